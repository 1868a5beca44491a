"""Which JVM a job starts: quick (C1, serial GC) for small work, the full JIT once a job says it is big."""

from __future__ import annotations

import pytest

from traffic.runtime import jvm
from traffic.accounting.ingest import big_batch
from traffic.core.settings import SettingsError, load_settings


def _plan(*files):
    return {"files": [{"status": status, "size": size, "start": start} for status, size, start in files]}


def test_auto_is_quick_unless_the_work_is_big():
    assert jvm.quick_for("auto", False) and jvm.quick_for("quick", False) and not jvm.quick_for("full", False)
    assert not jvm.quick_for("auto", True) and jvm.quick_for("quick", True) and not jvm.quick_for("full", True)


def test_a_batch_is_big_by_the_bytes_it_still_has_to_read():
    mib = 2**20
    # 20 + 10 MiB to read: duplicates and counted prefixes are not read
    assert big_batch(_plan(("accounted", 20 * mib, 0), ("duplicate", 100 * mib, 0), ("appended", 40 * mib, 30 * mib))) \
        is None
    assert big_batch(_plan(("accounted", 20 * mib, 0), ("replayed", 13 * mib, 0))) == "a batch of 33 MiB"


def test_driver_options_carry_log4j_and_the_quick_flags_only_when_quick():
    assert jvm.driver_java_options(False) == f"-Dlog4j.configurationFile=file:{jvm.LOG4J}"
    assert jvm.driver_java_options(True).endswith(" -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
                                                  " -XX:ReservedCodeCacheSize=240m")  # C1's own 48 MB filled up


def test_spark_jit_setting_is_checked():
    assert load_settings(environ={}).spark_jit == "auto"
    assert load_settings(environ={"TRAFFIC_SPARK_JIT": "Full"}).spark_jit == "full"
    with pytest.raises(SettingsError, match="spark_jit: 'fast' is not one of auto, quick, full"):
        load_settings(environ={"TRAFFIC_SPARK_JIT": "fast"})


def test_the_cli_says_which_jvm_it_starts_and_why(monkeypatch, capsys):
    import traffic.runtime.spark
    from traffic.app.spark_holder import SparkHolder

    built = []
    monkeypatch.setattr(traffic.runtime.spark, "build_spark",
                        lambda settings, name, big_job=None: built.append(big_job))
    settings = load_settings(environ={}, overrides={"spark_master": "local[2]"})
    SparkHolder(settings, "traffic-test")()
    assert "starting Spark (quick-start JVM) …" in capsys.readouterr().err
    SparkHolder(settings, "traffic-test").start("a batch of 40 MiB")
    assert "starting Spark (full JIT: a batch of 40 MiB) …" in capsys.readouterr().err
    SparkHolder(settings.replace(spark_jit="quick"), "traffic-test").start("a batch of 40 MiB")
    assert "starting Spark (quick-start JVM) …" in capsys.readouterr().err
    assert built == [None, "a batch of 40 MiB", "a batch of 40 MiB"]  # the reason reaches the session builder


def test_a_factory_that_can_still_choose_its_jvm_is_told_why_the_work_is_big():
    from traffic.runtime.spark import start_spark

    class Holder:
        def start(self, big_job=None):
            return ("started", big_job)

    assert start_spark(Holder(), "a close of 30 hours") == ("started", "a close of 30 hours")
    assert start_spark(lambda: "running session", "a close of 30 hours") == "running session"
