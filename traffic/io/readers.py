"""Input readers: bytes of one inbox file (or a line-aligned chunk of it) → ``PARSED_SCHEMA`` rows.

Formats (DESIGN §7): router-feed CSV (``new,OP_INSERT,<ts_us>,…``), CSV with a header,
JSON lines, and pcap/pcapng captures (``traffic.io.captures``). Text is judged column-wise with
Arrow compute kernels; only distinct non-canonical addresses and rare odd rows touch Python.
A bad record becomes a ``reject`` row with a reason; it never stops the file.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from traffic.core.records import (
    CANONICAL_IPV4_REGEX,
    DIRECTIONS,
    MAX_BYTES_V4,
    MAX_BYTES_V6,
    MAX_QUOTED_CHARS,
    MAX_RECORD_CHARS,
    MAX_SOURCE_CHARS,
    CONTROL_CHARS_REGEX,
    PARSED_SCHEMA,
    canonical_ip,
    clip_record,
    clip_value,
)
from traffic.io.captures import is_capture
from traffic.io.captures import parse_capture

ROUTER_FEED = "router-feed"
CSV_HEADER = "csv"
JSON_LINES = "jsonl"
CAPTURE = "capture"
#: Flow telemetry: a capture of export datagrams (sFlow, NetFlow, IPFIX), decoded by ``traffic.io.telemetry``.
FLOWS = "flows"
#: The name ``traffic collect`` gives its files: telemetry whatever their source.
FLOWS_SUFFIX = ".flows.pcap"

PACKET_FIELDS = ("ts", "local_ip", "remote_ip", "local_port", "remote_port", "protocol", "bytes", "direction")
_ROUTER_COLUMNS = ["op_new", "opcode", "ts", "local_ip", "remote_ip", "local_port", "remote_port", "bytes"]
_DIGITS = r"^[0-9]{1,19}$"
_MAX_TS_US = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z
_BOM = b"\xef\xbb\xbf"
#: A text line longer than this is rejected whole (a packet record needs a few hundred bytes).
MAX_LINE_BYTES = 64 * 1024
#: A text record may name only a stored direction (or none: unknown); ``transit`` is no longer one.
_DIRECTIONS = pa.array(DIRECTIONS, pa.string())


def detect_format(name: str, head: bytes) -> str:
    """The format of a file from its name, confirmed by its first bytes."""

    lower = name.lower()
    if lower.endswith((".pcap", ".pcapng", ".cap")) or is_capture(head):
        return CAPTURE
    if lower.endswith((".jsonl", ".ndjson", ".json")):
        return JSON_LINES
    stripped = head.removeprefix(_BOM).lstrip()
    if stripped.startswith(b"{"):
        return JSON_LINES
    # A header is recognised by naming the `ts` column; anything else is the router-feed dialect,
    # judged line by line, so a garbage first line is one reject rather than the whole file.
    first = stripped.split(b"\n", 1)[0].decode("utf-8", "replace")
    if "ts" in {field.strip().strip('"') for field in first.split(",")}:
        return CSV_HEADER
    return ROUTER_FEED


def parse_bytes(data: bytes, fmt: str, *, source: str, input_file: str, settings=None,
                own: tuple[int, int] | None = None) -> pa.Table:
    """Parse one file's bytes (or a line-aligned chunk for text formats).

    ``own``: for a capture, the byte range whose frames this call decodes (see ``parse_capture``).
    """
    if fmt == CAPTURE:

        return parse_capture(
            data,
            source=source,
            input_file=input_file,
            local_networks=list(settings.local_networks) if settings else [],
            keep_transit=bool(settings and settings.keep_transit),
            own=own,
        )
    data = data.removeprefix(_BOM)  # a byte-order mark at the start of a file is no part of a record
    good, bad = _split_utf8(data)
    rejects = _rejects(bad, "not UTF-8 text", source, input_file)
    if fmt == ROUTER_FEED:
        parsed = parse_router_feed(good, source=source, input_file=input_file)
    elif fmt == JSON_LINES:
        parsed = parse_json_lines(good, source=source, input_file=input_file)
    else:
        parsed = parse_csv_header(good, source=source, input_file=input_file)
    return pa.concat_tables([parsed, rejects]) if rejects.num_rows else parsed


def _split_utf8(data: bytes) -> tuple[bytes, list[str]]:
    """Valid UTF-8 lines, and a hex excerpt of each line that is not (the rare slow path)."""
    if is_utf8(data):
        return data, []
    good, bad = [], []
    for line in data.split(b"\n"):
        try:
            line.decode("utf-8")
            good.append(line)
        except UnicodeDecodeError:
            bad.append("hex:" + line[:64].hex())
    return b"\n".join(good), bad


def is_utf8(data: bytes) -> bool:
    """Whether ``data`` is valid UTF-8, checked by Arrow without decoding (10x faster than ``bytes.decode``)."""
    offsets = pa.py_buffer(np.array([0, len(data)], np.int64))
    whole = pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, pa.py_buffer(data)])
    try:
        whole.cast(pa.large_string())
    except pa.ArrowInvalid:
        return False
    return True


def unreadable_chunk(row: dict, error: BaseException) -> pa.Table:
    """One reject standing for a whole chunk a reader failed on (the last line of defence: none is known)."""
    what = f"{row['name']} bytes {row['start']}-{row['end']}"
    reason = (f"could not be read as {row['format']} ({type(error).__name__}: {clip_value(str(error))}); "
              "nothing of these bytes was counted")
    return _rejects([what], reason, row["source"], row["name"])


def _too_long(size: int) -> str:
    """Why a line of ``size`` bytes is rejected whole."""
    return f"line of {size:,} bytes is longer than a record may be ({MAX_LINE_BYTES:,})"


def _long_lines(lines: list[bytes]) -> tuple[list[bytes], list[str], list[str]]:
    """Lines short enough to be records, then the others as rejects (an excerpt, and why)."""
    keep, rejected, reasons = [], [], []
    for line in lines:
        if len(line) <= MAX_LINE_BYTES:
            keep.append(line)
            continue
        rejected.append(line[:MAX_RECORD_CHARS].decode("utf-8", "replace"))
        reasons.append(_too_long(len(line)))
    return keep, rejected, reasons


def _rejects(records: list[str], reason: str | list[str], source: str, input_file: str) -> pa.Table:
    n = len(records)
    if not n:
        return PARSED_SCHEMA.empty_table()
    reasons = reason if isinstance(reason, list) else [reason] * n
    table = pa.table(
        {
            "kind": pa.array(["reject"] * n, pa.string()),
            "source": pa.array([source] * n, pa.string()),
            "reason": pa.array(reasons, pa.string()),
            "record": pa.array([clip_record(r) for r in records], pa.string()),
            "input_file": pa.array([input_file] * n, pa.string()),
        }
    )
    return _conform(table)


def _conform(table: pa.Table) -> pa.Table:
    arrays = [
        table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
        for f in PARSED_SCHEMA
    ]
    return pa.Table.from_arrays(arrays, schema=PARSED_SCHEMA)


# -- router-feed ------------------------------------------------------------------------


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
        keep, rejected, reasons = _long_lines(data.split(b"\n"))
        long_lines = _rejects(rejected, reasons, source, input_file)
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
    parts = [_rejects(rejects, reasons, source, input_file)]
    if ticks:
        n = len(ticks)
        empty = pa.array([""] * n, pa.string())
        fields = {"ts": pa.array(ticks, pa.string())}
        fields.update({c: empty for c in PACKET_FIELDS if c != "ts"})
        parts.append(judge_fields(fields, pa.array(tick_raw, pa.string()), source=source, input_file=input_file))
    return pa.concat_tables(parts)


# -- CSV with header and JSON lines -------------------------------------------------------


def parse_csv_header(data: bytes, *, source: str, input_file: str) -> pa.Table:
    """CSV with a header row naming ``packets`` columns (``ts`` required).

    Each line is one record: a quote never continues a field onto the next line (no packets
    column holds a line break), so a stray quote costs its own line, never the lines after it.
    """
    lines = data.decode("utf-8").split("\n")
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return PARSED_SCHEMA.empty_table()
    header_line = lines[first].removeprefix("\ufeff")
    header, problem = _csv_fields(header_line)
    header = [h.strip() for h in header or []]
    if problem is None and "ts" not in header:
        problem = "CSV header has no 'ts' column (expected packets column names)"
    twice = sorted({h for h in header if header.count(h) > 1})
    if problem is None and twice:
        problem = f"CSV header names column {clip_value(twice[0])!r} more than once"
    if problem is not None:
        body = [line for line in lines[first + 1:] if line.strip()]
        return _rejects([clip_record(header_line)] + body, [f"{problem}: the file's header is unusable"] +
                        [f"not read: the file's header is unusable ({problem})"] * len(body), source, input_file)
    columns: dict[str, list[str]] = {name: [] for name in header}
    raw, bad, bad_reasons = [], [], []
    for line in lines[first + 1:]:
        if not line.strip():
            continue
        if len(line) > MAX_LINE_BYTES:
            bad.append(line[:MAX_RECORD_CHARS])
            bad_reasons.append(_too_long(len(line.encode())))
            continue
        row, problem = _csv_fields(line)
        if problem is not None:
            bad.append(line)
            bad_reasons.append(problem)
            continue
        if len(row) != len(header):
            bad.append(line)
            bad_reasons.append(f"expected {len(header)} fields as in the header, found {len(row)}")
            continue
        for name, value in zip(header, row):
            columns[name].append(value.strip())
        raw.append(line.rstrip("\r"))
    return _judge_named(columns, raw, bad, bad_reasons, source=source, input_file=input_file)


def _csv_fields(line: str) -> tuple[list[str] | None, str | None]:
    """The fields of one CSV line, or why it is not valid CSV (an unclosed quote, text after a quote)."""
    line = line.rstrip("\r")
    if '"' not in line:
        return line.split(","), None
    try:
        return next(csv.reader([line], strict=True)), None
    except (csv.Error, StopIteration) as error:
        return None, f"not valid CSV ({clip_value(str(error))})"


def parse_json_lines(data: bytes, *, source: str, input_file: str) -> pa.Table:
    """One JSON object per line with ``packets`` column names (``ts`` as µs or ISO-8601)."""
    names = PACKET_FIELDS + ("source",)
    columns: dict[str, list[str]] = {name: [] for name in names}
    raw, bad, bad_reasons = [], [], []
    for line in data.decode("utf-8").split("\n"):
        line = line.strip().removeprefix("\ufeff")
        if not line:
            continue
        if len(line) > MAX_LINE_BYTES:
            bad.append(line[:MAX_RECORD_CHARS])
            bad_reasons.append(_too_long(len(line.encode())))
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as error:
            bad.append(line)
            bad_reasons.append(f"not valid JSON ({clip_value(error.msg)} at column {error.colno})")
            continue
        except RecursionError:
            bad.append(line)
            bad_reasons.append("not valid JSON here (nested too deeply)")
            continue
        if not isinstance(obj, dict):
            bad.append(line)
            bad_reasons.append("a JSON line must be an object with packets column names")
            continue
        for name in names:
            value = obj.get(name)
            if isinstance(value, bool) or isinstance(value, (dict, list)):
                value = json.dumps(value)
            elif isinstance(value, float) and value.is_integer():
                value = str(int(value))
            columns[name].append("" if value is None else str(value).strip())
        raw.append(line)
    return _judge_named(columns, raw, bad, bad_reasons, source=source, input_file=input_file)


def _judge_named(columns, raw, bad, bad_reasons, *, source, input_file) -> pa.Table:
    n = len(raw)
    empty = [""] * n
    fields = {name: pa.array(columns.get(name, empty), pa.string()) for name in PACKET_FIELDS}
    fields["ts"] = _iso_to_micros(fields["ts"])
    record_source = pa.array(columns.get("source", empty), pa.string())
    good = judge_fields(fields, pa.array(raw, pa.string()), source=source, input_file=input_file,
                 record_source=record_source, require_ports=False)
    rejects = _rejects(bad, bad_reasons, source, input_file)
    return pa.concat_tables([good, rejects]) if rejects.num_rows else good


def _iso_to_micros(ts: pa.Array) -> pa.Array:
    """Leave integer µs as they are; turn ISO-8601 text into µs (a time without offset is UTC)."""
    digits = pc.match_substring_regex(ts, _DIGITS)
    if pc.all(pc.or_kleene(digits, pc.equal(ts, ""))).as_py():
        return ts
    out = []
    for value, is_digits in zip(ts.to_pylist(), digits.to_pylist()):
        if is_digits or not value:
            out.append(value)
            continue
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
        except ValueError:
            out.append(value)  # judged below as a bad time
            continue
        parsed = parsed.replace(tzinfo=timezone.utc) if parsed.tzinfo is None else parsed.astimezone(timezone.utc)
        delta = parsed - datetime(1970, 1, 1, tzinfo=timezone.utc)
        out.append(str((delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds))
    return pa.array(out, pa.string())


# -- judging --------------------------------------------------------------------------------


def judge_fields(fields: dict[str, pa.Array], raw, *, source: str, input_file: str,
          prior_reason: pa.Array | None = None, record_source: pa.Array | None = None,
          require_ports: bool = False, blank_is_tick: bool = True) -> pa.Table:
    """Validate text columns into packets, ticks and rejects (first failing check names the reason).

    ``raw`` is the record text per row, or a function of row indices that builds it: it is only
    needed for rejected rows, as are the reasons, so a clean file never builds either.
    """
    n = len(fields["ts"])
    if n == 0:
        return PARSED_SCHEMA.empty_table()
    null_str = pa.scalar(None, pa.string())
    col = {k: (v.combine_chunks() if isinstance(v, pa.ChunkedArray) else v) for k, v in fields.items()}
    col = {k: pc.fill_null(v, "") for k, v in col.items()}
    blank = {k: pc.equal(pc.binary_length(v), 0) for k, v in col.items()}
    is_tick = pc.and_kleene(pc.invert(blank["ts"]), _all([blank[k] for k in PACKET_FIELDS if k != "ts"]))
    if not blank_is_tick:  # router-feed: only a 3-field line is a tick; empty packet fields are an error
        is_tick = pa.repeat(pa.scalar(False), n)

    ts_ok = _digits(col["ts"], 19)
    ts_num = _to_int(col["ts"], ts_ok)
    ts_ok = pc.and_kleene(ts_ok, pc.less_equal(ts_num, _MAX_TS_US))

    local, local_ok, local_v6, local_why = canonical_ips(col["local_ip"])
    remote, remote_ok, remote_v6, remote_why = canonical_ips(col["remote_ip"])
    v6 = pc.fill_null(local_v6, False)
    ports = {}
    port_ok = {}
    for name in ("local_port", "remote_port"):
        ok = _digits(col[name], 5)
        num = _to_int(col[name], ok)
        ok = pc.and_kleene(ok, pc.less_equal(num, 65535))
        if not require_ports:
            ok = pc.or_kleene(ok, blank[name])
        ports[name] = pc.if_else(ok, num, None).cast(pa.int32())
        port_ok[name] = ok
    proto_ok = _digits(col["protocol"], 3)
    proto = _to_int(col["protocol"], proto_ok)
    proto_ok = pc.or_kleene(pc.and_kleene(proto_ok, pc.less_equal(proto, 255)), blank["protocol"])
    size_ok = _digits(col["bytes"], 10)
    size = _to_int(col["bytes"], size_ok)
    limit = pc.if_else(v6, MAX_BYTES_V6, MAX_BYTES_V4)
    size_in_range = pc.less_equal(size, limit)
    negative = pc.starts_with(col["bytes"], "-")
    if pc.any(negative).as_py():
        negative = pc.and_kleene(negative, pc.ascii_is_decimal(pc.utf8_slice_codeunits(col["bytes"], 1)))
    direction = col["direction"]
    dir_ok = pc.or_kleene(blank["direction"], pc.is_in(direction, _DIRECTIONS))

    def quoted(before: str, name: str, after: str):
        return lambda pick: pc.binary_join_element_wise(before, shown(pick(col[name])), after, "")

    # A record's own source (JSON/CSV ``source``) must be a usable name; ticks carry one too.
    source_ok = pa.repeat(pa.scalar(True), n)
    if record_source is not None:
        named = pc.fill_null(record_source, "")
        source_ok = pc.invert(pc.or_kleene(pc.greater(pc.utf8_length(named), MAX_SOURCE_CHARS),
                                           pc.match_substring_regex(named, CONTROL_CHARS_REGEX)))

    # (passes?, reason where it does not) in order; a reason is built only for the rows that fail.
    checks = [
        (ts_ok, quoted("time '", "ts", "' is not microseconds since 1970 (or ISO-8601)")),
        (source_ok, lambda pick: f"source name is longer than {MAX_SOURCE_CHARS} characters or has control characters"),
        (local_ok, lambda pick: pc.binary_join_element_wise(
            "local_ip '", shown(pick(col["local_ip"])), "' ", pick(local_why), "")),
        (remote_ok, lambda pick: pc.binary_join_element_wise(
            "remote_ip '", shown(pick(col["remote_ip"])), "' ", pick(remote_why), "")),
        (pc.equal(local_v6, remote_v6), lambda pick: "local_ip and remote_ip are of different families (IPv4 and IPv6)"),
        (port_ok["local_port"], quoted("local_port '", "local_port", "' is not a port 0-65535")),
        (port_ok["remote_port"], quoted("remote_port '", "remote_port", "' is not a port 0-65535")),
        (proto_ok, quoted("protocol '", "protocol", "' is not a protocol number 0-255")),
        (pc.invert(negative), quoted("byte count ", "bytes", " is negative")),
        (size_ok, quoted("byte count '", "bytes", "' is not a whole number")),
        (size_in_range, lambda pick: pc.binary_join_element_wise(
            "byte count ", pick(col["bytes"]), pc.if_else(pick(v6), " is more than an IPv6 packet can carry (4294967335)",
                                                          " is more than an IPv4 packet can carry (65535)"), "")),
        (dir_ok, quoted("direction '", "direction", f"' is not {'/'.join(DIRECTIONS)} (or empty: unknown)")),
    ]
    # Ticks only need a good time and source; packets need everything.
    reason = _first_reason(checks, is_tick, n, prior_reason)
    rejected = _flat(pc.is_valid(reason))
    any_rejected = pc.any(rejected).as_py()

    kind = pc.if_else(rejected, "reject", pc.if_else(is_tick, "tick", "packet"))
    packet = pc.equal(kind, "packet")
    accepted = pc.invert(rejected)
    src = pa.repeat(pa.scalar(source, pa.string()), n)
    if record_source is not None:
        src = pc.if_else(pc.greater(pc.utf8_length(record_source), 0), record_source, src)
    micros = pc.if_else(accepted, ts_num, None) if any_rejected else ts_num
    record = pa.nulls(n, pa.string())
    if any_rejected:
        rows = pc.indices_nonzero(rejected)
        text = raw(rows) if callable(raw) else pc.take(raw, rows)
        record = pc.replace_with_mask(record, rejected, _flat(pc.utf8_slice_codeunits(text, 0, 512)))
    table = pa.table(
        {
            "kind": kind,
            "ts": micros.cast(pa.timestamp("us", tz="UTC")),
            "source": src,
            "local_ip": pc.if_else(packet, local, null_str),
            "remote_ip": pc.if_else(packet, remote, null_str),
            "local_port": pc.if_else(packet, ports["local_port"], None),
            "remote_port": pc.if_else(packet, ports["remote_port"], None),
            "protocol": pc.if_else(pc.and_kleene(packet, pc.invert(blank["protocol"])), proto, None).cast(pa.int32()),
            "bytes": pc.if_else(packet, size, None),
            "direction": pc.if_else(pc.and_kleene(packet, pc.invert(blank["direction"])), direction, null_str),
            "reason": reason,
            "record": record,
            "input_file": pa.repeat(pa.scalar(input_file, pa.string()), n),
        }
    )
    return _conform(table)


#: How many of ``judge``'s checks, from the first, a tick must pass (its time and its source).
_TICK_CHECKS = 2


def _first_reason(checks, is_tick, n, prior_reason=None) -> pa.Array:
    """The reason of the first failing check (in order), null when all pass; ticks need only the first two.

    Reasons are built only for the failing rows (taken out, judged, put back in place).
    """
    passes = []
    for index, (ok, _) in enumerate(checks):
        ok = pc.fill_null(ok, False)
        if index >= _TICK_CHECKS:
            ok = pc.or_kleene(ok, is_tick)
        passes.append(ok)
    failing = pc.invert(_all(passes))
    if prior_reason is not None:
        failing = pc.or_kleene(failing, pc.is_valid(prior_reason))
    failing = _flat(failing)
    if not pc.any(failing).as_py():
        return pa.nulls(n, pa.string())
    rows = pc.indices_nonzero(failing)
    m = len(rows)

    def pick(array):
        return pc.take(array, rows)

    reason = pa.nulls(m, pa.string())
    for ok, text in reversed(list(zip(passes, (text for _, text in checks)))):
        value = text(pick)
        if isinstance(value, str):
            value = pa.repeat(pa.scalar(value, pa.string()), m)
        reason = pc.if_else(pick(ok), reason, value)
    if prior_reason is not None:
        reason = pc.coalesce(pick(prior_reason), reason)
    return pc.replace_with_mask(pa.nulls(n, pa.string()), failing, _flat(reason))


def shown(values: pa.Array) -> pa.Array:
    """Values as a reason quotes them: at most ``MAX_QUOTED_CHARS`` characters each."""
    long = pc.greater(pc.utf8_length(values), MAX_QUOTED_CHARS)
    if not pc.any(long).as_py():
        return values
    return pc.if_else(long, pc.binary_join_element_wise(
        pc.utf8_slice_codeunits(values, 0, MAX_QUOTED_CHARS - 1), "…", ""), values)


def _flat(array):
    """One contiguous array (``replace_with_mask`` takes no chunked masks)."""
    return array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array


def _all(masks):
    result = masks[0]
    for mask in masks[1:]:
        result = pc.and_kleene(result, mask)
    return result


def _digits(text: pa.Array, most: int) -> pa.Array:
    """``^[0-9]{1,most}$`` without a regex: ASCII decimal digits only (never other scripts' digits)."""
    return pc.and_kleene(pc.ascii_is_decimal(text), pc.less_equal(pc.binary_length(text), most))


def _to_int(text: pa.Array, ok: pa.Array) -> pa.Array:
    """``int64`` of the digits where ``ok`` (others null), without failing on the rest."""
    safe = pc.if_else(ok, text, pa.scalar(None, pa.string()))
    long_enough = pc.less_equal(pc.binary_length(safe), 18)
    safe = pc.if_else(long_enough, safe, pa.scalar(None, pa.string()))
    return pc.cast(safe, pa.int64())


def canonical_ips(text: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
    """(stored text, valid?, is IPv6?, why not) per address, by ``records.canonical_ip``.

    Canonical dotted quads pass through; every other distinct text goes through the rule once (a
    feed has thousands of distinct addresses, not millions): zone ids are refused and IPv4-mapped
    IPv6 becomes IPv4, so a row's family, byte bound and account are those of the address it stores.
    """
    n = len(text)
    # The regex runs once per distinct address.
    encoded = pc.dictionary_encode(text)
    fast = pc.fill_null(pc.take(pc.match_substring_regex(encoded.dictionary, CANONICAL_IPV4_REGEX),
                                encoded.indices), False)
    if pc.all(fast).as_py():
        return text, pa.repeat(pa.scalar(True), n), pa.repeat(pa.scalar(False), n), pa.nulls(n, pa.string())
    slow_values = pc.unique(pc.filter(text, pc.invert(fast))).to_pylist()
    canon, v6, why = [], [], []
    for value in slow_values:
        try:
            stored = canonical_ip(value)
        except ValueError as error:
            canon.append(None)
            v6.append(None)
            why.append(str(error))
            continue
        canon.append(stored)
        v6.append(":" in stored)
        why.append(None)
    lookup = pa.array(slow_values, pa.string())
    index = pc.index_in(text, value_set=lookup)
    canonical = pc.if_else(fast, text, pc.take(pa.array(canon, pa.string()), index))
    is_v6 = pc.if_else(fast, False, pc.take(pa.array(v6, pa.bool_()), index))
    reason = pc.if_else(fast, pa.scalar(None, pa.string()), pc.take(pa.array(why, pa.string()), index))
    return canonical, pc.is_valid(canonical), is_v6, reason
