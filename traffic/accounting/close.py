"""Close: freeze closed hours (and raise their alerts), roll up closed days and months, store closed bills, expire
raw detail and, when a retention is set, old per-address rows (DESIGN §3–§6).

What to do is decided on the driver from the small state tables, so a close with nothing
to do never starts Spark. Each step recomputes its output from its inputs and replaces
exactly its partitions before writing the ledger row that marks it done, so a close
killed anywhere and run again ends as an uninterrupted one.

Every step checks what it produces before publishing it (``traffic.quality.suites``: one Great
Expectations run per suite over all the periods of the step). A roll-up first re-checks the
periods it is built from — a frozen hour or a rolled-up day found corrupt since is marked
failed and the roll-up over it waits. The ledger row's ``dq_status`` is the verdict:
``passed``/``warning`` (published) or ``failed`` (not published, until ``traffic accept``).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.compute as pc

from traffic.runtime import jvm
from traffic.runtime.spark import start_spark
from traffic.storage import state as st
from traffic.accounting.alerts import refresh_alerts
from traffic.accounting.bills import due_periods, store_bills
from traffic.core.periods import (PUBLISHED, closed_hours, day_start, days_due, expiry_cutoff,
                                  days_between, days_of_month, expected_sources_window, hour_floor, hours_between, hours_of_day,
                                  is_published, month_start, months_due, next_month, panes_of, period_end,
                                  retention_floor, starts)
from traffic.storage.warehouse import Warehouse
from traffic.core.settings import Settings, SettingsError
from traffic.quality.data_docs import build_data_docs, prune_reports
from traffic.quality.gx_context import preload
from traffic.quality.suite_documents import period_label
from traffic.quality.suites import Validation
from traffic.storage.keys import cluster_key
from traffic.accounting import parts
from traffic.accounting import freeze_tasks
from traffic.accounting import panes as P
from traffic.runtime.spark import task_slots
from traffic.accounting import transforms as T
from traffic.storage.schemas import columns
from traffic.accounting.bills import billing_cycle, stored_bills

UTC = timezone.utc


class CheckFailed(RuntimeError):
    """A period failed a critical check: it is recorded as failed and nothing is rolled up over it.

    Raised by ``close`` after the whole run is written (the message names each failed period, the
    check and the value it failed with); ``result`` is that run's ``CloseResult``.
    """

    def __init__(self, message: str, result: "CloseResult | None" = None):
        super().__init__(message)
        self.result = result


@dataclass
class ClosePlan:
    """What a close run will do; empty means no Spark is needed."""

    hours: list[datetime] = field(default_factory=list)
    days: list[date] = field(default_factory=list)
    months: list[datetime] = field(default_factory=list)
    expire_packets: list[str] = field(default_factory=list)
    expire_other: dict[str, list[str]] = field(default_factory=dict)
    bills: list = field(default_factory=list)  # billing periods that close (traffic.accounting.bills)
    dq_bound: datetime | None = None  # check results of periods before this expire (dq_retention)
    merge_before: datetime | None = None  # days (months) before this are frozen: merge their files (maintain)

    @property
    def empty(self) -> bool:
        return not (self.hours or self.days or self.months or self.expire_packets
                    or any(self.expire_other.values()) or self.bills)


@dataclass
class CloseResult:
    hours_frozen: list[datetime] = field(default_factory=list)
    days_rolled: list[date] = field(default_factory=list)
    months_rolled: list[datetime] = field(default_factory=list)
    bills_stored: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    expired_hours: int = 0
    watermark: datetime | None = None
    seconds: dict = field(default_factory=dict)


def plan_close(settings: Settings, warehouse: Warehouse, until: datetime | None = None) -> ClosePlan:
    """Decide, without Spark, which hours to freeze, days/months to roll up and partitions to expire."""
    state = st.read_clock_state(warehouse)
    plan = ClosePlan()
    if state.watermark is None or state.first_hour is None:
        return plan
    ledger = st.read_ledger(warehouse, columns=st.LEDGER_STATUS)
    hours_done = {r["period_start"]: r for r in ledger if r["grain"] == "hour"}
    frontier = st.frozen_frontier(ledger)
    plan.hours = closed_hours(state.first_hour, frontier, state.watermark, until)
    frozen_end = period_end(plan.hours[-1], "hour") if plan.hours else (frontier or state.first_hour)
    plan.merge_before = day_start(frozen_end)
    published = {h for h, r in hours_done.items() if is_published(r["dq_status"])}
    freezing = set(plan.hours)
    # Hours frozen by this run count as published unless their checks fail (then the roll-up stops).
    plan.days = days_due(state.first_hour, state.watermark, starts(ledger, "day"), published | freezing, until,
                         frozen_end)
    # Days rolled up by this run count as published unless their checks fail (then the month waits).
    rolled_days = starts(ledger, "day") | {day_start(d) for d in plan.days}
    unpublished_days = starts(ledger, "day") - starts(ledger, "day", PUBLISHED)
    plan.months = months_due(state.first_hour, state.watermark, rolled_days, starts(ledger, "month"),
                             unpublished_days, until)
    cutoff = expiry_cutoff(state.watermark, settings.keep_hours, frozen_end)
    plan.expire_packets = warehouse.table("packets").keys_before(cutoff)
    for table, retention in (("late_packets", settings.late_retention), ("rejects", settings.reject_retention),
                             ("source_panes", settings.dq_retention)):
        plan.expire_other[table] = warehouse.table(table).keys_before(retention_floor(state.watermark, retention))
    plan.dq_bound = month_start(retention_floor(state.watermark, settings.dq_retention))
    plan.expire_other["dq_results"] = warehouse.table("dq_results").keys_before(plan.dq_bound)
    plan.expire_other.update(per_address_expiry(warehouse, state.watermark, ledger))
    # Bills of billing periods whose hours are all frozen (by now or by this run) and published.
    plan.bills = due_periods(warehouse, state.first_hour, frozen_end, published | freezing)
    return plan


#: Per-address tables with a retention setting (DESIGN §5; default: kept), each with the coarser grain its
#: rows must be summed into, and published, before they may go.
PER_ADDRESS_RETENTION = {"hourly": ("hourly_retention", "day"), "daily": ("daily_retention", "month")}
_KEY_WIDTH = {"day": 10, "month": 7}


def per_address_expiry(warehouse: Warehouse, watermark: datetime, ledger: list[dict]) -> dict[str, list[str]]:
    """The keys of ``hourly`` (``daily``) rows past ``hourly_retention`` (``daily_retention``), by event time.

    An hour (a day) goes once it lies wholly before ``hour_floor(W) - retention`` and the day (month) it
    was rolled up into is in the ledger and published: its bytes then live on in ``daily`` (``monthly``)
    and the ledger, which expiry never touches, and the accounting never reads it again (a roll-up reads
    only periods not rolled up yet; a month re-checks its days against the ledger, not ``hourly``; bills
    are cut from ``panes``). Reports of an expired period find the totals, not the addresses. So an open
    hour, a frozen hour of a day not rolled up yet, and the hours of a failed day (an operator's evidence
    until ``traffic accept``) are kept whatever the setting. ``None`` (the default) keeps the table.
    """
    expired: dict[str, list[str]] = {}
    for table, (setting, coarser) in PER_ADDRESS_RETENTION.items():
        retention = getattr(warehouse.settings, setting)
        if retention is None:
            continue
        rolled_up = {cluster_key(r["period_start"], coarser) for r in ledger
                     if r["grain"] == coarser and is_published(r["dq_status"])}
        expired[table] = [k for k in warehouse.table(table).keys_before(retention_floor(watermark, retention))
                          if k[:_KEY_WIDTH[coarser]] in rolled_up]
    return expired


STEPS = ("freeze", "days", "months", "expire")


def restrict(plan: ClosePlan, only: tuple[str, ...] | None) -> ClosePlan:
    """Keep only some steps of a plan (a scheduler runs them as separate, visible tasks)."""
    if not only:
        return plan
    unknown = set(only) - set(STEPS)
    if unknown:
        raise SettingsError(f"--only: unknown close step(s) {sorted(unknown)}; steps are {', '.join(STEPS)}")
    if "freeze" not in only and plan.hours:
        # Days/months may only count hours that are frozen already, not ones this plan would freeze.
        first_unfrozen = plan.hours[0]
        plan.bills = []
        plan.days = [d for d in plan.days if period_end(day_start(d), "day") <= first_unfrozen]
        plan.months = [m for m in plan.months if next_month(m) <= first_unfrozen]
    return ClosePlan(
        hours=plan.hours if "freeze" in only else [],
        days=plan.days if "days" in only else [],
        months=plan.months if "months" in only else [],
        expire_packets=plan.expire_packets if "expire" in only else [],
        expire_other=plan.expire_other if "expire" in only else {},
        bills=plan.bills if "freeze" in only else [],  # bills are stored by the step that freezes their last hour
        dq_bound=plan.dq_bound if "expire" in only else None,
        # Maintenance merges only days that are frozen already, not ones this plan would freeze.
        merge_before=plan.merge_before if "freeze" in only or not plan.hours else min(plan.merge_before,
                                                                                     day_start(plan.hours[0])),
    )


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
    execute_close(warehouse.with_spark(start_spark(spark_factory, big_job)), plan, result, progress)
    return result


def execute_close(warehouse: Warehouse, plan: ClosePlan, result: CloseResult, progress=print) -> None:
    """Run a close plan with Spark: freeze → roll up days → months (each checked) → expire → maintenance → report."""

    if plan.hours or plan.days or plan.months or plan.bills:
        preload()
    checks = []
    clock = time.perf_counter()
    if plan.hours:
        progress(f"freezing {len(plan.hours)} hour(s) {plan.hours[0]:%Y-%m-%d %H:00} … {plan.hours[-1]:%Y-%m-%d %H:00}")
        check = _validation(warehouse, "freeze", [("hour", h) for h in plan.hours])
        failed = freeze_hours(warehouse, plan.hours, check)
        checks.append(check)
        result.hours_frozen = plan.hours
        result.failed += list(failed.values()) + alert_failures(check)
        result.warnings += _warnings(check, "hour", plan.hours)
        if failed:
            first_bad = min(failed)
            plan.days = [d for d in plan.days if period_end(day_start(d), "day") <= first_bad.replace(hour=0)]
            plan.months = [m for m in plan.months if next_month(m) <= first_bad.replace(hour=0)]
    result.seconds["freeze"] = time.perf_counter() - clock
    clock = time.perf_counter()
    if plan.days:
        rolled, failures, check = roll_up_days(warehouse, plan.days, frozen_now=set(plan.hours))
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
        alerts_check = _validation(warehouse, "alerts", [("alert", p.start_utc) for p in plan.bills])
        result.failed += refresh_alerts(warehouse, [], [], alerts_check, periods=plan.bills)
        alerts_check.record()
        checks.append(alerts_check if alerts_check.outcomes else None)
        stored, failures, check = store_bills(warehouse, plan.bills, lambda periods: _validation(warehouse, "bills", periods))
        checks.append(check)
        result.bills_stored += stored
        result.failed += failures
        if stored:
            progress(f"stored the bills of billing period(s) {', '.join(stored)}")
    result.seconds["bills"] = time.perf_counter() - clock
    clock = time.perf_counter()
    if plan.expire_packets:
        warehouse.table("packets").delete_keys(plan.expire_packets, op="expire")
        result.expired_hours = len(plan.expire_packets)
        progress(f"expired raw detail of {len(plan.expire_packets)} hour(s)")
    for table, keys in plan.expire_other.items():
        if table == "dq_results" and plan.dq_bound is not None:
            # Listed again now: this run's own checks of periods already past dq_retention (a catch-up over
            # months) go too, as they would at a rerun of this close after a crash, which finds them written.
            keys = warehouse.table(table).keys_before(plan.dq_bound)
        elif table in PER_ADDRESS_RETENTION and result.watermark is not None:
            # Listed again now, with the days and months this run has just rolled up and published: as at
            # a rerun of this close after a crash, which finds them in the ledger.
            keys = per_address_expiry(warehouse, result.watermark,
                                      st.read_ledger(warehouse, columns=st.LEDGER_STATUS)).get(table, [])
        if keys:
            warehouse.table(table).delete_keys(keys, op="expire")
    if plan.dq_bound is not None:
        # The validation results and Data Docs pages behind expired dq_results go with them.
        pruned = prune_reports(warehouse, plan.dq_bound)
        if pruned:
            progress(f"removed {pruned} Great Expectations run(s) of periods before {plan.dq_bound:%Y-%m}")
    maintain(warehouse, plan.merge_before)
    result.seconds["expire_maintain"] = time.perf_counter() - clock
    checks = [c for c in checks if c is not None]
    result.seconds["quality"] = sum(c.seconds for c in checks)
    if checks:
        clock = time.perf_counter()
        try:
            build_data_docs(warehouse, checks)
        except Exception as error:  # noqa: BLE001 - the accounting is written; docs are a view of it
            progress(f"warning: Data Docs not rebuilt: {type(error).__name__}: {error}")
        result.seconds["data_docs"] = time.perf_counter() - clock
        evaluated = sum(len(c.outcomes) for c in checks)
        progress(f"data quality: {evaluated:,} check(s) evaluated, {len(result.failed)} period(s) failed, "
                 f"{len(result.warnings)} flagged ({result.seconds['quality']:.1f} s validating, "
                 f"{result.seconds['data_docs']:.1f} s Data Docs)")


def _validation(warehouse: Warehouse, step: str, periods, inputs=()):

    return Validation(warehouse, step, list(periods), list(inputs))


def _warnings(check, grain: str, starts) -> list[str]:

    notes = []
    for start in starts:
        status, note = check.status(grain, start)
        if status == "warning":
            notes.append(f"{grain} {period_label(grain, start)}: {note}")
    return notes


def _utc_hour(value) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _sums(frame, column: str, extra=()) -> dict:
    """Per-period Σ bytes and Σ packets of a Spark frame (one small collect)."""
    from pyspark.sql import functions as F

    aggs = [F.sum("bytes").alias("bytes"), *extra]
    return {r[column]: r for r in frame.groupBy(column).agg(*aggs).collect()}


def _arrow_sums(table: pa.Table, column: str, counted: str = "packets") -> dict[datetime, list[int]]:
    """Per-period [Σ bytes, Σ packets] of an Arrow table (``counted=None``: count rows as packets).

    Grouped in Arrow (an hour of hourly rows at real-world cardinality is millions of rows); only one
    entry per period reaches Python.
    """
    import pyarrow.compute as pc

    amounts = {"bytes": ("bytes", "sum"), "packets": (counted, "sum") if counted else ([], "count_all")}
    grouped = parts.group_sums(table.select([column, "bytes", *([counted] if counted else [])]), [column], amounts)
    sums: dict[datetime, list[int]] = {}
    for value, size, count in zip(grouped.column(column).to_pylist(),
                                  pc.fill_null(grouped.column("bytes"), 0).to_pylist(),
                                  pc.fill_null(grouped.column("packets"), 0).to_pylist()):
        key = value if isinstance(value, datetime) else datetime(value.year, value.month, value.day)
        entry = sums.setdefault(_utc_hour(key), [0, 0])
        entry[0] += size
        entry[1] += count
    return sums


def _ledger_frame(rows: list[dict]):
    """The ledger rows beside their reconciliation totals, as the pandas frame the ``periods`` suite checks."""
    import pandas as pd

    columns = ["grain", "period_start", "bytes", "packets", "late_bytes", "late_packets", "sources_reporting",
               "sources_expected", "panes_active", "table_bytes", "table_packets", "source_bytes", "source_packets",
               "parts_bytes", "late_kept_bytes", "rows_differing", "panes_bytes", "panes_packets", "lost",
               "seconds_past_start", "sources_ahead"]
    records = []
    for r in rows:
        estimated, total = r.get("estimated_bytes") or 0, r.get("bytes") or 0
        start = r["period_start"]
        aligned = {"hour": start.replace(minute=0, second=0, microsecond=0),
                   "day": start.replace(hour=0, minute=0, second=0, microsecond=0),
                   "month": start.replace(day=1, hour=0, minute=0, second=0, microsecond=0)}.get(r["grain"], start)
        records.append({**{c: r.get(c) for c in columns},
                        "seconds_past_start": int((start - aligned).total_seconds()),
                        "estimated_share": estimated / total if total else (0 if not estimated else 2)})
    frame = pd.DataFrame.from_records(records, columns=columns)
    for name in columns[2:-1]:
        frame[name] = frame[name].astype("Int64")
    frame["sources_ahead"] = frame["sources_ahead"].astype("object")
    frame["estimated_share"] = pd.Series([r["estimated_share"] for r in records], dtype="float64")
    return frame


def _late_kept(warehouse: Warehouse, hours: list[datetime]) -> dict[datetime, int | None]:
    """Σ late_packets bytes per hour, or None for hours whose late records may already have expired."""
    watermark = st.read_clock_state(warehouse).watermark
    bound = retention_floor(watermark, warehouse.settings.late_retention) if watermark else None
    late = warehouse.table("late_packets").read_arrow(keys=hours,
                                                      columns=["hour", "bytes"])
    sums = _arrow_sums(late, "hour", counted=None)
    return {h: (None if bound is not None and h < bound else sums.get(h, [0, 0])[0]) for h in hours}


def _validate_side_tables(warehouse: Warehouse, check, periods: list, step: str) -> None:
    """Ingest health of the hours that have late records or rejects (one run per table over all of them)."""
    for name in ("late_packets", "rejects"):
        present = set(warehouse.table(name).periods_with_files([start for _, start in periods]))
        if present:
            covered = [p for p in periods if p[1] in present]
            check.validate(name, warehouse.table(name).read(keys=sorted(present)), covered, asset=f"{name}.{step}")


@dataclass
class _Recomputed:
    """A freeze's hours recomputed from raw detail: final rows and panes to commit (staged files or Spark
    frames), per-hour raw Σ (bytes, rows), the rows differing from the open ones, and the raw detail as
    Spark reads it (for the checks)."""

    final: object
    final_panes: object
    raw: dict[datetime, tuple[int, int]]
    differing: dict[datetime, int]
    packets: object
    cached: tuple = ()
    estimated: dict = field(default_factory=dict)  # per hour, bytes estimated from samples


def freeze_hours(warehouse: Warehouse, hours: list[datetime], check=None,
                 restated: str | None = None) -> dict[datetime, str]:
    """Write final rows and panes, check them and write the ledger rows for ``hours`` in one pass.

    Returns the hours that failed a critical check, each with the message naming the check
    and the value it failed with. A failed hour keeps its final rows but is not published
    (``dq_status = failed``), so no day is rolled up over it. ``restated`` is the reason when the
    hours are frozen again after a restatement replaced their raw detail.
    """

    check = check or _validation(warehouse, "freeze", [("hour", h) for h in hours])
    periods = [("hour", h) for h in hours]
    # Only hours with rows cost work: an empty hour (no packets, no open rows or panes) has nothing to
    # recompute, write or check but its ledger row, which is built and checked with the others below.
    # A year of empty hours (one stray old record) closes at the cost of the hours with data.
    busy = set(_hours_with_rows(warehouse, hours))
    busy_hours = [h for h in hours if h in busy]
    busy_periods = [("hour", h) for h in busy_hours]
    if busy_hours:
        # Arrow tasks read each hour's own files; where a file holds several hours (one another writer
        # made) the tables cannot be listed by hour, and Spark reads them by key instead.
        raw_files = warehouse.table("packets").paths_by_period(busy_hours)
        open_files = warehouse.table("hourly").paths_by_period(busy_hours)
        totals = recompute_arrow(warehouse, busy_hours, raw_files, open_files) \
            if raw_files is not None and open_files is not None else recompute_spark(warehouse, busy_hours)
        warehouse.table("hourly").replace(totals.final, keys=busy_hours, op="freeze")
        warehouse.table("panes").replace(totals.final_panes, keys=busy_hours, op="freeze")
    else:
        totals = _Recomputed(None, None, {}, {}, None)
    stored = _arrow_sums(warehouse.table("hourly").read_arrow(keys=busy_hours, columns=["hour", "bytes", "packets"]),
                         "hour")
    pane_sums = _arrow_sums(warehouse.table("panes").read_arrow(keys=busy_hours, columns=["hour", "bytes", "packets"]),
                            "hour")

    late = warehouse.table("late_packets").read_arrow(keys=hours, columns=["hour", "bytes", "packets"])
    late_totals = _arrow_sums(late.set_column(2, "packets", parts.weights(late)), "hour")
    late_kept = _late_kept(warehouse, hours)
    completeness = _completeness(warehouse, hours)
    history = st.watermark_history(warehouse)
    clocks = st.read_clock_state(warehouse)
    rows = []
    for hour in hours:
        late_bytes, late_packets = late_totals.get(hour, (0, 0))
        reporting, expected, active, lost = completeness[hour]
        table_bytes, table_packets = stored.get(hour, (0, 0))
        source_bytes, source_packets = totals.raw.get(hour, (0, 0))
        rows.append({
            **_ledger_row("hour", hour, (table_bytes, table_packets), (late_bytes, late_packets),
                          (reporting, expected, active), st.closed_at(history, period_end(hour, "hour")), restated,
                          lost=lost, estimated_bytes=totals.estimated.get(hour, 0)),
            # reconciliation (checked by the `periods` suite, not stored)
            "table_bytes": table_bytes, "table_packets": table_packets,
            "source_bytes": source_bytes, "source_packets": source_packets,
            "late_kept_bytes": late_kept[hour], "rows_differing": totals.differing.get(hour, 0),
            "panes_bytes": pane_sums.get(hour, (0, 0))[0], "panes_packets": pane_sums.get(hour, (0, 0))[1],
            "sources_ahead": ", ".join(clocks.ahead_when_closed(hour)) or None,
        })
    if busy_hours:
        # The row suites check the hours that have rows; an empty hour is checked by its ledger row.
        check.validate("packets", totals.packets, busy_periods, asset="packets.freeze",
                       rows=sum(count for _, count in totals.raw.values()))
        # The final rows and panes as stored (an Arrow freeze wrote them from its tasks).
        check.validate("hourly", warehouse.table("hourly").read(keys=busy_hours), busy_periods, asset="hourly.freeze")
        check.validate("panes", warehouse.table("panes").read(keys=busy_hours), busy_periods, asset="panes.freeze")
    _validate_side_tables(warehouse, check, periods, "freeze")
    check.validate("periods", _ledger_frame(rows), periods, asset="periods.freeze")
    for frame in totals.cached:
        frame.unpersist()
    _judge(check, rows)
    failed = {row["period_start"]: check.message("hour", row["period_start"])
              for row in rows if row["dq_status"] == "failed"}
    # Alerts of the billing periods over these hours, from their published final panes: written before
    # the ledger rows that mark the hours done, so a crash in between freezes (and alerts) them again.
    refresh_alerts(warehouse, hours, rows, check)
    check.record()
    st.write_ledger_rows(warehouse, _store(rows), op="freeze")
    return failed


def alert_failures(check) -> list[str]:
    """The messages of the billing periods whose alerts failed a critical check in ``check`` (not stored)."""
    starts = sorted({o.period_start for o in check.outcomes if o.grain == "alert" and o.critical and not o.success})
    return [f"alerts: {check.message('alert', start)}" for start in starts]


def _hours_with_rows(warehouse: Warehouse, hours: list[datetime]) -> set[datetime]:
    """The hours among ``hours`` with rows in ``packets``, ``hourly`` or ``panes`` (from the file lists
    alone). A merged file spanning several hours (a restated range) counts for every hour it may hold."""
    return {h for name in ("packets", "hourly", "panes") for h in warehouse.table(name).periods_with_files(hours)}


def recompute_arrow(warehouse: Warehouse, hours: list[datetime], raw_files: dict, open_files: dict) -> _Recomputed:
    """Recompute in Arrow tasks (``traffic.accounting.freeze_tasks``) that write the hours' final rows and panes
    to staged folders; the driver only sums the tasks' per-hour raw totals and differing rows. ``raw_files``
    and ``open_files`` are the hours' files of ``packets`` and ``hourly`` (``Table.paths_by_period``)."""

    packets, hourly = warehouse.table("packets"), warehouse.table("hourly")
    work = [(freeze_tasks.Hour(hour, tuple(path for path, _ in raw_files.get(hour, ())),
                               tuple(path for path, _ in open_files.get(hour, ()))),
             sum(size for _, size in raw_files.get(hour, ())))
            for hour in hours if hour in raw_files or hour in open_files]
    # Two tasks per slot: an uneven split leaves a core idle for less of the job.
    groups = freeze_tasks.share_out(work, 2 * task_slots(warehouse.settings))
    scratch = warehouse.scratch("freeze")
    job = freeze_tasks.Job(str(scratch), hourly.staging(), warehouse.table("panes").staging(),
                P.Mapping.of(warehouse.settings.accounts_file))
    if groups:
        warehouse.spark.range(0, len(groups), 1, len(groups)) \
            .mapInArrow(freeze_tasks.task_function(groups, job), freeze_tasks.OUTCOME_DDL).collect()
    attempts = {task: 0 for task in range(len(groups))}
    raw = parts.read_parts(str(scratch), "raw", attempts)
    differing = parts.read_parts(str(scratch), "differing", attempts)
    warehouse.drop_scratch(scratch)
    return _Recomputed(job.hourly, job.panes, {h: tuple(v) for h, v in _arrow_sums(raw, "hour").items()},
                       {_utc_hour(h): n for h, n in zip(differing.column("hour").to_pylist(),
                                                        differing.column("n").to_pylist())},
                       packets.read(keys=hours),
                       estimated={_utc_hour(h): e for h, e in zip(*freeze_tasks.sum_raw(raw).select(
                           ["hour", "estimated_bytes"]).to_pydict().values())})


