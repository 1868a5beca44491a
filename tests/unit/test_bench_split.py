"""bench/suite.py's split of an Airflow backfill's time: tasks, gaps inside a run, gaps between runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parents[2] / "bench" / "suite.py"


@pytest.fixture(scope="module")
def suite():
    spec = importlib.util.spec_from_file_location("bench_suite", SUITE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(start: str, end: str, *tasks: tuple[str, str]) -> dict:
    return {"start_date": f"2026-11-26T10:00:{start}Z", "end_date": f"2026-11-26T10:00:{end}Z",
            "task_instances": [{"start_date": f"2026-11-26T10:00:{a}Z", "end_date": f"2026-11-26T10:00:{b}Z"}
                               for a, b in tasks]}


def test_a_backfills_time_splits_into_tasks_gaps_inside_runs_and_gaps_between_runs(suite):
    runs = [_run("10", "14", ("10.5", "11"), ("11.5", "12.5"), ("13", "13.5")),  # 2 s of tasks in a 4 s run
            _run("01", "04", ("01.5", "02.5"), ("03", "03.5"))]  # the first run (given out of order): 1.5 s in 3 s
    split = suite.run_time_split(runs)
    assert split == pytest.approx({"tasks": 1.75, "inside a run": 1.75, "between runs": 6.0})
    per_run = split["tasks"] + split["inside a run"]
    assert per_run * 2 + split["between runs"] == pytest.approx(13.0)  # 10:00:01 → 10:00:14, all accounted for


def test_a_backfills_span_ends_with_its_last_run_and_says_when_airflow_marked_it_complete(suite):
    backfill = {"created_at": "2026-11-26T10:00:00Z", "completed_at": "2026-11-26T10:00:40Z"}
    runs = [_run("03", "05"), _run("06", "12"), _run("13", "14")]
    assert suite.backfill_time(backfill, runs) == {"to_last_run": 14.0, "before_first_run": 3.0,
                                                   "marked_complete_after": 26.0}
