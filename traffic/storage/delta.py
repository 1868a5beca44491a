"""The Delta layer: the only code that knows where tables live and how they are written.

Two engines write standard Delta tables:

* ``rs`` — Spark (or Arrow, for small driver-side tables) writes parquet files into a fresh
  folder under the table root, then ``deltalake`` (delta-rs) commits them to the log. Works
  offline; this is what CI runs. Ingest's parse tasks write raw detail themselves, on the
  executors, into a folder the table hands out (``Table.staging`` → ``Staged``,
  ``write_staged``); committing the handle adds those files.
* ``spark`` — delta-spark (``DeltaTable``, ``replaceWhere``, ``txnAppId``/``txnVersion``),
  used where Delta Lake's jars are on Spark's classpath (the compose stack's image).

Tables are created with pinned protocol versions (reader 1, writer 2) and no optional
features, and are not Delta-partitioned: instead every data file holds the rows of one
*cluster key* (an hour, a day or a month of the table's cluster column, see
``traffic.storage.schemas``), recorded in its path (``…/k=<key>/…``) and min/max stats. That gives
atomic partition replacement and expiry (remove exactly the files of those keys in one
commit) and pruning, while every Delta reader sees ordinary columns.

Every write goes through named steps — ``<table>.<op>.files_written`` then
``<table>.<op>.committed`` — and ``Warehouse.step`` is the fault-injection hook the crash
tests use to SIGKILL the process at any of them (``TRAFFIC_FAULT_AT``).
"""

from __future__ import annotations

import abc
import bisect
import json
import os
import re
import shutil
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from traffic.storage import schemas
from traffic.storage.journal import state_folder
from traffic.core.periods import from_micros
from traffic.core.settings import Settings

PROTOCOL = (1, 2)
#: A checkpoint every this many commits. Opening a table reads its last checkpoint and replays every
#: commit since as JSON; after a month of micro-batches a 40-commit tail made each open ~25 ms against
#: ~4 ms from a fresh checkpoint, and a job opens a dozen tables. A checkpoint costs a few ms.
CHECKPOINT_EVERY = 10
#: Every table's settings. Files a commit removed stay on disk a day (a reader of an older snapshot
#: still finds them), then ``vacuum`` deletes them; the log keeps a day of commits too (an older
#: version's files are gone anyway). delta-rs lists the whole ``_delta_log`` folder to bring a
#: snapshot up to date, several times a commit, so a shorter log is a cheaper commit: with 7 days,
#: a table committed every 5 minutes held ~2,400 log files; with one, ~400.
TABLE_CONFIGURATION = {
    "delta.checkpointInterval": str(CHECKPOINT_EVERY),
    "delta.logRetentionDuration": "interval 1 days",
    "delta.deletedFileRetentionDuration": "interval 1 days",
}
_KEY_SEGMENT = re.compile(r"(?:^|/)k=([^/]+)/")
_NULL_KEY = "__HIVE_DEFAULT_PARTITION__"
_KEY_FORMATS = {"hour": "%Y-%m-%dT%H", "day": "%Y-%m-%d", "month": "%Y-%m"}
_SPARK_KEY_FORMATS = {"hour": "yyyy-MM-dd'T'HH", "day": "yyyy-MM-dd", "month": "yyyy-MM"}
_KEY_LENGTH = {"hour": 13, "day": 10, "month": 7}
#: A table keyed by hour merges each finished day into one file, keyed by the day (a *span*); a
#: table keyed by day merges finished months (``Table.merge``). A span's key prefixes every key it
#: holds, and its first key is the span's key followed by this suffix.
_SPAN_GRAIN = {"hour": "day", "day": "month"}
_SPAN_FIRST = {"hour": "T00", "day": "-01"}


#: Tables of raw detail: big, and a batch's rows fall in few keys.
_RAW_TABLES = frozenset({"packets", "late_packets", "rejects"})


def _now_ms() -> int:
    """The time a commit stamps on the files it removes (their retention counts from it)."""
    return int(time.time() * 1000)


class StorageError(RuntimeError):
    """A table cannot be read or written as asked; the message says which and why."""


def cluster_key(value: datetime | date | None, grain: str) -> str | None:
    """The file key of one cluster-column value: ``2026-11-01T10``, ``2026-11-01`` or ``2026-11``."""
    if value is None:
        return None
    return value.strftime(_KEY_FORMATS[grain])


def choose_engine(settings: Settings) -> str:
    """``rs`` or ``spark``: ``auto`` picks ``spark`` only when a Delta jar directory is configured."""
    if settings.engine != "auto":
        return settings.engine
    jars = settings.spark_jars_dir
    if jars and jars.is_dir() and any(p.name.startswith(("delta-spark", "delta-core")) for p in jars.glob("*.jar")):
        return "spark"
    return "rs"


@dataclass(frozen=True)
class Staged:
    """Parquet files written ahead of their commit, into a folder the table chose (``Table.staging``).

    Ingest tasks write raw detail here on the executors (``write_staged``), so the rows never
    pass through the driver or the JVM; committing the handle adds exactly those files.
    """

    table: str
    folder: str


_UNIT_US = {"hour": 3_600_000_000, "day": 86_400_000_000, "month": 86_400_000_000}


