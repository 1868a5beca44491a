"""Table schemas: ``schemas/<table>.json`` (Spark StructType JSON) is the one definition.

Spark, Arrow and Delta schemas are all derived from it here. A field whose metadata has
``"cluster": "hour"|"day"|"month"`` is the table's file-organisation key: every data file
holds rows of one key value only, so partitions can be replaced or expired atomically.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pyarrow as pa

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"

TABLES = (
    "packets",
    "late_packets",
    "rejects",
    "hourly",
    "daily",
    "monthly",
    "periods",
    "source_panes",
    "clocks",
    "batches",
    "dq_results",
    "panes",
    "bills",
    "flow_state",
    "alerts",
)

_ARROW_TYPES = {
    "string": pa.string(),
    "long": pa.int64(),
    "integer": pa.int32(),
    "boolean": pa.bool_(),
    "double": pa.float64(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}


@dataclass(frozen=True)
class Cluster:
    """The column whose value (floored to ``grain``) keys a table's files."""

    column: str
    grain: str  # hour | day | month


@lru_cache(maxsize=None)
def document(table: str) -> dict:
    """The raw StructType JSON of ``table``."""
    path = SCHEMA_DIR / f"{table}.json"
    if not path.exists():
        raise KeyError(f"no schema for table {table!r} in {SCHEMA_DIR}")
    return json.loads(path.read_text())


def columns(table: str) -> list[str]:
    """Column names of ``table`` in schema order."""
    return [f["name"] for f in document(table)["fields"]]


def _arrow_type(spec) -> pa.DataType:
    if isinstance(spec, str):
        return _ARROW_TYPES[spec]
    if spec["type"] == "array":
        return pa.list_(_arrow_type(spec["elementType"]))
    if spec["type"] == "struct":
        return pa.struct([pa.field(f["name"], _arrow_type(f["type"])) for f in spec["fields"]])
    raise ValueError(f"unsupported schema type {spec!r}")


@lru_cache(maxsize=None)
def arrow_schema(table: str) -> pa.Schema:
    """The Arrow schema of ``table`` (timestamps as microseconds, UTC)."""
    return pa.schema([pa.field(f["name"], _arrow_type(f["type"])) for f in document(table)["fields"]])


def spark_schema(table: str):
    """The Spark ``StructType`` of ``table`` (pyspark imported only when asked)."""
    from pyspark.sql.types import StructType

    return StructType.fromJson(document(table))


@lru_cache(maxsize=None)
def cluster(table: str) -> Cluster | None:
    """The table's file key, or None for a table kept as a whole."""
    for f in document(table)["fields"]:
        grain = f.get("metadata", {}).get("cluster")
        if grain:
            return Cluster(f["name"], grain)
    return None
