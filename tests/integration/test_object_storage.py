"""A warehouse on object storage (``warehouse = "s3://…"``, issue 38) against a real S3 server (SeaweedFS on
127.0.0.1), with both Delta engines (delta-rs through its object store, delta-spark through Hadoop's S3A
connector): the worked example's stream gives the reference model's tables and the same rows, column for
column, as a warehouse on local disk written by the same engine; nothing is written to a local warehouse
folder; the run state (journal, lease, scratch) lives on the store; two jobs never hold the warehouse at once,
and a job killed mid-commit is finished by the next without losing or doubling a row."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone

import obstore
import pyarrow as pa
import pytest

from tests.integration.test_worked_example import NOW, STREAM
from tests.model.reference import ModelSettings, ReferenceModel
from tests.support.harness import Harness, feed_line, model_tables, tick_line
from traffic.core.location import ObjectLocation
from traffic.storage import schemas
from traffic.storage.journal import Journal, LockTimeout, warehouse_lock
from traffic.storage.lease import LEASE_KEY, LeaseLost
from traffic.storage.warehouse import Warehouse

UTC = timezone.utc
T0 = datetime(2026, 10, 31, 22, tzinfo=UTC)


#: The worked example's stream in three deliveries: record C arrives after the tick that closed its hour (late),
#: the bad record with it, record D after the month boundary. Three ingests and closes instead of eight keep the
#: module's two runs (the store's and the local reference) short; the worked example itself runs all eight.
DELIVERIES = [STREAM[0:3], STREAM[3:6], STREAM[6:8]]


def _stream(harness: Harness, model: ReferenceModel | None) -> None:
    for lines in DELIVERIES:
        text = "\n".join(lines) + "\n"
        harness.deliver("r1", text)
        if model is not None:
            model.ingest([("r1", text)], NOW)
        harness.ingest()
        harness.close()
        if model is not None:
            model.close()


def _all_rows(warehouse: Warehouse) -> dict[str, list[tuple]]:
    """Every table's rows, every column but the times a run stamps (sorted, comparable across runs)."""
    stamped = {"loaded_at", "closed_at", "last_seen_at", "rolled_at", "checked_at", "finished_at", "started_at",
               "published_at", "expired_at", "restated_at", "validated_at", "recorded_at", "computed_at"}
    out = {}
    for name in schemas.TABLES:
        table = warehouse.table(name).read_arrow()
        columns = [c for c in table.column_names if c not in stamped and not c.endswith("_at")]
        out[name] = sorted((tuple(_unstamped(row[c]) for c in columns) for row in table.select(columns).to_pylist()),
                           key=repr)
    return out


def _unstamped(value):
    """A batch's file list without the inbox files' own modification times (each run delivered its own files)."""
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return [{k: v for k, v in item.items() if k != "mtime_ns"} for item in value]
    return value


#: Who commits, as each engine signs its commits in the Delta log.
SIGNED = {"rs": "delta-rs", "spark": "Delta-Lake"}


def _signed_by(warehouse: Warehouse, table: str) -> set[str]:
    """The engines that made a table's commits, from the client or engine each commit names."""
    names = {str(entry.get("clientVersion") or entry.get("engineInfo") or "") for entry in warehouse.table(table).history()}
    return {engine for engine, sign in SIGNED.items() if any(sign in name for name in names)}


@pytest.fixture(scope="module")
def local_run(spark, tmp_path_factory):
    """The same stream into a warehouse on local disk, the reference of both engines' runs on the store. Written
    by delta-rs (seconds; delta-spark's tables on disk equal its row for row: tests/integration/test_engines.py)."""
    local = Harness(tmp_path_factory.mktemp("localrun"), spark, engine="rs")
    _stream(local, None)
    return local


@pytest.fixture(scope="module", params=["rs", "spark"])
def on_store(request, spark, seaweed, local_run, tmp_path_factory):
    """The worked example's stream, in three deliveries, into an s3:// warehouse written by one engine."""
    engine = request.param
    mp = pytest.MonkeyPatch()
    seaweed.export(mp)
    url = seaweed.url(f"warehouse-{engine}-{uuid.uuid4().hex[:8]}")
    root = tmp_path_factory.mktemp("s3run")
    harness, model = Harness(root, spark, warehouse=url, engine=engine), ReferenceModel(ModelSettings())
    _stream(harness, model)
    assert _signed_by(harness.warehouse(), "hourly") == {engine}
    yield harness, model, local_run, url
    mp.undo()


