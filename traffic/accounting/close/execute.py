"""A close run: its plan's steps in order, freeze → roll up days → months → bills (with their alerts) →
expire → maintenance → Data Docs, each step timed and its failures and warnings gathered in one result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import date, datetime

from traffic.accounting.bills import store_bills
from traffic.accounting.close.freeze import freeze_hours, raise_alerts
from traffic.accounting.close.maintenance import expire, maintain
from traffic.accounting.close.plan import ClosePlan, plan_close, restrict
from traffic.accounting.close.rollup import roll_up_days, roll_up_months
from traffic.core.periods import day_start, next_month, period_end
from traffic.core.settings import Settings
from traffic.quality.data_docs import build_data_docs
from traffic.storage.report_copy import fetch_quietly
from traffic.quality.gx_context import preload
from traffic.quality.suite_documents import period_label
from traffic.quality.suites import Validation
from traffic.runtime import jvm
from traffic.runtime.spark import start_spark
from traffic.storage import state as st
from traffic.storage.warehouse import Warehouse


class CheckFailed(RuntimeError):
    """A period failed a critical check: it is recorded as failed and nothing is rolled up over it.

    Raised by ``close`` after the whole run is written (the message names each failed period, the
    check and the value it failed with); ``result`` is that run's ``CloseResult``.
    """

    def __init__(self, message: str, result: "CloseResult | None" = None):
        super().__init__(message)
        self.result = result


@dataclass
class CloseResult:
    """What a close run did: periods frozen, rolled up and billed, failure and warning messages, hours expired."""

    hours_frozen: list[datetime] = field(default_factory=list)
    days_rolled: list[date] = field(default_factory=list)
    months_rolled: list[datetime] = field(default_factory=list)
    bills_stored: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    expired_hours: int = 0
    watermark: datetime | None = None
    seconds: dict = field(default_factory=dict)


def close_locked(settings: Settings, warehouse: Warehouse, spark_factory, until: datetime | None,
                 progress=print, only: tuple[str, ...] | None = None, big_job: str | None = None) -> CloseResult:
    """The body of ``close`` for a caller that already holds the warehouse lock (replay).

    ``big_job``: why the caller's work is big (a replay's range), for a JVM this close starts when its own
    hours are few."""
    plan = restrict(plan_close(settings, warehouse, until), only)
    result = CloseResult(watermark=st.read_clock_state(warehouse).watermark)
    if plan.empty:
        return result
    if len(plan.hours) > jvm.QUICK_MAX_HOURS:
        big_job = f"a close of {len(plan.hours)} hours"
    execute_close(settings, warehouse.with_spark(start_spark(spark_factory, big_job)), plan, result, progress)
    return result


def execute_close(settings: Settings, warehouse: Warehouse, plan: ClosePlan, result: CloseResult,
                  progress=print) -> None:
    """Run a close plan with Spark: freeze → roll up days → months (each checked) → expire → maintenance → report."""
    if plan.hours or plan.days or plan.months or plan.bills:
        preload()
    checks = []
    clock = time.perf_counter()
    if plan.hours:
        progress(f"freezing {len(plan.hours)} hour(s) {plan.hours[0]:%Y-%m-%d %H:00} … {plan.hours[-1]:%Y-%m-%d %H:00}")
        check = Validation(warehouse, "freeze", [("hour", h) for h in plan.hours], [])
        frozen = freeze_hours(settings, warehouse, plan.hours, check)
        checks.append(check)
        result.hours_frozen = plan.hours
        result.failed += list(frozen.failed.values()) + frozen.alerts_failed
        result.warnings += _warnings(check, "hour", plan.hours)
        if frozen.failed:
            first_bad = min(frozen.failed)
            plan.days = [d for d in plan.days if period_end(day_start(d), "day") <= first_bad.replace(hour=0)]
            plan.months = [m for m in plan.months if next_month(m) <= first_bad.replace(hour=0)]
    result.seconds["freeze"] = time.perf_counter() - clock
    clock = time.perf_counter()
    if plan.days:
        rolled, failures, check = roll_up_days(settings, warehouse, plan.days, frozen_now=set(plan.hours))
        checks.append(check)
        result.days_rolled += rolled
        result.failed += failures
        result.warnings += _warnings(check, "day", [day_start(d) for d in rolled])
        if rolled:
            progress(f"rolled up {len(rolled)} day(s): {', '.join(d.isoformat() for d in rolled)}")
        waiting = [d for d in plan.days if d not in rolled]
        if waiting:
            progress(f"day(s) waiting for unpublished hours: {', '.join(d.isoformat() for d in waiting)}")
    if plan.months:
        rolled_months, failures, check = roll_up_months(warehouse, plan.months,
                                                        rolled_now={day_start(d) for d in result.days_rolled})
        checks.append(check)
        result.months_rolled += rolled_months
        result.failed += failures
        result.warnings += _warnings(check, "month", rolled_months)
        if rolled_months:
            progress(f"rolled up month(s): {', '.join(f'{m:%Y-%m}' for m in rolled_months)}")
    result.seconds["roll_up"] = time.perf_counter() - clock
    clock = time.perf_counter()
    if plan.bills:
        # Their alerts first (the same rows unless an hour was accepted since it failed): the stored bills
        # mark the period done, so a crash in between recomputes both.
        alerts_check = Validation(warehouse, "alerts", [("alert", p.start_utc) for p in plan.bills], [])
        result.failed += raise_alerts(warehouse, alerts_check, periods=plan.bills)
        alerts_check.record()
        checks.append(alerts_check if alerts_check.outcomes else None)
        stored, failures, check = store_bills(warehouse, plan.bills,
                                              lambda periods: Validation(warehouse, "bills", list(periods), []))
        checks.append(check)
        result.bills_stored += stored
        result.failed += failures
        if stored:
            progress(f"stored the bills of billing period(s) {', '.join(stored)}")
    result.seconds["bills"] = time.perf_counter() - clock
    clock = time.perf_counter()
    result.expired_hours = expire(settings, warehouse, plan, result.watermark, progress)
    maintain(warehouse, plan.merge_before)
    result.seconds["expire_maintain"] = time.perf_counter() - clock
    checks = [c for c in checks if c is not None]
    result.seconds["quality"] = sum(c.seconds for c in checks)
    if checks:
        clock = time.perf_counter()
        try:
            fetch_quietly(warehouse, progress)  # on object storage: other hosts' runs, for the index
            build_data_docs(warehouse, checks)
        except Exception as error:  # noqa: BLE001 - the accounting is written; docs are a view of it
            progress(f"warning: Data Docs not rebuilt: {type(error).__name__}: {error}")
        result.seconds["data_docs"] = time.perf_counter() - clock
        evaluated = sum(len(c.outcomes) for c in checks)
        progress(f"data quality: {evaluated:,} check(s) evaluated, {len(result.failed)} period(s) failed, "
                 f"{len(result.warnings)} flagged ({result.seconds['quality']:.1f} s validating, "
                 f"{result.seconds['data_docs']:.1f} s Data Docs)")


def _warnings(check, grain: str, starts) -> list[str]:
    """The notes of the periods among ``starts`` published with a warning."""
    notes = []
    for start in starts:
        status, note = check.status(grain, start)
        if status == "warning":
            notes.append(f"{grain} {period_label(grain, start)}: {note}")
    return notes
