"""The cluster path without Docker: the pipeline on a real Spark standalone master and worker.

A master and one worker (2 cores, 2 GiB) are started with pyspark's own ``bin/spark-class``,
each in its own process group, on 127.0.0.1 and ports they pick themselves (port 0, read back from
their logs: a port probed free here could be taken by a parallel test before Spark binds it, and
Spark would then quietly move to the next one). Two deliveries of a two-source
feed crossing the midnight that ends October then go through the real CLI in its own process
(``traffic run`` with ``TRAFFIC_SPARK_MASTER=spark://127.0.0.1:<port>``; this process already
holds the shared local session): the first is ingested, its hours frozen, 2026-10-31 and
October rolled up; the second brings a late record for a frozen hour, a bad line and the clocks
that close the next hour. The same deliveries go through the in-process harness on the shared
``local[2]`` session, and every table of the two warehouses is compared row for row; only the
batches' wall-clock ``started_at`` and ``committed_at`` may differ. The worker runs in another
time zone (``Pacific/Chatham``, +13:45), so nothing on the executors may lean on theirs.

Then the cluster itself is asked what ran: the master's JSON API (``/json/``) lists both
applications as finished, the worker's (``/json/``) lists their finished executors, the
executors' logs have the finished tasks, the Python workers under the executors ran this venv's
interpreter, and every port of the master, the worker and the executors listened on 127.0.0.1
only (the master's REST submission server, on by default at 6066, is switched off). Master and
worker are stopped (their process groups, then anything they started) and their ports checked free.

Runs in 2-2.5 minutes on a 2-core machine, printing each step's time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psutil
import pytest

from tests.support.harness import Harness, feed_line, tick_line
from tests.support.tables import differences, tables

pytestmark = pytest.mark.slow

UTC = timezone.utc
T0 = datetime(2026, 10, 31, 22, tzinfo=UTC)
NOW = "2026-12-01T00:00:00+00:00"
#: Every delivered file gets this modification time, so ``batches.files`` compares whole.
DELIVERED_AT_NS = int(datetime(2026, 11, 1, 2, tzinfo=UTC).timestamp()) * 10**9
#: The worker's (and so its executors' and Python workers') zone: not UTC, not a whole hour.
EXECUTOR_TZ = "Pacific/Chatham"
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1"}


def deliveries() -> list[dict[str, str]]:
    """Two deliveries, ``{relative path: text}``: a feed from two sources over 2026-10-31 22:00 →
    11-01 01:30, then a late record for 22:00, a bad line, on-time traffic and ticks to 02:00."""
    first = {}
    for k, source in enumerate(("r1", "r2")):
        lines = [feed_line(T0 + timedelta(minutes=m, seconds=13 * k), local=f"10.0.{k}.{m % 5 + 1}",
                           remote=f"192.0.2.{m % 3 + 1}", lport=1000 + m, rport=(443, 53, 8443)[m % 3],
                           size=100 + m)
                 for m in range(0, 200, 7)]
        first[f"{source}/a.csv"] = "\n".join([*lines, tick_line(T0 + timedelta(hours=3, minutes=30))]) + "\n"
    second = {
        "r1/b.csv": "\n".join([feed_line(T0 + timedelta(minutes=30), local="10.0.0.9", size=777),
                               "new,OP_INSERT,not-a-time,10.0.0.1,192.0.2.1,1,2,3",
                               feed_line(T0 + timedelta(hours=3, minutes=40), local="10.0.0.2", size=1500),
                               tick_line(T0 + timedelta(hours=4))]) + "\n",
        "r2/b.csv": "\n".join([feed_line(T0 + timedelta(hours=3, minutes=50), local="10.0.1.3", size=64),
                               tick_line(T0 + timedelta(hours=4))]) + "\n",
    }
    return [first, second]


def deliver(inbox: Path, delivery: dict[str, str]) -> None:
    for name, text in delivery.items():
        path = inbox / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.utime(path, ns=(DELIVERED_AT_NS, DELIVERED_AT_NS))


# -- the cluster ---------------------------------------------------------------------------------

def spark_home() -> Path:
    """The pyspark package: it holds ``bin/spark-class`` and ``jars/`` (found without importing it)."""
    return Path(importlib.util.find_spec("pyspark").submodule_search_locations[0])


def logged_port(log: Path, pattern: str) -> int | None:
    """The port a Spark process says it bound (``pattern`` has one group), from its log; None before."""
    found = re.search(pattern, log.read_text(errors="replace")) if log.exists() else None
    return int(found.group(1)) if found else None


MASTER_PORT = r"Successfully started service 'sparkMaster' on port (\d+)"
MASTER_UI = r"Bound MasterWebUI to 127\.0\.0\.1, and started at http://[^:]+:(\d+)"
WORKER_UI = r"Bound WorkerWebUI to 127\.0\.0\.1, and started at http://[^:]+:(\d+)"


def get_json(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/", timeout=5) as answer:
        return json.load(answer)


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def tail(path: Path, lines: int = 40) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Cluster:
    """A standalone master and one worker, each ``spark-class`` in its own process group."""

    root: Path
    port: int = 0  # each 0 until the process reports what it bound
    master_ui: int = 0
    worker_ui: int = 0
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"  # never spark://local[…]: that would mean YARN

    @property
    def work_dir(self) -> Path:
        return self.root / "work"

    def log(self, name: str) -> Path:
        return self.root / f"{name}.log"

    def start(self, name: str, arguments: list[str], **extra_env) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_", "TRAFFIC_"))}
        env.pop("PYTHONPATH", None)  # executors import this project from the venv, as on a real worker
        env.update(SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1", **extra_env)
        command = [str(spark_home() / "bin" / "spark-class"), *arguments]
        with self.log(name).open("w") as handle:
            self.processes[name] = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                                    cwd=self.root, start_new_session=True)

    def wait_until(self, what: str, ready, timeout: float = 90) -> None:
        """Wait for ``ready()``; fail with the logs' tails when a process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            exited = [name for name, p in self.processes.items() if p.poll() is not None]
            if exited:
                self.fail(f"{', '.join(exited)} exited (code {self.processes[exited[0]].returncode}) before {what}")
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.fail(f"no {what} within {timeout:.0f} s")

    def fail(self, message: str) -> None:
        logs = "\n".join(f"--- {name}.log (last lines) ---\n{tail(self.log(name))}" for name in self.processes)
        pytest.fail(f"Spark standalone cluster: {message}\n{logs}", pytrace=False)

    def descendants(self) -> list[psutil.Process]:
        found = []
        for process in self.processes.values():
            try:
                found += psutil.Process(process.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        return found

    def stop(self, timeout: float = 30) -> list[str]:
        """SIGTERM each process group (SIGKILL if it lingers), then wait for whatever they started
        outside their groups (pyspark's daemons make their own); what is still running, if anything."""
        started = self.descendants()
        for process in self.processes.values():
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    process.wait(timeout)
                    break
                except subprocess.TimeoutExpired:
                    continue
        _, alive = psutil.wait_procs(started, timeout=timeout)
        for process in alive:
            process.kill()
        _, alive = psutil.wait_procs(alive, timeout=timeout)
        left = [f"pid {p.pid}" for p in alive]
        for name, process in self.processes.items():
            try:
                os.killpg(process.pid, 0)
                left.append(f"{name}'s process group {process.pid}")
            except ProcessLookupError:
                pass
        return left


def start_cluster(cluster: Cluster) -> None:
    """Master, then worker; each must answer on its JSON API (the worker: registered) or the test fails."""
    cluster.root.mkdir(parents=True, exist_ok=True)
    cluster.start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                             "--port", "0", "--webui-port", "0"],
                  # The REST submission server (on by default, at 6066) would accept any local user's job.
                  SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")
    with stopwatch("master up"):
        cluster.wait_until("master reporting its ports", lambda: logged_port(cluster.log("master"), MASTER_PORT)
                           and logged_port(cluster.log("master"), MASTER_UI))
        cluster.port = logged_port(cluster.log("master"), MASTER_PORT)
        cluster.master_ui = logged_port(cluster.log("master"), MASTER_UI)
        cluster.wait_until("master answering on its JSON API",
                           lambda: get_json(cluster.master_ui)["status"] == "ALIVE")
    cluster.start("worker", ["org.apache.spark.deploy.worker.Worker", cluster.url, "--host", "127.0.0.1",
                             "--cores", "2", "--memory", "2g", "--webui-port", "0",
                             "--work-dir", str(cluster.work_dir)],
                  SPARK_LOCAL_DIRS=str(cluster.root / "local"), TZ=EXECUTOR_TZ)
    with stopwatch("worker registered"):
        cluster.wait_until("worker reporting its web UI port", lambda: logged_port(cluster.log("worker"), WORKER_UI))
        cluster.worker_ui = logged_port(cluster.log("worker"), WORKER_UI)
        cluster.wait_until("worker registered with the master",
                           lambda: get_json(cluster.master_ui)["aliveworkers"] == 1 and get_json(cluster.worker_ui))


