"""One real Airflow for the end-to-end tests: `scripts/airflow.sh` (what `make airflow` runs) in a tmp home.

Module fixtures (the REST and the browser tests are one module, so Airflow starts once, and stops as
soon as that module is done rather than at the very end of the run):

* ``airflow`` — `airflow standalone` on 127.0.0.1 (a free port), its own AIRFLOW_HOME, warehouse
  and inbox under tmp, ``TRAFFIC_KEEP_HOURS=1``; a REST API v2 client with a JWT from the simple
  auth manager. Stopped like Ctrl-C does (SIGINT to its process group); whatever of it is still
  alive after 20 s is SIGKILLed (its home and warehouse are thrown away).
* ``hourly_backfill`` — the scenario: router-feed files for six event-time hours across one
  midnight (a tick at the end so the watermark passes the last hour) dropped in the inbox,
  `traffic_ingest` unpaused and triggered, then `traffic_hourly` backfilled over those hours
  through the REST API's backfill endpoint.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UTC = timezone.utc
# Generous bounds: about 40 s per backfilled hour on an idle 2-core machine, several times that
# when other Spark jobs share it.
START_TIMEOUT, INGEST_TIMEOUT, BACKFILL_TIMEOUT = 240, 360, 900
HOURS_BEFORE_MIDNIGHT, HOURS_AFTER_MIDNIGHT = 3, 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ApiError(AssertionError):
    """A REST API answer other than 2xx (the message has the status and the body)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class AirflowApi:
    """A tiny REST API v2 client (urllib) with a simple-auth-manager JWT."""

    def __init__(self, url: str, password: str):
        self.url, self.password, self._token = url, password, None

    def token(self) -> str:
        if self._token is None:
            body = self._send("POST", "/auth/token", {"username": "admin", "password": self.password}, auth=False)
            self._token = body["access_token"]
        return self._token

    def _send(self, method: str, path: str, body=None, auth: bool = True):
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        request = urllib.request.Request(self.url + path, method=method, headers=headers,
                                         data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read()
        except urllib.error.HTTPError as error:
            raise ApiError(f"{method} {path} → {error.code}: {error.read().decode()[:2000]}", error.code) from None
        return json.loads(text) if text else None

    def get(self, path: str):
        return self._send("GET", path)

    def post(self, path: str, body):
        return self._send("POST", path, body)

    def patch(self, path: str, body):
        return self._send("PATCH", path, body)

    def unpause(self, dag_id: str) -> None:
        self.patch(f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def runs(self, dag_id: str, **query) -> list[dict]:
        params = "&".join(f"{k}={v}" for k, v in {"limit": 100, **query}.items())
        return self.get(f"/api/v2/dags/{dag_id}/dagRuns?{params}")["dag_runs"]

    def run(self, dag_id: str, run_id: str) -> dict:
        return self.get(f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id)}")

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        tis = self.get(f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id)}/taskInstances")
        return {t["task_id"]: t["state"] for t in tis["task_instances"]}

    def wait_run(self, dag_id: str, run_id: str, timeout: float, home: Path | None = None) -> dict:
        """Poll until the run is finished; on timeout say where every task is."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.run(dag_id, run_id)
            if run["state"] in ("success", "failed"):
                return run
            time.sleep(2)
        raise AssertionError(f"{dag_id} {run_id} not finished after {timeout}s: {self.task_states(dag_id, run_id)}"
                             + (failed_task_logs(home, dag_id, run_id) if home else ""))


def failed_task_logs(home: Path, dag_id: str, run_id: str, lines: int = 40) -> str:
    """The end of every failed or running task's log of a run (what a failing test should print)."""
    out = []
    for log in sorted((home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}").glob("task_id=*/attempt=*.log")):
        text = log.read_text(errors="replace").splitlines()
        if any('"level":"error"' in line or "ERROR" in line for line in text):
            events = []
            for line in text[-lines:]:
                try:
                    events.append(json.loads(line).get("event", line))
                except ValueError:
                    events.append(line)
            out.append(f"\n--- {log.relative_to(home)}\n" + "\n".join(map(str, events)))
    return "".join(out)


@dataclass
class Airflow:
    url: str
    home: Path
    warehouse: Path
    inbox: Path
    base: Path
    password: str
    api: AirflowApi
    log: Path
    env: dict = field(repr=False, default_factory=dict)

    def settings(self):
        from traffic.core.settings import load_settings

        return load_settings(environ={k: v for k, v in self.env.items() if k.startswith("TRAFFIC_")})

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _our_processes(home: Path) -> list[int]:
    """Processes whose environment names this test's AIRFLOW_HOME (all started by it)."""
    marker = f"AIRFLOW_HOME={home}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _stop(process: subprocess.Popen, home: Path) -> None:
    """Like Ctrl-C: SIGINT to the process group; after 20 s, SIGKILL to whatever of ours is left."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    for _ in range(3):
        leftovers = ([process.pid] if process.poll() is None else []) + _our_processes(home)
        if not leftovers:
            break
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(1)
    if process.poll() is None:
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    base = tmp_path_factory.mktemp("airflow-e2e")
    home, warehouse, inbox = base / "airflow-home", base / "warehouse", base / "inbox"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAFFIC_", "AIRFLOW", "PYSPARK_"))}
    env.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW__API__PORT": str(port),
        "TRAFFIC_WAREHOUSE": str(warehouse), "TRAFFIC_INBOX": str(inbox),
        "TRAFFIC_KEEP_HOURS": "1",
        # The test unpauses and triggers on its own; no scheduled micro-batch to race with it.
        "TRAFFIC_AIRFLOW_UNPAUSE": "", "TRAFFIC_INGEST_EVERY_MINUTES": "60",
        "NO_COLOR": "1", "PYTHONUNBUFFERED": "1",  # the log file keeps up, even if we have to SIGKILL
    })
    log = base / "airflow.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(["bash", str(ROOT / "scripts" / "airflow.sh")], cwd=ROOT, env=env,
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        api = None
        while True:
            if process.poll() is not None:
                raise AssertionError(f"airflow.sh exited with {process.returncode}:\n"
                                     + log.read_text(errors="replace")[-4000:])
            if time.monotonic() > deadline:
                raise AssertionError(f"Airflow not ready after {START_TIMEOUT}s:\n" + log.read_text(errors="replace")[-4000:])
            try:
                if api is None:
                    password = json.loads((home / "passwords.json").read_text())["admin"]
                    api = AirflowApi(url, password)
                dags = api.get("/api/v2/dags?dag_id_pattern=traffic_")["dags"]
                if {d["dag_id"] for d in dags} == {"traffic_ingest", "traffic_hourly", "traffic_replay"}:
                    break
            except (OSError, ValueError, KeyError, AssertionError):
                pass
            time.sleep(2)
        assert all(d["is_paused"] for d in dags), "DAGs must start paused (only `make airflow` unpauses them)"
        yield Airflow(url=url, home=home, warehouse=warehouse, inbox=inbox, base=base, password=password, api=api,
                      log=log, env=env)
    finally:
        _stop(process, home)
        assert _our_processes(home) == [], "processes of the test's Airflow are still running"


# -- sample traffic ------------------------------------------------------------------------------

def write_router_feed(path: Path, start: datetime, end: datetime, seed: int) -> dict[datetime, list[int]]:
    """Router-feed CSV: a few packets a minute over ``[start, end)``, a clock tick at ``end``.

    Returns (bytes, packets) per hour. Written under a temporary name, then renamed, as a sender does.
    """
    rng = random.Random(seed)
    lines, per_hour = [], {}
    moment = start
    while moment < end:
        for _ in range(rng.randint(1, 3)):
            ts = moment + timedelta(microseconds=rng.randrange(60_000_000))
            size = rng.choice([64, 576, 1500])
            lines.append(f"new,OP_INSERT,{int(ts.timestamp()) * 1_000_000 + ts.microsecond},"
                         f"192.0.2.{rng.randint(10, 14)},198.51.100.{rng.randint(1, 9)},"
                         f"{rng.randint(1024, 65535)},443,{size}")
            totals = per_hour.setdefault(moment.replace(minute=0), [0, 0])
            totals[0] += size
            totals[1] += 1
        moment += timedelta(minutes=1)
    lines.append(f"new,OP_INSERT,{int(end.timestamp()) * 1_000_000}")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    partial.write_text("\n".join(lines) + "\n")
    partial.rename(path)
    return per_hour


def scenario_midnight() -> datetime:
    """Midnight two days back: in the past (backfills only create finished intervals), well within max_history."""
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - timedelta(days=2)


def scheduler_alive(log: Path) -> None:
    """Fail at once, with Airflow's own words, when the scheduler loop has died (nothing would run again)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    crash = text.find("Exception when executing SchedulerJob._run_scheduler_loop")
    if crash >= 0:
        excerpt = [line for line in text[crash:].splitlines()[:60] if "Error" in line or "error" in line]
        raise AssertionError("Airflow's scheduler died (so queued runs never start): " + " | ".join(excerpt[:5]))


def create_backfill(api: AirflowApi, dag_id: str, first: datetime, last: datetime, reprocess: str = "none") -> dict:
    """POST /api/v2/backfills for the logical dates ``first``…``last``, one run at a time (``reprocess``:
    Airflow's reprocess behavior, ``none`` for missing runs only, ``completed`` to run them all again).

    On SQLite, Airflow refuses to create a backfill while another writer holds the database
    ("Database is locked", 503) and removes the partial one: wait a moment and ask again.
    """
    body = {"dag_id": dag_id, "from_date": first.isoformat(), "to_date": last.isoformat(),
            "max_active_runs": 1, "reprocess_behavior": reprocess}
    deadline = time.monotonic() + 90
    while True:
        try:
            return api.post("/api/v2/backfills", body)
        except ApiError as error:
            if error.status == 409:  # an earlier attempt got through after all
                active = [b for b in api.get(f"/api/v2/backfills?dag_id={dag_id}")["backfills"] if not b["completed_at"]]
                if active:
                    return active[0]
            if error.status not in (409, 503) or time.monotonic() > deadline:
                raise
        time.sleep(2)


@dataclass
class Backfill:
    midnight: datetime
    start: datetime
    end: datetime
    expected: dict
    ingest_runs: list
    triggered_ingest: dict
    backfill: dict
    runs: list  # backfill runs in order, each with "tasks": {task_id: state}
    live_runs: list  # the scheduled runs when the backfill completed, each with "tasks"
    seconds: dict


@pytest.fixture(scope="module")
def hourly_backfill(airflow) -> Backfill:
    api, clock, seconds = airflow.api, time.monotonic(), {}
    midnight = scenario_midnight()
    start = midnight - timedelta(hours=HOURS_BEFORE_MIDNIGHT)
    end = midnight + timedelta(hours=HOURS_AFTER_MIDNIGHT)
    expected = write_router_feed(airflow.inbox / "edge" / f"feed-{start:%Y%m%dT%H}.csv", start, end, seed=4)

    # Micro-batch: unpause, trigger through the REST API, then once more with nothing new.
    api.unpause("traffic_ingest")
    triggered = api.post("/api/v2/dags/traffic_ingest/dagRuns", {"logical_date": None})
    run = api.wait_run("traffic_ingest", triggered["dag_run_id"], timeout=INGEST_TIMEOUT, home=airflow.home)
    assert run["state"] == "success", failed_task_logs(airflow.home, "traffic_ingest", triggered["dag_run_id"])
    again = api.post("/api/v2/dags/traffic_ingest/dagRuns", {"logical_date": None})
    api.wait_run("traffic_ingest", again["dag_run_id"], timeout=120, home=airflow.home)
    ingest_runs = []
    for r in api.runs("traffic_ingest"):
        if r["state"] not in ("success", "failed"):
            r = api.wait_run("traffic_ingest", r["dag_run_id"], timeout=240, home=airflow.home)
        ingest_runs.append({**r, "tasks": api.task_states("traffic_ingest", r["dag_run_id"])})
    seconds["ingest"] = time.monotonic() - clock

    # Hourly close over those hours: Airflow's own backfill (REST API v2), one run at a time, in order.
    # Created while the DAG is still paused, then unpaused (a backfill of a paused DAG never starts):
    # creating it beside the scheduler's own work on a just-unpaused DAG crashed Airflow 3.3's
    # scheduler on SQLite twice (StaleDataError, then a foreign-key error on a half-made backfill).
    clock = time.monotonic()
    backfill = create_backfill(api, "traffic_hourly", start, end - timedelta(hours=1))
    api.unpause("traffic_hourly")
    deadline = time.monotonic() + BACKFILL_TIMEOUT
    while api.get(f"/api/v2/backfills/{backfill['id']}")["completed_at"] is None:
        scheduler_alive(airflow.log)
        if time.monotonic() > deadline:
            states = {r["dag_run_id"]: (r["state"], api.task_states("traffic_hourly", r["dag_run_id"]))
                      for r in api.runs("traffic_hourly", run_type="backfill")}
            raise AssertionError(f"backfill not complete after {BACKFILL_TIMEOUT}s: {states}")
        time.sleep(3)
    seconds["backfill"] = time.monotonic() - clock
    # The live run the scheduler made on unpausing (the latest hour, far past the watermark), as it is now.
    live = [{**r, "tasks": api.task_states("traffic_hourly", r["dag_run_id"])}
            for r in api.runs("traffic_hourly", run_type="scheduled")]
    print(f"\nAirflow e2e: ingest {seconds['ingest']:.0f} s, backfill of {(end - start) // timedelta(hours=1)} hours {seconds['backfill']:.0f} s")
    runs = sorted(api.runs("traffic_hourly", run_type="backfill"), key=lambda r: r["data_interval_start"])
    for r in runs:
        r["tasks"] = api.task_states("traffic_hourly", r["dag_run_id"])
    return Backfill(midnight=midnight, start=start, end=end, expected=expected, ingest_runs=ingest_runs,
                    triggered_ingest=triggered, backfill=backfill, runs=runs, seconds=seconds, live_runs=live)
