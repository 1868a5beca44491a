"""expected_sources decides an hour's completeness through the pipeline (DESIGN §6 ``sources_expected``).

Sources a and b send a packet and a tick in every 5-minute pane of 22:00; c sends nothing. Configured to
expect a, b and c, the frozen hour's ledger row counts 3 expected, 2 reporting, no complete pane, and the
completeness checks flag it (a warning: ``completeness_action``); expecting a and b it is complete.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tests.support.harness import Harness, feed_line, tick_line

UTC = timezone.utc
T0 = datetime(2026, 10, 31, 22, tzinfo=UTC)
SOURCES_CHECK = "expect_column_pair_values_a_to_be_greater_than_b(sources_reporting ≥ sources_expected)"
PANES_CHECK = "expect_column_values_to_be_between(panes with every expected source ≥ completeness_min_panes)"


def _freeze_22h(harness: Harness) -> tuple[dict, dict[str, bool]]:
    """Feed a and b through 22:00 and past 23:00; close; the 22:00 ledger row and its completeness checks."""
    for source in ("a", "b"):
        minutes = range(0, 65, 5)
        harness.deliver(source, "\n".join([feed_line(T0 + timedelta(minutes=m, seconds=1)) for m in minutes]
                                          + [tick_line(T0 + timedelta(minutes=m, seconds=2)) for m in minutes]) + "\n")
    harness.ingest()
    harness.close()
    row = next(r for r in harness.table("periods") if r["grain"] == "hour" and r["period_start"] == T0)
    checks = {r["expectation"]: r["success"] for r in harness.table("dq_results")
              if r["grain"] == "hour" and r["period_start"] == T0 and r["suite"] == "periods"}
    return row, checks


def test_an_expected_source_that_sends_nothing_makes_the_frozen_hour_incomplete(spark, tmp_path):
    row, checks = _freeze_22h(Harness(tmp_path / "abc", spark, expected_sources="a,b,c"))
    assert (row["sources_reporting"], row["sources_expected"], row["panes_active"]) == (2, 3, 0), row
    assert row["dq_status"] == "warning", row
    assert (checks[SOURCES_CHECK], checks[PANES_CHECK]) == (False, False), checks


def test_with_every_expected_source_present_the_hour_is_complete(spark, tmp_path):
    row, checks = _freeze_22h(Harness(tmp_path / "ab", spark, expected_sources="a,b"))
    assert (row["sources_reporting"], row["sources_expected"], row["panes_active"]) == (2, 2, 12), row
    assert row["dq_status"] == "passed", row
    assert (checks[SOURCES_CHECK], checks[PANES_CHECK]) == (True, True), checks