@pytest.fixture
def cluster(tmp_path):
    """A running master and worker; stopped afterwards, and their ports checked free, however the test ends."""
    cluster = Cluster(tmp_path / "cluster")
    try:
        start_cluster(cluster)
        yield cluster
    finally:
        with stopwatch("cluster stopped"):
            left = cluster.stop()
        assert not left, f"left running after the cluster stopped: {left}"
        busy = [port for port in (cluster.port, cluster.master_ui, cluster.worker_ui) if port and listening(port)]
        assert not busy, f"ports still listening after the cluster stopped: {busy}"


class stopwatch:
    """Prints how long a step took."""

    def __init__(self, step: str):
        self.step = step

    def __enter__(self):
        self.clock = time.perf_counter()
        return self

    def __exit__(self, kind, *_):
        outcome = "failed after " if kind else ""
        print(f"standalone cluster: {self.step}: {outcome}{time.perf_counter() - self.clock:.1f} s", flush=True)


# -- watching what runs on the worker -----------------------------------------------------------

class Watch(threading.Thread):
    """Samples, while a job runs, the Python workers under the worker's executors and every
    listening socket of the master, the worker and what they started."""

    def __init__(self, cluster: Cluster):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.pythons: set[tuple[str, ...]] = set()
        self.python_zones: set[str | None] = set()
        self.sockets: set[tuple[str, str, int]] = set()
        self.done = threading.Event()
        self.failed: str | None = None

    def run(self):
        try:
            self._sample()
        except Exception as error:  # noqa: BLE001 - reported by __exit__: a dead sampler would check nothing
            self.failed = f"{type(error).__name__}: {error}"

    def _sample(self):
        while not self.done.wait(0.3):
            # Not yet reaped by this process, so their pids cannot have gone or been reused.
            roles = {p.pid: name for name, p in self.cluster.processes.items() if p.poll() is None}
            for process in [psutil.Process(pid) for pid in roles] + self.cluster.descendants():
                try:
                    command = tuple(process.cmdline())
                    if "pyspark.daemon" in command:
                        self.pythons.add(command)
                        self.python_zones.add(process.environ().get("TZ"))
                    # A process that is exiting (a zombie) has no command line left.
                    role = roles.get(process.pid) or (Path(command[0]).name if command else f"pid {process.pid}")
                    for conn in process.net_connections(kind="inet"):
                        if conn.status == psutil.CONN_LISTEN:
                            self.sockets.add((role, conn.laddr.ip, conn.laddr.port))
                except psutil.Error:
                    continue

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.join()
        assert not self.failed, f"the sampling thread stopped: {self.failed}"


