"""A real Airflow runs the pipeline, checked through its API and through a real browser.

One module, so both halves share one Airflow on one test worker. The scenario (start Airflow,
drop the files, trigger `traffic_ingest`, backfill `traffic_hourly` across a midnight) is the
``hourly_backfill`` fixture in ``conftest.py``. First, what it must have produced — in the Delta
tables (read with Arrow, no Spark) and in the runs' and tasks' states. Then the UI: headless
Chromium from Debian (``/usr/bin/chromium``; `make test` installs it) driven by Playwright (no
browser is downloaded) logs in, sees the three DAGs, fills and submits the replay form.
Screenshots go to ``test-output/``; the grid of ``traffic_hourly`` after the backfill is the
README's image (``make screenshots`` refreshes ``docs/img/``).
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, write_router_feed
from tests.support.screenshots import publish_for_docs
from traffic.storage import state as st
from traffic.storage.delta import Warehouse

pytestmark = pytest.mark.slow


def _warehouse(airflow) -> Warehouse:
    return Warehouse(airflow.settings(), engine="rs")


def _hours(start, end):
    hour, out = start, []
    while hour < end:
        out.append(hour)
        hour += timedelta(hours=1)
    return out


def test_micro_batch_ingests_once_and_skips_spark_when_nothing_is_new(airflow, hourly_backfill):
    runs = {r["dag_run_id"]: r for r in hourly_backfill.ingest_runs}
    triggered = runs[hourly_backfill.triggered_ingest["dag_run_id"]]
    assert triggered["run_type"] == "manual" and triggered["state"] == "success", triggered
    assert all(r["state"] == "success" for r in runs.values()), {k: (r["state"], r["tasks"]) for k, r in runs.items()}
    ingested = [k for k, r in runs.items() if r["tasks"]["ingest"] == "success"]
    skipped = [k for k, r in runs.items() if r["tasks"]["ingest"] == "skipped"]
    assert len(ingested) == 1 and len(skipped) == len(runs) - 1 >= 1, {k: r["tasks"] for k, r in runs.items()}

    warehouse = _warehouse(airflow)
    batches = st.rows(warehouse.table("batches").read_arrow())
    expected_packets = sum(p for _, p in hourly_backfill.expected.values())
    assert [(b["batch_id"], b["packets_on_time"], b["ticks"], b["packets_late"], b["records_rejected"])
            for b in batches] == [(1, expected_packets, 1, 0, 0)]
    assert st.read_clock_state(warehouse).watermark == hourly_backfill.end


def test_backfill_freezes_every_hour_and_rolls_up_the_day_once_at_midnight(airflow, hourly_backfill):
    scenario = hourly_backfill
    hours = _hours(scenario.start, scenario.end)
    assert [r["data_interval_start"][:16] for r in scenario.runs] == [f"{h:%Y-%m-%dT%H:%M}" for h in hours]
    for index, run in enumerate(scenario.runs):
        at_midnight = run["data_interval_end"].startswith(f"{scenario.midnight:%Y-%m-%dT%H:%M}")
        assert run["state"] == "success", run
        # Issue 26: the backfill's first run freezes every hour the watermark has closed (the whole range,
        # in one Spark application); the later runs find theirs final and only re-check them.
        assert run["tasks"] == {"wait_for_watermark": "success", "close": "success",
                                "publish_data_quality": "success"}, run["dag_run_id"]
        close = run["close"]  # the close task's XCom: what the grid shows of the run
        assert (close["froze"], close["rolled_up_day"], close["rolled_up_month"]) == (index == 0, at_midnight, False), \
            (run["dag_run_id"], close)
        assert close["spark"] == ("warm server" if index == 0 or at_midnight else None), close

    warehouse = _warehouse(airflow)
    ledger = st.read_ledger(warehouse)
    frozen = {r["period_start"]: r for r in ledger if r["grain"] == "hour"}
    assert sorted(frozen) == hours
    for hour in hours:
        assert (frozen[hour]["bytes"], frozen[hour]["packets"]) == tuple(scenario.expected[hour]), hour
        assert frozen[hour]["dq_status"] in ("passed", "warning") and frozen[hour]["late_bytes"] == 0  # published
    hourly = st.rows(warehouse.table("hourly").read_arrow(columns=["hour", "bytes", "status"]))
    assert {r["status"] for r in hourly} == {"final"}
    for hour in hours:
        assert sum(r["bytes"] for r in hourly if r["hour"] == hour) == scenario.expected[hour][0]

    # The day before the midnight is rolled up exactly once; the day after is not closed yet.
    day = scenario.midnight - timedelta(days=1)
    days = [r for r in ledger if r["grain"] == "day"]
    assert [r["period_start"] for r in days] == [day] and days[0]["dq_status"] in ("passed", "warning")
    day_bytes = sum(scenario.expected[h][0] for h in hours if h < scenario.midnight)
    assert days[0]["bytes"] == day_bytes
    daily = st.rows(warehouse.table("daily").read_arrow(columns=["day", "bytes"]))
    assert {r["day"] for r in daily} == {day.date()} and sum(r["bytes"] for r in daily) == day_bytes
    roll_ups = [h for h in warehouse.table("daily").history() if h.get("traffic.op") == "roll_up"]
    assert len(roll_ups) == 1, roll_ups
    assert [r for r in ledger if r["grain"] == "month"] == []
    assert warehouse.table("monthly").read_arrow().num_rows == 0

    # Raw detail: keep_hours=1 behind hour_floor(W) — only the last hour's packets are left,
    # expired by each run's `close` task in the worker, without a JVM.
    packets = st.rows(warehouse.table("packets").read_arrow(columns=["hour", "bytes"]))
    assert {r["hour"] for r in packets} == {scenario.end - timedelta(hours=1)}
    assert sum(r["bytes"] for r in packets) == scenario.expected[scenario.end - timedelta(hours=1)][0]
    expired = [r["close"]["expire"] for r in scenario.runs]
    assert [e["spark_started"] for e in expired] == [False] * len(scenario.runs), expired
    assert sum(e["expired_hours"] for e in expired) == len(scenario.runs) - 1, expired


def test_the_live_run_waiting_for_the_watermark_does_not_hold_the_backfill_back(airflow, hourly_backfill):
    """Issue 26: the scheduler's own run of the latest hour waits (its sensor, up to two hours) for a
    watermark two days behind, and the backfill completes beside it all the same."""
    live = hourly_backfill.live_runs
    assert len(live) == 1, live
    run = live[0]
    assert run["state"] in ("queued", "running"), run
    assert run["tasks"]["wait_for_watermark"] in ("up_for_reschedule", "running", "scheduled", "queued"), run
    assert run["tasks"]["close"] is None, run
    latest = max(r["data_interval_end"] for r in hourly_backfill.runs)
    assert run["data_interval_start"] > latest  # an hour the watermark has not reached
    # It was waiting while the backfill's runs went through, not created after them.
    assert run["start_date"] < max(r["end_date"] for r in hourly_backfill.runs), run


def test_spark_steps_ran_as_clients_of_the_warm_server_make_airflow_started(airflow, hourly_backfill):
    """Issue 26: `make airflow` starts the warehouse's own Spark Connect server; the freeze, the day roll-up
    and the micro-batch ran as its clients (no spark-submit, no JVM of their own) and their logs say so."""
    ran = {step: next(r["dag_run_id"] for r in hourly_backfill.runs if r["close"][step])
           for step in ("froze", "rolled_up_day")}
    logs = [airflow.home / "logs" / "dag_id=traffic_hourly" / f"run_id={run_id}" / "task_id=close" / "attempt=1.log"
            for run_id in ran.values()]
    ingest = hourly_backfill.ingest_runs[-1]
    logs += sorted((airflow.home / "logs" / "dag_id=traffic_ingest").glob("run_id=*/task_id=ingest/attempt=1.log"))
    assert len(set(ran.values())) == 2 and len(logs) >= 3, (ran, ingest)
    for log in logs:
        text = log.read_text(errors="replace")
        assert "Spark: a client of the warm Spark Connect server sc://localhost:" in text, (log, text[-2000:])
        assert "(the warehouse's own)" in text and "Spark-Submit cmd" not in text, log
        assert "token=" not in text, f"{log} shows the server's token"


def test_rerunning_a_final_hour_rechecks_without_spark(airflow, hourly_backfill):
    """Clearing a finished run re-runs it: the freeze is skipped (already final) and no table changes."""
    api, warehouse = airflow.api, _warehouse(airflow)
    run = next(r for r in hourly_backfill.runs if r["data_interval_start"].startswith(
        f"{hourly_backfill.midnight:%Y-%m-%dT%H:%M}"))
    versions = {name: warehouse.table(name).version() for name in ("hourly", "periods", "daily", "packets")}
    clock = time.monotonic()
    api.post(f"/api/v2/dags/traffic_hourly/dagRuns/{run['dag_run_id']}/clear", {"dry_run": False})
    time.sleep(2)
    again = api.wait_run("traffic_hourly", run["dag_run_id"], timeout=180, home=airflow.home)
    seconds = time.monotonic() - clock
    tasks = api.task_states("traffic_hourly", run["dag_run_id"])
    assert again["state"] == "success", tasks
    assert tasks == {"wait_for_watermark": "success", "close": "success", "publish_data_quality": "success"}, tasks
    close = airflow.api.xcom("traffic_hourly", run["dag_run_id"], "close")
    assert (close["froze"], close["rolled_up_day"], close["rolled_up_month"], close["spark"]) == \
        (False, False, False, None), close  # the hour after midnight: no day change, and no day waiting
    assert {name: warehouse.table(name).version() for name in versions} == versions
    assert seconds < 90, f"a re-check took {seconds:.0f}s"


# -- the Airflow UI in a real browser ------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
OUT = ROOT / "test-output"


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


@pytest.fixture()
def page(browser, airflow):
    """A logged-in page (the simple auth manager's login form, as a person fills it)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, timezone_id="UTC")
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(airflow.url + "/")
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill(airflow.password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(airflow.url + "/")
    OUT.mkdir(exist_ok=True)
    try:
        yield page
    finally:
        context.close()


def _field(dialog, label: str):
    """A form row of the trigger dialog, found by its visible label."""
    return dialog.get_by_role("group").filter(has=dialog.page.locator("label", has_text=label))


def _pick_datetime(page, dialog, label: str, moment) -> None:
    """The form's date-time picker: open it, type date and time (UTC), close it."""
    _field(dialog, label).get_by_test_id("datetime-input").click()
    popover = page.locator("[data-scope=popover][data-part=content][data-state=open]")
    popover.get_by_placeholder("YYYY/MM/DD").fill(f"{moment:%Y/%m/%d}")
    time_input = popover.get_by_placeholder("HH:mm")
    time_input.fill(f"{moment:%H:%M}")
    time_input.press("Enter")
    dialog.get_by_role("heading").first.click()  # closes the popover
    popover.wait_for(state="detached")


def test_ui_lists_the_dags_and_the_replay_form_starts_a_run(airflow, hourly_backfill, page):
    # The three DAGs are listed.
    page.goto(airflow.url + "/dags")
    for dag_id in ("traffic_ingest", "traffic_hourly", "traffic_replay"):
        page.get_by_text(dag_id, exact=True).first.wait_for()
    page.screenshot(path=str(OUT / "airflow-dags.png"))

    # A small archive after what was ingested: two hours with a tick at the end.
    start = hourly_backfill.end + timedelta(hours=1)
    end = start + timedelta(hours=2)
    archive = airflow.base / "archive"
    expected = write_router_feed(archive / "edge" / "archived.csv", start, end, seed=11)

    airflow.api.unpause("traffic_replay")  # paused DAGs keep triggered runs queued
    page.goto(airflow.url + "/dags/traffic_replay")
    page.get_by_role("button", name="Trigger").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text("Run Parameters").wait_for()
    _pick_datetime(page, dialog, "From (UTC)", start)
    _pick_datetime(page, dialog, "To (UTC)", end + timedelta(minutes=1))  # the tick at `end` is inside the range
    _field(dialog, "Input folder").locator("input").fill(str(archive))
    _field(dialog, "Source").locator("input").fill("edge")
    page.screenshot(path=str(OUT / "airflow-replay-form.png"), full_page=True)
    before = {r["dag_run_id"] for r in airflow.api.runs("traffic_replay")}
    dialog.get_by_role("button", name="Trigger", exact=True).click()

    # The run the form started, with the form's values, succeeds.
    deadline = time.monotonic() + 30
    while not (new := [r for r in airflow.api.runs("traffic_replay") if r["dag_run_id"] not in before]):
        assert time.monotonic() < deadline, "the form did not start a run"
        time.sleep(1)
    (run,) = new
    assert run["conf"]["input"] == str(archive) and run["conf"]["source"] == "edge", run["conf"]
    assert run["conf"]["from"].startswith(f"{start:%Y-%m-%dT%H:%M}"), run["conf"]
    assert run["conf"]["restate"] is False
    done = airflow.api.wait_run("traffic_replay", run["dag_run_id"], timeout=240, home=airflow.home)
    assert done["state"] == "success", airflow.api.task_states("traffic_replay", run["dag_run_id"])
    page.goto(f"{airflow.url}/dags/traffic_replay/runs/{run['dag_run_id']}")
    page.get_by_text("check_request").first.wait_for()
    page.screenshot(path=str(OUT / "airflow-replay-run.png"))

    # Replayed into an open range: counted normally, and closed in the same application.
    warehouse = Warehouse(airflow.settings(), engine="rs")
    frozen = {r["period_start"]: r for r in st.read_ledger(warehouse, "hour")}
    for hour, (size, packets) in expected.items():
        assert (frozen[hour]["bytes"], frozen[hour]["packets"]) == (size, packets), hour


def test_grid_after_the_backfill(airflow, hourly_backfill, page):
    """The grid of traffic_hourly: each hour frozen, the day rolled up only at midnight (README image)."""
    page.set_viewport_size({"width": 960, "height": 520})
    page.goto(airflow.url + "/dags/traffic_hourly")
    page.get_by_role("button", name="Collapse Details Panel").click()
    for run in hourly_backfill.runs:  # a column per backfilled hour (its states are checked via the API)
        page.get_by_test_id(f"grid-{run['dag_run_id']}-publish_data_quality").wait_for()
    page.wait_for_timeout(1000)  # let the last cells paint
    page.screenshot(path=str(OUT / "airflow-grid.png"))
    publish_for_docs(OUT / "airflow-grid.png")
    assert (OUT / "airflow-grid.png").stat().st_size < 200_000
