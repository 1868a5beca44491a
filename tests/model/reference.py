"""A plain-Python reference model of the accounting contract, for property tests.

Written straight from ``../shared/DESIGN.md`` §2–§7 and ``docs/semantics.md`` (router-feed
CSV dialect only). Property tests feed the same random stream to the Spark pipeline and to
this model and compare every table row for row, so it aims at being obviously right, not
fast: state is plain dicts and lists, every time is held as integer microseconds since the
epoch (no timezone or overflow surprises) and turned into ``datetime``/``date`` only when
tables are read, and each number is recomputed from the rows that define it.
"""

from __future__ import annotations

import calendar
import hashlib
import ipaddress
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

UTC = timezone.utc
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

MINUTE = 60 * 1_000_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR
PANE = 5 * MINUTE

#: Largest accepted ``ts``: 9999-12-31 23:59:59.999999 UTC.
MAX_TS_US = 253_402_300_799_999_999
MAX_PORT = 65_535
#: Largest IP packet per family: IPv4 total length is 16 bits; an IPv6 jumbogram carries
#: up to 2**32 - 1 payload bytes after its 40-byte header.
MAX_BYTES = {4: 65_535, 6: 4_294_967_295 + 40}

#: A decimal number as the feed writes it: ASCII digits only (no sign, space, underscore).
_DECIMAL = re.compile(r"[0-9]+")

TIMESTAMP_COLUMNS = frozenset(
    {"ts", "hour", "pane_start", "period_start", "closed_at_watermark", "clock", "last_seen_at",
     "watermark_before", "watermark_after"}
)
DATE_COLUMNS = frozenset({"day", "month"})


@dataclass(frozen=True)
class ModelSettings:
    """The configuration the contract leaves to the operator (same names as the pipeline's)."""

    keep_hours: int = 24
    allowed_lateness: timedelta = timedelta(0)
    source_timeout: timedelta = timedelta(hours=1)
    max_future_skew: timedelta = timedelta(days=1)
    max_history: timedelta = timedelta(days=400)
    #: Empty: a closed hour expects the sources seen in the 24 h ending at the hour's end.
    expected_sources: tuple[str, ...] = ()
    #: An hour with fewer active panes, or fewer reporting sources than expected, is published as
    #: a ``warning`` (the model covers the default action only: ``failure`` blocks roll-ups).
    completeness_min_panes: int = 12
    late_retention: timedelta = timedelta(days=90)
    reject_retention: timedelta = timedelta(days=90)


# --------------------------------------------------------------------------- time helpers


def to_us(moment: datetime) -> int:
    """Microseconds since the epoch of an aware datetime."""
    if moment.tzinfo is None:
        raise ValueError(f"naive datetime {moment!r}: the model only takes UTC-aware times")
    return (moment - EPOCH) // timedelta(microseconds=1)


def span_us(span: timedelta) -> int:
    """A duration in whole microseconds."""
    return span // timedelta(microseconds=1)


def to_datetime(us: int) -> datetime:
    """The UTC datetime of microseconds since the epoch."""
    return EPOCH + timedelta(microseconds=us)


def floor_to(us: int, unit: int) -> int:
    """Start of the ``unit``-long period (hour, day, pane) holding ``us``."""
    return us - us % unit


def month_start(us: int) -> int:
    """First instant of the calendar month holding ``us``."""
    moment = to_datetime(us)
    return to_us(datetime(moment.year, moment.month, 1, tzinfo=UTC))


def month_end(us: int) -> int:
    """First instant after the calendar month holding ``us``."""
    moment = to_datetime(us)
    return month_start(us) + calendar.monthrange(moment.year, moment.month)[1] * DAY


def _iso(us: int) -> str:
    return to_datetime(us).isoformat()


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class ParsedRecord:
    """One router-feed line, judged on its own: a packet, a tick, or a reject with a reason."""

    kind: str  # "packet" | "tick" | "reject"
    ts: int | None = None
    local_ip: str | None = None
    remote_ip: str | None = None
    local_port: int | None = None
    remote_port: int | None = None
    bytes: int | None = None
    reason: str | None = None


def _reject(reason: str) -> ParsedRecord:
    return ParsedRecord("reject", reason=reason)


