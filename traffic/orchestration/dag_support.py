"""What the Airflow DAGs' task callables call: JVM-free checks, expiry, the data-quality verdict.

The DAG files only declare; each callable imports this module inside the task, so parsing a
DAG never imports the library. Nothing here imports pyspark: every check reads the small
state tables with Arrow (``traffic.orchestration.conditions``), and expiry with the ``rs`` engine only
removes files from the Delta log, so a run with nothing to freeze finishes in seconds.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections import deque
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

UTC = timezone.utc
log = logging.getLogger(__name__)


class DataQualityFailed(RuntimeError):
    """A period of the run's interval failed its checks: it is not published."""


def settings_from_env():
    """The pipeline's settings as a task sees them (``TRAFFIC_CONFIG`` / ``TRAFFIC_*`` of the worker)."""
    from traffic.core.settings import load_settings  # deferred: DAG parsing stays light

    return load_settings()


def as_utc(moment: Any) -> datetime:
    """An Airflow (pendulum) or ISO-string time as a plain aware ``datetime`` in UTC."""
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    if moment.tzinfo is None:
        return datetime(*moment.timetuple()[:6], moment.microsecond, tzinfo=UTC)
    return datetime.fromtimestamp(moment.timestamp(), UTC)


def _fmt(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else "none yet"


# -- spark-submit ----------------------------------------------------------------------------

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
    """``spark-submit --conf`` for a task's job: our log4j2 config and the driver's JIT.

    ``spark_jit`` (``TRAFFIC_SPARK_JIT``) decides; under ``auto`` the DAG decides by the kind of
    job, since spark-submit starts the JVM before the job knows its size: the quick-starting JVM
    for micro-batches and hourly closes, the full JIT for replays.
    """
    from traffic.runtime import jvm  # deferred: DAG parsing stays light
    from traffic.core.settings import load_settings  # deferred: DAG parsing stays light

    mode = load_settings(environ=os.environ if environ is None else environ).spark_jit
    return {"spark.driver.extraJavaOptions": jvm.driver_java_options(jvm.quick_for(mode, big=not quick_by_default))}


def prepare_spark_submit(task, quick_by_default: bool) -> None:
    """``pre_execute`` of a SparkSubmitOperator: settings, environment and JVM options read when it runs."""
    task.env_vars = spark_submit_env()
    task.conf = {**(task.conf or {}), **spark_submit_conf(quick_by_default)}


def _say_delta_engine(settings) -> None:
    from traffic.storage.delta import choose_engine  # deferred: DAG parsing stays light

    engine = choose_engine(settings)
    log.info("Delta layer: the %s engine (%s)", engine, f"Delta Lake's jars in {settings.spark_jars_dir}"
             if engine == "spark" else "delta-rs, which needs no jars" if settings.engine == "rs"
             else f"delta-rs: no Delta Lake jars in {settings.spark_jars_dir or 'spark_jars_dir (not set)'}")


def _warm_server(settings) -> tuple[str, str] | None:
    """The answering warm server's URL (with its token) and how to name it in a log; None, said why, if none."""
    from traffic.runtime.connect import answers, client_url, recorded_server  # deferred: DAG parsing stays light
    from traffic.storage.journal import state_folder  # deferred: DAG parsing stays light

    url = shown = settings.spark_connect
    if not url:
        log.info("Spark: spark-submit (no warm Spark Connect server is configured: spark_connect is empty)")
        return None
    if url == "auto":
        record = recorded_server(state_folder(settings.warehouse))
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


def _spark_way(settings) -> tuple[str, str] | None:
    """The answering warm server (URL with its token, and its name for a log), or None for spark-submit;
    the task log says which Delta engine runs, which way Spark runs and why."""
    _say_delta_engine(settings)
    return _warm_server(settings)


def _on_warm_server(warm: tuple[str, str], application: str, args: list[str], env: Mapping[str, str],
                    step: str = "") -> None:
    """Run ``application args`` as a client of the warm server ``warm`` (from ``_spark_way``)."""
    url, shown = warm
    log.info("Spark: a client of the warm Spark Connect server %s (no JVM start in this task)%s", shown,
             f": {step}" if step else "")
    _as_client(application, args, {**os.environ, **env, "TRAFFIC_SPARK_MASTER": url}, shown)


def run_spark_step(task, submit: Callable[[], Any]) -> Any:
    """``execute`` of a DAG's Spark step: its job as a client of the warm Spark Connect server (setting
    ``spark_connect``) while that server answers, so the task starts no JVM; else ``submit()``, the
    operator's own spark-submit. The task log says which, and why."""
    warm = _spark_way(settings_from_env())
    if warm is None:
        return submit()
    _on_warm_server(warm, task.application, list(task.application_args or []), task.env_vars or {})
    return None


CLOSE_JOB = Path(__file__).resolve().parents[2] / "jobs" / "close.py"


class CloseSteps:
    """Runs steps of ``jobs/close.py`` as Spark: a client of the warm server while one answers, else
    spark-submit (the quick-starting JVM, as for every hourly close). Which is decided at the first
    step and said once in the task log; a run with nothing to freeze or roll up starts neither."""

    def __init__(self, settings):
        self.settings = settings
        self._warm: tuple[str, str] | None | bool = False  # False: not decided yet

    def __call__(self, step: str, bound: list[str]) -> str:
        """``close.py <bound> --only <step>``; returns how it ran ("warm server" or "spark-submit")."""
        if self._warm is False:
            self._warm = _spark_way(self.settings)
        args = [*bound, "--only", step]
        if self._warm:
            _on_warm_server(self._warm, str(CLOSE_JOB), args, spark_submit_env(), step)
            return "warm server"
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        hook = SparkSubmitHook(conn_id="spark_default", name=f"traffic-close-{step}", env_vars=spark_submit_env(),
                               conf=spark_submit_conf(quick_by_default=True), application_args=args)
        try:
            hook.submit(str(CLOSE_JOB))
        except BaseException:
            hook.on_kill()
            raise
        return "spark-submit"


def close_interval(interval_end: Any, run_type: Any, spark: Callable[[str, list[str]], str] | None = None) -> dict:
    """The hourly DAG's ``close`` task: every step of an hour's close in one task process (each task costs
    Airflow about half a second to start, and most runs of a backfill only re-check).

    In order, each step only when its check (Arrow, no JVM) says so: freeze (skipped when every hour
    up to the interval end is final; a backfill run freezes every hour the watermark has closed), roll up
    the day (midnight UTC, or a closed day waiting) and the month (likewise), expire raw detail; and,
    whatever happened before, send the alerts not sent yet. Returns the run's summary (its XCom: the
    grid's record of whether this run froze, rolled up a day or month, and how Spark ran).
    """
    settings = settings_from_env()
    end = as_utc(interval_end)
    run_type = str(getattr(run_type, "value", run_type))  # the task SDK's DagRunType: "backfill", "scheduled", …
    spark = spark or CloseSteps(settings)
    until = ["--until", end.isoformat()]
    summary: dict[str, Any] = {"interval_end": end.isoformat(), "froze": False, "rolled_up_day": False,
                               "rolled_up_month": False, "spark": None}
    try:
        if freeze_needed(end):
            say_freeze_bound(run_type, end)
            summary["spark"] = spark("freeze", [] if run_type == "backfill" else until)
            summary["froze"] = True
        if day_closes(end):
            summary["spark"] = spark("days", until)
            summary["rolled_up_day"] = True
        if month_closes(end):
            summary["spark"] = spark("months", until)
            summary["rolled_up_month"] = True
        summary["expire"] = expire_raw_detail(end, spark)
    finally:
        summary["alerts"] = notify_alerts()  # alerts of the hours published so far, even if a step failed
    done = [said for said, key in (("froze", "froze"), ("rolled up the day", "rolled_up_day"),
                                   ("rolled up the month", "rolled_up_month")) if summary[key]]
    log.info("close of the interval ending %s: %s (Spark: %s); expiry %s", _fmt(end),
             ", ".join(done) or "nothing to freeze or roll up, re-checked only", summary["spark"] or "not started",
             summary["expire"])
    return summary


def say_freeze_bound(run_type: str, interval_end: Any) -> None:
    """Log how far this run's freeze goes: its interval end, or (a backfill run) the watermark."""
    if run_type == "backfill":  # DagRunType.BACKFILL_JOB's value
        log.info("backfill run: freezing every hour the watermark has closed, not only up to %s, so this "
                 "backfill's later runs find their hours final and only re-check them", _fmt(as_utc(interval_end)))
    else:
        log.info("freezing the closed hours up to %s", _fmt(as_utc(interval_end)))


# -- the checks the sensors and short-circuits ask ------------------------------------------

def watermark_passed(interval_end: Any) -> bool:
    """Sensor: has the watermark reached the end of this interval (every hour in it is closed)?"""
    from traffic.orchestration import conditions as orchestration  # deferred: DAG parsing stays light

    settings = settings_from_env()
    end = as_utc(interval_end)
    current = orchestration.watermark(settings)
    passed = current is not None and current >= end
    log.info("watermark %s; this interval ends %s: %s", _fmt(current), _fmt(end),
             "passed" if passed else "waiting")
    return passed


def _first_hour(settings) -> datetime | None:
    """The first hour (of the first on-time packet), or None before any packet."""
    from traffic.orchestration import conditions as orchestration  # deferred: DAG parsing stays light
    from traffic.storage import state as st  # deferred: DAG parsing stays light

    warehouse = orchestration.warehouse_if_any(settings)
    return st.read_clock_state(warehouse).first_hour if warehouse is not None else None


def freeze_needed(interval_end: Any) -> bool:
    """Short-circuit: False when every hour up to ``interval_end`` is already final (no Spark job)."""
    from traffic.orchestration import conditions as orchestration  # deferred: DAG parsing stays light

    settings, end = settings_from_env(), as_utc(interval_end)
    if _first_hour(settings) is None:
        log.info("no packet yet (only clock ticks, or nothing): there is no hour to freeze")
        return False
    final = orchestration.hours_final_until(settings, end)
    log.info("hours up to %s %s", _fmt(end), "are already final: nothing to freeze" if final else "need freezing")
    return not final


def day_closes(interval_end: Any) -> bool:
    """Gate of the day roll-up: the interval ends at midnight UTC, or a closed day is still waiting."""
    from traffic.orchestration import conditions as orchestration  # deferred: DAG parsing stays light

    end = as_utc(interval_end)
    if (end.hour, end.minute, end.second, end.microsecond) == (0, 0, 0, 0):
        log.info("the interval ends at midnight UTC: %s closes", (end - timedelta(days=1)).date())
        return True
    waiting = orchestration.day_waiting(settings_from_env(), end)
    log.info("not a day change; %s", "a closed day is waiting to be rolled up (catch-up)" if waiting
             else "no closed day is waiting: skip")
    return waiting


def month_waiting(settings, interval_end: datetime) -> bool:
    """True when a closed month (ending by ``interval_end``) whose last day is rolled up has no roll-up yet."""
    from traffic.orchestration import conditions  # deferred: DAG parsing stays light

    return conditions.month_waiting(settings, interval_end)


def month_closes(interval_end: Any) -> bool:
    """Gate of the month roll-up: the interval ends at the first midnight of a month, or a month is waiting."""
    end = as_utc(interval_end)
    if (end.day, end.hour, end.minute, end.second, end.microsecond) == (1, 0, 0, 0, 0):
        log.info("the interval ends at the start of %s: the previous month closes", end.strftime("%Y-%m"))
        return True
    waiting = month_waiting(settings_from_env(), end)
    log.info("not a month change; %s", "a closed month is waiting to be rolled up (catch-up)" if waiting
             else "no closed month is waiting: skip")
    return waiting


def inbox_has_new_files() -> bool:
    """Short-circuit of the micro-batch: anything new in the inbox (or an interrupted batch to finish)?"""
    from traffic.orchestration import conditions as orchestration  # deferred: DAG parsing stays light

    settings = settings_from_env()
    new = orchestration.inbox_has_new_files(settings)
    log.info("inbox %s: %s", settings.inbox, "new files: ingest" if new else "nothing new: no Spark job")
    return new


# -- expiry without a JVM ---------------------------------------------------------------------

def expire_raw_detail(interval_end: Any, spark: Callable[[str, list[str]], str] | None = None) -> dict:
    """``traffic close --only expire --until <end>``, without a JVM in the worker.

    ``traffic.accounting.close.close`` asks for a session before running any non-empty plan, but expiry
    with the ``rs`` engine only removes files through delta-rs and never touches it; so the
    session factory here returns None. When Spark is really needed — the ``spark`` engine, or
    an interrupted batch to finish first — the same step runs as a Spark job instead (``spark``, as
    the close's other steps: a client of the warm server or spark-submit), never inside the worker.
    """
    from traffic.storage.journal import pending_batch  # deferred: DAG files import this module at parse time
    from traffic.app.console import print_close  # deferred: DAG parsing stays light
    from traffic.app.runs import close  # deferred: DAG parsing stays light
    from traffic.storage.delta import Warehouse, choose_engine  # deferred: DAG parsing stays light

    settings = settings_from_env()
    end = as_utc(interval_end)
    pending = Warehouse(settings, engine="rs").exists() and \
        pending_batch(settings.warehouse) is not None
    if choose_engine(settings) == "rs" and not pending:
        result = close(settings, lambda: None, end, lambda message: log.info("%s", message), only=("expire",))
        print_close(result)
        return {"expired_hours": result.expired_hours, "spark_started": False,
                "watermark": result.watermark.isoformat() if result.watermark else None}
    log.info("expiry needs Spark here (%s): jobs/close.py --only expire",
             "an interrupted batch is waiting" if pending else "spark engine")
    (spark or CloseSteps(settings))("expire", ["--until", end.isoformat()])
    return {"expired_hours": None, "spark_started": True, "watermark": None}


# -- publish the data-quality outcome ------------------------------------------------------------

def interval_periods(settings, start: datetime, end: datetime) -> list[dict]:
    """Ledger rows the interval ``[start, end)`` closes: its hours, and a day or month ending in it."""
    from traffic.orchestration import conditions as orchestration  # deferred: DAG parsing stays light
    from traffic.storage import state as st  # deferred: DAG parsing stays light
    from traffic.core.periods import period_end  # deferred: DAG parsing stays light

    warehouse = orchestration.warehouse_if_any(settings)
    if warehouse is None:
        return []
    chosen = []
    for row in st.read_ledger(warehouse):
        begin = row["period_start"]
        finish = None if row["grain"] == "hour" else period_end(begin, row["grain"])
        if row["grain"] == "hour" and start <= begin < end:
            chosen.append(row)
        elif finish is not None and start < finish <= end:
            chosen.append(row)
    return sorted(chosen, key=lambda r: (r["period_start"], r["grain"]))


def publish_data_quality(interval_start: Any, interval_end: Any) -> dict:
    """Log the interval's data-quality outcome; fail when any of its periods failed its checks."""
    from traffic.orchestration import conditions as orchestration  # deferred: DAG parsing stays light

    settings = settings_from_env()
    start, end = as_utc(interval_start), as_utc(interval_end)
    rows = interval_periods(settings, start, end)
    first_hour = _first_hour(settings)
    if first_hour is not None and first_hour < end and not orchestration.hours_final_until(settings, end):
        raise DataQualityFailed(f"not every hour up to {_fmt(end)} is frozen: this interval cannot be published")
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["dq_status"]] = counts.get(row["dq_status"], 0) + 1
        note = f" — {row['dq_note']}" if row.get("dq_note") else ""
        restated = f" (restated: {row['restated']})" if row.get("restated") else ""
        log.info("%-5s %s  %s bytes, %s packets, late %s bytes: %s%s%s", row["grain"], _fmt(row["period_start"]),
                 f"{row['bytes']:,}", f"{row['packets']:,}", f"{row['late_bytes']:,}", row["dq_status"],
                 note, restated)
    if not rows:  # hours before the first hour get no ledger row (DESIGN §4): nothing to publish, no failure
        log.info("no period closes in %s … %s (it is before the first hour)", _fmt(start), _fmt(end))
    failed = [r for r in rows if r["dq_status"] == "failed"]
    summary = {"interval_start": start.isoformat(), "interval_end": end.isoformat(), "periods": len(rows),
               "by_status": counts,
               "failed": [f"{r['grain']} {r['period_start'].isoformat()}" for r in failed]}
    log.info("data quality of %s … %s: %s", _fmt(start), _fmt(end),
             ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "nothing to publish")
    if failed:
        raise DataQualityFailed("not published, failed checks: " + "; ".join(
            f"{r['grain']} {_fmt(r['period_start'])}" + (f" ({r['dq_note']})" if r.get("dq_note") else "")
            for r in failed))
    return summary


