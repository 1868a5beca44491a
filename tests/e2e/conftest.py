"""One real Airflow for the end-to-end tests: `scripts/airflow.sh` (what `make airflow` runs) in a tmp home.

Module fixtures (the REST and the browser tests are one module, so Airflow starts once, and stops as
soon as that module is done rather than at the very end of the run):

* ``airflow`` — `make airflow`'s Airflow, as a user gets it: metadata in its own PostgreSQL (on a Unix
  socket), the three DAGs unpaused by `airflow.sh` once parsed, the 5-minute ingest on its schedule and
  the hourly DAG's live run waiting for the watermark; 127.0.0.1 (a free port), its own AIRFLOW_HOME,
  warehouse and inbox under tmp, ``TRAFFIC_KEEP_HOURS=1``; a REST API v2 client with a JWT from the
  simple auth manager. Stopped like Ctrl-C does (SIGINT to its process group); whatever of it is still
  alive after 20 s is SIGKILLed (its home, warehouse and database are thrown away).
* ``browser`` — headless Chromium from Debian driven by Playwright (no browser is downloaded).
* ``backfills`` — the user's scenario of issue 40, ``REPEATS`` times in a row on that one Airflow: a
  router feed of five event-time hours across a midnight dropped in the inbox and ingested by
  `traffic_ingest`, then `traffic_hourly` backfilled over the four hours from 21:00 to 00:00 (logical
  dates; the midnight run is the one ending at 00:00) while the live runs work — from the UI's Backfill
  form (Playwright) and through the REST API in turn, with ``max_active_runs`` 1, 2 and 4 in turn
  (issue 41). Each repeat is the next day, so the watermark only moves forward.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.support.airflow_api import AirflowApi, backfill_completed, create_backfill, failed_task_logs, write_router_feed  # noqa: F401 (tests import the feed from here)
from tests.conftest import SUITE_ENGINE
from tests.support.sockets import free_port

ROOT = Path(__file__).resolve().parents[2]
UTC = timezone.utc
CHROMIUM = "/usr/bin/chromium"
OUT = ROOT / "test-output"
# Generous bounds: a few seconds per backfilled hour on an idle 2-core machine, several times that
# when other Spark jobs share it.
START_TIMEOUT, INGEST_TIMEOUT, BACKFILL_TIMEOUT = 240, 360, 600
HOURS_BEFORE_MIDNIGHT, HOURS_AFTER_MIDNIGHT = 3, 2
#: The scenario's repeats: the creating hand (UI form / REST API) alternates, max_active_runs cycles 1, 2, 4,
#: so each hand creates five backfills and meets every max_active_runs.
REPEATS = 10
MAX_ACTIVE_RUNS = (1, 2, 4)
#: What the supervisor of `make airflow` prints when a component dies (it then restarts it).
COMPONENT_DIED = "exited unexpectedly"
SCHEDULER_LOOP_DIED = "Exception when executing SchedulerJob._run_scheduler_loop"


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
        """The settings `make airflow`'s processes resolve (their environment names the suite's engine)."""
        from traffic.core.settings import load_settings

        return load_settings(environ={k: v for k, v in self.env.items() if k.startswith("TRAFFIC_")})

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def components_alive(self) -> None:
        """Fail at once, with Airflow's own words, when a component died (the supervisor restarts it, but
        a test of the user's scenario must not pass on a restart) or the scheduler loop crashed."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        died = [line for line in text.splitlines() if COMPONENT_DIED in line]
        crash = text.find(SCHEDULER_LOOP_DIED)
        if crash >= 0:
            died += [line for line in text[crash:].splitlines()[:60] if "Error" in line or "error" in line][:5]
        assert not died, "a component of the embedded Airflow died: " + " | ".join(died)


