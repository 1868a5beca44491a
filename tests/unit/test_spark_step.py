"""A DAG's Spark step: a client of the warm Spark Connect server while it answers, else spark-submit."""

from __future__ import annotations

import json
import logging
import socket
from datetime import date, datetime, timezone
from types import SimpleNamespace

import pytest

from traffic.core.settings import SettingsError, load_settings
from traffic.orchestration.spark_tasks import run_spark_step
from traffic.runtime.connect import plain_with_token

JOB = """
import os, sys
print("args", sys.argv[1:])
print("master", os.environ["TRAFFIC_SPARK_MASTER"])
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


@pytest.fixture
def job(tmp_path):
    path = tmp_path / "job.py"
    path.write_text(JOB)
    return SimpleNamespace(application=str(path), application_args=["--until", "2026-11-01T10:00:00+00:00"],
                           env_vars={"TRAFFIC_SPARK_MASTER": "spark://spark-master:7077"})


@pytest.fixture
def listening():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def _submitted(calls):
    def submit():
        calls.append("spark-submit")
        return "submitted"
    return submit


def test_without_a_configured_server_the_step_is_a_spark_submit(job, monkeypatch, caplog):
    monkeypatch.delenv("TRAFFIC_SPARK_CONNECT", raising=False)
    calls = []
    with caplog.at_level(logging.INFO):
        assert run_spark_step(job, _submitted(calls)) == "submitted"
    assert calls == ["spark-submit"]
    assert "Spark: spark-submit (no warm Spark Connect server is configured" in caplog.text


@pytest.mark.parametrize("engine, jars, said", [
    ("auto", ["delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar"],
     "spark (delta-spark, Delta's jars in {jars})"),
    ("auto", ["delta-storage-4.4.0.jar"], "rs (delta-rs: no Delta jars in {jars})"),
    ("rs", ["delta-spark_4.2_2.13-4.4.0.jar"], "rs (engine = rs)"),
    ("spark", [], "spark (engine = spark)"),
])
def test_the_task_log_says_which_delta_engine_writes_and_why(job, engine, jars, said, tmp_path, monkeypatch, caplog):
    """The engine the settings pick, not the machine's: delta-spark where the jars folder holds delta-spark."""
    folder = tmp_path / "jars"
    folder.mkdir()
    for name in jars:
        (folder / name).write_bytes(b"")
    monkeypatch.delenv("TRAFFIC_CONFIG", raising=False)
    monkeypatch.delenv("TRAFFIC_SPARK_CONNECT", raising=False)
    monkeypatch.setenv("TRAFFIC_ENGINE", engine)
    monkeypatch.setenv("TRAFFIC_SPARK_JARS_DIR", str(folder))
    with caplog.at_level(logging.INFO):
        run_spark_step(job, _submitted([]))
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("Delta layer: ")] \
        == ["Delta layer: " + said.format(jars=folder)]


def test_a_server_that_does_not_answer_falls_back_to_spark_submit(job, monkeypatch, caplog):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("TRAFFIC_SPARK_CONNECT", f"sc://127.0.0.1:{port}/;use_ssl=false")
    calls = []
    with caplog.at_level(logging.INFO):
        assert run_spark_step(job, _submitted(calls)) == "submitted"
    assert calls == ["spark-submit"] and "does not answer: spark-submit instead" in caplog.text


def test_an_answering_server_runs_the_job_as_its_client_with_no_spark_submit(job, listening, monkeypatch, caplog):
    url = f"sc://127.0.0.1:{listening}/;use_ssl=false"
    monkeypatch.setenv("TRAFFIC_SPARK_CONNECT", url)
    calls = []
    with caplog.at_level(logging.INFO):
        run_spark_step(job, _submitted(calls))
    assert calls == []
    assert f"Spark: a client of the warm Spark Connect server {url} (no JVM start in this task)" in caplog.text
    assert f"master {url}" in caplog.text  # the job's own output, in the task log, told where Spark is
    assert "args ['--until', '2026-11-01T10:00:00+00:00']" in caplog.text


