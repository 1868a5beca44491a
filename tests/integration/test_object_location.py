"""``s3://`` locations against a real S3-compatible server (SeaweedFS on 127.0.0.1): parsing, credentials
kept out of every text, the clients each location hands out, and what the store guarantees that the
warehouse relies on (conditional puts, concurrent delta-rs commits)."""

from __future__ import annotations

import threading
import uuid

import obstore
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from obstore.exceptions import AlreadyExistsError, PreconditionError

from tests.support.seaweed import ACCESS_KEY, SECRET_KEY
from tests.support.sockets import socket_inodes, tcp_listening
from traffic.core.location import LocationError, ObjectLocation, StoreUnreachable, is_object_url


def _location(seaweed, name: str | None = None) -> ObjectLocation:
    return ObjectLocation.parse(seaweed.url(name or uuid.uuid4().hex), seaweed.environ())


def test_parse_names_bucket_prefix_and_endpoint_and_keeps_credentials_out_of_its_text():
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9/", "AWS_ACCESS_KEY_ID": "AKIDSECRET",
           "AWS_SECRET_ACCESS_KEY": "very-secret", "AWS_REGION": "eu-west-3"}
    location = ObjectLocation.parse("s3://lake/warehouse/main/", env)
    assert (location.bucket, location.prefix, location.endpoint, location.region) == \
        ("lake", "warehouse/main", "http://127.0.0.1:9", "eu-west-3")
    assert location.allow_http and location.url == "s3://lake/warehouse/main"
    assert location.child("_traffic", "lease.json").key() == "warehouse/main/_traffic/lease.json"
    for text in (str(location), repr(location), str(location.child("x")), repr(location.child("x"))):
        assert "AKIDSECRET" not in text and "very-secret" not in text
    assert location.delta_options()["AWS_SECRET_ACCESS_KEY"] == "very-secret"
    assert location.s3a_uri("hourly") == "s3a://lake/warehouse/main/hourly"
    conf = location.s3a_conf()
    assert conf["fs.s3a.path.style.access"] == "true" and conf["fs.s3a.endpoint"] == "http://127.0.0.1:9"
    assert conf["fs.s3a.secret.key"] == "very-secret" and conf["fs.s3a.endpoint.region"] == "eu-west-3"


@pytest.mark.parametrize("url, why", [
    ("/data/warehouse", "not an object-storage URL"),
    ("s3:///prefix", "names no bucket"),
    ("s3://key:secret@lake/x", "AWS_* variables"),
    ("s3://lake/a/../b", "'..'"),
])
def test_parse_refuses_what_it_cannot_use_in_one_line(url, why):
    with pytest.raises(LocationError, match=why.replace("*", r"\*").replace(".", r"\.")) as raised:
        ObjectLocation.parse(url, {})
    assert "\n" not in str(raised.value)
    assert not is_object_url(url) or url.startswith("s3://")


def test_seaweed_listens_on_loopback_only(seaweed):
    listening = tcp_listening()
    ours = [listening[inode] for inode in socket_inodes(seaweed.process.pid) if inode in listening]
    assert ours, "weed mini listens on nothing it owns"
    assert {address for address, _ in ours} == {"127.0.0.1"}, ours


def test_conditional_puts_are_honoured(seaweed):
    """What the lease stands on: create-if-absent and replace-if-unchanged (If-None-Match / If-Match)."""
    store = _location(seaweed).store()
    first = obstore.put(store, "x", b"1", mode="create")
    with pytest.raises(AlreadyExistsError):
        obstore.put(store, "x", b"2", mode="create")
    second = obstore.put(store, "x", b"3", mode={"e_tag": first["e_tag"]})
    with pytest.raises(PreconditionError):
        obstore.put(store, "x", b"4", mode={"e_tag": first["e_tag"]})
    assert bytes(obstore.get(store, "x").bytes()) == b"3" and second["e_tag"] != first["e_tag"]


def test_arrow_filesystem_writes_and_reads_parquet(seaweed):
    location = _location(seaweed)
    rows = pa.table({"a": [1, 2, 3]})
    pq.write_table(rows, location.arrow_path("t/part.parquet"), filesystem=location.arrow_filesystem())
    assert pq.read_table(location.arrow_path("t/part.parquet"), filesystem=location.arrow_filesystem()) == rows
    listed = [m["path"] for m in obstore.list(location.store()).collect()]
    assert listed == ["t/part.parquet"]


