"""The warehouse: every table under one root, and the one door to them (DESIGN §8).

Callers ask it for a table by name and hand the table rows with a write intent (append batch N,
replace these periods, delete where); which engine writes is decided here, once, from the settings,
and nothing outside ``traffic.storage`` knows it (``traffic.storage.engine`` says which, and why). ``Warehouse.reader`` opens the tables for reading
only: no Spark, no engine, any writer's tables.
"""

from __future__ import annotations

from traffic.core.settings import Settings
from traffic.storage import schemas
from traffic.storage.engine import choose_engine
from traffic.storage.faults import injector
from pathlib import Path

from traffic.storage.journal import STATE_FOLDER, host_folder, state_folder, warehouse_lock
from traffic.storage.place import Place
from traffic.storage.table import FileIndex, StorageError, Table


class Warehouse:
    """All tables under one root, written by one engine (or opened for reading only)."""

    def __init__(self, settings: Settings, spark=None, engine: str | None = None):
        """``spark`` is a SparkSession, or a function returning one, called when a write first needs it
        (an empty micro-batch decides so without starting Spark)."""
        self.settings = settings
        self.root = Place.of(settings.warehouse)  # a local folder or s3://bucket/prefix
        self._spark = spark
        self.engine = engine or choose_engine(settings)
        self.faults = injector(settings)
        self.snapshots: dict[str, object] = {}  # table name -> loaded delta-rs snapshot
        self.file_indexes: dict[str, FileIndex] = {}  # table name -> its snapshot's files by key

    @property
    def spark(self):
        """The session writes and Spark reads use (started on first use when given as a function); None if none."""
        if callable(self._spark):
            self._spark = self._spark()
        return self._spark

    @classmethod
    def reader(cls, settings: Settings) -> "Warehouse":
        """The tables opened for reading only (Arrow reads, no Spark): any engine's tables; writes refused."""
        return cls(settings, engine="read")

    def with_spark(self, spark) -> "Warehouse":
        """A handle for the Spark part of a job, sharing the snapshots this one has loaded (a table
        re-opened reads its last checkpoint and every commit since: ~10 ms each after a month)."""
        other = Warehouse(self.settings, spark=spark, engine=self.engine)
        other.snapshots, other.file_indexes = self.snapshots, self.file_indexes
        return other

    def step(self, name: str) -> None:
        """A named point of a write (the crash tests' kill points)."""
        self.faults.reached(name)

    def table(self, name: str) -> Table:
        if name not in schemas.TABLES:
            raise StorageError(f"unknown table {name!r}")
        if self.engine == "read":
            return Table(self, name)
        if self.engine == "spark":
            from traffic.storage.engines.spark import SparkTable  # deferred: one engine per process

            return SparkTable(self, name)
        from traffic.storage.engines.rs import RsTable  # deferred: one engine per process

        return RsTable(self, name)

    def state_dir(self) -> Place:
        """Where the pipeline keeps its journal and lock (not a table)."""
        path = state_folder(self.root)
        try:
            path.mkdir()
        except OSError as error:
            raise StorageError(f"warehouse {self.root} cannot be used: {error.strerror or error}") from None
        return path

    def host_dir(self, name: str = STATE_FOLDER) -> Path:
        """This host's own folder for the warehouse (``journal.host_folder``), made if missing."""
        path = host_folder(self.root, name)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StorageError(f"{path} cannot be used: {error.strerror or error}") from None
        return path

    def lock(self, holder: str):
        """One job at a time on this warehouse (``journal.warehouse_lock``: an ``flock``, or on object storage
        the lease), waiting up to ``lock_timeout``."""
        return warehouse_lock(self.state_dir(), self.settings.lock_timeout.total_seconds(), holder,
                              self.settings.lease_ttl.total_seconds())

    def exists(self) -> bool:
        return (self.root / "clocks" / "_delta_log").is_dir()

    def scratch(self, name: str, fresh: bool = True) -> Place:
        """The folder for one job's intermediate files: emptied (what is left of an earlier attempt is
        removed) unless ``fresh`` is false, which finds an earlier attempt's (the folder may not exist)."""
        path = self.state_dir() / "scratch" / name
        if fresh:
            path.rmtree()
            path.mkdir()
        return path

    def drop_scratch(self, path: Place) -> None:
        path.rmtree()

    def create_all(self) -> None:
        """Create every table that does not exist yet (idempotent)."""
        for name in schemas.TABLES:
            self.table(name).create()
