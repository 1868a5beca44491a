"""Every time rule of the contract (DESIGN §2–§5), one pure function each, named after the rule.

Hours, days and months are UTC calendar periods ``[start, end)``. Nothing here reads the
warehouse: callers pass what the ledger and the clocks say, so ingest, close, replay, bills, the
DAG helpers and the scheduler's short-circuit checks decide the same way, and each rule has its
unit tests (``tests/unit/test_periods.py``).
"""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from typing import Collection, Iterable

import numpy as np

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
#: The 5-minute pane every rate, percentile and mapping change is measured on (§7), and its length in the
#: units Arrow, numpy and Spark code counts in.
PANE = timedelta(minutes=5)
PANE_SECONDS = PANE // timedelta(seconds=1)
PANE_US = PANE // timedelta(microseconds=1)
HOUR_US = HOUR // timedelta(microseconds=1)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

#: ``dq_status`` values that publish a period (§6): a ``failed`` period is not published and blocks roll-ups.
PUBLISHED = ("passed", "warning", "accepted")


# -- calendar (§2: periods are UTC [start, end)) ---------------------------------------------------

def as_utc(ts: datetime) -> datetime:
    """A time as aware UTC: a naive one is UTC (as everywhere in this project: Spark's ``collect()`` runs in a
    UTC process), an aware one is converted."""
    return ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts.astimezone(timezone.utc)


def on_pane_boundary(ts: datetime) -> bool:
    """Whether ``ts`` starts a UTC 5-minute pane (a naive time is UTC)."""
    return (as_utc(ts) - EPOCH) % PANE == timedelta(0)


def micros(value: datetime) -> int:
    """Microseconds since the epoch of an aware time (how Arrow and numpy code compares times)."""
    return (value - EPOCH) // timedelta(microseconds=1)


def from_micros(value: int) -> datetime:
    """The aware UTC time ``value`` microseconds after the epoch."""
    return EPOCH + timedelta(microseconds=int(value))


def hour_floor(ts: datetime) -> datetime:
    """The start of the hour ``ts`` is in."""
    return ts.replace(minute=0, second=0, microsecond=0)


def day_start(day: date) -> datetime:
    """The start of a UTC day."""
    return datetime(day.year, day.month, day.day, tzinfo=timezone.utc)


def month_start(ts: datetime | date) -> datetime:
    """The start of the UTC month ``ts`` is in."""
    return datetime(ts.year, ts.month, 1, tzinfo=timezone.utc)


def next_month(start: datetime) -> datetime:
    """The start of the month after the one starting at ``start``."""
    return start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)


def period_end(start: datetime, grain: str) -> datetime:
    """The end of the hour, day or month starting at ``start`` (periods are ``[start, end)``)."""
    return next_month(start) if grain == "month" else start + (DAY if grain == "day" else HOUR)


def hour_ceil(ts: datetime) -> datetime:
    """The first hour start at or after ``ts``."""
    floor = hour_floor(ts)
    return floor if floor == ts else floor + HOUR


def panes_of(hour: datetime) -> list[datetime]:
    """The twelve 5-minute panes of an hour."""
    return [hour + PANE * i for i in range(12)]


def expected_sources_window(hour: datetime) -> tuple[datetime, datetime]:
    """Where an hour's expected sources come from when none are configured (§6): the 24 hours ending at
    its end."""
    end = period_end(hour, "hour")
    return end - DAY, end


