"""The one-pass checks (DESIGN §6a) against Great Expectations' own evaluation of the same suites.

Each row suite is run two ways over the same frames — rows drawn at random from pools that break
every kind of rule (nulls, negative and huge counts, addresses not in canonical form, times off the
hour, unknown directions, repeated keys, markup): by ``traffic.quality.one_pass`` (one aggregation,
as the close runs it), and by GX's Spark engine evaluating the original expectations one by one (the
reference: GX's code, not ours). For every expectation and period both must count the same breaking
rows. Then a single bad row among many fails the period exactly as before, and is among the examples
Data Docs show.
"""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta, timezone

import pyarrow as pa
import pytest

from traffic.quality import one_pass
from traffic.quality.suite_documents import as_period, suite_document
from traffic.quality.suites import _viewed
from traffic.storage.schemas import arrow_schema

UTC = timezone.utc
ROW_SUITES = ("packets", "late_packets", "rejects", "hourly", "panes", "daily", "monthly")
HOURS = [datetime(2026, 11, 1, h, tzinfo=UTC) for h in (10, 11, 12)]
STRINGS = ["10.0.0.1", "192.0.2.7", "2001:db8::1", "2001:DB8::1", "010.0.0.1", "final", "open", "in", "out",
           "internal", "transit", "r1", "acct", "<b>x</b>", "", None]
INTEGERS = [0, 1, 5, 100, 1500, -3, 70000, 65536, 4294967336, None]


def _value(kind: pa.DataType, rng: random.Random, name: str):
    if rng.random() < 0.06:
        return None
    if pa.types.is_timestamp(kind):
        hour = rng.choice(HOURS)
        return hour if rng.random() < 0.85 else hour + timedelta(minutes=rng.choice([5, 30]))
    if pa.types.is_date(kind):
        day = rng.choice([date(2026, 11, 1), date(2026, 11, 2), date(2026, 10, 31)])
        return day.replace(day=1) if name == "month" and rng.random() < 0.8 else day
    if pa.types.is_integer(kind):
        value = rng.choice(INTEGERS)
        return value if value is None or abs(value) < 2 ** (kind.bit_width - 1) else -1
    if pa.types.is_floating(kind):
        return rng.choice([0.0, 0.5, 1.0, -1.0])
    if pa.types.is_boolean(kind):
        return rng.random() < 0.5
    return rng.choice(STRINGS)


def _frame(spark, suite: str, rows: int, seed: int):
    """``rows`` random rows of the suite's table, each column drawn from a pool that breaks its rules."""
    table = suite_document(suite)["meta"]["table"]
    schema = arrow_schema(table)
    rng = random.Random(seed)
    data = [{f.name: _value(f.type, rng, f.name) for f in schema} for _ in range(rows)]
    return spark.createDataFrame(pa.Table.from_pylist(data, schema=schema).to_pandas(types_mapper=_nullable()))


def _nullable():
    import pandas as pd

    return {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype(), pa.int16(): pd.Int16Dtype(),
            pa.bool_(): pd.BooleanDtype()}.get


def _gx_counts(spark_frame, suite: str) -> dict[tuple[int, datetime], int]:
    """GX's Spark engine over the original suite: breaking rows per (expectation index, period)."""
    import great_expectations as gx

    doc = suite_document(suite)
    column = doc["meta"]["period_column"]
    context = gx.get_context(mode="ephemeral")
    source = context.data_sources.add_spark(name="reference", persist=False)
    batch = source.add_dataframe_asset(name=suite).add_batch_definition_whole_dataframe("whole")
    expectations = [gx.expectations.registry.get_expectation_impl(e["type"])(**e["kwargs"], meta={"index": i})
                    for i, e in enumerate(doc["expectations"])]
    result = batch.get_batch(batch_parameters={"dataframe": spark_frame}).validate(
        gx.ExpectationSuite(name=suite, expectations=expectations),
        result_format={"result_format": "COMPLETE", "unexpected_index_column_names": [column],
                       "return_unexpected_index_query": False})
    counts: dict[tuple[int, datetime], int] = {}
    for item in result.results:  # (GX orders its results its own way)
        index = item.expectation_config.meta["index"]
        assert not (item.exception_info or {}).get("raised_exception"), (suite, index, item.exception_info)
        for entry in item.result.get("unexpected_index_list") or []:
            key = (index, as_period(entry[column]))
            counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.parametrize("suite", ROW_SUITES)
