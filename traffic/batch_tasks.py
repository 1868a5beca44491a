"""What one ingest task does on an executor, and how the driver sums what the tasks leave.

A task is handed one chunk of one inbox file and the batch's time rules. It parses the chunk
to Arrow, gives every record its fate (DESIGN §3: on time, late, tick, late tick, rejected,
outside a replay's range), writes the on-time and late packets as parquet straight into the
tables' staged folders, and leaves the small things the driver needs as Arrow files in the
batch's scratch folder: the per (fate, source, pane) summary, the hourly and per-address pane
partial totals of its on-time packets, and its rejects. One row per task crosses into the JVM.

The history bound needs the batch's newest record, which no task knows alone, so the first
pass judges without it and reports each chunk's oldest record that the bound could reject;
the driver runs again only the chunks that hold a record older than the bound (rare: a
batch spanning more than ``max_history``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traffic.clock import micros
from traffic.records import MAX_REASON_CHARS, PARSED_SCHEMA

ON_TIME = "packet"
LATE = "late"
TICK = "tick"
LATE_TICK = "late_tick"
REJECT = "reject"
OUTSIDE = "outside"  # replay: a record outside the replayed time range (not counted by this run)

# Codes of the fate chain, first match wins; two extra codes tell the sanity-bound rejects apart.
_REJECTED, _OUTSIDE, _TOO_NEW, _TOO_OLD, _LATE_TICK, _TICK, _LATE, _ON_TIME = range(8)
_FATE_NAMES = pa.array([REJECT, OUTSIDE, REJECT, REJECT, LATE_TICK, TICK, LATE, ON_TIME], pa.string())
_HOUR_US = 3_600_000_000
_PANE_US = 300_000_000
_TS = pa.timestamp("us", tz="UTC")
NO_TIME = np.iinfo(np.int64).min

_DDL_TYPES = {pa.int32(): "int", pa.int64(): "long", pa.string(): "string"}
#: Why a chunk counted nothing (its whole file is then left out of the batch and recorded).
VANISHED, CHANGED_SINCE_PLANNED, UNREADABLE = "vanished", "changed", "unreadable"

#: The amounts every per-pair total carries (hourly, daily, monthly rows and their parts).
AMOUNTS = ("bytes", "packets", "bytes_in", "bytes_out")
#: What each task returns to the driver (through Spark), one row per chunk; times in epoch microseconds.
#: ``problem``: why the chunk's planned bytes could not be read (then it counted nothing), or null.
OUTCOME = pa.schema([("chunk", pa.int32()), ("attempt", pa.int32()), ("newest", pa.int64()), ("oldest", pa.int64()),
                     ("problem", pa.string())])
OUTCOME_DDL = ", ".join(f"{f.name} {_DDL_TYPES[f.type]}" for f in OUTCOME)
SUMMARY = pa.schema([("fate", pa.string()), ("source", pa.string()), ("pane", _TS), ("records", pa.int64()),
                     ("bytes", pa.int64()), ("max_ts", _TS)])
HOURLY_PARTS = pa.schema([("hour", _TS), ("local_ip", pa.string()), ("remote_ip", pa.string()),
                          ("bytes", pa.int64()), ("packets", pa.int64()), ("bytes_in", pa.int64()),
                          ("bytes_out", pa.int64())])
PANE_PARTS = pa.schema([("pane_start", _TS), ("source", pa.string()), ("local_ip", pa.string()),
                        ("direction", pa.string()), ("bytes", pa.int64()), ("packets", pa.int64())])
REJECT_ROWS = pa.schema([("source", pa.string()), ("input_file", pa.string()), ("record", pa.string()),
                         ("reason", pa.string()), ("ts", _TS)])
#: Per hour, rows of the open and the recomputed side without an equal row on the other (a freeze's check).
DIFFERING = pa.schema([("hour", _TS), ("n", pa.int64())])
#: Pane parts attributed to accounts (``panes.attributed_parts``), as freeze tasks leave them.
ACCOUNT_PARTS = pa.schema([("pane_start", _TS), ("source", pa.string()), ("account", pa.string()),
                           ("direction", pa.string()), ("mapping_version", pa.string()), ("bytes", pa.int64()),
                           ("packets", pa.int64())])
#: Per-hour Σ bytes and rows of raw detail (what a freeze task read, for the ledger's reconciliation).
RAW_SUMS = pa.schema([("hour", _TS), ("bytes", pa.int64()), ("packets", pa.int64())])
_PARTS = {"summary": SUMMARY, "hourly": HOURLY_PARTS, "panes": PANE_PARTS, "rejects": REJECT_ROWS, "raw": RAW_SUMS,
          "accounts": ACCOUNT_PARTS, "differing": DIFFERING}


@dataclass(frozen=True)
class Rules:
    """Everything a task needs to judge and write its chunk (pickled to the executors)."""

    batch_id: int
    watermark_before: datetime | None
    future_limit: datetime
    history_floor: datetime | None  # None on the first pass
    time_range: tuple[datetime, datetime] | None
    packets: object | None  # delta.Staged for on-time packets, or None when they are already committed
    late_packets: object | None
    scratch: str
    settings_doc: dict
    attempt: int = 0


def history_floor(newest: datetime | None, max_history: timedelta) -> datetime | None:
    """The oldest time a record may have in a batch whose newest record is ``newest``."""
    return newest - max_history if newest is not None else None


def _stamp(ts: pa.Array) -> pa.Array:
    """``2026-05-04T03:00:05.000123Z``: the text rejects and late reasons quote a time in."""
    return pc.strftime(ts, format="%Y-%m-%dT%H:%M:%SZ")


def fates(parsed: pa.Table, rules: Rules) -> np.ndarray:
    """The fate code of every parsed row (see ``_FATE_NAMES``); lateness uses the watermark from before the batch."""
    kind = parsed.column("kind")
    ts = pc.fill_null(pc.cast(parsed.column("ts"), pa.int64()), NO_TIME).to_numpy()
    has_ts = ts != NO_TIME
    rejected = pc.equal(kind, REJECT).to_numpy(zero_copy_only=False)
    tick = pc.equal(kind, TICK).to_numpy(zero_copy_only=False)
    none = np.zeros(len(ts), dtype=bool)
    outside = none
    if rules.time_range:
        start, end = (micros(t) for t in rules.time_range)
        outside = has_ts & ((ts < start) | (ts >= end))
    too_new = has_ts & (ts > micros(rules.future_limit))
    too_old = has_ts & (ts < micros(rules.history_floor)) if rules.history_floor is not None else none
    closed = none
    if rules.watermark_before is not None:
        closed = has_ts & (ts // _HOUR_US * _HOUR_US + _HOUR_US <= micros(rules.watermark_before))
    return np.select(
        [rejected, outside, too_new, too_old, tick & closed, tick, closed],
        [_REJECTED, _OUTSIDE, _TOO_NEW, _TOO_OLD, _LATE_TICK, _TICK, _LATE], _ON_TIME).astype(np.int8)


def floor_to(ts: pa.Array | pa.ChunkedArray, unit_us: int) -> pa.Array:
    """Timestamps floored to a whole number of ``unit_us`` (an hour, a 5-minute pane); nulls stay null."""
    since_epoch = pc.cast(ts, pa.int64())
    if isinstance(since_epoch, pa.ChunkedArray):
        since_epoch = since_epoch.combine_chunks()
    mask = pc.is_null(since_epoch).to_numpy(zero_copy_only=False) if since_epoch.null_count else None
    values = pc.fill_null(since_epoch, 0).to_numpy()
    return pa.array(values // unit_us * unit_us, pa.int64(), mask=mask).cast(_TS)


def judge(parsed: pa.Table, rules: Rules, code: np.ndarray | None = None) -> dict[str, pa.Table]:
    """Split a parsed chunk by fate: ``packets``, ``late``, ``rejects`` rows and the ``summary``."""
    code = fates(parsed, rules) if code is None else code
    ts = parsed.column("ts")
    hour = floor_to(ts, _HOUR_US)
    with_hour = parsed.append_column("hour", hour)
    pane = floor_to(ts, _PANE_US)
    fate = _FATE_NAMES.take(pa.array(code))
    summary = pa.table({"fate": fate, "source": parsed.column("source"), "pane": pane,
                        "bytes": pc.fill_null(parsed.column("bytes"), 0), "ts": ts})
    summary = group_sums(summary, ["fate", "source", "pane"],
                         {"records": ([], "count_all"), "bytes": ("bytes", "sum"), "max_ts": ("ts", "max")}, SUMMARY)

    # (A chunk that is all on time, the usual case, is not copied.)
    on_time = with_hour if (code == _ON_TIME).all() else with_hour.filter(pa.array(code == _ON_TIME))
    late = with_hour.filter(pa.array(code == _LATE)) if (code == _LATE).any() else with_hour.schema.empty_table()
    if late.num_rows:
        closed = f" was closed (watermark {rules.watermark_before.isoformat() if rules.watermark_before else ''})"
        late = late.append_column("late_reason", pc.binary_join_element_wise(
            "hour ", pc.strftime(late.column("hour"), format="%Y-%m-%dT%H:00Z"), closed, ""))
    rejects = _reject_rows(parsed, code, rules)
    return {"packets": on_time, "late": late, "rejects": rejects, "summary": summary}


def group_sums(table: pa.Table, keys: list[str], outputs: dict[str, tuple], schema: pa.Schema | None = None) -> pa.Table:
    """Group ``table`` by ``keys``; each output column is ``(input column, Arrow aggregation)``.

    Returns the keys then the outputs, in that order, cast to ``schema`` when given.
    """
    grouped = table.group_by(keys, use_threads=False).aggregate(list(outputs.values()))
    arrow_names = {"count_all" if column == [] else f"{column}_{how}": name for name, (column, how) in outputs.items()}
    grouped = grouped.rename_columns([arrow_names.get(c, c) for c in grouped.column_names]).select([*keys, *outputs])
    return grouped.select(schema.names).cast(schema) if schema is not None else grouped


def _reject_rows(parsed: pa.Table, code: np.ndarray, rules: Rules) -> pa.Table:
    """Rejected rows with the reason a person reads; a sanity-bound reject keeps its record as text."""
    picked = np.flatnonzero((code == _REJECTED) | (code == _TOO_NEW) | (code == _TOO_OLD))
    if len(picked) == 0:
        return REJECT_ROWS.empty_table()
    rows = parsed.take(pa.array(picked))
    which = pa.array(code[picked])
    stamp = _stamp(rows.column("ts"))
    floor = rules.history_floor.isoformat() if rules.history_floor else ""
    too_new = pc.binary_join_element_wise(
        "time ", stamp, " is more than the allowed future skew ahead of this machine's clock (limit "
        f"{rules.future_limit.isoformat()})", "")
    too_old = pc.binary_join_element_wise(
        "time ", stamp, f" is more than max_history behind the newest record of its batch (floor {floor})", "")
    reason = pc.if_else(pc.equal(which, _TOO_NEW), too_new,
                        pc.if_else(pc.equal(which, _TOO_OLD), too_old, rows.column("reason")))
    reason = pc.utf8_slice_codeunits(reason, 0, MAX_REASON_CHARS)  # whatever a reader quoted, a reason stays short
    as_text = [rows.column(c).cast(pa.string()) for c in
               ("source", "local_ip", "remote_ip", "local_port", "remote_port", "protocol", "bytes", "direction")]
    record = pc.coalesce(rows.column("record"),
                         pc.binary_join_element_wise(stamp, *as_text, ",", null_handling="skip"))
    return pa.table({"source": rows.column("source"), "input_file": rows.column("input_file"), "record": record,
                     "reason": reason, "ts": rows.column("ts")}, schema=REJECT_ROWS)


def with_direction_bytes(packets: pa.Table) -> pa.Table:
    """``bytes_in``/``bytes_out`` per packet: known directions only (so in + out <= bytes)."""
    zero = pa.scalar(0, pa.int64())
    direction, amount = packets.column("direction"), packets.column("bytes")
    def only(value: str):
        return pc.if_else(pc.fill_null(pc.equal(direction, value), False), amount, zero)

    return packets.append_column("bytes_in", only("in")).append_column("bytes_out", only("out"))


def hourly_parts(packets: pa.Table) -> pa.Table:
    """Per (hour, local_ip, remote_ip) totals of on-time packets."""
    return group_sums(with_direction_bytes(packets), ["hour", "local_ip", "remote_ip"],
                      {"bytes": ("bytes", "sum"), "packets": ([], "count_all"), "bytes_in": ("bytes_in", "sum"),
                       "bytes_out": ("bytes_out", "sum")}, HOURLY_PARTS)


def pane_parts(packets: pa.Table) -> pa.Table:
    """Per (pane, source, local_ip, direction) totals of on-time packets (attributed to accounts later)."""
    table = pa.table({"pane_start": floor_to(packets.column("ts"), _PANE_US), "source": packets.column("source"),
                      "local_ip": packets.column("local_ip"), "direction": packets.column("direction"),
                      "bytes": packets.column("bytes")})
    return group_sums(table, ["pane_start", "source", "local_ip", "direction"],
                      {"bytes": ("bytes", "sum"), "packets": ([], "count_all")}, PANE_PARTS)


def part_path(scratch: str, what: str, chunk: int, attempt: int) -> Path:
    return Path(scratch) / f"{what}-c{chunk:05d}-a{attempt}.arrow"


def file_part(chunk: int, attempt: int) -> str:
    """The name every parquet file a task writes carries (one per cluster key)."""
    return f"part-c{chunk:05d}-a{attempt}"


def run_chunk(row: dict, rules: Rules, settings) -> dict:
    """Parse, judge and write one chunk; returns its outcome row.

    The task reads exactly the bytes its plan names and checks their sha256 first: a file that
    vanished, became unreadable or changed since it was planned counts nothing (``problem``).
    Whatever a reader raises on the bytes becomes one reject for the chunk, never a failed task.
    """
    from traffic.delta import write_staged
    from traffic.inbox import PieceChanged, read_piece
    from traffic.readers import CAPTURE, CSV_HEADER, parse_bytes, unreadable_chunk

    own = None
    try:
        if row["format"] == CAPTURE:
            # The whole capture from its file header (an appended tail has none), of which this task
            # decodes the frames that start in its range.
            data = read_piece(row["path"], 0, row["file_end"], row["sha256"])
            own = (row["start"], row["end"])
        else:
            data = read_piece(row["path"], row["start"], row["end"], row["sha256"])
            if row["format"] == CSV_HEADER and row.get("header"):
                data = row["header"].encode() + b"\n" + data  # an appended tail is read under its file's header
    except PieceChanged:
        return _unread(row, rules, CHANGED_SINCE_PLANNED)
    except FileNotFoundError:
        return _unread(row, rules, VANISHED)
    except OSError as error:
        return _unread(row, rules, f"{UNREADABLE}: {error.strerror or type(error).__name__}")
    try:
        parsed = parse_bytes(data, row["format"], source=row["source"], input_file=row["name"], settings=settings,
                             own=own).cast(PARSED_SCHEMA)
    except Exception as error:  # noqa: BLE001 - a reader's failure on hostile bytes must not stop the batch
        parsed = unreadable_chunk(row, error)
    del data
    code = fates(parsed, rules)
    parts = judge(parsed, rules, code)
    packets = parts["packets"].append_column("batch_id", pa.repeat(pa.scalar(rules.batch_id, pa.int64()),
                                                                    parts["packets"].num_rows))
    name = file_part(row["chunk"], rules.attempt)
    if rules.packets is not None and packets.num_rows:
        write_staged(packets, rules.packets, name)
    if rules.late_packets is not None and parts["late"].num_rows:
        late = parts["late"]
        write_staged(late.append_column("batch_id", pa.repeat(pa.scalar(rules.batch_id, pa.int64()), late.num_rows)),
                     rules.late_packets, name)
    _save(rules, "summary", row["chunk"], parts["summary"])
    _save(rules, "hourly", row["chunk"], hourly_parts(packets))
    _save(rules, "panes", row["chunk"], pane_parts(packets))
    _save(rules, "rejects", row["chunk"], parts["rejects"])
    # What the driver needs for the history bound: the newest record the bound is measured from
    # (not rejected, not too far in the future) and the oldest record the bound could reject.
    # (On the first pass, judged without a history floor, no record is too old yet.)
    ts = pc.fill_null(pc.cast(parsed.column("ts"), pa.int64()), NO_TIME).to_numpy()
    readable = (code != _REJECTED) & (ts != NO_TIME)
    anchors = ts[readable & (ts <= micros(rules.future_limit))]
    candidates = ts[readable & (code != _OUTSIDE) & (code != _TOO_NEW)]
    return {"chunk": row["chunk"], "attempt": rules.attempt,
            "newest": int(anchors.max()) if len(anchors) else None,
            "oldest": int(candidates.min()) if len(candidates) else None, "problem": None}


def _unread(row: dict, rules: Rules, problem: str) -> dict:
    """The outcome of a chunk whose planned bytes could not be read: empty parts, and why."""
    for what in ("summary", "hourly", "panes", "rejects"):
        _save(rules, what, row["chunk"], _PARTS[what].empty_table())
    return {"chunk": row["chunk"], "attempt": rules.attempt, "newest": None, "oldest": None, "problem": problem}


def _save(rules: Rules, what: str, chunk: int, table: pa.Table) -> None:
    save_part(rules.scratch, what, chunk, rules.attempt, table)


def save_part(scratch: str, what: str, chunk: int, attempt: int, table: pa.Table) -> None:
    """Leave one kind of part of one task in the scratch folder (read back with ``read_parts``)."""
    import pyarrow.feather as feather

    feather.write_feather(table.cast(_PARTS[what]), str(part_path(scratch, what, chunk, attempt)),
                          compression="uncompressed")


def task_function(rules: Rules, chunk_rows: list[dict]):
    """The function Spark runs per task (``mapInArrow`` over ``spark.range``): each id is the index of
    a chunk row (carried in the function itself), and yields that chunk's outcome row."""

    def run(batches):
        from traffic.settings import build_settings

        settings = build_settings(rules.settings_doc)
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield pa.RecordBatch.from_pylist([run_chunk(chunk_rows[index], rules, settings)], schema=OUTCOME)

    return run


