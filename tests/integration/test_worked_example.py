"""The worked example of the contract: a hand-made stream fed one record per batch, and all at once.

Two days with ticks, a late record, a bad record, a zero-traffic day and a month boundary.
Every table is checked row by row against the reference model, and the facts the contract
names are asserted directly — including where the two feeds must differ: record C is late
when it arrives after the tick that closed its hour, and on time when it arrives with the rest.
"""

from __future__ import annotations

from datetime import date, datetime, timezone

import pytest

from tests.support.harness import Harness, feed_line, model_tables, tick_line
from tests.model.reference import ModelSettings, ReferenceModel

UTC = timezone.utc
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def t(day, hour, minute=0):
    return datetime(2026, 10 if day > 2 else 11, day, hour, minute, tzinfo=UTC)


STREAM = [
    feed_line(t(30, 22, 10), "10.0.0.1", "192.0.2.1", 1000, 443, 100),   # A
    feed_line(t(30, 23, 50), "10.0.0.2", "192.0.2.1", 1001, 443, 200),   # B
    tick_line(t(31, 0, 30)),                                              # closes hour 23:00 of the 30th
    feed_line(t(30, 23, 55), "10.0.0.2", "192.0.2.1", 1001, 443, 300),   # C: late when alone
    "new,OP_INSERT,oops,10.0.0.1,192.0.2.1,1,2,3",                      # bad record
    tick_line(t(1, 0, 30)),                                               # the 31st saw only ticks
    feed_line(t(1, 1, 15), "2001:DB8::1", "2001:db8:ffff::2", 5, 6, 400),  # D, after the month boundary
    tick_line(t(1, 3, 0)),                                                # W = 03:00 on Nov 1
]


def _run(harness: Harness, model: ReferenceModel, batches: list[list[str]]) -> None:
    for lines in batches:
        text = "\n".join(lines) + "\n"
        harness.deliver("r1", text)
        model.ingest([("r1", text)], NOW)
        harness.ingest()
        harness.close()
        model.close()


@pytest.fixture(scope="module")
def one_by_one(spark, tmp_path_factory):
    harness, model = Harness(tmp_path_factory.mktemp("one"), spark), ReferenceModel(ModelSettings())
    _run(harness, model, [[line] for line in STREAM])
    return harness, model


@pytest.fixture(scope="module")
def all_at_once(spark, tmp_path_factory):
    harness, model = Harness(tmp_path_factory.mktemp("all"), spark), ReferenceModel(ModelSettings())
    _run(harness, model, [STREAM])
    return harness, model


@pytest.mark.parametrize("feed", ["one_by_one", "all_at_once"])
def test_every_table_equals_the_reference_model(feed, request):
    harness, model = request.getfixturevalue(feed)
    ours, theirs = harness.tables(), model_tables(model)
    for name in theirs:
        assert ours[name] == theirs[name], f"{feed}: table {name}\n got      {ours[name]}\n expected {theirs[name]}"


def test_one_by_one_record_c_is_late_and_grows_the_closed_hours_ledger(one_by_one):
    harness, _ = one_by_one
    late = harness.table("late_packets")
    assert [(r["ts"], r["bytes"]) for r in late] == [(t(30, 23, 55), 300)]
    assert "closed" in late[0]["late_reason"]
    ledger = {(r["grain"], r["period_start"]): r for r in harness.table("periods")}
    assert (ledger[("hour", t(30, 23))]["bytes"], ledger[("hour", t(30, 23))]["late_bytes"]) == (200, 300)
    assert (ledger[("day", t(30, 0))]["bytes"], ledger[("day", t(30, 0))]["late_bytes"]) == (300, 300)
    assert (ledger[("month", t(1, 0).replace(month=10))]["bytes"],
            ledger[("month", t(1, 0).replace(month=10))]["late_bytes"]) == (300, 300)
    hourly = {(r["hour"], r["local_ip"]): (r["bytes"], r["status"]) for r in harness.table("hourly")}
    assert hourly[(t(30, 23), "10.0.0.2")] == (200, "final")


