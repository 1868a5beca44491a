"""The warehouse's run state on disk: one job at a time (the lock), and the plan of the batch in progress."""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path


#: The warehouse's folder for its run state (journal, lock, scratch, staging, the Spark Connect record).
STATE_FOLDER = "_traffic"


def state_folder(warehouse_root: Path | str) -> Path:
    """Where a warehouse keeps its run state (not a table); it may not exist yet."""
    return Path(warehouse_root) / STATE_FOLDER


def pending_batch(warehouse_root: Path | str) -> dict | None:
    """The plan of a batch that was started and not finished, read without creating anything."""
    folder = state_folder(warehouse_root)
    return Journal(folder).load() if folder.is_dir() else None


class LockTimeout(RuntimeError):
    """Another job holds the warehouse lock for longer than ``lock_timeout``."""


class Journal:
    """The plan of the batch in progress, written before any table is touched.

    A rerun after a crash finds it and redoes the same batch (same id, files, watermark and
    clock), so every table write is an idempotent repeat.
    """

    def __init__(self, state_dir: Path):
        self.path = state_dir / "pending-batch.json"

    def load(self) -> dict | None:
        if not self.path.exists():
            return None
        return json.loads(self.path.read_text())

    def save(self, plan: dict) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(plan, indent=1, default=str))
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        tmp.replace(self.path)

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


@contextmanager
def warehouse_lock(state_dir: Path, timeout_seconds: float, holder: str):
    """One job at a time per warehouse (ingest, close, replay): the loser waits, then fails clearly."""
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
