"""Days and months roll up in Arrow (``rollup._rolled_in_arrow``): a period's final finer rows summed per pair.

On an ``rs`` warehouse (no Spark): hours spread past a fold of four, an open row that must not count, a
pair seen in two days, a month from its days, and a sum past 64 bits refused in one line.
"""

from __future__ import annotations

from datetime import date, datetime, timezone

import pyarrow as pa
import pytest

from traffic.accounting.close.rollup import _PARTS_PER_FOLD, _rolled_in_arrow
from traffic.accounting.parts import SumOverflow
from traffic.core.settings import load_settings
from traffic.storage.schemas import arrow_schema
from traffic.storage.warehouse import Warehouse

UTC = timezone.utc


def at(day: int, hour: int) -> datetime:
    return datetime(2026, 11, day, hour, tzinfo=UTC)


@pytest.fixture
def warehouse(tmp_path):
    house = Warehouse(load_settings(environ={}, overrides={"warehouse": tmp_path / "w"}), engine="rs")
    house.create_all()
    return house


def _hourly(warehouse, rows):
    schema = arrow_schema("hourly")
    table = pa.Table.from_pylist([{"hour": h, "day": h.date(), "local_ip": a, "remote_ip": b, "bytes": n,
                                   "packets": p, "bytes_in": n, "bytes_out": 0, "status": s}
                                  for h, a, b, n, p, s in rows], schema=schema)
    warehouse.table("hourly").replace(table, keys=sorted({r[0] for r in rows}))


def _pairs(table: pa.Table, period: str) -> dict:
    return {(r[period], r["local_ip"], r["remote_ip"]): (r["bytes"], r["packets"], r["bytes_in"], r["bytes_out"])
            for r in table.to_pylist()}


def test_a_day_is_the_sum_of_its_final_hours_per_pair_across_folds(warehouse):
    hours = [at(1, h) for h in range(0, 24, 3)]  # 8 hours with rows: more than one fold of hours
    assert len(range(0, 24, _PARTS_PER_FOLD)) > 1
    _hourly(warehouse, [(h, "10.0.0.1", "192.0.2.7", 100 + i, 1, "final") for i, h in enumerate(hours)]
            + [(at(1, 5), "10.0.0.2", "192.0.2.7", 7, 2, "final"),
               (at(1, 6), "10.0.0.3", "192.0.2.9", 999, 9, "open"),  # not final: not rolled up
               (at(2, 1), "10.0.0.1", "192.0.2.7", 5, 1, "final")])
    rolled, sums = _rolled_in_arrow(warehouse, "day", [at(1, 0), at(2, 0)])
    assert rolled.schema == arrow_schema("daily")
    assert sums == {at(1, 0): [sum(100 + i for i in range(8)) + 7, 10], at(2, 0): [5, 1]}  # what it read
    assert _pairs(rolled, "day") == {
        (date(2026, 11, 1), "10.0.0.1", "192.0.2.7"): (sum(100 + i for i in range(8)), 8, sum(100 + i for i in range(8)), 0),
        (date(2026, 11, 1), "10.0.0.2", "192.0.2.7"): (7, 2, 7, 0),
        (date(2026, 11, 2), "10.0.0.1", "192.0.2.7"): (5, 1, 5, 0),
    }
    assert set(rolled.column("month").to_pylist()) == {date(2026, 11, 1)}


def test_a_month_is_the_sum_of_its_days(warehouse):
    schema = arrow_schema("daily")
    days = [date(2026, 11, d) for d in (1, 2, 9, 30)]
    warehouse.table("daily").replace(pa.Table.from_pylist(
        [{"day": d, "month": date(2026, 11, 1), "local_ip": "10.0.0.1", "remote_ip": "192.0.2.7", "bytes": 10 * d.day,
          "packets": 1, "bytes_in": 0, "bytes_out": 10 * d.day} for d in days], schema=schema),
        keys=[datetime(d.year, d.month, d.day, tzinfo=UTC) for d in days])
    rolled, _ = _rolled_in_arrow(warehouse, "month", [datetime(2026, 11, 1, tzinfo=UTC)])
    assert rolled.schema == arrow_schema("monthly")
    assert _pairs(rolled, "month") == {(date(2026, 11, 1), "10.0.0.1", "192.0.2.7"): (420, 4, 0, 420)}


def test_a_pair_past_64_bits_in_a_day_is_refused_not_wrapped(warehouse):
    big = (1 << 62) + 1
    _hourly(warehouse, [(at(1, 1), "10.0.0.1", "192.0.2.7", big, 1, "final"),
                        (at(1, 9), "10.0.0.1", "192.0.2.7", big, 1, "final")])
    with pytest.raises(SumOverflow, match="10.0.0.1"):
        _rolled_in_arrow(warehouse, "day", [at(1, 0)])