# -- running the pipeline -------------------------------------------------------------------------

def traffic_run(root: Path, master: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``traffic run`` in its own process (and process group: a timeout ends its JVM too)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_", "TRAFFIC_"))}
    env["TRAFFIC_SPARK_MASTER"] = master
    command = [str(Path(sys.executable).with_name("traffic")), "run", "--warehouse", str(root / "warehouse"),
               "--inbox", str(root / "inbox"), "--set", f"now={NOW}", "--set", "shuffle_partitions=2", "--timings"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=root,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"traffic run did not finish within {timeout:.0f} s\n{out}\n{err}", pytrace=False)
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def test_the_pipeline_on_a_standalone_cluster_equals_a_local_run(cluster, spark, tmp_path):
    feed = deliveries()
    on_cluster, outputs = tmp_path / "on-cluster", []
    for number, delivery in enumerate(feed, 1):
        deliver(on_cluster / "inbox", delivery)
        with Watch(cluster) as watch, stopwatch(f"traffic run {number} on {cluster.url}"):
            done = traffic_run(on_cluster, cluster.url)
        print("".join(f"  {line}\n" for line in done.stderr.splitlines() if line.startswith("timings:")), end="")
        assert done.returncode == 0, f"traffic run {number} on the cluster failed:\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
        # Python workers ran under the worker's executors, with this venv's interpreter.
        assert watch.pythons, "no Python worker was seen under the worker's executors"
        assert {Path(command[0]).parent for command in watch.pythons} == {Path(sys.executable).parent}, watch.pythons
        assert watch.python_zones == {EXECUTOR_TZ}, watch.python_zones
        outside = sorted(s for s in watch.sockets if s[1] not in LOOPBACK)
        assert not outside, f"listening beyond 127.0.0.1: {outside}"
        assert {port for role, _, port in watch.sockets if role == "master"} == {cluster.port, cluster.master_ui}, \
            sorted(watch.sockets)
    assert "day(s) rolled up: 2026-10-31" in outputs[0] and "month(s) rolled up: 2026-10" in outputs[0], outputs[0]
    assert "1 late" in outputs[1] and "1 rejected" in outputs[1], outputs[1]

    reference = Harness(tmp_path / "local", spark, now=NOW, shuffle_partitions=2)
    with stopwatch("the same deliveries on the shared local[2] session"):
        for delivery in feed:
            deliver(reference.root / "inbox", delivery)
            reference.ingest()
            assert not reference.close().failed

    with stopwatch("compare every table"):
        got, expected = tables(on_cluster / "warehouse"), tables(reference.root / "warehouse")
    assert got == expected, differences(got, expected)
    sizes = {name: len(table) for name, table in expected.items()}
    print(f"standalone cluster: equal tables (rows): {sizes}", flush=True)
    for name in ("packets", "late_packets", "rejects", "hourly", "daily", "monthly", "periods", "source_panes",
                 "panes", "bills"):
        assert sizes[name], f"{name} is empty: the comparison proves nothing about it"

    with stopwatch("ask the cluster what ran"):
        master = wait_for_finished(cluster, len(feed))
        worker = get_json(cluster.worker_ui)
    apps = {app["id"]: app for app in master["completedapps"]}
    assert [app["name"] for app in apps.values()] == ["traffic-run"] * len(feed), master["completedapps"]
    assert {app["state"] for app in apps.values()} == {"FINISHED"}, master["completedapps"]
    assert [w["host"] for w in master["workers"]] == ["127.0.0.1"] and master["workers"][0]["id"] == worker["id"]
    ran_on_worker = {executor["appid"] for executor in worker["finishedexecutors"]}
    assert set(apps) <= ran_on_worker, f"apps {sorted(apps)}, executors on the worker for {sorted(ran_on_worker)}"
    for app in apps:
        logs = sorted(cluster.work_dir.glob(f"{app}/*/stderr"))
        assert logs and all("Finished task" in log.read_text(errors="replace") for log in logs), (app, logs)


def wait_for_finished(cluster: Cluster, count: int, timeout: float = 30) -> dict:
    """The master's state once ``count`` applications have finished (it learns it from the driver's stop)."""
    deadline = time.monotonic() + timeout
    while True:
        state = get_json(cluster.master_ui)
        if (len(state["completedapps"]) >= count and not state["activeapps"]) or time.monotonic() > deadline:
            return state
        time.sleep(0.5)
