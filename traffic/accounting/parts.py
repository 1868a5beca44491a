"""Per-pair and per-pane partial totals as Arrow tables: what tasks leave and the driver sums.

Pure Arrow over plain tables (no Spark, no storage): ingest tasks, freeze tasks, the driver's
sums and the Spark transforms share these shapes and sums, so executor code needs nothing else.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traffic.core.periods import PANE_US  # noqa: F401 - panes and tests floor to it through this module

if TYPE_CHECKING:
    from traffic.storage.place import Place

_TS = pa.timestamp("us", tz="UTC")
#: Rows below which the driver sums hourly parts in one piece (splitting costs more than it saves).
PARALLEL_ROWS = 200_000

#: The amounts every per-pair total carries (hourly, daily, monthly rows and their parts).
AMOUNTS = ("bytes", "packets", "bytes_in", "bytes_out")
#: Per (fate, source, pane): rows, Σ packet weights (DESIGN §7a: a flow share stands for many packets)
#: and bytes, newest time.
SUMMARY = pa.schema([("fate", pa.string()), ("source", pa.string()), ("pane", _TS), ("records", pa.int64()),
                     ("packets", pa.int64()), ("bytes", pa.int64()), ("max_ts", _TS)])
HOURLY_PARTS = pa.schema([("hour", _TS), ("local_ip", pa.string()), ("remote_ip", pa.string()),
                          ("bytes", pa.int64()), ("packets", pa.int64()), ("bytes_in", pa.int64()),
                          ("bytes_out", pa.int64())])
#: Per-address pane parts, which ingest tasks left before they attributed panes themselves: a batch
#: interrupted after its first commit by an earlier version still has them (``ingest.writes.account_pane_parts``).
ADDRESS_PANE_PARTS = pa.schema([("pane_start", _TS), ("source", pa.string()), ("local_ip", pa.string()),
                                ("direction", pa.string()), ("bytes", pa.int64()), ("packets", pa.int64())])
REJECT_ROWS = pa.schema([("source", pa.string()), ("input_file", pa.string()), ("record", pa.string()),
                         ("reason", pa.string()), ("ts", _TS)])
#: Per hour, rows of the open and the recomputed side without an equal row on the other (a freeze's check).
DIFFERING = pa.schema([("hour", _TS), ("n", pa.int64())])
#: Pane totals per account (``panes.account_parts``), as ingest and freeze tasks leave them.
ACCOUNT_PARTS = pa.schema([("pane_start", _TS), ("source", pa.string()), ("account", pa.string()),
                           ("direction", pa.string()), ("mapping_version", pa.string()), ("bytes", pa.int64()),
                           ("packets", pa.int64())])
#: Per-hour Σ bytes and packets of raw detail (what a freeze task read, for the ledger's reconciliation),
#: and the bytes estimated from samples (rows with a sampling rate above 1).
RAW_SUMS = pa.schema([("hour", _TS), ("bytes", pa.int64()), ("packets", pa.int64()), ("estimated_bytes", pa.int64())])
#: What a telemetry task leaves: its source's state after the batch, and what it skipped (JSON documents).
TELEMETRY_STATE = pa.schema([("source", pa.string()), ("state", pa.string()), ("skipped", pa.string())])
#: Export sequence units lost per source and pane (``traffic.io.telemetry.LOST_SCHEMA``).
LOST = pa.schema([("source", pa.string()), ("pane_start", _TS), ("lost", pa.int64())])
_PARTS = {"summary": SUMMARY, "lost": LOST, "telemetry": TELEMETRY_STATE, "hourly": HOURLY_PARTS, "panes": ADDRESS_PANE_PARTS, "rejects": REJECT_ROWS, "raw": RAW_SUMS,
          "accounts": ACCOUNT_PARTS, "differing": DIFFERING}


def floor_to(ts: pa.Array | pa.ChunkedArray, unit_us: int) -> pa.Array:
    """Timestamps floored to a whole number of ``unit_us`` (an hour, a 5-minute pane); nulls stay null."""
    since_epoch = pc.cast(ts, pa.int64())
    if isinstance(since_epoch, pa.ChunkedArray):
        since_epoch = since_epoch.combine_chunks()
    mask = pc.is_null(since_epoch).to_numpy(zero_copy_only=False) if since_epoch.null_count else None
    values = pc.fill_null(since_epoch, 0).to_numpy()
    return pa.array(values // unit_us * unit_us, pa.int64(), mask=mask).cast(_TS)


class SumOverflow(ArithmeticError):
    """A sum of 64-bit amounts that would pass 2**63 − 1 (DESIGN §7a: all sums are overflow-checked)."""


_INT64_MAX = (1 << 63) - 1


def group_sums(table: pa.Table, keys: list[str], outputs: dict[str, tuple], schema: pa.Schema | None = None) -> pa.Table:
    """Group ``table`` by ``keys``; each output column is ``(input column, Arrow aggregation)``.

    Returns the keys then the outputs, in that order, cast to ``schema`` when given. Integer sums
    are checked: Arrow's sum wraps silently (two rows of 2**62 bytes sum to −9.2 EB), so a sum
    that would pass 64 bits raises ``SumOverflow`` with one line naming the group, never wraps.
    """
    risky = [column for column, how in outputs.values() if how == "sum" and _may_overflow(table, column)]
    if risky:  # rare: exact sums in 128-bit decimals, then back to 64 bits if they fit
        table = _as_decimals(table, risky)
    grouped = table.group_by(keys, use_threads=False).aggregate(list(outputs.values()))
    arrow_names = {"count_all" if column == [] else f"{column}_{how}": name for name, (column, how) in outputs.items()}
    grouped = grouped.rename_columns([arrow_names.get(c, c) for c in grouped.column_names]).select([*keys, *outputs])
    if risky:
        grouped = _back_to_int64(grouped, keys, [name for name, (column, how) in outputs.items()
                                                 if how == "sum" and column in risky])
    return grouped.select(schema.names).cast(schema) if schema is not None else grouped


def rows_of_groups_past_int64(table: pa.Table, keys: list[str], columns: list[str]) -> np.ndarray:
    """Which rows belong to a group (by ``keys``) whose sum of one of ``columns`` would pass 2**63 − 1:
    what ``group_sums`` would refuse to sum. A boolean mask; all False (cheaply) when no sum can."""
    risky = [column for column in columns if _may_overflow(table, column)]
    if not risky:
        return np.zeros(table.num_rows, dtype=bool)
    exact = _as_decimals(table.select([*keys, *risky]), risky)
    grouped = exact.group_by(keys, use_threads=False).aggregate([(column, "sum") for column in risky])
    over = None
    for column in risky:
        sums = grouped.column(f"{column}_sum")
        past = pc.greater(sums, pa.scalar(_INT64_MAX, sums.type))
        over = past if over is None else pc.or_(over, past)
    bad = grouped.filter(over).select(keys)
    if bad.num_rows == 0:
        return np.zeros(table.num_rows, dtype=bool)
    numbered = table.select(keys).append_column("_row", pa.array(np.arange(table.num_rows), pa.int64()))
    rows = numbered.join(bad, keys, join_type="left semi").column("_row").to_numpy()
    mask = np.zeros(table.num_rows, dtype=bool)
    mask[rows] = True
    return mask


def _may_overflow(table: pa.Table, column: str) -> bool:
    """Whether some group's sum of an integer column could pass 64 bits: only when the largest
    magnitude times the number of rows could (one pass; almost never true for real traffic)."""
    values = table.column(column)
    if not pa.types.is_integer(values.type) or table.num_rows < 2:
        return False
    low, high = pc.min_max(values).values()
    if low.as_py() is None:
        return False
    largest = max(abs(low.as_py()), abs(high.as_py()))
    return largest > 0 and table.num_rows > _INT64_MAX // largest


def _as_decimals(table: pa.Table, columns: list[str]) -> pa.Table:
    for column in columns:
        i = table.schema.get_field_index(column)
        table = table.set_column(i, column, table.column(column).cast(pa.decimal128(38, 0)))
    return table


def _back_to_int64(grouped: pa.Table, keys: list[str], columns: list[str]) -> pa.Table:
    """Exact sums back to 64-bit integers; ``SumOverflow`` names the first group whose sum does not fit."""
    for column in columns:
        sums = grouped.column(column)
        over = pc.or_(pc.greater(sums, pa.scalar(_INT64_MAX, sums.type)),
                      pc.less(sums, pa.scalar(-_INT64_MAX - 1, sums.type)))
        if pc.any(over).as_py():
            row = grouped.filter(over).slice(0, 1).to_pylist()[0]
            where = ", ".join(f"{k} {row[k]}" for k in keys)
            raise SumOverflow(f"the sum of {column} for {where or 'all rows'} is {row[column]}, past 2**63 − 1: "
                              "a 64-bit total would wrap, so nothing was summed (records too large to add up)")
        grouped = grouped.set_column(grouped.schema.get_field_index(column), column, sums.cast(pa.int64()))
    return grouped


def weights(packets: pa.Table) -> pa.Array:
    """How many packets each raw row stands for (DESIGN §7a): its ``packets`` column, 1 where that is
    null or absent (a packet header; rows written before weights existed)."""
    if "packets" not in packets.column_names:
        return pa.repeat(pa.scalar(1, pa.int64()), packets.num_rows)
    return pc.fill_null(packets.column("packets").cast(pa.int64()), 1)


def estimated_bytes(packets: pa.Table) -> pa.Array:
    """Each row's bytes if they are an estimate from samples (sampling rate above 1), else 0."""
    if "sampling_rate" not in packets.column_names:
        return pa.repeat(pa.scalar(0, pa.int64()), packets.num_rows)
    sampled = pc.fill_null(pc.greater(packets.column("sampling_rate"), 1), False)
    return pc.if_else(sampled, packets.column("bytes").cast(pa.int64()), pa.scalar(0, pa.int64()))


