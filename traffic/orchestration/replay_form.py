"""The replay DAG's form, checked before any JVM starts: the folder it names must lie under a replay root,
and its fields become ``jobs/replay.py`` arguments.

The DAG imports this inside its task, so parsing the DAG never imports the library.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping


def replay_input(settings, folder: str) -> Path:
    """The replay form's input folder, links resolved, if it lies inside one of ``replay_roots``.

    Whoever may trigger a DAG may not make the worker read any file it can: only archives under
    the configured roots (``Settings.replay_folders``). The resolved path is what the job gets, so
    a link swapped after this check cannot point it elsewhere.
    """
    from traffic.core.settings import SettingsError  # deferred: DAG parsing stays light

    roots = [Path(os.path.realpath(root)) for root in settings.replay_folders()]
    if not roots:
        raise SettingsError("replay reads archives from folders only, and the inbox is on object storage: "
                            "name the folders it may read in the setting replay_roots")
    allowed = ", ".join(str(root) for root in roots)
    if not Path(folder).is_absolute() or "\0" in folder:
        raise SettingsError(f"input {folder!r} is not an absolute folder (allowed: folders under {allowed})")
    resolved = Path(os.path.realpath(folder))
    if not any(resolved.is_relative_to(root) for root in roots):
        raise SettingsError(f"input {folder!r} is not under a replay root (allowed: folders under {allowed}; "
                            "the setting replay_roots adds others)")
    if not resolved.is_dir():
        raise SettingsError(f"input {folder!r} is not a folder on the worker")
    return resolved


def replay_arguments(params: Mapping[str, Any]) -> list[str]:
    """``jobs/replay.py`` arguments from the replay form, checked before any JVM starts.

    Values go as ``--name=value``, so a reason or a source that starts with ``-`` stays a value.
    """
    from traffic.core.settings import SettingsError, load_settings, parse_time  # deferred: DAG parsing stays light

    def text(name: str) -> str:
        value = params.get(name)
        return "" if value is None else str(value).strip()

    missing = [name for name in ("from", "to", "input") if not text(name)]
    if missing:
        raise SettingsError(f"replay needs {', '.join(missing)}")
    start, end = parse_time("from", text("from")), parse_time("to", text("to"))
    if end <= start:
        raise SettingsError(f"replay range is empty: from {start.isoformat()} is not before to {end.isoformat()}")
    folder = replay_input(load_settings(), text("input"))
    args = [f"--from={start.isoformat()}", f"--to={end.isoformat()}", f"--input={folder}"]
    if text("source"):
        args.append(f"--source={text('source')}")
    restate = params.get("restate")
    if restate is True or str(restate).strip().lower() in {"true", "1", "yes"}:
        if not text("reason"):
            raise SettingsError("restate needs a reason (it is recorded in the ledger)")
        args += ["--restate", f"--reason={text('reason')}"]
    return args
