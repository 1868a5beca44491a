"""Top talkers over a sliding window that ends at the watermark: exact, and cheap whatever the window.

The window ``[W - last, W)`` splits into whole hours, read from ``hourly`` (open or final: an
hour's row always holds every on-time packet of that hour) or, per account, from ``panes``,
and at most two partial hours at its edges, read from raw detail (``packets``) pruned to those
hours alone; per account, each raw packet takes the account of the mapping version in force at
its time, as its pane did. Totals are built one UTC day at a time (a frozen day of ``hourly``
and ``panes`` is one merged file, read once) and folded into one running table per key, so
memory grows with the number of keys, never with the length of the window.

Raw detail exists only for the last ``keep_hours`` hours before ``hour_floor(W)`` (older hours
may have been expired; W never moves back, so no newer hour ever was). When the window starts
inside an hour older than that, its start moves up to the next whole hour and the result says
so, rather than counting part of that hour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from traffic.accounting.parts import weights
from traffic.core.accounts import NO_ACCOUNTS, load_accounts
from traffic.core.periods import day_start, hour_ceil, hour_floor, hours_between, is_closed, period_end, retention_floor
from traffic.storage.warehouse import Warehouse
from traffic.storage.state import read_clock_state

#: What ``--by`` groups on.
KEYS = {"host": "local_ip", "peer": "remote_ip", "account": "account"}
TOTALS = ("bytes", "packets", "bytes_in", "bytes_out")


class TopError(ValueError):
    """A window that cannot be answered (no data yet, unknown grouping)."""


@dataclass
class TopTalkers:
    """The heaviest keys of one window, with where each part of the window was read from."""

    by: str
    start: datetime
    end: datetime
    rows: list[dict]
    keys: int
    whole_hours: list[datetime] = field(default_factory=list)
    raw_hours: list[datetime] = field(default_factory=list)
    note: str | None = None


def _sum_by(rows: pa.Table, key: str) -> pa.Table:
    """One row per ``key`` with the sum of each total."""
    summed = rows.group_by(key).aggregate([(c, "sum") for c in TOTALS])
    return pa.table({key: summed.column(key), **{c: summed.column(f"{c}_sum") for c in TOTALS}})


def _fold(running: pa.Table | None, part: pa.Table, key: str) -> pa.Table:
    """Add ``part``'s totals into ``running`` (both one row per key after this)."""
    return _sum_by(part if running is None else pa.concat_tables([running, part]), key)


def _by_direction(keys: pa.Array, key: str, size: pa.Array, count: pa.Array, direction: pa.Array) -> pa.Table:
    """Rows of (key, bytes, packets, bytes_in, bytes_out) from a direction column."""
    zero = pa.scalar(0, pa.int64())
    return pa.table({
        key: keys, "bytes": size, "packets": count,
        "bytes_in": pc.if_else(pc.fill_null(pc.equal(direction, "in"), False), size, zero),
        "bytes_out": pc.if_else(pc.fill_null(pc.equal(direction, "out"), False), size, zero),
    })


def _accounts_of(warehouse: Warehouse, local: pa.Array, ts: pa.Array) -> pa.Array:
    """The account of each address under the mapping version in force at each packet's time."""
    accounts = load_accounts(warehouse.settings.accounts_file)
    versions = (NO_ACCOUNTS, *accounts.versions)
    starts = np.array([int(v.effective_from.timestamp() * 1_000_000) for v in accounts.versions], dtype=np.int64)
    which = np.searchsorted(starts, pc.cast(ts, pa.int64()).to_numpy(zero_copy_only=False), side="right")
    owner = np.empty(len(local), dtype=object)
    for index in np.unique(which):
        rows = np.flatnonzero(which == index)
        owner[rows] = versions[int(index)].lookup_many(local.take(pa.array(rows))).to_numpy(zero_copy_only=False)
    return pa.array(owner, pa.string())


def _raw_part(warehouse: Warehouse, hour: datetime, lo: datetime, hi: datetime, keys: list[str]) -> dict[str, pa.Table]:
    """Totals per key (each of ``keys``) of the on-time packets with ``lo <= ts < hi`` in one hour's raw
    detail, read once for all of them."""
    ts = pads.field("ts")
    stamp = pa.timestamp("us", tz="UTC")
    addresses = sorted({"local_ip" if key == "account" else key for key in keys})
    packets = warehouse.table("packets").read_arrow(
        keys=[hour], columns=["ts", *addresses, "bytes", "direction", "packets"],
        filter=(ts >= pa.scalar(lo, stamp)) & (ts < pa.scalar(hi, stamp))).combine_chunks()
    parts = {}
    for key in keys:
        column = packets.column("local_ip" if key == "account" else key)
        if key == "account":
            column = _accounts_of(warehouse, column.combine_chunks(), packets.column("ts"))
        parts[key] = _sum_by(_by_direction(column, key, packets.column("bytes"), weights(packets),
                                           packets.column("direction")), key)
    return parts


