"""The reports of a warehouse on object storage, kept on the store: ``<warehouse>/_reports/`` there.

GX, the HTML report and the metrics file write to a folder of this host (``reports_folder``); for a
warehouse on object storage that folder is a working copy, kept in step with the store:

* ``fetch_reports`` (before Data Docs are built, and before ``traffic report``) brings what other hosts
  published since this one last looked, so the Data Docs index and the report's links cover every run;
* ``publish_reports`` (when a job ends, after its metrics) catches up the same way, then sends what this host
  wrote or changed, and deletes on the store what this host removed (results pruned by ``dq_retention``,
  results archived). A file changed both here and on the store since this host last looked: this host's
  version is sent (the last job's wins).

A manifest beside the copy (``.on-store.json``: per file, its size and modification time here and its ETag
on the store) is what both compare with, so each sends or fetches only what changed, and a file this host
never had is never deleted on the store. Each send that changed something writes a numbered change record
(``_reports/.changes/``), and a fetch reads only the records after the last it applied: a listing that
starts there, so a fetch costs what changed, not the thousands of pages a quarter of Data Docs holds
(listing 13,000 keys takes ~3.9 s on SeaweedFS here). Jobs that write reports hold the warehouse's lease,
so two hosts seldom publish at once, and when they do each takes its own record number (created only if
absent). Hidden names (GX's store ids, temporary files) stay on their host.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from traffic.storage.journal import host_folder
from traffic.storage.place import Place, object_store
from traffic.storage.warehouse import Warehouse

PREFIX = "_reports/"
#: Change records, one per job that sent or removed something: ``{"put": {name: etag}, "deleted": [name]}``.
CHANGES = f"{PREFIX}.changes/"
#: Change records kept: about a month of 5-minute ticks. A host away for longer compares with everything once.
KEEP_CHANGES = 10_000
MANIFEST = ".on-store.json"


def reports_folder(warehouse: Warehouse) -> Path:
    """``<warehouse>/_reports``: the HTML report, Data Docs and metrics (not a table). For a warehouse on object
    storage, this host's working copy of the store's (``journal.host_folder``)."""
    return host_folder(warehouse.root, "_reports")


def _on_store(warehouse: Warehouse):
    """The store and this host's copy of a warehouse on object storage; None for a local warehouse."""
    root = Place.of(warehouse.root)
    return None if root.is_local else (object_store(root.location), reports_folder(warehouse))


def _load(folder: Path) -> dict:
    """The manifest: ``files`` (name → size, mtime_ns here, etag there) and ``seen`` (the last change applied)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return {"files": {}}
    return manifest if isinstance(manifest.get("files"), dict) else {"files": {}}


def _save(folder: Path, manifest: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f"{MANIFEST}.{os.getpid()}"
    temporary.write_text(json.dumps(manifest, sort_keys=True))
    os.replace(temporary, folder / MANIFEST)


def _stamp(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_size, info.st_mtime_ns


def _same(entry: dict | None, path: Path) -> bool:
    return entry is not None and (entry.get("size"), entry.get("mtime_ns")) == _stamp(path)


def _change_key(number: int) -> str:
    return f"{CHANGES}{number:012d}.json"


def _changes_after(store, seen: int) -> list[tuple[int, str]]:
    """The change records after number ``seen``, in order (one listing that starts after it: costs what is new)."""
    import obstore  # deferred: only a warehouse on object storage needs it

    found = []
    for batch in obstore.list(store, prefix=CHANGES, offset=_change_key(seen) if seen else None):
        for meta in batch:
            stem = meta["path"][len(CHANGES):].removesuffix(".json")
            if stem.isdigit() and int(stem) > seen:
                found.append((int(stem), meta["path"]))
    return sorted(found)


def _bring(store, folder: Path, files: dict, name: str, etag: str) -> bool:
    """Write the store's ``name`` here unless this host already has that version; whether it wrote."""
    import obstore  # deferred: only a warehouse on object storage needs it

    path = folder / name
    if path.exists() and (files.get(name, {}).get("etag") == etag or not _same(files.get(name), path)):
        return False  # this version, or a file written here since (this host sends it next: it wins)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        temporary.write_bytes(bytes(obstore.get(store, PREFIX + name).bytes()))
    except FileNotFoundError:  # removed since (a later change says so)
        return False
    os.replace(temporary, path)
    size, mtime_ns = _stamp(path)
    files[name] = {"etag": etag, "size": size, "mtime_ns": mtime_ns}
    return True


def _drop(folder: Path, files: dict, name: str) -> None:
    """Forget ``name``, removed on the store by another host; its copy here goes unless changed here since."""
    path = folder / name
    if name in files and path.is_file() and _same(files[name], path):
        path.unlink()
    files.pop(name, None)


