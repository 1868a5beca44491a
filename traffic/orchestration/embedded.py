"""`make airflow`'s supervisor: Airflow's components and the PostgreSQL server of their metadata, run as one.

    python -m traffic.orchestration.embedded prepare --pgdata DIR  # install (root), initialise; print the socket folder
    python -m traffic.orchestration.embedded url --pgdata DIR      # its database's SQLAlchemy URL (`airflow` commands)
    python -m traffic.orchestration.embedded run [--pgdata DIR]    # what scripts/airflow.sh execs: start, watch, stop

``airflow standalone`` kept the metadata in SQLite, where a backfill created while the scheduler works
can crash the scheduler (``ObjectDeletedError``), and it never noticed a component that died: nothing
ran again and nobody was told. Here a PostgreSQL server from Debian's packages keeps the metadata in a
folder of the project (``airflow_postgres``: Unix socket only, a generated password, owner-only), and a
supervisor starts it, ``airflow db migrate``, then the API server, the scheduler, the DAG processor and the triggerer
(the scheduler and the triggerer without their log servers, which Airflow 3.3 binds to every interface,
with no setting to change it; the API server reads the logs from the log folder). A component
that exits is said on the console and restarted, at most ``RESTARTS`` times in ``WINDOW`` seconds, then
everything stops with a non-zero exit; PostgreSQL exiting stops everything. SIGINT (Ctrl-C), SIGTERM or
SIGHUP stops the components (SIGINT to each one's process group as a terminal's Ctrl-C would, SIGTERM to
what still runs after ``SECOND_SIGNAL`` s, SIGKILL after ``STOP_GRACE`` s; the API server once the scheduler
has exited, as tasks finishing meanwhile report to it), then PostgreSQL, and exits 0.
"""

from __future__ import annotations

import argparse
import os
import selectors
import shlex
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence, TextIO

from traffic.orchestration.airflow_postgres import (
    PostgresFolder,
    Refused,
    clear_stale_server,
    prepare,
    server_bin,
    server_command,
    server_env,
    server_user,
)
from traffic.orchestration.processes import (
    become_subreaper,
    describe_exit,
    descendants,
    die_with_parent,
    is_running,
    process_table,
    send_signal,
)

#: A component that exits more than RESTARTS times within WINDOW seconds stops the whole.
RESTARTS, WINDOW = 3, 600.0
#: Seconds the components have to stop, then PostgreSQL after SIGINT (fast shutdown): both within the 20 s
#: after which a Ctrl-C'd caller (the e2e fixture) SIGKILLs what is left. The scheduler waits for its
#: running tasks after one signal; a second one, SECOND_SIGNAL s later, ends that wait.
STOP_GRACE, POSTGRES_GRACE, SECOND_SIGNAL = 15.0, 4.0, 5.0
#: Stopped once these have exited: tasks that finish while the scheduler stops report to the API server.
STOP_AFTER = {"api-server": ("scheduler",)}
READY_TIMEOUT = 60.0
#: How long the ``--on-stop`` command (the warm Spark server's stop) may take before the stop goes on without it.
ON_STOP_TIMEOUT = 60.0

MIGRATE = ("db-migrate", ("airflow", "db", "migrate"))
#: The components `airflow standalone` ran, without the scheduler's and triggerer's log servers (the API
#: server reads the logs from the log folder; nothing but it needs to listen, and it listens on 127.0.0.1).
COMPONENTS = (
    ("api-server", ("airflow", "api-server")),
    ("scheduler", ("airflow", "scheduler", "--skip-serve-logs")),
    ("dag-processor", ("airflow", "dag-processor")),
    ("triggerer", ("airflow", "triggerer", "--skip-serve-logs")),
)