def test_concurrent_delta_rs_appends_on_the_store_both_land(seaweed):
    """delta-rs with ``conditional_put=etag`` commits safely from two writers at once: no commit is lost."""
    from deltalake import DeltaTable, write_deltalake

    location = _location(seaweed)
    uri, options = location.url, location.delta_options()
    write_deltalake(uri, pa.table({"n": pa.array([0], pa.int64())}), storage_options=options)
    errors = []

    def writer(n: int) -> None:
        try:
            for i in range(4):
                write_deltalake(uri, pa.table({"n": pa.array([n * 100 + i], pa.int64())}), mode="append",
                                storage_options=options)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(n,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    table = DeltaTable(uri, storage_options=options)
    assert sorted(table.to_pyarrow_table().column("n").to_pylist()) == [0, 100, 101, 102, 103, 200, 201, 202, 203]
    assert table.version() == 8


def test_wrong_credentials_fail_clearly(seaweed):
    env = seaweed.environ()
    env["AWS_SECRET_ACCESS_KEY"] = "not-" + SECRET_KEY
    store = ObjectLocation.parse(seaweed.url("denied"), env).store()
    with pytest.raises(Exception) as raised:
        obstore.put(store, "x", b"1")
    assert "not-" + SECRET_KEY not in str(raised.value) and ACCESS_KEY


# -- a command's first request: can it use the store at all? ---------------------------------------
@pytest.mark.parametrize("change, url, why", [
    ({}, "s3://nosuch/w", "bucket 'nosuch' does not exist there: create it, or fix the warehouse's URL"),
    ({"AWS_SECRET_ACCESS_KEY": "not-" + SECRET_KEY}, None, "it refused the secret key: check AWS_SECRET_ACCESS_KEY"),
    ({"AWS_ACCESS_KEY_ID": "nobody"}, None, "it does not know this access key: check AWS_ACCESS_KEY_ID"),
    ({"AWS_ENDPOINT_URL": "dead"}, None, "it does not answer: check AWS_ENDPOINT_URL and that the store is running"),
], ids=["no bucket", "wrong secret", "unknown key", "no answer"])
def test_a_store_a_command_cannot_use_is_said_in_one_line_at_once(seaweed, change, url, why):
    import time

    from tests.support.sockets import free_port

    env = {**seaweed.environ(), **change}
    if env["AWS_ENDPOINT_URL"] == "dead":
        env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{free_port()}"
    clock = time.monotonic()
    with pytest.raises(StoreUnreachable) as raised:
        ObjectLocation.parse(url or seaweed.url("w"), env).check_reachable()
    message = str(raised.value)
    assert why in message and "\n" not in message, message
    assert SECRET_KEY not in message and ACCESS_KEY not in message and "nobody" not in message, message
    assert time.monotonic() - clock < 20


def test_a_store_that_answers_passes_the_check(seaweed):
    ObjectLocation.parse(seaweed.url("fresh/prefix"), seaweed.environ()).check_reachable()  # an empty prefix too


def test_a_command_on_a_store_that_does_not_answer_exits_2_before_spark(monkeypatch, capsys, tmp_path):
    from tests.support.sockets import free_port
    from traffic.app.cli import main

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.chdir(tmp_path)
    code = main(["ingest", "--warehouse", "s3://lake/w", "--inbox", str(tmp_path / "inbox")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("traffic ingest: error: s3://lake/w (at http://127.0.0.1:") and \
        err.count("\n") == 1, err
    assert SECRET_KEY not in err


def test_what_a_refusal_means_without_a_server():
    aws = ObjectLocation.parse("s3://bucket/p", {})
    assert aws._why("HTTP error: error sending request") == \
        "AWS S3 (region us-east-1, no AWS_ENDPOINT_URL set) does not answer from here"
    assert aws._why("Server returned non-2xx status code: 301 Moved Permanently: ") == "it answered HTTP 301"
    assert aws._why("403 Forbidden: <Error><Code>AccessDenied</Code>") == \
        "these credentials may not use 'bucket': check the key's permissions"
    assert aws._why("<Error><Code>SlowDown</Code>") == "it answered SlowDown"
