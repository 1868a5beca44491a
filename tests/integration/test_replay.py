"""Replay and restatement (DESIGN §3, §8): open ranges count, closed ranges are late, restatements are audited."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tests.support.harness import Harness, feed_line, tick_line
from traffic.app.runs import replay
from traffic.core.settings import SettingsError

UTC = timezone.utc
D1 = datetime(2026, 10, 30, tzinfo=UTC)


def _archive(root, hours: range, size: int, name="archive.csv"):
    lines = [feed_line(D1 + timedelta(hours=h, minutes=m), "10.0.0.1", "192.0.2.1", size=size)
             for h in hours for m in (5, 35)]
    lines.append(tick_line(D1 + timedelta(hours=hours.stop)))
    folder = root / "r1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("\n".join(lines) + "\n")
    return root


def _quiet(*_):
    return None


def _replay(harness, input_dir, start, end, restate=None):
    return replay(harness.settings, lambda: harness.spark, input_dir, start, end, None, restate, _quiet)


def _reconciles(harness):
    batches = harness.table("batches")
    accepted = sum(b["bytes_on_time"] + b["bytes_late"] - (b["bytes_withdrawn"] or 0) for b in batches)
    return accepted == sum(r["bytes"] for r in harness.table("hourly")) + sum(
        r["bytes"] for r in harness.table("late_packets"))


def test_replay_into_new_warehouse_counts_the_range_once(spark, tmp_path):
    harness = Harness(tmp_path / "w", spark)
    archive = _archive(tmp_path / "archive", range(0, 30), 100)
    batch, closed = _replay(harness, archive, D1, D1 + timedelta(days=1))
    # 24 hours x 2 packets inside the range; hours 24-29 are outside and not counted by this replay.
    assert (batch.packets_on_time, batch.packets_late, batch.records_skipped) == (48, 0, 12 + 1)
    assert len(closed.hours_frozen) == 23  # the tick at the end is outside: W reaches 23:35 of day 1
    assert sum(r["bytes"] for r in harness.table("hourly")) == 4800
    again, _ = _replay(harness, archive, D1 + timedelta(hours=6), D1 + timedelta(hours=12))
    assert again.nothing_to_do  # same file, overlapping range: a recorded duplicate, not a second count
    assert _reconciles(harness)


def test_replay_into_closed_range_is_late(spark, tmp_path):
    harness = Harness(tmp_path / "w", spark)
    harness.deliver("r1", "\n".join([feed_line(D1 + timedelta(hours=1)), tick_line(D1 + timedelta(hours=5))]) + "\n")
    harness.ingest()
    harness.close()
    archive = _archive(tmp_path / "archive", range(0, 2), 70)
    batch, _ = _replay(harness, archive, D1, D1 + timedelta(hours=2))
    assert (batch.packets_on_time, batch.packets_late) == (0, 4)
    ledger = {r["period_start"]: r for r in harness.table("periods") if r["grain"] == "hour"}
    assert ledger[D1 + timedelta(hours=1)]["late_bytes"] == 140
    assert _reconciles(harness)


def _hour_checks(harness, hour) -> set[tuple[str, str]]:
    """(table, run id) of every check result recorded for one hour."""
    return {(r["table"], r["run_id"]) for r in harness.table("dq_results")
            if r["grain"] == "hour" and r["period_start"] == hour}


def test_restatement_replaces_a_frozen_range_and_says_why(spark, tmp_path):
    harness = Harness(tmp_path / "w", spark)
    original = _archive(tmp_path / "v1", range(0, 49), 100)
    _replay(harness, original, D1, D1 + timedelta(days=3))
    day1 = {r["period_start"]: r for r in harness.table("periods") if r["grain"] == "day"}[D1]
    assert day1["bytes"] == 4800 and day1["restated"] is None
    # October closed (its last hour is frozen), so its bill is stored: everything is unassigned here.
    assert [(b["period"], b["account"], b["bytes_total"]) for b in harness.table("bills")] == \
        [("2026-10", "unassigned", 9600)]
    corrected = _archive(tmp_path / "v2", range(3, 5), 250, name="fixed.csv")
    with pytest.raises(SettingsError, match="needs --reason"):
        _replay(harness, corrected, D1 + timedelta(hours=3), D1 + timedelta(hours=5), restate=" ")
    checked_before = _hour_checks(harness, D1 + timedelta(hours=3))
    _replay(harness, corrected, D1 + timedelta(hours=3), D1 + timedelta(hours=5), restate="exporter bug #12 fixed")
    # The restated hours were frozen again: their rows and ledger rows checked anew, not published unchecked.
    checked_after = _hour_checks(harness, D1 + timedelta(hours=3))
    assert {"hourly", "panes", "periods"} <= {t for t, _ in checked_after - checked_before}
    ledger = {(r["grain"], r["period_start"]): r for r in harness.table("periods")}
    for h in (3, 4):
        row = ledger[("hour", D1 + timedelta(hours=h))]
        assert (row["bytes"], row["packets"], row["restated"]) == (500, 2, "exporter bug #12 fixed")
    assert ledger[("hour", D1 + timedelta(hours=2))]["restated"] is None
    assert (ledger[("day", D1)]["bytes"], ledger[("day", D1)]["restated"]) == (4800 + 600, "exporter bug #12 fixed")
    assert sum(r["bytes"] for r in harness.table("daily") if r["day"] == D1.date()) == 5400
    hourly = [r for r in harness.table("hourly") if r["hour"] == D1 + timedelta(hours=3)]
    assert [(r["bytes"], r["status"]) for r in hourly] == [(500, "final")]
    panes = [p for p in harness.table("panes") if p["hour"] == D1 + timedelta(hours=3)]
    assert sorted((p["pane_start"].minute, p["bytes"], p["status"]) for p in panes) == [(5, 250, "final"),
                                                                                         (35, 250, "final")]
    # The stored bill of the restated period is recomputed from the restated panes.
    assert [(b["period"], b["bytes_total"]) for b in harness.table("bills")] == [("2026-10", 9600 + 600)]
    restate_batch = [b for b in harness.table("batches") if b["mode"] == "restate"][0]
    assert (restate_batch["bytes_withdrawn"], restate_batch["note"]) == (400, "exporter bug #12 fixed")
    assert _reconciles(harness)
    with pytest.raises(SettingsError, match="only frozen hours"):
        _replay(harness, corrected, D1 + timedelta(days=5), D1 + timedelta(days=5, hours=1), restate="too early")


def test_restatement_of_part_of_a_day_whose_hours_retention_expired_is_refused(spark, tmp_path):
    """With ``hourly_retention``, the close drops hours of rolled-up days: restating some hours of such a day
    would roll the day up again from the hours left, and lose the others. Refused with its reason; the
    whole day may still be restated (every hour comes from the archive)."""
    harness = Harness(tmp_path / "w", spark, hourly_retention="1h")
    original = _archive(tmp_path / "v1", range(0, 49), 100)
    _replay(harness, original, D1, D1 + timedelta(days=3))
    assert not [r for r in harness.table("hourly") if r["hour"] < D1 + timedelta(days=1)]  # day 1's hours expired
    corrected = _archive(tmp_path / "v2", range(0, 24), 150)
    with pytest.raises(SettingsError, match=r"^the restatement covers part of the day of 2026-\d\d-\d\d, some of "
                                            r"whose rows hourly_retention may have expired"):
        _replay(harness, corrected, D1 + timedelta(hours=3), D1 + timedelta(hours=5), restate="exporter bug #12")
    _replay(harness, corrected, D1, D1 + timedelta(days=1), restate="exporter bug #12, whole day")
    day1 = {r["period_start"]: r for r in harness.table("periods") if r["grain"] == "day"}[D1]
    assert (day1["bytes"], day1["restated"]) == (24 * 2 * 150, "exporter bug #12, whole day")
