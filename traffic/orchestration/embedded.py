"""`make airflow`'s supervisor: Airflow's components and the PostgreSQL server of their metadata, run as one.

    python -m traffic.orchestration.embedded prepare --pgdata DIR  # install (root), initialise; print the socket folder
    python -m traffic.orchestration.embedded url --pgdata DIR      # its database's SQLAlchemy URL (`airflow` commands)
    python -m traffic.orchestration.embedded run [--pgdata DIR]    # what scripts/airflow.sh execs: start, watch, stop

``airflow standalone`` kept the metadata in SQLite, where a backfill created while the scheduler works
can crash the scheduler (``ObjectDeletedError``), and it never noticed a component that died: nothing
ran again and nobody was told. Here a PostgreSQL server from Debian's packages keeps the metadata in a
folder of the project (Unix socket only, a generated password, owner-only), and a supervisor starts
it, ``airflow db migrate``, then the API server, the scheduler, the DAG processor and the triggerer
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
import ctypes
import grp
import os
import pwd
import secrets
import selectors
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence, TextIO
from urllib.parse import quote

import psycopg2

ROLE = DATABASE = "airflow"
PORT = 5432
#: A Unix socket's path has room for 107 bytes (sun_path is 108 with its NUL); PostgreSQL refuses longer.
SOCKET_PATH_MAX = 107
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

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


class Refused(Exception):
    """The embedded Airflow cannot start; the message is the one line a user sees."""


_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


def _die_with_parent(signum: int) -> Callable[[], None]:
    """A child's preexec: ``signum`` reaches it when the supervisor dies, even SIGKILLed, so nothing is left behind.
    It runs after the switch to the server's user (a change of user clears the setting)."""
    return lambda: _prctl(_PR_SET_PDEATHSIG, signum)


def _server_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for initdb and postgres: no PG* variable (PGPORT would rename the socket)."""
    return {k: v for k, v in environ.items() if not k.startswith("PG")}


def _describe(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"code {returncode}"


# -- the PostgreSQL folder --------------------------------------------------------------------------

@dataclass(frozen=True)
class PostgresFolder:
    """TRAFFIC_AIRFLOW_PGDATA: the cluster (``data``), its socket folder (``run``) and the role's password."""

    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def sockets(self) -> Path:
        return self.root / "run"

    @property
    def socket(self) -> Path:
        return self.sockets / f".s.PGSQL.{PORT}"

    @property
    def password_file(self) -> Path:
        return self.root / "password"

    def password(self) -> str:
        return self.password_file.read_text().strip()

    def url(self, driver: str = "psycopg2") -> str:
        """The SQLAlchemy URL Airflow uses: role and database ``airflow`` over the socket folder (no TCP)."""
        return (f"postgresql+{driver}://{ROLE}:{quote(self.password(), safe='')}@/{DATABASE}"
                f"?host={quote(str(self.sockets), safe='/')}")

    def connect(self, database: str = DATABASE, timeout: int = 2):
        return psycopg2.connect(host=str(self.sockets), port=PORT, user=ROLE, password=self.password(),
                                dbname=database, connect_timeout=timeout)

    def server_ready(self) -> bool:
        """The server says it is ready in its postmaster.pid (what pg_ctl waits for), so no connection is tried
        while it starts (each would leave a FATAL line in its log)."""
        try:
            lines = (self.data / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) >= 8 and lines[7].strip() == "ready"

    def accepts_connections(self) -> bool:
        try:
            self.connect("postgres").close()
        except psycopg2.OperationalError:
            return False
        return True

    def ensure_database(self) -> None:
        """The ``airflow`` database, made on the first start (initdb makes only ``postgres``)."""
        connection = self.connect("postgres")
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
                if cursor.fetchone() is None:
                    cursor.execute(f'CREATE DATABASE "{DATABASE}"')
        finally:
            connection.close()

    def version(self) -> str | None:
        try:
            return (self.data / "PG_VERSION").read_text().strip()
        except FileNotFoundError:
            return None


