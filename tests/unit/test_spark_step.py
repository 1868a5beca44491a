"""A DAG's Spark step: a client of the warm Spark Connect server while it answers, else spark-submit."""

from __future__ import annotations

import logging
import socket
from types import SimpleNamespace

import pytest

from traffic.core.settings import SettingsError, load_settings
from traffic.orchestration.dag_support import run_spark_step
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
    assert "Delta layer: the rs engine" in caplog.text


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


@pytest.fixture
def gates(monkeypatch):
    """close_interval's checks, expiry and alerts, answered by the test (each call recorded)."""
    from traffic.orchestration import dag_support

    answers = {"freeze_needed": True, "day_closes": False, "month_closes": False}
    calls = []
    for name in answers:
        monkeypatch.setattr(dag_support, name, lambda end, name=name: answers[name])
    monkeypatch.setattr(dag_support, "expire_raw_detail",
                        lambda end, spark: calls.append("expire") or {"expired_hours": 1, "spark_started": False})
    monkeypatch.setattr(dag_support, "notify_alerts", lambda: calls.append("alerts") or {"sent": 0})
    return SimpleNamespace(answers=answers, calls=calls)


def _steps(calls, fail_at=None):
    def spark(step, bound):
        calls.append((step, bound))
        if step == fail_at:
            raise RuntimeError(f"{step} failed")
        return "spark-submit"
    return spark


def test_a_backfill_run_freezes_every_closed_hour_and_a_scheduled_or_manual_run_up_to_its_interval_end(gates):
    """Issue 26: a backfill's runs share one freeze of the range (no ``--until``: all the watermark closed)."""
    from airflow.sdk.api.datamodels._generated import DagRunType  # what a task's dag_run.run_type is

    from traffic.orchestration.dag_support import close_interval

    for run_type, bound in ((DagRunType.BACKFILL, []), ("backfill", []), (DagRunType.SCHEDULED, ["--until", END]),
                            (DagRunType.MANUAL, ["--until", END])):
        calls = []
        summary = close_interval(END, run_type, spark=_steps(calls))
        assert calls == [("freeze", bound)], run_type
        assert summary["froze"] and not summary["rolled_up_day"] and not summary["rolled_up_month"]
        assert summary["spark"] == "spark-submit" and summary["expire"]["expired_hours"] == 1


def test_roll_ups_run_only_when_their_gates_say_so_and_keep_the_interval_end(gates):
    from traffic.orchestration.dag_support import close_interval

    gates.answers.update(freeze_needed=False, day_closes=True, month_closes=True)
    calls = []
    summary = close_interval(END, "backfill", spark=_steps(calls))
    assert calls == [("days", ["--until", END]), ("months", ["--until", END])]  # a day closes at its midnight only
    assert not summary["froze"] and summary["rolled_up_day"] and summary["rolled_up_month"]
    assert gates.calls == ["expire", "alerts"]


def test_a_final_hour_starts_no_spark_and_still_expires_and_sends_alerts(gates, caplog):
    from traffic.orchestration.dag_support import close_interval

    gates.answers["freeze_needed"] = False
    calls = []
    with caplog.at_level(logging.INFO):
        summary = close_interval(END, "scheduled", spark=_steps(calls))
    assert calls == [] and summary["spark"] is None and not summary["froze"]
    assert gates.calls == ["expire", "alerts"] and summary["alerts"] == {"sent": 0}
    assert "nothing to freeze or roll up, re-checked only (Spark: not started)" in caplog.text


def test_a_failing_step_fails_the_task_after_the_alerts_and_runs_no_later_step(gates):
    """Alerts come from published hours only, so they go out even when a later step fails (the old
    ``notify_alerts`` task's ``all_done``)."""
    from traffic.orchestration.dag_support import close_interval

    gates.answers["day_closes"] = True
    calls = []
    with pytest.raises(RuntimeError, match="days failed"):
        close_interval(END, "scheduled", spark=_steps(calls, fail_at="days"))
    assert [step for step, _ in calls] == ["freeze", "days"]
    assert gates.calls == ["alerts"]  # no expiry after a failed roll-up, the alerts all the same


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

    monkeypatch.setattr(spark_submit, "SparkSubmitHook", Hook)
    monkeypatch.delenv("TRAFFIC_SPARK_CONNECT", raising=False)
    monkeypatch.delenv("TRAFFIC_SPARK_JIT", raising=False)
    monkeypatch.setenv("TRAFFIC_WAREHOUSE", "/w")
    steps = CloseSteps(load_settings())
    with caplog.at_level(logging.INFO):
        assert steps("freeze", ["--until", END]) == "spark-submit"
        assert steps("days", ["--until", END]) == "spark-submit"
    assert caplog.text.count("Spark: spark-submit (no warm Spark Connect server") == 1  # decided once
    (application, first), (_, second) = submitted
    assert application.name == "close.py" and application.is_file()
    assert first["application_args"] == ["--until", END, "--only", "freeze"] and first["conn_id"] == "spark_default"
    assert second["application_args"] == ["--until", END, "--only", "days"]
    assert first["env_vars"]["TRAFFIC_WAREHOUSE"] == "/w" and first["env_vars"]["TZ"] == "UTC"
    assert QUICK_FLAGS in first["conf"]["spark.driver.extraJavaOptions"]


def test_close_steps_run_as_clients_of_an_answering_warm_server(listening, monkeypatch, caplog, tmp_path):
    from traffic.orchestration import dag_support

    job = tmp_path / "close.py"
    job.write_text(JOB)
    monkeypatch.setattr(dag_support, "CLOSE_JOB", job)
    url = f"sc://127.0.0.1:{listening}/;use_ssl=false"
    monkeypatch.setenv("TRAFFIC_SPARK_CONNECT", url)
    with caplog.at_level(logging.INFO):
        assert dag_support.CloseSteps(load_settings())("freeze", []) == "warm server"
    assert f"Spark: a client of the warm Spark Connect server {url} (no JVM start in this task): freeze" in caplog.text
    assert "args ['--only', 'freeze']" in caplog.text and f"master {url}" in caplog.text


def test_expiry_that_needs_spark_runs_as_a_step_of_the_same_close(monkeypatch, tmp_path, caplog):
    """With the ``spark`` engine (or an interrupted batch to finish) expiry is a Spark job like the close's other
    steps, through the same runner: a client of the warm server when one answers, never a JVM in the worker."""
    from traffic.orchestration import dag_support
    from traffic.storage import delta

    monkeypatch.setenv("TRAFFIC_WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.setattr(delta, "choose_engine", lambda settings: "spark")
    calls = []
    with caplog.at_level(logging.INFO):
        assert dag_support.expire_raw_detail(END, spark=_steps(calls))["spark_started"] is True
    assert calls == [("expire", ["--until", END])] and "expiry needs Spark here (spark engine)" in caplog.text