def test_an_s3_warehouse_equals_the_reference_model(on_store):
    harness, model, _, _ = on_store
    assert harness.tables() == model_tables(model)
    assert [row["bytes"] for row in harness.table("late_packets")] == [300]  # record C came after its hour closed


def test_an_s3_warehouse_equals_a_local_one_row_for_row(on_store):
    harness, _, local, _ = on_store
    got, expected = _all_rows(harness.warehouse()), _all_rows(local.warehouse())
    for name in schemas.TABLES:
        assert got[name] == expected[name], name
    assert sum(len(rows) for rows in got.values()) > 20


def test_everything_is_on_the_store_and_nothing_in_a_local_warehouse(on_store, seaweed):
    harness, _, _, url = on_store
    assert not (harness.root / "warehouse").exists()
    location = ObjectLocation.parse(url)
    keys = [meta["path"] for meta in obstore.list(location.store()).collect()]
    assert {key.split("/")[0] for key in keys} >= {"hourly", "packets", "daily", "monthly", "clocks", "_traffic"}
    assert any(key.startswith("hourly/_delta_log/") for key in keys)
    assert LEASE_KEY in keys  # the run held the lease, and released it: expired, token counted up
    assert not [k for k in keys if k.startswith("_traffic/scratch/") and not k.endswith("/")], \
        "a finished job leaves no scratch files"
    assert not [k for k in keys if k.startswith("_traffic/pending-batch")]


def test_delta_rs_and_arrow_read_the_store_directly(on_store):
    """What docs/query.md shows: any Delta reader with the same AWS variables reads the tables."""
    from deltalake import DeltaTable

    harness, _, _, url = on_store
    location = ObjectLocation.parse(url)
    hourly = DeltaTable(f"{location.url}/hourly", storage_options=location.delta_options()).to_pyarrow_table()
    assert pa.compute.sum(hourly.column("bytes")).as_py() == \
        sum(row["bytes"] for row in harness.table("hourly"))


def test_a_second_job_waits_for_the_lease_then_fails_naming_the_holder(on_store):
    harness, _, _, _ = on_store
    state = harness.warehouse().state_dir()
    with warehouse_lock(state, 5, "traffic close (test)"):
        with pytest.raises(LockTimeout, match=r"busy: traffic close \(test\) \(host .*\) holds the warehouse's lease"):
            with warehouse_lock(state, 1, "traffic ingest (test)"):
                pass
    with warehouse_lock(state, 1, "traffic ingest (test)"):
        pass


def test_a_commit_after_the_lease_was_taken_over_is_refused_and_changes_nothing(on_store):
    """A job that paused past its lease (taken over meanwhile) must not commit: each engine reads the lease just
    before each commit and refuses, and the table keeps its version."""
    harness, _, _, url = on_store
    warehouse, store = harness.warehouse(), ObjectLocation.parse(url).store()
    table = warehouse.table("hourly")
    version, key = table.version(), table.keys()[0]
    with warehouse_lock(warehouse.state_dir(), 5, "traffic close (paused)"):
        token = _lease(ObjectLocation.parse(url))["token"]
        taken = {"holder": "traffic close (another host)", "token": token + 1, "expires": time.time() + 60}
        obstore.put(store, LEASE_KEY, json.dumps(taken).encode())
        try:
            with pytest.raises(LeaseLost, match=f"taken over by token {token + 1}"):
                table.delete_keys([key], op="delete")
        finally:  # the other holder "finishes": its lease expired, the token kept
            obstore.put(store, LEASE_KEY, json.dumps({**taken, "holder": "", "expires": 0.0}).encode())
    assert harness.warehouse().table("hourly").version() == version


def test_watermark_and_close_state_survive_reopening(on_store):
    harness, _, _, _ = on_store
    assert harness.watermark == datetime(2026, 11, 1, 3, 0, tzinfo=UTC)


def _cli(command: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "traffic.app.cli", *command], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _lease(location: ObjectLocation) -> dict | None:
    try:
        return json.loads(bytes(obstore.get(location.store(), LEASE_KEY).bytes()))
    except FileNotFoundError:
        return None


