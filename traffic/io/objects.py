"""An inbox on object storage (``inbox = "s3://bucket/prefix"``): listing its objects and reading them.

A leaf module like ``traffic.io.files``: parse tasks on executors import it to read their piece of an
object. An object is opened pinned to the ETag it has when opened: every range read through one handle
comes from that one version of the object (``If-Match``), so a rewrite while a batch plans or reads it
shows as ``ObjectRewritten`` (a piece then changed: retried by the next batch), never as a mix of two
versions. Planning pins the sha256 of each piece as it does for files, and a task checks it before it
counts anything.

Endpoint, region and credentials come from the standard AWS variables, as for an ``s3://`` warehouse.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, replace

from traffic.core.location import ObjectLocation, object_store, shared_arrow_filesystem

#: Bytes a handle fetches per request at least (reads of a few KiB do not cost a request each).
READ_AHEAD = 1 << 20


class ObjectRewritten(OSError):
    """The object is no longer the version the handle was opened on."""


@dataclass(frozen=True)
class Listed:
    """One object under an inbox prefix."""

    name: str  # key relative to the prefix
    url: str
    size: int
    mtime_ns: int


def reach(url: str, location: ObjectLocation | None = None) -> tuple[object, str]:
    """The client of ``url``'s bucket and the object's key. The store is reached as ``location`` says (the inbox's
    location, pickled with a parse task to an executor that may not have the driver's AWS variables), or as
    this process's AWS variables say."""
    bucket, key = split_url(url)
    where = location if location is not None and location.bucket == bucket else ObjectLocation.parse(f"s3://{bucket}")
    return object_store(replace(where, prefix="")), key


def split_url(url: str) -> tuple[str, str]:
    """The bucket and the key of an object's ``s3://bucket/key`` as ``list_objects`` makes it: the key is taken
    as it is (an object's key may hold ``?`` or ``#``, which a URL parser would cut off)."""
    scheme, _, rest = url.partition("://")
    bucket, _, key = rest.partition("/")
    return bucket, key


def list_objects(url: str) -> list[Listed]:
    """Every object under the prefix ``url`` names, sorted by key.

    Listed with Arrow's S3 client, which takes any key a store holds: obstore refuses to list a prefix in
    which one key has a control character, and one such object must not hide the others (``addressable``
    tells which keys can then be read)."""
    from pyarrow import fs  # deferred: only an inbox on object storage needs it

    location = ObjectLocation.parse(url)
    base = location.arrow_path()
    found: dict[str, Listed] = {}
    selector = fs.FileSelector(base, recursive=True, allow_not_found=True)
    for info in shared_arrow_filesystem(location).get_file_info(selector):
        if info.type != fs.FileType.File or not info.path.startswith(f"{base}/"):
            continue  # a folder (or its marker object)
        name = info.path[len(base) + 1:]
        found[name] = Listed(name, f"s3://{info.path}", int(info.size), int(info.mtime_ns or 0))
    return [found[name] for name in sorted(found)]


def addressable(key: str) -> bool:
    """Whether an object's key can be read here (not with a control character, nor an empty, ``.`` or ``..``
    folder name, which the object store client refuses)."""
    return not any(ord(c) < 32 or c == "\x7f" for c in key) and all(p not in ("", ".", "..") for p in key.split("/"))


class ObjectReader(io.RawIOBase):
    """A seekable, read-only view of one object, pinned to the version it had when opened.

    ``st_size`` and ``st_mtime`` stand in for ``os.fstat`` (``traffic.io.files.size_and_mtime``).
    """

    def __init__(self, url: str, location: ObjectLocation | None = None):
        import obstore  # deferred: only an inbox on object storage needs it

        super().__init__()
        self.name = url
        self._store, self._key = reach(url, location)
        meta = obstore.head(self._store, self._key)  # FileNotFoundError when there is no such object
        self._etag = meta.get("e_tag")
        self.st_size = int(meta["size"])
        self.st_mtime = meta["last_modified"].timestamp()
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.st_size}[whence]
        if base + offset < 0:
            raise OSError(f"seek before the start of {self.name}")
        self._position = base + offset
        return self._position

    def readinto(self, buffer) -> int:
        import obstore  # deferred: only an inbox on object storage needs it
        from obstore.exceptions import PreconditionError

        end = min(self.st_size, self._position + len(buffer))
        if end <= self._position:
            return 0
        options = {"range": (self._position, end)}
        if self._etag:
            options["if_match"] = self._etag
        try:
            data = obstore.get(self._store, self._key, options=options).bytes()
        except PreconditionError:
            raise ObjectRewritten(f"{self.name} was rewritten while it was read") from None
        view = memoryview(data)
        buffer[:len(view)] = view
        self._position += len(view)
        return len(view)


def open_object(url: str, location: ObjectLocation | None = None):
    """``url`` opened for reading (reached as ``reach`` says): a buffered, seekable handle pinned to the object's
    current version."""
    return io.BufferedReader(ObjectReader(url, location), buffer_size=READ_AHEAD)
