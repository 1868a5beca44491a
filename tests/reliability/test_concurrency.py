"""Jobs that collide: one job at a time per warehouse; the loser waits, or fails clearly and succeeds on retry."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from tests.support.harness import Harness, feed_line, tick_line
from traffic.storage.journal import LockTimeout, warehouse_lock

UTC = timezone.utc
T0 = datetime(2026, 11, 1, 10, tzinfo=UTC)


def _feed(hours: int, size: int = 100) -> str:
    lines = [feed_line(T0 + timedelta(minutes=m), size=size) for m in range(0, 60 * hours, 3)]
    return "\n".join(lines + [tick_line(T0 + timedelta(hours=hours))]) + "\n"


def test_a_busy_warehouse_fails_with_the_holder_named_then_succeeds_on_retry(spark, tmp_path):
    harness = Harness(tmp_path, spark, lock_timeout=1)
    harness.deliver("r1", _feed(2))
    harness.warehouse().root.mkdir(parents=True, exist_ok=True)
    with warehouse_lock(harness.warehouse().state_dir(), 5, "traffic close (test)"):
        with pytest.raises(LockTimeout, match=r"busy: traffic close \(test\) \(pid \d+\) holds .*retry"):
            harness.ingest()
    assert harness.ingest().packets_on_time == 40  # the retry


def _traffic(tmp_path, *args):
    command = [sys.executable, "-m", "traffic.app.cli", *args, "--warehouse", str(tmp_path / "warehouse"),
               "--inbox", str(tmp_path / "inbox"), "--set", "now=2026-11-02T00:00:00+00:00"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TZ": "UTC"})


@pytest.mark.slow
def test_parallel_ingests_and_closes_count_everything_once(tmp_path):
    (tmp_path / "inbox" / "r1").mkdir(parents=True)
    (tmp_path / "inbox" / "r1" / "a.csv").write_text(_feed(3))
    first, second = _traffic(tmp_path, "ingest"), _traffic(tmp_path, "ingest")
    outputs = [p.communicate(timeout=300) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outputs
    assert any("starting Spark (quick-start JVM)" in err for _, err in outputs), outputs  # a small batch
    said = sorted(out for out, _ in outputs)
    assert "nothing new" in said[1] or "nothing new" in said[0], said  # the loser waited, then had nothing to do
    # New content: its first three hours are late by now, the rest on time; then collide close, run and close.
    (tmp_path / "inbox" / "r1" / "b.csv").write_text(_feed(5, size=7))
    runs = [_traffic(tmp_path, "close"), _traffic(tmp_path, "run"), _traffic(tmp_path, "close")]
    outputs = [p.communicate(timeout=300) for p in runs]
    assert [p.returncode for p in runs] == [0, 0, 0], outputs
    harness = Harness(tmp_path, None)
    batches = harness.table("batches")
    accepted = sum(b["bytes_on_time"] + b["bytes_late"] for b in batches)
    assert accepted == sum(r["bytes"] for r in harness.table("hourly")) + sum(
        r["bytes"] for r in harness.table("late_packets"))
    assert sorted(b["batch_id"] for b in batches) == [1, 2]
    hours = [r["period_start"] for r in harness.table("periods") if r["grain"] == "hour"]
    assert len(hours) == len(set(hours)), "an hour was frozen twice"
