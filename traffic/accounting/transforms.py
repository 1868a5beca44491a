"""Pure DataFrame → DataFrame transforms of the pipeline (no reading, no writing)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from traffic.accounting.parts import AMOUNTS  # noqa: F401 - the amounts of per-pair totals, here for Spark transforms
from traffic.core.periods import PANE_SECONDS


def with_direction_bytes(packets: DataFrame) -> DataFrame:
    """``bytes_in``/``bytes_out`` per packet: known directions only (so in + out <= bytes)."""
    return packets.withColumn(
        "bytes_in", F.when(F.col("direction") == "in", F.col("bytes")).otherwise(F.lit(0).cast("long"))
    ).withColumn(
        "bytes_out", F.when(F.col("direction") == "out", F.col("bytes")).otherwise(F.lit(0).cast("long"))
    )


def weight() -> F.Column:
    """How many packets a raw row stands for (DESIGN §7a); null (a row written before weights) is 1."""
    return F.coalesce(F.col("packets"), F.lit(1)).cast("long")


def hourly_totals(packets: DataFrame, status: str) -> DataFrame:
    """Per (hour, local_ip, remote_ip) totals of packets, with ``status``."""
    return (
        with_direction_bytes(packets)
        .groupBy("hour", "local_ip", "remote_ip")
        .agg(F.sum("bytes").alias("bytes"), F.sum(weight()).alias("packets"),
             F.sum("bytes_in").alias("bytes_in"), F.sum("bytes_out").alias("bytes_out"))
        .withColumn("day", F.to_date("hour"))
        .withColumn("status", F.lit(status))
    )


def pane_start(ts_column: str = "ts") -> F.Column:
    """The start of the 5-minute pane of a timestamp."""
    return F.timestamp_seconds(F.floor(F.unix_seconds(F.col(ts_column)) / PANE_SECONDS) * PANE_SECONDS)
