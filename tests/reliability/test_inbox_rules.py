"""Exactly once at the file level: duplicates, appended files, changed files, files still being written."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta, timezone

from tests.support.harness import Harness, feed_line, tick_line
from traffic.io.inbox import scan

UTC = timezone.utc
T0 = datetime(2026, 11, 1, 10, tzinfo=UTC)


def _lines(start: int, count: int, size: int = 100) -> str:
    return "".join(feed_line(T0 + timedelta(minutes=m), size=size) + "\n" for m in range(start, start + count))


def _newer_than(path, counted_ns: int) -> None:
    """Give a rewritten file an mtime other than the one it was counted with, even on a coarse clock,
    and in the past: the inbox takes a file only once its mtime is ``min_file_age`` old, so a future one waits."""
    os.utime(path, ns=(counted_ns + 1_000_000, counted_ns + 1_000_000))


def test_same_content_under_another_name_counts_once_and_is_recorded(spark, tmp_path):
    harness = Harness(tmp_path, spark)
    harness.deliver("r1", _lines(0, 5), name="a.csv")
    harness.deliver("r1", _lines(0, 5), name="b.csv")  # same content, same batch
    first = harness.ingest()
    harness.deliver("r1", _lines(0, 5), name="c.csv")  # same content, a later batch
    second = harness.ingest()
    assert (first.packets_on_time, first.duplicate_files, second.packets_on_time, second.duplicate_files) == \
        (5, 1, 0, 1)
    statuses = sorted((f["name"], f["status"]) for b in harness.table("batches") for f in b["files"])
    assert statuses == [("r1/a.csv", "accounted"), ("r1/b.csv", "duplicate"), ("r1/c.csv", "duplicate")]
    # Another source may send the same bytes: sources observe disjoint traffic, so they add up.
    harness.deliver("r2", _lines(0, 5), name="a.csv")
    assert harness.ingest().packets_on_time == 5
    # Nothing new: no batch at all, and unchanged files are not read again.
    assert harness.ingest().nothing_to_do


def test_appending_to_a_counted_file_counts_only_the_tail(spark, tmp_path):
    harness = Harness(tmp_path, spark)
    path = harness.deliver("r1", _lines(0, 3), name="feed.csv")
    harness.ingest()
    counted = path.stat().st_mtime_ns
    with open(path, "a") as handle:
        handle.write(_lines(3, 2, size=7))
    _newer_than(path, counted)
    result = harness.ingest()
    assert (result.packets_on_time, result.bytes_on_time) == (2, 14)
    assert sum(r["bytes"] for r in harness.table("packets")) == 314
    statuses = [f["status"] for b in sorted(harness.table("batches"), key=lambda b: b["batch_id"]) for f in b["files"]]
    assert statuses == ["accounted", "appended"]


def test_changing_a_counted_file_is_rejected_whole_with_a_reason(spark, tmp_path):
    harness = Harness(tmp_path, spark)
    path = harness.deliver("r1", _lines(0, 3), name="feed.csv")
    harness.ingest()
    counted = path.stat().st_mtime_ns
    path.write_text(_lines(0, 3, size=999))  # same size class, different content: not an append
    _newer_than(path, counted)
    result = harness.ingest()
    assert (result.packets_on_time, result.records_rejected) == (0, 1)
    reject = harness.table("rejects")[0]
    assert reject["input_file"] == "r1/feed.csv" and "changed after it was counted" in reject["reason"]
    assert sum(r["bytes"] for r in harness.table("packets")) == 300


def test_files_still_being_written_are_not_taken(tmp_path):
    inbox = tmp_path / "inbox"
    (inbox / "r1").mkdir(parents=True)
    for name in (".hidden.csv", "feed.csv.tmp", "feed.csv.part", "feed.csv.partial", "_staging.csv"):
        (inbox / "r1" / name).write_text("new,OP_INSERT,1\n")
    (inbox / "r1" / "done.csv").write_text("new,OP_INSERT,1\n")
    assert [f.name for f in scan(inbox)] == ["r1/done.csv"]
    fresh = inbox / "r1" / "fresh.csv"
    fresh.write_text("new,OP_INSERT,1\n")
    assert "r1/fresh.csv" not in [f.name for f in scan(inbox, min_age_seconds=60)]
    old = time.time() - 120
    os.utime(fresh, (old, old))
    assert "r1/fresh.csv" in [f.name for f in scan(inbox, min_age_seconds=60)]
    # A file dated ahead of this machine's clock (a sender's clock ahead) waits until that time has
    # passed, even with no minimum age: its age is negative.
    ahead = time.time() + 3600
    os.utime(fresh, (ahead, ahead))
    assert "r1/fresh.csv" not in [f.name for f in scan(inbox)]
    assert "r1/fresh.csv" in [f.name for f in scan(inbox, now=ahead + 1)]


def test_a_file_renamed_into_place_is_taken_once(spark, tmp_path):
    harness = Harness(tmp_path, spark)
    temporary = harness.deliver("r1", _lines(0, 4) + tick_line(T0 + timedelta(hours=2)) + "\n", name="x.csv.tmp")
    assert harness.ingest().nothing_to_do
    temporary.rename(temporary.with_name("x.csv"))
    assert harness.ingest().packets_on_time == 4
    assert harness.ingest().nothing_to_do


def test_a_tick_with_nothing_to_do_never_starts_spark(spark, tmp_path):
    """An empty inbox, and a close up to an hour already final, are decided without a JVM (issue 8)."""
    import subprocess
    import sys
    from pathlib import Path

    harness = Harness(tmp_path, spark)
    harness.deliver("r1", _lines(0, 5) + tick_line(T0 + timedelta(hours=2)) + "\n")
    harness.ingest()
    assert [h.hour for h in harness.close().hours_frozen] == [10, 11]
    traffic = str(Path(sys.executable).with_name("traffic"))
    common = ["--warehouse", str(harness.settings.warehouse), "--inbox", str(harness.settings.inbox),
              "--set", "now=2026-12-01T00:00:00+00:00"]
    for command in (["run"], ["close", "--until", "2026-11-01T12:00:00+00:00"]):
        done = subprocess.run([traffic, *command, *common], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "starting Spark" not in done.stderr, (command, done.stderr)
        assert "nothing" in done.stdout, done.stdout
