"""Reading a file that ``--format``/``traffic export`` wrote back into Arrow, without the code under test."""

from __future__ import annotations

import json
from datetime import date, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq


def _from_json(value, kind: pa.DataType):
    """One JSON value as the Python value of an Arrow type, checking the form the formats promise."""
    if value is None:
        return None
    if pa.types.is_timestamp(kind):
        assert isinstance(value, str) and value.endswith("+00:00") and "T" in value, value
        return datetime.fromisoformat(value)
    if pa.types.is_date(kind):
        assert len(value) == 10, value
        return date.fromisoformat(value)
    if pa.types.is_integer(kind):
        assert type(value) is int, value
    elif pa.types.is_floating(kind):
        assert type(value) is float, value
    elif pa.types.is_boolean(kind):
        assert type(value) is bool, value
    elif pa.types.is_list(kind):
        return [_from_json(v, kind.value_type) for v in value]
    elif pa.types.is_struct(kind):
        assert list(value) == [f.name for f in kind], value
        return {f.name: _from_json(value[f.name], f.type) for f in kind}
    return value


def read_back(path: Path, fmt: str, schema: pa.Schema) -> pa.Table:
    """A written file as an Arrow table of ``schema``: Parquet as it is, CSV by pyarrow.csv with the schema's
    types (a list or struct is a JSON text cell), JSON lines one object at a time."""
    if fmt == "parquet":
        return pq.read_table(path)
    if fmt == "csv":
        nested = {f.name for f in schema if pa.types.is_nested(f.type)}
        types = {f.name: pa.string() if f.name in nested else f.type for f in schema}
        table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
            column_types=types, strings_can_be_null=True, quoted_strings_can_be_null=False))
        assert table.column_names == schema.names
        for name in nested:
            kind = schema.field(name).type
            values = [None if v is None else _from_json(json.loads(v), kind) for v in table.column(name).to_pylist()]
            table = table.set_column(table.schema.get_field_index(name), name, pa.array(values, kind))
        return table
    rows = []
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        assert list(doc) == schema.names, line
        rows.append({f.name: _from_json(doc[f.name], f.type) for f in schema})
    return pa.Table.from_pylist(rows, schema=schema)


def _canonical(table: pa.Table) -> pa.Table:
    """Rows in one order whatever the order written (every sortable column, in turn)."""
    keys = [(f.name, "ascending") for f in table.schema if not pa.types.is_nested(f.type)]
    return table.sort_by(keys) if table.num_rows else table


def assert_same_rows(got: pa.Table, expected: pa.Table) -> None:
    assert got.schema == expected.schema, (got.schema, expected.schema)
    got, expected = _canonical(got), _canonical(expected)
    assert got.num_rows == expected.num_rows, (got.num_rows, expected.num_rows)
    assert got.equals(expected), (got.slice(0, 5).to_pylist(), expected.slice(0, 5).to_pylist())
