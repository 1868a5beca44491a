"""Restatements (``replay --restate``): after a batch replaced a range's raw detail, its hours are frozen
again and given new ledger rows, its rolled-up days and months rolled up again, its stored bills recomputed.

Recomputed from the tables each time, so a crash here is repaired by running it again.
"""

from __future__ import annotations

from datetime import datetime

from traffic.accounting.bills import billing_cycle, store_bills, stored_bills
from traffic.accounting.close.freeze import freeze_hours
from traffic.accounting.close.rollup import roll_up_day, roll_up_month
from traffic.core.periods import days_between, hours_between, month_start, next_month
from traffic.core.settings import Settings
from traffic.quality.suites import Validation
from traffic.storage import state as st
from traffic.storage.warehouse import Warehouse


def rewrite_restated_periods(warehouse: Warehouse, plan: dict, progress=print) -> None:
    """After a restatement batch: new ledger rows for its hours, then its rolled-up days and months again.

    The settings are the warehouse's: the replay that calls this hands over only its warehouse.
    """
    settings = warehouse.settings
    reason = plan["restate"]
    start, end = (datetime.fromisoformat(t) for t in plan["range"])
    hours = hours_between(start, end)
    # Frozen again from the new raw detail: recomputed, checked and given ledger rows as any frozen
    # hour is, so a restatement that breaks a rule is failed, not published unchecked.
    frozen = freeze_hours(settings, warehouse, hours, restated=reason)
    for message in frozen.failed.values():
        progress(f"restated hour failed its checks: {message}")
    days = {r["period_start"] for r in st.read_ledger(warehouse, "day")}
    redo_days = [day for day in days_between(start.replace(hour=0), end) if day in days]
    for day in redo_days:
        roll_up_day(settings, warehouse, day.date(), restated=reason)
    months = {r["period_start"] for r in st.read_ledger(warehouse, "month")}
    month = month_start(start)
    while month < end:
        if month in months:
            roll_up_month(warehouse, month, restated=reason)
        month = next_month(month)
    restore_bills(settings, warehouse, start, end)
    progress(f"restated {len(hours)} hour(s), {len(redo_days)} day(s): {reason}")


def restore_bills(settings: Settings, warehouse: Warehouse, start: datetime, end: datetime) -> list[str]:
    """Bills already stored for billing periods overlapping a restated range are recomputed from its new panes."""
    cycle = billing_cycle(settings)
    period, overlapping = cycle.period_containing(start), []
    while period.start_utc < end:
        if stored_bills(warehouse, period):
            overlapping.append(period)
        period = cycle.period_containing(period.end_utc)
    if not overlapping:
        return []
    stored, _, _ = store_bills(warehouse, overlapping,
                               lambda periods: Validation(warehouse, "bills", list(periods), []))
    return stored