def with_direction_bytes(packets: pa.Table) -> pa.Table:
    """``bytes_in``/``bytes_out`` per packet: known directions only (so in + out <= bytes)."""
    zero = pa.scalar(0, pa.int64())
    direction, amount = packets.column("direction"), packets.column("bytes")
    def only(value: str):
        return pc.if_else(pc.fill_null(pc.equal(direction, value), False), amount, zero)

    return packets.append_column("bytes_in", only("in")).append_column("bytes_out", only("out"))


def hourly_parts(packets: pa.Table) -> pa.Table:
    """Per (hour, local_ip, remote_ip) totals of on-time packets."""
    table = with_direction_bytes(packets.select(["hour", "local_ip", "remote_ip", "bytes", "direction"]))
    return group_sums(table.append_column("weight", weights(packets)), ["hour", "local_ip", "remote_ip"],
                      {"bytes": ("bytes", "sum"), "packets": ("weight", "sum"), "bytes_in": ("bytes_in", "sum"),
                       "bytes_out": ("bytes_out", "sum")}, HOURLY_PARTS)


def part_path(scratch: Place, what: str, chunk: int, attempt: int) -> Place:
    """Where a task leaves one kind of part in a job's scratch folder (local, or on the warehouse's store)."""
    return scratch / f"{what}-c{chunk:05d}-a{attempt}.arrow"


