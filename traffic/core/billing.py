"""Bills: an account's volume and 95th-percentile rate over a billing period of 5-minute panes.

Pure functions over plain values; no Spark, no storage.

* A **billing period** runs from the cycle's start (day ``start_day`` at ``start_time``,
  wall clock in the IANA zone ``tz``) to the next one, ``[start, end)``; its label
  ``YYYY-MM`` is the month it starts in (start day 15: "2026-10" is Oct 15 → Nov 15).
  DST months are an hour shorter or longer (8,916 or 8,940 panes instead of 8,928). A
  wall-clock start that occurs twice is its first occurrence, one that does not occur
  (a DST gap) is read with the offset before the change (``zoneinfo``'s ``fold=0``).
  Panes are UTC-aligned, so a boundary off the 5-minute grid (a historical offset like
  -00:44:30, a ``start_time`` of 00:02) is an error, never a rounded guess; hour,
  half-hour (+05:30) and 45-minute (+05:45) offsets all land on the grid.
* The **95th percentile** of a direction: the account's bytes per pane (summed over
  sources), every pane of the period present (a pane without traffic is 0), sorted
  ascending, the value at rank ``ceil(0.95·N)`` (1-based), N = the period's panes. So
  the busiest ``N − rank`` panes (432 of a 30-day month: 36 hours) are free. The rate
  of a pane is ``bytes·8/300`` bits/s; bytes stay integers, the rate is a float for
  display (Python's int/int division: the nearest float to the exact rate).
* **Directions**: ``in`` and ``out`` are billed. ``internal`` (both ends local) and
  ``transit`` (neither end local) never cross the account's uplink: they count in
  ``bytes_total`` only. Unknown direction (null: the router feed) always counts in
  ``bytes_total``; ``unknown_direction`` decides how it enters the rate series:
  ``in`` (default) adds it to inbound, ``out`` to outbound, ``both`` to each (for rule
  ``max`` an upper bound whatever its true direction), ``ignore`` leaves it out. The
  default counts every unknown byte exactly once, so a feed with no directions bills
  the 95th percentile of its total traffic, which is never below the true
  ``max(p95 in, p95 out)``.
* The **billable rate** is ``max`` (the larger of the two percentiles) or ``sum``
  (their sum, not the percentile of the summed series). ``both`` with ``sum`` would
  count unknown traffic twice and is refused.
* ``bytes_in``/``bytes_out`` are the measured known directions, as in the ``hourly``
  table, so a bill reconciles with ``monthly``: ``bytes_total = bytes_in + bytes_out +
  bytes_internal + bytes_transit + bytes_unknown``.
"""

from __future__ import annotations

import operator
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, time, timezone
from typing import Iterable, Mapping
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from traffic.core.periods import PANE, PANE_SECONDS, as_utc, on_pane_boundary

RULES = ("max", "sum")
UNKNOWN_DIRECTIONS = ("in", "out", "both", "ignore")
DIRECTIONS = ("in", "out", "internal", "transit", None)

_LABEL = re.compile(r"^(\d{4})-(\d{2})$")


class BillingError(ValueError):
    """A billing request that cannot be answered exactly; the message says what to fix."""


@dataclass(frozen=True)
class BillingPeriod:
    """One billing period ``[start_utc, end_utc)``, labelled by the month it starts in."""

    label: str
    start_utc: datetime
    end_utc: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "start_utc", as_utc(self.start_utc))
        object.__setattr__(self, "end_utc", as_utc(self.end_utc))
        for name in ("start_utc", "end_utc"):
            boundary = getattr(self, name)
            if not on_pane_boundary(boundary):
                raise BillingError(f"billing period {self.label}: {name} {boundary.isoformat()} is not on a "
                                   f"5-minute UTC pane boundary, so it cannot be billed exactly from panes")
        if self.end_utc <= self.start_utc:
            raise BillingError(f"billing period {self.label}: end {self.end_utc.isoformat()} is not after "
                               f"start {self.start_utc.isoformat()}")

    @property
    def pane_count(self) -> int:
        """N: the number of 5-minute panes in the period."""
        return (self.end_utc - self.start_utc) // PANE

    def pane_index(self, pane_start: datetime) -> int:
        """The 0-based position of a pane in the period; an error if it is off-grid or outside."""
        pane_start = as_utc(pane_start)
        if not on_pane_boundary(pane_start):
            raise BillingError(f"pane {pane_start.isoformat()} does not start on a 5-minute UTC boundary")
        if not self.start_utc <= pane_start < self.end_utc:
            raise BillingError(f"pane {pane_start.isoformat()} is outside billing period {self.label} "
                               f"[{self.start_utc.isoformat()}, {self.end_utc.isoformat()})")
        return (pane_start - self.start_utc) // PANE