def _our_processes(home: Path, database: Path | None = None) -> list[int]:
    """Processes whose environment names this test's AIRFLOW_HOME (all started by it), and those of its
    PostgreSQL server (the ``postgres`` user's, whose environment does not carry it and whose backends set
    their own titles: found by their working folder, which is the server's data folder)."""
    marker = f"AIRFLOW_HOME={home}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
            elif database is not None and Path(os.readlink(proc / "cwd")).is_relative_to(database):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return f"pid {pid} (gone)"


def _stop(process: subprocess.Popen, home: Path, database: Path | None = None) -> list[str]:
    """Like Ctrl-C: SIGINT to the process group, then up to 30 s for everything of it to end (the warm Spark
    server and PostgreSQL included, which `make airflow` stops after Airflow); then SIGKILL to whatever of
    ours is left. Returns what Ctrl-C left running (the command lines), for the caller to judge."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.monotonic() + 30
    while (left := ([process.pid] if process.poll() is None else []) + _our_processes(home, database)) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    survivors = [_command(pid) for pid in left]
    for _ in range(3):
        leftovers = ([process.pid] if process.poll() is None else []) + _our_processes(home, database)
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
    return survivors


@contextmanager
def database_folder():
    """A folder for the Airflow's PostgreSQL server that its ``postgres`` user can reach when the tests
    run as root (pytest's own tmp folders are 0700 root), removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="traffic-e2e-pg-", dir="/tmp"))
    base.chmod(0o711)
    try:
        yield base / "postgres"
    finally:
        shutil.rmtree(base, ignore_errors=True)


class PortTaken(RuntimeError):
    """The API server could not bind the port chosen for it: another test's server took it meanwhile."""


def _start(env: dict, home: Path, database: Path, log: Path) -> tuple[subprocess.Popen, AirflowApi, str]:
    """`scripts/airflow.sh` with ``env``, until it has unpaused the three DAGs as it does for a user: its
    process, a REST client and the admin password. Stopped again if it does not get there."""
    url = f"http://127.0.0.1:{env['AIRFLOW__API__PORT']}"
    with open(log, "wb") as out:
        process = subprocess.Popen(["bash", str(ROOT / "scripts" / "airflow.sh")], cwd=ROOT, env=env,
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    try:
        deadline, api = time.monotonic() + START_TIMEOUT, None
        while True:
            said = log.read_text(errors="replace")
            if "address already in use" in said.lower():
                raise PortTaken(f"port {env['AIRFLOW__API__PORT']} was taken")
            if process.poll() is not None:
                raise AssertionError(f"airflow.sh exited with {process.returncode}:\n" + said[-4000:])
            if time.monotonic() > deadline:
                raise AssertionError(f"Airflow not ready after {START_TIMEOUT}s:\n" + said[-4000:])
            try:
                if api is None:
                    password = json.loads((home / "passwords.json").read_text())["admin"]
                    api = AirflowApi(url, password)
                dags = api.get("/api/v2/dags?dag_id_pattern=traffic_")["dags"]
                if {d["dag_id"] for d in dags if not d["is_paused"]} == {"traffic_ingest", "traffic_hourly",
                                                                        "traffic_replay"}:
                    return process, api, password
            except (OSError, ValueError, KeyError, AssertionError):
                pass
            time.sleep(2)
    except BaseException:
        _stop(process, home, database)
        raise


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    base = tmp_path_factory.mktemp("airflow-e2e")
    home, warehouse, inbox = base / "airflow-home", base / "warehouse", base / "inbox"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAFFIC_", "AIRFLOW", "PYSPARK_"))}
    log = base / "airflow.log"
    with database_folder() as database:
        env.update({
            "AIRFLOW_HOME": str(home), "TRAFFIC_WAREHOUSE": str(warehouse), "TRAFFIC_INBOX": str(inbox),
            "TRAFFIC_AIRFLOW_PGDATA": str(database), "TRAFFIC_KEEP_HOURS": "1",
            # The suite's engine (rs unless TRAFFIC_TEST_ENGINE says otherwise): on delta-spark this module's
            # ten backfills took 35 min of CI's 60 (16 on rs); the compose test runs Airflow on delta-spark.
            "TRAFFIC_ENGINE": SUITE_ENGINE,
            "NO_COLOR": "1", "PYTHONUNBUFFERED": "1",  # the log file keeps up, even if we have to SIGKILL
        })
        # A free port can be taken by another test's server between our look and the API server's bind:
        # then start again on another one (three tries, then the failure says so).
        for attempt in range(3):
            env["AIRFLOW__API__PORT"] = str(free_port())
            try:
                process, api, password = _start(env, home, database, log)
                break
            except PortTaken:
                if attempt == 2:
                    raise
                log.rename(log.with_name(f"airflow-port-taken-{attempt + 1}.log"))  # its words are not this run's
        try:
            banner = [line for line in log.read_text(errors="replace").splitlines() if line.startswith(" metadata ")]
            assert banner and all("PostgreSQL (socket " in line for line in banner), banner  # make airflow's default
            yield Airflow(url=f"http://127.0.0.1:{env['AIRFLOW__API__PORT']}", home=home, warehouse=warehouse,
                          inbox=inbox, base=base, password=password, api=api, log=log, env=env)
        finally:
            survivors = _stop(process, home, database)
            assert _our_processes(home, database) == [], "processes of the test's Airflow are still running"
            assert survivors == [], f"Ctrl-C left these running 30 s later: {survivors}"


# -- the browser ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium chromium-driver (scripts/test.sh does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"])
        try:
            yield chromium
        finally:
            chromium.close()


@contextmanager
def logged_in(browser, airflow, width: int = 1280, height: int = 900):
    """A page logged in through the simple auth manager's form, as a person does."""
    context = browser.new_context(viewport={"width": width, "height": height}, timezone_id="UTC")
    page = context.new_page()
    page.set_default_timeout(30_000)
    try:
        page.goto(airflow.url + "/")
        page.get_by_label("Username").fill("admin")
        page.get_by_label("Password").fill(airflow.password)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(airflow.url + "/")
        OUT.mkdir(exist_ok=True)
        yield page
    finally:
        context.close()


def rest(page) -> None:
    """Leave the UI for a blank page, logged in still. An open DAG page refreshes itself every few seconds
    while runs are active: measured, Chromium and the API server it polls took a third of a core between
    the scenario's backfills, taken from the Spark tasks the test waits for."""
    page.goto("about:blank")


def form_field(dialog, label: str):
    """A form row of the trigger dialog, found by its visible label."""
    return dialog.get_by_role("group").filter(has=dialog.page.locator("label", has_text=label))


def pick_datetime(page, dialog, label: str, moment) -> None:
    """The form's date-time picker: open it, type date and time (UTC), close it."""
    form_field(dialog, label).get_by_test_id("datetime-input").click()
    popover = page.locator("[data-scope=popover][data-part=content][data-state=open]")
    popover.get_by_placeholder("YYYY/MM/DD").fill(f"{moment:%Y/%m/%d}")
    time_input = popover.get_by_placeholder("HH:mm")
    time_input.fill(f"{moment:%H:%M}")
    time_input.press("Enter")
    dialog.get_by_role("heading").first.click()  # closes the popover
    popover.wait_for(state="detached")


def backfill_in_the_ui(page, airflow, dag_id: str, first: datetime, last: datetime, max_active_runs: int,
                       shot: Path | None = None) -> dict:
    """The UI's Backfill form, as a person fills it: Trigger → Backfill, From/To (logical dates, UTC),
    Max Active Runs, Run Backfill; then the backfill the form made, as the REST API shows it."""
    before = {b["id"] for b in airflow.api.get(f"/api/v2/backfills?dag_id={dag_id}")["backfills"]}
    page.goto(f"{airflow.url}/dags/{dag_id}")
    page.get_by_role("button", name="Trigger").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text("Backfill", exact=True).click()
    dialog.get_by_text("Date Range").wait_for()
    pick_datetime(page, dialog, "From", first)
    pick_datetime(page, dialog, "To", last)
    dialog.locator("input[name=max_active_runs]").fill(str(max_active_runs))
    runs = (last - first) // timedelta(hours=1) + 1
    dialog.get_by_text(f"{runs} runs will be triggered").wait_for()  # the form's own dry run agrees
    if shot is not None:
        page.screenshot(path=str(shot), full_page=True)
    dialog.get_by_role("button", name="Run Backfill").click()
    page.get_by_text("Backfill generated").wait_for()
    rest(page)
    made = [b for b in airflow.api.get(f"/api/v2/backfills?dag_id={dag_id}")["backfills"] if b["id"] not in before]
    assert len(made) == 1, made
    return made[0]


# -- the scenario --------------------------------------------------------------------------------

def first_midnight() -> datetime:
    """The first repeat's midnight: far enough back that every repeat's hours are finished intervals
    (backfills only create those), well within max_history."""
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - timedelta(days=REPEATS + 1)


@dataclass
class Repeat:
    index: int
    hand: str  # "ui" or "api": who created the backfill
    max_active_runs: int
    midnight: datetime
    start: datetime  # the feed's first hour, and the backfill's first logical date
    end: datetime  # the feed's end (its tick): the watermark after the ingest
    expected: dict
    backfill: dict
    runs: list  # the backfill's runs in order, each with "tasks": {task_id: state} and "close": the close task's XCom
    roll_up_commits: dict  # table -> roll-up commits this repeat added ("daily", "periods")
    seconds: dict

    @property
    def last(self) -> datetime:
        """The backfill's last logical date: the hour starting at midnight (its run ends at 01:00)."""
        return self.midnight


@dataclass
class Backfills:
    repeats: list
    ingest_runs: list  # every traffic_ingest run when the last repeat was done, each with "tasks"
    live_runs: list  # the hourly DAG's scheduled runs then, each with "tasks"


def _roll_up_commits(warehouse) -> dict:
    return {name: sum(1 for h in warehouse.table(name).history() if h.get("traffic.op") == "roll_up")
            for name in ("daily", "periods")}


def _wait_for_watermark(airflow, moment: datetime, run_id: str) -> None:
    from traffic.orchestration import conditions

    deadline = time.monotonic() + INGEST_TIMEOUT
    while not conditions.watermark_passed(airflow.settings(), moment):
        airflow.components_alive()
        if time.monotonic() > deadline:
            raise AssertionError(f"the watermark has not reached {moment} after {INGEST_TIMEOUT}s: "
                                 + str(airflow.api.task_states("traffic_ingest", run_id))
                                 + failed_task_logs(airflow.home, "traffic_ingest", run_id))
        time.sleep(2)


def backfill_runs(api, backfill: dict) -> list[dict]:
    """The runs of ``backfill`` in order (the REST API's runs do not name their backfill: its DAG's backfill
    runs whose logical dates are in its range; one backfill of a DAG is active at a time)."""
    first, last = (datetime.fromisoformat(backfill[k].replace("Z", "+00:00")) for k in ("from_date", "to_date"))
    runs = [r for r in api.runs(backfill["dag_id"], run_type="backfill")
            if first <= datetime.fromisoformat(r["logical_date"].replace("Z", "+00:00")) <= last]
    return sorted(runs, key=lambda r: r["logical_date"])


def _wait_for_completion(airflow, backfill: dict) -> dict:
    deadline = time.monotonic() + BACKFILL_TIMEOUT
    while not (done := backfill_completed(airflow.api, backfill))[1]:
        backfill = done[0]
        airflow.components_alive()
        if time.monotonic() > deadline:
            states = {r["dag_run_id"]: (r["state"], airflow.api.task_states("traffic_hourly", r["dag_run_id"]))
                      for r in backfill_runs(airflow.api, backfill)}
            raise AssertionError(f"backfill {backfill['id']} not complete after {BACKFILL_TIMEOUT}s: {states}")
        time.sleep(2)
    return done[0]


@pytest.fixture(scope="module")
def backfills(airflow, browser) -> Backfills:
    from traffic.storage.warehouse import Warehouse

    api, repeats = airflow.api, []
    deadline = time.monotonic() + 60
    while not api.runs("traffic_hourly", run_type="scheduled"):  # the live run unpausing makes
        assert time.monotonic() < deadline, "unpausing traffic_hourly made no live run in 60 s"
        time.sleep(1)
    # Read the clock once: a run that crosses midnight UTC must not skip a day between two repeats (seen in
    # CI: repeat 6 started the day after repeat 5, so day 5 was left for it and it rolled up two days).
    first = first_midnight()
    with logged_in(browser, airflow) as page:
        rest(page)
        for index in range(REPEATS):
            clock, seconds = time.monotonic(), {}
            midnight = first + timedelta(days=index)
            start = midnight - timedelta(hours=HOURS_BEFORE_MIDNIGHT)
            end = midnight + timedelta(hours=HOURS_AFTER_MIDNIGHT)
            expected = write_router_feed(airflow.inbox / "edge" / f"feed-{start:%Y%m%dT%H}.csv", start, end, seed=4)
            # The micro-batch: the 5-minute schedule runs on its own; a user in a hurry triggers one too.
            triggered = api.post("/api/v2/dags/traffic_ingest/dagRuns", {"logical_date": None})
            _wait_for_watermark(airflow, end, triggered["dag_run_id"])
            seconds["ingest"] = time.monotonic() - clock

            # The backfill, created while the live hourly run waits and the ingest runs on its schedule.
            warehouse = Warehouse(airflow.settings(), engine="rs")
            commits = _roll_up_commits(warehouse)
            hand, mar = ("ui", "api")[index % 2], MAX_ACTIVE_RUNS[index % len(MAX_ACTIVE_RUNS)]
            clock = time.monotonic()
            if hand == "ui":
                made = backfill_in_the_ui(page, airflow, "traffic_hourly", start, midnight, mar,
                                          shot=OUT / "airflow-backfill-form.png" if index == 0 else None)
            else:
                made = create_backfill(api, "traffic_hourly", start, midnight, max_active_runs=mar)
            assert made["max_active_runs"] == mar and not made["is_paused"], made
            done = _wait_for_completion(airflow, made)
            seconds["backfill"] = time.monotonic() - clock
            runs = backfill_runs(api, made)
            for r in runs:
                r["tasks"] = api.task_states("traffic_hourly", r["dag_run_id"])
                r["close"] = api.xcom("traffic_hourly", r["dag_run_id"], "close")  # what the run's close did
            added = {name: n - commits[name] for name, n in _roll_up_commits(warehouse).items()}
            print(f"\nAirflow e2e repeat {index + 1}/{REPEATS} ({hand}, max_active_runs {mar}): ingest "
                  f"{seconds['ingest']:.0f} s, backfill of {len(runs)} hours {seconds['backfill']:.0f} s")
            repeats.append(Repeat(index=index, hand=hand, max_active_runs=mar, midnight=midnight, start=start, end=end,
                                  expected=expected, backfill=done, runs=runs, roll_up_commits=added,
                                  seconds=seconds))
    airflow.components_alive()
    ingest_runs = []
    for r in api.runs("traffic_ingest"):
        if r["state"] not in ("success", "failed"):
            r = api.wait_run("traffic_ingest", r["dag_run_id"], timeout=240, home=airflow.home)
        ingest_runs.append({**r, "tasks": api.task_states("traffic_ingest", r["dag_run_id"])})
    live = [{**r, "tasks": api.task_states("traffic_hourly", r["dag_run_id"])}
            for r in api.runs("traffic_hourly", run_type="scheduled")]
    return Backfills(repeats=repeats, ingest_runs=ingest_runs, live_runs=live)
