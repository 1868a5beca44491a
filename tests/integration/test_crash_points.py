"""Crash anywhere: stop ingest and close at every named write step, run again, get the same tables.

Every fault point of the Delta layer (files written / committed, per table and operation)
reached by a scenario of two ingests and two closes is enumerated from a clean run. For each
one, the scenario is stopped there and the interrupted command is run again: the tables must
equal the uninterrupted run's, row for row, and conservation must hold. In-process the stop
raises at the step (leaving exactly what a kill leaves on disk); a sample of points is also
killed for real with SIGKILL in a separate process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.harness import Harness, feed_line, tick_line
from traffic import delta

UTC = timezone.utc
T0 = datetime(2026, 10, 31, 22, tzinfo=UTC)


def _deliveries():
    first = [feed_line(T0 + timedelta(minutes=m), "10.0.0.1", "192.0.2.1", size=100 + m) for m in range(0, 120, 7)]
    first += ["new,OP_INSERT,bad,1,2,3,4,5", tick_line(T0 + timedelta(hours=2, minutes=5))]
    second = [feed_line(T0 + timedelta(hours=1, minutes=3), size=999)]  # late by then
    second += [feed_line(T0 + timedelta(hours=2, minutes=m), "10.0.0.2", size=50) for m in range(10, 200, 9)]
    second += [tick_line(T0 + timedelta(hours=27))]  # crosses midnight: a day and a month roll up
    return [("r1", "\n".join(first) + "\n"), ("r1", "\n".join(second) + "\n")]


SCENARIO = ["ingest", "close", "ingest", "close"]


def _run(harness: Harness, start: int = 0) -> None:
    for index in range(start, len(SCENARIO)):
        _run_one(harness, index)


def _snapshot(harness: Harness) -> dict:
    from traffic.schemas import TABLES, columns

    skip = {"batches": {"started_at", "committed_at", "files"}}
    return {name: sorted(map(repr, ({c: r[c] for c in columns(name) if c not in skip.get(name, ())}
                                    for r in harness.table(name)))) for name in TABLES}


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory):
    harness = Harness(tmp_path_factory.mktemp("clean"), spark, keep_hours=1)
    points, counts = [], {}
    for index in range(len(SCENARIO)):
        delta.STEPS_REACHED.clear()
        _run_one(harness, index)
        for step in delta.STEPS_REACHED:
            counts[step] = counts.get(step, 0) + 1
            points.append((f"{step}#{counts[step]}", index))
    return _snapshot(harness), points


def test_scenario_reaches_many_kill_points(reference):
    points = [p for p, _ in reference[1]]
    assert len(points) >= 30, points
    assert any(p.startswith("packets.ingest.files_written") for p in points)
    assert any(p.startswith("daily.roll_up.committed") for p in points)
    assert any(p.startswith("monthly.roll_up.committed") for p in points)
    assert any(p.startswith("packets.expire.committed") for p in points)


def _crash_and_rerun(spark, root: Path, point: str) -> Harness:
    harness = Harness(root, spark, keep_hours=1, fault_at=f"{point}!raise")
    for index in range(len(SCENARIO)):
        try:
            _run_one(harness, index)
        except delta.SimulatedCrash:
            clean = Harness(root, spark, keep_hours=1)
            _run(clean, start=index)
            return clean
    raise AssertionError(f"fault point {point} was never reached")


def _run_one(harness: Harness, index: int) -> None:
    deliveries = _deliveries()
    if SCENARIO[index] == "ingest":
        number = SCENARIO[: index + 1].count("ingest") - 1
        path = harness.root / "inbox" / deliveries[number][0] / f"d{number}.csv"
        if not path.exists():
            harness.deliver(deliveries[number][0], deliveries[number][1], name=f"d{number}.csv")
        harness.ingest()
    else:
        harness.close()


@pytest.mark.slow
def test_crash_at_every_point_then_rerun_equals_uninterrupted(spark, reference, tmp_path):
    """All points, one test: each point builds a fresh warehouse, stops there, reruns, compares."""
    expected, points = reference
    survived = []
    for number, (point, _) in enumerate(points):
        root = tmp_path / f"p{number}"
        harness = _crash_and_rerun(spark, root, point)
        got = _snapshot(harness)
        for name in expected:
            assert got[name] == expected[name], f"after a crash at {point}, table {name} differs"
        batches = harness.table("batches")
        accepted = sum(b["bytes_on_time"] + b["bytes_late"] for b in batches)
        assert accepted == sum(r["bytes"] for r in harness.table("hourly")) + sum(
            r["bytes"] for r in harness.table("late_packets")), point
        survived.append(point)
    assert len(survived) == len(points) >= 30


@pytest.mark.slow
@pytest.mark.parametrize("point", ["packets.ingest.committed#1", "hourly.ingest.files_written#2",
                                   "periods.freeze.committed#1", "daily.roll_up.committed#1"])
def test_real_sigkill_then_rerun_equals_uninterrupted(spark, reference, tmp_path, point):
    """The process kills itself (SIGKILL) at the point; a rerun converges to the uninterrupted tables."""
    expected, points = reference
    command_of = dict(points)
    assert point in command_of, sorted(command_of)
    index = command_of[point]
    harness = Harness(tmp_path, spark, keep_hours=1)
    for earlier in range(index):
        _run_one(harness, earlier)
    # Occurrences are counted from the killed process's own start: the first one inside that command.
    name = point.split("#")[0]
    nth = [p for p, i in points if p.split("#")[0] == name and i == index].index(point) + 1
    if SCENARIO[index] == "ingest":
        number = SCENARIO[: index + 1].count("ingest") - 1
        source, text = _deliveries()[number]
        harness.deliver(source, text, name=f"d{number}.csv")
    command = [sys.executable, "-m", "traffic.cli", SCENARIO[index], "--warehouse", str(tmp_path / "warehouse"),
               "--inbox", str(tmp_path / "inbox"), "--set", "keep_hours=1", "--set",
               f"now={harness.settings.now.isoformat()}", "--set", f"fault_at={name}#{nth}"]
    completed = subprocess.run(command, env={**os.environ, "TZ": "UTC"}, capture_output=True, text=True, timeout=300)
    assert completed.returncode == -signal.SIGKILL, completed.stderr[-2000:]
    _run(harness, start=index)
    got = _snapshot(harness)
    for table in expected:
        assert got[table] == expected[table], f"after SIGKILL at {point}, table {table} differs"
