"""``state.rows``: Arrow rows as dicts, every timestamp an aware UTC datetime (whatever its unit or zone)."""

from __future__ import annotations

from datetime import date, datetime, timezone
from zoneinfo import ZoneInfo

import pyarrow as pa

from traffic.storage.state import rows

UTC = timezone.utc


def test_timestamps_of_any_unit_and_zone_come_back_as_utc_and_other_values_as_they_are():
    moment = datetime(2026, 11, 22, 14, 2, 33, 14627, tzinfo=UTC)
    table = pa.table({
        "aware": pa.array([moment, None], pa.timestamp("us", tz="UTC")),
        "naive": pa.array([moment.replace(tzinfo=None), None], pa.timestamp("us")),  # UTC by convention
        "berlin": pa.array([moment, moment], pa.timestamp("us", tz="Europe/Berlin")),
        "millis": pa.array([moment.replace(microsecond=14000)] * 2, pa.timestamp("ms", tz="UTC")),
        "day": pa.array([date(2026, 11, 22), None], pa.date32()),
        "files": pa.array([[{"path": "a", "size": 1}], None]),
        "name": ["x", None],
    })
    got = rows(table)
    assert got == [
        {"aware": moment, "naive": moment, "berlin": moment, "millis": moment.replace(microsecond=14000),
         "day": date(2026, 11, 22), "files": [{"path": "a", "size": 1}], "name": "x"},
        {"aware": None, "naive": None, "berlin": moment, "millis": moment.replace(microsecond=14000),
         "day": None, "files": None, "name": None},
    ]
    assert all(v.tzinfo is UTC for row in got for v in row.values() if isinstance(v, datetime))
    assert got[0]["berlin"].astimezone(ZoneInfo("Europe/Berlin")).hour == 15
    assert rows(table.slice(0, 0)) == []
