"""What the Airflow DAGs' task callables call: JVM-free checks, expiry, the data-quality verdict.

The DAG files only declare; each callable imports this module inside the task, so parsing a
DAG never imports the library. Nothing here starts a JVM: every check reads the small state
tables with Arrow (``traffic.orchestration.conditions``), the hourly close decides its steps with
the close's own planner through delta-rs (``decide_close``, under the warehouse lock), and expiry
with the ``rs`` engine only removes files from the Delta log, so a run with nothing to freeze
finishes in seconds. Spark work runs as a job: a client of the warm server, or spark-submit.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, NamedTuple

from traffic.orchestration.spark_tasks import (on_warm_server, settings_from_env, spark_submit_conf, spark_submit_env,
                                                 spark_way)

UTC = timezone.utc
log = logging.getLogger(__name__)


class DataQualityFailed(RuntimeError):
    """A period of the run's interval failed its checks: it is not published."""


def airflow_time(moment: Any) -> datetime:
    """An Airflow time (a pendulum ``DateTime``, or its ISO text in a template) as a plain ``datetime`` in
    UTC (``core.periods.as_utc``): the project's code compares and formats plain ones."""
    from traffic.core.periods import as_utc  # deferred: DAG parsing stays light (periods imports numpy)

    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    plain = datetime(*moment.timetuple()[:6], moment.microsecond, tzinfo=moment.tzinfo)
    return as_utc(plain)


