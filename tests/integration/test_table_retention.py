"""hourly_retention and daily_retention expire per-address rows through the pipeline (DESIGN §5).

Only rows summed into a published coarser period go (an hour of a rolled-up day, a day of a rolled-up
month), and never a row of ``monthly`` or the ledger; by default both tables are kept.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

from tests.support.harness import Harness, feed_line, tick_line

UTC = timezone.utc
T0 = datetime(2026, 10, 31, 22, tzinfo=UTC)
NOV_1 = datetime(2026, 11, 1, tzinfo=UTC)


def _traffic() -> str:
    """Packets from Oct 31 22:00 to Nov 1 02:10; the clock reaches Nov 1 02:30 (W)."""
    lines = [feed_line(T0 + timedelta(minutes=m)) for m in range(0, 250, 10)]
    return "\n".join(lines + [tick_line(T0 + timedelta(hours=4, minutes=30))]) + "\n"


def _kept(harness: Harness) -> dict[str, list[dict]]:
    return {name: sorted(harness.table(name), key=lambda r: sorted((k, str(v)) for k, v in r.items()))
            for name in ("hourly", "daily", "monthly", "periods")}


def test_retention_expires_hours_of_rolled_up_days_then_days_of_rolled_up_months_and_nothing_else(spark, tmp_path):
    # One warehouse, closed first with the default settings, then by closes that only differ in a retention.
    kept = Harness(tmp_path, spark)
    kept.deliver("r1", _traffic())
    kept.ingest()
    kept.close()  # freezes 22:00 … 01:00; rolls up Oct 31 and October; 02:00 stays open
    before = _kept(kept)
    hours = {r["hour"] for r in before["hourly"]}
    assert {T0, T0 + timedelta(hours=1), NOV_1, NOV_1 + timedelta(hours=1), NOV_1 + timedelta(hours=2)} <= hours
    assert [r["day"] for r in before["daily"]] == [date(2026, 10, 31)]  # the default keeps everything
    assert [r["status"] for r in before["hourly"] if r["hour"] == NOV_1 + timedelta(hours=2)] == ["open"]

    # hourly_retention 1h: bound hour_floor(W) - 1h = Nov 1 01:00. Oct 31's hours go (its day is rolled up);
    # Nov 1 00:00 is past the bound too but its day is not rolled up, so it stays, as do 01:00 and the open 02:00.
    Harness(tmp_path, spark, hourly_retention="1h").close()
    after = _kept(kept)
    assert after["hourly"] == [r for r in before["hourly"] if r["hour"] >= NOV_1]
    assert {NOV_1, NOV_1 + timedelta(hours=2)} <= {r["hour"] for r in after["hourly"]}
    assert {k: after[k] for k in ("daily", "monthly", "periods")} == \
           {k: before[k] for k in ("daily", "monthly", "periods")}

    # daily_retention 1h: Oct 31 goes (October is rolled up); monthly, the ledger and hourly stay.
    Harness(tmp_path, spark, daily_retention="1h").close()
    last = _kept(kept)
    assert last["daily"] == []
    assert {k: last[k] for k in ("hourly", "monthly", "periods")} == \
           {k: after[k] for k in ("hourly", "monthly", "periods")}
    assert [r["bytes"] for r in last["monthly"]] == [1200]  # Oct 31 22:00-23:50: 12 packets of 100 bytes


def test_the_close_that_rolls_a_day_up_expires_its_hours_as_a_rerun_would(spark, tmp_path):
    harness = Harness(tmp_path, spark, hourly_retention="1h")
    harness.deliver("r1", _traffic())
    harness.ingest()
    harness.close()  # the day is rolled up and its hours expired by one close
    hourly = harness.table("hourly")
    assert hourly and min(r["hour"] for r in hourly) == NOV_1
    assert [r["bytes"] for r in harness.table("daily")] == [1200]
    ledger = {(r["grain"], r["period_start"]): r["bytes"] for r in harness.table("periods")}
    assert ledger[("hour", T0)] == 600 and ledger[("day", datetime(2026, 10, 31, tzinfo=UTC))] == 1200
