"""The compose stack's per-hour close latency, spark-submit vs the warm Spark (issue 39: out of the tests).

    .venv/bin/python bench/compose.py        (root, or a Docker engine that answers; about 10 minutes)

The stack of ``docker-compose.yml`` built and started as ``tests/compose`` does it (``running_stack``:
the bases from Debian's packages, the stack's image, `up`, every health check), then the test's two
phases (``run_phases``): the demo's deliveries and a router feed ingested by `traffic_ingest` and a
backfill of `traffic_hourly` with spark-submit (spark-connect stopped), then three more hours and a
backfill as a client of the warm `spark-connect`. Printed per way: the `ingest` task's duration, the
backfill's freezing run (it freezes every hour of the range in one step), the median of the runs that
only re-check final hours, and the midnight run with its day roll-up. A run's time is Airflow's, from
the run's start to its end. ``down -v`` at the end, whatever happened.

There is no target: the figures are recorded in ``docs/benchmarks.md``. The test asserts what the runs
did (each succeeded, froze or rolled up once, ran Spark the way it should); a wall-clock bound on two
cores shared with the rest of the suite failed for the load (the freezing run took 44 s alone, 75 s
beside the suite), and the one bound that holds whatever the load, the close task's 30-minute
``execution_timeout``, is Airflow's own: a run past it fails, and the test then fails on its state.
Exit status 1 if the stack or a run failed, 2 if no Docker engine can run here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

WAYS = ("spark-submit", "connect")


def run_seconds(run: dict) -> float:
    """An Airflow run's wall time, from its start to its end (its own clock)."""
    start, end = (datetime.fromisoformat(run[k].replace("Z", "+00:00")) for k in ("start_date", "end_date"))
    return (end - start).total_seconds()


def close_latency(facts: dict) -> list[str]:
    """One line per way: the ingest task, the freezing run, the re-checking runs' median, the midnight run."""
    lines = []
    for way in WAYS:
        runs = facts[f"backfill {way}"]
        rest = [run_seconds(r) for r in runs[1:] if not r["close"]["rolled_up_day"]]
        line = (f"{way}: ingest task {facts[f'ingest {way}']['duration']:.1f} s; freezing run "
                f"{run_seconds(runs[0]):.1f} s; re-checking runs median {statistics.median(rest):.1f} s (n={len(rest)})")
        roll_up = [run_seconds(r) for r in runs if r["close"]["rolled_up_day"]]
        if roll_up:
            line += f"; the midnight run with the day roll-up {roll_up[0]:.1f} s"
        lines.append(line)
    return lines


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    from tests.compose.conftest import NoEngine, compose_command, running_stack, start_engine
    from tests.compose.test_stack import run_phases

    try:
        env, stop = start_engine()
    except NoEngine as why:
        print(f"bench/compose.py: {why}", file=sys.stderr)
        return 2
    try:
        compose_command(env)
        with tempfile.TemporaryDirectory(prefix="bench-compose-") as home:
            deliveries = Path(home) / "deliveries"
            deliveries.mkdir()
            with running_stack(env, Path(home), f"traffic-bench-{os.getpid()}") as stack:
                facts, _ = run_phases(stack, deliveries)
    except NoEngine as why:
        print(f"bench/compose.py: {why}", file=sys.stderr)
        return 2
    except AssertionError as failure:
        print(f"bench/compose.py: the stack failed: {failure}", file=sys.stderr)
        return 1
    finally:
        stop()
    print("compose: " + ", ".join(f"{k} {v:.0f} s" for k, v in stack.seconds.items()))
    for line in close_latency(facts):
        print(f"compose close latency — {line}")
    if stack.left:
        print(f"bench/compose.py: left after down -v: {stack.left}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