def file_part(chunk: int, attempt: int) -> str:
    """The name every parquet file a task writes carries (one per cluster key)."""
    return f"part-c{chunk:05d}-a{attempt}"


def save_part(scratch: Place, what: str, chunk: int, attempt: int, table: pa.Table) -> None:
    """Leave one kind of part of one task in the scratch folder (read back with ``read_parts``)."""
    import pyarrow.feather as feather

    place = part_path(scratch, what, chunk, attempt)
    if place.is_local:
        feather.write_feather(table.cast(_PARTS[what]), place.uri, compression="uncompressed")
        return
    with place.open_output() as stream:  # on a store the object appears whole when the stream closes
        feather.write_feather(table.cast(_PARTS[what]), stream, compression="uncompressed")


def has_parts(scratch: Place, what: str, attempts: dict[int, int]) -> bool:
    """Whether every chunk's final attempt left this kind of part."""
    return all(part_path(scratch, what, chunk, attempt).exists() for chunk, attempt in attempts.items())


def read_parts(scratch: Place, what: str, attempts: dict[int, int]) -> pa.Table:
    """One kind of part left by the tasks, from each chunk's final attempt."""
    import pyarrow.feather as feather

    places = [part_path(scratch, what, chunk, attempt) for chunk, attempt in sorted(attempts.items())]
    tables = [feather.read_table(place.uri) if place.is_local else feather.read_table(place.read_bytes_buffer())
              for place in places]
    return pa.concat_tables([t.cast(_PARTS[what]) for t in tables]) if tables else _PARTS[what].empty_table()


