"""Misbehaving clocks: jumps backwards, bogus far-future/far-past times, a stalled source, its late return."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tests.support.harness import Harness, feed_line, tick_line

UTC = timezone.utc
T0 = datetime(2026, 11, 1, 10, tzinfo=UTC)
NOW = datetime(2026, 11, 2, tzinfo=UTC)


def _h(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def test_clock_jumping_backwards_never_moves_the_watermark_back(spark, tmp_path):
    harness = Harness(tmp_path, spark, now=NOW.isoformat())
    harness.deliver("a", feed_line(_h(2)) + "\n")
    harness.ingest()
    assert harness.watermark == _h(2)
    # Back to 10:30 and 11:54: both hours are closed at W = 12:00, so both are late.
    harness.deliver("a", feed_line(_h(0.5), size=77) + "\n" + feed_line(_h(1.9), size=5) + "\n")
    result = harness.ingest()
    assert harness.watermark == _h(2) and (result.packets_late, result.packets_on_time) == (2, 0)
    clock = {r["source"]: r["clock"] for r in harness.table("clocks")}
    assert clock == {"a": _h(2)}


def test_bogus_times_are_rejected_instead_of_freezing_a_year_of_empty_hours(spark, tmp_path):
    harness = Harness(tmp_path, spark, now=NOW.isoformat())
    harness.deliver("a", "\n".join([feed_line(_h(0)), feed_line(_h(1)),
                                    feed_line(NOW + timedelta(days=365)),       # a year ahead of the machine
                                    feed_line(_h(0) - timedelta(days=365 * 30)),  # decades before the batch
                                    tick_line(_h(3))]) + "\n")
    result = harness.ingest()
    assert (result.packets_on_time, result.records_rejected) == (2, 2)
    reasons = sorted(r["reason"] for r in harness.table("rejects"))
    assert "ahead of this machine's clock" in reasons[1] and "max_history" in reasons[0]
    # The decades-old record only turns out too old once the batch's newest is known: its parse task
    # ran again, and the packets it wrote the first time were discarded, not committed.
    assert sorted(r["ts"] for r in harness.table("packets")) == [_h(0), _h(1)]
    assert harness.watermark == _h(3)
    harness.close()
    hours = [r for r in harness.table("periods") if r["grain"] == "hour"]
    assert len(hours) == 3  # 10:00, 11:00, 12:00 — not a year of empty hours


def test_stalled_source_stops_holding_the_watermark_and_its_return_is_late_but_counted(spark, tmp_path):
    harness = Harness(tmp_path, spark, now=NOW.isoformat(), source_timeout=3600)
    harness.deliver("a", "\n".join(feed_line(_h(m / 60)) for m in range(0, 60, 10)) + "\n")
    harness.deliver("b", "\n".join(feed_line(_h(m / 60), "10.0.0.2") for m in range(0, 60, 10)) + "\n")
    harness.ingest()
    before = harness.watermark
    # b stalls at 10:50; a carries on to 13:30. Within the timeout b holds W back; beyond it, not.
    harness.deliver("a", "\n".join(feed_line(_h(1 + m / 60)) for m in range(0, 150, 10)) + "\n")
    harness.ingest()
    # a's clock is 13:20; b's 10:50 is more than source_timeout behind, so b is not live and W = 13:20.
    w_after_stall = harness.watermark
    assert before == _h(50 / 60) and w_after_stall == _h(1 + 140 / 60)
    harness.close()
    ledger = {r["period_start"]: r for r in harness.table("periods") if r["grain"] == "hour"}
    assert (ledger[_h(1)]["sources_reporting"], ledger[_h(1)]["sources_expected"]) == (1, 2)
    assert ledger[_h(1)]["panes_active"] == 0
    # b comes back with what it saw while stalled: closed hours, so late — kept and counted.
    harness.deliver("b", "\n".join(feed_line(_h(1 + m / 60), "10.0.0.2", size=9) for m in range(0, 60, 10)) + "\n")
    result = harness.ingest()
    assert result.packets_late == 6 and harness.watermark >= w_after_stall
    harness.close()
    ledger = {r["period_start"]: r for r in harness.table("periods") if r["grain"] == "hour"}
    assert ledger[_h(1)]["late_bytes"] == 54
    assert sum(r["bytes"] for r in harness.table("late_packets")) == 54