def _decimal(text: str, upper: int) -> int | None:
    """``text`` as an int in ``0..upper``, or None when it is not a plain decimal in range."""
    if not _DECIMAL.fullmatch(text):
        return None
    significant = text.lstrip("0") or "0"
    if len(significant) > len(str(upper)):  # also keeps int() away from huge strings
        return None
    value = int(significant)
    return value if value <= upper else None


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a record stores: no zone id; an IPv4-mapped IPv6 address is its IPv4 address."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if address.version == 6 and address.scope_id is not None:
        return None
    return (address.ipv4_mapped or address) if address.version == 6 else address


def parse_router_feed_line(line: str) -> ParsedRecord:
    """Judge one non-empty line of the router-feed dialect (DESIGN §7), time rules aside."""
    fields = line.split(",")
    if len(fields) not in (3, 8):
        return _reject(f"expected 3 fields (tick) or 8 fields (packet), found {len(fields)}")
    if fields[0] != "new":
        return _reject(f"first field must be 'new', found {fields[0]!r}")
    if fields[1] != "OP_INSERT":
        return _reject(f"unknown opcode {fields[1]!r}")
    ts = _decimal(fields[2], MAX_TS_US)
    if ts is None:
        return _reject(f"bad timestamp {fields[2]!r}: microseconds since 1970 before year 10000")
    if len(fields) == 3:
        return ParsedRecord("tick", ts=ts)
    local, remote = _address(fields[3]), _address(fields[4])
    if local is None:
        return _reject(f"bad local IP address {fields[3]!r}")
    if remote is None:
        return _reject(f"bad remote IP address {fields[4]!r}")
    if local.version != remote.version:
        return _reject("IPv4 and IPv6 addresses mixed in one record")
    local_port, remote_port = _decimal(fields[5], MAX_PORT), _decimal(fields[6], MAX_PORT)
    if local_port is None:
        return _reject(f"bad local port {fields[5]!r}: must be 0-65535")
    if remote_port is None:
        return _reject(f"bad remote port {fields[6]!r}: must be 0-65535")
    size = _decimal(fields[7], MAX_BYTES[local.version])
    if size is None:
        return _reject(
            f"bad byte count {fields[7]!r}: must be 0-{MAX_BYTES[local.version]} for IPv{local.version}"
        )
    return ParsedRecord(
        "packet", ts=ts, local_ip=str(local), remote_ip=str(remote),
        local_port=local_port, remote_port=remote_port, bytes=size,
    )


def split_records(text: str) -> list[str]:
    """The records of a file: lines split on '\\n', one trailing '\\r' cut, empty lines skipped."""
    lines = (line[:-1] if line.endswith("\r") else line for line in text.split("\n"))
    return [line for line in lines if line != ""]


# --------------------------------------------------------------------------- the model


