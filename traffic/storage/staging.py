"""Parquet files written ahead of their commit: the rs engine's file layout (``k=<key>/<part>.parquet``).

Ingest's parse tasks and the freeze's Arrow tasks write rows here on the executors, so the rows
never pass through the driver or the JVM; committing the ``Staged`` handle adds those files (the rs
engine) or writes them through Delta's writer (the spark engine). Imported on executors: it needs
only Arrow.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from traffic.storage import schemas
from traffic.storage.keys import key_groups
from traffic.storage.place import Place

#: Tables of raw detail: big, and a batch's rows fall in few keys.
RAW_TABLES = frozenset({"packets", "late_packets", "rejects"})
#: Threads the driver writes one table's files with (Arrow and parquet release the GIL); executor tasks
#: write with one, each task already having its core.
DRIVER_THREADS = max(1, min(4, os.cpu_count() or 1))


@dataclass(frozen=True)
class Staged:
    """Parquet files written ahead of their commit, into a folder the table chose (``Table.staging``).

    Ingest tasks write raw detail here on the executors (``write_staged``), so the rows never
    pass through the driver or the JVM; committing the handle adds exactly those files.
    """

    table: str
    folder: Place  # under the table's root (rs) or the warehouse's staging folder (spark), local or on a store

    def __post_init__(self):
        object.__setattr__(self, "folder", Place.of(self.folder))  # a path or URI given: the place it names


def conform(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """Select and cast ``data`` to ``schema`` (missing columns become nulls)."""
    arrays = []
    for field in schema:
        if field.name in data.column_names:
            arrays.append(data.column(field.name).cast(field.type))
        else:
            arrays.append(pa.nulls(data.num_rows, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def statistics(table: str) -> bool | list[str]:
    """Parquet column statistics to write: raw detail is only ever filtered by time (and batch),
    and statistics on its address and port columns cost a tenth of the write."""
    return [c for c in ("ts", "hour", "batch_id") if c in schemas.arrow_schema(table).names] \
        if table in RAW_TABLES else True


def write_keyed(data: pa.Table, table: str, dest: Place | Path, part: str, threads: int = 1) -> int:
    """Write ``data`` (conformed to ``table``'s schema) into ``dest``: one ``k=<key>/<part>.parquet`` per cluster key
    (``threads`` files at a time)."""
    dest = Place.of(dest)
    data = conform(data, schemas.arrow_schema(table))
    if data.num_rows == 0:
        return 0
    cluster = schemas.cluster(table)
    if cluster is None:
        dest.mkdir()
        write_file(data, dest / f"{part}.parquet", True)
        return data.num_rows
    index, keys = key_groups(data.column(cluster.column), cluster.grain)
    # Rows already in key order (a feed in time order) are written as slices, without a copy.
    in_order = bool(np.all(index[:-1] <= index[1:]))
    order = None if in_order else np.argsort(index, kind="stable")
    bounds = np.searchsorted(index if in_order else index[order], np.arange(len(keys) + 1))

    def write(position: int) -> None:
        lo, hi = int(bounds[position]), int(bounds[position + 1])
        folder = dest / f"k={keys[position]}"
        folder.mkdir()
        part_rows = data.slice(lo, hi - lo) if in_order else data.take(pa.array(order[lo:hi]))
        write_file(part_rows, folder / f"{part}.parquet", statistics(table))

    present = [p for p in range(len(keys)) if bounds[p + 1] > bounds[p]]
    if threads > 1 and len(present) > 1:
        with ThreadPoolExecutor(min(threads, len(present))) as pool:
            list(pool.map(write, present))
    else:
        for position in present:
            write(position)
    return data.num_rows


def write_staged(data: pa.Table, staged: Staged, part: str) -> int:
    """Write rows into a staged folder (on an executor or the driver); returns the rows written."""
    return write_keyed(data, staged.table, staged.folder, part)


def discard_staged(staged: Staged, part: str) -> None:
    """Remove the files named ``part`` from a staged folder (a task's output that will not be committed)."""
    for entry in list(staged.folder.files(f"{part}.parquet")):
        entry.place.unlink()


def write_file(rows: pa.Table, target: Place, write_statistics) -> None:
    """One parquet file, on local disk or a store (where the object appears whole when the write ends)."""
    pq.write_table(rows, target.fs_path, filesystem=target.fs, write_statistics=write_statistics)
