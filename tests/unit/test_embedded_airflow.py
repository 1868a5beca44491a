"""`make airflow`'s supervisor (traffic.orchestration.embedded) with fake components: tiny shell and Python children.

A component that exits is said on the console (``exited unexpectedly``) and restarted; one that keeps dying stops
the whole with a non-zero exit; a Ctrl-C (SIGINT to the process group, as a terminal or the e2e fixture sends it)
stops every child and what the children started, and exits 0. The supervisor runs as its own process, as
scripts/airflow.sh execs it, so its signal handling is the real one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from traffic.orchestration import airflow_postgres, processes
from traffic.orchestration.airflow_postgres import PostgresFolder, Refused

ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
import json, sys
from pathlib import Path
from traffic.orchestration.airflow_postgres import PostgresFolder
from traffic.orchestration.embedded import Supervisor
spec = json.loads(sys.argv[1])
folder = PostgresFolder(Path(spec["pgdata"])) if spec.get("pgdata") else None
options = {k: spec[k] for k in ("grace", "restarts", "second_signal", "stop_after", "on_stop") if k in spec}
sys.exit(Supervisor([tuple(c) for c in spec["components"]], setup=[tuple(c) for c in spec.get("setup", [])],
                    postgres=folder, **options).run())
"""


class Supervised:
    """The supervisor started like scripts/airflow.sh leaves it: its own session, output to a file."""

    def __init__(self, folder: Path, components, **spec):
        self.folder, self.log = folder, folder / "supervisor.log"
        spec = {"components": components, **spec}
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(spec)], cwd=folder,
                                            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
                                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, needle: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while needle not in (text := self.text()):
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} not in the supervisor's output after {timeout} s:\n{text}")
            if self.process.poll() is not None:
                raise AssertionError(f"the supervisor exited ({self.process.returncode}) before {needle!r}:\n{text}")
            time.sleep(0.05)
        return text

    def ctrl_c(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
        return self.wait(timeout)

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the supervisor did not exit within {timeout} s:\n{self.text()}") from None

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def supervised(tmp_path):
    started = []

    def start(components, **spec):
        started.append(Supervised(tmp_path, components, **spec))
        return started[-1]

    yield start
    for one in started:
        one.kill()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended; whoever adopted it may not have reaped it yet


def pid_in(path: Path, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} was not written"
        time.sleep(0.05)
    return int(path.read_text())


def gone(pids, timeout: float = 10) -> list[int]:
    """The pids still running after ``timeout`` s (polled): [] when all ended."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def sleeper(name: str) -> tuple[str, list[str]]:
    return name, ["sh", "-c", f'echo $$ > {name}.pid; echo "{name} up"; exec sleep 600']


def test_a_component_that_exits_is_said_restarted_and_counted(supervised, tmp_path):
    flaky = ("flaky", ["sh", "-c", 'if [ -e once ]; then echo $$ > flaky.pid; echo "flaky again"; exec sleep 600; fi; '
                                   'touch once; echo "flaky dies"; exit 3'])
    run = supervised([sleeper("steady"), flaky])
    text = run.wait_for("flaky again")
    assert "flaky         | flaky dies" in text, text  # each line of a component under its name
    assert "[airflow] flaky exited unexpectedly (code 3): restarting it (1 of 3 in 10 min)" in text, text
    assert text.count("exited unexpectedly") == 1, text
    pids = [pid_in(tmp_path / "steady.pid"), pid_in(tmp_path / "flaky.pid")]
    assert run.ctrl_c() == 0, run.text()
    assert gone(pids) == [], run.text()
    assert run.text().count("exited unexpectedly") == 1, run.text()


def test_a_component_that_keeps_dying_stops_the_whole_with_a_non_zero_exit(supervised, tmp_path):
    run = supervised([sleeper("steady"), ("doomed", ["sh", "-c", "echo doomed starts; exit 1"])])
    steady = pid_in(tmp_path / "steady.pid")
    code = run.wait()
    text = run.text()
    assert code == 1, text
    for count in (1, 2, 3):
        assert f"doomed exited unexpectedly (code 1): restarting it ({count} of 3 in 10 min)" in text, text
    assert ("doomed exited unexpectedly (code 1), 4 times in 10 min (at most 3 restarts): "
            "stopping everything") in text, text
    assert text.count("doomed        | doomed starts") == 4, text  # started once, restarted three times
    assert gone([steady]) == [], f"the steady component outlived the stop:\n{text}"


def test_ctrl_c_stops_every_child_and_what_they_started_and_exits_0(supervised, tmp_path):
    # One child ignores SIGINT and SIGTERM (it is killed after the grace) and leaves a grandchild that ignores
    # them too; neither may outlive the stop.
    stubborn = ("stubborn", [sys.executable, "-c", (
        "import os, signal, subprocess, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "child = subprocess.Popen(['sleep', '600'])\n"
        "open('grandchild.pid', 'w').write(str(child.pid))\n"
        "open('stubborn.pid', 'w').write(str(os.getpid()))\n"
        "print('stubborn up', flush=True)\n"
        "time.sleep(600)\n")])
    run = supervised([sleeper("steady"), stubborn], grace=1)
    run.wait_for("stubborn up")
    run.wait_for("steady up")
    pids = [pid_in(tmp_path / name) for name in ("steady.pid", "stubborn.pid", "grandchild.pid")]
    clock = time.monotonic()
    assert run.ctrl_c() == 0, run.text()
    text = run.text()
    assert time.monotonic() - clock < 10, text
    assert "[airflow] stopping (SIGINT): steady, stubborn" in text, text
    assert "[airflow] stubborn did not stop within 1 s: killing it" in text, text
    assert "exited unexpectedly" not in text, text
    assert text.rstrip().endswith("[airflow] stopped"), text
    assert gone(pids, timeout=2) == [], text


def test_the_on_stop_command_runs_once_the_components_have_stopped(supervised, tmp_path):
    # `make airflow` stops the warm Spark server this way: after Airflow's components, its output on the console.
    on_stop = [sys.executable, "-c", "import os; print('steady still running:', os.path.exists('steady.alive'));"
                                     "open('on_stop.ran', 'w').close(); print('warm server stopped')"]
    steady = ("steady", [sys.executable, "-c", (
        "import os, signal, sys, time\n"
        "open('steady.alive', 'w').close()\n"
        "signal.signal(signal.SIGINT, lambda *_: (os.remove('steady.alive'), sys.exit(0)))\n"
        "print('steady up', flush=True)\n"
        "while True: time.sleep(1)\n")])
    run = supervised([steady], on_stop=on_stop)
    run.wait_for("steady up")
    assert not (tmp_path / "on_stop.ran").exists()
    assert run.ctrl_c() == 0, run.text()
    text = run.text()
    assert (tmp_path / "on_stop.ran").exists(), text
    assert "[airflow] steady still running: False" in text and "[airflow] warm server stopped" in text, text
    assert text.index("[airflow] warm server stopped") < text.index("[airflow] stopped"), text


def test_a_failing_on_stop_command_is_said_and_the_stop_goes_on(supervised, tmp_path):
    run = supervised([sleeper("steady")], on_stop=[sys.executable, "-c", "import sys; print('no server'); sys.exit(3)"])
    run.wait_for("steady up")
    assert run.ctrl_c() == 0, run.text()
    text = run.text()
    assert "[airflow] no server" in text and "exited with 3" in text and text.rstrip().endswith("[airflow] stopped"), text


def test_sigterm_stops_it_too(supervised, tmp_path):
    run = supervised([sleeper("steady")])
    steady = pid_in(tmp_path / "steady.pid")
    os.kill(run.process.pid, signal.SIGTERM)  # the supervisor alone, not its group
    assert run.wait() == 0, run.text()
    assert "stopping (SIGTERM)" in run.text() and "exited unexpectedly" not in run.text()
    assert gone([steady]) == []


def test_the_api_server_stops_last_and_a_waiting_scheduler_gets_a_second_sigterm(supervised, tmp_path):
    # The scheduler waits for its tasks after one signal and exits at the second; tasks report to the API
    # server while it waits, so the API server is signalled only once the scheduler has exited.
    scheduler = ("scheduler", [sys.executable, "-c", (
        "import signal, sys, time\n"
        "def stop(signum, _):\n"
        "    if stop.once:\n"
        "        open('scheduler.stopped', 'w').close(); sys.exit(0)\n"
        "    stop.once = True; print('waiting for running tasks after', signal.Signals(signum).name, flush=True)\n"
        "stop.once = False\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "signal.signal(signal.SIGINT, stop)\n"
        "print('scheduler up', flush=True)\n"
        "while True: time.sleep(1)\n")])
    api = ("api-server", [sys.executable, "-c", (
        "import os, signal, sys, time\n"
        "def stop(*_):\n"
        "    print('api-server stops; scheduler stopped before:', os.path.exists('scheduler.stopped'), flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "signal.signal(signal.SIGINT, stop)\n"
        "print('api up', flush=True)\n"
        "while True: time.sleep(1)\n")])
    run = supervised([api, scheduler], grace=10, second_signal=0.5, stop_after={"api-server": ["scheduler"]})
    run.wait_for("scheduler up")
    run.wait_for("api up")
    assert run.ctrl_c() == 0, run.text()
    text = run.text()
    assert "scheduler     | waiting for running tasks after SIGINT" in text, text  # a Ctrl-C to its group
    assert "[airflow] scheduler still running 0.5 s after SIGINT: SIGTERM (the scheduler stops waiting" in text, text
    assert "api-server    | api-server stops; scheduler stopped before: True" in text, text
    assert "killing" not in text, text


def test_a_killed_component_is_restarted_and_what_it_left_is_stopped(supervised, tmp_path):
    # Like a scheduler SIGKILLed: its executor's workers are orphans (adopted by the supervisor) and are stopped.
    worker_owner = ("scheduler", [sys.executable, "-c", (
        "import os, subprocess, sys, time\n"
        "run = len([p for p in os.listdir('.') if p.startswith('scheduler.')])\n"
        "worker = subprocess.Popen(['sleep', '600'])\n"
        "open(f'worker.{run}', 'w').write(str(worker.pid))\n"
        "open(f'scheduler.{run}', 'w').write(str(os.getpid()))\n"
        "print(f'scheduler run {run}', flush=True)\n"
        "time.sleep(600)\n")])
    run = supervised([sleeper("api"), worker_owner])
    run.wait_for("scheduler run 0")
    first, worker = pid_in(tmp_path / "scheduler.0"), pid_in(tmp_path / "worker.0")
    os.kill(first, signal.SIGKILL)
    text = run.wait_for("scheduler run 1")
    assert "[airflow] scheduler exited unexpectedly (killed by SIGKILL): restarting it (1 of 3 in 10 min)" in text, text
    assert gone([worker]) == [], "the killed scheduler's worker is still running"
    second = [pid_in(tmp_path / "scheduler.1"), pid_in(tmp_path / "worker.1")]
    assert alive(second[0]) and alive(second[1])
    assert run.ctrl_c() == 0, run.text()
    assert gone(second) == [], run.text()


def test_setup_runs_before_the_components_and_its_failure_stops_everything(supervised, tmp_path):
    migrate = ("db-migrate", ["sh", "-c", "echo migrating; sleep 0.3; touch migrated"])
    checks = ("api", ["sh", "-c", "test -e migrated && echo 'saw the migration'; exec sleep 600"])
    run = supervised([checks], setup=[migrate])
    text = run.wait_for("saw the migration")
    assert text.index("db-migrate    | migrating") < text.index("api           | saw the migration"), text
    assert run.ctrl_c() == 0

    (tmp_path / "supervisor.log").unlink()
    failing = supervised([sleeper("api")], setup=[("db-migrate", ["sh", "-c", "echo broken >&2; exit 4"])])
    assert failing.wait() == 1, failing.text()
    text = failing.text()
    assert "db-migrate    | broken" in text and "failed (code 4): stopping" in text, text
    assert "api up" not in text and not (tmp_path / "api.pid").exists(), text


# -- the PostgreSQL folder, without a server ---------------------------------------------------------------

def test_the_url_uses_psycopg2_the_socket_folder_and_a_quoted_password(tmp_path):
    folder = PostgresFolder(tmp_path / "pg")
    folder.root.mkdir()
    folder.password_file.write_text("a/b+c%d\n")
    assert folder.url() == f"postgresql+psycopg2://airflow:a%2Fb%2Bc%25d@/airflow?host={tmp_path}/pg/run"
    from sqlalchemy.engine import make_url  # Airflow's own parser reads it back as written

    url = make_url(folder.url())
    assert (url.drivername, url.username, url.password, url.database, url.query["host"]) == \
        ("postgresql+psycopg2", "airflow", "a/b+c%d", "airflow", f"{tmp_path}/pg/run")
    assert folder.socket == tmp_path / "pg" / "run" / ".s.PGSQL.5432"


def test_a_socket_path_too_long_is_refused_in_one_line(tmp_path):
    deep = tmp_path / ("x" * (airflow_postgres.SOCKET_PATH_MAX - len(str(tmp_path))))
    with pytest.raises(Refused) as refused:
        airflow_postgres.prepare(deep)
    message = str(refused.value)
    assert "\n" not in message and "TRAFFIC_AIRFLOW_PGDATA" in message and "107" in message, message
    assert not deep.exists()  # refused before anything was made
    fits = tmp_path / "pg"
    assert len(os.fsencode(PostgresFolder(fits).socket)) <= airflow_postgres.SOCKET_PATH_MAX


def test_a_folder_holding_other_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    before = tmp_path.stat()
    with pytest.raises(Refused, match="holds other files"):
        airflow_postgres.prepare(tmp_path)
    after = tmp_path.stat()
    assert (after.st_mode, after.st_uid) == (before.st_mode, before.st_uid)  # not taken over
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_the_server_ready_line_of_postmaster_pid(tmp_path):
    folder = PostgresFolder(tmp_path)
    folder.data.mkdir()
    assert not folder.server_ready()
    lines = ["123", str(folder.data), "1700000000", "5432", str(folder.sockets), "", "0 0", "starting"]
    (folder.data / "postmaster.pid").write_text("\n".join(lines) + "\n")
    assert not folder.server_ready()
    (folder.data / "postmaster.pid").write_text("\n".join([*lines[:7], "ready   "]) + "\n")
    assert folder.server_ready()


def test_exit_descriptions():
    assert processes.describe_exit(3) == "code 3"
    assert processes.describe_exit(-signal.SIGKILL) == "killed by SIGKILL"


def test_only_debians_server_folders_count(tmp_path):
    for version in ("15", "16", "devel"):
        (tmp_path / version / "bin").mkdir(parents=True)
        (tmp_path / version / "bin" / "postgres").write_text("")
    (tmp_path / "17" / "bin").mkdir(parents=True)  # the client only
    assert airflow_postgres.installed_servers(tmp_path) == {"15": tmp_path / "15" / "bin", "16": tmp_path / "16" / "bin"}


def test_a_missing_server_is_installed_only_by_root_and_otherwise_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(airflow_postgres, "installed_servers", lambda: {})
    monkeypatch.setattr(airflow_postgres.os, "geteuid", lambda: 1000)
    with pytest.raises(Refused) as refused:
        airflow_postgres.server_bin(PostgresFolder(tmp_path / "pg"), sys.stderr)
    assert "sudo apt-get install -y postgresql" in str(refused.value) and "\n" not in str(refused.value)

    ran = []
    monkeypatch.setattr(airflow_postgres.os, "geteuid", lambda: 0)
    monkeypatch.setattr(airflow_postgres.shutil, "which", lambda name: "/usr/bin/apt-get")
    monkeypatch.setattr(airflow_postgres.subprocess, "run", lambda argv, **kw: ran.append((argv, kw["env"]["DEBIAN_FRONTEND"]))
                        or subprocess.CompletedProcess(argv, 100))
    with pytest.raises(Refused, match=r"could not install PostgreSQL's server \(apt-get install -y postgresql: "
                                      r"code 100"):
        airflow_postgres.server_bin(PostgresFolder(tmp_path / "pg"), open(os.devnull, "w"))
    assert [argv for argv, _ in ran] == [["apt-get", "install", "-y", "-q", "postgresql"], ["apt-get", "update", "-q"],
                                         ["apt-get", "install", "-y", "-q", "postgresql"]]
    assert {frontend for _, frontend in ran} == {"noninteractive"}


def test_a_cluster_of_another_major_version_is_refused(tmp_path, monkeypatch):
    folder = PostgresFolder(tmp_path / "pg")
    folder.data.mkdir(parents=True)
    (folder.data / "PG_VERSION").write_text("14\n")
    monkeypatch.setattr(airflow_postgres, "installed_servers", lambda: {"15": Path("/usr/lib/postgresql/15/bin")})
    with pytest.raises(Refused, match="is PostgreSQL 14, whose server is not installed .installed: 15.: "
                                      "install postgresql-14"):
        airflow_postgres.server_bin(folder, sys.stderr)
    (folder.data / "PG_VERSION").write_text("15\n")
    assert airflow_postgres.server_bin(folder, sys.stderr) == Path("/usr/lib/postgresql/15/bin")
