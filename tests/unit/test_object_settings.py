"""Settings and choices for a warehouse on object storage (issue 38), without a store: what is accepted, what is
refused in one line, which engine writes it and why, and the ``Place`` API both kinds of warehouse share."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from traffic.core.settings import SettingsError, load_settings
from traffic.storage.engine import choose_engine, engine_reason
from traffic.storage.place import Place
from traffic.storage.table import StorageError
from traffic.storage.warehouse import Warehouse

SECRET = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "not-to-be-printed",
          "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}


def test_a_warehouse_url_is_kept_as_a_url_and_a_folder_is_made_absolute(tmp_path):
    assert load_settings(environ={"TRAFFIC_WAREHOUSE": "s3://lake/traffic/"}).warehouse == "s3://lake/traffic"
    assert load_settings(environ={"TRAFFIC_WAREHOUSE": "s3a://lake"}).warehouse == "s3://lake"
    assert load_settings(environ={"TRAFFIC_WAREHOUSE": "rel/w"}).warehouse == Path("rel/w").absolute()


@pytest.mark.parametrize("value, why", [("s3:///x", "names no bucket"), ("gs://lake/x", "not an object-storage URL"),
                                        ("s3://AKID:secret@lake/x", "AWS_")])
def test_a_bad_warehouse_url_is_one_line_naming_the_setting(value, why):
    with pytest.raises(SettingsError) as raised:
        load_settings(environ={"TRAFFIC_WAREHOUSE": value})
    message = str(raised.value)
    assert message.startswith("warehouse: ") and why in message and "\n" not in message and "secret@" not in message


def test_an_inbox_url_is_kept_as_a_url_and_replay_then_needs_folders_named(tmp_path):
    from traffic.orchestration.replay_form import replay_input

    settings = load_settings(environ={"TRAFFIC_INBOX": "s3://lake/inbox/"})
    assert settings.inbox == "s3://lake/inbox" and settings.replay_folders() == ()
    with pytest.raises(SettingsError) as raised:
        replay_input(settings, str(tmp_path))
    assert "replay_roots" in str(raised.value) and "\n" not in str(raised.value)
    named = settings.replace(replay_roots=str(tmp_path))
    assert named.replay_folders() == (tmp_path,) and replay_input(named, str(tmp_path)) == tmp_path
    with pytest.raises(SettingsError, match="^inbox: .*names no bucket"):
        load_settings(environ={"TRAFFIC_INBOX": "s3:///x"})


def test_lease_ttl_has_a_floor():
    assert load_settings(environ={"TRAFFIC_LEASE_TTL": "45s"}).lease_ttl.total_seconds() == 45
    with pytest.raises(SettingsError, match="lease_ttl: 1 s is too short"):
        load_settings(environ={"TRAFFIC_LEASE_TTL": "1"})


def test_auto_writes_a_warehouse_on_object_storage_with_spark_only_beside_the_s3a_connector(tmp_path):
    jars = tmp_path / "jars"
    jars.mkdir()
    for name in ("delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar"):
        (jars / name).write_bytes(b"")
    local = load_settings(environ={"TRAFFIC_ENGINE": "auto", "TRAFFIC_SPARK_JARS_DIR": str(jars)})
    stored = local.replace(warehouse="s3://lake/traffic")
    assert choose_engine(local) == "spark"
    assert choose_engine(stored) == "rs"  # Delta's jars without hadoop-aws: delta-spark cannot reach the store
    assert "no S3A connector (hadoop-aws)" in engine_reason(stored)
    (jars / "hadoop-aws-3.5.0.jar").write_bytes(b"")
    assert choose_engine(stored) == "spark" and engine_reason(stored).startswith("spark (delta-spark")


def test_the_spark_engine_without_the_s3a_connector_refuses_an_s3_warehouse_in_one_line(monkeypatch, tmp_path):
    for name, value in SECRET.items():
        monkeypatch.setenv(name, value)
    settings = load_settings(environ={"TRAFFIC_ENGINE": "spark", "TRAFFIC_WAREHOUSE": "s3://lake/traffic",
                                      "TRAFFIC_SPARK_JARS_DIR": str(tmp_path)})
    with pytest.raises(StorageError, match=r"through Hadoop's S3A connector, whose jars are not in .*make setup.*"
                                           r"set engine = rs") as raised:
        Warehouse(settings).table("hourly")
    assert "not-to-be-printed" not in str(raised.value) and "AKIDEXAMPLE" not in str(raised.value)
    assert "\n" not in str(raised.value)


def test_places_join_name_and_travel_to_tasks_with_their_store(monkeypatch, tmp_path):
    for name, value in SECRET.items():
        monkeypatch.setenv(name, value)
    root = Place.of("s3://lake/traffic")
    part = root / "hourly" / "k=2026-11-01T10" / "part-00000.parquet"
    assert part.uri == "s3://lake/traffic/hourly/k=2026-11-01T10/part-00000.parquet"
    assert part.fs_path == "lake/traffic/hourly/k=2026-11-01T10/part-00000.parquet"
    assert (part.name, part.suffix, part.parent.name) == ("part-00000.parquet", ".parquet", "k=2026-11-01T10")
    assert part.relative_to(root / "hourly") == "k=2026-11-01T10/part-00000.parquet"
    assert part.spark_uri == "s3a://lake/traffic/hourly/k=2026-11-01T10/part-00000.parquet"
    assert Place.of(tmp_path).spark_uri == str(tmp_path)
    assert root.resolve(part.uri) == part
    assert root.delta_options()["AWS_SECRET_ACCESS_KEY"] == "not-to-be-printed"
    assert "not-to-be-printed" not in repr(part) + str(part)
    travelled = pickle.loads(pickle.dumps(part))  # a task's closure: the place and how to reach its store
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    assert travelled == part and travelled.delta_options()["AWS_SECRET_ACCESS_KEY"] == "not-to-be-printed"
    with pytest.raises(TypeError, match="object storage"):
        open(part)
    local = Place.of(tmp_path) / "a" / "b.json"
    local.parent.mkdir()
    local.write_atomic('{"x": 1}')
    assert local.read_text() == '{"x": 1}' and [e.place.name for e in Place.of(tmp_path).files()] == ["b.json"]
    local.unlink()
    local.unlink()  # quiet when gone
    with pytest.raises(FileNotFoundError):
        local.read_text()