def recompute_spark(warehouse: Warehouse, hours: list[datetime]) -> _Recomputed:
    """Recompute with Spark over the tables read by key (files that hold several hours)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    # Many hours at once (a replay, a catch-up) are cached on local disk, not in the JVM heap.
    packets = warehouse.table("packets").read(keys=hours).persist(
        StorageLevel.DISK_ONLY if len(hours) > 24 else StorageLevel.MEMORY_AND_DISK_DESER)
    final = T.hourly_totals(packets, "final").persist()
    # Built-in check: the open rows the micro-batches maintained equal the totals recomputed from raw detail.
    differing = spark_rows_differing(final, warehouse.table("hourly").read(keys=hours))
    sampled = F.when(F.coalesce(F.col("sampling_rate"), F.lit(1)) > 1, F.col("bytes")).otherwise(F.lit(0))
    sums = _sums(packets, "hour", [F.sum(T.weight()).alias("packets"), F.sum(sampled).alias("estimated")])
    raw = {_utc_hour(k): (int(v["bytes"] or 0), int(v["packets"])) for k, v in sums.items()}
    # The hour's final panes, from the same raw detail, attributed with the mapping in force at each pane.
    final_panes = P.pane_totals(packets, P.Mapping.of(warehouse.settings.accounts_file), "final").persist()
    return _Recomputed(final, final_panes, raw, differing, packets, (packets, final, final_panes),
                       estimated={_utc_hour(k): int(v["estimated"] or 0) for k, v in sums.items()})


def spark_rows_differing(final, open_rows) -> dict[datetime, int]:
    """Per hour, rows of either side without an equal row on the other (a multiset difference both ways).

    Both sides hold one row per (hour, local_ip, remote_ip), so one full outer join on that key
    finds them: a key on one side only is one differing row, a key on both with other amounts two.
    """
    from pyspark.sql import functions as F

    key = ["hour", "local_ip", "remote_ip"]

    def side(frame, tag: str):
        return frame.select(*[F.col(c).alias(f"{tag}_{c}") for c in (*key, *T.AMOUNTS)], F.lit(1).alias(f"{tag}_row"))

    joined = side(final, "a").join(side(open_rows, "b"), how="full_outer",
                                   on=[F.col(f"a_{c}").eqNullSafe(F.col(f"b_{c}")) for c in key]) \
        .withColumn("hour", F.coalesce("a_hour", "b_hour"))
    same = F.lit(True)
    for c in T.AMOUNTS:
        same = same & F.col(f"a_{c}").eqNullSafe(F.col(f"b_{c}"))
    both = F.col("a_row").isNotNull() & F.col("b_row").isNotNull()
    rows = F.when(both & same, 0).when(both, 2).otherwise(1)
    return {_utc_hour(r["hour"]): r["n"] for r in
            joined.groupBy("hour").agg(F.sum(rows).alias("n")).where(F.col("n") > 0).collect()}


def _completeness(warehouse: Warehouse, hours: list[datetime]) -> dict[datetime, tuple[int, int, int, int]]:
    """(sources_reporting, sources_expected, panes_active, lost) per hour, from ``source_panes``; ``lost``
    is the export sequence units flow sources lost in the hour (DESIGN §7a)."""
    settings = warehouse.settings
    lo, hi = expected_sources_window(hours[0])[0], expected_sources_window(hours[-1])[1]
    panes = st.rows(warehouse.table("source_panes").read_arrow(key_min=lo, key_max=hi,
                                                               columns=["source", "pane_start", "lost"]))
    by_pane: dict[datetime, set[str]] = {}
    lost_by_hour: dict[datetime, int] = {}
    for p in panes:
        by_pane.setdefault(p["pane_start"], set()).add(p["source"])
        if p["lost"]:
            lost_by_hour[hour_floor(p["pane_start"])] = lost_by_hour.get(hour_floor(p["pane_start"]), 0) + p["lost"]
    result = {}
    starts = sorted(by_pane)
    for hour in hours:
        reporting = set().union(*[by_pane.get(pane, set()) for pane in panes_of(hour)])
        if settings.expected_sources:
            expected = set(settings.expected_sources)
        else:
            # The panes of the 24 hours ending at the hour's end (a slice of the sorted starts: a long
            # run of hours costs per pane with data, not per hour times panes).
            first, end = expected_sources_window(hour)
            window = starts[bisect_left(starts, first):bisect_left(starts, end)]
            expected = set().union(*[by_pane[pane] for pane in window])
        active = sum(1 for pane in panes_of(hour) if expected <= by_pane.get(pane, set()))
        result[hour] = (len(reporting), len(expected), active, lost_by_hour.get(hour, 0))
    return result


def _children_summary(ledger_rows: list[dict]) -> dict:
    return {
        "late_bytes": sum(r["late_bytes"] for r in ledger_rows),
        "late_packets": sum(r["late_packets"] for r in ledger_rows),
        "sources_expected": max((r["sources_expected"] for r in ledger_rows), default=0),
        "panes_active": sum(r["panes_active"] for r in ledger_rows),
        "lost": sum(r.get("lost") or 0 for r in ledger_rows),
        "estimated_bytes": sum(r.get("estimated_bytes") or 0 for r in ledger_rows),
    }


def _published(row: dict | None) -> bool:
    return row is not None and row["dq_status"] in PUBLISHED


def _recheck(check, rows: list[dict], grain: str) -> list[dict]:
    """Ledger rows to rewrite after a re-check: published periods that now fail a critical check.

    Accepted periods stay accepted (an operator looked at them); the failure is still recorded.
    """
    changed = []
    for row in rows:
        status, note = check.status(grain, row["period_start"])
        if status == "failed" and row["dq_status"] in ("passed", "warning"):
            changed.append({**row, "dq_status": "failed", "dq_note": f"re-check: {note}"})
    return changed


def _store(rows: list[dict]) -> list[dict]:
    """Ledger rows without the reconciliation columns (those are checked, not stored)."""

    names = columns("periods")
    return [{k: r.get(k) for k in names} for r in rows]


def roll_up_days(warehouse: Warehouse, days: list[date], frozen_now=frozenset(), restated: str | None = None):
    """``daily`` for closed days in one pass: re-check their hours, roll up, check, publish.

    The day's hours are checked again first (their rows and ledger rows, except hours this run
    has just frozen): an hour found corrupt is marked failed and its day waits. Days roll up in
    order; the first one that cannot stops the rest. Returns (days rolled, failure messages, check).
    """
    from pyspark.sql import functions as F

    state = st.read_clock_state(warehouse)
    starts = sorted(day_start(d) for d in days)
    begin, end = starts[0], period_end(starts[-1], "day")
    ledger = st.read_ledger(warehouse, keys=sorted({month_start(s) for s in starts}))
    hours = {r["period_start"]: r for r in ledger if r["grain"] == "hour" and begin <= r["period_start"] < end}
    check = _validation(warehouse, "days", [("day", s) for s in starts], hours.values())
    hourly = warehouse.table("hourly").read(key_min=begin, key_max=end).persist()
    recheck = sorted(h for h in hours if h not in frozen_now)
    failures: list[str] = []
    changed: list[dict] = []
    if recheck:
        periods = [("hour", h) for h in recheck]
        rows_of = hourly.where(F.col("hour").isin(recheck)) if len(recheck) < len(hours) else hourly
        # As when they were frozen: the row suite checks the hours that have rows, every hour its ledger row.
        with_rows = {_utc_hour(h) for h in warehouse.table("hourly").read_arrow(keys=recheck, columns=["hour"])
                     .column("hour").to_pylist()}
        row_periods = [p for p in periods if p[1] in with_rows]
        if row_periods:
            check.validate("hourly", rows_of, row_periods, asset="hourly.recheck")
        _validate_side_tables(warehouse, check, periods, "days")
        final_sums = _arrow_sums(warehouse.table("hourly").read_arrow(
            keys=recheck, columns=["hour", "bytes", "packets"], filter=pc.field("status") == "final"), "hour")
        present = warehouse.table("packets").periods_with_files(recheck)
        raw = {}
        if present:
            packets = warehouse.table("packets").read(keys=present)
            raw = {_utc_hour(k): v for k, v in _sums(packets, "hour", [F.sum(T.weight()).alias("packets")]).items()}
        late_kept = _late_kept(warehouse, recheck)
        view = []
        for h in recheck:
            source = raw.get(h)
            view.append({**hours[h], "table_bytes": final_sums.get(h, (0, 0))[0],
                         "table_packets": final_sums.get(h, (0, 0))[1],
                         "source_bytes": int(source["bytes"]) if source else None,
                         "source_packets": int(source["packets"]) if source else None,
                         "late_kept_bytes": late_kept[h]})
        check.validate("periods", _ledger_frame(view), periods, asset="periods.recheck-hours")
        changed = _recheck(check, [hours[h] for h in recheck], "hour")
        for row in changed:
            hours[row["period_start"]] = row
            failures.append(check.message("hour", row["period_start"]))
    rollable = []
    for start in starts:
        needed = hours_of_day(start, state.first_hour or start)
        if not all(_published(hours.get(h)) for h in needed):
            break
        rollable.append(start)
    day_rows = []
    if rollable:
        in_days = F.to_date("hour").isin([s.date() for s in rollable])
        finals = hourly.where((F.col("status") == "final") & in_days)
        day_rows = _roll_up_into(warehouse, check, "day", rollable, finals, F.to_date("hour"), hours, restated)
        failures += _judge(check, day_rows)
    hourly.unpersist()
    check.record()
    st.write_ledger_rows(warehouse, _store(changed + day_rows), op="roll_up")
    return [s.date() for s in rollable], failures, check


_ROLLED_UP = {"day": "daily", "month": "monthly"}


def _roll_up_into(warehouse: Warehouse, check, grain: str, rollable: list[datetime], finer, period_of,
                  parts_by_start: dict[datetime, dict], restated: str | None) -> list[dict]:
    """What a day's and a month's roll-up share: sum the finer rows into the coarser table, replace its
    periods, check them, and build their ledger rows (their verdicts are set by the caller, ``_judge``).

    ``finer``: the final rows of the periods' parts (hourly / daily); ``period_of``: the Spark column
    giving each row's period start; ``parts_by_start``: the parts' ledger rows by start.
    """
    from pyspark.sql import functions as F  # deferred: pyspark's column functions, as everywhere in this module

    table = _ROLLED_UP[grain]
    rolled = T.roll_up(finer, grain, period_of)
    if grain == "day":
        rolled = rolled.withColumn("month", F.trunc("day", "month"))
    rolled = rolled.persist()
    keys = rollable
    warehouse.table(table).replace(rolled, keys=keys, op="roll_up")
    stored = _arrow_sums(warehouse.table(table).read_arrow(keys=keys, columns=[grain, "bytes", "packets"]), grain)
    from_parts = {_utc_hour(datetime.combine(r[grain], datetime.min.time())): r for r in
                  finer.groupBy(period_of.alias(grain)).agg(
                      F.sum("bytes").alias("bytes"), F.sum("packets").alias("packets")).collect()}
    periods = [(grain, s) for s in rollable]
    check.validate(table, rolled, periods, asset=f"{table}.{grain}s")
    history = st.watermark_history(warehouse)
    rows = []
    for start in rollable:
        parts = [r for s, r in parts_by_start.items() if start <= s < period_end(start, grain)]
        rows.append(_rolled_up_row(warehouse, grain, start, period_end(start, grain), parts, stored.get(start, (0, 0)),
                                   from_parts.get(start), history, restated))
    check.validate("periods", _ledger_frame(rows), periods, asset=f"periods.{grain}s")
    rolled.unpersist()
    return rows


def _rolled_up_row(warehouse: Warehouse, grain: str, start: datetime, end: datetime, parts: list[dict],
                   stored: tuple[int, int], source: dict | None, history, restated: str | None) -> dict:
    """The ledger row of a rolled-up day or month, with the figures its checks compare."""
    table_bytes, table_packets = stored
    children = _children_summary(parts)
    reporting = _sources_between(warehouse, max(start, min(r["period_start"] for r in parts)), end)
    return {
        **_ledger_row(grain, start, stored, (children["late_bytes"], children["late_packets"]),
                      (reporting, children["sources_expected"], children["panes_active"]),
                      st.closed_at(history, end), restated, lost=children["lost"],
                      estimated_bytes=children["estimated_bytes"]),
        "table_bytes": table_bytes, "table_packets": table_packets,
        "source_bytes": int(source["bytes"]) if source else 0,
        "source_packets": int(source["packets"]) if source else 0,
        "parts_bytes": sum(r["bytes"] for r in parts),
    }


def _ledger_row(grain: str, start: datetime, totals: tuple[int, int], late: tuple[int, int],
                completeness: tuple[int, int, int], closed_at: datetime | None, restated: str | None,
                lost: int = 0, estimated_bytes: int = 0) -> dict:
    """A period's ledger row (DESIGN §6), its verdict still to be set from its checks (``_judge``).

    ``totals`` are the (bytes, packets) of the period's final rows as stored, ``late`` its late
    (bytes, packets) so far, ``completeness`` (sources reporting, sources expected, panes active);
    ``lost`` the export sequence units flow sources lost, ``estimated_bytes`` the bytes estimated
    from sampled records (DESIGN §7a).
    """
    return {"grain": grain, "period_start": start, "bytes": totals[0], "packets": totals[1],
            "late_bytes": late[0], "late_packets": late[1], "sources_reporting": completeness[0],
            "sources_expected": completeness[1], "panes_active": completeness[2],
            "closed_at_watermark": closed_at, "dq_status": None, "restated": restated, "dq_note": None,
            "lost": lost, "estimated_bytes": estimated_bytes}


def _judge(check, rows: list[dict]) -> list[str]:
    """Set each ledger row's verdict from the checks; the messages of the failed ones."""
    failures = []
    for row in rows:
        row["dq_status"], row["dq_note"] = check.status(row["grain"], row["period_start"])
        if row["dq_status"] == "failed":
            failures.append(check.message(row["grain"], row["period_start"]))
    return failures


