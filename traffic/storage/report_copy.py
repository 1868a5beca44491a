"""The reports of a warehouse on object storage, kept on the store: ``<warehouse>/_reports/`` there.

GX, the HTML report and the metrics file write to a folder of this host (``reports_folder``); for a
warehouse on object storage that folder is a working copy, kept in step with the store:

* ``fetch_reports`` (before Data Docs are built, and before ``traffic report``) brings what other hosts
  published since this one last looked, so the Data Docs index and the report's links cover every run;
* ``publish_reports`` (when a job ends, after its metrics) sends what this host wrote or changed, and
  deletes on the store what this host removed (results pruned by ``dq_retention``, results archived).

A manifest beside the copy (``.on-store.json``: per file, its size and modification time here and its ETag
on the store) is what both compare with, so each sends or fetches only what changed, and a file this host
never had is never deleted on the store. Jobs that write reports hold the warehouse's lease, so two hosts
never publish at once. Hidden names (GX's store ids, temporary files) stay on their host.
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
MANIFEST = ".on-store.json"


def reports_folder(warehouse: Warehouse) -> Path:
    """``<warehouse>/_reports``: the HTML report, Data Docs and metrics (not a table). For a warehouse on object
    storage, this host's working copy of the store's (``journal.host_folder``)."""
    return host_folder(warehouse.root, "_reports")


def _on_store(warehouse: Warehouse):
    """The store and this host's copy of a warehouse on object storage; None for a local warehouse."""
    root = Place.of(warehouse.root)
    return None if root.is_local else (object_store(root.location), reports_folder(warehouse))


def _load(folder: Path) -> dict[str, dict]:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


def _save(folder: Path, manifest: dict[str, dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f"{MANIFEST}.{os.getpid()}"
    temporary.write_text(json.dumps(manifest, sort_keys=True))
    os.replace(temporary, folder / MANIFEST)


def _stamp(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_size, info.st_mtime_ns


def _same(entry: dict | None, path: Path) -> bool:
    return entry is not None and (entry.get("size"), entry.get("mtime_ns")) == _stamp(path)


def fetch_reports(warehouse: Warehouse) -> int:
    """Bring this host's copy up to the store's ``_reports/``; returns the files written here."""
    import obstore  # deferred: only a warehouse on object storage needs it

    where = _on_store(warehouse)
    if where is None:
        return 0
    store, folder = where
    manifest = _load(folder)
    listed = {meta["path"][len(PREFIX):]: meta["e_tag"]
              for batch in obstore.list(store, prefix=PREFIX) for meta in batch}
    fetched = 0
    for name, etag in sorted(listed.items()):
        if not name or name.endswith("/") or (manifest.get(name, {}).get("etag") == etag and (folder / name).exists()):
            continue
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.part")
        temporary.write_bytes(bytes(obstore.get(store, PREFIX + name).bytes()))
        os.replace(temporary, path)
        size, mtime_ns = _stamp(path)
        manifest[name] = {"etag": etag, "size": size, "mtime_ns": mtime_ns}
        fetched += 1
    for name in [n for n in manifest if n not in listed]:  # removed on the store by another host
        path = folder / name
        if path.is_file() and _same(manifest[name], path):
            path.unlink()
        del manifest[name]
    _save(folder, manifest)
    return fetched


def publish_reports(warehouse: Warehouse) -> tuple[int, int]:
    """Send this host's new or changed report files to the store, delete there what it removed; returns
    (files sent, files deleted)."""
    import obstore  # deferred: only a warehouse on object storage needs it

    where = _on_store(warehouse)
    if where is None or not where[1].is_dir():
        return 0, 0
    store, folder = where
    manifest = _load(folder)
    present, sent = set(), 0
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if not path.is_file() or any(part.startswith(".") for part in relative.parts):
            continue
        name = relative.as_posix()
        present.add(name)
        if _same(manifest.get(name), path):
            continue
        size, mtime_ns = _stamp(path)
        answer = obstore.put(store, PREFIX + name, path.read_bytes())
        manifest[name] = {"etag": answer.get("e_tag"), "size": size, "mtime_ns": mtime_ns}
        sent += 1
    gone = sorted(n for n in manifest if n not in present)
    for start in range(0, len(gone), 1000):
        obstore.delete(store, [PREFIX + n for n in gone[start:start + 1000]])
    for name in gone:
        del manifest[name]
    _save(folder, manifest)
    return sent, len(gone)


def publish_quietly(warehouse: Warehouse, progress: Callable[[str], None]) -> None:
    """``publish_reports``; a failure is one warning line (reports are a view: the tables are what counts)."""
    try:
        publish_reports(warehouse)
    except Exception as error:  # noqa: BLE001 - reports never fail a job
        progress(f"warning: reports not sent to {Place.of(warehouse.root).uri}/{PREFIX}: "
                 f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}")


def fetch_quietly(warehouse: Warehouse, progress: Callable[[str], None]) -> None:
    """``fetch_reports``; a failure is one warning line (this host's copy is then what it builds on)."""
    try:
        fetch_reports(warehouse)
    except Exception as error:  # noqa: BLE001 - reports never fail a job
        progress(f"warning: reports not fetched from {Place.of(warehouse.root).uri}/{PREFIX}: "
                 f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}")
