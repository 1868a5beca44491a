"""Close: freeze closed hours, roll up closed days and months, expire raw detail (DESIGN §3–§5).

What to do is decided on the driver from the small state tables, so a close with nothing
to do never starts Spark. Each step recomputes its output from its inputs and replaces
exactly its partitions before writing the ledger row that marks it done, so a close
killed anywhere and run again ends as an uninterrupted one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

from traffic import inbox as inbox_mod
from traffic import state as st
from traffic.clock import DAY, HOUR, PANE, closed_hours, day_start, hour_floor, month_start, next_month
from traffic.delta import Warehouse, cluster_key
from traffic.ingest import finish_pending
from traffic.settings import Settings, SettingsError

UTC = timezone.utc
PUBLISHED = ("passed", "warning", "accepted")


class CheckFailed(RuntimeError):
    """A period failed a critical check: it is recorded as failed and nothing is rolled up over it."""


@dataclass
class ClosePlan:
    """What a close run will do; empty means no Spark is needed."""

    hours: list[datetime] = field(default_factory=list)
    days: list[date] = field(default_factory=list)
    months: list[datetime] = field(default_factory=list)
    expire_packets: list[str] = field(default_factory=list)
    expire_other: dict[str, list[str]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.hours or self.days or self.months or self.expire_packets
                    or any(self.expire_other.values()))


@dataclass
class CloseResult:
    hours_frozen: list[datetime] = field(default_factory=list)
    days_rolled: list[date] = field(default_factory=list)
    months_rolled: list[datetime] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    expired_hours: int = 0
    watermark: datetime | None = None
    seconds: dict = field(default_factory=dict)


def plan_close(settings: Settings, warehouse: Warehouse, until: datetime | None = None) -> ClosePlan:
    """Decide, without Spark, which hours to freeze, days/months to roll up and partitions to expire."""
    state = st.read_clock_state(warehouse)
    plan = ClosePlan()
    if state.watermark is None or state.first_hour is None:
        return plan
    ledger = st.read_ledger(warehouse)
    hours_done = {r["period_start"]: r for r in ledger if r["grain"] == "hour"}
    frontier = max(hours_done) + HOUR if hours_done else None
    plan.hours = closed_hours(state.first_hour, frontier, state.watermark, until)
    frozen_end = (plan.hours[-1] + HOUR) if plan.hours else (frontier or state.first_hour)
    published = {h for h, r in hours_done.items() if r["dq_status"] in PUBLISHED}
    days_done = {r["period_start"] for r in ledger if r["grain"] == "day"}
    months_done = {r["period_start"] for r in ledger if r["grain"] == "month"}
    limit = state.watermark if until is None else min(state.watermark, until)
    day = state.first_hour.replace(hour=0)
    while day + DAY <= limit and day + DAY <= frozen_end:
        if day not in days_done:
            first = max(day, state.first_hour)
            hours = [first + HOUR * i for i in range(int((day + DAY - first) / HOUR))]
            # Hours frozen by this run count as published unless their checks fail (then the roll-up stops).
            if not all(h in published or h in plan.hours for h in hours):
                break
            plan.days.append(day.date())
        day += DAY
    rolled_days = {d for d in days_done} | {day_start(d) for d in plan.days}
    month = month_start(state.first_hour)
    while next_month(month) <= limit:
        last_day = next_month(month) - DAY
        if month not in months_done:
            if last_day not in rolled_days:
                break
            plan.months.append(month)
        month = next_month(month)
    # Expiry (DESIGN §5): raw detail of frozen hours older than hour_floor(W) - keep_hours.
    cutoff = min(hour_floor(state.watermark) - timedelta(hours=settings.keep_hours), frozen_end)
    packet_keys = warehouse.table("packets").keys()
    plan.expire_packets = [k for k in packet_keys if k < cluster_key(cutoff, "hour")]
    floor_w = hour_floor(state.watermark)
    for table, retention in (("late_packets", settings.late_retention), ("rejects", settings.reject_retention),
                             ("source_panes", settings.dq_retention)):
        bound = cluster_key(floor_w - retention, "hour")
        plan.expire_other[table] = [k for k in warehouse.table(table).keys() if k < bound]
    dq_bound = cluster_key(month_start(floor_w - settings.dq_retention), "month")
    plan.expire_other["dq_results"] = [k for k in warehouse.table("dq_results").keys() if k < dq_bound]
    return plan


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
        plan.days = [d for d in plan.days if day_start(d) + DAY <= first_unfrozen]
        plan.months = [m for m in plan.months if next_month(m) <= first_unfrozen]
    return ClosePlan(
        hours=plan.hours if "freeze" in only else [],
        days=plan.days if "days" in only else [],
        months=plan.months if "months" in only else [],
        expire_packets=plan.expire_packets if "expire" in only else [],
        expire_other=plan.expire_other if "expire" in only else {},
    )


def close(settings: Settings, spark_factory: Callable[[], object], until: datetime | None = None,
          progress=print, only: tuple[str, ...] | None = None) -> CloseResult:
    """Freeze, roll up and expire everything the watermark allows (up to ``until``). Holds the lock.

    ``only`` limits the run to some of ``STEPS``; days and months are still only rolled up
    once all their hours are frozen and published, so running steps separately is safe.
    """
    warehouse = Warehouse(settings)
    with inbox_mod.warehouse_lock(warehouse.state_dir(), settings.lock_timeout.total_seconds(), "traffic close"):
        warehouse.create_all()
        finish_pending(settings, warehouse, spark_factory, progress)
        return close_locked(settings, warehouse, spark_factory, until, progress, only)


def close_locked(settings: Settings, warehouse: Warehouse, spark_factory, until: datetime | None,
                 progress=print, only: tuple[str, ...] | None = None) -> CloseResult:
    """The body of ``close`` for a caller that already holds the warehouse lock (replay)."""
    plan = restrict(plan_close(settings, warehouse, until), only)
    result = CloseResult(watermark=st.read_clock_state(warehouse).watermark)
    if plan.empty:
        return result
    execute_close(Warehouse(settings, spark=spark_factory()), plan, result, progress)
    return result


def execute_close(warehouse: Warehouse, plan: ClosePlan, result: CloseResult, progress=print) -> None:
    """Run a close plan with Spark: freeze → roll up days → months → expire → maintenance."""
    clock = time.perf_counter()
    if plan.hours:
        progress(f"freezing {len(plan.hours)} hour(s) {plan.hours[0]:%Y-%m-%d %H:00} … {plan.hours[-1]:%Y-%m-%d %H:00}")
        failed = freeze_hours(warehouse, plan.hours)
        result.hours_frozen = plan.hours
        result.failed += [f"hour {h:%Y-%m-%dT%H:00Z}: {why}" for h, why in failed.items()]
        if failed:
            first_bad = min(failed)
            plan.days = [d for d in plan.days if day_start(d) + DAY <= first_bad.replace(hour=0)]
            plan.months = [m for m in plan.months if next_month(m) <= first_bad.replace(hour=0)]
    result.seconds["freeze"] = time.perf_counter() - clock
    clock = time.perf_counter()
    for day in plan.days:
        roll_up_day(warehouse, day)
        result.days_rolled.append(day)
    if plan.days:
        progress(f"rolled up {len(plan.days)} day(s): {', '.join(d.isoformat() for d in plan.days)}")
    for month in plan.months:
        roll_up_month(warehouse, month)
        result.months_rolled.append(month)
    if plan.months:
        progress(f"rolled up month(s): {', '.join(f'{m:%Y-%m}' for m in plan.months)}")
    result.seconds["roll_up"] = time.perf_counter() - clock
    clock = time.perf_counter()
    if plan.expire_packets:
        warehouse.table("packets").delete_keys(plan.expire_packets, op="expire")
        result.expired_hours = len(plan.expire_packets)
        progress(f"expired raw detail of {len(plan.expire_packets)} hour(s)")
    for table, keys in plan.expire_other.items():
        if keys:
            warehouse.table(table).delete_keys(keys, op="expire")
    maintain(warehouse)
    result.seconds["expire_maintain"] = time.perf_counter() - clock


def freeze_hours(warehouse: Warehouse, hours: list[datetime]) -> dict[datetime, str]:
    """Write final rows and ledger rows for ``hours`` in one pass; returns failed hours and why."""
    from pyspark.sql import functions as F

    from traffic import transforms as T

    keys = [cluster_key(h, "hour") for h in hours]
    final = T.hourly_totals(warehouse.table("packets").read(keys=keys), "final")
    open_rows = warehouse.table("hourly").read(keys=keys)
    final = final.persist()
    # Built-in check: the open rows the micro-batches maintained equal the totals recomputed from raw detail.
    cols = ["hour", "local_ip", "remote_ip", *T.AMOUNTS]
    mismatched = final.select(*cols).exceptAll(open_rows.select(*cols)).union(
        open_rows.select(*cols).exceptAll(final.select(*cols))).select("hour").distinct().collect()
    mismatch_hours = {r["hour"].replace(tzinfo=UTC) if r["hour"].tzinfo is None else r["hour"] for r in mismatched}
    totals = {(r["hour"].replace(tzinfo=UTC) if r["hour"].tzinfo is None else r["hour"]): r for r in
              final.groupBy("hour").agg(F.sum("bytes").alias("bytes"), F.sum("packets").alias("packets")).collect()}
    warehouse.table("hourly").replace(final, keys=keys, op="freeze")
    final.unpersist()

    late = warehouse.table("late_packets").read_arrow(keys=keys, columns=["hour", "bytes"])
    late_totals: dict[datetime, list[int]] = {}
    for hour, size in zip(late.column("hour").to_pylist(), late.column("bytes").to_pylist()):
        entry = late_totals.setdefault(hour.astimezone(UTC), [0, 0])
        entry[0] += size
        entry[1] += 1
    completeness = _completeness(warehouse, hours)
    history = st.watermark_history(warehouse)
    failed: dict[datetime, str] = {}
    rows = []
    for hour in hours:
        total = totals.get(hour)
        status, note = "passed", None
        if hour in mismatch_hours:
            status, note = "failed", "open rows differ from totals recomputed from packets"
            failed[hour] = note
        late_bytes, late_packets = late_totals.get(hour, (0, 0))
        reporting, expected, active = completeness[hour]
        rows.append({
            "grain": "hour", "period_start": hour,
            "bytes": int(total["bytes"]) if total else 0, "packets": int(total["packets"]) if total else 0,
            "late_bytes": late_bytes, "late_packets": late_packets,
            "sources_reporting": reporting, "sources_expected": expected, "panes_active": active,
            "closed_at_watermark": st.closed_at(history, hour + HOUR),
            "dq_status": status, "restated": None, "dq_note": note,
        })
    st.write_ledger_rows(warehouse, rows, op="freeze")
    return failed


def _completeness(warehouse: Warehouse, hours: list[datetime]) -> dict[datetime, tuple[int, int, int]]:
    """(sources_reporting, sources_expected, panes_active) per hour, from ``source_panes``."""
    settings = warehouse.settings
    lo = cluster_key(hours[0] + HOUR - DAY, "hour")
    hi = cluster_key(hours[-1] + HOUR, "hour")
    panes = st.rows(warehouse.table("source_panes").read_arrow(key_min=lo, key_max=hi,
                                                               columns=["source", "pane_start"]))
    by_pane: dict[datetime, set[str]] = {}
    for p in panes:
        by_pane.setdefault(p["pane_start"], set()).add(p["source"])
    result = {}
    for hour in hours:
        reporting = set().union(*[by_pane.get(hour + PANE * i, set()) for i in range(12)])
        if settings.expected_sources:
            expected = set(settings.expected_sources)
        else:
            expected = set().union(*[s for pane, s in by_pane.items() if hour + HOUR - DAY <= pane < hour + HOUR])
        active = sum(1 for i in range(12) if expected <= by_pane.get(hour + PANE * i, set()))
        result[hour] = (len(reporting), len(expected), active)
    return result


def _children_summary(ledger_rows: list[dict]) -> dict:
    return {
        "late_bytes": sum(r["late_bytes"] for r in ledger_rows),
        "late_packets": sum(r["late_packets"] for r in ledger_rows),
        "sources_expected": max((r["sources_expected"] for r in ledger_rows), default=0),
        "panes_active": sum(r["panes_active"] for r in ledger_rows),
    }


def roll_up_day(warehouse: Warehouse, day: date, restated: str | None = None) -> None:
    """``daily`` for one closed day from its final hourly rows, then its ledger row."""
    from pyspark.sql import functions as F

    from traffic import transforms as T

    start = day_start(day)
    hourly = warehouse.table("hourly").read(key_min=cluster_key(start, "hour"), key_max=cluster_key(start + DAY, "hour"))
    daily = T.roll_up(hourly.where(F.col("status") == "final"), "day", F.to_date("hour")) \
        .withColumn("month", F.trunc("day", "month"))
    warehouse.table("daily").replace(daily, keys=[cluster_key(start, "day")], op="roll_up")
    stored = warehouse.table("daily").read_arrow(keys=[cluster_key(start, "day")], columns=["bytes", "packets"])
    hours = [r for r in st.read_ledger(warehouse, "hour", keys=[cluster_key(start, "month")])
             if start <= r["period_start"] < start + DAY]
    st.write_ledger_rows(warehouse, [{
        "grain": "day", "period_start": start,
        "bytes": int(pc.sum(stored.column("bytes")).as_py() or 0),
        "packets": int(pc.sum(stored.column("packets")).as_py() or 0),
        **_children_summary(hours),
        "sources_reporting": _sources_between(warehouse, max(start, min(r["period_start"] for r in hours)), start + DAY),
        "closed_at_watermark": st.closed_at(st.watermark_history(warehouse), start + DAY),
        "dq_status": "passed", "restated": restated, "dq_note": None,
    }], op="roll_up")


def roll_up_month(warehouse: Warehouse, month: datetime, restated: str | None = None) -> None:
    """``monthly`` for one closed month from its ``daily`` rows, then its ledger row."""
    from pyspark.sql import functions as F

    from traffic import transforms as T

    end = next_month(month)
    daily = warehouse.table("daily").read(key_min=cluster_key(month, "day"), key_max=cluster_key(end, "day"))
    monthly = T.roll_up(daily, "month", F.trunc("day", "month"))
    key = cluster_key(month, "month")
    warehouse.table("monthly").replace(monthly, keys=[key], op="roll_up")
    stored = warehouse.table("monthly").read_arrow(keys=[key], columns=["bytes", "packets"])
    days = st.read_ledger(warehouse, "day", keys=[key])
    st.write_ledger_rows(warehouse, [{
        "grain": "month", "period_start": month,
        "bytes": int(pc.sum(stored.column("bytes")).as_py() or 0),
        "packets": int(pc.sum(stored.column("packets")).as_py() or 0),
        **_children_summary(days),
        "sources_reporting": _sources_between(warehouse, max(month, min(r["period_start"] for r in days)), end),
        "closed_at_watermark": st.closed_at(st.watermark_history(warehouse), end),
        "dq_status": "passed", "restated": restated, "dq_note": None,
    }], op="roll_up")


def _sources_between(warehouse: Warehouse, start: datetime, end: datetime) -> int:
    panes = warehouse.table("source_panes").read_arrow(
        key_min=cluster_key(start, "hour"), key_max=cluster_key(end, "hour"), columns=["source"])
    return len(set(panes.column("source").to_pylist()))


def maintain(warehouse: Warehouse) -> None:
    """Keep every table's file and log counts bounded: compact small files, checkpoint."""
    for name in ("packets", "hourly", "source_panes", "periods", "batches", "clocks", "rejects", "late_packets",
                 "daily", "dq_results"):
        table = warehouse.table(name)
        if table.compact():
            table.checkpoint()
