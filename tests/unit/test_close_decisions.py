"""The hourly close decides each step under the warehouse lock, and its record says what its job did (issue 41).

Two runs of one backfill may overlap (the backfill's ``max_active_runs`` > 1). Each test drives the DAG's
own ``close_interval`` on a real small warehouse with the real lock; its Spark steps run ``traffic close
--only <step> --report <file>`` in this process with the shared session (``InProcessSteps``: the job a
warm server's client or spark-submit runs, without the JVM start). An overlap is made exact, not left to
timing: one run's job waits, after its run has decided, until the other run has finished.
"""

from __future__ import annotations

import shutil
import threading
from datetime import datetime, timedelta, timezone

import pytest

from tests.support.harness import Harness, feed_line, tick_line
from traffic.app.cli import main as traffic
from traffic.app.runs import close
from traffic.orchestration import dag_support
from traffic.orchestration.dag_support import CloseSteps, close_interval, decide_close
from traffic.storage import state as st

UTC = timezone.utc
FIRST = datetime(2026, 11, 20, 10, tzinfo=UTC)  # the first hour of data
MIDNIGHT = datetime(2026, 11, 21, tzinfo=UTC)  # the end of the day 2026-11-20: its midnight run ends here
WATERMARK = datetime(2026, 11, 21, 2, tzinfo=UTC)
DAY = "2026-11-20"
PATIENCE = 300  # seconds a run waits for the other (a Spark step here takes seconds)


def _quiet(*_args, **_kwargs):
    return None