def _fmt(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else "none yet"


CLOSE_JOB = Path(__file__).resolve().parents[2] / "jobs" / "close.py"


class StepRun(NamedTuple):
    """One step of an hourly close run as a Spark job: how it ran, and what its job reports it did."""

    spark: str  # "warm server" or "spark-submit"
    report: dict  # the job's ``--report`` (``traffic.app.cli.close_facts``): hours frozen, days, months, expiry


def read_report(path: Path, step: str) -> dict:
    """The facts ``jobs/close.py --report`` wrote; a job that succeeded without writing them is an error."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise RuntimeError(f"jobs/close.py --only {step} finished but wrote no report to {path} (its driver must "
                           "run on this worker: a warm server's client, or spark-submit in client mode)") from None


class CloseSteps:
    """Runs steps of ``jobs/close.py`` as Spark: a client of the warm server while one answers, else
    spark-submit (the quick-starting JVM, as for every hourly close). Which is decided at the first
    step and said once in the task log; a run with nothing to freeze or roll up starts neither.

    Each step returns what its job did, not what was expected of it: the job writes its own
    ``--report`` into a temporary folder of the worker, where its driver runs (a child process
    that is the warm server's client, or spark-submit's driver in client mode)."""

    def __init__(self, settings):
        self.settings = settings
        self._warm: tuple[str, str] | None | bool = False  # False: not decided yet

    def __call__(self, step: str, bound: list[str]) -> StepRun:
        """``close.py <bound> --only <step> --report <file>``; how it ran and what it reported."""
        with tempfile.TemporaryDirectory(prefix="traffic-close-") as folder:
            report = Path(folder) / "report.json"
            how = self.run([*bound, "--only", step, "--report", str(report)], step)
            return StepRun(how, read_report(report, step))

    def run(self, args: list[str], step: str) -> str:
        """``close.py args`` as Spark; returns how it ran ("warm server" or "spark-submit")."""
        if self._warm is False:
            self._warm = spark_way(self.settings)
        if self._warm:
            on_warm_server(self._warm, str(CLOSE_JOB), args, spark_submit_env(), step)
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


@dataclass
class CloseDecision:
    """What each step of an hourly close finds to do at this moment, decided under the warehouse lock by
    ``plan_close``, the planner the job itself runs (so never a guess made before the lock is held)."""

    hours: list[datetime] = field(default_factory=list)  # to freeze, up to the interval end
    days: list[date] = field(default_factory=list)  # to roll up, as ``--only days`` plans them
    months: list[datetime] = field(default_factory=list)  # likewise ``--only months``
    rolled_days: set[datetime] = field(default_factory=set)  # days with a ledger row: rolled up already
    rolled_months: set[datetime] = field(default_factory=set)
    first_hour: datetime | None = None
    planned: bool = True  # False: a table is missing (an older warehouse); each step's job creates it and decides

    def due(self, step: str) -> bool:
        return not self.planned or bool({"freeze": self.hours, "days": self.days, "months": self.months}[step])


def decide_close(settings, end: datetime) -> CloseDecision:
    """Plan the close up to ``end`` under the warehouse lock, as ``traffic close --until end`` does, and let it go.

    Reads only (delta-rs in the worker, no JVM). The lock is released before any Spark job starts,
    and that job takes it again and plans again: a step found due here may be found done when its
    job runs (another run of a backfill got there first); the job's report says so.
    """
    from traffic.accounting.close.plan import plan_close, restrict  # deferred: DAG parsing stays light
    from traffic.core.periods import starts  # deferred: DAG parsing stays light
    from traffic.storage import schemas, state as st  # deferred: DAG parsing stays light
    from traffic.storage.warehouse import Warehouse  # deferred: DAG parsing stays light

    warehouse = Warehouse.reader(settings)
    if not warehouse.exists():
        return CloseDecision()  # no data yet: nothing to close
    with warehouse.lock("the traffic_hourly close task (deciding)"):
        if not all(warehouse.table(name).exists() for name in schemas.TABLES):
            return CloseDecision(planned=False)
        plan = plan_close(settings, warehouse, end)
        ledger = st.read_ledger(warehouse, columns=["grain", "period_start"])
        first_hour = st.read_clock_state(warehouse).first_hour
    # restrict rebinds fields of the plan it is given: each step gets its own copy
    return CloseDecision(hours=plan.hours, days=restrict(replace(plan), ("days",)).days,
                         months=restrict(replace(plan), ("months",)).months, rolled_days=starts(ledger, "day"),
                         rolled_months=starts(ledger, "month"), first_hour=first_hour)


class _RollUp(NamedTuple):
    """How the close task records one roll-up step (``days`` or ``months``)."""

    grain: str  # its XCom key: "day" or "month" (the periods listed under "days" / "months")
    flag: str  # the grid's flag: true only when this run's job rolled one up
    reported: str  # the job report's list of what it rolled up
    label: Callable[[Any], str]  # a period as the report names it: 2026-11-20, 2026-11
    rolled: Callable[["CloseDecision"], set]  # the periods with a ledger row, in a decision
    on_time: Callable[[datetime], datetime | None]  # the period an interval ending then closes, if any


def _at_midnight(end: datetime) -> bool:
    return (end.hour, end.minute, end.second, end.microsecond) == (0, 0, 0, 0)


_ROLL_UPS = {
    "days": _RollUp("day", "rolled_up_day", "days_rolled",
                    lambda start: (start.date() if isinstance(start, datetime) else start).isoformat(),
                    lambda decision: decision.rolled_days,
                    lambda end: end - timedelta(days=1) if _at_midnight(end) else None),
    "months": _RollUp("month", "rolled_up_month", "months_rolled", lambda start: f"{start:%Y-%m}",
                      lambda decision: decision.rolled_months,
                      lambda end: (end - timedelta(days=1)).replace(day=1) if _at_midnight(end) and end.day == 1
                      else None),
}


def freeze_outcome(before: CloseDecision, report: dict | None) -> dict:
    """What this run's freeze did: ``froze`` (its job froze hours), ``already_frozen`` (hours found due under
    the lock were final when its job ran: another run froze them meanwhile) or ``not_due`` (nothing to freeze)."""
    if report is not None and report["hours_frozen"]:
        return {"outcome": "froze", "hours": report["hours_frozen"], "first": report["first_hour_frozen"],
                "last": report["last_hour_frozen"]}
    if report is not None and before.hours:
        return {"outcome": "already_frozen", "hours": len(before.hours), "first": before.hours[0].isoformat(),
                "last": before.hours[-1].isoformat()}
    return {"outcome": "not_due", "hours": 0}


def roll_up_outcome(step: str, end: datetime, before: CloseDecision, report: dict | None,
                    after: CloseDecision) -> dict:
    """What this run's roll-up step (``days`` or ``months``) did, from its job's report and the ledger after it.

    ``rolled_up``: its job rolled periods up (named). ``already_rolled_up``: the periods it found due were
    rolled up when its job ran, or (no job) the period its interval closes on time — the day of a midnight
    run, the month of a month's first midnight — has a ledger row already: another run, or an earlier try,
    rolled it up. ``waiting``: that period (or one found due) is not rolled up: not all its parts are frozen
    and published. ``not_due``: nothing to roll up.
    """
    kind = _ROLL_UPS[step]
    listed, label = f"{kind.grain}s", kind.label
    planned = [label(p) for p in (before.days if step == "days" else before.months)]
    done = {label(start) for start in kind.rolled(after)}
    if report is not None and report[kind.reported]:
        outcome = {"outcome": "rolled_up", listed: list(report[kind.reported])}
        others = [p for p in planned if p not in report[kind.reported] and p in done]
        return {**outcome, "already": others} if others else outcome
    if report is not None and planned:
        already = [p for p in planned if p in done]
        return {"outcome": "already_rolled_up", listed: already} if already else \
            {"outcome": "waiting", listed: planned}
    own = kind.on_time(end)
    if own is not None and after.first_hour is not None and end > after.first_hour:
        return {"outcome": "already_rolled_up" if label(own) in done else "waiting", listed: [label(own)]}
    return {"outcome": "not_due", listed: []}


def _said(step: str, outcome: dict) -> str:
    """An outcome in words, for the task log."""
    if step == "freeze":
        if outcome["outcome"] == "froze":
            return f"froze {outcome['hours']} hour(s) {outcome['first']} … {outcome['last']}"
        if outcome["outcome"] == "already_frozen":
            return f"found its {outcome['hours']} hour(s) to freeze frozen by another run meanwhile"
        return "nothing to freeze"
    grain = _ROLL_UPS[step].grain
    periods = ", ".join(outcome[f"{grain}s"])
    said = {"rolled_up": f"rolled up {grain} {periods}",
            "already_rolled_up": f"found {grain} {periods} already rolled up (by another run or an earlier try)",
            "waiting": f"{grain} {periods} waits (not all its parts are frozen and published)",
            "not_due": f"no {grain} due"}[outcome["outcome"]]
    if outcome.get("already"):
        said += f" (and found {', '.join(outcome['already'])} already rolled up by another run)"
    return said


def close_interval(interval_end: Any, run_type: Any, spark: Callable[[str, list[str]], StepRun] | None = None) -> dict:
    """The hourly DAG's ``close`` task: every step of an hour's close in one task process (each task costs
    Airflow about half a second to start, and most runs of a backfill only re-check).

    In order: freeze (a backfill run freezes every hour the watermark has closed), roll up days, roll up
    months, expire raw detail; and, whatever happened before, send the alerts not sent yet. Whether a
    step is due is decided under the warehouse lock by ``plan_close`` at the moment the step comes
    (``decide_close``); a step found due runs its Spark job, which takes the lock again and reports what
    it did. So of two overlapping runs of a backfill, the one whose job first holds the lock rolls a day
    up and the other finds it rolled up. Returns the run's summary (its XCom: the grid's record of what
    this run did — ``froze``, ``rolled_up_day``, ``rolled_up_month`` are true only when this run's job did
    it; ``freeze``, ``day``, ``month`` give each step's outcome; ``spark``: how Spark ran, if it did).
    """
    settings = settings_from_env()
    end = airflow_time(interval_end)
    run_type = str(getattr(run_type, "value", run_type))  # the task SDK's DagRunType: "backfill", "scheduled", …
    spark = spark or CloseSteps(settings)
    until = ["--until", end.isoformat()]
    summary: dict[str, Any] = {"interval_end": end.isoformat(), "froze": False, "rolled_up_day": False,
                               "rolled_up_month": False, "spark": None}
    try:
        decision = decide_close(settings, end)
        report = None
        if decision.due("freeze"):
            log.info("freeze: %s (decided under the warehouse lock)", f"{len(decision.hours)} hour(s) up to "
                     f"{_fmt(end)} are not final" if decision.planned else "a table is missing: the job decides")
            say_freeze_bound(run_type, end)
            run = spark("freeze", [] if run_type == "backfill" else until)
            summary["spark"], report = run.spark, run.report
        summary["freeze"] = freeze_outcome(decision, report)
        summary["froze"] = summary["freeze"]["outcome"] == "froze"
        log.info("freeze: %s", _said("freeze", summary["freeze"]))
        if report is not None:
            decision = decide_close(settings, end)
        for step, kind in _ROLL_UPS.items():
            before, report = decision, None
            if decision.due(step):
                planned = decision.days if step == "days" else decision.months
                log.info("%s: due (decided under the warehouse lock): %s", step, ", ".join(map(kind.label, planned))
                         if decision.planned else "a table is missing: the job decides")
                run = spark(step, until)
                summary["spark"], report = run.spark, run.report
                decision = decide_close(settings, end)  # what the ledger holds now: the outcome's evidence
            summary[kind.grain] = roll_up_outcome(step, end, before, report, decision)
            summary[kind.flag] = summary[kind.grain]["outcome"] == "rolled_up"
            log.info("%s: %s", step, _said(step, summary[kind.grain]))
        summary["expire"] = expire_raw_detail(end, spark)
    finally:
        summary["alerts"] = notify_alerts()  # alerts of the hours published so far, even if a step failed
    log.info("close of the interval ending %s: %s (Spark: %s); expiry %s", _fmt(end), "; ".join(
        _said(step, summary[key]) for step, key in (("freeze", "freeze"), ("days", "day"), ("months", "month"))),
        summary["spark"] or "not started", summary["expire"])
    return summary


def say_freeze_bound(run_type: str, interval_end: Any) -> None:
    """Log how far this run's freeze goes: its interval end, or (a backfill run) the watermark."""
    if run_type == "backfill":  # DagRunType.BACKFILL_JOB's value
        log.info("backfill run: freezing every hour the watermark has closed, not only up to %s, so this "
                 "backfill's later runs find their hours final and only re-check them", _fmt(airflow_time(interval_end)))
    else:
        log.info("freezing the closed hours up to %s", _fmt(airflow_time(interval_end)))


