"""The event-time clock: source clocks, liveness, the watermark and what it closes (DESIGN §2–§4).

Pure functions over plain values; no Spark, no storage.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta, timezone
from typing import Mapping

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
PANE = timedelta(minutes=5)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def micros(value: datetime) -> int:
    """Microseconds since the epoch of an aware time (how Arrow and numpy code compares times)."""
    return (value - EPOCH) // timedelta(microseconds=1)


def from_micros(value: int) -> datetime:
    """The aware UTC time ``value`` microseconds after the epoch."""
    return EPOCH + timedelta(microseconds=int(value))


def hour_floor(ts: datetime) -> datetime:
    return ts.replace(minute=0, second=0, microsecond=0)


def day_start(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=timezone.utc)


def month_start(ts: datetime | date) -> datetime:
    return datetime(ts.year, ts.month, 1, tzinfo=timezone.utc)


def next_month(start: datetime) -> datetime:
    return start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)


@dataclass(frozen=True)
class ClockState:
    """Clocks per source, the watermark ``W`` (None before any data) and the first hour."""

    clocks: Mapping[str, datetime] = field(default_factory=dict)
    last_batch: Mapping[str, int] = field(default_factory=dict)
    watermark: datetime | None = None
    first_hour: datetime | None = None

    def live_sources(self, source_timeout: timedelta) -> set[str]:
        """Sources whose clock is within ``source_timeout`` of the largest clock."""
        if not self.clocks:
            return set()
        newest = max(self.clocks.values())
        return {s for s, c in self.clocks.items() if c >= newest - source_timeout}


def advance(
    state: ClockState,
    batch_clocks: Mapping[str, datetime],
    batch_id: int,
    allowed_lateness: timedelta,
    source_timeout: timedelta,
    first_on_time_hour: datetime | None = None,
) -> ClockState:
    """The state after a batch whose accepted records reached ``batch_clocks`` per source."""
    clocks = dict(state.clocks)
    last_batch = dict(state.last_batch)
    for source, ts in batch_clocks.items():
        clocks[source] = max(ts, clocks.get(source, ts))
        last_batch[source] = batch_id
    first_hour = state.first_hour
    if first_on_time_hour is not None:
        first_hour = first_on_time_hour if first_hour is None else min(first_hour, first_on_time_hour)
    advanced = replace(state, clocks=clocks, last_batch=last_batch, first_hour=first_hour)
    live = advanced.live_sources(source_timeout)
    if not live:
        return advanced
    candidate = min(clocks[s] for s in live) - allowed_lateness
    watermark = candidate if state.watermark is None else max(state.watermark, candidate)
    return replace(advanced, watermark=watermark)


def is_closed(hour: datetime, watermark: datetime | None) -> bool:
    """Hour ``hour`` is closed once ``hour + 1h <= W``."""
    return watermark is not None and hour + HOUR <= watermark


def closed_hours(first_hour: datetime | None, frontier: datetime | None, watermark: datetime | None,
                 until: datetime | None = None) -> list[datetime]:
    """Hours to freeze next, in order: from the frontier (or first hour) while closed (and ``< until``)."""
    if first_hour is None or watermark is None:
        return []
    start = frontier or first_hour
    limit = watermark if until is None else min(watermark, until)
    hours = []
    hour = start
    while hour + HOUR <= limit:
        hours.append(hour)
        hour += HOUR
    return hours
