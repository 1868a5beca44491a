"""A day of traffic for 100,000 distinct remote addresses runs within memory with the default settings.

The tick runs as a user runs it — ``traffic run`` in a fresh process with its own Spark — so the
measured peak is this job's process tree (Python driver, JVM, Python workers) and nothing that the
test session's shared JVM accumulated before it. The peak counts only if it was sampled while the
job's JVM was in the tree (checked by the JVM's presence, not by a number of samples, which would
depend on how long the job ran).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psutil
import pytest

from tests.support.harness import Harness, micros
from traffic.runtime.peakmem import PeakMemory

UTC = timezone.utc
T0 = datetime(2026, 11, 1, tzinfo=UTC)
REMOTES = 100_000
PACKETS = 300_000
LIMIT = 4 * 2**30
REPO = Path(__file__).resolve().parents[2]


class JvmSeen(threading.Thread):
    """Watches a process tree until a JVM (``java``) is in it, or the tree's root ends: ``seen``."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.seen = pid, threading.Event()

    def run(self) -> None:
        try:
            root = psutil.Process(self.pid)
            while root.is_running() and root.status() != psutil.STATUS_ZOMBIE:
                if any(_name(child) == "java" for child in root.children(recursive=True)):
                    self.seen.set()
                    return
                self.seen.wait(0.05)
        except psutil.Error:
            return


def _name(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.Error:
        return ""


@pytest.mark.slow
def test_a_day_with_100k_distinct_remote_addresses(tmp_path):
    harness = Harness(tmp_path, spark=None)  # the job brings its own Spark
    step = 86_400_000_000 // PACKETS
    base = micros(T0)
    lines = []
    for i in range(PACKETS):
        remote = i % REMOTES
        lines.append(f"new,OP_INSERT,{base + i * step},10.0.{i % 7}.1,"
                     f"100.{64 + remote // 65536}.{(remote // 256) % 256}.{remote % 256},40000,443,{64 + i % 1400}")
    lines.append(f"new,OP_INSERT,{micros(T0 + timedelta(days=1, minutes=1))}")
    harness.deliver("r1", "\n".join(lines) + "\n")

    # Default settings: only where the data lives and the fixed processing clock are set.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAFFIC_", "SPARK_"))}
    env.update(TRAFFIC_WAREHOUSE=str(harness.settings.warehouse), TRAFFIC_INBOX=str(harness.settings.inbox),
               TRAFFIC_NOW="2026-12-01T00:00:00+00:00")
    job = subprocess.Popen([sys.executable, "-m", "traffic.app.cli", "run"], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    jvm = JvmSeen(job.pid)
    jvm.start()
    with PeakMemory(job.pid) as memory:
        output, _ = job.communicate(timeout=600)
    jvm.join(timeout=10)
    assert job.returncode == 0, output
    # The sampler runs from the job's start to its end, every 0.1 s, and the JVM (seen in the tree) lives
    # for all of the job's Spark work inside that; a tree without the JVM would hold nothing to the bound.
    assert memory.samples >= 1 and jvm.seen.is_set(), "the job's JVM was never seen in its process tree"

    batches = harness.table("batches")
    assert [b["packets_on_time"] for b in batches] == [PACKETS]
    daily = harness.table("daily")
    assert len({r["remote_ip"] for r in daily}) == REMOTES
    assert sum(r["bytes"] for r in daily) == sum(64 + i % 1400 for i in range(PACKETS))
    print(f"\npeak resident memory of the job's process tree: {memory.peak / 2**30:.2f} GiB")
    assert memory.peak < LIMIT, f"peak {memory.peak / 2**30:.2f} GiB"