def test_one_pass_counts_what_gx_counts_for_every_expectation_and_period(spark, suite):
    doc = suite_document(suite)
    rules = one_pass.compile_rules(doc)
    frame = _viewed(_frame(spark, suite, 400, seed=len(suite)), doc["meta"]).cache()
    frame = frame.where(frame[doc["meta"]["period_column"]].isNotNull())  # every row belongs to a period
    measured = one_pass.measure(frame, rules, doc["meta"]["period_column"])
    reference = _gx_counts(frame, suite)
    ours = {(int(key[1:]), period): n for (key, period), n in measured.broken.items() if n}
    assert ours == reference, suite
    # The pools break every kind of rule somewhere (a test that never sees a failure proves nothing).
    assert {r.kind for r in rules if any(i == r.index for i, _ in ours)} == {r.kind for r in rules}, suite
    frame.unpersist()


def test_suites_measured_together_count_what_each_counts_alone(spark):
    """A freeze measures its suites in one Spark job (``measure_together``): every row suite's frame at once,
    hourly and daily periods mixed, repeated keys among them, gives each suite exactly its own pass."""
    items = []
    for suite in ROW_SUITES:
        doc = suite_document(suite)
        column = doc["meta"]["period_column"]
        frame = _viewed(_frame(spark, suite, 300, seed=7 * len(suite)), doc["meta"])
        items.append((frame.where(frame[column].isNotNull()).cache(), one_pass.compile_rules(doc), column))
    together = one_pass.measure_together(items)
    alone = [one_pass.measure(*item) for item in items]
    for suite, both, one in zip(ROW_SUITES, together, alone):
        assert (both.rows, both.broken, both.low, both.high) == (one.rows, one.broken, one.low, one.high), suite
    assert any(n for (key, _), n in together[ROW_SUITES.index("hourly")].broken.items() if key == "r00"), \
        "no repeated key: the exact uniqueness path was not exercised"
    for frame, _, _ in items:
        frame.unpersist()


def test_every_row_suite_compiles_and_other_expectations_are_refused_by_name():
    for suite in ROW_SUITES:
        assert one_pass.compile_rules(suite_document(suite))
    with pytest.raises(one_pass.UnsupportedRule, match="expect_column_mean_to_be_between.*not one the one-pass"):
        one_pass.compile_rules({"name": "x", "expectations": [
            {"type": "expect_column_mean_to_be_between", "kwargs": {"column": "bytes", "min_value": 0}}]})
    with pytest.raises(one_pass.UnsupportedRule, match=r"argument\(s\) \['mostly'\]"):
        one_pass.compile_rules({"name": "x", "expectations": [
            {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "bytes", "mostly": 0.9}}]})


def test_one_bad_row_among_many_fails_its_period_alone_and_is_an_example(spark):
    """200,000 good final rows over three hours and one with a negative byte count, one repeated key."""
    from pyspark.sql import functions as F

    doc = suite_document("hourly")
    rules = one_pass.compile_rules(doc)
    base = (spark.range(200_000).select(
        (F.lit(HOURS[0]) + F.expr("make_interval(0, 0, 0, 0, cast(id % 3 as int), 0, 0)")).alias("hour"),
        F.concat(F.lit("10.0."), (F.col("id") % 250).cast("string"), F.lit(".1")).alias("local_ip"),
        F.concat(F.lit("192.0."), (F.col("id") / 250).cast("int").cast("string"), F.lit(".7")).alias("remote_ip"),
        F.lit(1500).cast("long").alias("bytes"), F.lit(1).cast("long").alias("packets"),
        F.lit(1000).cast("long").alias("bytes_in"), F.lit(500).cast("long").alias("bytes_out"),
        F.lit("final").alias("status")))
    base = base.withColumn("day", F.to_date("hour"))
    bad = spark.createDataFrame([(HOURS[1], "10.0.0.9", "192.0.2.9", -40, 1, 0, 0, "final")],
                                "hour timestamp, local_ip string, remote_ip string, bytes long, packets long, "
                                "bytes_in long, bytes_out long, status string").withColumn("day", F.to_date("hour"))
    twin = base.where(F.col("hour") == F.lit(HOURS[2])).limit(1)
    frame = _viewed(base.unionByName(bad).unionByName(twin), doc["meta"])
    measured = one_pass.measure(frame, rules, "hour")
    assert measured.rows == {HOURS[0]: 66_667, HOURS[1]: 66_668, HOURS[2]: 66_667}
    failed = measured.failed()
    by_kind = {r.kind if r.column != "bytes" else "bytes": r for r in rules if r.key in failed}
    assert failed[by_kind["bytes"].key] == [HOURS[1]]
    assert failed[by_kind["expect_compound_columns_to_be_unique"].key] == [HOURS[2]]
    assert measured.broken[(by_kind["expect_compound_columns_to_be_unique"].key, HOURS[2])] == 2
    shown = one_pass.examples(frame, by_kind["bytes"], [HOURS[1]], "hour")
    assert [r["local_ip"] for r in shown[HOURS[1]]] == ["10.0.0.9"]
    assert one_pass.observed(by_kind["bytes"], measured, HOURS[1], shown[HOURS[1]]) == "1 row, min -40"
