"""An inbox on object storage (``inbox = "s3://…"``, issue 38) against a real S3 server (SeaweedFS on 127.0.0.1).

Ingest lists the prefix, plans and reads objects under the inbox's own rules: the worked example's stream delivered
as objects into an ``s3://`` warehouse gives the tables of the same stream delivered as files into a local one
(nothing shared but the store); names a sender is still writing are not taken; an object rewritten after planning
is retried and counted once; an object that grows counts its tail; a flow-export capture decodes as it does from a
file; a store that does not answer fails the command in one line."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import uuid
from pathlib import Path

import obstore
import pytest

from tests.integration.test_object_storage import _all_rows, _stream
from tests.model.reference import ModelSettings, ReferenceModel
from tests.reliability.test_hostile_inbox import _good, _rejects_by_file, _spark_factory_that
from tests.support.harness import Harness, model_tables, put_object
from traffic.core.location import ObjectLocation
from traffic.core.records import MAX_SOURCE_CHARS
from traffic.io import inbox as inbox_mod
from traffic.io.files import PieceChanged, read_piece
from traffic.storage import schemas

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"


@pytest.fixture
def aws(seaweed, monkeypatch):
    """The AWS variables that reach the test's SeaweedFS, for this process and the commands it runs."""
    seaweed.export(monkeypatch)
    return seaweed


def _prefix(seaweed, what: str) -> str:
    return seaweed.url(f"{what}-{uuid.uuid4().hex[:8]}")


def _statuses(harness: Harness) -> dict[str, str]:
    return {f["name"]: f["status"] for b in harness.table("batches") for f in b["files"]}


@pytest.fixture(scope="module")
def files_run(spark, tmp_path_factory):
    """The stream delivered as files into a local inbox and warehouse: the reference of the runs from the store."""
    local = Harness(tmp_path_factory.mktemp("filesrun"), spark, engine="rs")
    _stream(local, None)
    return local


def test_an_s3_inbox_gives_the_tables_of_a_local_one(aws, spark, files_run, tmp_path):
    """Inbox and warehouse on the store, nothing shared but the store. (The Delta engine takes no part in reading
    the inbox: Spark's parse tasks read it whichever engine commits; each engine on an s3:// warehouse is
    tests/integration/test_object_storage.py's.)"""
    harness = Harness(tmp_path, spark, inbox=_prefix(aws, "inbox"), warehouse=_prefix(aws, "warehouse"), engine="rs")
    model = ReferenceModel(ModelSettings())
    _stream(harness, model)
    assert harness.tables() == model_tables(model)
    got, expected = _all_rows(harness.warehouse()), _all_rows(files_run.warehouse())
    for name in schemas.TABLES:
        assert got[name] == expected[name], name
    assert not any((tmp_path / "inbox").iterdir())  # nothing came through a local folder
    assert set(_statuses(harness).values()) == {"accounted"}


def test_names_still_being_sent_are_not_taken_and_bad_folders_are_recorded(aws, spark, tmp_path):
    inbox = _prefix(aws, "inbox")
    for name in ("r1/.hidden.csv", "r1/feed.csv.part", "r1/feed.csv.tmp", "_staging/r1/feed.csv", "r1/_x/feed.csv"):
        put_object(f"{inbox}/{name}", _good(2).encode())
    put_object(f"{inbox}/r1/feed.csv", _good(3).encode())
    too_long = "s" * (MAX_SOURCE_CHARS + 1)
    put_object(f"{inbox}/{too_long}/feed.csv", _good(1).encode())
    found = inbox_mod.scan(inbox)
    assert [(f.name, f.status) for f in found] == [("r1/feed.csv", "accounted"), (f"{too_long}/feed.csv", "skipped")]
    assert found[0].path == f"{inbox}/r1/feed.csv" and found[0].size == len(_good(3))
    assert "longer than a source name may be" in found[1].note
    assert inbox_mod.scan(inbox, min_age_seconds=3600) == [found[1]]  # too young to take; a skip is recorded at once

    harness = Harness(tmp_path, spark, inbox=inbox, engine="rs")
    assert harness.ingest().bytes_on_time == 300
    assert _statuses(harness) == {f"{too_long}/feed.csv": "skipped", "r1/feed.csv": "accounted"}
    assert harness.ingest().nothing_to_do  # listed again, nothing read again


def test_a_key_the_client_cannot_read_is_recorded_by_name_and_hides_nothing(aws, spark, tmp_path):
    """Another client stored a key with a control character (which obstore refuses to list or read): that one
    object is skipped with a reason, and every other object of the inbox still counts."""
    inbox = _prefix(aws, "inbox")
    location = ObjectLocation.parse(inbox)
    with location.arrow_filesystem().open_output_stream(location.arrow_path("r1/bad\x7fname.csv")) as out:
        out.write(_good(2).encode())
    put_object(f"{inbox}/r1/feed.csv", _good(3).encode())
    harness = Harness(tmp_path, spark, inbox=inbox, engine="rs")
    assert harness.ingest().bytes_on_time == 300
    assert _statuses(harness) == {"r1/bad\x7fname.csv": "skipped", "r1/feed.csv": "accounted"}
    assert "control character" in _rejects_by_file(harness)["r1/bad\x7fname.csv"][0]