# -- the checks the sensors and short-circuits ask ------------------------------------------

def watermark_sensor(interval_end: Any) -> bool:
    """Sensor: has the watermark reached the end of this interval (``conditions.watermark_passed``)?"""
    from traffic.orchestration import conditions as orchestration  # deferred: DAG parsing stays light

    settings = settings_from_env()
    end = airflow_time(interval_end)
    current = orchestration.watermark(settings)
    passed = orchestration.watermark_reached(current, end)
    log.info("watermark %s; this interval ends %s: %s", _fmt(current), _fmt(end),
             "passed" if passed else "waiting")
    return passed


def _first_hour(settings) -> datetime | None:
    """The first hour (of the first on-time packet), or None before any packet."""
    from traffic.orchestration import conditions as orchestration  # deferred: DAG parsing stays light
    from traffic.storage import state as st  # deferred: DAG parsing stays light

    warehouse = orchestration.warehouse_if_any(settings)
    return st.read_clock_state(warehouse).first_hour if warehouse is not None else None


def inbox_has_new_files() -> bool:
    """Short-circuit of the micro-batch: anything new in the inbox (or an interrupted batch to finish)?"""
    from traffic.orchestration import conditions as orchestration  # deferred: DAG parsing stays light

    settings = settings_from_env()
    new = orchestration.inbox_has_new_files(settings)
    log.info("inbox %s: %s", settings.inbox, "new files: ingest" if new else "nothing new: no Spark job")
    return new