@dataclass(frozen=True)
class BillingCycle:
    """When billing periods start: day of month (1–28), wall-clock time and IANA zone."""

    start_day: int = 1
    tz: str = "UTC"
    start_time: time = time(0)

    def __post_init__(self) -> None:
        if isinstance(self.start_day, bool) or not isinstance(self.start_day, int) or not 1 <= self.start_day <= 28:
            raise BillingError(f"billing start_day: {self.start_day!r} is not a day 1–28 (every month has it)")
        try:
            ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
            raise BillingError(f"billing tz: {self.tz!r} is not an IANA time zone (e.g. UTC, Europe/Berlin, "
                               f"Asia/Kolkata)") from None
        if not isinstance(self.start_time, time) or self.start_time.tzinfo is not None:
            raise BillingError(f"billing start_time: {self.start_time!r} must be a wall-clock time without a "
                               f"zone (the zone is tz)")

    def period_for(self, label: str) -> BillingPeriod:
        """The period that starts in month ``label`` (``YYYY-MM``)."""
        match = _LABEL.match(label) if isinstance(label, str) else None
        if not match or not 1 <= int(match.group(2)) <= 12:
            raise BillingError(f"billing period {label!r} is not YYYY-MM (the month the period starts in)")
        year, month = int(match.group(1)), int(match.group(2))
        return BillingPeriod(label, self._start(year, month), self._start(*_shift(year, month, 1)))

    def period_containing(self, ts: datetime) -> BillingPeriod:
        """The period whose ``[start, end)`` holds ``ts``."""
        ts = as_utc(ts)
        local = ts.astimezone(ZoneInfo(self.tz))
        # The local month's period, or a neighbour when ts is before its start day
        # (or, in a zone that falls back across midnight at month end, after its end).
        for step in (0, -1, 1):
            year, month = _shift(local.year, local.month, step)
            period = self.period_for(f"{year:04d}-{month:02d}")
            if period.start_utc <= ts < period.end_utc:
                return period
        raise AssertionError(f"no billing period holds {ts.isoformat()}")  # periods tile time

    def _start(self, year: int, month: int) -> datetime:
        wall = datetime.combine(date(year, month, self.start_day), self.start_time, tzinfo=ZoneInfo(self.tz))
        return wall.astimezone(timezone.utc)


def _shift(year: int, month: int, months: int) -> tuple[int, int]:
    index = year * 12 + month - 1 + months
    return index // 12, index % 12 + 1


def percentile_rank(n_panes: int) -> int:
    """``ceil(0.95·N)``, the 1-based rank of the 95th percentile, in exact integer arithmetic."""
    if n_panes < 1:
        raise BillingError(f"a 95th percentile needs at least one pane, not {n_panes}")
    return (95 * n_panes + 99) // 100


def rate_bps(pane_bytes: int) -> float:
    """The rate of a pane in bits/s, ``bytes·8/300`` (the nearest float to the exact value)."""
    return pane_bytes * 8 / PANE_SECONDS


@dataclass(frozen=True)
class Percentile:
    """The 95th-percentile pane of a series: its rank among N panes and its bytes."""

    rank: int
    panes: int
    pane_bytes: int

    @property
    def bps(self) -> float:
        """The percentile as a rate in bits/s."""
        return rate_bps(self.pane_bytes)


def p95(pane_bytes: Mapping[int, int], n_panes: int) -> Percentile:
    """The 95th percentile of N panes given sparsely (pane index → bytes; a missing pane is 0)."""
    rank = percentile_rank(n_panes)
    for index, value in pane_bytes.items():
        if not 0 <= index < n_panes:
            raise BillingError(f"pane index {index} is outside 0..{n_panes - 1}")
        if value < 0:
            raise BillingError(f"pane {index} has negative bytes ({value})")
    missing = n_panes - len(pane_bytes)
    # Missing panes are zeros and sort first; no byte count is below zero.
    value = 0 if rank <= missing else sorted(pane_bytes.values())[rank - missing - 1]
    return Percentile(rank, n_panes, int(value))


@dataclass(frozen=True)
class Bill:
    """An account's bill for one period: volumes, per-direction 95th percentiles, billable rate."""

    account: str
    period: str
    period_start: datetime
    period_end: datetime
    panes: int
    rule: str
    unknown_direction: str
    bytes_in: int
    bytes_out: int
    bytes_internal: int
    bytes_transit: int
    bytes_unknown: int
    bytes_total: int
    p95_rank: int
    p95_in_pane_bytes: int
    p95_out_pane_bytes: int
    billable_pane_bytes: int
    p95_in_bps: float
    p95_out_bps: float
    billable_bps: float
    mapping_versions: tuple[str, ...]
    #: The account's committed rate (``commit_bps`` of its accounts-file version) and the billable rate above it
    #: (``max(0, billable_bps − commit_bps)``); None when it has no commit.
    commit_bps: float | None = None
    overage_bps: float | None = None


