"""Cluster keys: how a table's rows are grouped into files by the hour, day or month of one column.

Tables are not Delta-partitioned: every data file holds the rows of one *cluster key* (an hour, a
day or a month of the table's cluster column, see ``traffic.storage.schemas``), named in its path
(``…/k=<key>/…``) when the rs engine wrote it, or read from the file's min/max statistics when
another writer did. A *span* is a file of a whole day of an hourly table (a whole month of a daily
one): its key prefixes every key it holds.
"""

from __future__ import annotations

import re
from datetime import date, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traffic.core.periods import from_micros

KEY_SEGMENT = re.compile(r"(?:^|/)k=([^/]+)/")
#: The key of rows whose cluster column is null (Hive's name for a null partition value).
NULL_KEY = "__HIVE_DEFAULT_PARTITION__"
KEY_FORMATS = {"hour": "%Y-%m-%dT%H", "day": "%Y-%m-%d", "month": "%Y-%m"}
SPARK_KEY_FORMATS = {"hour": "yyyy-MM-dd'T'HH", "day": "yyyy-MM-dd", "month": "yyyy-MM"}
KEY_LENGTH = {"hour": 13, "day": 10, "month": 7}
#: A table keyed by hour merges each finished day into one file, keyed by the day (a *span*); a
#: table keyed by day merges finished months (``Table.merge``). A span's key prefixes every key it
#: holds, and its first key is the span's key followed by this suffix.
SPAN_GRAIN = {"hour": "day", "day": "month"}
SPAN_FIRST = {"hour": "T00", "day": "-01"}
UNIT_US = {"hour": 3_600_000_000, "day": 86_400_000_000, "month": 86_400_000_000}


def cluster_key(value: datetime | date | None, grain: str) -> str | None:
    """The file key of one cluster-column value: ``2026-11-01T10``, ``2026-11-01`` or ``2026-11``."""
    if value is None:
        return None
    return value.strftime(KEY_FORMATS[grain])


def key_groups(column: pa.ChunkedArray | pa.Array, grain: str) -> tuple[np.ndarray, list[str]]:
    """Per row, the index of its cluster key, and the keys: one datetime conversion per distinct value."""
    if pa.types.is_date(column.type):
        micros = pc.multiply(pc.cast(pc.cast(column, pa.int32()), pa.int64()), UNIT_US["day"])
    else:
        micros = pc.cast(column, pa.int64())
    null = np.iinfo(np.int64).min
    floored = pc.fill_null(micros, null).to_numpy()
    floored = np.where(floored == null, null, floored // UNIT_US[grain] * UNIT_US[grain])
    distinct, index = np.unique(floored, return_inverse=True)
    keys = [NULL_KEY if v == null else cluster_key(from_micros(v), grain) for v in distinct]
    if grain == "month":  # several days share a month: merge their groups
        names = sorted(set(keys))
        index = np.array([names.index(k) for k in keys], dtype=np.int64)[index]
        keys = names
    return index, keys
