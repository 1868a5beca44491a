"""A year of empty hours (issue 20 item 9): one record 300 days old, inside ``max_history``, then today's.

Every hour from the first hour on is closed and ledgered (DESIGN §3), so the close writes 7,200 hour
rows, 300 day rows and 10 month rows. It costs per hour with data, not per calendar hour: the hours
with data are recomputed and checked row by row, the empty ones only by their ledger rows, all in
one pass with a few commits per table (measured: at most 4, for ``dq_results``), never one per hour.
``traffic status`` warns about the gap.

The test holds the close to that shape (commits per table, row checks only where rows are), which
does not depend on how busy the machine is; how long it takes is measured by ``bench/timings.py
--only empty-hours`` (target: well under a minute).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest

from tests.support.harness import Harness, feed_line
from traffic.reporting.report import status
from traffic.storage.schemas import TABLES

UTC = timezone.utc
NOW = datetime(2026, 11, 2, tzinfo=UTC)
OLD = NOW - timedelta(days=300, hours=1)  # 2026-01-05 23:00: the first hour
RECENT = NOW - timedelta(minutes=30)       # 2026-11-01 23:30: W, so hours up to 22:00 close


def _warehouse_with_a_stray_old_record(root, spark, **settings) -> Harness:
    harness = Harness(root, spark, now=NOW.isoformat(), **settings)
    harness.deliver("a", feed_line(OLD, size=10) + "\n")
    harness.ingest()
    harness.deliver("a", feed_line(RECENT, size=20) + "\n")
    harness.ingest()
    return harness


def _versions(harness: Harness) -> dict[str, int]:
    """Each table's Delta version: how many commits a step made is the difference."""
    warehouse = harness.warehouse()
    return {name: warehouse.table(name).version() for name in TABLES}


def _expected_hours() -> int:
    return int((RECENT.replace(minute=0) - OLD) / timedelta(hours=1))  # first hour .. the hour before W's


def test_a_year_of_empty_hours_closes_in_one_pass_with_a_commit_per_table(spark, tmp_path):
    # Check results kept for the whole stretch (by default those of periods past 90 days expire at once).
    harness = _warehouse_with_a_stray_old_record(tmp_path, spark, dq_retention="400d")
    warning = [w for w in status(harness.settings)["warnings"] if w.startswith("first hour")]
    assert warning == ["first hour 2026-01-05 23:00 is 300 d before the next hour with data, 7,199 empty hours "
                       "between, each closed and in the ledger: a stray old record? (warned beyond 7 d)"]
    before = _versions(harness)
    result = harness.close()
    commits = {name: version - before[name] for name, version in _versions(harness).items()}
    print(f"close of {len(result.hours_frozen):,} hours: commits {commits}")
    # Freeze, roll-up, checks and expiry commit once each at most, whatever the number of hours (a commit
    # per hour would be 7,200 of them).
    assert len(result.hours_frozen) == 7200 and max(commits.values()) <= 4, commits

    periods = harness.table("periods")
    assert Counter(p["grain"] for p in periods) == {"hour": _expected_hours(), "day": 300, "month": 10}
    assert _expected_hours() == 7200
    hours = {p["period_start"]: p for p in periods if p["grain"] == "hour"}
    assert min(hours) == OLD and max(hours) == RECENT.replace(minute=0) - timedelta(hours=1)
    assert sum(p["bytes"] for p in hours.values()) == 10 and hours[OLD]["bytes"] == 10
    # Empty hours are ledgered with 0 bytes and judged by their completeness: a warning while a is
    # expected (24 hours after its record), passed after (nobody expected, vacuously complete).
    assert all(p["bytes"] == 0 and p["packets"] == 0 for h, p in hours.items() if h != OLD)
    assert Counter(p["dq_status"] for p in hours.values()) == {"passed": 7200 - 24, "warning": 24}
    # Days and months are judged by their reconciliation: all pass.
    assert {p["dq_status"] for p in periods if p["grain"] != "hour"} == {"passed"}
    assert all(p["bytes"] == 0 for p in periods if p["grain"] == "day" and p["period_start"] > OLD)
    # The row suites check the hours with rows (here: one); every hour's ledger row is checked.
    results = harness.table("dq_results")
    assert {r["period_start"] for r in results if r["suite"] == "packets"} == {OLD}
    assert len({r["period_start"] for r in results if r["suite"] == "periods" and r["grain"] == "hour"}) == 7200
    assert all(r["success"] or r["expectation"].endswith("≥ completeness_min_panes)")
               or "sources_reporting" in r["expectation"] for r in results)
    # Idempotent: a rerun has nothing to do and changes nothing.
    before = harness.tables()
    again = harness.close()
    assert again.hours_frozen == [] and again.days_rolled == [] and harness.tables() == before


@pytest.mark.slow
def test_a_close_of_empty_hours_killed_half_way_and_run_again_ends_as_an_uninterrupted_one(spark, tmp_path):
    from tests.integration.test_crash_points import _snapshot

    expected = _warehouse_with_a_stray_old_record(tmp_path / "whole", spark)
    expected.close()
    want = _snapshot(expected)
    # The checks of periods past dq_retention (90 days) expire in the close that made them, as in a rerun.
    assert min(r["period_start"] for r in expected.table("dq_results")) == datetime(2026, 8, 1, tzinfo=UTC)
    for number, point in enumerate(["dq_results.quality.committed#1", "periods.freeze.committed#1",
                                    "daily.roll_up.committed#1"]):
        harness = _warehouse_with_a_stray_old_record(tmp_path / f"killed{number}", spark)
        command = [sys.executable, "-m", "traffic.app.cli", "close", "--warehouse", str(harness.settings.warehouse),
                   "--inbox", str(harness.settings.inbox), "--set", f"now={NOW.isoformat()}",
                   "--set", "shuffle_partitions=2", "--set", f"fault_at={point}"]
        completed = subprocess.run(command, env={**os.environ, "TZ": "UTC"}, capture_output=True, text=True,
                                   timeout=600)
        assert completed.returncode == -signal.SIGKILL, f"{point}: {completed.stderr[-2000:]}"
        harness.close()
        got = _snapshot(harness)
        for table in want:
            assert got[table] == want[table], f"after SIGKILL at {point}, table {table} differs"
