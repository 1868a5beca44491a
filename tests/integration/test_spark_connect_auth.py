"""The warm Spark Connect server answers only clients with its token, and the token stays the owner's.

`traffic spark start` on a tmp warehouse (127.0.0.1 only), then real clients in their own
processes: without a token and with a wrong one they are refused before any code runs; with the
token read from the record they run a query. The record and the log are 0600, the token is not on
the server's command line (every user can read that), and `auto` resolves to a URL with the token.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from traffic.runtime.connect import address, client_url, read_record, record_path, recorded_server, with_token
from traffic.core.settings import load_settings
from traffic.runtime.spark import resolve_master

CLIENT = """
import sys
from pyspark.sql import SparkSession
try:
    spark = SparkSession.builder.remote(sys.argv[1]).create()
    print("ran", spark.range(3).count())
except Exception as error:
    print("refused", type(error).__name__, str(error).replace("\\n", " ")[:400])
"""


def _traffic(*args, timeout=300):
    command = [str(Path(sys.executable).with_name("traffic")), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith("TRAFFIC_") and k != "SPARK_CONNECT_AUTHENTICATE_TOKEN"})


def _client(url: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_AUTHENTICATE_TOKEN"}
    done = subprocess.run([sys.executable, "-c", CLIENT, url], capture_output=True, text=True, timeout=180, env=env)
    return done.stdout.strip() or done.stderr.strip()[-400:]


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A warm server of a tmp warehouse, stopped (its whole process group) at the end."""
    base = tmp_path_factory.mktemp("warm-auth")
    where = ["--warehouse", str(base / "warehouse"), "--inbox", str(base / "inbox")]
    (base / "inbox").mkdir()
    started = _traffic("spark", "start", *where)
    try:
        assert started.returncode == 0, started.stderr
        record = recorded_server(base / "warehouse" / "_traffic")
        assert record, started.stdout + started.stderr
        yield base, record, started
    finally:
        stopped = _traffic("spark", "stop", *where)
        assert stopped.returncode == 0, stopped.stderr


def test_a_client_without_the_token_is_refused(warm):
    _, record, _ = warm
    port = record["port"]
    for url in (f"sc://127.0.0.1:{port}", address(port), with_token(address(port), "0" * 64)):
        outcome = _client(url)
        assert outcome.startswith("refused") and "UNAUTHENTICATED" in outcome.upper(), (url, outcome)


def test_a_client_with_the_recorded_token_runs(warm):
    _, record, _ = warm
    assert _client(client_url(record)) == "ran 3"


def test_auto_resolves_to_the_recorded_server_with_its_token(warm):
    base, record, started = warm
    settings = load_settings(environ={}, overrides={"warehouse": base / "warehouse"})
    assert resolve_master(settings) == client_url(record)
    assert record["token"] not in started.stdout + started.stderr, "the token was printed"
    assert record["url"] == address(record["port"]) and "token" not in record["url"]


def test_the_token_and_the_record_are_the_owners_alone(warm):
    base, record, _ = warm
    state = base / "warehouse" / "_traffic"
    for path in (record_path(state), Path(record["log"])):
        info = os.stat(path)
        assert info.st_mode & 0o777 == 0o600 and info.st_uid == os.geteuid(), f"{path}: {info.st_mode & 0o777:o}"
    assert read_record(record_path(state))["token"] == record["token"]
    deadline = time.monotonic() + 10
    command = b""
    while time.monotonic() < deadline and b"SparkConnectServer" not in command:  # spark-submit execs the JVM
        command = Path(f"/proc/{record['pid']}/cmdline").read_bytes()
        time.sleep(0.2)
    assert b"SparkConnectServer" in command and record["token"].encode() not in command
    assert record["token"] not in Path(record["log"]).read_text(errors="replace")


NETWORK_CLIENT = """
import sys
from traffic.core.settings import load_settings
from traffic.runtime.spark import build_spark
try:
    spark = build_spark(load_settings(environ={}, overrides={"spark_master": sys.argv[1]}), "auth-test")
    from pyspark.sql import functions as F  # the classic module: it must dispatch to Connect for this session
    print("ran", spark.range(3).where(F.lit(True)).count())
except Exception as error:
    print("refused", type(error).__name__, str(error).replace("\\n", " ")[:400])
"""


def _network_client(url: str, token: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_AUTHENTICATE_TOKEN" and not k.startswith("TRAFFIC_")}
    if token is not None:
        env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = token
    done = subprocess.run([sys.executable, "-c", NETWORK_CLIENT, url], capture_output=True, text=True, timeout=180,
                          env=env)
    return done.stdout.strip() or done.stderr.strip()[-400:]


def test_a_server_named_by_address_takes_the_token_as_a_plain_header_only_when_the_url_says_so(warm):
    """The compose stack's clients reach `spark-connect` by name over the stack's network: `use_ssl=false`
    sends the token from SPARK_CONNECT_AUTHENTICATE_TOKEN as a plain header, and only the right one runs.
    The session it builds is a Connect session to pyspark too: `pyspark.sql.functions` (the module the
    jobs import) send their columns to the server, not to a classic SparkContext the client has not got."""
    _, record, _ = warm
    url = f"sc://127.0.0.1:{record['port']}/;use_ssl=false"
    assert _network_client(url, record["token"]) == "ran 3"
    for token in ("0" * 64, None):
        outcome = _network_client(url, token)
        assert outcome.startswith("refused") and "UNAUTHENTICATED" in outcome.upper(), (token, outcome)