# -- the replay form ----------------------------------------------------------------------------

def replay_input(settings, folder: str) -> Path:
    """The replay form's input folder, links resolved, if it lies inside one of ``replay_roots``.

    Whoever may trigger a DAG may not make the worker read any file it can: only archives under
    the configured roots (``Settings.replay_folders``). The resolved path is what the job gets, so
    a link swapped after this check cannot point it elsewhere.
    """
    from traffic.core.settings import SettingsError  # deferred: DAG parsing stays light

    roots = [Path(os.path.realpath(root)) for root in settings.replay_folders()]
    allowed = ", ".join(str(root) for root in roots)
    if not Path(folder).is_absolute() or "\0" in folder:
        raise SettingsError(f"input {folder!r} is not an absolute folder (allowed: folders under {allowed})")
    resolved = Path(os.path.realpath(folder))
    if not any(resolved.is_relative_to(root) for root in roots):
        raise SettingsError(f"input {folder!r} is not under a replay root (allowed: folders under {allowed}; "
                            "the setting replay_roots adds others)")
    if not resolved.is_dir():
        raise SettingsError(f"input {folder!r} is not a folder on the worker")
    return resolved


def replay_arguments(params: Mapping[str, Any]) -> list[str]:
    """``jobs/replay.py`` arguments from the replay form, checked before any JVM starts.

    Values go as ``--name=value``, so a reason or a source that starts with ``-`` stays a value.
    """
    from traffic.core.settings import SettingsError, parse_time  # deferred: DAG parsing stays light

    def text(name: str) -> str:
        value = params.get(name)
        return "" if value is None else str(value).strip()

    missing = [name for name in ("from", "to", "input") if not text(name)]
    if missing:
        raise SettingsError(f"replay needs {', '.join(missing)}")
    start, end = parse_time("from", text("from")), parse_time("to", text("to"))
    if end <= start:
        raise SettingsError(f"replay range is empty: from {start.isoformat()} is not before to {end.isoformat()}")
    folder = replay_input(settings_from_env(), text("input"))
    args = [f"--from={start.isoformat()}", f"--to={end.isoformat()}", f"--input={folder}"]
    if text("source"):
        args.append(f"--source={text('source')}")
    restate = params.get("restate")
    if restate is True or str(restate).strip().lower() in {"true", "1", "yes"}:
        if not text("reason"):
            raise SettingsError("restate needs a reason (it is recorded in the ledger)")
        args += ["--restate", f"--reason={text('reason')}"]
    return args


# -- alerts --------------------------------------------------------------------------------------

def notify_alerts() -> dict:
    """Send the stored alerts not sent yet through the Airflow notifier (``traffic.orchestration.notify``)."""
    from traffic.orchestration.notify import notify_pending  # deferred: DAG parsing stays light

    return notify_pending(settings_from_env())
