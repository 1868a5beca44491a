"""Reading inbox files safely: only regular files, never blocking, exactly the bytes a plan names.

A leaf module: executor tasks import it to read their piece without the inbox's planning code.
"""

from __future__ import annotations

import hashlib
import os
import stat


class PieceChanged(OSError):
    """The bytes on disk are not the ones planned (the file was rewritten, truncated or replaced)."""


def open_regular(path: str):
    """``path`` opened for reading if it is a regular file (never blocks on a FIFO or follows a last link)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_piece(path: str, start: int, end: int, sha256: str) -> bytes:
    """Exactly the planned bytes ``[start, end)``, or PieceChanged when they are not what was planned."""
    with open_regular(path) as handle:
        handle.seek(start)
        data = handle.read(end - start)
    if len(data) != end - start or hashlib.sha256(data).hexdigest() != sha256:
        raise PieceChanged(f"bytes {start}-{end} of {path} changed after the batch was planned")
    return data