@pytest.mark.parametrize("engine", ["rs", "spark"])
def test_two_writers_one_killed_mid_commit_lose_nothing_and_count_nothing_twice(engine, spark, seaweed, tmp_path,
                                                                                monkeypatch):
    """Two ``traffic ingest`` processes on one s3:// warehouse: the first holds the lease and is killed between
    two tables' commits of its batch; the second waits, takes the expired lease over (a larger token), finds
    the batch's journal and finishes it. Closed, the tables equal a local warehouse's that was never killed."""
    seaweed.export(monkeypatch)
    url = seaweed.url(f"race-{uuid.uuid4().hex[:8]}")
    location = ObjectLocation.parse(url)
    text = "\n".join([*(feed_line(T0 + timedelta(minutes=m), "10.0.0.1", "192.0.2.1", size=100 + m)
                        for m in range(0, 120, 7)), "new,OP_INSERT,bad,1,2,3,4,5",
                      tick_line(T0 + timedelta(hours=2, minutes=5))]) + "\n"
    stored = Harness(tmp_path / "s3", spark, warehouse=url, engine=engine)
    stored.deliver("r1", text, name="d0.csv")
    common = ["--warehouse", url, "--inbox", str(tmp_path / "s3" / "inbox"), "--set", "shuffle_partitions=2",
              "--set", f"now={stored.settings.now.isoformat()}", "--set", "lease_ttl=4s", "--set", f"engine={engine}"]
    env = {**seaweed.environ(), "TZ": "UTC"}
    first = _cli(["ingest", *common, "--set", "fault_at=hourly.ingest.committed#1"], env)
    deadline = time.monotonic() + 120
    while (_lease(location) or {}).get("holder", "").startswith("traffic ingest") is False:
        assert first.poll() is None and time.monotonic() < deadline, first.stdout.read() if first.poll() is not None else "no lease"
        time.sleep(0.2)
    first_token = _lease(location)["token"]
    second = _cli(["ingest", *common], env)
    assert first.wait(180) == -signal.SIGKILL, first.stdout.read()[-2000:]
    output = second.communicate(timeout=300)[0]
    assert second.returncode == 0, output[-3000:]
    lease = _lease(location)
    assert lease["token"] > first_token and lease["expires"] == 0.0  # taken over, then released
    assert Journal(stored.warehouse().state_dir()).load() is None
    stored.close()

    reference = Harness(tmp_path / "local", spark, engine="rs")  # the reference: see local_run
    reference.deliver("r1", text, name="d0.csv")
    reference.ingest()
    reference.close()
    got, expected = _all_rows(stored.warehouse()), _all_rows(reference.warehouse())
    for name in schemas.TABLES:
        if name != "dq_results":  # an audit log of evaluations: the finishing run evaluated again
            assert got[name] == expected[name], name
    assert sum(r["bytes"] for r in stored.table("hourly")) == sum(100 + m for m in range(0, 120, 7))
    assert _signed_by(stored.warehouse(), "hourly") == {engine}


def test_the_seed_examples_deliveries_on_s3_equal_a_local_run_row_for_row(spark, seaweed, tmp_path, monkeypatch):
    """The demo's deliveries (three sources over six hours across a month's end, then late records, bad lines and a
    re-delivered file) into an s3:// warehouse written by delta-rs equal, table by table and row by row, a local
    warehouse's fed the same files (delta-spark on the store does the same in the compose stack's test)."""
    from traffic.app.demo.deliveries import add_trouble, generate

    seaweed.export(monkeypatch)
    stored = Harness(tmp_path / "s3", spark, warehouse=seaweed.url(f"seed-{uuid.uuid4().hex[:8]}"), engine="rs",
                     local_networks="192.0.2.0/24")
    local = Harness(tmp_path / "local", spark, engine="rs", local_networks="192.0.2.0/24")
    for harness in (stored, local):
        generate(harness.root / "inbox", T0, T0 + timedelta(hours=6))
        harness.ingest()
        harness.close()
        add_trouble(harness.root / "inbox", T0 + timedelta(hours=1))
        harness.ingest()
        harness.close()
    got, expected = _all_rows(stored.warehouse()), _all_rows(local.warehouse())
    for name in schemas.TABLES:
        assert got[name] == expected[name], name
    assert got["late_packets"] and got["rejects"] and got["monthly"] and len(got["packets"]) > 1000
    assert not (stored.root / "warehouse").exists()


def test_the_query_pages_s3_recipes_read_the_store(on_store):
    """``docs/query.md``'s ``python s3`` blocks, run as written against this warehouse on SeaweedFS."""
    from tests.integration.test_query_recipes import DOC, run_blocks

    harness, _, _, url = on_store
    answers = run_blocks(DOC.read_text(), url, {}, kind="s3")
    expected = sum(row["bytes"] for row in harness.table("hourly") if row["status"] == "final")
    assert expected > 0
    assert answers["s3_final_bytes_duckdb"] == expected
    assert answers["s3_final_bytes_polars"] == expected
