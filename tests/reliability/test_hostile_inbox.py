"""An operator's messy inbox never stops the pipeline, loses a byte or counts one twice (issue 20).

Poison content (a line longer than Arrow's block, JSON nested past Python's recursion limit, a
header CSV with a huge field or a column named twice, a stray quote, byte-order marks), files
that change or vanish between planning and reading, unterminated last lines, entries that are
not regular files inside the inbox, and unbounded names and reasons. Each case asserts
conservation: every record of every good file is counted exactly once, every bad one explained.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.support.harness import Harness, feed_line, micros
from traffic.storage.place import Place
from traffic.io import inbox as inbox_mod
from traffic.core.records import MAX_REASON_CHARS
from traffic.storage.journal import Journal

UTC = timezone.utc
T0 = datetime(2026, 11, 1, 10, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[2]
#: Bytes of no file outside the inbox may ever be stored: this marker stands for /etc/passwd.
OUTSIDE_MARKER = "root:x:0:0:OUTSIDE-SECRET-7f3a"


def _good(count: int, start_minute: int = 0, size: int = 100) -> str:
    return "".join(feed_line(T0 + timedelta(minutes=start_minute + m), size=size) + "\n" for m in range(count))


def _poison() -> dict[str, bytes]:
    """One file per defect that used to raise out of the parse task (each also holds one good record)."""
    good = feed_line(T0 + timedelta(minutes=30), size=7).encode() + b"\n"
    json_good = json.dumps({"ts": micros(T0 + timedelta(minutes=31)), "local_ip": "10.0.0.1",
                            "remote_ip": "192.0.2.1", "bytes": 11}).encode() + b"\n"
    return {
        "long-line.csv": good + b"new,OP_INSERT," + b"9" * (50 << 20),  # no newline, past Arrow's 16 MiB block
        "deep.jsonl": b"[" * 60_000 + b"\n" + json_good,  # within the line bound, past the recursion limit
        "huge-field.csv": b"ts,local_ip,remote_ip,bytes\n1793527200000000,10.0.0.1,192.0.2.1,"
                          + b"9" * (200 << 10) + b"\n" + b"1793527260000000,10.0.0.1,192.0.2.1,13\n",
        "twice.csv": b"ts,ts,local_ip,remote_ip,bytes\n1,2,10.0.0.1,192.0.2.1,5\n",
    }


def _write_quiet(path: Path, data: bytes) -> None:
    """Write a file dated past the grace period, so an unterminated last line is read as it is."""
    path.write_bytes(data)
    old = time.time() - 3600
    os.utime(path, (old, old))


def _rejects_by_file(harness: Harness) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for row in harness.table("rejects"):
        found.setdefault(row["input_file"], []).append(row["reason"])
    return found


def test_poison_files_become_rejects_and_the_batch_completes(spark, tmp_path):
    harness = Harness(tmp_path, spark)
    for name, data in _poison().items():
        (harness.settings.inbox / "r1").mkdir(parents=True, exist_ok=True)
        _write_quiet(harness.settings.inbox / "r1" / name, data)
    result = harness.ingest()
    assert (result.packets_on_time, result.bytes_on_time) == (3, 7 + 11 + 13)
    assert Journal(harness.warehouse().state_dir()).load() is None  # nothing left pending
    reasons = _rejects_by_file(harness)
    assert "longer than a record may be" in reasons["r1/long-line.csv"][0]
    assert reasons["r1/deep.jsonl"] == ["not valid JSON here (nested too deeply)"]
    assert "longer than a record may be" in reasons["r1/huge-field.csv"][0]
    assert "column 'ts' more than once" in reasons["r1/twice.csv"][0] and len(reasons["r1/twice.csv"]) == 2
    assert all(len(reason) <= MAX_REASON_CHARS for rows in reasons.values() for reason in rows)
    assert harness.ingest().nothing_to_do


def test_a_reader_that_fails_costs_its_chunk_one_reject_not_the_task(tmp_path, monkeypatch):
    """The last line of defence: whatever a reader raises becomes one reject naming the bytes not read."""
    import pyarrow.feather as feather

    from traffic.accounting import batch_tasks as B
    from traffic.accounting import parts
    from traffic.core.settings import load_settings

    path = tmp_path / "f.csv"
    path.write_text(_good(2))
    data = path.read_bytes()
    row = {"chunk": 0, "path": str(path), "source": "r1", "name": "r1/f.csv", "format": "router-feed", "start": 0,
           "end": len(data), "sha256": hashlib.sha256(data).hexdigest(), "header": "",
           "file_end": len(data)}
    rules = B.Rules(batch_id=1, watermark_before=None, future_limit=T0 + timedelta(days=400), history_floor=None,
                    time_range=None, packets=None, late_packets=None, scratch=str(tmp_path), settings_doc={})

    def broken(*_args, **_kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(B, "parse_bytes", broken)
    outcome = B.run_chunk(row, rules, load_settings(environ={}))
    assert outcome["problem"] is None
    rejects = feather.read_table(str(parts.part_path(Place.of(tmp_path), "rejects", 0, 0))).to_pylist()
    assert [(r["record"], r["reason"].split(";")[0]) for r in rejects] == [
        (f"r1/f.csv bytes 0-{len(data)}",
         "could not be read as router-feed (RecursionError: maximum recursion depth exceeded)")]


def _spark_factory_that(spark, before_spark):
    """A Spark factory that changes the inbox the moment the batch's Spark job is asked for (after planning)."""
    def factory():
        before_spark()
        return spark
    return factory