def test_all_at_once_record_c_is_on_time(all_at_once):
    harness, _ = all_at_once
    assert harness.table("late_packets") == []
    hourly = {(r["hour"], r["local_ip"]): (r["bytes"], r["packets"], r["status"]) for r in harness.table("hourly")}
    assert hourly[(t(30, 23), "10.0.0.2")] == (500, 2, "final")
    monthly = harness.table("monthly")
    assert sum(r["bytes"] for r in monthly if r["month"] == date(2026, 10, 1)) == 600


@pytest.mark.parametrize("feed", ["one_by_one", "all_at_once"])
def test_contract_facts_hold_in_both_feeds(feed, request):
    harness, _ = request.getfixturevalue(feed)
    ledger = {(r["grain"], r["period_start"]): r for r in harness.table("periods")}
    # The zero-traffic day still has its ledger row (proof the roll-up ran), with 0 bytes.
    assert ledger[("day", t(31, 0))]["bytes"] == 0 and ledger[("day", t(31, 0))]["packets"] == 0
    assert [r for r in harness.table("daily") if r["day"] == date(2026, 10, 31)] == []
    # Hours freeze from the first hour (22:00 on the 30th) through 02:00 on Nov 1 (W = 03:00), empty ones included.
    hours = sorted(p for g, p in ledger if g == "hour")
    assert hours[0] == t(30, 22) and hours[-1] == t(1, 2) and len(hours) == 29
    # Nov 1 is not closed yet; October is (its last day rolled up on the day change).
    assert ("day", t(1, 0)) not in ledger and ("month", t(1, 0).replace(month=10)) in ledger
    assert ("month", t(1, 0)) not in ledger
    # The bad record is rejected with a reason a person understands; it did not stop the batch.
    rejects = harness.table("rejects")
    assert [r["reason"] for r in rejects] == ["time 'oops' is not microseconds since 1970 (or ISO-8601)"]
    # IPv6 is stored canonical.
    assert {r["local_ip"] for r in harness.table("hourly")} >= {"2001:db8::1"}
    # Conservation: accepted bytes = hourly (open + final) + late.
    accepted = sum(b["bytes_on_time"] + b["bytes_late"] for b in harness.table("batches"))
    assert accepted == 1000
    assert accepted == sum(r["bytes"] for r in harness.table("hourly")) + sum(
        r["bytes"] for r in harness.table("late_packets"))
    assert harness.watermark == t(1, 3)


def test_tables_are_real_delta_tables(one_by_one):
    """Independent readers (deltalake, polars) see the rows the project reports."""
    import polars as pl
    from deltalake import DeltaTable

    harness, _ = one_by_one
    root = harness.settings.warehouse
    for name in ("hourly", "daily", "monthly", "periods", "packets", "late_packets"):
        ours = len(harness.table(name))
        assert DeltaTable(str(root / name)).to_pyarrow_table().num_rows == ours, name
        assert pl.read_delta(str(root / name)).height == ours, name
    assert pl.read_delta(str(root / "monthly"))["bytes"].sum() == 300


def test_close_until_stops_at_that_hour(spark, tmp_path):
    """``close --until H`` freezes only hours ending by H and rolls up only days ending by H."""
    harness = Harness(tmp_path, spark)
    harness.deliver("r1", "\n".join(STREAM) + "\n")
    harness.ingest()
    harness.close(until=t(30, 23))
    ledger = harness.table("periods")
    assert [(r["grain"], r["period_start"]) for r in ledger] == [("hour", t(30, 22))]
    harness.close(until=t(1, 0))
    grains = {}
    for r in harness.table("periods"):
        grains.setdefault(r["grain"], []).append(r["period_start"])
    assert max(grains["hour"]) == t(31, 23) and sorted(grains["day"]) == [t(30, 0), t(31, 0)]
    assert grains["month"] == [t(1, 0).replace(month=10)]
    harness.close()
    assert max(r["period_start"] for r in harness.table("periods") if r["grain"] == "hour") == t(1, 2)
