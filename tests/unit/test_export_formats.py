"""The machine formats on inline tables: exact values, one ISO-8601 UTC form, escapes, atomic files, errors."""

from __future__ import annotations

import io
import json
import random
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from traffic.core.settings import SettingsError
from traffic.reporting.export import RowWriter, csv_columns, iso_times, json_lines, output_path, rows_table, write_rows

UTC = timezone.utc
STAMP = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("n", pa.int64()), ("small", pa.int32()), ("rate", pa.float64()), ("text", pa.string()),
                    ("day", pa.date32()), ("ts", STAMP), ("flag", pa.bool_()), ("tags", pa.list_(pa.string())),
                    ("files", pa.list_(pa.struct([("name", pa.string()), ("size", pa.int64())])))])


def _sample() -> pa.Table:
    return pa.table({
        "n": [2 ** 62 + 1, None, -7, 0],
        "small": pa.array([1, 2, None, 2 ** 31 - 1], pa.int32()),
        "rate": [0.1, 1 / 3, None, 5.0],
        "text": ['say "hi"\\', "", None, "a\x1bb\ttab é"],
        "day": [date(2026, 11, 1), None, date(1999, 12, 31), date(2026, 2, 28)],
        "ts": pa.array([datetime(2026, 11, 1, 10, tzinfo=UTC), datetime(2026, 11, 1, 10, 0, 0, 5, tzinfo=UTC), None,
                        datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)], STAMP),
        "flag": [True, False, None, True],
        "tags": [["a", "b"], [], None, ['"q"']],
        "files": [[{"name": "x.csv", "size": 10}], None, [], [{"name": "y", "size": None}]],
    }, schema=SCHEMA)


def _buffer_stream():
    class Stream:
        buffer = io.BytesIO()

        def flush(self):
            pass

    return Stream()


def test_times_are_isoformat_in_utc_with_microseconds_only_when_there_are_some():
    rng = random.Random(5)
    moments = [datetime(2026, 11, 1, tzinfo=UTC) + timedelta(microseconds=rng.randrange(10 ** 13)) for _ in range(300)]
    moments += [datetime(2026, 11, 1, 10, tzinfo=UTC), datetime(1970, 1, 1, tzinfo=UTC),
                datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=UTC)]
    got = iso_times(pa.array(moments, STAMP)).to_pylist()
    assert got == [m.isoformat() for m in moments]
    assert got[-3:] == ["2026-11-01T10:00:00+00:00", "1970-01-01T00:00:00+00:00", "1969-12-31T23:59:59.500000+00:00"]


def test_json_lines_read_back_to_the_same_values_and_types():
    table = _sample()
    lines = json_lines(table)
    assert len(lines) == table.num_rows and all(line.endswith("}\n") and line.count("\n") == 1 for line in lines)
    docs = [json.loads(line) for line in lines]
    assert [list(d) for d in docs] == [SCHEMA.names] * table.num_rows  # every column, in order, nulls as null
    first, second = docs[0], docs[1]
    assert first["n"] == 2 ** 62 + 1 and type(first["n"]) is int  # no rounding through a double
    assert first["rate"] == 0.1 and docs[3]["rate"] == 5.0 and type(docs[3]["rate"]) is float
    assert second["rate"] == 1 / 3  # the exact double
    assert first["ts"] == "2026-11-01T10:00:00+00:00" and second["ts"] == "2026-11-01T10:00:00.000005+00:00"
    assert first["day"] == "2026-11-01" and second["day"] is None and second["n"] is None
    assert first["text"] == 'say "hi"\\' and docs[3]["text"] == "a\x1bb\ttab é" and second["text"] == ""
    assert "\x1b" not in "".join(lines)  # control characters are escaped by JSON itself
    assert first["tags"] == ["a", "b"] and first["files"] == [{"name": "x.csv", "size": 10}]
    assert second["tags"] == [] and second["files"] is None and first["flag"] is True and docs[2]["flag"] is None
    assert json_lines(table.slice(0, 0)) == []


