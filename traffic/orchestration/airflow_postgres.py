"""The PostgreSQL server of the embedded Airflow's metadata: its folder, its installation and first set-up.

A server from Debian's packages keeps the metadata in a folder of the project (TRAFFIC_AIRFLOW_PGDATA):
Unix socket only, a generated password, owner-only, run as the system user ``postgres`` when this is
root. ``prepare`` installs (root) and initialises it once; the supervisor (``embedded``) starts it.
"""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, TextIO
from urllib.parse import quote

import psycopg2

from traffic.orchestration.processes import describe_exit, is_running, parent_pid

ROLE = DATABASE = "airflow"
PORT = 5432
#: A Unix socket's path has room for 107 bytes (sun_path is 108 with its NUL); PostgreSQL refuses longer.
SOCKET_PATH_MAX = 107


class Refused(Exception):
    """The embedded Airflow cannot start; the message is the one line a user sees."""


def server_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for initdb and postgres: no PG* variable (PGPORT would rename the socket)."""
    return {k: v for k, v in environ.items() if not k.startswith("PG")}


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
    """This user, or ``postgres`` when this is root (PostgreSQL refuses to run as root)."""
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
                      f"{describe_exit(done.returncode)}, its output is above)")


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
    """``path`` owned by the server's user, with ``mode``."""
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
            cwd=folder.root, env=server_env(os.environ), stdin=subprocess.DEVNULL, capture_output=True, text=True,
            **user.popen_args())
        if done.returncode != 0:
            last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
            raise Refused(f"initdb could not make the cluster in {folder.data} ({describe_exit(done.returncode)}): {last}")
        print(f"[airflow] made a PostgreSQL {folder.version()} cluster for Airflow's metadata in {folder.data}",
              file=log, flush=True)
    return folder


def server_command(folder: PostgresFolder, bin_dir: Path) -> list[str]:
    """postgres on the socket folder only: no TCP listener at all, the socket open to its owner alone."""
    return [str(bin_dir / "postgres"), "-D", str(folder.data), "-k", str(folder.sockets), "-p", str(PORT),
            "-c", "listen_addresses=", "-c", "unix_socket_permissions=0700"]


def clear_stale_server(folder: PostgresFolder, say: Callable[[str], None]) -> None:
    """A killed run may leave postmaster.pid (its pid reused by another process since) or, rarely, an orphaned
    server: the first is removed, the second stopped; a server that another live run still owns is refused."""
    pidfile = folder.data / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    ours = False
    if is_running(pid):
        try:
            ours = os.path.samefile(f"/proc/{pid}/cwd", folder.data)  # a postmaster works in its data folder
        except OSError:
            ours = False
    if not ours:
        for stale in [pidfile, *folder.sockets.glob(f".s.PGSQL.{PORT}*")]:
            stale.unlink(missing_ok=True)
        say(f"removed the stale postmaster.pid of a run that did not stop (pid {pid} is no server of {folder.data})")
        return
    if parent_pid(pid) not in (1, None):
        raise Refused(f"a PostgreSQL server already runs on {folder.data} (pid {pid}): is another `make airflow` using "
                      "this TRAFFIC_AIRFLOW_PGDATA? Stop it first")
    say(f"stopping the PostgreSQL server a killed run left on {folder.data} (pid {pid})")
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 30
    while is_running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if is_running(pid):
        raise Refused(f"the PostgreSQL server a killed run left on {folder.data} (pid {pid}) does not stop: "
                      "stop it first")