def roll_up_months(warehouse: Warehouse, months: list[datetime], rolled_now=frozenset(), restated: str | None = None):
    """``monthly`` for closed months in one pass: re-check their days, roll up, check, publish.

    Like ``roll_up_days`` one level up: a day found corrupt (its rows no longer add up to its
    ledger row) is marked failed and its month waits. Returns (months rolled, failures, check).
    """
    from pyspark.sql import functions as F

    months = sorted(months)
    begin, end = months[0], next_month(months[-1])
    ledger = st.read_ledger(warehouse, keys=months)
    days = {r["period_start"]: r for r in ledger if r["grain"] == "day"}
    hours = [r for r in ledger if r["grain"] == "hour"]
    check = _validation(warehouse, "months", [("month", m) for m in months], days.values())
    daily = warehouse.table("daily").read(key_min=begin, key_max=end).persist()
    recheck = sorted(d for d in days if d not in rolled_now)
    failures: list[str] = []
    changed: list[dict] = []
    if recheck:
        periods = [("day", d) for d in recheck]
        rows_of = daily.where(F.col("day").isin([d.date() for d in recheck]))
        check.validate("daily", rows_of, periods, asset="daily.recheck")
        sums = _arrow_sums(warehouse.table("daily").read_arrow(keys=recheck,
                                                                columns=["day", "bytes", "packets"]), "day")
        view = [{**days[d], "table_bytes": sums.get(d, (0, 0))[0], "table_packets": sums.get(d, (0, 0))[1],
                 "parts_bytes": sum(h["bytes"] for h in hours if d <= h["period_start"] < period_end(d, "day"))}
                for d in recheck]
        check.validate("periods", _ledger_frame(view), periods, asset="periods.recheck-days")
        changed = _recheck(check, [days[d] for d in recheck], "day")
        for row in changed:
            days[row["period_start"]] = row
            failures.append(check.message("day", row["period_start"]))
    state = st.read_clock_state(warehouse)
    rollable = []
    for month in months:
        needed = days_of_month(month, state.first_hour or month)
        if not all(_published(days.get(d)) for d in needed):
            break
        rollable.append(month)
    month_rows = []
    if rollable:
        of_months = daily.where(F.trunc("day", "month").isin([m.date() for m in rollable]))
        month_rows = _roll_up_into(warehouse, check, "month", rollable, of_months, F.trunc("day", "month"), days,
                                   restated)
        failures += _judge(check, month_rows)
    daily.unpersist()
    check.record()
    st.write_ledger_rows(warehouse, _store(changed + month_rows), op="roll_up")
    return rollable, failures, check


