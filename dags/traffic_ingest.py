"""Micro-batch ingest: every few minutes, take what is new in the inbox in one Spark job.

| task | what it does | Spark? |
|---|---|---|
| `inbox_has_new_files` | short-circuit: is there a file no batch has handled (or an interrupted batch to finish)? If not, `ingest` is **skipped** and the run ends in seconds | no |
| `ingest` | `jobs/ingest.py`: one micro-batch — classify every record (on time, late, rejected, tick), advance the clocks and the watermark, refresh the open hours ("this hour so far") | yes |

Every **5 minutes** by default; set `TRAFFIC_INGEST_EVERY_MINUTES` in the environment of the
Airflow scheduler and DAG processor to change it (read when the file is parsed: it is the
schedule). `max_active_runs=1` and no catchup: a batch takes everything new, so a missed tick
is simply folded into the next one, and two batches never race for the warehouse lock.

Settings (`TRAFFIC_WAREHOUSE`, `TRAFFIC_INBOX`, `TRAFFIC_CONFIG`, …) come from the worker's
environment when a task runs and are passed on to `spark-submit`. With `TRAFFIC_SPARK_CONNECT` set
(the compose stack's `spark-connect` service), a Spark task runs its job as a client of that warm
server while it answers, and starts no JVM; the task log says which way it ran.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

from airflow.sdk import dag, task

from traffic.orchestration.dag_operators import spark_job

ROOT = Path(__file__).absolute().parent.parent


def _every_minutes() -> int:
    """The micro-batch cadence (minutes, default 5); a bad value falls back to the default."""
    value = os.environ.get("TRAFFIC_INGEST_EVERY_MINUTES", "5").strip()
    return int(value) if value.isdigit() and int(value) > 0 else 5


@dag(
    dag_id="traffic_ingest",
    schedule=timedelta(minutes=_every_minutes()),
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=30),
    doc_md=__doc__,
    tags=["traffic", "ingest", "spark"],
    default_args={"owner": "traffic", "retries": 1, "retry_delay": timedelta(minutes=1)},
)
def traffic_ingest():
    @task.short_circuit
    def inbox_has_new_files() -> bool:
        """Anything new in the inbox? Decided from the filesystem and the batches table, no JVM."""
        from traffic.orchestration.dag_support import inbox_has_new_files

        return inbox_has_new_files()

    # The quick-starting JVM: a micro-batch is small work.
    ingest = spark_job(ROOT, "ingest", timeout=timedelta(minutes=20), quick_by_default=True, warm=True)

    inbox_has_new_files() >> ingest


traffic_ingest()