def test_a_file_rewritten_while_the_spark_job_starts_counts_nothing_then_counts_once(spark, tmp_path):
    from traffic.app.runs import ingest

    harness = Harness(tmp_path, spark)
    path = harness.deliver("r1", _good(3), name="feed.csv")
    other = harness.deliver("r1", _good(2, start_minute=10), name="other.csv")
    rewritten = _good(3, size=999) + _good(4, start_minute=20, size=5)  # another content, longer than planned

    result = ingest(harness.settings, _spark_factory_that(spark, lambda: path.write_text(rewritten)), print)
    assert (result.packets_on_time, result.bytes_on_time) == (2, 200)  # only the untouched file
    statuses = {f["name"]: f["status"] for b in harness.table("batches") for f in b["files"]}
    assert statuses == {"r1/feed.csv": "retry", "r1/other.csv": "accounted"}
    assert "changed after its batch was planned" in _rejects_by_file(harness)["r1/feed.csv"][0]
    # The next batch reads the file as it is then, once.
    assert (harness.ingest().bytes_on_time, harness.ingest().nothing_to_do) == (3 * 999 + 4 * 5, True)
    assert sum(r["bytes"] for r in harness.table("packets")) == 200 + 3 * 999 + 4 * 5
    assert other.exists()


def test_a_file_that_vanishes_before_it_is_read_is_recorded_and_close_still_works(spark, tmp_path):
    """A journaled batch whose file was moved away finishes (by close here): nothing pending for good."""
    from traffic.accounting.ingest import plan_batch

    harness = Harness(tmp_path, spark)
    harness.deliver("r1", _good(2), name="kept.csv")
    gone = harness.deliver("r1", _good(3, start_minute=5), name="gone.csv")
    warehouse = harness.warehouse()
    warehouse.create_all()
    journal = Journal(warehouse.state_dir())
    journal.save(plan_batch(harness.settings, warehouse))  # as if killed right after planning
    gone.rename(tmp_path / "moved-away.csv")
    harness.close()
    assert journal.load() is None
    statuses = {f["name"]: f["status"] for b in harness.table("batches") for f in b["files"]}
    assert statuses == {"r1/gone.csv": "vanished", "r1/kept.csv": "accounted"}
    assert sum(r["bytes"] for r in harness.table("packets")) == 200
    assert "vanished before its batch read it" in _rejects_by_file(harness)["r1/gone.csv"][0]