def read_parts(scratch: str, what: str, attempts: dict[int, int]) -> pa.Table:
    """One kind of part left by the tasks, from each chunk's final attempt."""
    import pyarrow.feather as feather

    tables = [feather.read_table(str(part_path(scratch, what, chunk, attempt)))
              for chunk, attempt in sorted(attempts.items())]
    return pa.concat_tables([t.cast(_PARTS[what]) for t in tables]) if tables else _PARTS[what].empty_table()


def combine_summary(parts: pa.Table) -> pa.Table:
    """Per (fate, source, pane) summary of the whole batch from the tasks' summaries."""
    return group_sums(parts, ["fate", "source", "pane"],
                      {"records": ("records", "sum"), "bytes": ("bytes", "sum"), "max_ts": ("max_ts", "max")}, SUMMARY)


def sum_hourly(rows: pa.Table, status: str) -> pa.Table:
    """Per (hour, local_ip, remote_ip) sums of hourly rows or parts, as ``hourly`` rows with ``status``."""
    grouped = group_sums(rows, ["hour", "local_ip", "remote_ip"],
                         {c: (c, "sum") for c in AMOUNTS})
    return grouped.append_column("day", pc.cast(grouped.column("hour"), pa.date32())) \
                  .append_column("status", pa.repeat(pa.scalar(status), grouped.num_rows))
