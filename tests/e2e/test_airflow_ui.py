"""A real browser on the Airflow UI: log in, see the three DAGs, fill and submit the replay form.

Headless Chromium from Debian (``/usr/bin/chromium``; `make test` installs it) driven by
Playwright — no browser is downloaded. Screenshots go to ``test-output/``; the grid of
``traffic_hourly`` after the backfill is the README's image (``make screenshots`` refreshes ``docs/img/``).
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, write_router_feed
from tests.screenshots import publish_for_docs
from traffic import state as st
from traffic.delta import Warehouse

pytestmark = pytest.mark.slow

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