@pytest.mark.slow
def test_a_resumed_batch_that_committed_already_ends_as_planned_whatever_happened_to_its_files(spark, tmp_path):
    """Killed after its raw detail was committed, then the file changes: the rerun reuses the first run's work."""
    harness = Harness(tmp_path, spark)
    path = harness.deliver("r1", _good(3), name="feed.csv")
    killed = subprocess.run(
        [sys.executable, "-m", "traffic.app.cli", "ingest", "--warehouse", str(harness.settings.warehouse), "--inbox",
         str(harness.settings.inbox), "--set", f"now={harness.settings.now.isoformat()}", "--set",
         "fault_at=packets.ingest.committed", "--set", "spark_master=local[1]"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    path.write_text(_good(3, size=5))
    result = harness.ingest()
    assert result.resumed and result.bytes_on_time == 300
    hourly = sum(r["bytes"] for r in harness.table("hourly"))
    assert hourly == sum(r["bytes"] for r in harness.table("packets")) == 300


def test_an_unterminated_last_line_waits_for_its_end_then_counts_once(spark, tmp_path):
    harness = Harness(tmp_path, spark, partial_line_grace="10m")
    line = feed_line(T0 + timedelta(minutes=1), size=100)
    path = harness.deliver("r1", _good(1) + line[:-2], name="feed.csv")  # "…,1" of "…,100" written so far
    first = harness.ingest()
    assert (first.packets_on_time, first.bytes_on_time, first.records_rejected) == (1, 100, 0)
    assert harness.ingest().nothing_to_do  # still unterminated: nothing new
    with open(path, "a") as handle:
        handle.write(line[-2:] + "\n")
    second = harness.ingest()
    assert (second.packets_on_time, second.bytes_on_time, second.records_rejected) == (1, 100, 0)
    statuses = [f["status"] for b in sorted(harness.table("batches"), key=lambda b: b["batch_id"]) for f in b["files"]]
    assert statuses == ["accounted", "appended"]


def test_an_unterminated_line_counts_as_it_is_once_the_file_is_quiet_for_the_grace_period(spark, tmp_path):
    harness = Harness(tmp_path, spark, partial_line_grace="10m")
    path = harness.deliver("r1", _good(1) + feed_line(T0 + timedelta(minutes=1), size=42), name="feed.csv")
    old = time.time() - 11 * 60
    os.utime(path, (old, old))
    assert harness.ingest().bytes_on_time == 142


def test_an_appended_header_csv_tail_is_read_under_its_header(spark, tmp_path):
    harness = Harness(tmp_path, spark)
    header = "ts,local_ip,remote_ip,bytes\n"
    path = harness.deliver("r1", header + f"{micros(T0)},10.0.0.1,192.0.2.1,10\n", name="feed.csv")
    counted_ns = path.stat().st_mtime_ns
    harness.ingest()
    with open(path, "a") as handle:
        handle.write(f"{micros(T0) + 1},10.0.0.1,192.0.2.1,20\n")
    # Another mtime than the counted one even on a coarse clock, and in the past: a file dated ahead of
    # this machine's clock waits (test_inbox_rules), and the next ingest may scan within a millisecond.
    os.utime(path, ns=(counted_ns + 10**6,) * 2)
    result = harness.ingest()
    assert (result.packets_on_time, result.bytes_on_time, result.records_rejected) == (1, 20, 0)


def test_byte_order_marks_are_ignored_and_a_stray_quote_costs_only_its_line(spark, tmp_path):
    harness = Harness(tmp_path, spark)
    bom = "\ufeff"
    quote = '"'
    lines = [f"{micros(T0) + i},10.0.0.1,192.0.2.1,{quote if i == 3 else ''}{10 + i}" for i in range(12)]
    harness.deliver("r1", bom + "ts,local_ip,remote_ip,bytes\n" + "\n".join(lines) + "\n", name="quoted.csv")
    harness.deliver("r1", bom + json.dumps({"ts": micros(T0), "local_ip": "10.0.0.2", "remote_ip": "192.0.2.1",
                                            "bytes": 64}) + "\n", name="bom.jsonl")
    result = harness.ingest()
    assert (result.packets_on_time, result.records_rejected) == (12, 1)
    assert result.bytes_on_time == sum(10 + i for i in range(12) if i != 3) + 64
    assert [r["reason"] for r in harness.table("rejects")] == ["not valid CSV (unexpected end of data)"]


def test_reasons_and_source_names_are_bounded(spark, tmp_path):
    harness = Harness(tmp_path, spark)
    huge = "x" * (5 << 20)
    records = [{"ts": micros(T0), "local_ip": huge, "remote_ip": "192.0.2.1", "bytes": 1},
               {"ts": micros(T0), "local_ip": "10.0.0.1", "remote_ip": "192.0.2.1", "bytes": 2, "source": "s" * 200},
               {"ts": micros(T0), "source": "bad\x1b[31mname"},
               {"ts": micros(T0), "local_ip": "10.0.0.1", "remote_ip": "192.0.2.1", "bytes": 3, "source": "edge-1"}]
    harness.deliver("r1", "\n".join(json.dumps(r) for r in records) + "\n", name="f.jsonl")
    result = harness.ingest()
    assert (result.packets_on_time, result.records_rejected) == (1, 3)
    rejects = harness.table("rejects")
    assert all(len(r["reason"]) <= MAX_REASON_CHARS and len(r["record"]) <= 512 for r in rejects)
    assert sum("source name is longer than 128" in r["reason"] for r in rejects) == 2
    assert [r["source"] for r in harness.table("packets")] == ["edge-1"]


def _hostile_entries(inbox: Path, outside: Path) -> None:
    """Every kind of inbox entry that is not a regular file inside the inbox."""
    folder = inbox / "r1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "passwd.csv").symlink_to(outside)
    (folder / "zero.csv").symlink_to("/dev/zero")
    (folder / "dangling.csv").symlink_to(inbox / "no-such-file")
    (folder / "outside-dir").symlink_to(outside.parent, target_is_directory=True)
    os.mkfifo(folder / "pipe.csv")
    (inbox / ("e" * 200)).mkdir()
    (inbox / ("e" * 200) / "long-source.csv").write_text(_good(1))


def test_special_entries_are_recorded_by_name_and_never_read(spark, tmp_path):
    outside = tmp_path / "etc" / "passwd"
    outside.parent.mkdir()
    outside.write_text(OUTSIDE_MARKER + "\n")
    harness = Harness(tmp_path, spark)
    _hostile_entries(harness.settings.inbox, outside)
    good = harness.deliver("r1", _good(2), name="good.csv")
    (harness.settings.inbox / "r1" / "link-inside.csv").symlink_to(harness.settings.inbox / "r1" / "good.csv")
    result = harness.ingest()
    assert result.bytes_on_time == 200  # the inside link is the same content: a recorded duplicate
    files = {f["name"]: (f["status"], f["size"]) for b in harness.table("batches") for f in b["files"]}
    assert files.pop("r1/good.csv") == ("accounted", good.stat().st_size)
    assert files.pop("r1/link-inside.csv")[0] == "duplicate"
    assert {name: status for name, (status, _) in files.items()} == {
        "r1/passwd.csv": "skipped", "r1/zero.csv": "skipped", "r1/dangling.csv": "skipped",
        "r1/outside-dir": "skipped", "r1/pipe.csv": "skipped", f"{'e' * 200}/long-source.csv": "skipped"}
    reasons = {r["input_file"]: r["reason"] for r in harness.table("rejects")}
    assert reasons["r1/passwd.csv"] == "a link to a place outside the inbox: never read"
    assert reasons["r1/pipe.csv"] == "not a regular file (a FIFO): never read"
    assert "longer than a source name may be" in reasons[f"{'e' * 200}/long-source.csv"]
    assert harness.ingest().nothing_to_do  # recorded once, not every batch


def test_an_unreadable_file_is_rejected_with_its_reason_once_and_read_when_it_can_be(spark, tmp_path, monkeypatch):
    """(Root reads any file, so the refusal is the operating system's error, injected at the open.)"""
    harness = Harness(tmp_path, spark)
    locked = harness.deliver("r1", _good(3), name="locked.csv")
    harness.deliver("r1", _good(1, start_minute=9), name="open.csv")
    real_open = inbox_mod.open_regular

    def refusing(path):
        if path == str(locked):
            raise PermissionError(13, "Permission denied")
        return real_open(path)

    monkeypatch.setattr(inbox_mod, "open_regular", refusing)
    assert harness.ingest().bytes_on_time == 100
    assert harness.ingest().nothing_to_do  # recorded once
    assert "cannot be read (Permission denied)" in _rejects_by_file(harness)["r1/locked.csv"][0]
    monkeypatch.setattr(inbox_mod, "open_regular", real_open)
    assert harness.ingest().bytes_on_time == 300


def test_replay_input_follows_the_inbox_rules(spark, tmp_path):
    from traffic.app.runs import replay

    outside = tmp_path / "etc" / "passwd"
    outside.parent.mkdir()
    outside.write_text(OUTSIDE_MARKER + "\n")
    archive = tmp_path / "archive"
    _hostile_entries(archive, outside)
    (archive / "r1" / "good.csv").write_text(_good(2))
    harness = Harness(tmp_path, spark)
    result, _ = replay(harness.settings, lambda: spark, archive, T0, T0 + timedelta(hours=1), progress=lambda *_: None)
    assert result.bytes_on_time == 200
    statuses = {f["name"]: f["status"] for b in harness.table("batches") for f in b["files"]}
    assert statuses["r1/passwd.csv"] == statuses["r1/pipe.csv"] == "skipped"
    assert not any(OUTSIDE_MARKER in (r["record"] or "") for r in harness.table("rejects"))


@pytest.mark.slow
def test_a_mixed_inbox_goes_through_one_run_exactly(tmp_path):
    """Good data beside every poison file, FIFO and outside link: `traffic run` exits 0 in bounded time."""
    outside = tmp_path / "etc" / "passwd"
    outside.parent.mkdir()
    outside.write_text(OUTSIDE_MARKER + "\n")
    inbox, warehouse = tmp_path / "inbox", tmp_path / "warehouse"
    _hostile_entries(inbox, outside)
    for name, data in _poison().items():
        _write_quiet(inbox / "r1" / name, data)
    tick = f"new,OP_INSERT,{micros(T0 + timedelta(hours=3))}\n"  # every source's clock moves on: hours close
    (inbox / "r1" / "tick.csv").write_text(tick)
    good = _good(120) + tick  # two hours of traffic
    (inbox / "r2").mkdir()
    (inbox / "r2" / "good.csv").write_text(good)
    (inbox / "r2" / "tail.csv").write_text(_good(1, start_minute=5) + "new,OP_INSERT,17935")  # still being written
    env = {**os.environ, "TRAFFIC_WAREHOUSE": str(warehouse), "TRAFFIC_INBOX": str(inbox), "TRAFFIC_NOW":
           "2026-12-01T00:00:00+00:00", "TRAFFIC_SPARK_MASTER": "local[2]", "TRAFFIC_SHUFFLE_PARTITIONS": "2"}
    try:  # bounded: a FIFO or /dev/zero read would block the run for ever (the timeout is the bound, not a timing)
        done = subprocess.run([sys.executable, "-m", "traffic.app.cli", "run"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"traffic run did not finish in 600 s: an inbox entry blocked it\n{expired.stdout}{expired.stderr}")
    assert done.returncode == 0, done.stdout + done.stderr
    harness = Harness(tmp_path, None)
    # Every entry that is not a regular file inside the inbox is recorded by name and skipped, never read.
    statuses = {f["name"]: f["status"] for b in harness.table("batches") for f in b["files"]}
    hostile = ("r1/passwd.csv", "r1/zero.csv", "r1/dangling.csv", "r1/outside-dir", "r1/pipe.csv",
               f"{'e' * 200}/long-source.csv")
    assert {name: statuses.get(name) for name in hostile} == dict.fromkeys(hostile, "skipped"), statuses
    assert all(statuses[f"r1/{name}"] == "accounted" for name in _poison()), statuses
    good_bytes = 120 * 100 + 100 + 7 + 11 + 13
    assert sum(r["bytes"] for r in harness.table("packets")) == good_bytes
    assert sum(r["bytes"] for r in harness.table("hourly")) + sum(r["bytes"] for r in harness.table("late_packets")) \
        == good_bytes
    final = [r for r in harness.table("periods") if r["grain"] == "hour"]
    assert final and all(r["dq_status"] != "failed" for r in final), final
    assert sum(r["bytes"] for r in final) == sum(r["bytes"] for r in harness.table("hourly") if r["status"] == "final")
    for table in ("packets", "late_packets", "rejects", "batches", "dq_results"):
        assert OUTSIDE_MARKER not in json.dumps(harness.table(table), default=str)
    for path in warehouse.rglob("*"):
        if path.is_file():
            assert OUTSIDE_MARKER.encode() not in path.read_bytes(), path
