"""Which JVM a job starts: quick (C1, serial GC) for small work, the full JIT once a job says it is big."""

from __future__ import annotations

import pytest

from traffic.runtime import jvm
from traffic.accounting.ingest import announce_work
from traffic.core.settings import SettingsError, load_settings


@pytest.fixture(autouse=True)
def no_big_job(monkeypatch):
    monkeypatch.setattr(jvm, "_big_job", None)


def _plan(*files):
    return {"files": [{"status": status, "size": size, "start": start} for status, size, start in files]}


def test_auto_is_quick_until_a_job_says_it_is_big():
    assert jvm.quick("auto") and jvm.quick("quick") and not jvm.quick("full")
    jvm.expect_big_job("a batch of 40 MiB")
    assert not jvm.quick("auto") and jvm.quick("quick") and jvm.big_job() == "a batch of 40 MiB"


def test_a_batch_is_big_by_the_bytes_it_still_has_to_read():
    mib = 2**20
    announce_work(_plan(("accounted", 20 * mib, 0), ("duplicate", 100 * mib, 0), ("appended", 40 * mib, 30 * mib)))
    assert jvm.big_job() is None  # 20 + 10 MiB to read: duplicates and counted prefixes are not read
    announce_work(_plan(("accounted", 20 * mib, 0), ("replayed", 13 * mib, 0)))
    assert jvm.big_job() == "a batch of 33 MiB"


def test_driver_options_carry_log4j_and_the_quick_flags_only_when_quick():
    assert jvm.driver_java_options(False) == f"-Dlog4j.configurationFile=file:{jvm.LOG4J}"
    assert jvm.driver_java_options(True).endswith(" -XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


def test_spark_jit_setting_is_checked():
    assert load_settings(environ={}).spark_jit == "auto"
    assert load_settings(environ={"TRAFFIC_SPARK_JIT": "Full"}).spark_jit == "full"
    with pytest.raises(SettingsError, match="spark_jit: 'fast' is not one of auto, quick, full"):
        load_settings(environ={"TRAFFIC_SPARK_JIT": "fast"})


def test_the_cli_says_which_jvm_it_starts_and_why(monkeypatch, capsys):
    import traffic.runtime.spark
    from traffic.app.spark_holder import SparkHolder

    monkeypatch.setattr(traffic.runtime.spark, "build_spark", lambda settings, name: object())
    settings = load_settings(environ={}, overrides={"spark_master": "local[2]"})
    SparkHolder(settings, "traffic-test")()
    assert "starting Spark (quick-start JVM) …" in capsys.readouterr().err
    jvm.expect_big_job("a batch of 40 MiB")
    SparkHolder(settings, "traffic-test")()
    assert "starting Spark (full JIT: a batch of 40 MiB) …" in capsys.readouterr().err
    SparkHolder(settings.replace(spark_jit="quick"), "traffic-test")()
    assert "starting Spark (quick-start JVM) …" in capsys.readouterr().err