@dataclass(frozen=True)
class ServerUser:
    """Who runs initdb and postgres: this user, or the system user ``postgres`` when this is root."""

    uid: int
    gid: int
    name: str

    @property
    def is_other(self) -> bool:
        return self.uid != os.geteuid()

    def popen_args(self) -> dict:
        return {"user": self.uid, "group": self.gid, "extra_groups": []} if self.is_other else {}


def server_user() -> ServerUser:
    if os.geteuid() != 0:
        entry = pwd.getpwuid(os.geteuid())
        return ServerUser(entry.pw_uid, entry.pw_gid, entry.pw_name)
    try:
        entry = pwd.getpwnam("postgres")
    except KeyError:
        raise Refused("PostgreSQL refuses to run as root and this machine has no `postgres` user to run it "
                      "(apt-get install -y postgresql makes one)") from None
    return ServerUser(entry.pw_uid, entry.pw_gid, entry.pw_name)


def installed_servers(base: Path = Path("/usr/lib/postgresql")) -> dict[str, Path]:
    """Debian's PostgreSQL servers: major version -> its bin folder."""
    return {path.parent.parent.name: path.parent for path in base.glob("*/bin/postgres")
            if path.parent.parent.name.isdigit()}


def install_server(log: TextIO) -> None:
    """``apt-get install -y postgresql`` (root only); one line saying why not, when it cannot."""
    if os.geteuid() != 0:
        raise Refused("PostgreSQL's server is not installed and installing it needs root: run "
                      "`sudo apt-get install -y postgresql` (or TRAFFIC_AIRFLOW_DB=sqlite, which backfills can crash)")
    if shutil.which("apt-get") is None:
        raise Refused("PostgreSQL's server is not installed and there is no apt-get to install it: install "
                      "PostgreSQL's server (postgres, initdb under /usr/lib/postgresql/<version>/bin)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "postgresql"]
    print("[airflow] installing PostgreSQL's server for Airflow's metadata: apt-get install -y postgresql",
          file=log, flush=True)
    done = subprocess.run(install, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    if done.returncode != 0:  # a fresh machine has no package lists yet
        subprocess.run(["apt-get", "update", "-q"], env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        done = subprocess.run(install, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    if done.returncode != 0 or not installed_servers():
        raise Refused("could not install PostgreSQL's server (apt-get install -y postgresql: "
                      f"{_describe(done.returncode)}, its output is above)")


def server_bin(folder: PostgresFolder, log: TextIO) -> Path:
    """The bin folder of the server for this cluster: its own major version, or the newest for a new one."""
    servers = installed_servers()
    if not servers:
        install_server(log)
        servers = installed_servers()
    wanted = folder.version()
    if wanted is None:
        return servers[max(servers, key=int)]
    if wanted not in servers:
        raise Refused(f"the cluster in {folder.data} is PostgreSQL {wanted}, whose server is not installed "
                      f"(installed: {', '.join(sorted(servers, key=int))}): install postgresql-{wanted} or set "
                      "TRAFFIC_AIRFLOW_PGDATA to another folder")
    return servers[wanted]


def _closed_ancestor(path: Path, user: ServerUser) -> Path | None:
    """The first folder on the way to ``path`` that ``user`` may not pass through (its mode bits)."""
    groups = {user.gid} | {g.gr_gid for g in grp.getgrall() if user.name in g.gr_mem}
    for folder in [*reversed(path.parents), path]:
        try:
            info = folder.stat()
        except OSError:
            return folder
        bit = (stat.S_IXUSR if info.st_uid == user.uid else stat.S_IXGRP if info.st_gid in groups else stat.S_IXOTH)
        if not info.st_mode & bit:
            return folder
    return None


def _check_reachable(root: Path, user: ServerUser) -> None:
    """Fail at once, in one line, when the server's user cannot reach its folder (e.g. under a 0700 pytest tmp)."""
    reached = subprocess.run(["test", "-x", str(root), "-a", "-w", str(root)], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **user.popen_args())
    if reached.returncode != 0:
        closed = _closed_ancestor(root, user)
        where = f" ({closed} is closed to it)" if closed else ""
        raise Refused(f"PostgreSQL runs as the system user `{user.name}` (it refuses root), which cannot reach {root}"
                      f"{where}: set TRAFFIC_AIRFLOW_PGDATA to a folder whose parents it can pass through")


def _own(path: Path, user: ServerUser, mode: int) -> None:
    if user.is_other:
        os.chown(path, user.uid, user.gid)
    os.chmod(path, mode)


def prepare(root: Path, log: TextIO = sys.stderr) -> PostgresFolder:
    """The cluster in ``root``, ready to start: installed (root), initialised once, the password made once.

    Idempotent: a second call reuses the cluster and its password."""
    folder = PostgresFolder(root.resolve())
    ours = folder.password_file.exists() or folder.data.exists()
    if folder.root.is_dir() and any(folder.root.iterdir()) and not ours:
        raise Refused(f"{folder.root} holds other files and no PostgreSQL of `make airflow`: set "
                      "TRAFFIC_AIRFLOW_PGDATA to a new or empty folder")
    length = len(os.fsencode(folder.socket))
    if length > SOCKET_PATH_MAX:
        raise Refused(f"the PostgreSQL socket {folder.socket} would be {length} bytes, more than a Unix socket's "
                      f"{SOCKET_PATH_MAX}: set TRAFFIC_AIRFLOW_PGDATA to a shorter folder")
    bin_dir = server_bin(folder, log)
    user = server_user()
    folder.root.mkdir(parents=True, exist_ok=True)
    _own(folder.root, user, 0o700)
    if user.is_other:
        _check_reachable(folder.root, user)
    folder.sockets.mkdir(exist_ok=True)
    _own(folder.sockets, user, 0o700)
    if not folder.password_file.is_file() or not folder.password_file.read_text().strip():
        descriptor = os.open(folder.password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(secrets.token_urlsafe(32) + "\n")
    _own(folder.password_file, user, 0o600)
    if folder.version() is None:
        done = subprocess.run(
            [str(bin_dir / "initdb"), "-D", str(folder.data), "-U", ROLE, f"--pwfile={folder.password_file}",
             "-A", "scram-sha-256", "-E", "UTF8", "--locale=C", "--no-instructions"],
            cwd=folder.root, env=_server_env(os.environ), stdin=subprocess.DEVNULL, capture_output=True, text=True,
            **user.popen_args())
        if done.returncode != 0:
            last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
            raise Refused(f"initdb could not make the cluster in {folder.data} ({_describe(done.returncode)}): {last}")
        print(f"[airflow] made a PostgreSQL {folder.version()} cluster for Airflow's metadata in {folder.data}",
              file=log, flush=True)
    return folder


def server_command(folder: PostgresFolder, bin_dir: Path) -> list[str]:
    """postgres on the socket folder only: no TCP listener at all, the socket open to its owner alone."""
    return [str(bin_dir / "postgres"), "-D", str(folder.data), "-k", str(folder.sockets), "-p", str(PORT),
            "-c", "listen_addresses=", "-c", "unix_socket_permissions=0700"]


def _running_pid(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def clear_stale_server(folder: PostgresFolder, say: Callable[[str], None]) -> None:
    """A killed run may leave postmaster.pid (its pid reused by another process since) or, rarely, an orphaned
    server: the first is removed, the second stopped; a server that another live run still owns is refused."""
    pidfile = folder.data / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    ours = False
    if _running_pid(pid):
        try:
            ours = os.path.samefile(f"/proc/{pid}/cwd", folder.data)  # a postmaster works in its data folder
        except OSError:
            ours = False
    if not ours:
        for stale in [pidfile, *folder.sockets.glob(f".s.PGSQL.{PORT}*")]:
            stale.unlink(missing_ok=True)
        say(f"removed the stale postmaster.pid of a run that did not stop (pid {pid} is no server of {folder.data})")
        return
    if _parent(pid) not in (1, None):
        raise Refused(f"a PostgreSQL server already runs on {folder.data} (pid {pid}): is another `make airflow` using "
                      "this TRAFFIC_AIRFLOW_PGDATA? Stop it first")
    say(f"stopping the PostgreSQL server a killed run left on {folder.data} (pid {pid})")
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 30
    while _running_pid(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _running_pid(pid):
        raise Refused(f"the PostgreSQL server a killed run left on {folder.data} (pid {pid}) does not stop: "
                      "stop it first")


# -- processes --------------------------------------------------------------------------------------

def _process_table() -> dict[int, int]:
    """pid -> parent pid of every live process."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            parent = _parent(int(entry.name))
            if parent is not None:
                table[int(entry.name)] = parent
    return table


def descendants(pid: int, table: Mapping[int, int] | None = None) -> list[int]:
    table = _process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for child, parent in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def _signal(pids, signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


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
            _signal([pid for pid in late if _running_pid(pid)], signal.SIGKILL)
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
        popen.setdefault("preexec_fn", _die_with_parent(signal.SIGTERM))
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
        for pid, parent in _process_table().items():
            if parent == me and pid not in self._spawned and not _running_pid(pid):
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def _leftovers(self) -> list[int]:
        """Live processes of children that already exited (orphans adopted by this one), and all below them."""
        table, me = _process_table(), os.getpid()
        managed = {c.process.pid for c in [*self.components, self.server, self.one_shot]
                   if c is not None and c.process is not None and c.process.returncode is None}
        roots = [pid for pid, parent in table.items() if parent == me and pid not in self._helpers | managed]
        return [p for root in roots for p in (root, *descendants(root, table)) if _running_pid(p)]

    def _stop_leftovers(self) -> None:
        """SIGTERM to what a component that exited left running (its executor's workers, say); SIGKILL 10 s later."""
        for pid in self._leftovers():
            if pid not in self._doomed:
                _signal([pid], signal.SIGTERM)
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
        self._helpers = {pid for pid, parent in _process_table().items() if parent == os.getpid()}
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
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
                self.say(f"`{' '.join(self.one_shot.argv)}` failed ({_describe(self.one_shot.process.returncode)}): "
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
                self.say(f"PostgreSQL exited unexpectedly ({_describe(self.server.process.returncode)}): "
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
        how, count, minutes = _describe(child.process.returncode), len(child.exits), f"{self.window / 60:g} min"
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
        self.spawn(self.server, env=_server_env(self.env), cwd=folder.root,
                   preexec_fn=_die_with_parent(signal.SIGINT), **user.popen_args())
        deadline = time.monotonic() + READY_TIMEOUT
        while not (folder.server_ready() and folder.accepts_connections()):
            if self.stopping:
                return self.shutdown(0)
            if not self.server.alive():
                self.drain()
                self.say(f"PostgreSQL exited before accepting connections ({_describe(self.server.process.returncode)};"
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
            _signal([self.server.process.pid], signal.SIGINT)
            deadline = time.monotonic() + self.postgres_grace
            while self.server.alive() and time.monotonic() < deadline:
                self.pump(0.2)
            if self.server.alive():
                self.say(f"PostgreSQL did not stop within {self.postgres_grace:g} s: killing it")
                # its backends each have a session of their own: found as its descendants, not by its group
                _signal([self.server.process.pid, *descendants(self.server.process.pid)], signal.SIGKILL)
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
                    _signal([child.process.pid], signal.SIGTERM)
                    again.add(child.name)
            self.pump(0.2)
        for child in running:
            self.say(f"{child.name} did not stop within {self.grace:g} s: killing it")
            _signal([child.process.pid, *descendants(child.process.pid)], signal.SIGKILL)
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
            _signal(left, signal.SIGKILL)
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