def roll_up_day(warehouse: Warehouse, day: date, restated: str | None = None) -> None:
    """``daily`` for one closed day (checked like any roll-up; kept for restatements)."""
    roll_up_days(warehouse, [day], restated=restated)


def roll_up_month(warehouse: Warehouse, month: datetime, restated: str | None = None) -> None:
    """``monthly`` for one closed month (checked like any roll-up; kept for restatements)."""
    roll_up_months(warehouse, [month], restated=restated)


def _sources_between(warehouse: Warehouse, start: datetime, end: datetime) -> int:
    panes = warehouse.table("source_panes").read_arrow(
        key_min=start, key_max=end, columns=["source"])
    return len(set(panes.column("source").to_pylist()))


#: Tables kept forever and keyed finer than a month: their frozen days (``daily``: months) are merged.
MERGED = ("hourly", "panes", "daily")
#: Tables a close compacts and checkpoints (``monthly``, ``bills`` and ``alerts`` take few commits a month).
MAINTAINED = ("packets", "hourly", "panes", "source_panes", "periods", "batches", "clocks", "rejects", "late_packets",
              "daily", "dq_results")
#: How often a close deletes the files no table needs any more. Wall-clock time, as their retention
#: (a day after a commit removed them) is: files on disk are the live ones plus at most ~30 hours of
#: removed ones, whatever the history.
VACUUM_EVERY = timedelta(hours=6)