class ReferenceModel:
    """The contract's tables, kept in memory, driven by micro-batches and closes."""

    def __init__(self, settings: ModelSettings = ModelSettings()):
        self.settings = settings
        self._keep = settings.keep_hours * HOUR
        self._lateness = span_us(settings.allowed_lateness)
        self._timeout = span_us(settings.source_timeout)
        self._future_skew = span_us(settings.max_future_skew)
        self._history = span_us(settings.max_history)
        self._late_retention = span_us(settings.late_retention)
        self._reject_retention = span_us(settings.reject_retention)

        self._accounted: set[tuple[str, str]] = set()  # (source, sha256) of files counted
        self._last_batch_id = 0
        self._watermark: int | None = None
        self._clocks: dict[str, dict] = {}  # source -> {"clock", "last_batch_id", "last_seen_at"}
        self._batches: list[dict] = []
        self._packets: list[dict] = []
        self._late_packets: list[dict] = []
        self._rejects: list[dict] = []  # plus "_watermark": the batch's watermark_after
        self._panes: dict[tuple[str, int], dict] = {}  # (source, pane_start) -> counts
        # Late packets per hour, never expired: the ledger's late columns are sums of it.
        self._late_by_hour: dict[int, list[int]] = defaultdict(lambda: [0, 0])

        self._first_hour: int | None = None
        self._open_hourly: dict[tuple[int, str, str], list[int]] = {}  # kept by ingest
        self._final_hourly: dict[tuple[int, str, str], list[int]] = {}
        self._daily: dict[tuple[int, str, str], list[int]] = {}
        self._monthly: dict[tuple[int, str, str], list[int]] = {}
        self._periods: dict[tuple[str, int], dict] = {}  # without the late columns
        self._frozen_until: int | None = None  # the freeze frontier
        self._rolled_days_until: int | None = None
        self._rolled_months_until: int | None = None

    # ------------------------------------------------------------------ ingest

    @property
    def watermark(self) -> datetime | None:
        """The event-time watermark W, or None before any data."""
        return None if self._watermark is None else to_datetime(self._watermark)

    def ingest(self, files: list[tuple[str, str]], now: datetime) -> None:
        """One micro-batch of router-feed files ``[(source, text)]``, processed at ``now``.

        A call without files is no batch. Content already accounted (same source and sha256
        of the UTF-8 text) adds nothing and is counted in ``duplicate_files``.
        """
        if not files:
            return
        self._last_batch_id += 1
        batch_id = self._last_batch_id
        now_us = to_us(now)
        w_before = self._watermark

        duplicates = 0
        records: list[tuple[str, str, ParsedRecord]] = []  # (source, raw line, judgement)
        for source, text in files:
            key = (source, hashlib.sha256(text.encode("utf-8")).hexdigest())
            if key in self._accounted:
                duplicates += 1
                continue
            self._accounted.add(key)
            records += [(source, line, parse_router_feed_line(line)) for line in split_records(text)]

        # Sanity bounds (semantics steps 2 and 3): the future first, then the past relative
        # to the newest record that survived steps 1-2, over all sources of the batch.
        records = [
            (source, line, _reject(f"timestamp {_iso(rec.ts)} more than max_future_skew "
                                   f"ahead of the processing clock {_iso(now_us)}"))
            if rec.kind != "reject" and rec.ts > now_us + self._future_skew
            else (source, line, rec)
            for source, line, rec in records
        ]
        surviving = [rec.ts for _, _, rec in records if rec.kind != "reject"]
        if surviving:
            oldest_allowed = max(surviving) - self._history
            records = [
                (source, line, _reject(f"timestamp {_iso(rec.ts)} more than max_history "
                                       f"behind the newest record of its batch"))
                if rec.kind != "reject" and rec.ts < oldest_allowed
                else (source, line, rec)
                for source, line, rec in records
            ]

        counts = dict(records_read=len(records), packets_on_time=0, packets_late=0,
                      records_rejected=0, ticks=0, bytes_on_time=0, bytes_late=0)
        for source, line, rec in records:
            if rec.kind == "reject":
                counts["records_rejected"] += 1
                self._rejects.append(dict(batch_id=batch_id, source=source, input_file=None,
                                          record=line, reason=rec.reason))
                continue
            hour = floor_to(rec.ts, HOUR)
            on_time = w_before is None or hour + HOUR > w_before
            if rec.kind == "tick":
                counts["ticks"] += 1
                if on_time:
                    self._pane(source, rec.ts)["ticks"] += 1
            else:
                row = dict(ts=rec.ts, source=source, local_ip=rec.local_ip,
                           remote_ip=rec.remote_ip, local_port=rec.local_port,
                           remote_port=rec.remote_port, protocol=None, bytes=rec.bytes,
                           direction=None, hour=hour, batch_id=batch_id)
                if on_time:
                    counts["packets_on_time"] += 1
                    counts["bytes_on_time"] += rec.bytes
                    self._packets.append(row)
                    pane = self._pane(source, rec.ts)
                    pane["packets"] += 1
                    pane["bytes"] += rec.bytes
                    open_row = self._open_hourly.setdefault((hour, rec.local_ip, rec.remote_ip), [0, 0])
                    open_row[0] += rec.bytes
                    open_row[1] += 1
                    if self._first_hour is None or hour < self._first_hour:
                        assert self._frozen_until is None, "first hour moved after freezing began"
                        self._first_hour = hour
                else:
                    counts["packets_late"] += 1
                    counts["bytes_late"] += rec.bytes
                    self._late_packets.append(
                        dict(row, late_reason=f"hour {_iso(hour)} closed by watermark {_iso(w_before)}")
                    )
                    self._late_by_hour[hour][0] += rec.bytes
                    self._late_by_hour[hour][1] += 1
            clock = self._clocks.setdefault(source, dict(clock=rec.ts, last_batch_id=batch_id))
            clock["clock"] = max(clock["clock"], rec.ts)
            clock["last_batch_id"] = batch_id

        ahead: list[str] = []
        if self._clocks:
            # A source's "last seen at" mark: the largest clock of any source after the last batch in
            # which it delivered a record. It is stalled once the largest clock has moved more than
            # source_timeout past its mark; a source delivering in every batch never is.
            newest = max(c["clock"] for c in self._clocks.values())
            for clock in self._clocks.values():
                if clock["last_batch_id"] == batch_id:
                    clock["last_seen_at"] = newest
            live = {source: c["clock"] for source, c in self._clocks.items()
                    if newest - c["last_seen_at"] <= self._timeout}
            candidate = min(live.values()) - self._lateness
            self._watermark = candidate if w_before is None else max(w_before, candidate)
            # Far ahead: more than source_timeout ahead of every other live source.
            ahead = [source for source, clock in live.items()
                     if len(live) > 1 and all(clock - other > self._timeout
                                              for name, other in live.items() if name != source)]

        for row in self._rejects:
            if row["batch_id"] == batch_id:
                row["_watermark"] = self._watermark
        self._batches.append(dict(batch_id=batch_id, **counts, duplicate_files=duplicates,
                                  watermark_before=w_before, watermark_after=self._watermark, _ahead=ahead))

    def _pane(self, source: str, ts: int) -> dict:
        return self._panes.setdefault((source, floor_to(ts, PANE)), dict(packets=0, bytes=0, ticks=0))

    # ------------------------------------------------------------------ close

    def close(self, until: datetime | None = None) -> None:
        """Freeze closed hours, roll up closed days then months, then expire (DESIGN §3–§5)."""
        limit = None if until is None else to_us(until)
        if self._first_hour is not None:
            self._freeze(limit)
            self._roll_up_days(limit)
            self._roll_up_months()
        self._expire()

    def _closable(self, end: int, limit: int | None) -> bool:
        return end <= self._watermark and (limit is None or end <= limit)

    def _freeze(self, limit: int | None) -> None:
        hour = self._first_hour if self._frozen_until is None else self._frozen_until
        while self._closable(hour + HOUR, limit):
            self._freeze_hour(hour)
            hour += HOUR
            self._frozen_until = hour

    def _freeze_hour(self, hour: int) -> None:
        final: dict[tuple[int, str, str], list[int]] = {}
        for packet in self._packets:
            if packet["hour"] == hour:
                row = final.setdefault((hour, packet["local_ip"], packet["remote_ip"]), [0, 0])
                row[0] += packet["bytes"]
                row[1] += 1
        kept_open = {key: value for key, value in self._open_hourly.items() if key[0] == hour}
        assert final == kept_open, f"open rows of {_iso(hour)} differ from its packets"
        for key in kept_open:
            del self._open_hourly[key]
        self._final_hourly.update(final)
        reporting, expected, panes_active = self._hour_completeness(hour)
        complete = panes_active >= self.settings.completeness_min_panes and reporting >= expected
        # A source far ahead of the others after the batch that closed the hour: a warning too.
        flagged = bool(self._closing_batch(hour + HOUR)["_ahead"])
        self._periods[("hour", hour)] = dict(
            bytes=sum(v[0] for v in final.values()), packets=sum(v[1] for v in final.values()),
            sources_reporting=reporting, sources_expected=expected, panes_active=panes_active,
            closed_at_watermark=self._closed_at(hour + HOUR),
            dq_status="passed" if complete and not flagged else "warning",
        )

    def _hour_completeness(self, hour: int) -> tuple[int, int, int]:
        end = hour + HOUR
        reporting = {source for source, pane in self._panes if hour <= pane < end}
        if self.settings.expected_sources:
            expected = set(self.settings.expected_sources)
        else:
            expected = {source for source, pane in self._panes if end - DAY <= pane < end}
        active = sum(
            1 for pane in range(hour, end, PANE)
            if all((source, pane) in self._panes for source in expected)
        )
        return len(reporting), len(expected), active

    def _closing_batch(self, end: int) -> dict:
        """The first batch whose watermark reached ``end``."""
        return next(b for b in self._batches if b["watermark_after"] is not None and b["watermark_after"] >= end)

    def _closed_at(self, end: int) -> int:
        """watermark_after of the first batch whose watermark reached ``end``."""
        return self._closing_batch(end)["watermark_after"]

    def _roll_up_days(self, limit: int | None) -> None:
        day = floor_to(self._first_hour, DAY) if self._rolled_days_until is None else self._rolled_days_until
        while (self._closable(day + DAY, limit) and self._frozen_until is not None
               and self._frozen_until >= day + DAY):
            rows: dict[tuple[int, str, str], list[int]] = {}
            for (hour, local, remote), (size, count) in self._final_hourly.items():
                if day <= hour < day + DAY:
                    row = rows.setdefault((day, local, remote), [0, 0])
                    row[0] += size
                    row[1] += count
            self._daily.update(rows)
            self._periods[("day", day)] = self._rolled_ledger(day, day + DAY, rows)
            day += DAY
            self._rolled_days_until = day

    def _roll_up_months(self) -> None:
        if self._rolled_days_until is None:
            return
        month = month_start(self._first_hour) if self._rolled_months_until is None else self._rolled_months_until
        while month_end(month) <= self._rolled_days_until:
            end = month_end(month)
            rows: dict[tuple[int, str, str], list[int]] = {}
            for (day, local, remote), (size, count) in self._daily.items():
                if month <= day < end:
                    row = rows.setdefault((month, local, remote), [0, 0])
                    row[0] += size
                    row[1] += count
            self._monthly.update(rows)
            self._periods[("month", month)] = self._rolled_ledger(month, end, rows)
            month = end
            self._rolled_months_until = month

    def _rolled_ledger(self, start: int, end: int, rows: dict) -> dict:
        """A day's or month's ledger row: totals from its rows, completeness from its hours."""
        covered_from = max(start, self._first_hour)
        hours = [row for (grain, hour), row in self._periods.items()
                 if grain == "hour" and start <= hour < end]
        return dict(
            bytes=sum(v[0] for v in rows.values()), packets=sum(v[1] for v in rows.values()),
            sources_reporting=len({s for s, pane in self._panes if covered_from <= pane < end}),
            sources_expected=max(h["sources_expected"] for h in hours),
            panes_active=sum(h["panes_active"] for h in hours),
            closed_at_watermark=self._closed_at(end),
        )

    def _expire(self) -> None:
        if self._watermark is None:
            return
        now_hour = floor_to(self._watermark, HOUR)
        def frozen(hour: int) -> bool:
            return self._frozen_until is not None and hour < self._frozen_until

        self._packets = [p for p in self._packets
                         if not (p["hour"] < now_hour - self._keep and frozen(p["hour"]))]
        self._late_packets = [p for p in self._late_packets
                              if not p["hour"] < now_hour - self._late_retention]
        self._rejects = [
            r for r in self._rejects
            if r["_watermark"] is None
            or not floor_to(r["_watermark"], HOUR) < now_hour - self._reject_retention
        ]

    # ------------------------------------------------------------------ tables

    def tables(self) -> dict[str, list[dict]]:
        """Every table's current rows, in the contract's columns and Python types, sorted."""
        hourly = [
            dict(hour=hour, day=floor_to(hour, DAY), local_ip=local, remote_ip=remote,
                 bytes=size, packets=count, bytes_in=0, bytes_out=0, status=status)
            for status, rows in (("final", self._final_hourly), ("open", self._open_hourly))
            for (hour, local, remote), (size, count) in rows.items()
        ]
        daily = [
            dict(day=day, month=month_start(day), local_ip=local, remote_ip=remote,
                 bytes=size, packets=count, bytes_in=0, bytes_out=0)
            for (day, local, remote), (size, count) in self._daily.items()
        ]
        monthly = [
            dict(month=month, local_ip=local, remote_ip=remote,
                 bytes=size, packets=count, bytes_in=0, bytes_out=0)
            for (month, local, remote), (size, count) in self._monthly.items()
        ]
        periods = []
        for (grain, start), row in self._periods.items():
            end = {"hour": start + HOUR, "day": start + DAY, "month": month_end(start)}[grain]
            late = [v for hour, v in self._late_by_hour.items() if max(start, self._first_hour) <= hour < end]
            periods.append(dict(
                grain=grain, period_start=start, bytes=row["bytes"], packets=row["packets"],
                late_bytes=sum(v[0] for v in late), late_packets=sum(v[1] for v in late),
                sources_reporting=row["sources_reporting"], sources_expected=row["sources_expected"],
                panes_active=row["panes_active"], closed_at_watermark=row["closed_at_watermark"],
                dq_status=row.get("dq_status", "passed"), restated=None,
            ))
        tables = dict(
            packets=[dict(p) for p in self._packets],
            late_packets=[dict(p) for p in self._late_packets],
            rejects=[{k: v for k, v in r.items() if not k.startswith("_")} for r in self._rejects],
            hourly=hourly,
            daily=daily,
            monthly=monthly,
            periods=periods,
            source_panes=[dict(source=source, pane_start=pane, **counts)
                          for (source, pane), counts in self._panes.items()],
            clocks=[dict(source=source, **clock) for source, clock in self._clocks.items()],
            batches=[{k: v for k, v in b.items() if not k.startswith("_")} for b in self._batches],
        )
        return {name: sorted((_typed(row) for row in rows), key=_sort_key) for name, rows in tables.items()}