def test_a_failing_job_fails_the_step_with_its_last_lines(job, listening, monkeypatch):
    monkeypatch.setenv("TRAFFIC_SPARK_CONNECT", f"sc://127.0.0.1:{listening}/;use_ssl=false")
    monkeypatch.setenv("EXIT_WITH", "3")
    job.application_args = None  # a job without arguments (ingest) runs too
    with pytest.raises(RuntimeError, match=r"job.py exited with 3 .*args \[\]"):
        run_spark_step(job, _submitted([]))


def test_the_setting_takes_a_connect_url_and_never_a_token():
    assert load_settings(environ={"TRAFFIC_SPARK_CONNECT": "sc://spark-connect:15002/;use_ssl=false"}).spark_connect
    assert load_settings(environ={}).spark_connect == ""
    with pytest.raises(SettingsError, match="is not a Spark Connect URL"):
        load_settings(environ={"TRAFFIC_SPARK_CONNECT": "spark://spark-master:7077"})
    assert load_settings(environ={"TRAFFIC_SPARK_CONNECT": "auto"}).spark_connect == "auto"
    with pytest.raises(SettingsError, match="SPARK_CONNECT_AUTHENTICATE_TOKEN, not in the URL"):
        load_settings(environ={"TRAFFIC_SPARK_CONNECT": "sc://spark-connect:15002/;token=abc"})


def test_a_plain_channel_carries_the_token_only_when_the_url_asks_for_it():
    env = {"SPARK_CONNECT_AUTHENTICATE_TOKEN": "t" * 64}
    assert plain_with_token("sc://spark-connect:15002/;use_ssl=false", env)
    assert not plain_with_token("sc://spark-connect:15002", env)  # pyspark's own TLS then
    assert not plain_with_token("sc://spark-connect:15002/;use_ssl=false", {})  # no token at all
    assert not plain_with_token("sc://localhost:15002/;use_ssl=false", env)  # pyspark's own local channel
    assert not plain_with_token("sc://localhost/;use_ssl=false", env)  # the default port, still localhost
    assert plain_with_token("sc://spark-connect/;use_ssl=false", env)
    assert plain_with_token("sc://10.1.2.3:15002/;use_ssl=false;token=" + "u" * 64, {})


