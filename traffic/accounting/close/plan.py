"""The close's plan: which steps are due (hours to freeze, days and months to roll up, bills to store,
partitions to expire), decided on the driver from the small state tables, without Spark.

``plan_close`` is the one answer to "which steps are due", for ``traffic close`` and for the hourly
DAG's ``decide_close`` alike; ``restrict`` keeps the steps a caller runs (``--only``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime

from traffic.accounting.bills import due_periods
from traffic.core.periods import (PUBLISHED, closed_hours, day_start, days_due, expiry_cutoff, is_published,
                                  month_start, months_due, next_month, period_end, retention_floor, starts)
from traffic.core.settings import Settings, SettingsError
from traffic.storage import state as st
from traffic.storage.keys import cluster_key
from traffic.storage.warehouse import Warehouse


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
    plan.expire_other.update(per_address_expiry(settings, warehouse, state.watermark, ledger))
    # Bills of billing periods whose hours are all frozen (by now or by this run) and published.
    plan.bills = due_periods(warehouse, state.first_hour, frozen_end, published | freezing)
    return plan


#: Per-address tables with a retention setting (DESIGN §5; default: kept), each with the coarser grain its
#: rows must be summed into, and published, before they may go.
PER_ADDRESS_RETENTION = {"hourly": ("hourly_retention", "day"), "daily": ("daily_retention", "month")}
_KEY_WIDTH = {"day": 10, "month": 7}


def per_address_expiry(settings: Settings, warehouse: Warehouse, watermark: datetime,
                       ledger: list[dict]) -> dict[str, list[str]]:
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
        retention = getattr(settings, setting)
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
