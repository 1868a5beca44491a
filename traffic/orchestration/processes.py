"""Linux process plumbing of `make airflow`'s supervisor: who is whose child, signals, and how a process ended.

Read from ``/proc`` and ``prctl(2)``: the supervisor adopts what its components leave behind (a child
subreaper) and its children get a signal when it dies, so nothing outlives it.
"""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path
from typing import Callable, Mapping

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


def die_with_parent(signum: int) -> Callable[[], None]:
    """A child's preexec: ``signum`` reaches it when the supervisor dies, even SIGKILLed, so nothing is left behind.
    It runs after the switch to the server's user (a change of user clears the setting)."""
    return lambda: _prctl(_PR_SET_PDEATHSIG, signum)


def become_subreaper() -> None:
    """Processes orphaned below this one become its children (not init's), so it can find and stop them."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def describe_exit(returncode: int) -> str:
    """How a child ended, as the console says it: ``code 3``, ``killed by SIGKILL``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"code {returncode}"


def is_running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid``, or None when it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def process_table() -> dict[int, int]:
    """pid -> parent pid of every live process."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            parent = parent_pid(int(entry.name))
            if parent is not None:
                table[int(entry.name)] = parent
    return table


def descendants(pid: int, table: Mapping[int, int] | None = None) -> list[int]:
    """Every process below ``pid`` (children, theirs, and so on)."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for child, parent in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def send_signal(pids, signum: int) -> None:
    """``signum`` to each of ``pids`` that still exists and is ours to signal."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

