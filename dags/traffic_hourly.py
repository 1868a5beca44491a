"""Hourly close: one run per event-time hour — freeze it, roll up a closed day or month, expire, publish.

Each run owns the data interval `[start, end)` of one UTC hour (a real one-hour interval:
`CronDataIntervalTimetable("0 * * * *")`), and every date it uses comes from that interval.

| task | what it does | Spark? |
|---|---|---|
| `wait_for_watermark` | sensor (`mode="reschedule"`, poke every 60 s, **timeout 2 h**): waits until the watermark `W` has reached the interval end | no |
| `freeze_needed` | "already final?" — if every hour up to the interval end is frozen, the freeze is **skipped** (final hours are re-checked below, never recomputed) | no |
| `freeze` | `jobs/close.py --until <interval end> --only freeze`: final rows, ledger row and checks of each closed hour; in a **backfill** run, every hour the watermark has closed (no `--until`), so the backfill's first run freezes its whole range in one Spark application and the later runs find their hours final | yes |
| `day_closes` → `roll_up_day` | roll up the day only when the interval ends at midnight UTC, or a closed day is still waiting (catch-up); otherwise `roll_up_day` is **skipped** | only when it runs |
| `month_closes` → `roll_up_month` | the same for a month (`--only months`) | only when it runs |
| `expire` | raw detail older than `keep_hours` (`close --only expire`, in the worker, no JVM with the `rs` engine) | no |
| `publish_data_quality` | reads the interval's ledger rows; **fails** if any has `dq_status = failed`, logs a summary | no |
| `notify_alerts` | sends the quota/commit alerts not sent yet (the `alerts` table, written by the freeze) through an Airflow notifier: mail via the SMTP connection `alerts_smtp_conn_id` when configured, else a log line each; each alert once, across reruns and backfills | no |

Choices:

* **`catchup=False`.** Freezing and roll-ups catch up by themselves (each close freezes every
  closed hour up to its interval end, in order), so after downtime the next run closes
  everything missed; history is re-run explicitly with a backfill (`airflow backfill create
  --dag-id traffic_hourly …`), where each run re-checks its hour in seconds.
* **`max_active_runs=1`.** Hours close in order, and every close step takes the warehouse
  lock anyway; a second run would only wait. (A backfill has its own `max_active_runs`: use 1.)
* **Wait timeout 2 h** (`source_timeout` of 1 h + ingest cadence + margin): with a stalled
  source the watermark moves on after `source_timeout`; if it still has not passed after
  2 h, every feed is silent — the run fails so someone looks, and the next run closes the
  missed hours once data flows again.
* Retries: 2 (Spark start-up failures are transient); the sensor timeout is not retried.

Settings (`TRAFFIC_WAREHOUSE`, `TRAFFIC_INBOX`, `TRAFFIC_KEEP_HOURS`, `TRAFFIC_CONFIG`, …) come
from the worker's environment when a task runs and are passed on to `spark-submit`. With `TRAFFIC_SPARK_CONNECT` set
(the compose stack's `spark-connect` service), a Spark task runs its job as a client of that warm
server while it answers, and starts no JVM; the task log says which way it ran.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import CronDataIntervalTimetable, TriggerRule, dag, task

ROOT = Path(__file__).absolute().parent.parent
CLOSE_JOB = str(ROOT / "jobs" / "close.py")
UNTIL = "{{ data_interval_end | ts }}"
#: A backfill run freezes every hour the watermark has closed: freezing is decided by the watermark, not
#: by when it runs (contract §3), so one Spark application does the whole range and the backfill's
#: later runs only re-check. Roll-ups keep their interval end: a day still closes only at its midnight.
FREEZE_UNTIL = "{{ '' if dag_run.run_type == 'backfill' else (data_interval_end | ts) }}"
WAIT_TIMEOUT = timedelta(hours=2)


class WarmSparkSubmitOperator(SparkSubmitOperator):
    """spark-submit, or a client of the warm Spark Connect server while one answers (the task log says which)."""

    def execute(self, context):
        from traffic.orchestration.dag_support import run_spark_step

        return run_spark_step(self, lambda: super(WarmSparkSubmitOperator, self).execute(context))


def _pass_settings(context) -> None:
    """Hand the worker's TRAFFIC_* settings to spark-submit, read when the task runs (not at parse);
    the quick-starting JVM unless TRAFFIC_SPARK_JIT says otherwise."""
    from traffic.orchestration.dag_support import prepare_spark_submit

    prepare_spark_submit(context["task"], quick_by_default=True)


def _pass_settings_and_say_the_bound(context) -> None:
    """``_pass_settings``, and the freeze's bound in the task log (a backfill run freezes all it can)."""
    from traffic.orchestration.dag_support import say_freeze_bound

    _pass_settings(context)
    say_freeze_bound(str(context["dag_run"].run_type), context["data_interval_end"])


