"""The router-feed dialect: ``new,OP_INSERT,<ts_us>,<local_ip>,<remote_ip>,<local_port>,<remote_port>,<bytes>``.

Read by Arrow's CSV reader as eight string columns; rows with another field count (a 3-field clock
tick, a short or unknown line) take the rare slow path. Every row is judged by ``text_judging``.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from traffic.core.records import PARSED_SCHEMA, clip_value
from traffic.io.text_judging import PACKET_FIELDS, judge_fields, reject_rows, split_long_lines

_ROUTER_COLUMNS = ["op_new", "opcode", "ts", "local_ip", "remote_ip", "local_port", "remote_port", "bytes"]


def parse_router_feed(data: bytes, *, source: str, input_file: str) -> pa.Table:
    """``new,OP_INSERT,<ts_us>,<local_ip>,<remote_ip>,<local_port>,<remote_port>,<bytes>``; 3 fields = tick."""
    odd: list[str] = []

    def keep_odd(row) -> str:
        odd.append(row.text)
        return "skip"

    if not data or data.isspace():  # (not ``strip()``: that copies a 64 MiB chunk to find out)
        return PARSED_SCHEMA.empty_table()
    long_lines = PARSED_SCHEMA.empty_table()
    try:
        table = _read_router_csv(data, keep_odd)
    except pa.ArrowInvalid:
        # A line longer than Arrow's block (the rare slow path): such lines are rejected, the rest read.
        odd.clear()
        keep, rejected, reasons = split_long_lines(data.split(b"\n"))
        long_lines = reject_rows(rejected, reasons, source, input_file)
        table = _read_router_csv(b"\n".join(keep), keep_odd)

    def raw(rows: pa.Array) -> pa.Array:  # the record text, rebuilt only for the rows that are rejected
        return pc.binary_join_element_wise(*[pc.take(table.column(c), rows) for c in _ROUTER_COLUMNS], ",")

    opcode_ok = pc.and_kleene(pc.equal(table.column("op_new"), "new"), pc.equal(table.column("opcode"), "OP_INSERT"))
    fields = {c: table.column(c) for c in PACKET_FIELDS if c in table.column_names}
    fields["protocol"] = fields["direction"] = pa.repeat(pa.scalar("", pa.string()), table.num_rows)
    opcode_reason = None
    if not pc.all(opcode_ok).as_py():
        opcode_reason = pc.if_else(
            opcode_ok, pa.scalar(None, pa.string()),
            pc.binary_join_element_wise(
                "unknown operation '", table.column("op_new"), ",", table.column("opcode"),
                "' (only new,OP_INSERT is accepted)", ""),
        )
    packets = judge_fields(fields, raw, source=source, input_file=input_file, prior_reason=opcode_reason,
                    require_ports=True, blank_is_tick=False)
    extra = _router_odd_rows(odd, source=source, input_file=input_file)
    return pa.concat_tables([packets, extra, long_lines]) if extra.num_rows or long_lines.num_rows else packets


def _read_router_csv(data: bytes, keep_odd) -> pa.Table:
    """The router-feed lines as eight string columns (rows with another field count go to ``keep_odd``)."""
    if not data or data.isspace():
        return pa.table({c: pa.array([], pa.string()) for c in _ROUTER_COLUMNS})
    table = pacsv.read_csv(
        io.BytesIO(data),
        read_options=pacsv.ReadOptions(column_names=_ROUTER_COLUMNS, block_size=16 << 20),
        parse_options=pacsv.ParseOptions(quote_char=False, invalid_row_handler=keep_odd),
        convert_options=pacsv.ConvertOptions(
            column_types={c: pa.string() for c in _ROUTER_COLUMNS},
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        ),
    )
    return table.combine_chunks()


def _router_odd_rows(lines: list[str], *, source: str, input_file: str) -> pa.Table:
    """Rows without 8 fields: a 3-field ``new,OP_INSERT,<ts>`` is a tick; the rest are rejects."""
    if not lines:
        return PARSED_SCHEMA.empty_table()
    ticks, tick_raw, rejects, reasons = [], [], [], []
    for line in lines:
        parts = line.split(",")
        if len(parts) == 3 and parts[0] == "new" and parts[1] == "OP_INSERT":
            ticks.append(parts[2])
            tick_raw.append(line)
        elif len(parts) >= 2 and (parts[0] != "new" or parts[1] != "OP_INSERT"):
            rejects.append(line)
            reasons.append(f"unknown operation '{clip_value(parts[0] + ',' + parts[1])}' "
                           "(only new,OP_INSERT is accepted)")
        else:
            rejects.append(line)
            reasons.append(f"expected 8 fields (or 3 for a clock tick), found {len(parts)}")
    parts = [reject_rows(rejects, reasons, source, input_file)]
    if ticks:
        n = len(ticks)
        empty = pa.array([""] * n, pa.string())
        fields = {"ts": pa.array(ticks, pa.string())}
        fields.update({c: empty for c in PACKET_FIELDS if c != "ts"})
        parts.append(judge_fields(fields, pa.array(tick_raw, pa.string()), source=source, input_file=input_file))
    return pa.concat_tables(parts)
