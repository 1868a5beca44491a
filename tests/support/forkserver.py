"""Run ``traffic`` commands as real child processes forked from a warm interpreter.

The crash suite kills about sixty commands. Started from scratch, each one pays some 3 s of
imports (Great Expectations, PySpark's Connect client) before it reaches its first write. This
server imports them once in a clean interpreter (spawned, never forked from the test process
with its JVM gateway) and forks one child per command: still a process of its own, with its own
Spark Connect session, ended by a real SIGKILL, sharing nothing with the test but the imports.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
import traceback
from pathlib import Path

PRELOAD = ("traffic.app.cli", "traffic.accounting.ingest", "traffic.accounting.close", "traffic.quality.suites", "traffic.runtime.spark",
           "great_expectations", "pyspark.sql.connect.session", "pyspark.sql.connect.functions")


def _child(argv: list[str], env: dict[str, str], log: str) -> int:
    """In the forked child: run the CLI with its output going to ``log``; return its exit code."""
    code = 1
    try:
        os.environ.update(env)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        from traffic.app.cli import main

        code = main(argv)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 - anything the command raised is the test's evidence
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def _serve(connection, preload: tuple[str, ...]) -> None:
    for module in preload:
        importlib.import_module(module)
    while True:
        request = connection.recv()
        if request is None:
            return
        argv, env, log = request
        pid = os.fork()
        if pid == 0:
            os._exit(_child(argv, env, log))  # never return into the server loop
        _, status = os.waitpid(pid, 0)
        connection.send(os.waitstatus_to_exitcode(status))


class ForkServer:
    """``run(argv)`` → (exit code like ``subprocess``: -9 for SIGKILL, output)."""

    def __init__(self, workdir: Path, preload: tuple[str, ...] = PRELOAD):
        context = multiprocessing.get_context("spawn")
        self._connection, theirs = context.Pipe()
        self._process = context.Process(target=_serve, args=(theirs, preload), daemon=True)
        self._process.start()
        theirs.close()
        self._workdir = Path(workdir)
        self._count = 0

    def run(self, argv: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, str]:
        self._count += 1
        log = self._workdir / f"command-{self._count:03d}.log"
        self._connection.send((list(argv), dict(env or {}), str(log)))
        if not self._connection.poll(timeout):
            raise TimeoutError(f"{argv} did not finish within {timeout}s")
        code = self._connection.recv()
        return code, log.read_text(errors="replace") if log.exists() else ""

    def stop(self) -> None:
        try:
            self._connection.send(None)
        except OSError:
            pass
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
