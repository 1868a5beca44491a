"""What one ingest task does on an executor, and how the driver sums what the tasks leave.

A task is handed one chunk of one inbox file and the batch's time rules. It parses the chunk
to Arrow, gives every record its fate (DESIGN §3: on time, late, tick, late tick, rejected,
outside a replay's range), writes the on-time and late packets as parquet straight into the
tables' staged folders, and leaves the small things the driver needs as Arrow files in the
batch's scratch folder: the per (fate, source, pane) summary, the hourly partial totals of its
on-time packets and their pane totals attributed to accounts, and its rejects. One row per task crosses into the JVM.

The history bound needs the batch's newest record, which no task knows alone, so the first
pass judges without it and reports each chunk's oldest record that the bound could reject;
the driver runs again only the chunks that hold a record older than the bound (rare: a
batch spanning more than ``max_history``).

The task's sums are overflow-checked (``parts.group_sums``): records are bounded one by one when
they are read (``io.telemetry``: weights that would pass 63 bits are rejects), and the packets of a
group whose sum would still pass 2**63 − 1 (a source's pane, a pair's hour: what the task sums)
are rejects with that reason, before anything is summed (``reject_sums_past_int64``): the rest of
the chunk counts, and the file does not stop every later batch. (The driver's sums across tasks
and with the open rows of earlier batches still stop the batch with one line, ``SumOverflow``.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traffic.accounting.panes import Mapping, account_parts
from traffic.accounting.parts import (SUMMARY, REJECT_ROWS, TELEMETRY_STATE, _PARTS, file_part, floor_to, group_sums, hourly_parts,
                                      rows_of_groups_past_int64, save_part, weights)
from traffic.core.periods import HOUR_US, PANE_US, late_mask, micros
from traffic.core.records import MAX_REASON_CHARS, PACKET, PARSED_SCHEMA, REJECT as REJECT_KIND
from traffic.storage.staging import write_staged
from traffic.storage.place import Place
from traffic.io.files import PieceChanged, read_piece
from traffic.io.readers import CAPTURE, CSV_HEADER, FLOWS, parse_bytes, unreadable_chunk
from traffic.io.telemetry import LOST_SCHEMA, TelemetryRules, TelemetryState, read_telemetry
from traffic.core.settings import build_settings

ON_TIME = "packet"
LATE = "late"
TICK = "tick"
LATE_TICK = "late_tick"
REJECT = "reject"
OUTSIDE = "outside"  # replay: a record outside the replayed time range (not counted by this run)

# Codes of the fate chain, first match wins; two extra codes tell the sanity-bound rejects apart.
_REJECTED, _OUTSIDE, _TOO_NEW, _TOO_OLD, _LATE_TICK, _TICK, _LATE, _ON_TIME = range(8)
_FATE_NAMES = pa.array([REJECT, OUTSIDE, REJECT, REJECT, LATE_TICK, TICK, LATE, ON_TIME], pa.string())
_TS = pa.timestamp("us", tz="UTC")
NO_TIME = np.iinfo(np.int64).min

_DDL_TYPES = {pa.int32(): "int", pa.int64(): "long", pa.string(): "string"}
#: Why a chunk counted nothing (its whole file is then left out of the batch and recorded).
VANISHED, CHANGED_SINCE_PLANNED, UNREADABLE = "vanished", "changed", "unreadable"

#: What each task returns to the driver (through Spark), one row per chunk; times in epoch microseconds.
#: ``problem``: why the chunk's planned bytes could not be read (then it counted nothing), or null.
OUTCOME = pa.schema([("chunk", pa.int32()), ("attempt", pa.int32()), ("newest", pa.int64()), ("oldest", pa.int64()),
                     ("problem", pa.string())])
OUTCOME_DDL = ", ".join(f"{f.name} {_DDL_TYPES[f.type]}" for f in OUTCOME)


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
    scratch: Place
    settings_doc: dict
    flow_states: dict = field(default_factory=dict)  # telemetry state per source before the batch (JSON)
    attempt: int = 0
    #: The accounts file the batch's open panes are attributed with (none: every address ``unassigned``).
    mapping: Mapping = field(default_factory=Mapping)
    #: An inbox on object storage: its ``ObjectLocation``, so the task reaches the store as the driver does.
    inbox: object | None = None

    def __post_init__(self):
        object.__setattr__(self, "scratch", Place.of(self.scratch))  # a folder's path given: the place it names


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
    closed = has_ts & late_mask(ts, rules.watermark_before)
    return np.select(
        [rejected, outside, too_new, too_old, tick & closed, tick, closed],
        [_REJECTED, _OUTSIDE, _TOO_NEW, _TOO_OLD, _LATE_TICK, _TICK, _LATE], _ON_TIME).astype(np.int8)


def split_by_fate(parsed: pa.Table, rules: Rules, code: np.ndarray | None = None) -> dict[str, pa.Table]:
    """Split a parsed chunk by fate: ``packets``, ``late``, ``rejects`` rows and the ``summary``."""
    code = fates(parsed, rules) if code is None else code
    ts = parsed.column("ts")
    hour = floor_to(ts, HOUR_US)
    with_hour = parsed.append_column("hour", hour)
    pane = floor_to(ts, PANE_US)
    fate = _FATE_NAMES.take(pa.array(code))
    is_packet = pc.equal(parsed.column("kind"), PACKET)
    summary = pa.table({"fate": fate, "source": parsed.column("source"), "pane": pane,
                        "weight": pc.if_else(is_packet, weights(parsed), 0),
                        "bytes": pc.fill_null(parsed.column("bytes"), 0), "ts": ts})
    summary = group_sums(summary, ["fate", "source", "pane"],
                         {"records": ([], "count_all"), "packets": ("weight", "sum"), "bytes": ("bytes", "sum"),
                          "max_ts": ("ts", "max")}, SUMMARY)
    # Raw rows carry their weight and sampling rate explicitly (1 for a packet header).
    with_hour = with_hour.set_column(with_hour.schema.get_field_index("packets"), "packets", weights(parsed)) \
                         .set_column(with_hour.schema.get_field_index("sampling_rate"), "sampling_rate",
                                     pc.fill_null(parsed.column("sampling_rate"), pa.scalar(1, pa.int32())))

    # (A chunk that is all on time, the usual case, is not copied.)
    on_time = with_hour if (code == _ON_TIME).all() else with_hour.filter(pa.array(code == _ON_TIME))
    late = with_hour.filter(pa.array(code == _LATE)) if (code == _LATE).any() else with_hour.schema.empty_table()
    if late.num_rows:
        closed = f" was closed (watermark {rules.watermark_before.isoformat() if rules.watermark_before else ''})"
        late = late.append_column("late_reason", pc.binary_join_element_wise(
            "hour ", pc.strftime(late.column("hour"), format="%Y-%m-%dT%H:00Z"), closed, ""))
    rejects = _reject_rows(parsed, code, rules)
    return {"packets": on_time, "late": late, "rejects": rejects, "summary": summary}


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


#: What the task sums its packets by (``split_by_fate``'s summary, ``hourly_parts``; an account's pane
#: is part of its source's), each with the words a reject names it by.
#: The pair first: its records are the ones to blame; a source's pane is checked without them.
_SUMMED_BY = ((("hour", "local_ip", "remote_ip"), "the pair's total for the hour"),
              (("source", "pane"), "the source's total for the pane"))


def reject_sums_past_int64(parsed: pa.Table) -> pa.Table:
    """``parsed`` with the packets of every group whose sum the task could not hold made rejects.

    DESIGN §7a: all sums are overflow-checked, and one bad record costs at most itself. A record
    is bounded when read (its weighted bytes fit 63 bits), but two records of 2**62 bytes for the
    same pair and hour do not add up in 64 bits. Such a group's packets become rejects ("the
    pair's total for the hour would pass 2**63 − 1 bytes"), each keeping its record as text; the
    other rows of the chunk count as before, so the file is counted, not retried for ever.
    """
    is_packet = pc.fill_null(pc.equal(parsed.column("kind"), PACKET), False)
    if parsed.num_rows < 2 or not pc.any(is_packet).as_py():
        return parsed
    ts = parsed.column("ts")
    amounts = pa.table({"source": parsed.column("source"), "pane": floor_to(ts, PANE_US),
                        "hour": floor_to(ts, HOUR_US), "local_ip": parsed.column("local_ip"),
                        "remote_ip": parsed.column("remote_ip"),
                        "bytes": pc.if_else(is_packet, pc.fill_null(parsed.column("bytes"), 0), 0),
                        "packets": pc.if_else(is_packet, weights(parsed), 0)})
    reason = pa.nulls(parsed.num_rows, pa.string())
    bad = np.zeros(parsed.num_rows, dtype=bool)
    for keys, words in _SUMMED_BY:
        for unit in ("bytes", "packets"):
            past = rows_of_groups_past_int64(amounts, list(keys), [unit]) & ~bad
            if past.any():
                reason = pc.if_else(pa.array(past), pa.scalar(f"{words} would pass 2**63 − 1 {unit}: a 64-bit "
                                                              "sum cannot hold it, so this record is not counted"),
                                    reason)
                bad |= past
                for column in ("bytes", "packets"):  # (the rows rejected add nothing to the next check)
                    amounts = amounts.set_column(amounts.schema.get_field_index(column), column,
                                                 pc.if_else(pa.array(bad), 0, amounts.column(column)))
    bad &= is_packet.to_numpy(zero_copy_only=False)
    if not bad.any():
        return parsed
    mask = pa.array(bad)
    as_text = [parsed.column(c).cast(pa.string()) for c in ("source", "local_ip", "remote_ip", "local_port",
                                                             "remote_port", "protocol", "bytes", "packets")]
    record = pc.coalesce(parsed.column("record"), pc.binary_join_element_wise(
        pc.strftime(ts, format="%Y-%m-%dT%H:%M:%SZ"), *as_text, ",", null_handling="skip"))
    changes = {"kind": pc.if_else(mask, REJECT_KIND, parsed.column("kind")),
               "reason": pc.if_else(mask, reason, parsed.column("reason")),
               "record": pc.if_else(mask, record, parsed.column("record")),
               # (a reject adds nothing: its amounts would overflow the reject summary's sum the same way)
               "bytes": pc.if_else(mask, pa.scalar(None, pa.int64()), parsed.column("bytes")),
               "packets": pc.if_else(mask, pa.scalar(None, pa.int64()), parsed.column("packets"))}
    for name, column in changes.items():
        parsed = parsed.set_column(parsed.schema.get_field_index(name), name, column)
    return parsed


def run_chunk(row: dict, rules: Rules, settings) -> dict:
    """Parse, judge and write one chunk; returns its outcome row.

    The task reads exactly the bytes its plan names and checks their sha256 first: a file that
    vanished, became unreadable or changed since it was planned counts nothing (``problem``).
    Whatever a reader raises on the bytes becomes one reject for the chunk, never a failed task.
    """

    own = None
    telemetry = None
    try:
        if row["format"] == FLOWS:
            files = [(read_piece(f["path"], 0, f["size"], f["sha256"], rules.inbox), f["name"], f["start"])
                     for f in row["files"]]
        elif row["format"] == CAPTURE:
            # The whole capture from its file header (an appended tail has none), of which this task
            # decodes the frames that start in its range.
            data = read_piece(row["path"], 0, row["file_end"], row["sha256"], rules.inbox)
            own = (row["start"], row["end"])
        else:
            data = read_piece(row["path"], row["start"], row["end"], row["sha256"], rules.inbox)
            if row["format"] == CSV_HEADER and row.get("header"):
                data = row["header"].encode() + b"\n" + data  # an appended tail is read under its file's header
    except PieceChanged:
        return _unread(row, rules, CHANGED_SINCE_PLANNED)
    except FileNotFoundError:
        return _unread(row, rules, VANISHED)
    except OSError as error:
        return _unread(row, rules, f"{UNREADABLE}: {error.strerror or type(error).__name__}")
    try:
        if row["format"] == FLOWS:
            telemetry = read_telemetry(files, TelemetryState.from_json(rules.flow_states.get(row["source"])),
                                       source=row["source"],
                                       rules=_telemetry_rules(settings, row["source"], rules.watermark_before))
            parsed = telemetry.parsed.cast(PARSED_SCHEMA)
        else:
            parsed = parse_bytes(data, row["format"], source=row["source"], input_file=row["name"],
                                 settings=settings, own=own).cast(PARSED_SCHEMA)
    except Exception as error:  # noqa: BLE001 - a reader's failure on hostile bytes must not stop the batch
        parsed = unreadable_chunk(row, error)
    data = files = None
    parsed = reject_sums_past_int64(parsed)
    code = fates(parsed, rules)
    parts = split_by_fate(parsed, rules, code)
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
    # Attributed here, where the packets are in memory: the driver only sums a few rows per pane.
    _save(rules, "accounts", row["chunk"], account_parts(packets, rules.mapping))
    _save(rules, "rejects", row["chunk"], parts["rejects"])
    _save(rules, "lost", row["chunk"], telemetry.lost if telemetry else LOST_SCHEMA.empty_table())
    _save(rules, "telemetry", row["chunk"], pa.table(
        {"source": [row["source"]], "state": [json.dumps(telemetry.state.to_json())],
         "skipped": [json.dumps(telemetry.skipped)]}, schema=TELEMETRY_STATE) if telemetry else
        TELEMETRY_STATE.empty_table())
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
    for what in ("summary", "hourly", "accounts", "rejects", "lost", "telemetry"):
        _save(rules, what, row["chunk"], _PARTS[what].empty_table())
    return {"chunk": row["chunk"], "attempt": rules.attempt, "newest": None, "oldest": None, "problem": problem}


def _save(rules: Rules, what: str, chunk: int, table: pa.Table) -> None:
    save_part(rules.scratch, what, chunk, rules.attempt, table)


def _telemetry_rules(settings, source: str, watermark: datetime | None) -> TelemetryRules:
    """What ``read_telemetry`` needs: the settings, and the watermark before the batch (waiting data
    expires by it too, DESIGN §7a)."""
    return TelemetryRules(local_networks=tuple(settings.local_networks), keep_transit=settings.keep_transit,
                          sampling_rate=settings.sampling_rates.get(source),
                          template_wait_us=micros_of(settings.template_wait),
                          max_flow_duration_us=micros_of(settings.max_flow_duration),
                          max_flow_bps=settings.max_flow_bps,
                          watermark_us=micros(watermark) if watermark is not None else None)


def micros_of(span: timedelta) -> int:
    """A duration in whole microseconds (exact: no float)."""
    return span // timedelta(microseconds=1)


def task_function(rules: Rules, chunk_rows: list[dict]):
    """The function Spark runs per task (``mapInArrow`` over ``spark.range``): each id is the index of
    a chunk row (carried in the function itself), and yields that chunk's outcome row."""

    def run(batches):

        settings = build_settings(rules.settings_doc)
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield pa.RecordBatch.from_pylist([run_chunk(chunk_rows[index], rules, settings)], schema=OUTCOME)

    return run