@dataclass
class Child:
    """One supervised command: its current process, and when it exited unexpectedly (within the window)."""

    name: str
    argv: Sequence[str]
    process: subprocess.Popen | None = None
    exits: deque = field(default_factory=deque)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Supervisor:
    """Starts PostgreSQL (when given a folder), the setup commands, then the components; watches and stops them."""

    def __init__(self, components: Sequence[tuple[str, Sequence[str]]], *,
                 setup: Sequence[tuple[str, Sequence[str]]] = (MIGRATE,),
                 postgres: PostgresFolder | None = None, env: Mapping[str, str] | None = None,
                 restarts: int = RESTARTS, window: float = WINDOW, grace: float = STOP_GRACE,
                 postgres_grace: float = POSTGRES_GRACE, second_signal: float = SECOND_SIGNAL,
                 stop_after: Mapping[str, Sequence[str]] = STOP_AFTER, out: TextIO | None = None,
                 on_stop: Sequence[str] = ()):
        self.components = [Child(name, list(argv)) for name, argv in components]
        self.on_stop = list(on_stop)  # a command run once the components have stopped (the warm Spark's stop)
        self.setup = [Child(name, list(argv)) for name, argv in setup]
        self.postgres = postgres
        self.env = dict(os.environ if env is None else env)
        self.restarts, self.window, self.grace, self.postgres_grace = restarts, window, grace, postgres_grace
        self.second_signal, self.stop_after = second_signal, {k: tuple(v) for k, v in stop_after.items()}
        self.out = out or sys.stdout
        self.server: Child | None = None
        self.one_shot: Child | None = None
        self.stopping: str | None = None
        self._selector = selectors.DefaultSelector()
        self._pending: dict[int, tuple[str, bytearray]] = {}
        self._spawned: set[int] = set()
        self._helpers: set[int] = set()
        self._doomed: dict[int, float] = {}

    # -- console ------------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        self._write(f"[airflow] {text}")

    def _write(self, line: str) -> None:
        try:
            self.out.write(line + "\n")
            self.out.flush()
        except (OSError, ValueError):  # the terminal has gone (a hang-up): the stop goes on
            pass

    def _line(self, name: str, raw: bytes) -> None:
        self._write(f"{name:<13} | {raw.decode('utf-8', 'replace').rstrip()}")

    def _read(self, descriptor: int) -> None:
        name, pending = self._pending[descriptor]
        try:
            chunk = os.read(descriptor, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            if pending:
                self._line(name, bytes(pending))
            self._selector.unregister(descriptor)
            os.close(descriptor)
            del self._pending[descriptor]
            return
        pending.extend(chunk)
        *lines, rest = pending.split(b"\n")
        for line in lines:
            self._line(name, line)
        pending[:] = rest
        if len(pending) > 65536:  # a line without an end: shown in pieces rather than held
            self._line(name, bytes(pending))
            pending.clear()

    def pump(self, timeout: float) -> None:
        """Show what the children wrote for up to ``timeout`` s (a signal or a child's exit wakes it earlier)."""
        for key, _ in self._selector.select(timeout):
            if key.fd == self._wake_read:
                try:
                    while os.read(self._wake_read, 512):
                        pass
                except BlockingIOError:
                    pass
                self._reap_orphans()
            else:
                self._read(key.fd)
        if self._doomed:
            now = time.monotonic()
            late = [pid for pid, deadline in self._doomed.items() if deadline < now]
            send_signal([pid for pid in late if is_running(pid)], signal.SIGKILL)
            for pid in late:
                del self._doomed[pid]

    def drain(self) -> None:
        while self._pending and self._selector.select(0):
            self.pump(0)

    # -- children -------------------------------------------------------------------------------------

    def spawn(self, child: Child, **popen) -> None:
        """Start ``child`` in a process group of its own: a Ctrl-C reaches this supervisor alone, which stops the
        children in order (the API server after the scheduler), not all at once."""
        popen.setdefault("env", self.env)
        popen.setdefault("preexec_fn", die_with_parent(signal.SIGTERM))
        child.process = subprocess.Popen(child.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, process_group=0, **popen)
        self._spawned.add(child.process.pid)
        descriptor = os.dup(child.process.stdout.fileno())  # read here, and closed at its end of file
        child.process.stdout.close()
        os.set_blocking(descriptor, False)
        self._pending[descriptor] = (child.name, bytearray())
        self._selector.register(descriptor, selectors.EVENT_READ)

    def _reap_orphans(self) -> None:
        """Processes a dead component left behind become this one's children (it is their subreaper): reap the
        exited ones, so they are no zombies; Popen reaps its own."""
        me = os.getpid()
        for pid, parent in process_table().items():
            if parent == me and pid not in self._spawned and not is_running(pid):
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def _leftovers(self) -> list[int]:
        """Live processes of children that already exited (orphans adopted by this one), and all below them."""
        table, me = process_table(), os.getpid()
        managed = {c.process.pid for c in [*self.components, self.server, self.one_shot]
                   if c is not None and c.process is not None and c.process.returncode is None}
        roots = [pid for pid, parent in table.items() if parent == me and pid not in self._helpers | managed]
        return [p for root in roots for p in (root, *descendants(root, table)) if is_running(p)]

    def _stop_leftovers(self) -> None:
        """SIGTERM to what a component that exited left running (its executor's workers, say); SIGKILL 10 s later."""
        for pid in self._leftovers():
            if pid not in self._doomed:
                send_signal([pid], signal.SIGTERM)
                self._doomed[pid] = time.monotonic() + 10

    def _on_signal(self, signum, _frame) -> None:
        if self.stopping is None:
            self.stopping = signal.Signals(signum).name

    # -- the whole ------------------------------------------------------------------------------------

    def run(self) -> int:
        """Start everything and watch it; the exit code: 0 when stopped by a signal, 1 when it had to stop."""
        self._wake_read, wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(wake_write, False)
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the loop (the wake-up pipe) when a child exits
        # Children already here are the launching script's helpers (the warm Spark's watcher, the unpause helper):
        # they stop on their own once this process is gone, and are never signalled from here.
        self._helpers = {pid for pid, parent in process_table().items() if parent == os.getpid()}
        become_subreaper()
        try:
            return self._run()
        except Refused as refusal:
            self.say(f"error: {refusal}")
            return self.shutdown(1)

    def _run(self) -> int:
        if self.postgres is not None:
            code = self._start_postgres()
            if code is not None:
                return code
        for self.one_shot in self.setup:
            self.spawn(self.one_shot)
            while self.one_shot.alive() and not self.stopping:
                self.pump(0.5)
            if self.stopping:
                return self.shutdown(0)
            if self.one_shot.process.returncode != 0:
                self.say(f"`{' '.join(self.one_shot.argv)}` failed ({describe_exit(self.one_shot.process.returncode)}): "
                         "stopping")
                return self.shutdown(1)
        self.one_shot = None
        for child in self.components:
            self.spawn(child)
        while True:
            self.pump(1.0)
            if self.stopping:
                return self.shutdown(0)
            if self.server is not None and not self.server.alive():
                if self.stopping:
                    return self.shutdown(0)
                self.say(f"PostgreSQL exited unexpectedly ({describe_exit(self.server.process.returncode)}): "
                         "Airflow cannot work without it, stopping everything")
                return self.shutdown(1)
            for child in self.components:
                if child.alive():
                    continue
                if self.stopping:  # a stop began while this loop ran: its exit is part of it
                    return self.shutdown(0)
                if not self._restart(child):
                    return self.shutdown(1)

    def _restart(self, child: Child) -> bool:
        now = time.monotonic()
        while child.exits and now - child.exits[0] > self.window:
            child.exits.popleft()
        child.exits.append(now)
        how, count, minutes = describe_exit(child.process.returncode), len(child.exits), f"{self.window / 60:g} min"
        if count > self.restarts:
            self.say(f"{child.name} exited unexpectedly ({how}), {count} times in {minutes} (at most "
                     f"{self.restarts} restarts): stopping everything")
            return False
        self.say(f"{child.name} exited unexpectedly ({how}): restarting it ({count} of {self.restarts} in {minutes})")
        self._stop_leftovers()
        self.spawn(child)
        return True

    def _start_postgres(self) -> int | None:
        folder = self.postgres
        bin_dir = server_bin(folder, self.out)
        clear_stale_server(folder, self.say)
        user = server_user()
        self.server = Child("postgres", server_command(folder, bin_dir))
        # Stopped last, by this supervisor (SIGINT: fast shutdown), or when the supervisor dies (parent-death signal).
        self.spawn(self.server, env=server_env(self.env), cwd=folder.root,
                   preexec_fn=die_with_parent(signal.SIGINT), **user.popen_args())
        deadline = time.monotonic() + READY_TIMEOUT
        while not (folder.server_ready() and folder.accepts_connections()):
            if self.stopping:
                return self.shutdown(0)
            if not self.server.alive():
                self.drain()
                self.say(f"PostgreSQL exited before accepting connections ({describe_exit(self.server.process.returncode)};"
                         " its lines are above): stopping")
                return self.shutdown(1)
            if time.monotonic() > deadline:
                self.say(f"PostgreSQL did not accept connections within {READY_TIMEOUT:.0f} s: stopping")
                return self.shutdown(1)
            self.pump(0.2)
        folder.ensure_database()
        self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = folder.url()
        self.env.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC", None)  # Airflow derives asyncpg's from it
        self.say(f"PostgreSQL accepts connections on {folder.socket} (no TCP listener)")
        return None

    def shutdown(self, code: int) -> int:
        """The components (``_stop``), what they left (SIGKILL), then PostgreSQL (fast shutdown); ``code`` back."""
        running = [c for c in [*self.components, self.one_shot] if c is not None and c.alive()]
        self.say(f"stopping{' (' + self.stopping + ')' if self.stopping else ''}: "
                 + (", ".join(c.name for c in running) or "no component running")
                 + (", then PostgreSQL" if self.server and self.server.alive() else ""))
        self._stop(running)
        self._kill_leftovers()
        self._run_on_stop()
        if self.server is not None and self.server.alive():
            send_signal([self.server.process.pid], signal.SIGINT)
            deadline = time.monotonic() + self.postgres_grace
            while self.server.alive() and time.monotonic() < deadline:
                self.pump(0.2)
            if self.server.alive():
                self.say(f"PostgreSQL did not stop within {self.postgres_grace:g} s: killing it")
                # its backends each have a session of their own: found as its descendants, not by its group
                send_signal([self.server.process.pid, *descendants(self.server.process.pid)], signal.SIGKILL)
                self.server.process.wait()
        self.drain()
        self.say("stopped" + ("" if code == 0 else f" (exit {code})"))
        return code

    def _stop(self, children: list[Child]) -> None:
        """Each child, once those it is stopped after have exited (``stop_after``): SIGINT to its process group, as a
        terminal's Ctrl-C (Airflow's subprocesses, the triggerer's runner say, stop on their own at once, not after
        their parent's escalation of 5-10 s); SIGTERM to it ``second_signal`` s later if it still runs; SIGKILL to
        it and all below it ``grace`` s after the stop began."""
        begun = time.monotonic()
        deadline, signalled, again = begun + self.grace, {}, set()
        while (running := [c for c in children if c.alive()]) and time.monotonic() < deadline:
            names = {c.name for c in running}
            for child in running:
                if child.name not in signalled and not names & set(self.stop_after.get(child.name, ())):
                    try:  # its group cannot be another's while it is not reaped: it leads it
                        os.killpg(child.process.pid, signal.SIGINT)
                    except (ProcessLookupError, PermissionError):
                        pass
                    signalled[child.name] = time.monotonic()
                elif child.name in signalled and child.name not in again \
                        and time.monotonic() - signalled[child.name] > self.second_signal:
                    self.say(f"{child.name} still running {self.second_signal:g} s after SIGINT: SIGTERM"
                             + (" (the scheduler stops waiting for its tasks)" if child.name == "scheduler" else ""))
                    send_signal([child.process.pid], signal.SIGTERM)
                    again.add(child.name)
            self.pump(0.2)
        for child in running:
            self.say(f"{child.name} did not stop within {self.grace:g} s: killing it")
            send_signal([child.process.pid, *descendants(child.process.pid)], signal.SIGKILL)
            child.process.wait()

    def _run_on_stop(self) -> None:
        """The ``on_stop`` command, its output said on the console; a failure is said, and the stop goes on."""
        if not self.on_stop:
            return
        try:
            done = subprocess.run(self.on_stop, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=ON_STOP_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as error:
            self.say(f"{shlex.join(self.on_stop)} failed: {error}")
            return
        for line in done.stdout.splitlines():
            self.say(line)
        if done.returncode:
            self.say(f"{shlex.join(self.on_stop)} exited with {done.returncode}")

    def _kill_leftovers(self) -> None:
        """SIGKILL to whatever the stopped components left; waits (at most 5 s) until it is gone."""
        deadline = time.monotonic() + 5
        while (left := self._leftovers()) and time.monotonic() < deadline:
            send_signal(left, signal.SIGKILL)
            self.pump(0.05)
            self._reap_orphans()
        if left:
            self.say(f"processes left behind did not end: {', '.join(map(str, left))}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m traffic.orchestration.embedded",
                                     description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("prepare", "install (root) and initialise the cluster; print its socket folder"),
                       ("url", "print the SQLAlchemy URL of its database"),
                       ("run", "start PostgreSQL (with --pgdata) and Airflow's components; watch and stop them")):
        command = commands.add_parser(name, help=text)
        if name == "run":
            command.add_argument("--on-stop", default="", metavar="COMMAND",
                                 help="a command (shell words) run once the components have stopped, before "
                                      "PostgreSQL: `make airflow` stops the warm Spark server with it")
        command.add_argument("--pgdata", type=Path, required=name != "run",
                             help="the PostgreSQL folder (TRAFFIC_AIRFLOW_PGDATA); run without it: the database "
                                  "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN names")
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            print(prepare(args.pgdata).sockets)
            return 0
        if args.command == "url":
            print(PostgresFolder(args.pgdata.resolve()).url())
            return 0
        folder = prepare(args.pgdata, sys.stdout) if args.pgdata else None
    except (Refused, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return Supervisor(COMPONENTS, postgres=folder, on_stop=shlex.split(args.on_stop)).run()


if __name__ == "__main__":
    sys.exit(main())
