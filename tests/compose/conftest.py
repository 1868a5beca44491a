"""A Docker engine and the project's compose stack, for ``tests/compose`` (slow, part of `make test`).

* ``docker_env`` (session) — the environment in which ``docker`` reaches an engine: the machine's own
  when one answers, else a ``dockerd`` started here (root only; `make test` installs Debian's
  docker.io) with its data under ``TRAFFIC_TEST_DOCKER_ROOT`` (default /var/tmp/traffic-test-docker,
  kept between runs so built images are reused), no iptables rules, its own socket; stopped at the
  end (``start_engine``, which ``bench/compose.py`` uses too). Skips, saying why, only where no
  engine can run.
* ``Stack`` — one compose project of the repository's docker-compose.yml with a generated `.env`
  (fresh secrets, the UI on a free 127.0.0.1 port, the base images scripts/local-images.sh builds from
  Debian's packages): build, up, wait for every health check, run commands in services, deliver
  files into the inbox on the stack's object store (one object each, as ``traffic collect --upload``
  sends them), fetch the warehouse's objects out of it, and ``down -v``, after which nothing of it may
  be left.
  The UI's port is free when chosen, but another test worker may take it before Docker binds it:
  ``Stack.up`` then moves the UI to another free port and runs `up` again, and fails saying so
  after ``UI_PORT_ATTEMPTS`` ports.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import os
import secrets
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.airflow_api import AirflowApi
from tests.support.sockets import free_port

ROOT = Path(__file__).resolve().parents[2]
ENGINE_ROOT = Path(os.environ.get("TRAFFIC_TEST_DOCKER_ROOT", "/var/tmp/traffic-test-docker"))
LOCAL_BASES = {"TRAFFIC_BASE_IMAGE": "traffic-python:3.11-bookworm", "POSTGRES_IMAGE": "traffic-postgres:15-bookworm"}
#: What the stack's accounting is told: the demo's networks (the seed example) and the router feed's.
LOCAL_NETWORKS = "192.0.2.0/24,2001:db8:100::/48"


def _answers(env: dict) -> bool:
    try:
        return subprocess.run(["docker", "info"], env=env, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class NoEngine(RuntimeError):
    """No Docker engine answers and none can be started here; the message says why."""


def start_engine() -> tuple[dict, Callable[[], None]]:
    """The environment in which ``docker`` reaches an engine, and the function that stops it: the machine's
    own engine when one answers (left running), else a ``dockerd`` started here. ``NoEngine`` when neither."""
    env = dict(os.environ)
    if shutil.which("docker") and _answers(env):
        return env, lambda: None
    dockerd = shutil.which("dockerd")
    if os.geteuid() != 0:
        raise NoEngine("no Docker engine answers, and starting one (dockerd) needs root")
    if not dockerd or not shutil.which("docker"):
        raise NoEngine("no Docker engine answers and dockerd is not installed (make test installs Debian's docker.io)")
    for folder in ("data", "exec"):
        (ENGINE_ROOT / folder).mkdir(parents=True, exist_ok=True)
    socket_path = ENGINE_ROOT / "docker.sock"
    env["DOCKER_HOST"] = f"unix://{socket_path}"
    log_path = ENGINE_ROOT / "dockerd.log"
    with open(log_path, "w") as log:
        engine = subprocess.Popen(
            [dockerd, "--data-root", str(ENGINE_ROOT / "data"), "--exec-root", str(ENGINE_ROOT / "exec"),
             "--pidfile", str(ENGINE_ROOT / "dockerd.pid"), "--host", env["DOCKER_HOST"], "--iptables=false",
             "--storage-driver", "overlay2"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 90
    while not _answers(env):
        if engine.poll() is not None or time.monotonic() > deadline:
            engine.kill()
            last = log_path.read_text(errors="replace").strip().splitlines()[-3:]
            raise NoEngine("a Docker engine cannot run on this machine: dockerd said " + " | ".join(last))
        time.sleep(1)

    def stop() -> None:
        engine.send_signal(signal.SIGTERM)
        try:
            engine.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(engine.pid, signal.SIGKILL)
            engine.wait(10)

    return env, stop


@pytest.fixture(scope="session")
def docker_env():
    try:
        env, stop = start_engine()
    except NoEngine as why:
        pytest.skip(str(why))
    try:
        yield env
    finally:
        stop()


def compose_command(env: dict) -> list[str]:
    """``docker compose`` (v2) where it is installed, else Debian's ``docker-compose`` (v1); ``NoEngine`` if neither."""
    if subprocess.run(["docker", "compose", "version"], env=env, capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise NoEngine("neither `docker compose` nor `docker-compose` is installed")


#: How many UI ports ``Stack.up`` tries before it fails (each was free when chosen, then taken before Docker bound it).
UI_PORT_ATTEMPTS = 5
#: What Docker says when a published port is held: by a process (its userland proxy cannot listen), by a container.
PORT_TAKEN = ("address already in use", "port is already allocated")


def port_taken(output: str, port: int) -> bool:
    """Whether a failed ``up`` says that ``127.0.0.1:port`` could not be bound because something holds it."""
    return f"127.0.0.1:{port}" in output and any(words in output for words in PORT_TAKEN)


def write_dotenv(path: Path, ui_port: int, **more: str) -> dict[str, str]:
    values = {
        "POSTGRES_USER": "airflow", "POSTGRES_PASSWORD": secrets.token_urlsafe(18), "POSTGRES_DB": "airflow",
        "AIRFLOW_ADMIN_USER": "admin", "AIRFLOW_ADMIN_PASSWORD": secrets.token_urlsafe(18),
        "AIRFLOW_FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        "AIRFLOW_JWT_SECRET": secrets.token_urlsafe(32), "AIRFLOW_UI_PORT": str(ui_port),
        "SPARK_CONNECT_TOKEN": secrets.token_hex(32),
        "S3_ACCESS_KEY": f"traffic-{secrets.token_hex(4)}", "S3_SECRET_KEY": secrets.token_urlsafe(32),
        "S3_BUCKET": "lake",
        "TRAFFIC_LOCAL_NETWORKS": LOCAL_NETWORKS, "TRAFFIC_KEEP_HOURS": "24", "TRAFFIC_EXPECTED_SOURCES": "",
        "TRAFFIC_EXPORTERS": "", "COLLECTOR_BIND": "127.0.0.1",
        **LOCAL_BASES, **more,
    }
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    path.chmod(0o600)
    return values


@dataclass
class Stack:
    env: dict
    project: str
    dotenv: Path
    values: dict
    seconds: dict = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    left: list = field(default_factory=list)  # what ``running_stack``'s own ``down -v`` left of the project

    @functools.cached_property
    def api(self) -> AirflowApi:
        """One client (one login) for the stack's whole life."""
        return AirflowApi(f"http://127.0.0.1:{self.values['AIRFLOW_UI_PORT']}", self.values["AIRFLOW_ADMIN_PASSWORD"],
                          patience=120)  # a GET waits out a restarting Postgres (5xx) instead of failing the test

    @functools.cached_property
    def compose_command(self) -> list[str]:
        try:
            return compose_command(self.env)
        except NoEngine as why:
            pytest.skip(str(why))

    def compose(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
        command = [*self.compose_command, "--project-directory", str(ROOT), "-f", str(ROOT / "docker-compose.yml"),
                   "--env-file", str(self.dotenv), "-p", self.project, *args]
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        if check and done.returncode:
            raise AssertionError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done

    def up(self, *args: str, timeout: float = 900) -> None:
        """``up -d`` with ``args``. When Docker cannot publish the UI because its port was taken since it was
        chosen, the UI moves to another free port (the `.env` rewritten, nothing else changed) and `up` runs
        again, ``UI_PORT_ATTEMPTS`` ports at most; any other failure fails at once."""
        tried = []
        while True:
            done = self.compose("up", "-d", *args, timeout=timeout, check=False)
            if done.returncode == 0:
                return
            port = int(self.values["AIRFLOW_UI_PORT"])
            output = done.stdout + done.stderr
            if not port_taken(output, port):
                raise AssertionError(f"up {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                                     f"{done.stderr[-3000:]}")
            tried.append(port)
            if len(tried) == UI_PORT_ATTEMPTS:
                raise AssertionError(f"the UI could not be published: each of the ports {tried} was taken before "
                                     f"Docker bound it:\n{output[-2000:]}")
            self.move_ui_port(free_port())

    def move_ui_port(self, port: int) -> None:
        """Publish the UI on ``port`` from the next ``up`` on: the `.env` rewritten with only that value changed."""
        self.values["AIRFLOW_UI_PORT"] = str(port)
        self.dotenv.write_text("".join(f"{k}={v}\n" for k, v in self.values.items()))
        self.__dict__.pop("api", None)  # a client made for the old port would reach nothing

    def docker(self, *args: str, input: bytes | None = None, timeout: float = 300, check: bool = True):
        done = subprocess.run(["docker", *args], env=self.env, input=input, capture_output=True, timeout=timeout)
        if check and done.returncode:
            raise AssertionError(f"docker {' '.join(args[:4])} … failed: {done.stderr.decode(errors='replace')[-2000:]}")
        return done

    def containers(self, service: str | None = None, all_states: bool = False) -> list[str]:
        label = f"label=com.docker.compose.project={self.project}"
        filters = ["--filter", label] + (["--filter", f"label=com.docker.compose.service={service}"] if service else [])
        out = self.docker("ps", "-q", *(["-a"] if all_states else []), *filters).stdout.decode()
        return out.split()

    def container(self, service: str) -> str:
        found = self.containers(service)
        assert found, f"no running container of {service}"
        return found[0]

    def exec(self, service: str, *command: str, input: bytes | None = None, timeout: float = 300) -> str:
        return self.docker("exec", "-i", self.container(service), *command, input=input,
                           timeout=timeout).stdout.decode(errors="replace")

    def health(self) -> dict[str, str]:
        """Each running container's service and health (``none`` where it has no check)."""
        states = {}
        for cid in self.containers():
            info = json.loads(self.docker("inspect", cid).stdout)[0]
            service = info["Config"]["Labels"]["com.docker.compose.service"]
            number = info["Config"]["Labels"].get("com.docker.compose.container-number", "1")
            states[f"{service}#{number}"] = (info["State"].get("Health") or {}).get("Status", "none")
        return states

    def wait_healthy(self, timeout: float = 600) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            states = self.health()
            if states and all(s == "healthy" for s in states.values()):
                return states
            if time.monotonic() > deadline:
                logs = self.compose("logs", "--tail", "15", check=False).stdout[-4000:]
                raise AssertionError(f"not every service is healthy after {timeout:.0f} s: {states}\n{logs}")
            time.sleep(3)

    def deliver(self, files: dict[str, bytes]) -> None:
        """Put files into the store's inbox as a sender does (``traffic collect --upload``): one PutObject each,
        which the store shows whole or not at all. Sent from inside the stack (the store is not published)."""
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), time.time()
                tar.addfile(info, io.BytesIO(data))
        self.exec("airflow-scheduler", "python", "-c", _STORE + _PUT_TAR, "TRAFFIC_INBOX", input=archive.getvalue())

    def fetch_warehouse(self, destination: Path) -> Path:
        """Every object of the stack's warehouse (``TRAFFIC_WAREHOUSE`` on the store) as files under
        ``destination``, at the same relative paths: Delta tables a local reader opens."""
        destination.mkdir(parents=True, exist_ok=True)
        done = self.docker("exec", self.container("airflow-scheduler"), "python", "-c", _STORE + _GET_TAR,
                           "TRAFFIC_WAREHOUSE", timeout=600)
        with tarfile.open(fileobj=io.BytesIO(done.stdout), mode="r") as tar:
            tar.extractall(destination, filter="data")
        return destination

    def list_objects(self, variable: str) -> dict[str, int]:
        """Each object's name and size under the location the services' ``variable`` names on the store."""
        listed = self.exec("airflow-scheduler", "python", "-c", _STORE + _LIST, variable)
        return {name: int(size) for name, size in (line.rsplit(" ", 1) for line in listed.splitlines() if line)}

    def down(self) -> list[str]:
        """``down -v``; what is left of the project afterwards (containers, volumes, networks): nothing, we hope."""
        self.compose("down", "-v", "--remove-orphans", "--timeout", "30", timeout=600)
        label = f"label=com.docker.compose.project={self.project}"
        left = self.containers(all_states=True)
        left += self.docker("volume", "ls", "-q", "--filter", label).stdout.decode().split()
        left += self.docker("network", "ls", "-q", "--filter", label).stdout.decode().split()
        return left


#: Run in a container of the stack (``python -c``, after ``_STORE``): the store at the location the environment
#: variable named by argv[1] holds.
_STORE = """
import io, os, sys, tarfile, obstore
from traffic.core.location import ObjectLocation
store = ObjectLocation.parse(os.environ[sys.argv[1]]).store()
"""
#: The tar on stdin put as objects there, one PutObject per file.
_PUT_TAR = """
with tarfile.open(fileobj=io.BytesIO(sys.stdin.buffer.read())) as tar:
    for member in tar.getmembers():
        if member.isfile():
            obstore.put(store, member.name, tar.extractfile(member).read())
"""
#: The other way: every object under that location, as a tar on stdout. A listed name that cannot be read is a
#: folder marker (Hadoop's S3A writes ``…/_staged_commits/``), not a file.
_GET_TAR = """
with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
    for batch in obstore.list(store):
        for meta in batch:
            try:
                data = bytes(obstore.get(store, meta["path"]).bytes())
            except FileNotFoundError:
                continue
            info = tarfile.TarInfo(meta["path"])
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
"""
#: Each object's name and size, a line each.
_LIST = """
for batch in obstore.list(store):
    for meta in batch:
        print(meta["path"], meta["size"])
"""


def build_images(env: dict, seconds: dict) -> None:
    """The bases from Debian's packages (scripts/local-images.sh: kept when already built), then the stack's image."""
    clock = time.monotonic()
    done = subprocess.run(["bash", str(ROOT / "scripts" / "local-images.sh")], env=env, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, f"local-images.sh failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    print(done.stdout.strip())
    seconds["base images"] = time.monotonic() - clock


@contextmanager
def running_stack(env: dict, home: Path, project: str, **dotenv_values: str) -> Iterator[Stack]:
    """The stack of ``project`` built and up (spark-connect stopped), every health check passed, its `.env` in
    ``home`` (with ``dotenv_values`` added); ``down -v`` on the way out, whatever happened. ``stack.seconds``
    says where the time went."""
    seconds: dict[str, float] = {}
    started = time.monotonic()
    build_images(env, seconds)
    dotenv = home / ".env"
    stack = Stack(env=env, project=project, dotenv=dotenv, values=write_dotenv(dotenv, free_port(), **dotenv_values),
                  seconds=seconds, started=started)
    try:
        clock = time.monotonic()
        stack.compose("build", "--force-rm", timeout=1800)
        seconds["image build"] = time.monotonic() - clock
        clock = time.monotonic()
        stack.up("--scale", "spark-connect=0")
        stack.wait_healthy()
        seconds["up, healthy"] = time.monotonic() - clock
        yield stack
    finally:
        stack.left = stack.down()
