"""The event-time clock: source clocks, liveness and the watermark (DESIGN §2).

Pure functions over plain values; no Spark, no storage. What the watermark closes, and every
other time rule, is in ``traffic.core.periods``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Mapping

from traffic.core.periods import hour_floor, period_end

@dataclass(frozen=True)
class ClockState:
    """Clocks per source, the watermark ``W`` (None before any data) and the first hour.

    ``seen_at`` is each source's *last seen at* mark: the largest clock of any source after the
    last batch in which that source delivered a record (a packet or a tick, on time or late). A
    source is stalled once the largest clock has moved more than ``source_timeout`` past its
    mark (``is_stalled``): being behind another source never stalls it, only the others' progress
    while it delivers nothing does. ``ahead`` keeps, per source, the watermark spans ``(after,
    upto]`` crossed by batches after which that source was far ahead (``far_ahead``): the hours
    those batches closed carry a data-quality warning.
    """

    clocks: Mapping[str, datetime] = field(default_factory=dict)
    last_batch: Mapping[str, int] = field(default_factory=dict)
    watermark: datetime | None = None
    first_hour: datetime | None = None
    seen_at: Mapping[str, datetime] = field(default_factory=dict)
    ahead: Mapping[str, tuple[tuple[datetime | None, datetime], ...]] = field(default_factory=dict)

    def newest(self) -> datetime | None:
        """The largest clock of any source (None before any data)."""
        return max(self.clocks.values()) if self.clocks else None

    def last_seen_at(self, source: str) -> datetime:
        """A source's mark; a warehouse written before marks existed starts from the source's own clock
        (which is the rule it followed then: stalled once ``source_timeout`` behind the largest clock)."""
        return self.seen_at.get(source) or self.clocks[source]

    def is_stalled(self, source: str, source_timeout: timedelta) -> bool:
        """Stalled: the largest clock is more than ``source_timeout`` past the source's last-seen-at mark."""
        return self.newest() - self.last_seen_at(source) > source_timeout

    def live_sources(self, source_timeout: timedelta) -> set[str]:
        """Sources not stalled: every source that delivered in the last batch is live."""
        return {s for s in self.clocks if not self.is_stalled(s, source_timeout)}

    def far_ahead(self, source_timeout: timedelta) -> dict[str, timedelta]:
        """Sources whose clock is more than ``source_timeout`` ahead of every other live source's, with by how much.

        Only the leader can be; with a single live source nobody is (a stalled source's clock is
        no yardstick: its hours say so through completeness).
        """
        live = self.live_sources(source_timeout)
        if len(live) < 2:
            return {}
        leader = max(live, key=lambda s: (self.clocks[s], s))
        gap = self.clocks[leader] - max(self.clocks[s] for s in live if s != leader)
        return {leader: gap} if gap > source_timeout else {}

    def ahead_when_closed(self, hour: datetime) -> list[str]:
        """Sources that were far ahead after the batch whose watermark closed ``hour``."""
        end = period_end(hour, "hour")
        return sorted(s for s, spans in self.ahead.items()
                      if any((after is None or after < end) and end <= upto for after, upto in spans))


def advance(
    state: ClockState,
    batch_clocks: Mapping[str, datetime],
    batch_id: int,
    allowed_lateness: timedelta,
    source_timeout: timedelta,
    first_on_time_hour: datetime | None = None,
    source_lateness: Mapping[str, timedelta] | None = None,
) -> ClockState:
    """The state after a batch whose accepted records reached ``batch_clocks`` per source.

    ``source_lateness`` gives a source its own allowed lateness (a flow exporter holds a long flow
    for up to its active timeout, DESIGN §7a); the others have ``allowed_lateness``.

    Decided by the sequence of batches alone (no wall clock), so a replay of the same batches
    gives the same watermarks.
    """
    clocks = dict(state.clocks)
    last_batch = dict(state.last_batch)
    seen_at = {s: state.last_seen_at(s) for s in state.clocks}
    for source, ts in batch_clocks.items():
        clocks[source] = max(ts, clocks.get(source, ts))
        last_batch[source] = batch_id
    newest = max(clocks.values()) if clocks else None
    for source in batch_clocks:
        seen_at[source] = newest
    first_hour = state.first_hour
    if first_on_time_hour is not None:
        first_hour = first_on_time_hour if first_hour is None else min(first_hour, first_on_time_hour)
    advanced = replace(state, clocks=clocks, last_batch=last_batch, first_hour=first_hour, seen_at=seen_at)
    live = advanced.live_sources(source_timeout)
    if not live:
        return advanced
    lateness = source_lateness or {}
    candidate = min(clocks[s] - lateness.get(s, allowed_lateness) for s in live)
    watermark = candidate if state.watermark is None else max(state.watermark, candidate)
    ahead = dict(state.ahead)
    if watermark != state.watermark:
        for source in advanced.far_ahead(source_timeout):
            ahead[source] = _extend(ahead.get(source, ()), state.watermark, watermark)
    return replace(advanced, watermark=watermark, ahead=ahead)


def _extend(spans: tuple, after: datetime | None, upto: datetime) -> tuple:
    """``spans`` plus ``(after, upto]``, joined to the last span when it continues it."""
    if spans and spans[-1][1] == after:
        return spans[:-1] + ((spans[-1][0], upto),)
    return spans + ((after, upto),)


#: ``traffic status`` warns when the first hour lies further than this before the next hour with data.
FIRST_HOUR_GAP = timedelta(days=7)


def first_hour_gap(first_hour: datetime | None, data_hours, newest: datetime | None) -> timedelta | None:
    """How far the first hour lies before the next hour with on-time data (none: the newest clock's hour), when
    that is more than ``FIRST_HOUR_GAP``: every hour between is empty, yet each is closed and ledgered (one
    stray old record can do that); else None."""
    if first_hour is None:
        return None
    later = [h for h in data_hours if h > first_hour]
    after = min(later) if later else (hour_floor(newest) if newest is not None else None)
    if after is None:
        return None
    gap = after - first_hour
    return gap if gap > FIRST_HOUR_GAP else None