def combine_summary(parts: pa.Table) -> pa.Table:
    """Per (fate, source, pane) summary of the whole batch from the tasks' summaries."""
    return group_sums(parts, ["fate", "source", "pane"],
                      {"records": ("records", "sum"), "packets": ("packets", "sum"), "bytes": ("bytes", "sum"),
                       "max_ts": ("max_ts", "max")}, SUMMARY)


def sum_hourly(rows: pa.Table, status: str, threads: int = 1) -> pa.Table:
    """Per (hour, local_ip, remote_ip) sums of hourly rows or parts, as ``hourly`` rows with ``status``.

    With ``threads`` > 1 (the driver), contiguous ranges of hours of about equal rows are summed
    apart, at once: each hash table holds a few hours' pairs, not the batch's millions (8 hours of
    ~670 k pairs each: 1.1 s instead of 3.9 s on 2 cores). A key never spans two ranges, so the
    sums are the same.
    """
    pieces = _hour_ranges(rows, 8 * threads) if threads > 1 and rows.num_rows >= PARALLEL_ROWS else []
    if len(pieces) > 1:
        with ThreadPoolExecutor(threads) as pool:
            return pa.concat_tables(list(pool.map(lambda mask: _sum_hourly(rows.filter(mask), status), pieces)))
    return _sum_hourly(rows, status)


def _sum_hourly(rows: pa.Table, status: str) -> pa.Table:
    grouped = group_sums(rows, ["hour", "local_ip", "remote_ip"],
                         {c: (c, "sum") for c in AMOUNTS})
    return grouped.append_column("day", pc.cast(grouped.column("hour"), pa.date32())) \
                  .append_column("status", pa.repeat(pa.scalar(status), grouped.num_rows))


def _hour_ranges(rows: pa.Table, pieces: int) -> list[pa.Array]:
    """Masks splitting ``rows`` into at most ``pieces`` ranges of whole hours of about equal rows (rows
    without an hour are a piece of their own); every row is in exactly one."""
    hour = pc.cast(rows.column("hour"), pa.int64())
    counts = pc.value_counts(pc.drop_null(hour))
    values = counts.field("values").to_numpy()
    order = np.argsort(values)
    values, sizes = values[order], counts.field("counts").to_numpy()[order]
    # Cut where the running count passes each multiple of total / pieces.
    ends = np.searchsorted(np.cumsum(sizes), np.arange(1, pieces) * sizes.sum() / pieces, side="right")
    bounds = sorted({0, *ends.tolist(), len(values)})
    masks = []
    for lo, hi in zip(bounds, bounds[1:]):
        if hi > lo:
            masks.append(pc.and_(pc.greater_equal(hour, int(values[lo])), pc.less_equal(hour, int(values[hi - 1]))))
    if hour.null_count:
        masks.append(pc.is_null(hour))
    return masks
