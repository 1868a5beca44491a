"""Text formats that name their columns: CSV with a header row, and JSON lines (``ts`` as µs or ISO-8601).

Each line is one record, split in Python (a stray quote or bad JSON costs its own line only), then
judged column-wise by ``text_judging``.
"""

from __future__ import annotations

import csv
import json
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from traffic.core.records import MAX_RECORD_CHARS, PARSED_SCHEMA, clip_record, clip_value
from traffic.io.text_judging import MAX_LINE_BYTES, PACKET_FIELDS, judge_fields, reject_rows, too_long

_DIGITS = r"^[0-9]{1,19}$"


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
        return reject_rows([clip_record(header_line)] + body, [f"{problem}: the file's header is unusable"] +
                        [f"not read: the file's header is unusable ({problem})"] * len(body), source, input_file)
    columns: dict[str, list[str]] = {name: [] for name in header}
    raw, bad, bad_reasons = [], [], []
    for line in lines[first + 1:]:
        if not line.strip():
            continue
        if len(line) > MAX_LINE_BYTES:
            bad.append(line[:MAX_RECORD_CHARS])
            bad_reasons.append(too_long(len(line.encode())))
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
            bad_reasons.append(too_long(len(line.encode())))
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
    """The split lines judged, with the lines that could not be split as rejects."""
    n = len(raw)
    empty = [""] * n
    fields = {name: pa.array(columns.get(name, empty), pa.string()) for name in PACKET_FIELDS}
    fields["ts"] = _iso_to_micros(fields["ts"])
    record_source = pa.array(columns.get("source", empty), pa.string())
    good = judge_fields(fields, pa.array(raw, pa.string()), source=source, input_file=input_file,
                 record_source=record_source, require_ports=False)
    rejects = reject_rows(bad, bad_reasons, source, input_file)
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

