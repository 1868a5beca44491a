"""How a DAG's task runs its Spark step: the worker's settings, what ``spark-submit`` is handed when the task
runs (environment, Delta's jars, the driver's JIT), and the warm Spark Connect server used instead while it
answers (the task log says which way, and why).

DAG files reach this module when a task runs, never at parse: its imports of the project are deferred.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Any, Callable, Mapping

log = logging.getLogger(__name__)


def settings_from_env():
    """The pipeline's settings as a task sees them (``TRAFFIC_CONFIG`` / ``TRAFFIC_*`` of the worker)."""
    from traffic.core.settings import load_settings  # deferred: DAG parsing stays light

    return load_settings()


def spark_submit_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment handed to ``spark-submit`` at run time: the worker's ``TRAFFIC_*`` settings,
    the Python that runs the job (this venv's, unless ``PYSPARK_PYTHON`` says otherwise), UTC,
    and a PATH on which this venv's ``spark-submit`` is found first."""
    environ = os.environ if environ is None else environ
    env = {name: value for name, value in environ.items() if name.startswith("TRAFFIC_")}
    python = environ.get("PYSPARK_PYTHON") or sys.executable
    env["PYSPARK_PYTHON"] = python
    env["PYSPARK_DRIVER_PYTHON"] = environ.get("PYSPARK_DRIVER_PYTHON") or python
    env["TZ"] = "UTC"
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), environ.get("PATH", os.defpath)])
    return env


def spark_submit_conf(quick_by_default: bool, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``spark-submit --conf`` for a task's job: Delta's jars and settings (the spark engine), our log4j2
    config and the driver's JIT.

    ``spark_jit`` (``TRAFFIC_SPARK_JIT``) decides; under ``auto`` the DAG decides by the kind of
    job, since spark-submit starts the JVM before the job knows its size: the quick-starting JVM
    for micro-batches and hourly closes, the full JIT for replays.
    """
    from traffic.runtime import jvm  # deferred: DAG parsing stays light
    from traffic.runtime.spark import delta_conf  # deferred: DAG parsing stays light
    from traffic.core.settings import load_settings  # deferred: DAG parsing stays light

    settings = load_settings(environ=os.environ if environ is None else environ)
    # Delta's jars go to spark-submit itself: a job's session starts in a JVM already up, too late for them.
    return {**delta_conf(settings),
            "spark.driver.extraJavaOptions": jvm.driver_java_options(jvm.quick_for(settings.spark_jit,
                                                                                   big=not quick_by_default))}


def prepare_spark_submit(task, quick_by_default: bool) -> None:
    """``pre_execute`` of a SparkSubmitOperator: settings, environment and JVM options read when it runs."""
    task.env_vars = spark_submit_env()
    task.conf = {**(task.conf or {}), **spark_submit_conf(quick_by_default)}


def _say_delta_engine(settings) -> None:
    from traffic.storage.engine import engine_reason  # deferred: DAG parsing stays light

    log.info("Delta layer: %s", engine_reason(settings))


def _warm_server(settings) -> tuple[str, str] | None:
    """The answering warm server's URL (with its token) and how to name it in a log; None, said why, if none."""
    from traffic.runtime.connect import answers, client_url, recorded_server  # deferred: DAG parsing stays light
    from traffic.storage.journal import host_folder  # deferred: DAG parsing stays light

    url = shown = settings.spark_connect
    if not url:
        log.info("Spark: spark-submit (no warm Spark Connect server is configured: spark_connect is empty)")
        return None
    if url == "auto":
        record = recorded_server(host_folder(settings.warehouse))
        if record is None:
            log.info("Spark: spark-submit (no warm Spark Connect server runs for %s: `traffic spark start` keeps one)",
                     settings.warehouse)
            return None
        url, shown = client_url(record), f"{record['url']} (the warehouse's own)"
    if not answers(url):
        log.warning("Spark: the warm Spark Connect server %s does not answer: spark-submit instead", shown)
        return None
    return url, shown


def _as_client(application: str, args: list[str], env: Mapping[str, str], shown: str) -> None:
    """Run ``application args`` in a child Python, a client of the warm server: its output goes to the
    task log, and the child is killed if the task is (a timeout, a kill from the UI)."""
    process = subprocess.Popen([sys.executable, application, *args], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=dict(env))
    try:
        last = deque(maxlen=5)
        for line in process.stdout:
            log.info("%s", line.rstrip())
            last.append(line.rstrip())
        if process.wait():
            raise RuntimeError(f"{Path(application).name} exited with {process.returncode} (as a client of "
                               f"{shown}): " + " | ".join(last))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def spark_way(settings) -> tuple[str, str] | None:
    """The answering warm server (URL with its token, and its name for a log), or None for spark-submit;
    the task log says which Delta engine runs, which way Spark runs and why."""
    _say_delta_engine(settings)
    return _warm_server(settings)


def on_warm_server(warm: tuple[str, str], application: str, args: list[str], env: Mapping[str, str],
                    step: str = "") -> None:
    """Run ``application args`` as a client of the warm server ``warm`` (from ``spark_way``)."""
    url, shown = warm
    log.info("Spark: a client of the warm Spark Connect server %s (no JVM start in this task)%s", shown,
             f": {step}" if step else "")
    _as_client(application, args, {**os.environ, **env, "TRAFFIC_SPARK_MASTER": url}, shown)


def run_spark_step(task, submit: Callable[[], Any]) -> Any:
    """``execute`` of a DAG's Spark step: its job as a client of the warm Spark Connect server (setting
    ``spark_connect``) while that server answers, so the task starts no JVM; else ``submit()``, the
    operator's own spark-submit. The task log says which, and why."""
    warm = spark_way(settings_from_env())
    if warm is None:
        return submit()
    on_warm_server(warm, task.application, list(task.application_args or []), task.env_vars or {})
    return None