def test_csv_reads_back_with_the_schema_and_nested_values_as_json_text():
    table = _sample()
    stream = _buffer_stream()
    written = write_rows(table, "csv", None, stream)
    data = stream.buffer.getvalue()
    assert written.rows == 4 and written.bytes == len(data) and written.path is None
    scalar = {f.name: f.type for f in SCHEMA if not pa.types.is_nested(f.type)}
    back = pacsv.read_csv(io.BytesIO(data), convert_options=pacsv.ConvertOptions(
        column_types={**scalar, "tags": pa.string(), "files": pa.string()}, strings_can_be_null=True,
        quoted_strings_can_be_null=False))
    assert back.column_names == SCHEMA.names
    assert back.select(list(scalar)).equals(table.select(list(scalar)))  # exact ints, doubles, dates, UTC times
    assert [None if v is None else json.loads(v) for v in back.column("tags").to_pylist()] == \
        table.column("tags").to_pylist()
    assert [None if v is None else json.loads(v) for v in back.column("files").to_pylist()] == \
        table.column("files").to_pylist()
    assert b'"2026-11-01T10:00:00.000005+00:00"' in data and b"4611686018427387905" in data


def test_csv_to_a_terminal_escapes_control_characters_and_a_file_keeps_them():
    table = _sample().select(["text"])
    assert csv_columns(table, escape=True).column("text").to_pylist()[3] == "a\\x1bb\\ttab é"
    assert csv_columns(table).column("text").to_pylist()[3] == "a\x1bb\ttab é"


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_a_file_appears_whole_or_not_at_all(tmp_path, fmt):
    out = tmp_path / f"rows.{fmt}"
    out.write_text("the previous export")
    with pytest.raises(RuntimeError):
        with RowWriter(fmt, SCHEMA, out) as writer:
            writer.write(_sample())
            raise RuntimeError("the read failed half-way")
    assert out.read_text() == "the previous export" and sorted(p.name for p in tmp_path.iterdir()) == [out.name]
    written = write_rows(_sample(), fmt, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name] and written.bytes == out.stat().st_size > 0
    if fmt == "parquet":
        back = pq.read_table(out)
        assert back.schema == SCHEMA and back.equals(_sample())


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_no_rows_still_make_a_readable_file(tmp_path, fmt):
    out = tmp_path / f"empty.{fmt}"
    assert write_rows(SCHEMA.empty_table(), fmt, out).rows == 0
    if fmt == "csv":
        assert out.read_text().splitlines() == [",".join(f'"{n}"' for n in SCHEMA.names)]
    elif fmt == "json":
        assert out.read_bytes() == b""
    else:
        assert pq.read_table(out).schema == SCHEMA and pq.read_metadata(out).num_rows == 0


def test_output_errors_are_settings_errors(tmp_path):
    with pytest.raises(SettingsError, match="give --out PATH"):
        output_path("parquet", None)
    with pytest.raises(SettingsError, match="does not exist"):
        output_path("csv", tmp_path / "no" / "such.csv")
    with pytest.raises(SettingsError, match="is a folder"):
        output_path("json", tmp_path)
    with pytest.raises(SettingsError, match="choose one of csv, json, parquet"):
        output_path("xml", tmp_path / "a.xml")
    assert output_path("csv", None) is None and output_path("json", tmp_path / "a.json") == tmp_path / "a.json"
    assert output_path("csv", "rel.csv") == Path("rel.csv").absolute()


def test_rows_table_takes_known_types_from_the_schema_and_infers_new_columns():
    schema = pa.schema([("account", pa.string()), ("bytes_in", pa.int64()), ("when", STAMP)])
    rows = [{"account": "acme", "bytes_in": 5, "when": datetime(2026, 10, 1, tzinfo=UTC), "commit_bps": 1.5e6},
            {"account": "beta", "bytes_in": None, "when": None, "commit_bps": None}]
    table = rows_table(rows, schema, final=True)
    assert table.schema == pa.schema([*schema, ("commit_bps", pa.float64()), ("final", pa.bool_())])
    assert table.column("commit_bps").to_pylist() == [1.5e6, None] and table.column("final").to_pylist() == [True] * 2
    empty = rows_table([], schema, final=True, stored=False)
    assert empty.num_rows == 0 and empty.column_names == ["account", "bytes_in", "when", "final", "stored"]
