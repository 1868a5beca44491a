"""How a ``traffic`` command ends when something goes wrong: the exit codes and the one line it prints.

A person's mistake exits 2 (``EXIT_USER``), a failed check 3 (``EXIT_CHECK``), anything unexpected
1 (``EXIT_BUG``, the details with ``--debug``), and a reader that went away 141 (``EXIT_PIPE``).
"""

from __future__ import annotations

import errno
import os
import select
import sys
import traceback

from traffic.core.text import printable

EXIT_USER, EXIT_CHECK, EXIT_BUG = 2, 3, 1
EXIT_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool whose reader went away

#: File-system errors a person fixes (ownership and permissions, a read-only mount, a full disk), with the hint.
FIXABLE = {
    errno.EACCES: "this user may not use it: run as the warehouse's owner, or fix its owner and permissions",
    errno.EPERM: "this user may not use it: run as the warehouse's owner, or fix its owner and permissions",
    errno.EROFS: "it is on a read-only file system",
    errno.ENOSPC: "the disk is full: free some space (an interrupted batch is finished by the next run)",
    errno.EDQUOT: "this user's disk quota is used up (an interrupted batch is finished by the next run)",
}


def fixable_problem(error: OSError) -> str:
    """One line for a file-system error a person can fix: the path, what went wrong, what to do."""
    where = " → ".join(printable(name) for name in (error.filename, error.filename2) if name is not None)
    what = error.strerror or type(error).__name__
    return f"{where}: {what} ({FIXABLE[error.errno]})" if where else f"{what} ({FIXABLE[error.errno]})"


def unexpected(args, error: BaseException) -> int:
    """The last line of defence: one line, not a JVM trace (the details with ``--debug``)."""
    if getattr(args, "debug", False):
        raise error
    first = str(error).strip().splitlines()[0] if str(error).strip() else f"{type(error).__name__} at {_where(error)}"
    print(f"traffic {args.command}: failed: {type(error).__name__}: {printable(first[:500])} (rerun with --debug)",
          file=sys.stderr)
    return EXIT_BUG


def _where(error: BaseException, depth: int = 3) -> str:
    """The innermost ``depth`` frames of ``error``'s traceback, innermost first (``file.py:line function``):
    all a bare ``assert`` in a library leaves to go on when its message is empty."""
    frames = traceback.extract_tb(error.__traceback__)[-depth:]
    return " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(frames)) or "?"


def reader_gone() -> bool:
    """After a ``BrokenPipeError``: if stdout's (or stderr's) reader has gone, point it at /dev/null so
    nothing more (the interpreter's last flush included) fails on it, and say so; False otherwise."""
    gone = False
    for stream in (sys.stdout, sys.stderr):
        try:
            poller = select.poll()
            poller.register(stream.fileno(), select.POLLOUT)
            broken = any(events & select.POLLERR for _, events in poller.poll(0))
        except (OSError, ValueError):  # not a file descriptor (a test's capture): nothing to redirect
            continue
        if broken:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
            gone = True
    return gone