def _key_groups(column: pa.ChunkedArray | pa.Array, grain: str) -> tuple[np.ndarray, list[str]]:
    """Per row, the index of its cluster key, and the keys: one datetime conversion per distinct value."""
    if pa.types.is_date(column.type):
        micros = pc.multiply(pc.cast(pc.cast(column, pa.int32()), pa.int64()), _UNIT_US["day"])
    else:
        micros = pc.cast(column, pa.int64())
    null = np.iinfo(np.int64).min
    floored = pc.fill_null(micros, null).to_numpy()
    floored = np.where(floored == null, null, floored // _UNIT_US[grain] * _UNIT_US[grain])
    distinct, index = np.unique(floored, return_inverse=True)
    keys = [_NULL_KEY if v == null else cluster_key(from_micros(v), grain) for v in distinct]
    if grain == "month":  # several days share a month: merge their groups
        names = sorted(set(keys))
        index = np.array([names.index(k) for k in keys], dtype=np.int64)[index]
        keys = names
    return index, keys


#: Threads the driver writes one table's files with (Arrow and parquet release the GIL); executor tasks
#: write with one, each task already having its core.
DRIVER_THREADS = max(1, min(4, os.cpu_count() or 1))


def write_keyed(data: pa.Table, table: str, dest: Path, part: str, threads: int = 1) -> int:
    """Write ``data`` (conformed to ``table``'s schema) into ``dest``: one ``k=<key>/<part>.parquet`` per cluster key
    (``threads`` files at a time)."""
    data = conform(data, schemas.arrow_schema(table))
    if data.num_rows == 0:
        return 0
    cluster = schemas.cluster(table)
    if cluster is None:
        dest.mkdir(parents=True, exist_ok=True)
        pq.write_table(data, dest / f"{part}.parquet")
        return data.num_rows
    index, keys = _key_groups(data.column(cluster.column), cluster.grain)
    # Rows already in key order (a feed in time order) are written as slices, without a copy.
    in_order = bool(np.all(index[:-1] <= index[1:]))
    order = None if in_order else np.argsort(index, kind="stable")
    bounds = np.searchsorted(index if in_order else index[order], np.arange(len(keys) + 1))

    def write(position: int) -> None:
        lo, hi = int(bounds[position]), int(bounds[position + 1])
        folder = dest / f"k={keys[position]}"
        folder.mkdir(parents=True, exist_ok=True)
        part_rows = data.slice(lo, hi - lo) if in_order else data.take(pa.array(order[lo:hi]))
        pq.write_table(part_rows, folder / f"{part}.parquet", write_statistics=_statistics(table))

    present = [p for p in range(len(keys)) if bounds[p + 1] > bounds[p]]
    if threads > 1 and len(present) > 1:
        with ThreadPoolExecutor(min(threads, len(present))) as pool:
            list(pool.map(write, present))
    else:
        for position in present:
            write(position)
    return data.num_rows


def _statistics(table: str) -> bool | list[str]:
    """Parquet column statistics to write: raw detail is only ever filtered by time (and batch),
    and statistics on its address and port columns cost a tenth of the write."""
    return [c for c in ("ts", "hour", "batch_id") if c in schemas.arrow_schema(table).names] \
        if table in _RAW_TABLES else True


def write_staged(data: pa.Table, staged: Staged, part: str) -> int:
    """Write rows into a staged folder (on an executor or the driver); returns the rows written."""
    return write_keyed(data, staged.table, Path(staged.folder), part)


def discard_staged(staged: Staged, part: str) -> None:
    """Remove the files named ``part`` from a staged folder (a task's output that will not be committed)."""
    for path in Path(staged.folder).glob(f"**/{part}.parquet"):
        path.unlink()


@dataclass(frozen=True)
class DataFile:
    """One data file of a table's current snapshot."""

    path: str  # relative to the table root
    size: int
    key: str | None
    rows: int | None


@dataclass(frozen=True)
class _FileIndex:
    """One snapshot's data files grouped by cluster key, each with its position in the snapshot."""

    version: tuple[int, int]  # (id of the snapshot object, table version)
    by_key: dict[str | None, list[tuple[int, DataFile]]]
    keys: list[str]  # the non-null keys of the table's grain, sorted
    spans: list[str]  # the keys of merged files (whole days or months), sorted


#: Every step reached in this process, in order (the crash tests enumerate kill points from it).
STEPS_REACHED: list[str] = []


class FaultInjector:
    """Kills the process (SIGKILL) at a named step: ``name`` or ``name#n`` (its n-th time)."""

    def __init__(self, spec: str | None):
        self.name, _, nth = (spec or "").partition("#")
        self.nth = int(nth) if nth else 1
        self.seen = 0

    def reached(self, step: str) -> None:
        STEPS_REACHED.append(step)
        if step == self.name:
            self.seen += 1
            if self.seen == self.nth:
                os.kill(os.getpid(), signal.SIGKILL)


_INJECTORS: dict[tuple[str | None, int], FaultInjector] = {}


def _injector(settings: Settings) -> FaultInjector:
    """One injector per settings object, so ``name#n`` counts across every job run with them."""
    key = (settings.fault_at, id(settings))
    if key not in _INJECTORS:
        _INJECTORS[key] = FaultInjector(settings.fault_at)
    return _INJECTORS[key]


class Warehouse:
    """All tables under one root, written by one engine."""

    def __init__(self, settings: Settings, spark=None, engine: str | None = None):
        self.settings = settings
        self.root = Path(settings.warehouse)
        self.spark = spark
        self.engine = engine or choose_engine(settings)
        self.faults = _injector(settings)
        self.snapshots: dict[str, object] = {}  # table name -> loaded delta-rs snapshot (rs engine)
        self.file_indexes: dict[str, _FileIndex] = {}  # table name -> its snapshot's files by key (rs engine)
        if self.engine == "spark" and spark is None:
            raise StorageError("the spark engine needs a SparkSession")

    def with_spark(self, spark) -> "Warehouse":
        """A handle for the Spark part of a job, sharing the snapshots this one has loaded (a table
        re-opened reads its last checkpoint and every commit since: ~10 ms each after a month)."""
        other = Warehouse(self.settings, spark=spark, engine=self.engine)
        other.snapshots, other.file_indexes = self.snapshots, self.file_indexes
        return other

    def step(self, name: str) -> None:
        """A named point of a write (the crash tests' kill points)."""
        self.faults.reached(name)

    def table(self, name: str) -> "Table":
        if name not in schemas.TABLES:
            raise StorageError(f"unknown table {name!r}")
        cls = SparkDeltaTable if self.engine == "spark" else RsTable
        return cls(self, name)

    def state_dir(self) -> Path:
        """Where the pipeline keeps its journal and lock (not a table)."""
        path = state_folder(self.root)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StorageError(f"warehouse {self.root} cannot be used: {error.strerror or error}") from None
        return path

    def exists(self) -> bool:
        return (self.root / "clocks" / "_delta_log").is_dir()

    def scratch(self, name: str, fresh: bool = True) -> Path:
        """The folder for one job's intermediate files: emptied (what is left of an earlier attempt is
        removed) unless ``fresh`` is false, which finds an earlier attempt's (the folder may not exist)."""
        path = self.state_dir() / "scratch" / name
        if fresh:
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
        return path

    def drop_scratch(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def create_all(self) -> None:
        """Create every table that does not exist yet (idempotent)."""
        for name in schemas.TABLES:
            self.table(name).create()


class Table(abc.ABC):
    """Operations every engine offers on one table."""

    def __init__(self, warehouse: Warehouse, name: str):
        self.warehouse = warehouse
        self.name = name
        self.path = warehouse.root / name
        self.cluster = schemas.cluster(name)
        self.arrow_schema = schemas.arrow_schema(name)

    # -- keys ---------------------------------------------------------------------------
    # Callers name periods (a datetime or date); the table turns them into its own file keys, so no
    # caller knows how files are keyed. A key the table itself listed (``keys()``) passes as it is.
    def key_of(self, value) -> str | None:
        if value is None or isinstance(value, str):
            return value
        return cluster_key(value, self.cluster.grain) if self.cluster else None

    def _key_list(self, periods) -> list[str | None] | None:
        return None if periods is None else [self.key_of(p) for p in periods]

    def files_by_span(self, start=None) -> dict | None:
        """The data files from ``start`` on, grouped by the span that holds them (the day of an hour,
        the month of a day; DESIGN §8's merged files), as {span start: [relative path, ...]}.
        None when a file has no key (its rows could belong to any span)."""
        spans: dict = {}
        width = _KEY_LENGTH[_SPAN_GRAIN[self.cluster.grain]]
        for f in self.files(key_min=start):
            if f.key is None:
                return None
            spans.setdefault(f.key[:width], []).append(f.path)
        parse = {10: "%Y-%m-%d", 7: "%Y-%m"}[width]
        return {datetime.strptime(k, parse).replace(tzinfo=timezone.utc): paths for k, paths in sorted(spans.items())}

    def keys_before(self, period) -> list[str]:
        """The cluster keys present of periods before ``period`` (what expiring up to it removes)."""
        if period is None:
            raise StorageError(f"no bound given for expiring {self.name}")
        bound = self.key_of(period)
        return [k for k in self.keys() if k < bound]

    def periods_with_files(self, periods) -> list:
        """Those of ``periods`` this table holds files of. A merged file (a span) may hold any of the
        periods it covers, so when one is found every period asked for is returned."""
        periods = list(periods)
        wanted = {self.key_of(p): p for p in periods}
        found = set()
        for f in self.files(keys=periods):
            if f.key not in wanted:
                return periods
            found.add(f.key)
        return [p for k, p in wanted.items() if k in found]

    def paths_by_period(self, periods) -> dict:
        """Each period's data files, as (absolute path, size) pairs in commit order; files of a merged
        span, keyed by the span, are not listed (freezing reads hours not merged yet)."""
        wanted = {self.key_of(p): p for p in periods}
        paths: dict = {}
        for f in self.files(keys=list(wanted.values())):
            if f.key in wanted:
                paths.setdefault(wanted[f.key], []).append((str(self.path / f.path), f.size))
        return paths

    def staging(self) -> Staged:
        """A fresh folder for files to be committed later (``append``/``replace`` the returned handle)."""
        return Staged(self.name, str(self._staging_folder()))

    @abc.abstractmethod
    def _staging_folder(self) -> Path:
        """Where this engine stages files before a commit."""

    def _where(self, keys=None, key_min=None, key_max=None) -> str | None:
        """A Spark SQL condition on the rows' own cluster keys."""
        if not self.cluster:
            return None
        keys, key_min, key_max = self._key_list(keys), self.key_of(key_min), self.key_of(key_max)
        fmt = _SPARK_KEY_FORMATS[self.cluster.grain]
        expr = f"date_format(`{self.cluster.column}`, \"{fmt}\")"
        parts = []
        if keys is not None:
            listed = [k for k in keys if k is not None]
            clause = f"{expr} IN ({', '.join(repr(k) for k in listed)})" if listed else "false"
            if None in set(keys):
                clause = f"({clause} OR `{self.cluster.column}` IS NULL)"
            parts.append(clause)
        if key_min is not None:
            parts.append(f"{expr} >= '{key_min}'")
        if key_max is not None:
            parts.append(f"{expr} < '{key_max}'")
        return " AND ".join(parts) if parts else None

    def _check_keys(self, keys: Iterable) -> list[str | None]:
        keys = self._key_list(keys)
        if keys and not self.cluster:
            raise StorageError(f"table {self.name} has no cluster key to replace or delete by")
        return keys


class RsTable(Table):
    """Spark/Arrow writes parquet, delta-rs commits it."""

    # -- snapshot ---------------------------------------------------------------------
    def _delta(self):
        """The table's current snapshot; reused within a job and brought up to date incrementally.

        Re-opening a table reads its last checkpoint and the commits since; bringing a loaded
        snapshot up to date reads only the new commits, which keeps a micro-batch's many small
        reads and commits cheap whatever the table's history.
        """
        from deltalake import DeltaTable

        cached = self.warehouse.snapshots.get(self.name)
        if cached is not None:
            cached.update_incremental()
            return cached
        try:
            snapshot = DeltaTable(str(self.path))
        except Exception as error:  # noqa: BLE001 - delta-rs raises several kinds here
            if not (self.path / "_delta_log").is_dir():
                raise StorageError(
                    f"table {self.name} does not exist under {self.warehouse.root} (run `traffic ingest` first)"
                ) from None
            raise StorageError(f"table {self.name} cannot be opened: {error}") from None
        # Checked when a job first opens the table, not by ``create_all`` (which would open all of them).
        self._check_protocol(snapshot)
        self.warehouse.snapshots[self.name] = snapshot
        return snapshot

    def exists(self) -> bool:
        return (self.path / "_delta_log").is_dir()

    def create(self) -> None:
        """Create the table from its schema with pinned protocol and no optional features."""
        if self.exists():
            return
        from deltalake import DeltaTable, Schema

        DeltaTable.create(
            str(self.path),
            schema=Schema.from_arrow(self.arrow_schema),
            mode="ignore",
            name=self.name,
            configuration=TABLE_CONFIGURATION,
        )
        self._check_protocol(self._delta())

    def _check_protocol(self, dt) -> None:
        protocol = dt.protocol()
        features = set(protocol.reader_features or []) | set(protocol.writer_features or [])
        if (protocol.min_reader_version, protocol.min_writer_version) > PROTOCOL and features - {"appendOnly", "invariants"}:
            raise StorageError(
                f"table {self.name} needs Delta features {sorted(features)} (protocol "
                f"{protocol.min_reader_version}/{protocol.min_writer_version}); the rs engine supports "
                f"protocol {PROTOCOL[0]}/{PROTOCOL[1]} without optional features"
            )
        if protocol.min_reader_version > 3 or protocol.min_writer_version > 7:
            raise StorageError(f"table {self.name} uses an unsupported Delta protocol")

    def version(self) -> int:
        return self._delta().version()

    def txn_version(self, app_id: str) -> int | None:
        """The last version committed by ``app_id`` (an idempotent writer), or None."""
        return self._delta().transaction_version(app_id)

    def files(self, keys: Iterable[str | None] | None = None, key_min: str | None = None,
              key_max: str | None = None, dt=None) -> list[DataFile]:
        """Data files of the current snapshot, pruned to cluster keys (``key_min <= key < key_max``).

        A merged file (a span: a whole day or month, see ``merge``) is listed when it holds any of the
        keys asked for; its other rows are filtered out by the reads.
        """
        keys, key_min, key_max = self._key_list(keys), self.key_of(key_min), self.key_of(key_max)
        index = self._file_index(dt or self._delta())
        if keys is not None:
            wanted = set(keys)
            if index.spans:
                width = _KEY_LENGTH[_SPAN_GRAIN[self.cluster.grain]]
                wanted |= {k[:width] for k in wanted if k is not None} & set(index.spans)
            picked = [entry for key in wanted for entry in index.by_key.get(key, ())]
        elif key_min is not None or key_max is not None:
            lo = bisect.bisect_left(index.keys, key_min) if key_min is not None else 0
            hi = bisect.bisect_left(index.keys, key_max) if key_max is not None else len(index.keys)
            picked = [entry for key in index.keys[lo:hi] for entry in index.by_key[key]]
            picked += [entry for span in index.spans if self._in_range(span, key_min, key_max)
                       for entry in index.by_key[span]]
        else:
            picked = [entry for entries in index.by_key.values() for entry in entries]
        return [f for _, f in sorted(picked, key=lambda entry: entry[0]) if self._in_range(f.key, key_min, key_max)]

    def _is_span(self, key: str | None) -> bool:
        """Whether ``key`` names a merged file (shorter than the keys of the table's grain)."""
        return key is not None and self.cluster is not None and len(key) < _KEY_LENGTH[self.cluster.grain]

    def _in_range(self, key: str | None, key_min: str | None, key_max: str | None) -> bool:
        """``key_min <= key < key_max`` for a key; for a span, whether any key it holds is in that range."""
        if key_min is None and key_max is None:
            return True
        if key is None:
            return False
        if self._is_span(key):
            # "~" sorts after every character of a key: span + "~" is above every key the span holds.
            return (key_min is None or key + "~" > key_min) and (
                key_max is None or key + _SPAN_FIRST[self.cluster.grain] < key_max)
        return (key_min is None or key >= key_min) and (key_max is None or key < key_max)

    def _key_mask(self, column, keys=None, key_min=None, key_max=None) -> np.ndarray:
        """Per row of a cluster column, whether its key is one of ``keys`` and within ``[key_min, key_max)``."""
        index, names = _key_groups(column, self.cluster.grain)
        wanted = set(keys) if keys is not None else None
        ok = np.array([(wanted is None or name in wanted) and self._in_range(name, key_min, key_max)
                       for name in (None if n == _NULL_KEY else n for n in names)], dtype=bool)
        return ok[index] if len(names) else np.zeros(len(index), dtype=bool)

    def _span_read(self, files: list[DataFile], keys, key_min, key_max) -> bool:
        """Whether a read of these files must filter rows by key (a merged file holds other keys too)."""
        return (keys is not None or key_min is not None or key_max is not None) and any(
            self._is_span(f.key) for f in files)

    def _file_index(self, dt) -> "_FileIndex":
        """The snapshot's data files by cluster key, parsed once per snapshot version (not once per read:
        a table's file list grows with its history, a micro-batch's reads must not)."""
        version = (id(dt), dt.version())
        cached = self.warehouse.file_indexes.get(self.name)
        if cached is not None and cached.version == version:
            return cached
        actions = pa.table(dt.get_add_actions(flatten=True))
        paths = actions.column("path").to_pylist()
        sizes = actions.column("size_bytes").to_pylist()
        rows = actions.column("num_records").to_pylist() if "num_records" in actions.column_names else [None] * len(paths)
        by_key: dict[str | None, list[tuple[int, DataFile]]] = {}
        for position, (path, size, count) in enumerate(zip(paths, sizes, rows)):
            match = _KEY_SEGMENT.search(path)
            key = match.group(1) if match else None
            key = None if key == _NULL_KEY else key
            by_key.setdefault(key, []).append((position, DataFile(path, size, key, count)))
        named = [k for k in by_key if k is not None]
        index = _FileIndex(version, by_key, sorted(k for k in named if not self._is_span(k)),
                           sorted(k for k in named if self._is_span(k)))
        self.warehouse.file_indexes[self.name] = index
        return index

    def keys(self) -> list[str]:
        """Distinct cluster keys present (sorted); a merged file's are read from its rows."""
        files = self.files()
        keys = {f.key for f in files if f.key is not None and not self._is_span(f.key)}
        spans = [str(self.path / f.path) for f in files if self._is_span(f.key)]
        if spans:
            column = pads.dataset(spans, schema=self.arrow_schema).to_table(columns=[self.cluster.column]).column(0)
            keys |= {k for k in _key_groups(column, self.cluster.grain)[1] if k != _NULL_KEY}
        return sorted(keys)

    # -- reads --------------------------------------------------------------------------
    def read_arrow(self, keys=None, key_min=None, key_max=None, columns=None, filter=None) -> pa.Table:
        """Read without Spark (driver-side, for small tables and checks)."""
        keys, key_min, key_max = self._key_list(keys), self.key_of(key_min), self.key_of(key_max)
        files = self.files(keys, key_min, key_max)
        if not files:
            table = self.arrow_schema.empty_table()
            return table.select(columns) if columns else table
        dataset = pads.dataset([str(self.path / f.path) for f in files], schema=self.arrow_schema, format="parquet")
        if not self._span_read(files, keys, key_min, key_max):
            return dataset.to_table(columns=columns, filter=filter)
        column = self.cluster.column
        wide = columns if columns is None or column in columns else [*columns, column]
        table = dataset.to_table(columns=wide, filter=filter)
        table = table.filter(pa.array(self._key_mask(table.column(column), keys, key_min, key_max)))
        return table.select(columns) if columns else table

    def read(self, keys=None, key_min=None, key_max=None):
        """A Spark DataFrame of the table (pruned to keys); an empty table reads as empty."""
        spark = self.warehouse.spark
        if spark is None:
            raise StorageError("reading with Spark needs a SparkSession")
        keys, key_min, key_max = self._key_list(keys), self.key_of(key_min), self.key_of(key_max)
        files = self.files(keys, key_min, key_max)
        schema = schemas.spark_schema(self.name)
        if not files:
            return spark.createDataFrame([], schema)
        df = spark.read.schema(schema).parquet(*[str(self.path / f.path) for f in files])
        return df.where(self._where(keys, key_min, key_max)) if self._span_read(files, keys, key_min, key_max) else df

    # -- writes -------------------------------------------------------------------------
    def append(self, data, txn: tuple[str, int] | None = None, op: str = "append") -> bool:
        """Append rows; with ``txn=(app_id, version)`` a version already committed is skipped."""
        return self._commit(data, remove_keys=None, txn=txn, op=op)

    def replace(self, data, keys: Iterable[str | None], txn: tuple[str, int] | None = None,
                op: str = "replace") -> bool:
        """Atomically replace the files of these cluster keys with ``data`` (which must fall inside them)."""
        return self._commit(data, remove_keys=set(self._check_keys(keys)), txn=txn, op=op)

    def overwrite(self, data, txn: tuple[str, int] | None = None, op: str = "overwrite") -> bool:
        """Atomically replace the whole table."""
        return self._commit(data, remove_keys="all", txn=txn, op=op)

    def delete_keys(self, keys: Iterable[str | None], txn: tuple[str, int] | None = None, op: str = "delete") -> bool:
        """Remove every row of these cluster keys in one commit."""
        return self._commit(None, remove_keys=set(self._check_keys(keys)), txn=txn, op=op)

    def delete_where(self, conditions: list[tuple[str, str, Any]], keys=None, txn=None, op: str = "delete") -> int:
        """Delete rows matching every ``(column, op, value)`` condition (ops: ``< <= = != >= >``).

        Only files that hold matching rows are rewritten (under the same cluster key), in one
        commit; returns the number of rows deleted.
        """
        from deltalake import CommitProperties, Transaction
        from deltalake._internal import RemoveAction

        dt = self._delta()
        if txn is not None:
            done = dt.transaction_version(txn[0])
            if done is not None and done >= txn[1]:
                return 0
        predicate = _arrow_predicate(conditions)
        folder = self.path / f"d{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"
        removes, deleted, now_ms = [], 0, _now_ms()
        keys = self._key_list(keys)
        for f in self.files(keys=keys, dt=dt):
            rows = pq.read_table(self.path / f.path, schema=self.arrow_schema)
            if keys is not None and self._is_span(f.key):
                # A merged file: only its rows of ``keys`` are candidates.
                numbered = rows.append_column("__row", pa.array(np.arange(rows.num_rows)))
                kept = np.zeros(rows.num_rows, dtype=bool)
                kept[numbered.filter(~predicate).column("__row").to_numpy()] = True
                keep = rows.filter(pa.array(kept | ~self._key_mask(rows.column(self.cluster.column), keys=keys)))
            else:
                keep = rows.filter(~predicate)
            if keep.num_rows == rows.num_rows:
                continue
            deleted += rows.num_rows - keep.num_rows
            removes.append(RemoveAction(f.path, True, now_ms, f.size, {}))
            if keep.num_rows:
                target = folder / (f"k={f.key if f.key is not None else _NULL_KEY}" if self.cluster else "")
                target.mkdir(parents=True, exist_ok=True)
                pq.write_table(keep, target / f"part-{len(removes):05d}.parquet",
                               write_statistics=_statistics(self.name))
        if not removes:
            return 0
        adds = [a for a, _ in self._add_actions(folder)]
        self.step(f"{self.name}.{op}.files_written")
        dt.create_write_transaction(adds + removes, mode="append", schema=self.arrow_schema, commit_properties=(
            CommitProperties(app_transactions=[Transaction(txn[0], txn[1])] if txn else None,
                             custom_metadata={"traffic.op": op})))
        self.step(f"{self.name}.{op}.committed")
        return deleted

    def step(self, name: str) -> None:
        self.warehouse.step(name)

    def _commit(self, data, remove_keys, txn, op) -> bool:
        from deltalake import CommitProperties, Transaction
        from deltalake._internal import RemoveAction

        dt = self._delta()
        if txn is not None:
            done = dt.transaction_version(txn[0])
            if done is not None and done >= txn[1]:
                return False
        self._add_new_columns(dt)
        adds = self._stage(data) if data is not None else []
        new_keys = {a_key for _, a_key in adds}
        if isinstance(remove_keys, set) and not new_keys <= remove_keys:
            raise StorageError(
                f"{self.name}: rows for {sorted(map(str, new_keys - remove_keys))} fall outside the keys being replaced"
            )
        now_ms = _now_ms()
        removes = []
        if remove_keys:
            old = self.files(dt=dt) if remove_keys == "all" else self.files(keys=remove_keys, dt=dt)
            removes = [RemoveAction(f.path, True, now_ms, f.size, {}) for f in old]
            if remove_keys != "all":
                # A merged day or month keeps its other keys: its rows outside ``remove_keys``, rewritten.
                adds += self._rewrite_spans([f for f in old if self._is_span(f.key) and f.key not in remove_keys],
                                            remove_keys)
        self.warehouse.step(f"{self.name}.{op}.files_written")
        if not adds and not removes and txn is None:
            return False
        properties = CommitProperties(
            app_transactions=[Transaction(txn[0], txn[1])] if txn else None,
            custom_metadata={"traffic.op": op},
        )
        dt.create_write_transaction(
            [a for a, _ in adds] + removes, mode="append", schema=self.arrow_schema, commit_properties=properties
        )
        self.warehouse.step(f"{self.name}.{op}.committed")
        return True

    def _add_new_columns(self, dt) -> None:
        """Columns added to ``schemas/<table>.json`` after the table was created join its Delta schema before a
        write (nullable: rows written before read as null). Its own commit, so a rerun finds it done."""
        from deltalake import Schema

        have = {f.name for f in dt.schema().fields}
        missing = [f for f in Schema.from_arrow(self.arrow_schema).fields if f.name not in have]
        if missing:
            dt.alter.add_columns(missing)
            dt.update_incremental()

    def _rewrite_spans(self, spans: list[DataFile], keys: set) -> list[tuple[Any, str | None]]:
        """Write each merged file's rows outside ``keys`` to a new file of the same span; their add actions."""
        if not spans:
            return []
        folder = self.path / f"s{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"
        for number, f in enumerate(spans):
            rows = pq.read_table(self.path / f.path, schema=self.arrow_schema)
            keep = rows.filter(pa.array(~self._key_mask(rows.column(self.cluster.column), keys=keys)))
            if keep.num_rows:
                target = folder / f"k={f.key}"
                target.mkdir(parents=True, exist_ok=True)
                pq.write_table(keep, target / f"part-{number:05d}.parquet", write_statistics=_statistics(self.name))
        return self._add_actions(folder)

    def _staging_folder(self) -> Path:
        # Inside the table root: committing staged files adds them where they are, no copy.
        return self.path / f"w{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"

    def _stage(self, data) -> list[tuple[Any, str | None]]:
        """Write ``data`` as parquet into a fresh folder; return (AddAction, key) per non-empty file."""
        if isinstance(data, Staged):
            if data.table != self.name or Path(data.folder).parent != self.path:
                raise StorageError(f"{self.name}: staged files of {data.table} at {data.folder} cannot be committed here")
            return self._add_actions(Path(data.folder))
        dest = self._staging_folder()
        if isinstance(data, pa.Table):
            write_keyed(data, self.name, dest, "part-00000", threads=DRIVER_THREADS)
        else:
            self._write_spark(data, dest)
        return self._add_actions(dest)

    def _write_spark(self, df, dest: Path) -> None:
        from pyspark.sql import functions as F

        schema = schemas.spark_schema(self.name)
        present = set(df.columns)
        df = df.select(*[
            (F.col(f.name) if f.name in present else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in schema.fields
        ])
        if self.cluster is None:
            df.write.parquet(str(dest))
        else:
            # Each key's rows to one task: one file per key and task-local writers. A task writing many
            # keys sorts its rows and opens a file per key; 240 hours of aggregates wrote 3.5x slower so.
            # Raw detail (large, few keys per batch) is written where it lies: shuffling it costs more.
            key = F.date_format(F.col(self.cluster.column), _SPARK_KEY_FORMATS[self.cluster.grain])
            df = df.withColumn("k", key)
            if self.name not in _RAW_TABLES:
                df = df.repartition("k")
            df.write.partitionBy("k").parquet(str(dest))

    def _add_actions(self, dest: Path) -> list[tuple[Any, str | None]]:
        from deltalake.transaction import AddAction

        actions = []
        if not dest.exists():
            return actions
        for path in sorted(dest.rglob("*")):
            if path.is_file() and (path.name.startswith((".", "_")) or path.suffix == ".crc"):
                path.unlink()  # Spark's _SUCCESS and .crc side files are not table data
        for path in sorted(dest.rglob("*.parquet")):
            meta = pq.read_metadata(path)
            relative = path.relative_to(self.path).as_posix()
            if meta.num_rows == 0:
                path.unlink()
                continue
            match = _KEY_SEGMENT.search(relative)
            key = match.group(1) if match else None
            key = None if key == _NULL_KEY else key
            stat = path.stat()
            stats = json.dumps({"numRecords": meta.num_rows})
            actions.append((AddAction(relative, stat.st_size, {}, int(stat.st_mtime * 1000), True, stats), key))
        return actions

    # -- maintenance --------------------------------------------------------------------
    def history(self, limit: int | None = None) -> list[dict]:
        return self._delta().history(limit)

    def compact(self, min_files: int | None = None) -> int:
        """Rewrite each cluster key with more than one small file into one file; returns files removed.

        A rewrite is ``dataChange=false``: readers and idempotent writers see the same rows.
        """
        dt = self._delta()
        files = self.files(dt=dt)
        threshold = min_files or self.warehouse.settings.compact_min_files
        if len(files) < threshold:
            return 0
        by_key: dict[str | None, list[DataFile]] = {}
        for f in files:
            by_key.setdefault(f.key, []).append(f)
        return self._combine(dt, by_key, "compact")

    def merge(self, before: datetime) -> int:
        """Merge each whole day before ``before`` of a table keyed by hour into one file keyed by the
        day (a table keyed by day: each month); returns files removed.

        Compaction keeps a file per key, so a table keyed by hour would gain a file an hour forever;
        merged, it gains one a day. Reads by hour still return only that hour's rows, and replacing or
        deleting an hour of a merged day rewrites the day's other hours (``_rewrite_spans``). A merge
        is ``dataChange=false``, like a compaction.
        """
        if self.cluster is None or self.cluster.grain not in _SPAN_GRAIN:
            return 0
        dt = self._delta()
        index = self._file_index(dt)
        grain = _SPAN_GRAIN[self.cluster.grain]
        bound, width = cluster_key(before, grain), _KEY_LENGTH[grain]
        by_span: dict[str, list[DataFile]] = {}
        for key in sorted(index.keys + index.spans):  # a span sorts before the keys it holds
            if key[:width] < bound:
                by_span.setdefault(key[:width], []).extend(f for _, f in index.by_key[key])
        return self._combine(dt, by_span, "merge")

    def _combine(self, dt, groups: dict[str | None, list[DataFile]], op: str) -> int:
        """Rewrite each group of two or more files as one file under the group's key, in one commit."""
        from deltalake import CommitProperties
        from deltalake._internal import RemoveAction
        from deltalake.transaction import AddAction

        folder = self.path / f"c{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"
        actions, removed, now_ms = [], 0, _now_ms()
        for key, group in groups.items():
            if len(group) < 2:
                continue
            rows = pads.dataset([str(self.path / f.path) for f in group], schema=self.arrow_schema).to_table()
            target = folder / (f"k={key if key is not None else _NULL_KEY}" if self.cluster else "") / "part-00000.parquet"
            target.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(rows, target, write_statistics=_statistics(self.name))
            stat = target.stat()
            actions.append(AddAction(target.relative_to(self.path).as_posix(), stat.st_size, {},
                                     int(stat.st_mtime * 1000), False, json.dumps({"numRecords": rows.num_rows})))
            actions += [RemoveAction(f.path, False, now_ms, f.size, {}) for f in group]
            removed += len(group)
        if not removed:
            return 0
        self.warehouse.step(f"{self.name}.{op}.files_written")
        dt.create_write_transaction(actions, mode="append", schema=self.arrow_schema,
                                    commit_properties=CommitProperties(custom_metadata={"traffic.op": op}))
        self.warehouse.step(f"{self.name}.{op}.committed")
        return removed

    def checkpoint(self) -> None:
        self._delta().create_checkpoint()

    def checkpoint_due(self) -> bool:
        """More than ``CHECKPOINT_EVERY`` commits since the last checkpoint (tables created with a longer
        interval, or commits made without delta-rs's post-commit checkpoint)."""
        try:
            last = json.loads((self.path / "_delta_log" / "_last_checkpoint").read_text())["version"]
        except (OSError, ValueError, KeyError):
            last = -1
        return self.version() - last > CHECKPOINT_EVERY

    def vacuum(self, retention_hours: int | None = None) -> list[str]:
        """Delete the files no current row is in: removed from the log, or never committed (a crashed
        write's), more than ``retention_hours`` ago (default: the table's ``deletedFileRetentionDuration``)."""
        deleted = self._delta().vacuum(retention_hours=retention_hours, dry_run=False,
                                       enforce_retention_duration=False, full=True)
        for folder in sorted({(self.path / name).parent for name in deleted}, key=lambda p: -len(p.parts)):
            while folder != self.path:  # the folders the deleted files leave empty (a write's own folder)
                try:
                    folder.rmdir()
                except OSError:
                    break
                folder = folder.parent
        return deleted

    def configure(self) -> bool:
        """Give a table made by an older version today's ``TABLE_CONFIGURATION``; whether it changed."""
        current = self._delta().metadata().configuration
        if all(current.get(name) == value for name, value in TABLE_CONFIGURATION.items()):
            return False
        self._delta().alter.set_table_properties(TABLE_CONFIGURATION)
        return True

    def cleanup_log(self) -> None:
        self._delta().cleanup_metadata()


_OPS = {"<": "__lt__", "<=": "__le__", "=": "__eq__", "!=": "__ne__", ">=": "__ge__", ">": "__gt__"}


def _arrow_predicate(conditions: list[tuple[str, str, Any]]):
    if not conditions:
        raise StorageError("delete_where needs at least one condition (use delete_keys to drop partitions)")
    expression = None
    for column, op, value in conditions:
        if op not in _OPS:
            raise StorageError(f"unsupported condition operator {op!r}")
        term = getattr(pads.field(column), _OPS[op])(value)
        expression = term if expression is None else expression & term
    return expression


def _sql_predicate(conditions: list[tuple[str, str, Any]]) -> str:
    def literal(value):
        if isinstance(value, (datetime, date)):
            return f"'{value.isoformat()}'"
        return repr(value)

    return " AND ".join(f"`{c}` {'=' if op == '=' else op} {literal(v)}" for c, op, v in conditions)


def conform(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """Select and cast ``data`` to ``schema`` (missing columns become nulls)."""
    arrays = []
    for field in schema:
        if field.name in data.column_names:
            arrays.append(data.column(field.name).cast(field.type))
        else:
            arrays.append(pa.nulls(data.num_rows, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


class SparkDeltaTable(Table):
    """delta-spark engine: used where Delta Lake's jars are on Spark's classpath.

    Verified only where those jars are present (not on this project's CI, which has no
    Maven access); the contract suite runs against it when they are.
    """

    def _spark(self):
        return self.warehouse.spark

    def exists(self) -> bool:
        return (self.path / "_delta_log").is_dir()

    def _delta(self):
        from delta.tables import DeltaTable

        return DeltaTable.forPath(self._spark(), str(self.path))

    def create(self) -> None:
        from delta.tables import DeltaTable

        builder = DeltaTable.createIfNotExists(self._spark()).location(str(self.path))
        builder = builder.addColumns(schemas.spark_schema(self.name))
        for name, value in TABLE_CONFIGURATION.items():
            builder = builder.property(name, value.replace("interval ", "interval "))
        builder.property("delta.minReaderVersion", str(PROTOCOL[0])).property(
            "delta.minWriterVersion", str(PROTOCOL[1])).execute()

    def version(self) -> int:
        return int(self._delta().history(1).collect()[0]["version"])

    def txn_version(self, app_id: str) -> int | None:
        from deltalake import DeltaTable as RsDeltaTable  # reading the log is engine-neutral

        return RsDeltaTable(str(self.path)).transaction_version(app_id)

    def read(self, keys=None, key_min=None, key_max=None):
        df = self._spark().read.format("delta").load(str(self.path))
        where = self._where(keys, key_min, key_max)
        return df.where(where) if where else df

    def read_arrow(self, keys=None, key_min=None, key_max=None, columns=None, filter=None) -> pa.Table:
        df = self.read(keys, key_min, key_max)
        table = conform(df.toArrow(), self.arrow_schema)
        if filter is not None:
            table = table.filter(filter)
        return table.select(columns) if columns else table

    def keys(self) -> list[str]:
        from pyspark.sql import functions as F

        if not self.cluster:
            return []
        fmt = _SPARK_KEY_FORMATS[self.cluster.grain]
        rows = self.read().select(F.date_format(self.cluster.column, fmt).alias("k")).distinct().collect()
        return sorted(r["k"] for r in rows if r["k"] is not None)

    def _staging_folder(self) -> Path:
        return self.warehouse.state_dir() / "staging" / self.name / uuid.uuid4().hex

    def _frame(self, data):
        if isinstance(data, Staged):
            schema = schemas.spark_schema(self.name)
            if not any(Path(data.folder).rglob("*.parquet")):
                return self._spark().createDataFrame([], schema)
            return self._spark().read.schema(schema).parquet(data.folder).select(*schema.fieldNames())
        if isinstance(data, pa.Table):
            return self._spark().createDataFrame(conform(data, self.arrow_schema).to_pandas(),
                                                 schemas.spark_schema(self.name))
        return data

    def _write(self, data, mode: str, where: str | None, txn, op: str) -> bool:
        if txn is not None:
            done = self.txn_version(txn[0])
            if done is not None and done >= txn[1]:
                return False
        # Columns added to the schema after the table was created join it (nullable; older rows read as null).
        writer = self._frame(data).write.format("delta").mode(mode).option("mergeSchema", "true")
        if where:
            writer = writer.option("replaceWhere", where)
        if txn is not None:
            writer = writer.option("txnAppId", txn[0]).option("txnVersion", txn[1])
        self.warehouse.step(f"{self.name}.{op}.files_written")
        writer.save(str(self.path))
        self.warehouse.step(f"{self.name}.{op}.committed")
        return True

    def append(self, data, txn=None, op="append") -> bool:
        return self._write(data, "append", None, txn, op)

    def replace(self, data, keys, txn=None, op="replace") -> bool:
        return self._write(data, "overwrite", self._where(keys=list(keys)) or "false", txn, op)

    def overwrite(self, data, txn=None, op="overwrite") -> bool:
        return self._write(data, "overwrite", None, txn, op)

    def delete_keys(self, keys, txn=None, op="delete") -> bool:
        empty = self._spark().createDataFrame([], schemas.spark_schema(self.name))
        return self._write(empty, "overwrite", self._where(keys=list(keys)) or "false", txn, op)

    def delete_where(self, conditions, keys=None, txn=None, op="delete") -> int:
        where = _sql_predicate(conditions)
        scope = self._where(keys=list(keys)) if keys is not None else None
        condition = f"({where}) AND ({scope})" if scope else where
        before = self.read().count()
        self.warehouse.step(f"{self.name}.{op}.files_written")
        self._delta().delete(condition)
        self.warehouse.step(f"{self.name}.{op}.committed")
        return before - self.read().count()

    def history(self, limit=None) -> list[dict]:
        return [r.asDict() for r in self._delta().history(limit or 1000).collect()]

    def compact(self, min_files=None) -> int:
        self._delta().optimize().executeCompaction()
        return 0

    def merge(self, before: datetime) -> int:
        """delta-spark prunes by the rows' keys, not by folder: its compaction's files may span keys already."""
        return 0

    def checkpoint(self) -> None:
        from deltalake import DeltaTable as RsDeltaTable

        RsDeltaTable(str(self.path)).create_checkpoint()

    def checkpoint_due(self) -> bool:
        """delta-spark checkpoints at the table's interval itself."""
        return False

    def vacuum(self, retention_hours: int | None = None) -> list[str]:
        self._delta().vacuum(retention_hours)
        return []

    def configure(self) -> bool:
        """delta-spark tables keep the properties they were created with."""
        return False

    def cleanup_log(self) -> None:
        """delta-spark cleans expired log entries itself at checkpoints."""