def _typed(row: dict) -> dict:
    """A row with its internal microsecond times turned into UTC datetimes and dates."""
    def convert(column: str, value):
        if value is None:
            return None
        if column in TIMESTAMP_COLUMNS:
            return to_datetime(value)
        if column in DATE_COLUMNS:
            return to_datetime(value).date()
        return value
    return {column: convert(column, value) for column, value in row.items()}


def _sort_key(row: dict) -> tuple:
    """Order rows by their columns left to right, nulls first."""
    return tuple((value is not None, value) for value in row.values())


__all__ = ["ModelSettings", "ReferenceModel", "ParsedRecord", "parse_router_feed_line",
           "split_records", "to_us"]


# --- flow telemetry (DESIGN §7a) ---------------------------------------------------------------


def apportion_flow(start: int, end: int, amount: int) -> list[tuple[int, int]]:
    """A flow's ``amount`` over the 5-minute panes ``[start, end]`` overlaps, as (share time, share), the
    obvious way: one pane at a time, exact fractions, then whole units by the largest remainder (ties:
    the earlier pane). A flow lasting no time, or inside one pane, is one share at its start."""
    from fractions import Fraction

    first, last = floor_to(start, PANE), floor_to(end - 1, PANE) if end > start else floor_to(start, PANE)
    panes = list(range(first, last + PANE, PANE))
    if len(panes) == 1:
        return [(start, amount)]
    exact = [Fraction(amount * (min(end, pane + PANE) - max(start, pane)), end - start) for pane in panes]
    shares = [int(x) for x in exact]  # floors: every value is ≥ 0
    by_remainder = sorted(range(len(panes)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in by_remainder[: amount - sum(shares)]:
        shares[i] += 1
    return [(max(start, pane), share) for pane, share in zip(panes, shares)]


def late_shares(start: int, end: int, amount: int, watermark: int | None) -> tuple[int, int]:
    """(on-time, late) parts of a flow when the watermark before its batch is ``watermark``: a share
    is late when its hour ended at or before the watermark (§3), judged share by share."""
    on_time = late = 0
    for ts, share in apportion_flow(start, end, amount):
        if watermark is not None and floor_to(ts, HOUR) + HOUR <= watermark:
            late += share
        else:
            on_time += share
    return on_time, late


# --- export sequence losses (DESIGN §7a "Loss") -------------------------------------------------

#: The window the docs state: a gap waits for this many more datagrams of its stream moving forward,
REORDER_WINDOW = 64
#: or until one of them is received this long (µs) after the datagram that revealed the gap.
REORDER_WAIT = 60 * 1_000_000
SEQUENCE_SPACE = 1 << 32


class LossModel:
    """Lost export sequence units per pane, the obvious way: every missing number is kept by itself.

    Per stream: the number expected next, every forward datagram's first number, and a dict of the
    missing numbers, each tagged with the pane, the forward count and the receive time of the
    datagram that revealed it. A late datagram removes the numbers it carries; a number still
    missing when 64 more forward datagrams have come, or one received a minute after its tag's, is
    lost in its tag's pane. A datagram in no gap and not among the last 64
    forward datagrams' numbers (behind, or 2**31 or more ahead in raw numbers), or ahead with an
    uptime more than a minute back, is a restart if the next datagram continues it, a stray if the
    next continues the old stream. Gaps are small in the
    tests (a number per entry), so this is only for them.
    """

    def __init__(self):
        self.streams: dict = {}
        self.lost: dict[int, int] = defaultdict(int)

    def datagram(self, key, number: int, units: int | None, received: int, uptime: int | None = None) -> None:
        s = self.streams.get(key)
        if s is None:
            self.streams[key] = self._started(number, units, uptime)
            return
        verdict = self._verdict(s, number, received)
        if verdict in ("next", "gap") and uptime is not None and s["uptime"] is not None \
                and uptime < s["uptime"] - REORDER_WAIT // 1000:
            verdict = "other"  # the uptime went back by more than a minute: a restart if the next datagram agrees
        if verdict != "other":
            s["candidate"] = None
            self._apply(s, verdict, number, units, received, uptime)
            return
        if s["candidate"] is not None:
            new = self._started(*s["candidate"], None)
            verdict = self._verdict(new, number, received)
            if verdict in ("next", "gap"):
                self._lose_all(s)
                self.streams[key] = new
                self._apply(new, verdict, number, units, received, uptime)
                return
            if verdict == "duplicate":
                return
        s["candidate"] = (number, units)

    @staticmethod
    def _started(number: int, units: int | None, uptime: int | None) -> dict:
        s = {"next": None, "starts": [], "missing": {}, "uptime": None, "candidate": None}
        LossModel._forward(s, number, units, uptime, None)
        return s

    @staticmethod
    def _verdict(s: dict, number: int, received: int) -> str:
        if number in s["missing"] and received - s["missing"][number][2] < REORDER_WAIT:
            return "fill"  # (a late datagram fills a gap only within a minute of the datagram that revealed it)
        if number == s["next"]:
            return "next"
        last = s["starts"][-1]
        if s["next"] is None and last < number < last + 2**31:
            return "next"  # after a datagram of unknown length: ahead of it, no gap can be judged
        window = s["starts"][-REORDER_WINDOW:]
        # The numbers from the oldest forward datagram in the window up to the one expected next
        # (or, its length unknown, up to the last one's first number).
        top = last if s["next"] is None else s["next"]
        span = (top - window[0]) % SEQUENCE_SPACE
        behind = (top - number) % SEQUENCE_SPACE
        if behind <= span and behind < 2**31:
            return "duplicate"
        if s["next"] is not None and s["next"] < number < s["next"] + 2**31:
            return "gap"
        return "other"

    def _apply(self, s: dict, verdict: str, number: int, units: int | None, received: int, uptime) -> None:
        if verdict == "fill":
            tag = s["missing"][number]
            n = number
            # Its units, or (unknown length) the rest of its gap: the missing numbers that follow with its tag.
            while n in s["missing"] and s["missing"][n] == tag and (units is None or (n - number) % SEQUENCE_SPACE < units):
                del s["missing"][n]
                n = (n + 1) % SEQUENCE_SPACE
            return
        if verdict == "gap":
            assert number - s["next"] < 10**6, "the model keeps every missing number: tests keep gaps small"
            for n in range(s["next"], number):
                s["missing"][n] = (floor_to(received, PANE), len(s["starts"]), received)
        if verdict in ("next", "gap"):
            self._forward(s, number, units, uptime, self, received)

    @staticmethod
    def _forward(s: dict, number: int, units: int | None, uptime, model, received: int | None = None) -> None:
        s["next"] = None if units is None else (number + units) % SEQUENCE_SPACE
        s["starts"].append(number)
        if uptime is not None:
            s["uptime"] = uptime
        for n, (pane, opened, revealed) in list(s["missing"].items()):
            if len(s["starts"]) - opened > REORDER_WINDOW or (received is not None and received - revealed >= REORDER_WAIT):
                del s["missing"][n]
                model.lost[pane] += 1

    def flush(self, now: int) -> None:
        """Count as lost every missing number revealed a minute or more before ``now`` (nothing can fill it)."""
        for s in self.streams.values():
            for n, (pane, _, revealed) in list(s["missing"].items()):
                if now - revealed >= REORDER_WAIT:
                    del s["missing"][n]
                    self.lost[pane] += 1

    def _lose_all(self, s: dict) -> None:
        for pane, _, _ in s["missing"].values():
            self.lost[pane] += 1
        s["missing"].clear()
