"""``traffic spark start|status|stop``: a warm Spark Connect server that later jobs on the warehouse use.

With the default ``spark_master = auto`` a job connects to the warehouse's recorded server
instead of starting a JVM; ``stop`` ends the server's whole process group and removes the
record; a record whose process is gone is stale and ignored. (A client killed mid-batch is
covered by ``test_crash_points.py``, whose killed commands are clients of such a server.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tests.support.harness import feed_line, tick_line
from traffic.runtime.connect import record_path, recorded_server, write_record

UTC = timezone.utc
T0 = datetime(2026, 11, 1, 10, tzinfo=UTC)


def _traffic(*args, timeout=300):
    command = [str(Path(sys.executable).with_name("traffic")), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in os.environ.items() if not k.startswith("TRAFFIC_")})


def _gone(pid: int, within: float = 10) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_a_warm_server_serves_later_jobs_and_stops_cleanly(tmp_path):
    warehouse, inbox = tmp_path / "warehouse", tmp_path / "inbox"
    (inbox / "r1").mkdir(parents=True)
    where = ["--warehouse", str(warehouse), "--inbox", str(inbox)]
    assert "no warm server" in _traffic("spark", "status", *where).stdout

    started = _traffic("spark", "start", *where)
    try:
        assert started.returncode == 0, started.stderr
        record = recorded_server(warehouse / "_traffic")
        assert record and record["url"].startswith("sc://localhost:"), started.stdout  # the server binds 127.0.0.1
        again = _traffic("spark", "start", *where)
        assert "already running" in again.stdout and recorded_server(warehouse / "_traffic")["pid"] == record["pid"]

        (inbox / "r1" / "a.csv").write_text("".join(feed_line(T0 + timedelta(minutes=m)) + "\n" for m in range(5))
                                            + tick_line(T0 + timedelta(hours=1)) + "\n")
        run = _traffic("run", *where, "--set", "now=2026-12-01T00:00:00+00:00")
        assert run.returncode == 0, run.stderr
        assert f"connecting to the warm Spark at {record['url']}" in run.stderr, run.stderr
        assert "starting Spark (" not in run.stderr
        assert "5 on time" in run.stdout and "1 hour(s) frozen" in run.stdout, run.stdout
    finally:
        stopped = _traffic("spark", "stop", *where)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    assert _gone(record["pid"]), "the server outlived `traffic spark stop`"
    assert not record_path(warehouse / "_traffic").exists()
    assert "no warm server" in _traffic("spark", "stop", *where).stdout


def test_a_stale_record_is_ignored_and_removed(tmp_path):
    state = tmp_path / "_traffic"
    state.mkdir()
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(done.stdout)  # a process that has exited
    write_record(state, {"pid": dead_pid, "port": 9, "url": "sc://localhost:9", "token": "t"})
    assert recorded_server(state) is None
    assert not record_path(state).exists()


def test_auto_resolves_to_local_without_a_server_and_explicit_masters_win(tmp_path):
    from traffic.core.settings import load_settings
    from traffic.runtime.spark import LOCAL_MASTER, resolve_master

    auto = load_settings(environ={}, overrides={"warehouse": tmp_path / "w"})
    assert auto.spark_master == "auto" and resolve_master(auto) == LOCAL_MASTER
    explicit = auto.replace(spark_master="sc://127.0.0.1:15002")
    assert resolve_master(explicit) == "sc://127.0.0.1:15002"
