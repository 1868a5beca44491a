"""Hourly close: one run per event-time hour — freeze it, roll up a closed day or month, expire, publish.

Each run owns the data interval `[start, end)` of one UTC hour (a real one-hour interval:
`CronDataIntervalTimetable("0 * * * *")`), and every date it uses comes from that interval.

| task | what it does | Spark? |
|---|---|---|
| `wait_for_watermark` | sensor (`mode="reschedule"`, poke every 60 s, **timeout 2 h**): waits until the watermark `W` has reached the interval end | no |
| `close` | each step only when it is due, **decided under the warehouse lock** by the close's own planner (`plan_close`, as `traffic close` plans; delta-rs reads, no JVM) at the moment the step comes: **freeze** (`jobs/close.py --until <interval end> --only freeze`: final rows, ledger row and checks of each closed hour) unless every hour up to the interval end is already final — in a **backfill** run, every hour the watermark has closed, so the backfill's first run freezes its whole range in one Spark application and the later runs only re-check; **roll up the days** (`--only days`) closed by the interval end and not rolled up yet (at midnight UTC the day just ended; otherwise a day still waiting: catch-up); **roll up the months** (`--only months`) likewise; **expire** raw detail older than `keep_hours` (in the worker, no JVM with the `rs` engine); then **send the alerts** not sent yet (the `alerts` table, written by the freeze) through an Airflow notifier — mail via the SMTP connection `alerts_smtp_conn_id` when configured, else a log line each; each alert once, across reruns and backfills; sent even when a step before failed. A step's Spark job takes the lock again, plans again and reports what it did (`--report`). Its XCom (`return_value`) is what **this run** did, from those reports: `froze`, `rolled_up_day`, `rolled_up_month` (true only when this run's job did it), `freeze` / `day` / `month` (each step's `outcome` — `froze`, `already_frozen`, `rolled_up`, `already_rolled_up`, `waiting`, `not_due` — and the hours, days or months), `spark` (`warm server`, `spark-submit`, or none), `expire`, `alerts`; its last log line says the same in words | only for a step that is due |
| `publish_data_quality` | reads the interval's ledger rows; **fails** if any has `dq_status = failed`, logs a summary | no |

Three tasks, not one per step: Airflow's start-up of a task costs about half a second, and most runs
of a backfill only re-check (issue 26); the `close` task's log and XCom keep each step visible.

Choices:

* **`catchup=False`.** Freezing and roll-ups catch up by themselves (each close freezes every
  closed hour up to its interval end, in order), so after downtime the next run closes
  everything missed; history is re-run explicitly with a backfill (`airflow backfill create
  --dag-id traffic_hourly …`), where each run re-checks its hour in seconds.
* **`max_active_runs=1`.** Hours close in order, and every close step takes the warehouse
  lock anyway; a second run would only wait.
* **Which run rolls up day `D`.** The run whose Spark job first holds the warehouse lock while
  `D` is due — all its hours frozen and published, and `D` ending by that run's interval end.
  Runs one at a time in order (this DAG, or a backfill with `max_active_runs` 1) make that
  `D`'s midnight run: the runs before it find no day due (a backfill's first run freezes every
  closed hour but rolls up only the days ending by its own interval end). With runs that overlap
  (a backfill's `max_active_runs` above 1, or a live run of a later hour beside it) or a backfill
  run backwards, a later run may catch `D` up first; the midnight run then records
  `already_rolled_up`. Either way `daily` and the ledger get `D` once (one
  roll-up commit), and exactly one run records `rolled_up_day: true`. A month likewise.
  No run waits for another's midnight run: one that stays queued (a paused backfill) would
  hold the day back.
* **Wait timeout 2 h** (`source_timeout` of 1 h + ingest cadence + margin): with a stalled
  source the watermark moves on after `source_timeout`; if it still has not passed after
  2 h, every feed is silent — the run fails so someone looks, and the next run closes the
  missed hours once data flows again.
* Retries: 2 (Spark start-up failures are transient); the sensor timeout is not retried.

Settings (`TRAFFIC_WAREHOUSE`, `TRAFFIC_INBOX`, `TRAFFIC_KEEP_HOURS`, `TRAFFIC_CONFIG`, …) come
from the worker's environment when a task runs and are passed on to `spark-submit`. With `TRAFFIC_SPARK_CONNECT` set
(the compose stack's `spark-connect` service, or `auto`: the warm server `make airflow` starts), the
`close` task runs its Spark steps as clients of that warm server while it answers, and starts no
JVM; its log and its XCom say which way they ran.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import CronDataIntervalTimetable, dag, task

WAIT_TIMEOUT = timedelta(hours=2)


@dag(
    dag_id="traffic_hourly",
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["traffic", "close", "spark"],
    default_args={"owner": "traffic", "retries": 2, "retry_delay": timedelta(minutes=2)},
)
def traffic_hourly():
    @task.sensor(task_id="wait_for_watermark", mode="reschedule", poke_interval=60,
                 timeout=WAIT_TIMEOUT.total_seconds())
    def wait_for_watermark(data_interval_end=None) -> bool:
        """Has the watermark passed this interval's end? (Arrow only, no JVM.)"""
        from traffic.orchestration.dag_support import watermark_sensor

        return watermark_sensor(data_interval_end)

    @task(execution_timeout=timedelta(minutes=30))
    def close(data_interval_end=None, dag_run=None) -> dict:
        """Freeze, roll up a closed day or month, expire, send alerts: each step only when due (decided under the
        warehouse lock); returns what this run did."""
        from traffic.orchestration.dag_support import close_interval

        return close_interval(data_interval_end, dag_run.run_type)

    @task
    def publish_data_quality(data_interval_start=None, data_interval_end=None) -> dict:
        """Fail when any period this interval closes failed its checks; log the summary."""
        from traffic.orchestration.dag_support import publish_data_quality

        return publish_data_quality(data_interval_start, data_interval_end)

    wait_for_watermark() >> close() >> publish_data_quality()


traffic_hourly()