# -- expiry without a JVM ---------------------------------------------------------------------

class _SparkNeeded(Exception):
    """Expiry has hours to remove from tables delta-spark writes: it runs as a Spark step."""


def expire_raw_detail(interval_end: Any, spark: Callable[[str, list[str]], StepRun] | None = None) -> dict:
    """``traffic close --only expire --until <end>``, without a JVM in the worker.

    ``traffic.app.runs.close`` asks for a session only before running a non-empty plan, and
    expiry with the ``rs`` engine only removes files through delta-rs and never touches it; so it runs
    here with no session. When Spark is really needed — hours to expire from tables delta-spark writes,
    or an interrupted batch to finish first — the same step runs as a Spark job instead (``spark``, as
    the close's other steps: a client of the warm server or spark-submit), never inside the worker; an
    hour with nothing to expire starts no JVM on either engine.
    """
    from traffic.storage.journal import pending_batch  # deferred: DAG files import this module at parse time
    from traffic.app.console import print_close  # deferred: DAG parsing stays light
    from traffic.app.runs import close  # deferred: DAG parsing stays light
    from traffic.storage.engine import writes_need_spark  # deferred: DAG parsing stays light
    from traffic.storage.warehouse import Warehouse  # deferred: DAG parsing stays light

    settings = settings_from_env()
    end = airflow_time(interval_end)
    pending = Warehouse.reader(settings).exists() and \
        pending_batch(settings.warehouse) is not None

    def no_session():
        if writes_need_spark(settings):
            raise _SparkNeeded
        return None

    if not pending:
        try:
            result = close(settings, no_session, end, lambda message: log.info("%s", message), only=("expire",))
        except _SparkNeeded:
            pass
        else:
            print_close(result)
            return {"expired_hours": result.expired_hours, "spark_started": False,
                    "watermark": result.watermark.isoformat() if result.watermark else None}
    log.info("expiry needs Spark here (%s): jobs/close.py --only expire",
             "an interrupted batch is waiting" if pending else "the tables are written by delta-spark")
    report = (spark or CloseSteps(settings))("expire", ["--until", end.isoformat()]).report
    return {"expired_hours": report["expired_hours"], "spark_started": True, "watermark": report["watermark"]}


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
    start, end = airflow_time(interval_start), airflow_time(interval_end)
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


# -- alerts --------------------------------------------------------------------------------------

def notify_alerts() -> dict:
    """Send the stored alerts not sent yet through the Airflow notifier (``traffic.orchestration.notify``)."""
    from traffic.orchestration.notify import notify_pending  # deferred: DAG parsing stays light

    return notify_pending(settings_from_env())
