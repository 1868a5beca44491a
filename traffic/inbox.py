"""The inbox: which files are new, who sent them, and what part of them is still to be counted.

A file is keyed by (source, sha256 of its content). Conventions a sender follows:

* write to a hidden name (``.name``) or one ending in ``.tmp``/``.part``/``.partial`` and
  rename when complete; such files are never taken (``min_file_age`` adds a quiet period);
* ``inbox/<source>/…`` gives the source; files directly in the inbox are ``default``.

Appending to an already counted file counts only the new tail when the counted content is
an unchanged prefix; any other change to a counted file is rejected whole, with a reason.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

ACCOUNTED = "accounted"
DUPLICATE = "duplicate"
APPENDED = "appended"
CHANGED = "rejected"
REPLAYED = "replayed"
TO_READ = (ACCOUNTED, APPENDED, REPLAYED)
_INCOMPLETE_SUFFIXES = (".tmp", ".part", ".partial", ".crdownload")


class InboxError(RuntimeError):
    """The inbox cannot be read; the message says why."""


class LockTimeout(RuntimeError):
    """Another job holds the warehouse lock for longer than ``lock_timeout``."""


@dataclass(frozen=True)
class InboxFile:
    """One file of the inbox and what this batch does with it."""

    name: str  # path relative to the inbox
    path: str  # absolute path
    source: str
    size: int
    mtime_ns: int
    sha256: str = ""
    status: str = ACCOUNTED
    start: int = 0  # first byte still to count (appended files)
    note: str = ""


def scan(inbox: Path, min_age_seconds: float = 0.0, now: float | None = None) -> list[InboxFile]:
    """Complete files of the inbox, sorted by name (hidden and in-progress names are skipped)."""
    if not inbox.exists():
        raise InboxError(f"inbox {inbox} does not exist (create it, or set TRAFFIC_INBOX / --inbox)")
    if not inbox.is_dir():
        raise InboxError(f"inbox {inbox} is not a directory")
    now = time.time() if now is None else now
    found = []
    for root, dirs, files in os.walk(inbox):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        for name in sorted(files):
            if name.startswith((".", "_")) or name.lower().endswith(_INCOMPLETE_SUFFIXES):
                continue
            path = Path(root) / name
            stat = path.stat()
            if now - stat.st_mtime < min_age_seconds:
                continue
            relative = path.relative_to(inbox)
            source = relative.parts[0] if len(relative.parts) > 1 else "default"
            found.append(InboxFile(relative.as_posix(), str(path), source, stat.st_size, stat.st_mtime_ns))
    return found


def sha256_of(path: str, limit: int | None = None) -> str:
    """Hex sha256 of a file's content (of its first ``limit`` bytes when given)."""
    digest = hashlib.sha256()
    remaining = limit
    with open(path, "rb") as handle:
        while True:
            size = 8 << 20 if remaining is None else min(8 << 20, remaining)
            if size == 0:
                break
            block = handle.read(size)
            if not block:
                break
            digest.update(block)
            if remaining is not None:
                remaining -= len(block)
    return digest.hexdigest()


def plan_files(found: list[InboxFile], known: list[dict]) -> list[InboxFile]:
    """Decide each found file's fate against what earlier batches recorded (``batches.files``).

    Files already handled under the same name, size and mtime are left out without being
    read again, so a batch costs what is new, not what the inbox has accumulated.
    """
    handled = {(k["source"], k["name"], k["size"], k.get("mtime_ns")) for k in known}
    # Content replayed for a time range counts as seen: a later delivery of it must not count that range twice.
    by_content = {(k["source"], k["sha256"]) for k in known if k["status"] in TO_READ}
    latest_by_name: dict[tuple[str, str], dict] = {}
    for k in known:
        if k["status"] in (ACCOUNTED, APPENDED):
            latest_by_name[(k["source"], k["name"])] = k
    planned: list[InboxFile] = []
    seen_now: set[tuple[str, str]] = set()
    for f in found:
        if (f.source, f.name, f.size, f.mtime_ns) in handled:
            continue
        digest = sha256_of(f.path)
        f = InboxFile(**{**asdict(f), "sha256": digest})
        key = (f.source, digest)
        if key in by_content or key in seen_now:
            planned.append(InboxFile(**{**asdict(f), "status": DUPLICATE,
                                        "note": "same content already accounted for this source"}))
            continue
        previous = latest_by_name.get((f.source, f.name))
        if previous is not None:
            old_size = previous["size"]
            if f.size > old_size and sha256_of(f.path, old_size) == previous["sha256"]:
                planned.append(InboxFile(**{**asdict(f), "status": APPENDED, "start": old_size}))
            else:
                planned.append(InboxFile(**{**asdict(f), "status": CHANGED, "note": (
                    f"file changed after it was counted (was {old_size} bytes, sha256 {previous['sha256'][:12]}…, "
                    f"now {f.size} bytes): only appending to a counted file is allowed; deliver corrections "
                    "as a new file or restate the range")}))
        else:
            planned.append(f)
        seen_now.add(key)
    return planned


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
