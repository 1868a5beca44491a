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
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.support.airflow_api import AirflowApi, backfill_completed, create_backfill, failed_task_logs, write_router_feed  # noqa: F401 (tests import the feed from here)

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


@dataclass
class Backfill:
    midnight: datetime
    start: datetime
    end: datetime
    expected: dict
    ingest_runs: list
    triggered_ingest: dict
    backfill: dict
    runs: list  # backfill runs in order, each with "tasks": {task_id: state} and "close": the close task's XCom
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
    while not (done := backfill_completed(api, backfill))[1]:
        backfill = done[0]
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
        r["close"] = api.xcom("traffic_hourly", r["dag_run_id"], "close")  # what the run's close did
    return Backfill(midnight=midnight, start=start, end=end, expected=expected, ingest_runs=ingest_runs,
                    triggered_ingest=triggered, backfill=backfill, runs=runs, seconds=seconds, live_runs=live)