def hours_between(start: datetime, end: datetime) -> list[datetime]:
    """The hours that start in ``[start, end)``, in order (``start`` on the hour)."""
    return [start + HOUR * i for i in range(max(0, -(-(end - start) // HOUR)))]


def days_between(start: datetime, end: datetime) -> list[datetime]:
    """The days that start in ``[start, end)``, in order (``start`` at midnight)."""
    return [start + DAY * i for i in range(max(0, -(-(end - start) // DAY)))]


# -- §2 sanity bounds ----------------------------------------------------------------------------

def future_limit(now: datetime, max_future_skew: timedelta) -> datetime:
    """The latest time a record may have: ``max_future_skew`` ahead of the processing machine's clock."""
    return now + max_future_skew


def history_floor(newest: datetime | None, max_history: timedelta) -> datetime | None:
    """The oldest time a record may have in a batch whose newest record is ``newest``."""
    return newest - max_history if newest is not None else None


# -- §3 freeze after the hour --------------------------------------------------------------------

def is_closed(hour: datetime, watermark: datetime | None) -> bool:
    """Hour ``hour`` is closed once ``hour + 1h <= W``."""
    return watermark is not None and hour + HOUR <= watermark


def is_late(ts: datetime, watermark_before: datetime | None) -> bool:
    """A record is late when its hour was closed by the watermark from before its batch."""
    return is_closed(hour_floor(ts), watermark_before)


def late_mask(ts_us: np.ndarray, watermark_before: datetime | None) -> np.ndarray:
    """``is_late`` over an array of epoch microseconds (what parse tasks judge a chunk with)."""
    if watermark_before is None:
        return np.zeros(len(ts_us), dtype=bool)
    return ts_us // HOUR_US * HOUR_US + HOUR_US <= micros(watermark_before)


def apportion_to_panes(start_us: np.ndarray, end_us: np.ndarray, amounts: list[np.ndarray]
                       ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """A flow's share of each 5-minute pane it overlaps (§7a), for many flows at once.

    Flow ``i`` lasts ``[start_us[i], end_us[i]]``; each of its ``amounts`` (bytes, packets, ...) is
    split over the panes the span overlaps in proportion to the overlap, in whole units by the
    largest remainder (ties: the earlier pane), so the shares of a flow add up exactly to it. A
    flow that lasts no time, or lies inside one pane, is one share. Returns, per share, the index
    of its flow, its time (the later of the flow's start and the pane's start: inside the pane)
    and its amounts; shares of a flow are in time order, and flows in their given order.

    A flow gets one share per pane it spans, so the caller bounds the spans (§7a: telemetry rejects
    a flow longer than ``max_flow_duration`` before calling this; a record ending in 2106 would be
    8.3 M shares). Amounts must fit 63 bits (telemetry checks value × rate); a share's product past
    64 bits is computed exactly, never wrapped.
    """
    start_us, end_us = np.asarray(start_us, np.int64), np.asarray(end_us, np.int64)
    duration = end_us - start_us
    first = start_us // PANE_US
    # The pane of the flow's last instant: an end exactly on a pane boundary does not reach into the next.
    last = np.where(duration > 0, (end_us - 1) // PANE_US, first)
    count = last - first + 1
    if (count == 1).all():  # every flow inside one pane (or lasting no time): one share each, at its start
        return np.arange(len(start_us)), start_us, [np.asarray(amount, np.int64) for amount in amounts]
    flow = np.repeat(np.arange(len(start_us)), count)
    offset = np.arange(len(flow)) - np.repeat(np.cumsum(count) - count, count)
    pane = (first[flow] + offset) * PANE_US
    ts = np.maximum(start_us[flow], pane)
    single = count[flow] == 1
    overlap = np.where(single, 1, np.minimum(end_us[flow], pane + PANE_US) - ts)
    span = np.where(single, 1, duration[flow])
    shares = [_largest_remainder(np.asarray(amount, np.int64), flow, overlap, span, count) for amount in amounts]
    return flow, ts, shares


def _largest_remainder(amount: np.ndarray, flow: np.ndarray, overlap: np.ndarray, span: np.ndarray,
                       count: np.ndarray) -> np.ndarray:
    """``amount[flow] * overlap / span`` per share, in whole units adding up to each flow's amount."""
    total = amount[flow]
    if len(total) and (np.abs(total).max(initial=0) >= (1 << 62) // max(int(overlap.max(initial=1)), 1)):
        # Products past 64 bits (huge counts over long flows): exact Python integers, rarely needed.
        product = total.astype(object) * overlap.astype(object)
        floor = np.array([p // s for p, s in zip(product, span.astype(object))], dtype=object)
        remainder = np.array([p % s for p, s in zip(product, span.astype(object))], dtype=object)
        floor, remainder = floor.astype(np.int64), (remainder / span.astype(object)).astype(np.float64)
    else:
        product = total * overlap
        floor, remainder = product // span, (product % span) / span
    starts = np.cumsum(count) - count  # a flow's shares are contiguous
    left = amount - np.add.reduceat(floor, starts) if len(amount) else amount
    # Within each flow, the shares by falling remainder (ties: the earlier pane) get one unit each.
    order = np.lexsort((np.arange(len(flow)), -remainder, flow))
    rank = np.empty(len(flow), np.int64)
    rank[order] = np.arange(len(flow)) - np.repeat(starts, count)
    return floor + (rank < left[flow])


def closed_hours(first_hour: datetime | None, frontier: datetime | None, watermark: datetime | None,
                 until: datetime | None = None) -> list[datetime]:
    """Hours to freeze next, in order: from the freeze frontier (or the first hour) while closed (and ``< until``)."""
    if first_hour is None or watermark is None:
        return []
    limit = watermark if until is None else min(watermark, until)
    start = frontier or first_hour
    return hours_between(start, hour_floor(limit)) if limit >= start + HOUR else []


# -- §4 roll up only on day change ---------------------------------------------------------------

def hours_of_day(day: datetime, first_hour: datetime) -> list[datetime]:
    """The hours a day rolls up: all 24, or from the first hour on for the first day."""
    return hours_between(max(day, first_hour), day + DAY)


def days_of_month(month: datetime, first_hour: datetime) -> list[datetime]:
    """The days a month rolls up: all of them, or from the first hour's day on for the first month."""
    return days_between(max(month, first_hour.replace(hour=0)), next_month(month))


def days_due(first_hour: datetime | None, watermark: datetime | None, rolled: Collection[datetime],
             published: Collection[datetime], until: datetime | None = None,
             frozen_end: datetime | None = None) -> list[date]:
    """Closed days not rolled up yet, in order, stopping at the first whose hours are not all published.

    A day ``D`` is closed when ``D + 1 day <= W`` (and ``<= until``); it is rolled up once, and only
    when all its hours from the first hour on are frozen and published (``published``: hour
    starts). ``frozen_end``, when given, also bounds the days to those whose hours are all frozen.
    """
    if first_hour is None or watermark is None:
        return []
    limit = min(t for t in (watermark, until, frozen_end) if t is not None)
    due, day = [], first_hour.replace(hour=0)
    while day + DAY <= limit:
        if day not in rolled:
            if not all(h in published for h in hours_of_day(day, first_hour)):
                break
            due.append(day.date())
        day += DAY
    return due


def months_due(first_hour: datetime | None, watermark: datetime | None, rolled_days: Collection[datetime],
               rolled_months: Collection[datetime], unpublished_days: Collection[datetime] = (),
               until: datetime | None = None) -> list[datetime]:
    """Closed months not rolled up yet, in order: a month is rolled up when its last day is, on the
    day change that crosses the month boundary, and waits while any of its days is not published."""
    if first_hour is None or watermark is None:
        return []
    limit = watermark if until is None else min(watermark, until)
    due, month = [], month_start(first_hour)
    while next_month(month) <= limit:
        if month not in rolled_months:
            if next_month(month) - DAY not in rolled_days or \
                    any(month <= d < next_month(month) for d in unpublished_days):
                break
            due.append(month)
        month = next_month(month)
    return due


# -- §5 expire raw detail after N hours ----------------------------------------------------------

def expiry_cutoff(watermark: datetime, keep_hours: int, frozen_end: datetime) -> datetime:
    """Raw detail of hours before this is expired: ``hour_floor(W) - keep_hours``, never an unfrozen hour."""
    return min(hour_floor(watermark) - timedelta(hours=keep_hours), frozen_end)


def retention_floor(watermark: datetime, retention: timedelta) -> datetime:
    """Rows of ``late_packets``, ``rejects``, ``source_panes`` before this are expired (event time)."""
    return hour_floor(watermark) - retention


def restatement_past_retention(start: datetime, end: datetime, watermark: datetime | None,
                               hourly_retention: timedelta | None, daily_retention: timedelta | None) -> str | None:
    """Why restating ``[start, end)`` would roll a day (month) up again without rows retention expired, or None.

    A restatement rolls up again every day and month it touches, from ``hourly`` (``daily``): a day only
    partly restated whose other hours may be past ``hourly_retention``, or a month only partly restated
    whose other days may be past ``daily_retention``, would lose them. Whole days (months) are safe.
    """
    if watermark is None:
        return None
    day_of = lambda ts: day_start(ts.date())  # noqa: E731
    for retention, floor_of, name, grain in ((hourly_retention, day_of, "hourly_retention", "day"),
                                             (daily_retention, month_start, "daily_retention", "month")):
        if retention is None:
            continue
        first, last = floor_of(start), floor_of(end - timedelta(microseconds=1))
        whole = start == first and end == period_end(last, grain)
        if not whole and first < retention_floor(watermark, retention):
            return (f"the restatement covers part of the {grain} of {first:%Y-%m-%d}, some of whose rows "
                    f"{name} may have expired: restate whole {grain}s ({first:%Y-%m-%d} to "
                    f"{period_end(last, grain):%Y-%m-%d}), or restate before they expire")
    return None


def is_published(status: str | None) -> bool:
    """Whether a period with this ``dq_status`` is published (§6)."""
    return status in PUBLISHED


def starts(rows: Iterable[dict], grain: str, statuses: Collection[str] | None = None) -> set[datetime]:
    """The period starts of ledger rows of one grain (with one of ``statuses`` when given)."""
    return {r["period_start"] for r in rows if r["grain"] == grain and (statuses is None or r["dq_status"] in statuses)}