def _close_step(task_id: str, step: str, until: str = UNTIL, **kwargs) -> SparkSubmitOperator:
    """One step of `traffic close`, bounded by ``until`` (the interval end), as its own Spark application."""
    return WarmSparkSubmitOperator(
        task_id=task_id,
        application=CLOSE_JOB,
        application_args=["--until", until, "--only", step],
        name=f"traffic-close-{step}",
        conn_id="spark_default",
        pre_execute=_pass_settings_and_say_the_bound if step == "freeze" else _pass_settings,
        execution_timeout=timedelta(minutes=30),
        **kwargs,
    )


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
        from traffic.orchestration.dag_support import watermark_passed

        return watermark_passed(data_interval_end)

    @task.short_circuit(ignore_downstream_trigger_rules=False)
    def freeze_needed(data_interval_end=None) -> bool:
        """Already final? Then skip the freeze and let the later steps re-check."""
        from traffic.orchestration.dag_support import freeze_needed

        return freeze_needed(data_interval_end)

    @task.short_circuit(trigger_rule=TriggerRule.NONE_FAILED, ignore_downstream_trigger_rules=False)
    def day_closes(data_interval_end=None) -> bool:
        """Midnight UTC, or a closed day still waiting: otherwise the day roll-up is skipped."""
        from traffic.orchestration.dag_support import day_closes

        return day_closes(data_interval_end)

    @task.short_circuit(trigger_rule=TriggerRule.NONE_FAILED, ignore_downstream_trigger_rules=False)
    def month_closes(data_interval_end=None) -> bool:
        """First midnight of a month, or a closed month still waiting: otherwise skipped."""
        from traffic.orchestration.dag_support import month_closes

        return month_closes(data_interval_end)

    @task(trigger_rule=TriggerRule.NONE_FAILED)
    def expire(data_interval_end=None) -> dict:
        """Expire raw detail older than keep_hours (delta-rs only: no JVM in the worker)."""
        from traffic.orchestration.dag_support import expire_raw_detail

        return expire_raw_detail(data_interval_end)

    @task(trigger_rule=TriggerRule.NONE_FAILED)
    def publish_data_quality(data_interval_start=None, data_interval_end=None) -> dict:
        """Fail when any period this interval closes failed its checks; log the summary."""
        from traffic.orchestration.dag_support import publish_data_quality

        return publish_data_quality(data_interval_start, data_interval_end)

    @task(trigger_rule=TriggerRule.ALL_DONE)
    def notify_alerts() -> dict:
        """Send alerts not sent yet, each once (even when another period of the interval failed its checks:
        alerts come from published hours only)."""
        from traffic.orchestration.dag_support import notify_alerts

        return notify_alerts()

    freeze = _close_step("freeze", "freeze", until=FREEZE_UNTIL)
    roll_up_day = _close_step("roll_up_day", "days")
    roll_up_month = _close_step("roll_up_month", "months")

    (
        wait_for_watermark()
        >> freeze_needed()
        >> freeze
        >> day_closes()
        >> roll_up_day
        >> month_closes()
        >> roll_up_month
        >> expire()
        >> publish_data_quality()
        >> notify_alerts()
    )


traffic_hourly()
