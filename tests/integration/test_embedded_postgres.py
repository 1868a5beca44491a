"""The embedded Airflow's PostgreSQL for real (traffic.orchestration.embedded), in a tmp folder.

The supervisor starts the server (as the system user ``postgres`` when this is root), which accepts connections
on its socket and has no TCP listener; the password is the owner's alone; Ctrl-C, a SIGKILLed supervisor and
the server's own death leave no server process of that folder; a second start reuses the cluster and its
password, and a postmaster.pid left by a killed run is dealt with. Components are tiny clients of the server
through the URL the supervisor hands them (``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN``), with psycopg2 and with
asyncpg (the driver Airflow derives for its async engine).
"""

from __future__ import annotations

import io
import os
import pwd
import shutil
import signal
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.sockets import socket_inodes, tcp_listening
from tests.unit.test_embedded_airflow import Supervised, alive, gone
from traffic.orchestration import airflow_postgres
from traffic.orchestration.airflow_postgres import Refused

CLIENT = ("client", [sys.executable, "-c", """
import asyncio, os, time
import sqlalchemy
from sqlalchemy.ext.asyncio import create_async_engine
url = os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
open("client.pid", "w").write(str(os.getpid()))
with sqlalchemy.create_engine(url).connect() as connection:
    row = connection.execute(sqlalchemy.text("SELECT current_database(), current_user, inet_server_addr()")).one()
print("connected", *row, flush=True)

async def main():
    engine = create_async_engine(url.replace("+psycopg2", "+asyncpg"))
    async with engine.connect() as connection:
        print("async", (await connection.execute(sqlalchemy.text("SELECT 1"))).scalar(), flush=True)
    await engine.dispose()

asyncio.run(main())
time.sleep(600)
"""])
CONNECTED = "client        | connected airflow airflow None"  # over the socket: no server address


@pytest.fixture
def base():
    """A folder under /tmp the server's user can pass through (pytest's own tmp is 0700 root's)."""
    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="embedded-pg-"))
    folder.chmod(0o711)
    yield folder
    for pid in server_processes(folder / "pg" / "data"):  # only if a test failed half-way
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)


def server_processes(data: Path) -> list[int]:
    """Every process of the server on ``data``: the postmaster and its backends all work in that folder."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and alive(int(entry.name)):
            try:
                if os.path.samefile(entry / "cwd", data):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def server_uid() -> int:
    return pwd.getpwnam("postgres").pw_uid if os.geteuid() == 0 else os.geteuid()


def test_the_server_accepts_its_socket_only_keeps_the_password_private_and_stops_with_ctrl_c(base):
    folder = airflow_postgres.prepare(base / "pg", io.StringIO())
    secret = folder.password_file.stat()
    assert stat.S_IMODE(secret.st_mode) == 0o600 and secret.st_uid == server_uid()
    assert stat.S_IMODE(folder.root.stat().st_mode) == 0o700 and folder.data.stat().st_uid == server_uid()

    run = Supervised(base, [CLIENT], pgdata=str(folder.root))
    try:
        text = run.wait_for("client        | async 1")
        assert CONNECTED in text, text
        assert f"[airflow] PostgreSQL accepts connections on {folder.socket} (no TCP listener)" in text, text
        assert "postgres      | " in text and "FATAL" not in text, text  # its log, under its name; no early tries
        assert stat.S_ISSOCK(folder.socket.stat().st_mode) and stat.S_IMODE(folder.socket.stat().st_mode) == 0o700
        servers = server_processes(folder.data)
        assert len(servers) >= 3, servers  # the postmaster, its background processes and the client's backend
        assert all(Path(f"/proc/{pid}").stat().st_uid == server_uid() for pid in servers)
        exposed = {pid: socket_inodes(pid) & set(tcp_listening()) for pid in servers}
        assert not any(exposed.values()), f"a server process listens on TCP: {exposed}"
    finally:
        code = run.ctrl_c()
    text = run.text()
    assert code == 0, text
    assert "received fast shutdown request" in text and text.rstrip().endswith("[airflow] stopped"), text
    assert "exited unexpectedly" not in text, text
    assert server_processes(folder.data) == [], "a server process outlived Ctrl-C"
    assert not folder.socket.exists()


def test_a_second_start_reuses_the_cluster_a_killed_supervisor_leaves_no_server_and_a_stale_pid_file_is_handled(base):
    said = io.StringIO()
    folder = airflow_postgres.prepare(base / "pg", said)
    password, made = folder.password(), (folder.data / "PG_VERSION").stat().st_ino
    assert "made a PostgreSQL" in said.getvalue()
    again = io.StringIO()
    assert airflow_postgres.prepare(base / "pg", again) == folder and again.getvalue() == ""
    assert folder.password() == password and (folder.data / "PG_VERSION").stat().st_ino == made

    run = Supervised(base, [CLIENT], pgdata=str(folder.root))
    run.wait_for(CONNECTED)
    client = int((base / "client.pid").read_text())
    servers = server_processes(folder.data)
    assert servers and alive(client)
    run.kill()  # SIGKILL: nothing of the supervisor runs; its children get their parent-death signal
    assert gone(servers, timeout=15) == [], "the server outlived its SIGKILLed supervisor"
    assert gone([client]) == []

    # A killed run's postmaster.pid whose pid is now another live process (here: this test's)
    lines = [str(os.getpid()), str(folder.data), "1700000000", "5432", str(folder.sockets), "", "0 0", "ready   "]
    (folder.data / "postmaster.pid").write_text("\n".join(lines) + "\n")
    (base / "supervisor.log").unlink()
    run = Supervised(base, [CLIENT], pgdata=str(folder.root))
    try:
        text = run.wait_for(CONNECTED)
        assert "removed the stale postmaster.pid" in text, text
    finally:
        assert run.ctrl_c() == 0, run.text()
    assert server_processes(folder.data) == []


def test_the_server_dying_stops_everything_with_a_non_zero_exit(base):
    folder = airflow_postgres.prepare(base / "pg", io.StringIO())
    waiting = ("idle", ["sh", "-c", "echo $$ > idle.pid; exec sleep 600"])
    run = Supervised(base, [CLIENT, waiting], pgdata=str(folder.root))
    run.wait_for(CONNECTED)
    idle = int((base / "idle.pid").read_text())
    postmaster = int((folder.data / "postmaster.pid").read_text().split()[0])
    os.kill(postmaster, signal.SIGKILL)
    assert run.wait() == 1, run.text()
    text = run.text()
    assert ("[airflow] PostgreSQL exited unexpectedly (killed by SIGKILL): Airflow cannot work without it, "
            "stopping everything") in text, text
    assert gone([idle]) == [] and gone(server_processes(folder.data)) == [], text


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the server as another user, who may not reach a folder")
def test_a_folder_the_server_user_cannot_reach_is_refused_in_one_line(base):
    closed = base / "closed"
    closed.mkdir(mode=0o700)  # like /tmp/pytest-of-root
    with pytest.raises(Refused) as refused:
        airflow_postgres.prepare(closed / "pg", io.StringIO())
    message = str(refused.value)
    assert "\n" not in message and "TRAFFIC_AIRFLOW_PGDATA" in message, message
    assert f"({closed} is closed to it)" in message, message
    assert not (closed / "pg" / "data").exists()
