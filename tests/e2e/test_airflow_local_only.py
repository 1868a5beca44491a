"""`make airflow` listens on 127.0.0.1 only and keeps its secrets to its owner.

The real `scripts/airflow.sh` (the ``airflow`` fixture): once the scheduler and the triggerer
run, every listening TCP socket of its processes is bound to a loopback address (Airflow 3.3's
log servers would listen on every interface; they are not started), the API server's among
them, and its PostgreSQL (every process of it) listens on no TCP port at all; the password file,
the JWT signing key and PostgreSQL's password file are 0600.
"""

from __future__ import annotations

import ipaddress
import os
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import _our_processes
from tests.support.sockets import socket_inodes, tcp_listening

pytestmark = pytest.mark.slow  # it starts a real Airflow


def _session(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, ValueError, IndexError):
        return None


def _airflow_processes(home: Path) -> list[int]:
    """Every process of the fixture's Airflow: its session (airflow.sh starts one). Found by session,
    not only by environment: a process that sets its title (the API server, a log server) overwrites
    the environment that /proc shows."""
    sessions = {_session(pid) for pid in _our_processes(home)} - {None}
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _session(int(p.name)) in sessions]


def _server_processes(data: Path) -> list[int]:
    """Every process of the PostgreSQL server on ``data`` (the postmaster and each backend, which has a
    session of its own, work in that folder)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.path.samefile(proc / "cwd", data):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_only_loopback_listens_and_the_secrets_are_the_owners(airflow):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the log servers would start with these two
        commands = [_command(pid) for pid in _airflow_processes(airflow.home)]
        if any("airflow scheduler" in c for c in commands) and any("airflow triggerer" in c for c in commands):
            break
        time.sleep(2)
    else:
        raise AssertionError(f"the scheduler and the triggerer did not start: {commands}")
    # Watched, not slept through: every listener any of its processes holds at any look during the window
    # in which a log server would bind (it starts with the scheduler and the triggerer), so one that binds
    # late in the window, or binds and goes, is seen too; the first look beyond loopback fails at once.
    pgdata = Path(airflow.env.get("TRAFFIC_AIRFLOW_PGDATA") or airflow.home / "postgres")
    servers = _server_processes(pgdata / "data")
    assert servers, f"no PostgreSQL server runs on {pgdata / 'data'}"
    ours: dict = {}
    window = time.monotonic() + 20
    while time.monotonic() < window:
        listening = tcp_listening()
        for pid in _airflow_processes(airflow.home) + _server_processes(pgdata / "data"):
            for inode in socket_inodes(pid) & set(listening):
                ours[listening[inode]] = _command(pid)
        exposed = {where: command for where, command in ours.items()
                   if not ipaddress.ip_address(where[0]).is_loopback}
        assert not exposed, f"listening beyond loopback: {exposed}"
        time.sleep(0.25)
    port = int(airflow.url.rsplit(":", 1)[1])
    assert ("127.0.0.1", port) in ours, f"the API server is not among the listeners: {ours}"
    database = {where: command for where, command in ours.items() if "/bin/postgres" in command}
    assert not database, f"PostgreSQL listens on TCP: {database}"

    for secret in (airflow.home / "passwords.json", airflow.home / "jwt_secret", pgdata / "password"):
        assert secret.stat().st_mode & 0o777 == 0o600, f"{secret}: {secret.stat().st_mode & 0o777:o}"
