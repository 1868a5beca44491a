"""Cheap questions a scheduler asks before it starts Spark (Arrow and the filesystem only, no JVM).

Airflow's sensors and short-circuits call these: has the watermark passed this interval's
end? Is this hour already final? Is there anything new in the inbox? Each answers in well
under a second, so a run with nothing to do finishes in seconds.

Whether a step of the hourly close is due (freeze, a day, a month) is not asked here: a check
made before the warehouse lock is held can be stale when the step runs (another run of a
backfill got there first), so the close decides under the lock with the close's own planner
(``traffic.orchestration.dag_support.decide_close``).
"""

from __future__ import annotations

from datetime import datetime, timezone

from traffic.storage import state as st
from traffic.core.periods import closed_hours, starts
from traffic.storage.warehouse import Warehouse
from traffic.core.settings import Settings
from traffic.storage.journal import pending_batch

UTC = timezone.utc


def warehouse_if_any(settings: Settings) -> Warehouse | None:
    warehouse = Warehouse.reader(settings)
    return warehouse if warehouse.exists() else None


def watermark(settings: Settings) -> datetime | None:
    """The current watermark ``W`` (None before any data)."""
    warehouse = warehouse_if_any(settings)
    return st.read_clock_state(warehouse).watermark if warehouse else None


def watermark_reached(current: datetime | None, interval_end: datetime) -> bool:
    """The watermark's rule: ``W >= interval_end`` (every hour ending by then is closed); no watermark, no."""
    return current is not None and current >= interval_end


def watermark_passed(settings: Settings, interval_end: datetime) -> bool:
    """True once the current watermark has reached ``interval_end`` (``watermark_reached``)."""
    return watermark_reached(watermark(settings), interval_end)


def hours_final_until(settings: Settings, interval_end: datetime) -> bool:
    """True when every hour from the first hour up to ``interval_end`` is frozen (nothing left to freeze).

    Also true when ``interval_end`` is before the first hour (periods before it are not produced).
    """
    warehouse = warehouse_if_any(settings)
    if warehouse is None:
        return False
    state = st.read_clock_state(warehouse)
    if state.first_hour is None:
        return False
    if interval_end <= state.first_hour:
        return True
    frozen = starts(st.read_ledger(warehouse, "hour"), "hour")
    return all(hour in frozen for hour in closed_hours(state.first_hour, None, interval_end))


def inbox_has_new_files(settings: Settings) -> bool:
    """True when the inbox holds a file no batch has handled (or a batch is waiting to be finished)."""
    from traffic.io import inbox as inbox_mod  # deferred: the inbox's readers import pandas, which no close check needs

    warehouse = warehouse_if_any(settings)
    if warehouse is not None and pending_batch(warehouse.root) is not None:
        return True
    found = inbox_mod.scan(settings.inbox, settings.min_file_age.total_seconds())
    if warehouse is None:
        return bool(found)
    return bool(inbox_mod.unhandled(found, st.known_files(warehouse)))
