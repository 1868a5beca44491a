"""Reading inbox files safely: only regular files, never blocking, exactly the bytes a plan names.

A low module: executor tasks import it (with ``traffic.io.objects``, for objects) to read their piece without
the inbox's planning code.
"""

from __future__ import annotations

import hashlib
import os
import stat

from traffic.core.location import is_object_url
from traffic.io.objects import ObjectRewritten, open_object


class PieceChanged(OSError):
    """The bytes on disk are not the ones planned (the file was rewritten, truncated or replaced)."""


def open_regular(path: str, location=None):
    """``path`` opened for reading if it is a regular file (never blocks on a FIFO or follows a last link);
    an ``s3://`` path is an object, opened pinned to its current version and reached as ``location`` (an
    ``ObjectLocation``) or the AWS variables say (``traffic.io.objects``)."""
    if is_object_url(path):
        return open_object(path, location)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def size_and_mtime(handle) -> tuple[int, float]:
    """The size and modification time (seconds) of what ``open_regular`` opened, file or object."""
    raw = getattr(handle, "raw", handle)
    if hasattr(raw, "st_size"):
        return raw.st_size, raw.st_mtime
    info = os.fstat(handle.fileno())
    return info.st_size, info.st_mtime


def read_piece(path: str, start: int, end: int, sha256: str, location=None) -> bytes:
    """Exactly the planned bytes ``[start, end)``, or PieceChanged when they are not what was planned."""
    try:
        with open_regular(path, location) as handle:
            handle.seek(start)
            data = handle.read(end - start)
    except ObjectRewritten as error:
        raise PieceChanged(f"bytes {start}-{end} of {path} changed after the batch was planned ({error})") from None
    if len(data) != end - start or hashlib.sha256(data).hexdigest() != sha256:
        raise PieceChanged(f"bytes {start}-{end} of {path} changed after the batch was planned")
    return data
