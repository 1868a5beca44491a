"""The pipeline's pure Spark transforms (``traffic.accounting.transforms``) on a few inline rows each.

Every case compares whole DataFrames with ``pyspark.testing.assertDataFrameEqual``, both ways
(expected against actual, and actual against expected), and shows that a wrong expectation is caught.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from datetime import date, datetime, timezone

import pandas
import pytest
from pyspark.errors import PySparkAssertionError
from pyspark.testing import assertDataFrameEqual

from traffic.accounting import transforms as T

pytestmark = pytest.mark.spark

UTC = timezone.utc
PACKETS = "ts timestamp, hour timestamp, local_ip string, remote_ip string, direction string, bytes long, packets long"


def at(hour: int, minute: int = 0, second: int = 0, day: int = 1) -> datetime:
    return datetime(2026, 11, day, hour, minute, second, tzinfo=UTC)


@contextmanager
def _spark_comparison():
    """pyspark 4.2's ``assertDataFrameEqual`` imports ``pyspark.pandas`` whenever pandas imports, and
    ``pyspark.pandas`` fails to import under pandas 3 (pyspark 4.2 supports pandas < 3). With pandas out of
    reach for the call, it takes its Spark DataFrame path, the one these Spark DataFrames take in any case."""
    if int(pandas.__version__.split(".")[0]) < 3:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "pandas", None)
        yield


def assert_equal(actual, expected) -> None:
    """``assertDataFrameEqual``: same schema and the same rows in any order (a diff of rows when not)."""
    with _spark_comparison():
        assertDataFrameEqual(actual, expected)


def both_ways(actual, expected) -> None:
    """Equal in both directions: no row, column or type of one is missing from the other."""
    assert_equal(actual, expected)
    assert_equal(expected, actual)


@pytest.fixture(scope="module")
def packets(spark):
    """Six packets of one pair over two hours: in, out, a direction not known, a row written before weights."""
    return spark.createDataFrame([
        (at(10, 1), at(10), "10.0.0.1", "192.0.2.7", "in", 1500, 1),
        (at(10, 4, 59), at(10), "10.0.0.1", "192.0.2.7", "out", 400, 2),
        (at(10, 5), at(10), "10.0.0.1", "192.0.2.7", None, 60, None),
        (at(10, 59, 59), at(10), "10.0.0.1", "198.51.100.3", "internal", 90, 1),
        (at(11, 0), at(11), "10.0.0.1", "192.0.2.7", "in", 1000, 10),
        (at(11, 30), at(11), "10.0.0.1", "192.0.2.7", "transit", 7, 1),
    ], PACKETS)


def test_direction_bytes_count_known_directions_only(spark, packets):
    actual = T.with_direction_bytes(packets).select("ts", "direction", "bytes", "bytes_in", "bytes_out")
    expected = spark.createDataFrame([
        (at(10, 1), "in", 1500, 1500, 0),
        (at(10, 4, 59), "out", 400, 0, 400),
        (at(10, 5), None, 60, 0, 0),
        (at(10, 59, 59), "internal", 90, 0, 0),
        (at(11, 0), "in", 1000, 1000, 0),
        (at(11, 30), "transit", 7, 0, 0),
    ], "ts timestamp, direction string, bytes long, bytes_in long, bytes_out long")
    both_ways(actual, expected)


def test_a_row_without_a_weight_stands_for_one_packet(spark, packets):
    actual = packets.select("ts", T.weight().alias("weight"))
    expected = spark.createDataFrame([(at(10, 1), 1), (at(10, 4, 59), 2), (at(10, 5), 1), (at(10, 59, 59), 1),
                                      (at(11, 0), 10), (at(11, 30), 1)], "ts timestamp, weight long")
    both_ways(actual, expected)


def test_hourly_totals_per_pair(spark, packets):
    actual = T.hourly_totals(packets, "open")
    expected = spark.createDataFrame([
        (at(10), "10.0.0.1", "192.0.2.7", 1960, 4, 1500, 400, date(2026, 11, 1), "open"),
        (at(10), "10.0.0.1", "198.51.100.3", 90, 1, 0, 0, date(2026, 11, 1), "open"),
        (at(11), "10.0.0.1", "192.0.2.7", 1007, 11, 1000, 0, date(2026, 11, 1), "open"),
    ], "hour timestamp, local_ip string, remote_ip string, bytes long, packets long, bytes_in long, bytes_out long, "
       "day date, status string")
    both_ways(actual, expected)


def test_pane_start_is_the_start_of_the_five_minute_pane(spark, packets):
    actual = packets.select("ts", T.pane_start().alias("pane_start"))
    expected = spark.createDataFrame([(at(10, 1), at(10)), (at(10, 4, 59), at(10)), (at(10, 5), at(10, 5)),
                                      (at(10, 59, 59), at(10, 55)), (at(11, 0), at(11)), (at(11, 30), at(11, 30))],
                                     "ts timestamp, pane_start timestamp")
    both_ways(actual, expected)


def test_a_wrong_expectation_is_caught_both_ways(spark, packets):
    """One byte too many in one row, or a row missing, fails the comparison whichever side it is on."""
    actual = T.hourly_totals(packets, "open").select("hour", "remote_ip", "bytes")
    off_by_one = spark.createDataFrame([(at(10), "192.0.2.7", 1961), (at(10), "198.51.100.3", 90),
                                        (at(11), "192.0.2.7", 1007)], "hour timestamp, remote_ip string, bytes long")
    a_row_short = spark.createDataFrame([(at(10), "192.0.2.7", 1960), (at(11), "192.0.2.7", 1007)],
                                        "hour timestamp, remote_ip string, bytes long")
    for wrong in (off_by_one, a_row_short):
        with pytest.raises(PySparkAssertionError):
            assert_equal(actual, wrong)
        with pytest.raises(PySparkAssertionError):
            assert_equal(wrong, actual)
