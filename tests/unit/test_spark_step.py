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
