"""A folder or file of the warehouse, on a local disk or on object storage, with one API (DESIGN §8).

The warehouse's tables, run state and scratch files live under one root: a local folder or an
``s3://bucket/prefix``. ``Place`` is the part of ``pathlib`` the storage layer uses (join, read,
write, list, delete), plus what each client needs to reach the same spot: an Arrow filesystem and
path for parquet and Arrow files, a URI and options for delta-rs. On a local disk every call is
``pathlib``'s own (nothing is slower than before); on a store, Arrow's S3 filesystem.

Differences a caller must know, and that this API hides where it can:

* A store has no folders: ``mkdir`` does nothing there, and a folder exists while an object is under it.
* A put is atomic on a store (a reader sees the old object or the new one, never part), so
  ``write_atomic`` is one put there and a write-and-rename with ``fsync`` on disk.
* ``lock`` is not here: a warehouse on a store is locked by its lease (``traffic.storage.lease``).
Where a store is and how to reach it: ``traffic.core.location``.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterator

from traffic.core.location import ObjectLocation, is_object_url, object_store, shared_arrow_filesystem


@dataclass(frozen=True)
class Entry:
    """One file found by ``Place.files``."""

    place: "Place"
    size: int
    mtime_ms: int


class Place:
    """A path on local disk (``location`` None) or under an object-storage location."""

    __slots__ = ("_local", "_location", "_key")

    def __init__(self, local: Path | None = None, location: ObjectLocation | None = None, key: str = ""):
        self._local, self._location, self._key = local, location, key.strip("/")

    @classmethod
    def of(cls, value, environ=None) -> "Place":
        """A place from a setting's value or a URI handed to a task: ``s3://…`` or a local path."""
        if isinstance(value, Place):
            return value
        if is_object_url(str(value)):
            return cls(location=ObjectLocation.parse(str(value), environ))
        return cls(local=Path(value))

    def resolve(self, uri: str) -> "Place":
        """A place below this root named by its ``uri`` (as a journal recorded it), reached as this root is."""
        if self._location is None:
            return Place(local=Path(uri))
        base = self._location.url
        if uri != base and not uri.startswith(base + "/"):
            raise ValueError(f"{uri} is not under {base}")
        return Place(location=self._location, key=uri[len(base):].lstrip("/"))

    # -- naming -------------------------------------------------------------------------
    @property
    def is_local(self) -> bool:
        return self._location is None

    @property
    def location(self) -> ObjectLocation | None:
        """The object-storage location of the root this place hangs from (None on local disk)."""
        return self._location

    @property
    def local(self) -> Path:
        if self._local is None:
            raise ValueError(f"{self} is on object storage, not a local path")
        return self._local

    def __truediv__(self, name) -> "Place":
        if self._location is None:
            return Place(local=self._local / name)
        return Place(location=self._location, key=f"{self._key}/{name}" if self._key else str(name))

    def __str__(self) -> str:
        return self.uri

    def __fspath__(self) -> str:
        """A local place is a path to ``open``, ``shutil`` and ``Path``; a place on a store is not."""
        if self._location is None:
            return str(self._local)
        raise TypeError(f"{self.uri} is on object storage: it has no local path")

    def __repr__(self) -> str:
        return f"Place({self.uri!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Place) and self.uri == other.uri

    def __hash__(self) -> int:
        return hash(self.uri)

    @property
    def uri(self) -> str:
        """``/abs/path`` or ``s3://bucket/prefix/key``: what delta-rs opens and a task is handed."""
        if self._location is None:
            return str(self._local)
        return "/".join(p for p in (self._location.url, self._key) if p)

    @property
    def spark_uri(self) -> str:
        """What Spark and delta-spark open: the local path, or ``s3a://bucket/key`` (Hadoop's S3A connector)."""
        return str(self._local) if self._location is None else self._location.s3a_uri(self._key)

    @property
    def name(self) -> str:
        return self._local.name if self._location is None else PurePosixPath(self._key).name

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def parent(self) -> "Place":
        if self._location is None:
            return Place(local=self._local.parent)
        return Place(location=self._location, key=str(PurePosixPath(self._key).parent).lstrip("."))

    def relative_to(self, other: "Place") -> str:
        """This place's path below ``other``, ``/``-separated."""
        if self._location is None:
            return self._local.relative_to(other._local).as_posix()
        return PurePosixPath(self._key).relative_to(other._key).as_posix() if other._key else self._key

    # -- clients ------------------------------------------------------------------------
    @property
    def fs(self):
        """An Arrow filesystem for ``fs_path`` (None on local disk: Arrow takes the plain path)."""
        if self._location is None:
            return None
        return shared_arrow_filesystem(self._location)

    @property
    def fs_path(self) -> str:
        return str(self._local) if self._location is None else self._location.arrow_path(self._key)

    def delta_options(self) -> dict[str, str] | None:
        """delta-rs's ``storage_options`` for a table here (None on local disk)."""
        return None if self._location is None else self._location.delta_options()

    # -- reading and writing ------------------------------------------------------------
    def _info(self):
        return self.fs.get_file_info(self.fs_path)

    def exists(self) -> bool:
        if self._location is None:
            return self._local.exists()
        from pyarrow.fs import FileType

        return self._info().type != FileType.NotFound

    def is_dir(self) -> bool:
        if self._location is None:
            return self._local.is_dir()
        from pyarrow.fs import FileType

        return self._info().type == FileType.Directory

    def size(self) -> int:
        return self._local.stat().st_size if self._location is None else self._info().size

    def read_bytes(self) -> bytes:
        """The file's bytes; ``FileNotFoundError`` when it does not exist (on either kind of place)."""
        if self._location is None:
            return self._local.read_bytes()
        try:
            with self.fs.open_input_stream(self.fs_path) as stream:
                return stream.read()
        except OSError as error:
            if "not found" in str(error).lower() or "does not exist" in str(error).lower():
                raise FileNotFoundError(self.uri) from None
            raise

    def read_bytes_buffer(self):
        """The file's bytes as an Arrow buffer (what an IPC or parquet reader takes without a copy)."""
        import pyarrow as pa

        return pa.py_buffer(self.read_bytes())

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_text(self, text: str) -> None:
        """``write_atomic`` under ``pathlib``'s name."""
        self.write_atomic(text)

    def write_atomic(self, data: str | bytes) -> None:
        """Write the whole file so a reader (or a crash) sees the old content or the new, never part of it."""
        data = data.encode() if isinstance(data, str) else data
        if self._location is None:
            tmp = self._local.with_name(self._local.name + ".tmp")
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            tmp.replace(self._local)
            return
        with self.fs.open_output_stream(self.fs_path) as stream:
            stream.write(data)

    def open_output(self):
        """A binary stream that writes this file (Arrow's; a store's object appears when it is closed)."""
        if self._location is None:
            import pyarrow as pa

            return pa.OSFile(str(self._local), "wb")
        return self.fs.open_output_stream(self.fs_path)

    def open_input(self):
        """A random-access binary file (for parquet footers and Arrow IPC)."""
        if self._location is None:
            import pyarrow as pa

            return pa.memory_map(str(self._local))
        return self.fs.open_input_file(self.fs_path)

    def mkdir(self, parents: bool = True, exist_ok: bool = True) -> None:
        """Make the folder (and its parents) if missing; nothing to do on a store. (The arguments are
        ``pathlib``'s, accepted and always true.)"""
        if self._location is None:
            self._local.mkdir(parents=True, exist_ok=True)

    def unlink(self) -> None:
        """Delete the file; quiet when it is not there."""
        if self._location is None:
            self._local.unlink(missing_ok=True)
            return
        import obstore

        # Through obstore, not Arrow: Arrow's S3 filesystem leaves a folder-marker object behind when it
        # deletes a folder's last file, and such markers would pile up with every job's scratch folder.
        obstore.delete(object_store(self._location), self._key)

    def rmtree(self) -> None:
        """Delete the folder and everything under it; quiet when it is not there."""
        if self._location is None:
            shutil.rmtree(self._local, ignore_errors=True)
            return
        import obstore

        store = object_store(self._location)
        keys = [meta["path"] for batch in obstore.list(store, prefix=self._key + "/") for meta in batch]
        for start in range(0, len(keys), 1000):
            obstore.delete(store, keys[start:start + 1000])

    def files(self, pattern: str | None = None) -> Iterator[Entry]:
        """Every file under this folder (recursively), in path order; only names matching ``pattern`` if given."""
        if self._location is None:
            if not self._local.is_dir():
                return
            for path in sorted(self._local.rglob("*")):
                if path.is_file() and (pattern is None or fnmatch.fnmatch(path.name, pattern)):
                    stat = path.stat()
                    yield Entry(Place(local=path), stat.st_size, int(stat.st_mtime * 1000))
            return
        from pyarrow.fs import FileSelector, FileType

        infos = self.fs.get_file_info(FileSelector(self.fs_path, recursive=True, allow_not_found=True))
        base = self._location.arrow_path()
        for info in sorted(infos, key=lambda i: i.path):
            if info.type == FileType.File and (pattern is None or fnmatch.fnmatch(info.base_name, pattern)):
                key = info.path[len(base):].lstrip("/")
                mtime = int(info.mtime.timestamp() * 1000) if info.mtime is not None else 0
                yield Entry(Place(location=self._location, key=key), info.size, mtime)

    def iterdir(self) -> Iterator["Place"]:
        return iter(self.children())

    def children(self) -> list["Place"]:
        """The files and folders right under this folder, in name order."""
        if self._location is None:
            return [Place(local=p) for p in sorted(self._local.iterdir())] if self._local.is_dir() else []
        from pyarrow.fs import FileSelector

        infos = self.fs.get_file_info(FileSelector(self.fs_path, recursive=False, allow_not_found=True))
        base = self._location.arrow_path()
        return [Place(location=self._location, key=i.path[len(base):].lstrip("/")) for i in sorted(infos, key=lambda i: i.path)]
