"""A real Airflow runs the pipeline: micro-batch ingest, then `traffic_hourly` backfilled across a midnight.

The scenario itself (start Airflow, drop the files, trigger, backfill) is the ``hourly_backfill``
fixture in ``conftest.py``, shared with the browser test. Here: what it must have produced —
in the Delta tables (read with Arrow, no Spark) and in the runs' and tasks' states.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from traffic import state as st
from traffic.delta import Warehouse

pytestmark = pytest.mark.slow


def _warehouse(airflow) -> Warehouse:
    return Warehouse(airflow.settings(), engine="rs")


def _hours(start, end):
    hour, out = start, []
    while hour < end:
        out.append(hour)
        hour += timedelta(hours=1)
    return out


def test_micro_batch_ingests_once_and_skips_spark_when_nothing_is_new(airflow, hourly_backfill):
    runs = {r["dag_run_id"]: r for r in hourly_backfill.ingest_runs}
    triggered = runs[hourly_backfill.triggered_ingest["dag_run_id"]]
    assert triggered["run_type"] == "manual" and triggered["state"] == "success", triggered
    assert all(r["state"] == "success" for r in runs.values()), {k: (r["state"], r["tasks"]) for k, r in runs.items()}
    ingested = [k for k, r in runs.items() if r["tasks"]["ingest"] == "success"]
    skipped = [k for k, r in runs.items() if r["tasks"]["ingest"] == "skipped"]
    assert len(ingested) == 1 and len(skipped) == len(runs) - 1 >= 1, {k: r["tasks"] for k, r in runs.items()}

    warehouse = _warehouse(airflow)
    batches = st.rows(warehouse.table("batches").read_arrow())
    expected_packets = sum(p for _, p in hourly_backfill.expected.values())
    assert [(b["batch_id"], b["packets_on_time"], b["ticks"], b["packets_late"], b["records_rejected"])
            for b in batches] == [(1, expected_packets, 1, 0, 0)]
    assert st.read_clock_state(warehouse).watermark == hourly_backfill.end


def test_backfill_freezes_every_hour_and_rolls_up_the_day_once_at_midnight(airflow, hourly_backfill):
    scenario = hourly_backfill
    hours = _hours(scenario.start, scenario.end)
    assert [r["data_interval_start"][:16] for r in scenario.runs] == [f"{h:%Y-%m-%dT%H:%M}" for h in hours]
    for run in scenario.runs:
        at_midnight = run["data_interval_end"].startswith(f"{scenario.midnight:%Y-%m-%dT%H:%M}")
        assert run["state"] == "success", run
        assert run["tasks"] == {
            "wait_for_watermark": "success", "freeze_needed": "success", "freeze": "success",
            "day_closes": "success", "roll_up_day": "success" if at_midnight else "skipped",
            "month_closes": "success", "roll_up_month": "skipped",
            "expire": "success", "publish_data_quality": "success",
        }, run["dag_run_id"]

    warehouse = _warehouse(airflow)
    ledger = st.read_ledger(warehouse)
    frozen = {r["period_start"]: r for r in ledger if r["grain"] == "hour"}
    assert sorted(frozen) == hours
    for hour in hours:
        assert (frozen[hour]["bytes"], frozen[hour]["packets"]) == tuple(scenario.expected[hour]), hour
        assert frozen[hour]["dq_status"] in ("passed", "warning") and frozen[hour]["late_bytes"] == 0  # published
    hourly = st.rows(warehouse.table("hourly").read_arrow(columns=["hour", "bytes", "status"]))
    assert {r["status"] for r in hourly} == {"final"}
    for hour in hours:
        assert sum(r["bytes"] for r in hourly if r["hour"] == hour) == scenario.expected[hour][0]

    # The day before the midnight is rolled up exactly once; the day after is not closed yet.
    day = scenario.midnight - timedelta(days=1)
    days = [r for r in ledger if r["grain"] == "day"]
    assert [r["period_start"] for r in days] == [day] and days[0]["dq_status"] in ("passed", "warning")
    day_bytes = sum(scenario.expected[h][0] for h in hours if h < scenario.midnight)
    assert days[0]["bytes"] == day_bytes
    daily = st.rows(warehouse.table("daily").read_arrow(columns=["day", "bytes"]))
    assert {r["day"] for r in daily} == {day.date()} and sum(r["bytes"] for r in daily) == day_bytes
    roll_ups = [h for h in warehouse.table("daily").history() if h.get("traffic.op") == "roll_up"]
    assert len(roll_ups) == 1, roll_ups
    assert [r for r in ledger if r["grain"] == "month"] == []
    assert warehouse.table("monthly").read_arrow().num_rows == 0

    # Raw detail: keep_hours=1 behind hour_floor(W) — only the last hour's packets are left,
    # expired by the `expire` tasks in the worker without a JVM.
    packets = st.rows(warehouse.table("packets").read_arrow(columns=["hour", "bytes"]))
    assert {r["hour"] for r in packets} == {scenario.end - timedelta(hours=1)}
    assert sum(r["bytes"] for r in packets) == scenario.expected[scenario.end - timedelta(hours=1)][0]
    expired = [airflow.api.get(f"/api/v2/dags/traffic_hourly/dagRuns/{r['dag_run_id']}/taskInstances/expire"
                               "/xcomEntries/return_value?deserialize=true")["value"] for r in scenario.runs]
    assert [e["spark_started"] for e in expired] == [False] * len(scenario.runs), expired
    assert sum(e["expired_hours"] for e in expired) == len(scenario.runs) - 1, expired


def test_rerunning_a_final_hour_rechecks_without_spark(airflow, hourly_backfill):
    """Clearing a finished run re-runs it: the freeze is skipped (already final) and no table changes."""
    api, warehouse = airflow.api, _warehouse(airflow)
    run = next(r for r in hourly_backfill.runs if r["data_interval_start"].startswith(
        f"{hourly_backfill.midnight:%Y-%m-%dT%H:%M}"))
    versions = {name: warehouse.table(name).version() for name in ("hourly", "periods", "daily", "packets")}
    clock = time.monotonic()
    api.post(f"/api/v2/dags/traffic_hourly/dagRuns/{run['dag_run_id']}/clear", {"dry_run": False})
    time.sleep(2)
    again = api.wait_run("traffic_hourly", run["dag_run_id"], timeout=180, home=airflow.home)
    seconds = time.monotonic() - clock
    tasks = api.task_states("traffic_hourly", run["dag_run_id"])
    assert again["state"] == "success", tasks
    assert tasks["freeze"] == "skipped" and tasks["roll_up_day"] == "skipped" and tasks["roll_up_month"] == "skipped"
    assert tasks["publish_data_quality"] == "success" and tasks["expire"] == "success"
    assert {name: warehouse.table(name).version() for name in versions} == versions
    assert seconds < 90, f"a re-check took {seconds:.0f}s"