def maintain(warehouse: Warehouse, merge_before: datetime | None = None) -> None:
    """Keep every table's files and log bounded: merge the files of frozen days (months) of the tables
    kept forever, compact small files, checkpoint after either or after a long run of commits (opening
    a table costs more with each file and with each commit since its checkpoint), and every
    ``VACUUM_EVERY`` delete the files no longer needed and bring older tables to today's settings."""
    vacuum = _vacuum_due(warehouse)
    for name in MAINTAINED + (("monthly", "bills", "alerts") if vacuum else ()):
        table = warehouse.table(name)
        changed = table.configure() if vacuum else False
        merged = table.merge(merge_before) if merge_before is not None and name in MERGED else 0
        if table.compact() or merged or changed or table.checkpoint_due():
            table.checkpoint()
        if vacuum:
            table.vacuum()
    if vacuum:
        _vacuumed(warehouse)


def _vacuum_stamp(warehouse: Warehouse):
    return warehouse.state_dir() / "vacuumed"


def _vacuum_due(warehouse: Warehouse) -> bool:
    """Whether ``VACUUM_EVERY`` has passed since the last vacuum (a new warehouse starts counting now)."""
    stamp = _vacuum_stamp(warehouse)
    if not stamp.exists():
        _vacuumed(warehouse)
        return False
    return time.time() - stamp.stat().st_mtime >= VACUUM_EVERY.total_seconds()


