"""Builds the one SparkSession a job uses (called from entry points and one test fixture only)."""

from __future__ import annotations

import re

import os
import sys
import time
import warnings

from traffic.runtime import jvm
from traffic.runtime.connect import (CONNECT_SESSION_CONF, DELTA_CONF, client_url, delta_classpath,
                                     plain_channel_builder, plain_with_token, recorded_server)
from traffic.storage.engine import choose_engine
from traffic.storage.journal import host_folder
from traffic.core.settings import Settings


#: What ``spark_master = auto`` means when the warehouse has no warm server running.
LOCAL_MASTER = "local[2]"


def resolve_master(settings: Settings) -> str:
    """``auto``: the warehouse's warm Spark Connect server (``traffic spark start``) if it runs, else local.

    The server's URL carries its token, read from the server's record (trusted only if this user
    wrote it: ``traffic.runtime.connect.recorded_server``); print it with ``traffic.runtime.connect.without_token``.
    Under ``spark-submit`` the JVM is already up, so ``auto`` never reaches for a server there.
    """
    if settings.spark_master != "auto":
        return settings.spark_master
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        record = recorded_server(host_folder(settings.warehouse))
        if record:
            return client_url(record)
    return LOCAL_MASTER


def driver_on_loopback(master: str) -> bool:
    """Does the driver listen on 127.0.0.1 only? Yes, unless its executors run on another host: a
    ``spark://`` master named by anything but a loopback address (the compose stack's
    ``spark://spark-master:7077``), whose executors must reach the driver at this host's address."""
    match = re.match(r"spark://([^:/,]+)", master.strip())
    return match is None or match.group(1) in {"127.0.0.1", "localhost", "::1"}


def delta_conf(settings: Settings) -> dict[str, str]:
    """A session's settings for the spark engine (delta-spark): Delta Lake's jars in ``spark_jars_dir``
    (``spark.jars``; none where the platform's classpath has them), its SQL extension and catalog, and
    cheap small commits (``DELTA_CONF``); nothing when the rs engine writes.

    ``spark.jars`` counts only where the JVM starts with it: a session of this process, or spark-submit's
    own ``--conf`` (a job it runs starts its session in a JVM already up, too late for the jars).
    """
    if choose_engine(settings) != "spark":
        return {}
    jars = delta_classpath(settings.spark_jars_dir)
    return {**({"spark.jars": ",".join(str(p) for p in jars)} if jars else {}), **DELTA_CONF}


def build_spark(settings: Settings, app_name: str, big_job: str | None = None):
    """A SparkSession tuned for this pipeline: UTC, microsecond timestamps, few partitions, no UI.

    ``big_job``: why the work it starts for is big (``spark_jit = auto`` then starts the full JIT), or None.
    """
    from pyspark.sql import SparkSession

    # Quiet JVM start-up (our log4j2 config applies from the first line), and the JIT the job needs.
    java_options = jvm.driver_java_options(jvm.quick_for(settings.spark_jit, big_job is not None))
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", f"--driver-java-options '{java_options}' pyspark-shell")
    # Python workers must run the same interpreter (and so the same pyarrow) as the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Spark turns timestamps into naive Python datetimes in the process's local zone: make it UTC.
    os.environ["TZ"] = "UTC"
    time.tzset()
    warnings.filterwarnings("ignore", category=FutureWarning, module="pyspark")
    master = resolve_master(settings)
    if master.startswith("sc://"):
        return _connect(settings.replace(spark_master=master))
    builder = SparkSession.builder.appName(app_name)
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        # Under spark-submit (Airflow, a cluster) the JVM is already up and its --master decides.
        builder = builder.master(master)
    builder = (
        builder
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.ansi.enabled", "true")  # a sum that passes 63 bits raises, never wraps (DESIGN 7a)
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        .config("spark.default.parallelism", str(settings.shuffle_partitions))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "200000")
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", os.environ.get("SPARK_DRIVER_MEMORY", "2g"))
        .config("spark.sql.files.maxPartitionBytes", str(settings.split_bytes))
        .config("spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
        .config("spark.hadoop.parquet.enable.summary-metadata", "false")
        .config("spark.driver.extraJavaOptions", java_options)
    )
    if driver_on_loopback(master):
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    for name, value in delta_conf(settings).items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def start_spark(spark_factory, big_job: str | None):
    """The session of ``spark_factory``; a JVM it starts now is chosen for ``big_job`` (why the work is big, or None).

    A factory that has not started Spark yet takes the reason (``start``, as the CLI's ``SparkHolder`` has);
    any other callable hands back a session already running (a test's, a job's), whose JVM was chosen then.
    """
    start = getattr(spark_factory, "start", None)
    return start(big_job) if start is not None else spark_factory()


def _connect(settings: Settings):
    """A client session of a running Spark Connect server (``sc://host:port``): starts in about a second."""
    from pyspark.sql import SparkSession

    if plain_with_token(settings.spark_master):
        from pyspark.sql.connect.session import SparkSession as ConnectSession  # deferred: with the session

        spark = ConnectSession.builder.channelBuilder(plain_channel_builder(settings.spark_master)).getOrCreate()
        # what ``builder.remote`` does and this builder does not: without it ``pyspark.sql.functions``
        # takes the classic path, which asserts a SparkContext this client has not got
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    else:
        spark = SparkSession.builder.remote(settings.spark_master).getOrCreate()
    for name, value in {**CONNECT_SESSION_CONF, "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
                        "spark.sql.files.maxPartitionBytes": str(settings.split_bytes)}.items():
        spark.conf.set(name, value)
    return spark


def task_slots(settings: Settings) -> int:
    """Parse tasks that run at once: N of a ``local[N]`` master (``auto``: the local default or the
    warm server, both ``local[2]``), this machine's cores for ``local[*]``; on a cluster,
    ``shuffle_partitions``."""
    master = LOCAL_MASTER if settings.spark_master == "auto" else settings.spark_master
    match = re.fullmatch(r"local\[(\d+|\*)(,\s*\d+)?\]", master.strip())
    if match:
        return max(1, os.cpu_count() or 1) if match.group(1) == "*" else max(1, int(match.group(1)))
    return max(1, settings.shuffle_partitions)
