"""The warehouse's run state: one job at a time (the lock, or on object storage the lease), and the plan of the
batch in progress."""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

from traffic.storage.place import Place, object_store


#: The warehouse's folder for its run state (journal, lock, scratch, staging, the Spark Connect record).
STATE_FOLDER = "_traffic"


def state_folder(warehouse_root: Place | Path | str) -> Place:
    """Where a warehouse keeps its run state (not a table); it may not exist yet."""
    return Place.of(warehouse_root) / STATE_FOLDER


def host_folder(warehouse_root: Place | Path | str, name: str = STATE_FOLDER) -> Path:
    """Where this host keeps what is its own for a warehouse (the warm Spark Connect server's record, caches,
    the HTML reports and Data Docs): ``<warehouse>/<name>`` on a local disk; for a warehouse on object
    storage, ``$TRAFFIC_HOST_DIR/<bucket>/<prefix>/<name>`` (default ``~/.cache/traffic``)."""
    root = Place.of(warehouse_root)
    if root.is_local:
        return root.local / name
    base = Path(os.environ.get("TRAFFIC_HOST_DIR") or Path.home() / ".cache" / "traffic").expanduser()
    return base / root.location.bucket / root.location.prefix / name


def pending_batch(warehouse_root: Place | Path | str) -> dict | None:
    """The plan of a batch that was started and not finished, read without creating anything."""
    return Journal(state_folder(warehouse_root)).load()


class LockTimeout(RuntimeError):
    """Another job holds the warehouse lock for longer than ``lock_timeout``."""


class Journal:
    """The plan of the batch in progress, written before any table is touched.

    A rerun after a crash finds it and redoes the same batch (same id, files, watermark and
    clock), so every table write is an idempotent repeat.
    """

    def __init__(self, state_dir: Place):
        self.path = Place.of(state_dir) / "pending-batch.json"

    def load(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (FileNotFoundError, NotADirectoryError):
            return None

    def save(self, plan: dict) -> None:
        self.path.write_atomic(json.dumps(plan, indent=1, default=str))

    def clear(self) -> None:
        self.path.unlink()


#: The lease each warehouse on object storage is held by in this process (its root's URI -> the keeper):
#: what a commit checks first (``check_lease``).
_LEASES: dict[str, object] = {}


@contextmanager
def warehouse_lock(state_dir: Place | Path, timeout_seconds: float, holder: str, lease_ttl: float = 30.0):
    """One job at a time per warehouse (ingest, close, replay): the loser waits, then fails clearly. On a
    local disk an ``flock``; on object storage the warehouse's lease (``traffic.storage.lease``), renewed
    while the job runs and checked before every commit (``check_lease``)."""
    state_dir = Place.of(state_dir)
    if state_dir.is_local:
        with _file_lock(state_dir.local, timeout_seconds, holder):
            yield
        return
    from traffic.storage.lease import LeaseHeld, lease_lock  # deferred: only a warehouse on object storage has one

    root = state_dir.parent.uri
    try:
        with lease_lock(object_store(state_dir.location), holder, timeout_seconds, ttl=lease_ttl) as keeper:
            _LEASES[root] = keeper
            try:
                yield
            finally:
                _LEASES.pop(root, None)
    except LeaseHeld as held:
        raise LockTimeout(f"the warehouse is busy: {held}; retry when it has finished") from None


def check_lease(root: Place) -> None:
    """Before a commit to a warehouse on object storage: ``LeaseLost`` unless this process still holds its
    lease. Nothing to check on a local disk (the ``flock`` cannot be lost) or where no lock was taken
    (a test's, or a tool's single writes)."""
    keeper = _LEASES.get(root.uri)
    if keeper is not None:
        keeper.check()


@contextmanager
def _file_lock(state_dir: Path, timeout_seconds: float, holder: str):
    path = state_dir / "lock"
    handle = open(path, "a+")
    deadline = time.monotonic() + timeout_seconds
    try:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    handle.seek(0)
                    who = handle.read().strip() or "another traffic job"
                    raise LockTimeout(
                        f"the warehouse is busy: {who} holds {path} (waited {timeout_seconds:.0f} s); "
                        "retry when it has finished"
                    ) from None
                time.sleep(0.2)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{holder} (pid {os.getpid()})")
        handle.flush()
        yield
    finally:
        try:
            handle.seek(0)
            handle.truncate()
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
