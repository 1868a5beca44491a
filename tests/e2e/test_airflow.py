"""A real Airflow runs the pipeline, checked through its API and through a real browser.

One module, so every test shares one Airflow (`make airflow`'s, on PostgreSQL) on one test worker. The
scenario — the DAGs unpaused, the 5-minute ingest on its schedule, the hourly DAG's live run waiting for
the watermark, and a backfill of `traffic_hourly` across a midnight created while they work, from the
UI's form and through the REST API in turn, with max_active_runs 1, 2 and 4 in turn, ten times in a row —
is the ``backfills`` fixture in ``conftest.py``. First, what it must have produced: in the Delta tables
(read with Arrow, no Spark), in the runs' and tasks' states and in each close's record (its XCom). Then
the UI: headless Chromium from Debian (``/usr/bin/chromium``; `make test` installs it) driven by
Playwright (no browser is downloaded). Screenshots go to ``test-output/``; the grid of `traffic_hourly`
and the list of finished backfills are the README's images (``make screenshots`` refreshes ``docs/img/``).
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from tests.e2e.conftest import OUT, REPEATS, form_field, logged_in, pick_datetime, write_router_feed
from tests.support.screenshots import publish_for_docs
from traffic.storage import state as st
from traffic.storage.engine import writes_need_spark
from traffic.storage.warehouse import Warehouse

pytestmark = pytest.mark.slow


def _warehouse(airflow) -> Warehouse:
    return Warehouse(airflow.settings(), engine="rs")


def _hours(start, end):
    hour, out = start, []
    while hour < end:
        out.append(hour)
        hour += timedelta(hours=1)
    return out


def _at(moment) -> str:
    return f"{moment:%Y-%m-%dT%H:%M}"


def test_micro_batch_ingests_each_file_once_and_skips_spark_when_nothing_is_new(airflow, backfills):
    runs = backfills.ingest_runs
    assert all(r["state"] == "success" for r in runs), [(r["dag_run_id"], r["state"], r["tasks"]) for r in runs]
    ingested = [r for r in runs if r["tasks"]["ingest"] == "success"]
    skipped = [r for r in runs if r["tasks"]["ingest"] == "skipped"]
    # Each repeat's file in exactly one batch, whichever run (the schedule's or the user's) took it.
    assert len(ingested) == REPEATS and len(skipped) == len(runs) - REPEATS, [(r["dag_run_id"], r["tasks"]) for r in runs]
    assert any(r["run_type"] == "scheduled" for r in runs), "the 5-minute schedule never ran"

    warehouse = _warehouse(airflow)
    batches = sorted(st.rows(warehouse.table("batches").read_arrow()), key=lambda b: b["batch_id"])
    assert [(b["batch_id"], b["packets_on_time"], b["ticks"], b["packets_late"], b["records_rejected"])
            for b in batches] == [(n + 1, sum(p for _, p in r.expected.values()), 1, 0, 0)
                                  for n, r in enumerate(backfills.repeats)]
    assert st.read_clock_state(warehouse).watermark == backfills.repeats[-1].end


def test_every_backfill_created_while_the_live_runs_work_completes(backfills):
    """Issue 40: the user's scenario, from the UI's form and through the REST API, five times each."""
    hands = {}
    for repeat in backfills.repeats:
        runs = repeat.runs
        assert repeat.backfill["completed_at"] is not None, repeat.backfill
        assert [r["data_interval_start"][:16] for r in runs] == [_at(h) for h in _hours(repeat.start, repeat.end - timedelta(hours=1))], \
            (repeat.index, [r["dag_run_id"] for r in runs])
        for run in runs:
            assert run["state"] == "success", (repeat.index, run["dag_run_id"], run["tasks"])
            assert run["tasks"] == {"wait_for_watermark": "success", "close": "success",
                                    "publish_data_quality": "success"}, (repeat.index, run["dag_run_id"])
        hands[repeat.hand] = hands.get(repeat.hand, 0) + 1
    assert hands == {"ui": REPEATS // 2, "api": REPEATS - REPEATS // 2}


def test_each_day_rolled_up_once_by_one_run_whatever_max_active_runs(airflow, backfills):
    """Issue 41: with 1, 2 or 4 runs at once, one run froze the hours, one run rolled the day up and its
    record says so; the others' records say they found the work done; one roll-up commit for the day.
    Expiry starts Spark only where delta-spark writes (issue 35); on rs never."""
    delta_spark = writes_need_spark(airflow.settings())
    seen = set()
    for repeat in backfills.repeats:
        seen.add(repeat.max_active_runs)
        closes = {r["data_interval_end"][:16]: r["close"] for r in repeat.runs}
        froze = [end for end, c in closes.items() if c["froze"]]
        rolled = [end for end, c in closes.items() if c["rolled_up_day"]]
        where = (repeat.index, repeat.max_active_runs, closes)
        assert len(froze) == 1, where
        assert len(rolled) == 1, where
        # The docs' rule (docs/airflow.md, Backfill): the run that first holds the lock while the day is due
        # rolls it up — one at a time, in order, that is the midnight run; overlapping, maybe a later one,
        # and then the midnight run's record says it found the day already rolled up.
        midnight_run = closes[_at(repeat.midnight)]
        if repeat.max_active_runs == 1:
            assert rolled == [_at(repeat.midnight)], where
        assert midnight_run["day"]["outcome"] in ("rolled_up", "already_rolled_up"), where
        day = f"{repeat.midnight - timedelta(days=1):%Y-%m-%d}"
        for end, c in closes.items():
            assert (c["day"]["outcome"] == "rolled_up") == (end in rolled), where
            if end in rolled:
                assert c["day"]["days"] == [day], where
            assert (c["freeze"]["outcome"] == "froze") == (end in froze), where
        assert not any(c["rolled_up_month"] for c in closes.values()) or repeat.midnight.day == 1, where
        for c in closes.values():
            assert c["spark"] in ("warm server", None) and (c["spark"] == "warm server" or not (c["froze"] or c["rolled_up_day"])), where
            if delta_spark:  # delta-spark's deletes run in Spark: any hour expired was a Spark step's
                assert c["expire"]["expired_hours"] == 0 or c["expire"]["spark_started"] is True, where
            else:  # delta-rs expires in the worker, never with Spark
                assert c["expire"]["spark_started"] is False, where
        assert repeat.roll_up_commits == {"daily": 1, "periods": 1 + (repeat.midnight.day == 1)}, where
        if repeat.max_active_runs == 1:  # in order: the backfill's first run froze every closed hour
            assert froze == [repeat.runs[0]["data_interval_end"][:16]], where
    assert seen == {1, 2, 4}


def test_every_hour_and_day_reconciles_and_raw_detail_expires(airflow, backfills):
    warehouse = _warehouse(airflow)
    ledger = st.read_ledger(warehouse)
    frozen = {r["period_start"]: r for r in ledger if r["grain"] == "hour"}
    hourly = st.rows(warehouse.table("hourly").read_arrow(columns=["hour", "bytes", "status"]))
    assert {r["status"] for r in hourly} == {"final"}
    by_hour = {}
    for r in hourly:
        by_hour[r["hour"]] = by_hour.get(r["hour"], 0) + r["bytes"]
    expected_days = {}
    for repeat in backfills.repeats:
        for hour, (size, packets) in repeat.expected.items():
            assert (frozen[hour]["bytes"], frozen[hour]["packets"]) == (size, packets), hour
            assert frozen[hour]["dq_status"] in ("passed", "warning") and frozen[hour]["late_bytes"] == 0, hour
            assert by_hour[hour] == size, hour
            day = hour.replace(hour=0)
            expected_days[day] = expected_days.get(day, 0) + size
    # Every day up to the last midnight is rolled up exactly once, with every byte of its hours.
    last_day = backfills.repeats[-1].midnight
    days = [r for r in ledger if r["grain"] == "day"]
    assert sorted(r["period_start"] for r in days) == sorted(d for d in expected_days if d < last_day)
    for row in days:
        assert row["bytes"] == expected_days[row["period_start"]] and row["dq_status"] in ("passed", "warning"), row
    daily = st.rows(warehouse.table("daily").read_arrow(columns=["day", "bytes"]))
    daily_bytes = {}
    for r in daily:
        daily_bytes[r["day"]] = daily_bytes.get(r["day"], 0) + r["bytes"]
    assert daily_bytes == {d.date(): b for d, b in expected_days.items() if d < last_day}

    # Raw detail: keep_hours=1 behind hour_floor(W): only the last hour's packets are left, expired by each
    # run's `close` task in the worker, without a JVM.
    last = backfills.repeats[-1]
    packets = st.rows(warehouse.table("packets").read_arrow(columns=["hour", "bytes"]))
    assert {r["hour"] for r in packets} == {last.end - timedelta(hours=1)}
    assert sum(r["bytes"] for r in packets) == last.expected[last.end - timedelta(hours=1)][0]


def test_tables_are_equal_whatever_max_active_runs(airflow, backfills):
    """Issue 41: the repeats after the first are the same traffic a day apart (the same feed, one day on),
    so their hours, their day and their ledger rows, shifted back, are equal — with 1, 2 or 4 runs at once."""
    warehouse = _warehouse(airflow)
    hourly = st.rows(warehouse.table("hourly").read_arrow())
    daily = st.rows(warehouse.table("daily").read_arrow())
    ledger = st.read_ledger(warehouse)

    def seen_from(repeat):
        """The repeat's hours [day before's 01:00, its 02:00) and its day, as if it were the second repeat."""
        shift = repeat.midnight - backfills.repeats[1].midnight
        first, end = repeat.midnight - timedelta(hours=23), repeat.end
        hours = sorted((r["hour"] - shift, r["local_ip"], r["remote_ip"], r["bytes"], r["packets"], r["bytes_in"],
                        r["bytes_out"]) for r in hourly if first <= r["hour"] < end)
        day = (repeat.midnight - timedelta(days=1)).date()
        days = sorted((r["local_ip"], r["remote_ip"], r["bytes"], r["packets"], r["bytes_in"], r["bytes_out"])
                      for r in daily if r["day"] == day)
        periods = sorted((r["grain"], r["period_start"] - shift, r["bytes"], r["packets"], r["late_bytes"], r["dq_status"])
                         for r in ledger if first - timedelta(hours=1) <= r["period_start"] < end
                         and (r["grain"] == "hour" or (r["grain"] == "day" and r["period_start"] < repeat.midnight)))
        return hours, days, periods

    reference = seen_from(backfills.repeats[1])
    assert all(reference), reference
    by_runs = {}
    for repeat in backfills.repeats[1:]:
        assert seen_from(repeat) == reference, (repeat.index, repeat.max_active_runs)
        by_runs.setdefault(repeat.max_active_runs, []).append(repeat.index)
    assert sorted(by_runs) == [1, 2, 4], by_runs


def test_the_live_run_waiting_for_the_watermark_does_not_hold_the_backfills_back(backfills):
    """The scheduler's own run of the latest hour waits (its sensor, up to two hours) for a watermark days
    behind, and every backfill completes beside it all the same."""
    live = backfills.live_runs
    assert len(live) == 1, live
    run = live[0]
    assert run["state"] in ("queued", "running"), run
    assert run["tasks"]["wait_for_watermark"] in ("up_for_reschedule", "running", "scheduled", "queued"), run
    assert run["tasks"]["close"] is None, run
    latest = max(r["data_interval_end"] for repeat in backfills.repeats for r in repeat.runs)
    assert run["data_interval_start"] > latest  # an hour the watermark has not reached
    # It was waiting while the backfills' runs went through, not created after them.
    assert run["start_date"] < min(r["end_date"] for r in backfills.repeats[0].runs), run


def test_spark_steps_ran_as_clients_of_the_warm_server_make_airflow_started(airflow, backfills):
    """`make airflow` starts the warehouse's own Spark Connect server; the freeze, the day roll-up and the
    micro-batch ran as its clients (no spark-submit, no JVM of their own) and their logs say so."""
    repeat = backfills.repeats[0]
    ran = {step: next(r["dag_run_id"] for r in repeat.runs if r["close"][step]) for step in ("froze", "rolled_up_day")}
    logs = [airflow.home / "logs" / "dag_id=traffic_hourly" / f"run_id={run_id}" / "task_id=close" / "attempt=1.log"
            for run_id in ran.values()]
    logs += sorted((airflow.home / "logs" / "dag_id=traffic_ingest").glob("run_id=*/task_id=ingest/attempt=1.log"))
    assert len(set(ran.values())) == 2 and len(logs) >= 2 + REPEATS, ran
    for log in logs:
        text = log.read_text(errors="replace")
        assert "Spark: a client of the warm Spark Connect server sc://localhost:" in text, (log, text[-2000:])
        assert "(the warehouse's own)" in text and "Spark-Submit cmd" not in text, log
        assert "token=" not in text, f"{log} shows the server's token"


def test_rerunning_a_final_hour_rechecks_without_spark(airflow, backfills):
    """Clearing a finished run re-runs it: nothing is frozen or rolled up (already final) and no table changes."""
    api, warehouse = airflow.api, _warehouse(airflow)
    last = backfills.repeats[-1]
    run = next(r for r in last.runs if r["data_interval_start"].startswith(_at(last.midnight)))
    versions = {name: warehouse.table(name).version() for name in ("hourly", "periods", "daily", "packets")}
    api.post(f"/api/v2/dags/traffic_hourly/dagRuns/{run['dag_run_id']}/clear", {"dry_run": False})
    deadline = time.monotonic() + 30
    while api.run("traffic_hourly", run["dag_run_id"])["state"] == "success":  # until the clear is seen
        assert time.monotonic() < deadline, "the cleared run never left its success state"
        time.sleep(0.5)
    again = api.wait_run("traffic_hourly", run["dag_run_id"], timeout=180, home=airflow.home)
    tasks = api.task_states("traffic_hourly", run["dag_run_id"])
    assert again["state"] == "success", tasks
    assert tasks == {"wait_for_watermark": "success", "close": "success", "publish_data_quality": "success"}, tasks
    close = api.xcom("traffic_hourly", run["dag_run_id"], "close")
    assert (close["froze"], close["rolled_up_day"], close["rolled_up_month"], close["spark"]) == \
        (False, False, False, None), close  # the hour after midnight: no day change, and no day waiting
    assert {name: warehouse.table(name).version() for name in versions} == versions


# -- the Airflow UI in a real browser ------------------------------------------------------------

def test_ui_lists_the_dags_and_the_replay_form_starts_a_run(airflow, backfills, browser):
    with logged_in(browser, airflow) as page:
        page.goto(airflow.url + "/dags")
        for dag_id in ("traffic_ingest", "traffic_hourly", "traffic_replay"):
            page.get_by_text(dag_id, exact=True).first.wait_for()
        page.screenshot(path=str(OUT / "airflow-dags.png"))

        # A small archive after what was ingested: two hours with a tick at the end.
        start = backfills.repeats[-1].end + timedelta(hours=1)
        end = start + timedelta(hours=2)
        archive = airflow.base / "archive"
        expected = write_router_feed(archive / "edge" / "archived.csv", start, end, seed=11)

        page.goto(airflow.url + "/dags/traffic_replay")
        page.get_by_role("button", name="Trigger").click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_text("Run Parameters").wait_for()
        pick_datetime(page, dialog, "From (UTC)", start)
        pick_datetime(page, dialog, "To (UTC)", end + timedelta(minutes=1))  # the tick at `end` is inside the range
        form_field(dialog, "Input folder").locator("input").fill(str(archive))
        form_field(dialog, "Source").locator("input").fill("edge")
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
        assert run["conf"]["from"].startswith(_at(start)), run["conf"]
        assert run["conf"]["restate"] is False
        done = airflow.api.wait_run("traffic_replay", run["dag_run_id"], timeout=240, home=airflow.home)
        assert done["state"] == "success", airflow.api.task_states("traffic_replay", run["dag_run_id"])
        page.goto(f"{airflow.url}/dags/traffic_replay/runs/{run['dag_run_id']}")
        page.get_by_text("check_request").first.wait_for()
        page.screenshot(path=str(OUT / "airflow-replay-run.png"))

    # Replayed into an open range: counted normally, and closed in the same application.
    frozen = {r["period_start"]: r for r in st.read_ledger(_warehouse(airflow), "hour")}
    for hour, (size, packets) in expected.items():
        assert (frozen[hour]["bytes"], frozen[hour]["packets"]) == (size, packets), hour


def test_grid_and_backfills_after_the_backfills(airflow, backfills, browser):
    """The grid of traffic_hourly (each hour frozen, the day rolled up only at midnight) and its finished
    backfills, as the UI lists them: the README's images."""
    with logged_in(browser, airflow, width=960, height=520) as page:
        page.goto(airflow.url + "/dags/traffic_hourly")
        page.get_by_role("button", name="Collapse Details Panel").click()
        for run in backfills.repeats[-1].runs:  # a column per backfilled hour (its states are checked via the API)
            page.get_by_test_id(f"grid-{run['dag_run_id']}-publish_data_quality").wait_for()
        page.wait_for_timeout(1000)  # let the last cells paint
        page.screenshot(path=str(OUT / "airflow-grid.png"))
        publish_for_docs(OUT / "airflow-grid.png")
        assert (OUT / "airflow-grid.png").stat().st_size < 200_000

        page.set_viewport_size({"width": 1280, "height": 760})
        page.goto(airflow.url + "/dags/traffic_hourly/backfills")
        page.get_by_text(f"{backfills.repeats[-1].start:%Y-%m-%d %H:%M:%S}").first.wait_for()
        page.wait_for_timeout(500)
        page.screenshot(path=str(OUT / "airflow-backfills.png"))
        publish_for_docs(OUT / "airflow-backfills.png")