def test_an_object_rewritten_after_planning_is_retried_then_counted_once(aws, spark, tmp_path):
    from traffic.app.runs import ingest

    harness = Harness(tmp_path, spark, inbox=_prefix(aws, "inbox"), engine="rs")
    url = harness.deliver("r1", _good(3), name="feed.csv")
    harness.deliver("r1", _good(2, start_minute=10), name="other.csv")
    rewritten = _good(3, size=999) + _good(4, start_minute=20, size=5)

    result = ingest(harness.settings, _spark_factory_that(spark, lambda: put_object(url, rewritten.encode())), print)
    assert (result.packets_on_time, result.bytes_on_time) == (2, 200)  # only the untouched object
    assert _statuses(harness) == {"r1/feed.csv": "retry", "r1/other.csv": "accounted"}
    assert "changed after its batch was planned" in _rejects_by_file(harness)["r1/feed.csv"][0]
    assert (harness.ingest().bytes_on_time, harness.ingest().nothing_to_do) == (3 * 999 + 4 * 5, True)
    assert sum(r["bytes"] for r in harness.table("packets")) == 200 + 3 * 999 + 4 * 5


def test_a_grown_object_counts_its_tail_and_a_changed_one_is_rejected_whole(aws, spark, tmp_path):
    harness = Harness(tmp_path, spark, inbox=_prefix(aws, "inbox"), engine="rs")
    grown = harness.deliver("r1", _good(2), name="grown.csv")
    changed = harness.deliver("r1", _good(2, start_minute=5), name="changed.csv")
    assert harness.ingest().bytes_on_time == 400
    put_object(grown, (_good(2) + _good(3, start_minute=30, size=7)).encode())
    put_object(changed, _good(2, start_minute=5, size=50).encode())
    assert harness.ingest().bytes_on_time == 21
    statuses = [(f["name"], f["status"]) for b in harness.table("batches") for f in b["files"]]
    assert ("r1/grown.csv", "appended") in statuses and ("r1/changed.csv", "rejected") in statuses
    assert sum(r["bytes"] for r in harness.table("packets")) == 421


def test_a_piece_is_read_from_the_version_planned_or_not_at_all(aws):
    """The executor's read: the planned bytes, PieceChanged when the object was rewritten, and
    FileNotFoundError (a vanished file) when it was deleted."""
    url = f"{_prefix(aws, 'inbox')}/r1/feed.csv"
    data = _good(40).encode()
    put_object(url, data)
    digest = hashlib.sha256(data[100:900]).hexdigest()
    assert read_piece(url, 100, 900, digest) == data[100:900]
    put_object(url, data.replace(b"10.0.0.1", b"10.0.0.2"))
    with pytest.raises(PieceChanged):
        read_piece(url, 100, 900, digest)
    location = ObjectLocation.parse(url)
    obstore.delete(ObjectLocation.parse(f"s3://{location.bucket}").store(), location.prefix)
    with pytest.raises(FileNotFoundError):
        read_piece(url, 100, 900, digest)


def test_a_flow_export_capture_decodes_from_the_store_as_from_a_file(aws, spark, tmp_path):
    data = (SHARED / "flowcaps" / "graylog_nprobe-netflow9.pcap").read_bytes()
    local = Harness(tmp_path / "local", spark, engine="rs", max_history="36500d", max_future_skew="36500d")
    (local.root / "inbox" / "edge").mkdir(parents=True)
    (local.root / "inbox" / "edge" / "export.flows.pcap").write_bytes(data)
    on_store = Harness(tmp_path / "store", spark, engine="rs", inbox=_prefix(aws, "inbox"), max_history="36500d",
                       max_future_skew="36500d")
    put_object(f"{on_store.settings.inbox}/edge/export.flows.pcap", data)
    expected, got = local.ingest(), on_store.ingest()
    assert got.records_read == expected.records_read > 0
    assert (got.bytes_on_time, got.bytes_late) == (expected.bytes_on_time, expected.bytes_late)
    assert _all_rows(on_store.warehouse())["packets"] == _all_rows(local.warehouse())["packets"]


def test_a_store_that_does_not_answer_fails_ingest_in_one_line(tmp_path):
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k",
           "AWS_SECRET_ACCESS_KEY": "s", "GX_ANALYTICS_ENABLED": "false"}
    done = subprocess.run([sys.executable, "-m", "traffic.app.cli", "ingest", "--warehouse", str(tmp_path / "w"),
                           "--inbox", "s3://lake/inbox"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("traffic ingest: error: s3://lake/inbox (at http://127.0.0.1:9)")
    assert "AWS_SECRET" not in done.stderr and "=s" not in done.stderr


def test_collect_refuses_an_s3_inbox_and_says_how_to_upload(tmp_path):
    done = subprocess.run([sys.executable, "-m", "traffic.app.cli", "collect", "--inbox", "s3://lake/inbox",
                           "--listen", "127.0.0.1:2055"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "GX_ANALYTICS_ENABLED": "false"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--upload s3://lake/inbox" in done.stderr and len(done.stderr.strip().splitlines()) == 1