def test_auto_without_the_warehouses_warm_server_is_a_spark_submit(job, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TRAFFIC_SPARK_CONNECT", "auto")
    monkeypatch.setenv("TRAFFIC_WAREHOUSE", str(tmp_path / "warehouse"))
    calls = []
    with caplog.at_level(logging.INFO):
        assert run_spark_step(job, _submitted(calls)) == "submitted"
    assert calls == ["spark-submit"] and "no warm Spark Connect server runs for" in caplog.text


# -- the hourly DAG's one `close` task ------------------------------------------------------------

END = "2026-11-20T03:00:00+00:00"


HOUR = datetime(2026, 11, 20, 2, tzinfo=timezone.utc)
DAY, MONTH = date(2026, 10, 31), datetime(2026, 10, 1, tzinfo=timezone.utc)


@pytest.fixture
def gates(monkeypatch):
    """close_interval's decisions (each ``decide_close`` takes the next of ``decisions``), expiry and alerts,
    answered by the test (each call recorded). The decisions under the real lock: test_close_decisions.py."""
    from traffic.orchestration import dag_support

    calls, decisions = [], []

    def decide(settings, end):
        calls.append(("decide", end.isoformat()))
        return decisions.pop(0)

    monkeypatch.setattr(dag_support, "decide_close", decide)
    monkeypatch.setattr(dag_support, "expire_raw_detail",
                        lambda end, spark: calls.append("expire") or {"expired_hours": 1, "spark_started": False})
    monkeypatch.setattr(dag_support, "notify_alerts", lambda: calls.append("alerts") or {"sent": 0})
    return SimpleNamespace(decisions=decisions, calls=calls)


def _facts(**done) -> dict:
    """A job's report (``traffic close --report``): nothing done unless said."""
    return {"hours_frozen": 0, "first_hour_frozen": None, "last_hour_frozen": None, "days_rolled": [],
            "months_rolled": [], "bills_stored": [], "expired_hours": 0, "watermark": END, "failed": [], **done}


def _steps(calls, fail_at=None, reports=None):
    from traffic.orchestration.dag_support import StepRun

    def spark(step, bound):
        calls.append((step, bound))
        if step == fail_at:
            raise RuntimeError(f"{step} failed")
        return StepRun("spark-submit", (reports or {}).get(step, _facts()))
    return spark


def test_a_backfill_run_freezes_every_closed_hour_and_a_scheduled_or_manual_run_up_to_its_interval_end(gates):
    """Issue 26: a backfill's runs share one freeze of the range (no ``--until``: all the watermark closed)."""
    from airflow.sdk.api.datamodels._generated import DagRunType  # what a task's dag_run.run_type is

    from traffic.orchestration.dag_support import CloseDecision, close_interval

    froze = {"freeze": _facts(hours_frozen=2, first_hour_frozen=HOUR.isoformat(), last_hour_frozen=END)}
    for run_type, bound in ((DagRunType.BACKFILL, []), ("backfill", []), (DagRunType.SCHEDULED, ["--until", END]),
                            (DagRunType.MANUAL, ["--until", END])):
        calls = []
        gates.decisions[:] = [CloseDecision(hours=[HOUR]), CloseDecision()]
        summary = close_interval(END, run_type, spark=_steps(calls, reports=froze))
        assert calls == [("freeze", bound)], run_type
        assert summary["froze"] and not summary["rolled_up_day"] and not summary["rolled_up_month"]
        assert summary["freeze"] == {"outcome": "froze", "hours": 2, "first": HOUR.isoformat(), "last": END}
        assert summary["spark"] == "spark-submit" and summary["expire"]["expired_hours"] == 1
        assert gates.decisions == []  # decided before the freeze, and again after its job


def test_roll_ups_run_only_when_decided_due_and_keep_the_interval_end(gates):
    from traffic.orchestration.dag_support import CloseDecision, close_interval

    gates.decisions[:] = [CloseDecision(days=[DAY], months=[MONTH]), CloseDecision(months=[MONTH]),
                          CloseDecision(rolled_months={MONTH})]
    calls = []
    reports = {"days": _facts(days_rolled=[DAY.isoformat()]), "months": _facts(months_rolled=["2026-10"])}
    summary = close_interval(END, "backfill", spark=_steps(calls, reports=reports))
    assert calls == [("days", ["--until", END]), ("months", ["--until", END])]  # a day closes by its end only
    assert not summary["froze"] and summary["rolled_up_day"] and summary["rolled_up_month"]
    assert (summary["day"], summary["month"]) == ({"outcome": "rolled_up", "days": ["2026-10-31"]},
                                                  {"outcome": "rolled_up", "months": ["2026-10"]})
    assert [c for c in gates.calls if c[0] != "decide"] == ["expire", "alerts"]


def test_a_step_found_due_whose_job_did_nothing_is_not_recorded_as_done(gates, caplog):
    """Issue 41: a day decided due under the lock, whose job found it rolled up (by another run, between the
    decision and the job), is recorded as found, not as rolled up by this run."""
    from traffic.orchestration.dag_support import CloseDecision, close_interval

    day_start = datetime(2026, 10, 31, tzinfo=timezone.utc)
    gates.decisions[:] = [CloseDecision(hours=[HOUR], days=[DAY]), CloseDecision(days=[DAY]),
                          CloseDecision(rolled_days={day_start})]
    calls = []
    with caplog.at_level(logging.INFO):
        summary = close_interval(END, "scheduled", spark=_steps(calls))
    assert [step for step, _ in calls] == ["freeze", "days"]
    assert (summary["froze"], summary["rolled_up_day"]) == (False, False), summary
    assert summary["freeze"] == {"outcome": "already_frozen", "hours": 1, "first": HOUR.isoformat(),
                                 "last": HOUR.isoformat()}
    assert summary["day"] == {"outcome": "already_rolled_up", "days": ["2026-10-31"]}
    assert caplog.records[-1].getMessage().startswith(
        "close of the interval ending 2026-11-20 03:00:00: found its 1 hour(s) to freeze frozen by another run "
        "meanwhile; found day 2026-10-31 already rolled up (by another run or an earlier try); no month due "
        "(Spark: spark-submit)")


def test_nothing_due_starts_no_spark_and_still_expires_and_sends_alerts(gates, caplog):
    from traffic.orchestration.dag_support import CloseDecision, close_interval

    gates.decisions[:] = [CloseDecision()]
    calls = []
    with caplog.at_level(logging.INFO):
        summary = close_interval(END, "scheduled", spark=_steps(calls))
    assert calls == [] and summary["spark"] is None and not summary["froze"]
    assert gates.calls == [("decide", END), "expire", "alerts"] and summary["alerts"] == {"sent": 0}
    assert (summary["freeze"]["outcome"], summary["day"]["outcome"], summary["month"]["outcome"]) == \
        ("not_due", "not_due", "not_due")
    assert "nothing to freeze; no day due; no month due (Spark: not started)" in caplog.text


def test_a_failing_step_fails_the_task_after_the_alerts_and_runs_no_later_step(gates):
    """Alerts come from published hours only, so they go out even when a later step fails (the old
    ``notify_alerts`` task's ``all_done``)."""
    from traffic.orchestration.dag_support import CloseDecision, close_interval

    gates.decisions[:] = [CloseDecision(hours=[HOUR], days=[DAY]), CloseDecision(days=[DAY])]
    calls = []
    with pytest.raises(RuntimeError, match="days failed"):
        close_interval(END, "scheduled", spark=_steps(calls, fail_at="days"))
    assert [step for step, _ in calls] == ["freeze", "days"]
    assert [c for c in gates.calls if c[0] != "decide"] == ["alerts"]  # no expiry after a failed roll-up


def test_a_table_missing_leaves_each_decision_to_its_job(gates):
    """An older warehouse without a newer table cannot be planned in the worker: each step's job creates it
    and decides; the record is still what the jobs reported."""
    from traffic.orchestration.dag_support import CloseDecision, close_interval

    gates.decisions[:] = [CloseDecision(planned=False), CloseDecision()]
    calls = []
    summary = close_interval(END, "scheduled", spark=_steps(calls))
    assert [step for step, _ in calls] == ["freeze"]  # its job created the tables: the next decisions are planned
    assert gates.decisions == []
    assert summary["freeze"]["outcome"] == "not_due" and not summary["froze"]


def test_close_steps_submit_close_py_with_the_quick_jvm_when_no_warm_server_answers(monkeypatch, caplog):
    """Without a warm server each step is one spark-submit of jobs/close.py, with the settings and the
    quick-starting JVM (hourly closes are small); the warm-server path is the one tested above."""
    from pathlib import Path

    from airflow.providers.apache.spark.hooks import spark_submit

    from traffic.orchestration.dag_support import CloseSteps
    from traffic.runtime.jvm import QUICK_FLAGS

    submitted = []

    class Hook:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

        def submit(self, application):
            submitted.append((Path(application), self.kwargs))
            args = self.kwargs["application_args"]  # the job writes its report where it is told
            Path(args[args.index("--report") + 1]).write_text(json.dumps(_facts(days_rolled=["2026-10-31"])))

    monkeypatch.setattr(spark_submit, "SparkSubmitHook", Hook)
    monkeypatch.delenv("TRAFFIC_SPARK_CONNECT", raising=False)
    monkeypatch.delenv("TRAFFIC_SPARK_JIT", raising=False)
    monkeypatch.setenv("TRAFFIC_WAREHOUSE", "/w")
    steps = CloseSteps(load_settings())
    with caplog.at_level(logging.INFO):
        assert steps("freeze", ["--until", END]) == ("spark-submit", _facts(days_rolled=["2026-10-31"]))
        assert steps("days", ["--until", END]).spark == "spark-submit"
    assert caplog.text.count("Spark: spark-submit (no warm Spark Connect server") == 1  # decided once
    (application, first), (_, second) = submitted
    assert application.name == "close.py" and application.is_file()
    assert first["application_args"][:4] == ["--until", END, "--only", "freeze"] and first["conn_id"] == "spark_default"
    assert second["application_args"][:4] == ["--until", END, "--only", "days"]
    report = Path(first["application_args"][5])
    assert first["application_args"][4] == "--report" and not report.exists()  # read, then its folder removed
    assert first["env_vars"]["TRAFFIC_WAREHOUSE"] == "/w" and first["env_vars"]["TZ"] == "UTC"
    assert QUICK_FLAGS in first["conf"]["spark.driver.extraJavaOptions"]


#: A close job that reports what it was told to report (``REPORT``), or nothing when that is empty.
REPORTING_JOB = JOB.replace("sys.exit(", """report = os.environ.get("REPORT")
if report:
    open(sys.argv[sys.argv.index("--report") + 1], "w").write(report)
sys.exit(""", 1)


def test_close_steps_run_as_clients_of_an_answering_warm_server(listening, monkeypatch, caplog, tmp_path):
    from traffic.orchestration import dag_support

    job = tmp_path / "close.py"
    job.write_text(REPORTING_JOB)
    monkeypatch.setattr(dag_support, "CLOSE_JOB", job)
    url = f"sc://127.0.0.1:{listening}/;use_ssl=false"
    monkeypatch.setenv("TRAFFIC_SPARK_CONNECT", url)
    monkeypatch.setenv("REPORT", json.dumps(_facts(hours_frozen=3)))
    with caplog.at_level(logging.INFO):
        assert dag_support.CloseSteps(load_settings())("freeze", []) == ("warm server", _facts(hours_frozen=3))
    assert f"Spark: a client of the warm Spark Connect server {url} (no JVM start in this task): freeze" in caplog.text
    assert "args ['--only', 'freeze', '--report', '" in caplog.text and f"master {url}" in caplog.text


def test_a_close_job_that_succeeds_without_its_report_fails_the_step(listening, monkeypatch, tmp_path):
    """What the run records comes from the job; without its report the task cannot say what it did."""
    from traffic.orchestration import dag_support

    job = tmp_path / "close.py"
    job.write_text(REPORTING_JOB)
    monkeypatch.setattr(dag_support, "CLOSE_JOB", job)
    monkeypatch.setenv("TRAFFIC_SPARK_CONNECT", f"sc://127.0.0.1:{listening}/;use_ssl=false")
    monkeypatch.delenv("REPORT", raising=False)
    with pytest.raises(RuntimeError, match=r"^jobs/close.py --only days finished but wrote no report to .*report.json "
                                           r"\(its driver must run on this worker"):
        dag_support.CloseSteps(load_settings())("days", ["--until", END])


def test_expiry_that_needs_spark_runs_as_a_step_of_the_same_close(monkeypatch, tmp_path, caplog):
    """With the ``spark`` engine (or an interrupted batch to finish) expiry is a Spark job like the close's other
    steps, through the same runner: a client of the warm server when one answers, never a JVM in the worker."""
    from traffic.orchestration import dag_support

    monkeypatch.delenv("TRAFFIC_CONFIG", raising=False)
    monkeypatch.setenv("TRAFFIC_WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.setenv("TRAFFIC_ENGINE", "spark")
    calls = []
    with caplog.at_level(logging.INFO):
        assert dag_support.expire_raw_detail(END, spark=_steps(calls, reports={"expire": _facts(expired_hours=4)})) \
            == {"expired_hours": 4, "spark_started": True, "watermark": END}  # what its job reported
    assert calls == [("expire", ["--until", END])]
    assert "expiry needs Spark here (the tables are written by delta-spark)" in caplog.text


def test_expiry_with_nothing_to_expire_starts_no_spark_on_either_engine(monkeypatch, tmp_path):
    """An hourly close whose hour expires nothing decides so without a JVM, also where delta-spark writes."""
    from traffic.core.settings import load_settings
    from traffic.orchestration import dag_support
    from traffic.storage.warehouse import Warehouse

    monkeypatch.delenv("TRAFFIC_CONFIG", raising=False)
    monkeypatch.setenv("TRAFFIC_WAREHOUSE", str(tmp_path / "warehouse"))
    Warehouse(load_settings(), engine="rs").create_all()  # tables, no raw detail
    for engine in ("rs", "spark"):
        monkeypatch.setenv("TRAFFIC_ENGINE", engine)
        calls = []
        done = dag_support.expire_raw_detail(END, spark=_steps(calls, reports={"expire": _facts(expired_hours=4)}))
        assert (done["expired_hours"], done["spark_started"], calls) == (0, False, []), engine