@pytest.fixture(scope="module")
def ingested(spark, tmp_path_factory):
    """16 hours of traffic (10:00 … 02:00 the next day) ingested, nothing frozen: copied for each test."""
    root = tmp_path_factory.mktemp("ingested")
    harness = Harness(root, spark)
    minutes = int((WATERMARK - FIRST).total_seconds() // 60)
    harness.deliver("r1", "".join(feed_line(FIRST + timedelta(minutes=m), size=100 + m % 7) + "\n"
                                  for m in range(0, minutes, 20)) + tick_line(WATERMARK) + "\n")
    harness.ingest()
    assert harness.watermark == WATERMARK
    return root


@pytest.fixture
def warehouse(ingested, tmp_path, spark, monkeypatch):
    """A copy of the ingested warehouse, and the worker's environment naming it (the task reads its settings)."""
    shutil.copytree(ingested, tmp_path / "w")
    harness = Harness(tmp_path / "w", spark)
    for name, value in (("WAREHOUSE", harness.settings.warehouse), ("INBOX", harness.settings.inbox),
                        ("NOW", "2026-12-01T00:00:00+00:00"), ("SHUFFLE_PARTITIONS", "2")):
        monkeypatch.setenv(f"TRAFFIC_{name}", str(value))
    for name in ("TRAFFIC_CONFIG", "TRAFFIC_SPARK_CONNECT", "TRAFFIC_ENGINE"):
        monkeypatch.delenv(name, raising=False)
    return harness


class InProcessSteps(CloseSteps):
    """``CloseSteps`` whose job runs in this process (the report file, its reading and everything else as in
    the task); ``hold`` makes a step's job wait, once asked, until ``release`` is set."""

    def __init__(self, spark, hold: str | None = None):
        super().__init__(dag_support.settings_from_env())
        self.spark, self.hold = spark, hold
        self.asked, self.ran = threading.Event(), []
        self.release = threading.Event()

    def run(self, args: list[str], step: str) -> str:
        if step == self.hold:
            self.asked.set()
            assert self.release.wait(PATIENCE), "the other run did not finish"
        assert traffic(["close", *args], spark=self.spark) == 0, args
        self.ran.append(step)
        return "in-process"


def _overlapping(first: tuple, second: tuple, hold: str, spark) -> tuple[dict, dict, InProcessSteps]:
    """Run ``close_interval(*first)`` until its ``hold`` step has been decided due and asked of Spark, then the
    whole of ``close_interval(*second)``, then the first run's job: the second run overlaps the first."""
    steps = InProcessSteps(spark, hold=hold)
    outcome: dict = {}

    def first_run():
        try:
            outcome["summary"] = close_interval(*first, spark=steps)
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread below
            outcome["error"] = error
            steps.asked.set()

    thread = threading.Thread(target=first_run)
    thread.start()
    try:
        assert steps.asked.wait(PATIENCE), f"the first run never asked for its {hold} step"
        assert "error" not in outcome, outcome
        second = close_interval(*second, spark=InProcessSteps(spark))
    finally:
        steps.release.set()
        thread.join(PATIENCE)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["summary"], second, steps


def _roll_up_commits(harness: Harness, table: str) -> int:
    return sum(1 for commit in harness.warehouse().table(table).history() if commit.get("traffic.op") == "roll_up")


def _days(harness: Harness) -> list[datetime]:
    return [r["period_start"] for r in st.read_ledger(harness.warehouse(), "day")]


def test_of_two_overlapping_runs_the_one_whose_job_rolls_the_day_up_says_so_and_the_other_found_it_done(
        warehouse, spark):
    """The midnight run decides its day due and asks for its job; the next hour's run (catch-up) decides the
    same under the lock and rolls it up first. The midnight run's job then finds it rolled up and says so:
    one record of a roll-up, one roll-up commit in ``daily`` and in ``periods``."""
    close(warehouse.settings, lambda: spark, progress=_quiet, only=("freeze",))
    midnight, later, steps = _overlapping((MIDNIGHT, "backfill"), (MIDNIGHT + timedelta(hours=1), "backfill"),
                                          "days", spark)
    assert steps.ran == ["days"]  # the midnight run's job did run: it was due when its run decided
    # The grid's flags first (what the issue saw: both runs saying they rolled the day up), then the outcomes.
    assert (midnight["rolled_up_day"], later["rolled_up_day"]) == (False, True), (midnight, later)
    assert later["day"] == {"outcome": "rolled_up", "days": [DAY]}, later
    assert midnight["day"] == {"outcome": "already_rolled_up", "days": [DAY]}, midnight
    for summary in (midnight, later):
        assert summary["freeze"] == {"outcome": "not_due", "hours": 0} and not summary["froze"], summary
        assert summary["month"] == {"outcome": "not_due", "months": []} and not summary["rolled_up_month"]
    assert _days(warehouse) == [MIDNIGHT - timedelta(days=1)]
    daily = st.rows(warehouse.warehouse().table("daily").read_arrow(columns=["day"]))
    assert {r["day"].isoformat() for r in daily} == {DAY}
    assert (_roll_up_commits(warehouse, "daily"), _roll_up_commits(warehouse, "periods")) == (1, 1)


def test_of_two_overlapping_backfill_runs_only_the_one_whose_job_froze_says_it_froze(warehouse, spark):
    """Both of a backfill's first runs find hours to freeze under the lock; the second run's job freezes every
    hour the watermark has closed; the first run's job then finds them final and says so."""
    first, second, steps = _overlapping((FIRST + timedelta(hours=1), "backfill"),
                                        (FIRST + timedelta(hours=2), "backfill"), "freeze", spark)
    assert steps.ran == ["freeze"]
    assert (first["froze"], second["froze"]) == (False, True), (first, second)
    hours = int((WATERMARK - FIRST) / timedelta(hours=1))
    assert second["freeze"] == {
        "outcome": "froze", "hours": hours, "first": FIRST.isoformat(),
        "last": (WATERMARK - timedelta(hours=1)).isoformat()}, second
    assert first["freeze"] == {
        "outcome": "already_frozen", "hours": 1, "first": FIRST.isoformat(), "last": FIRST.isoformat()}, first
    assert len(st.read_ledger(warehouse.warehouse(), "hour")) == hours
    assert _days(warehouse) == []  # neither interval makes a day due


def test_a_midnight_run_after_the_catch_up_starts_no_spark_and_says_its_day_was_rolled_up(warehouse, spark):
    """The next hour's run caught the day up before the midnight run decided (a backfill run backwards, or
    the midnight run late): the midnight run decides under the lock that nothing is due, starts no Spark,
    and its record names its day as rolled up already, not by it."""
    close(warehouse.settings, lambda: spark, progress=_quiet, only=("freeze",))
    later = close_interval(MIDNIGHT + timedelta(hours=1), "backfill", spark=InProcessSteps(spark))
    assert later["rolled_up_day"] and later["day"]["outcome"] == "rolled_up"
    steps = InProcessSteps(spark)
    midnight = close_interval(MIDNIGHT, "backfill", spark=steps)
    assert (steps.ran, midnight["rolled_up_day"], midnight["spark"]) == ([], False, None), midnight
    assert midnight["day"] == {"outcome": "already_rolled_up", "days": [DAY]}, midnight
    assert (_roll_up_commits(warehouse, "daily"), _roll_up_commits(warehouse, "periods")) == (1, 1)


def test_runs_in_order_roll_the_day_up_at_its_midnight_run_only(warehouse, spark, caplog):
    """One run at a time (max_active_runs = 1): the backfill's first run freezes every closed hour, the
    midnight run rolls the day up, the runs around it have nothing due; the last log line says each."""
    records = {}
    for end in (MIDNIGHT - timedelta(hours=1), MIDNIGHT, MIDNIGHT + timedelta(hours=1)):
        steps = InProcessSteps(spark)
        caplog.clear()
        with caplog.at_level("INFO", logger=dag_support.__name__):
            records[end] = (close_interval(end, "backfill", spark=steps), steps.ran, caplog.records[-1].getMessage())
    (before, before_ran, _), (midnight, midnight_ran, said), (after, after_ran, _) = records.values()
    assert before_ran == ["freeze"] and before["froze"] and not before["rolled_up_day"]
    assert midnight_ran == ["days"] and midnight["rolled_up_day"] and not midnight["froze"]
    assert midnight["day"] == {"outcome": "rolled_up", "days": [DAY]}
    assert after_ran == [] and after["day"] == {"outcome": "not_due", "days": []} and after["spark"] is None
    assert said.startswith("close of the interval ending 2026-11-21 00:00:00: nothing to freeze; rolled up day "
                           f"{DAY}; no month due (Spark: in-process)"), said
    assert (_roll_up_commits(warehouse, "daily"), _roll_up_commits(warehouse, "periods")) == (1, 1)


def test_a_midnight_run_whose_day_has_a_failed_hour_starts_no_roll_up_and_says_the_day_waits(warehouse, spark):
    """Decided by the close's own rule under the lock (``days_due``): a day with an unpublished hour is not
    due, so no Spark job is submitted for it, and the record says the day waits."""
    close(warehouse.settings, lambda: spark, progress=_quiet, only=("freeze",))
    assert decide_close(warehouse.settings, MIDNIGHT).days == [datetime(2026, 11, 20).date()]
    ledger = warehouse.warehouse()
    hour = next(r for r in st.read_ledger(ledger, "hour") if r["period_start"] == FIRST + timedelta(hours=1))
    st.write_ledger_rows(ledger, [{**hour, "dq_status": "failed", "dq_note": "test: a failed check"}])
    assert decide_close(warehouse.settings, MIDNIGHT).days == []
    steps = InProcessSteps(spark)
    summary = close_interval(MIDNIGHT, "scheduled", spark=steps)
    assert (steps.ran, summary["rolled_up_day"]) == ([], False), summary
    assert summary["day"] == {"outcome": "waiting", "days": [DAY]}, summary
    assert _days(warehouse) == []


def test_two_overlapping_closes_under_the_lock_roll_a_day_up_once(warehouse, spark):
    """The roll-up itself is idempotent under the lock: two ``traffic close --only days`` started together
    (threads, the real lock) plan in turn, so the second finds the day rolled up and writes nothing."""
    close(warehouse.settings, lambda: spark, progress=_quiet, only=("freeze",))
    start = threading.Barrier(2)
    results, errors = [], []

    def one():
        try:
            start.wait(PATIENCE)
            results.append(close(warehouse.settings, lambda: spark, MIDNIGHT + timedelta(hours=1), _quiet,
                                 only=("days",)))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PATIENCE)
    assert not errors, errors
    assert sorted(len(r.days_rolled) for r in results) == [0, 1], results
    assert _days(warehouse) == [MIDNIGHT - timedelta(days=1)]
    assert (_roll_up_commits(warehouse, "daily"), _roll_up_commits(warehouse, "periods")) == (1, 1)