def _resync(store, folder: Path, manifest: dict) -> int:
    """Compare with a listing of all of ``_reports/`` (a host's first fetch, or one away for longer than the
    change records kept): what grows with history, so done only then."""
    import obstore  # deferred: only a warehouse on object storage needs it

    latest = _changes_after(store, 0)
    listed = {}
    for batch in obstore.list(store, prefix=PREFIX):
        for meta in batch:
            name = meta["path"][len(PREFIX):]
            if name and not any(part.startswith(".") for part in name.split("/")):
                listed[name] = meta["e_tag"]
    files = manifest["files"]
    fetched = sum(_bring(store, folder, files, name, etag) for name, etag in sorted(listed.items()))
    for name in [n for n in files if n not in listed]:
        _drop(folder, files, name)
    manifest["seen"] = latest[-1][0] if latest else 0
    return fetched


def fetch_reports(warehouse: Warehouse) -> int:
    """Bring this host's copy up to the store's ``_reports/``; returns the files written here."""
    where = _on_store(warehouse)
    if where is None:
        return 0
    store, folder = where
    manifest = _load(folder)
    fetched = _catch_up(store, folder, manifest)
    _save(folder, manifest)
    return fetched


def _catch_up(store, folder: Path, manifest: dict) -> int:
    """Apply the change records other hosts wrote since this host's last; a host that has applied none yet, or
    whose last is older than the records kept, compares with a listing of everything once instead."""
    import obstore  # deferred: only a warehouse on object storage needs it

    seen = manifest.get("seen")
    changes = _changes_after(store, seen) if seen is not None else []
    if seen is None or (changes and changes[0][0] != seen + 1):
        return _resync(store, folder, manifest)
    fetched, files = 0, manifest["files"]
    for number, key in changes:
        try:
            change = json.loads(bytes(obstore.get(store, key).bytes()))
        except FileNotFoundError:  # pruned meanwhile: compare with everything instead
            return fetched + _resync(store, folder, manifest)
        fetched += sum(_bring(store, folder, files, name, etag) for name, etag in sorted(change["put"].items()))
        for name in change["deleted"]:
            _drop(folder, files, name)
        manifest["seen"] = number
    return fetched


def publish_reports(warehouse: Warehouse) -> tuple[int, int]:
    """Send this host's new or changed report files to the store, delete there what it removed, and record both
    as the next change record; returns (files sent, files deleted)."""
    import obstore  # deferred: only a warehouse on object storage needs it

    where = _on_store(warehouse)
    if where is None or not where[1].is_dir():
        return 0, 0
    store, folder = where
    manifest = _load(folder)
    _catch_up(store, folder, manifest)  # what others changed first: then this host's record comes next
    files, present, put = manifest["files"], set(), {}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if not path.is_file() or any(part.startswith(".") for part in relative.parts):
            continue
        name = relative.as_posix()
        present.add(name)
        if _same(files.get(name), path):
            continue
        size, mtime_ns = _stamp(path)
        answer = obstore.put(store, PREFIX + name, path.read_bytes())
        files[name] = {"etag": answer.get("e_tag"), "size": size, "mtime_ns": mtime_ns}
        put[name] = files[name]["etag"]
    gone = sorted(n for n in files if n not in present)
    for start in range(0, len(gone), 1000):
        obstore.delete(store, [PREFIX + n for n in gone[start:start + 1000]])
    for name in gone:
        del files[name]
    if put or gone:
        _record(store, manifest, {"put": put, "deleted": gone})
    _save(folder, manifest)
    return len(put), len(gone)


def _record(store, manifest: dict, change: dict) -> None:
    """Write ``change`` as the next change record (created only if absent: two hosts never take one number),
    and delete the one that falls out of the ``KEEP_CHANGES`` kept."""
    import obstore  # deferred: only a warehouse on object storage needs it
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    seen = manifest.get("seen") or 0
    pending = _changes_after(store, seen)
    number = (pending[-1][0] if pending else seen) + 1
    data = json.dumps(change, sort_keys=True).encode()
    for _ in range(100):
        try:
            obstore.put(store, _change_key(number), data, mode="create")
            break
        except (AlreadyExistsError, PreconditionError):
            number += 1
    if not pending and number == seen + 1:
        manifest["seen"] = number  # nothing of another host's between: this host has seen everything to here
    if number > KEEP_CHANGES:
        obstore.delete(store, _change_key(number - KEEP_CHANGES))


def _quietly(step: Callable[[Warehouse], object], done: str, warehouse: Warehouse,
             progress: Callable[[str], None]) -> None:
    """``step(warehouse)``; a failure is one warning line (reports are a view: the tables are what counts)."""
    try:
        step(warehouse)
    except Exception as error:  # noqa: BLE001 - reports never fail a job
        first = str(error).splitlines()[0][:200] if str(error) else ""
        progress(f"warning: reports not {done} {Place.of(warehouse.root).uri}/{PREFIX}: {type(error).__name__}: {first}")


def publish_quietly(warehouse: Warehouse, progress: Callable[[str], None]) -> None:
    """``publish_reports``, a failure being one warning line."""
    _quietly(publish_reports, "sent to", warehouse, progress)


def fetch_quietly(warehouse: Warehouse, progress: Callable[[str], None]) -> None:
    """``fetch_reports``, a failure being one warning line (this host's copy is then what it builds on)."""
    _quietly(fetch_reports, "fetched from", warehouse, progress)
