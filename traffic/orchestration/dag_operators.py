"""How a DAG file declares a Spark task: its job under ``jobs/``, submitted by ``spark-submit`` with the worker's
settings handed over when the task runs (never at parse).

DAG files import this module when Airflow parses them, so it imports Airflow's operator and nothing of the
project at the top: what a task needs of ``spark_tasks`` is imported when the task runs.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Callable

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator


class WarmSparkSubmitOperator(SparkSubmitOperator):
    """spark-submit, or a client of the warm Spark Connect server while one answers (the task log says which)."""

    def execute(self, context):
        from traffic.orchestration.spark_tasks import run_spark_step  # deferred: no project import at parse

        return run_spark_step(self, lambda: super(WarmSparkSubmitOperator, self).execute(context))


def pass_settings(quick_by_default: bool) -> Callable[[dict], None]:
    """The ``pre_execute`` hook handing the worker's TRAFFIC_* settings to spark-submit when the task runs; the
    quick-starting JVM (``quick_by_default``) or the full JIT unless TRAFFIC_SPARK_JIT says otherwise."""

    def hook(context) -> None:
        from traffic.orchestration.spark_tasks import prepare_spark_submit  # deferred: no project import at parse

        prepare_spark_submit(context["task"], quick_by_default=quick_by_default)

    return hook


def spark_job(root: Path, job: str, *, timeout: timedelta, quick_by_default: bool, warm: bool = False,
              application_args: str | None = None) -> SparkSubmitOperator:
    """The task ``job`` submitting ``jobs/<job>.py`` on the connection ``spark_default`` (a warm Spark Connect
    client while one answers when ``warm``)."""
    operator = WarmSparkSubmitOperator if warm else SparkSubmitOperator
    return operator(
        task_id=job,
        application=str(root / "jobs" / f"{job}.py"),
        application_args=application_args,
        name=f"traffic-{job}",
        conn_id="spark_default",
        pre_execute=pass_settings(quick_by_default),
        execution_timeout=timeout,
    )