def _vacuumed(warehouse: Warehouse) -> None:
    _vacuum_stamp(warehouse).touch()


# -- restatements (replay --restate): the ledger, roll-ups and bills over a replaced range ----------


def rewrite_restated_periods(warehouse: Warehouse, plan: dict, progress=print) -> None:
    """After a restatement batch: new ledger rows for its hours, then its rolled-up days and months again.

    Recomputed from the tables each time, so a crash here is repaired by running it again.
    """
    reason = plan["restate"]
    start, end = (datetime.fromisoformat(t) for t in plan["range"])
    hours = hours_between(start, end)
    # Frozen again from the new raw detail: recomputed, checked and given ledger rows as any frozen
    # hour is, so a restatement that breaks a rule is failed, not published unchecked.
    failed = freeze_hours(warehouse, hours, restated=reason)
    for message in failed.values():
        progress(f"restated hour failed its checks: {message}")
    days = {r["period_start"] for r in st.read_ledger(warehouse, "day")}
    redo_days = [day for day in days_between(start.replace(hour=0), end) if day in days]
    for day in redo_days:
        roll_up_day(warehouse, day.date(), restated=reason)
    months = {r["period_start"] for r in st.read_ledger(warehouse, "month")}
    month = month_start(start)
    while month < end:
        if month in months:
            roll_up_month(warehouse, month, restated=reason)
        month = next_month(month)
    restore_bills(warehouse, start, end)
    progress(f"restated {len(hours)} hour(s), {len(redo_days)} day(s): {reason}")


def restore_bills(warehouse: Warehouse, start: datetime, end: datetime) -> list[str]:
    """Bills already stored for billing periods overlapping a restated range are recomputed from its new panes."""

    cycle = billing_cycle(warehouse.settings)
    period, overlapping = cycle.period_containing(start), []
    while period.start_utc < end:
        if stored_bills(warehouse, period):
            overlapping.append(period)
        period = cycle.period_containing(period.end_utc)
    if not overlapping:
        return []
    stored, _, _ = store_bills(warehouse, overlapping, lambda periods: _validation(warehouse, "bills", periods))
    return stored
