"""A day of traffic for 100,000 distinct remote addresses runs within memory with the default settings."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import psutil
import pytest

from tests.harness import Harness, micros

UTC = timezone.utc
T0 = datetime(2026, 11, 1, tzinfo=UTC)
REMOTES = 100_000
PACKETS = 300_000


class PeakMemory:
    """Samples the resident memory of this process and all its children (JVM, Python workers)."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for process in [me, *me.children(recursive=True)]:
                try:
                    total += process.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            time.sleep(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@pytest.mark.slow
def test_a_day_with_100k_distinct_remote_addresses(spark, tmp_path):
    harness = Harness(tmp_path, spark)
    step = 86_400_000_000 // PACKETS
    base = micros(T0)
    lines = []
    for i in range(PACKETS):
        remote = i % REMOTES
        lines.append(f"new,OP_INSERT,{base + i * step},10.0.{i % 7}.1,"
                     f"100.{64 + remote // 65536}.{(remote // 256) % 256}.{remote % 256},40000,443,{64 + i % 1400}")
    lines.append(f"new,OP_INSERT,{micros(T0 + timedelta(days=1, minutes=1))}")
    harness.deliver("r1", "\n".join(lines) + "\n")
    with PeakMemory() as memory:
        result = harness.ingest()
        harness.close()
    assert result.packets_on_time == PACKETS
    daily = harness.table("daily")
    assert len({r["remote_ip"] for r in daily}) == REMOTES
    assert sum(r["bytes"] for r in daily) == sum(64 + i % 1400 for i in range(PACKETS))
    print(f"\npeak resident memory of the test process tree: {memory.peak / 2**30:.2f} GiB")
    assert memory.peak < 4 * 2**30, f"peak {memory.peak / 2**30:.2f} GiB"
