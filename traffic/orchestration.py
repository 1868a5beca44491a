"""Cheap questions a scheduler asks before it starts Spark (Arrow and the filesystem only, no JVM).

Airflow's sensors and short-circuits call these: has the watermark passed this interval's
end? Is this hour already final? Is there anything new in the inbox? Each answers in well
under a second, so a run with nothing to do finishes in seconds.
"""

from __future__ import annotations

from datetime import datetime, timezone

from traffic import inbox as inbox_mod
from traffic import state as st
from traffic.clock import DAY, HOUR
from traffic.delta import Warehouse
from traffic.settings import Settings

UTC = timezone.utc


def _warehouse(settings: Settings) -> Warehouse | None:
    warehouse = Warehouse(settings, engine="rs")
    return warehouse if warehouse.exists() else None


def watermark(settings: Settings) -> datetime | None:
    """The current watermark ``W`` (None before any data)."""
    warehouse = _warehouse(settings)
    return st.read_clock_state(warehouse).watermark if warehouse else None


def watermark_passed(settings: Settings, interval_end: datetime) -> bool:
    """True once ``W >= interval_end``: every hour ending by then is closed."""
    current = watermark(settings)
    return current is not None and current >= interval_end


def hours_final_until(settings: Settings, interval_end: datetime) -> bool:
    """True when every hour from the first hour up to ``interval_end`` is frozen (nothing left to freeze).

    Also true when ``interval_end`` is before the first hour (periods before it are not produced).
    """
    warehouse = _warehouse(settings)
    if warehouse is None:
        return False
    state = st.read_clock_state(warehouse)
    if state.first_hour is None:
        return False
    if interval_end <= state.first_hour:
        return True
    hours = {r["period_start"] for r in st.read_ledger(warehouse, "hour")}
    hour = state.first_hour
    while hour + HOUR <= interval_end:
        if hour not in hours:
            return False
        hour += HOUR
    return True


def day_waiting(settings: Settings, interval_end: datetime) -> bool:
    """True when a closed day (ending by ``interval_end``) has not been rolled up yet (catch-up)."""
    warehouse = _warehouse(settings)
    if warehouse is None:
        return False
    state = st.read_clock_state(warehouse)
    if state.first_hour is None or state.watermark is None:
        return False
    days = {r["period_start"] for r in st.read_ledger(warehouse, "day")}
    day = state.first_hour.replace(hour=0)
    while day + DAY <= min(interval_end, state.watermark):
        if day not in days:
            return True
        day += DAY
    return False


def inbox_has_new_files(settings: Settings) -> bool:
    """True when the inbox holds a file no batch has handled (or a batch is waiting to be finished)."""
    warehouse = _warehouse(settings)
    if warehouse is not None and inbox_mod.Journal(warehouse.root / "_traffic").load() is not None:
        return True
    found = inbox_mod.scan(settings.inbox, settings.min_file_age.total_seconds())
    if warehouse is None:
        return bool(found)
    return bool(inbox_mod.unhandled(found, st.known_files(warehouse)))