def compute_bill(
    panes: Iterable[tuple[datetime, str | None, int]],
    period: BillingPeriod,
    account: str,
    rule: str = "max",
    unknown_direction: str = "in",
    mapping_versions: Iterable[str] = (),
) -> Bill:
    """The bill of ``account`` from its ``(pane_start, direction, bytes)`` rows (any sources, any order).

    Every row must lie in the period: a pane outside it is an error, not ignored, since
    a bill built from a wrongly filtered read must not look complete.
    """
    check_rule(rule, unknown_direction)  # before a row is read: a bad rule fails however the rows are
    return _bill(pane_series(panes, period), period, account, rule, unknown_direction, mapping_versions)


def check_rule(rule: str, unknown_direction: str) -> None:
    if rule not in RULES:
        raise BillingError(f"billing rule {rule!r} is not one of {', '.join(RULES)}")
    if unknown_direction not in UNKNOWN_DIRECTIONS:
        raise BillingError(f"unknown_direction {unknown_direction!r} is not one of {', '.join(UNKNOWN_DIRECTIONS)}")
    if rule == "sum" and unknown_direction == "both":
        raise BillingError("unknown_direction 'both' with rule 'sum' would count unknown traffic twice; "
                           "use 'in' or 'out'")


def pane_series(panes: Iterable[tuple[datetime, str | None, int]],
                period: BillingPeriod) -> dict[str | None, dict[int, int]]:
    """Per direction, the bytes per pane index of ``(pane_start, direction, bytes)`` rows; an error for a row
    off the period's grid, of an unknown direction or with bytes that are not a whole count."""
    series: dict[str | None, defaultdict[int, int]] = {direction: defaultdict(int) for direction in DIRECTIONS}
    for pane_start, direction, nbytes in panes:
        if direction not in series:
            raise BillingError(f"pane {pane_start}: direction {direction!r} is not in/out/internal/transit/null")
        if isinstance(nbytes, bool) or not hasattr(nbytes, "__index__") or nbytes < 0:
            raise BillingError(f"pane {pane_start}: bytes {nbytes!r} is not a whole number of bytes")
        series[direction][period.pane_index(pane_start)] += operator.index(nbytes)
    return series


def billed_series(series: Mapping[str | None, Mapping[int, int]],
                  unknown_direction: str) -> tuple[Mapping[int, int], Mapping[int, int]]:
    """The inbound and outbound series a bill takes its percentiles of (traffic of unknown direction added
    where ``unknown_direction`` says)."""
    inbound, outbound = series.get("in", {}), series.get("out", {})
    unknown = series.get(None, {})
    if unknown_direction in ("in", "both"):
        inbound = _added(inbound, unknown)
    if unknown_direction in ("out", "both"):
        outbound = _added(outbound, unknown)
    return inbound, outbound


def bill_from_series(
    series: Mapping[str | None, Mapping[int, int]],
    period: BillingPeriod,
    account: str,
    rule: str = "max",
    unknown_direction: str = "in",
    mapping_versions: Iterable[str] = (),
) -> Bill:
    """The bill of ``account`` from its bytes per direction and pane index (``pane_series``)."""
    check_rule(rule, unknown_direction)
    return _bill(series, period, account, rule, unknown_direction, mapping_versions)


def _bill(series: Mapping[str | None, Mapping[int, int]], period: BillingPeriod, account: str, rule: str,
          unknown_direction: str, mapping_versions: Iterable[str]) -> Bill:
    """The bill under a rule already checked (``check_rule``): what ``compute_bill`` and ``bill_from_series`` share."""
    totals = {direction: sum(series.get(direction, {}).values()) for direction in DIRECTIONS}
    inbound, outbound = billed_series(series, unknown_direction)
    n_panes = period.pane_count
    p95_in, p95_out = p95(inbound, n_panes), p95(outbound, n_panes)
    billable = (max if rule == "max" else operator.add)(p95_in.pane_bytes, p95_out.pane_bytes)
    return Bill(
        account=account,
        period=period.label,
        period_start=period.start_utc,
        period_end=period.end_utc,
        panes=n_panes,
        rule=rule,
        unknown_direction=unknown_direction,
        bytes_in=totals["in"],
        bytes_out=totals["out"],
        bytes_internal=totals["internal"],
        bytes_transit=totals["transit"],
        bytes_unknown=totals[None],
        bytes_total=sum(totals.values()),
        p95_rank=p95_in.rank,
        p95_in_pane_bytes=p95_in.pane_bytes,
        p95_out_pane_bytes=p95_out.pane_bytes,
        billable_pane_bytes=billable,
        p95_in_bps=p95_in.bps,
        p95_out_bps=p95_out.bps,
        billable_bps=rate_bps(billable),
        mapping_versions=tuple(mapping_versions),
    )


def _added(a: Mapping[int, int], b: Mapping[int, int]) -> dict[int, int]:
    total = dict(a)
    for index, value in b.items():
        total[index] = total.get(index, 0) + value
    return total