def _hourly_part(warehouse: Warehouse, hours: list[datetime], keys: list[str]) -> dict[str, pa.Table]:
    """Totals per key (each of ``keys``) of whole hours: their ``hourly`` rows, read once for the addresses,
    or their panes per account."""
    parts = {}
    if "account" in keys:
        panes = warehouse.table("panes").read_arrow(keys=hours, columns=["account", "direction", "bytes", "packets"])
        parts["account"] = _sum_by(_by_direction(panes.column("account"), "account", panes.column("bytes"),
                                                 panes.column("packets"), panes.column("direction")), "account")
    addresses = [key for key in keys if key != "account"]
    if addresses:
        rows = warehouse.table("hourly").read_arrow(keys=hours, columns=[*addresses, *TOTALS])
        parts.update({key: _sum_by(rows.select([key, *TOTALS]), key) for key in addresses})
    return parts


def top_talkers(warehouse: Warehouse, last: timedelta, by: str = "host", limit: int | None = 10) -> TopTalkers:
    """The ``limit`` keys with the most bytes in ``[W - last, W)`` (all keys when ``limit`` is None)."""
    return top_talkers_by(warehouse, last, (by,), limit)[by]


def top_talkers_by(warehouse: Warehouse, last: timedelta, bys, limit: int | None = 10) -> dict[str, TopTalkers]:
    """``top_talkers`` for several groupings at once (the report's hosts and peers): each part of the window
    is read once for all of them."""
    bys = list(dict.fromkeys(bys))
    unknown = [by for by in bys if by not in KEYS]
    if unknown:
        raise TopError(f"--by {unknown[0]!r}: choose one of {', '.join(KEYS)}")
    if last <= timedelta(0):
        raise TopError("--last must be a positive duration")
    watermark = read_clock_state(warehouse).watermark
    if watermark is None:
        raise TopError("no watermark yet: nothing has been ingested")
    keys = [KEYS[by] for by in bys]
    start, note = watermark - last, None
    kept_from = retention_floor(watermark, timedelta(hours=warehouse.settings.keep_hours))
    if start != hour_floor(start) and hour_floor(start) < kept_from:
        snapped = hour_ceil(start)
        note = (f"raw detail before {kept_from:%Y-%m-%d %H:%M} is not kept (keep_hours="
                f"{warehouse.settings.keep_hours}): the window starts at {snapped:%Y-%m-%d %H:%M} instead of "
                f"{start:%Y-%m-%d %H:%M:%S}")
        start = snapped
    first_whole = hour_ceil(start)
    whole_hours, raw_hours = [], []
    running: dict[str, pa.Table | None] = dict.fromkeys(keys)

    def fold(parts: dict[str, pa.Table]) -> None:
        for key, part in parts.items():
            running[key] = _fold(running[key], part, key)

    if start < first_whole:  # the partial hour at the start edge
        fold(_raw_part(warehouse, hour_floor(start), start, min(first_whole, watermark), keys))
        raw_hours.append(hour_floor(start))
    hour = first_whole
    while is_closed(hour, watermark):  # the whole hours, up to hour_floor(W), a UTC day per read
        until = min(period_end(day_start(hour.date()), "day"), hour_floor(watermark))
        hours = hours_between(hour, until)
        fold(_hourly_part(warehouse, hours, keys))
        whole_hours += hours
        hour = until
    if hour < watermark and first_whole <= hour:  # the partial hour at the end (W inside it)
        fold(_raw_part(warehouse, hour, hour, watermark, keys))
        raw_hours.append(hour)
    results = {}
    for by, key in zip(bys, keys):
        result = results[by] = TopTalkers(by=by, start=start, end=watermark, rows=[], keys=0, note=note,
                                          whole_hours=list(whole_hours), raw_hours=list(raw_hours))
        table = running[key]
        if table is None or table.num_rows == 0:
            continue
        ranked = table.sort_by([("bytes", "descending"), (key, "ascending")])
        result.keys = ranked.num_rows
        chosen = ranked if limit is None else ranked.slice(0, limit)
        result.rows = [{"key": r[key], **{c: r[c] for c in TOTALS}} for r in chosen.to_pylist()]
    return results


def talkers_table(result: TopTalkers) -> pa.Table:
    """A result's rows as a table for the machine formats: the key (named by what it is: ``local_ip``,
    ``remote_ip`` or ``account``), the totals, and the window ``[window_start, window_end)`` on every row."""
    stamp = pa.timestamp("us", tz="UTC")
    count = len(result.rows)
    return pa.table({KEYS[result.by]: pa.array([r["key"] for r in result.rows], pa.string()),
                     **{c: pa.array([r[c] for r in result.rows], pa.int64()) for c in TOTALS},
                     "window_start": pa.array([result.start] * count, stamp),
                     "window_end": pa.array([result.end] * count, stamp)})
