"""The pane length and UTC normalisation have one home (``traffic.core.periods``), on inline cases both ways."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from traffic.core import periods as P

UTC = timezone.utc


def test_the_pane_is_five_minutes_in_every_unit():
    assert P.PANE == timedelta(minutes=5)
    assert P.PANE_SECONDS == 300 and P.PANE_US == 300_000_000
    assert P.HOUR_US == 3_600_000_000 and P.HOUR_US == 12 * P.PANE_US


def test_modules_that_count_in_panes_use_the_one_length():
    from traffic.accounting import batch_tasks, panes, parts, transforms
    from traffic.core import billing

    assert parts.PANE_US is P.PANE_US and panes.PANE_US is P.PANE_US and batch_tasks.PANE_US is P.PANE_US
    assert billing.PANE_SECONDS is P.PANE_SECONDS and transforms.PANE_SECONDS is P.PANE_SECONDS
    assert batch_tasks.HOUR_US is P.HOUR_US and panes.HOUR_US is P.HOUR_US


def test_floor_to_a_pane_and_an_hour():
    from traffic.accounting.parts import floor_to

    ts = pa.array([datetime(2026, 11, 1, 10, 4, 59, 999999, tzinfo=UTC), datetime(2026, 11, 1, 10, 5, tzinfo=UTC),
                   None], pa.timestamp("us", tz="UTC"))
    assert floor_to(ts, P.PANE_US).to_pylist() == [datetime(2026, 11, 1, 10, 0, tzinfo=UTC),
                                                  datetime(2026, 11, 1, 10, 5, tzinfo=UTC), None]
    assert floor_to(ts, P.HOUR_US).to_pylist() == [datetime(2026, 11, 1, 10, 0, tzinfo=UTC)] * 2 + [None]


def test_as_utc_reads_a_naive_time_as_utc_and_converts_an_aware_one():
    naive = datetime(2026, 11, 1, 10, 30)
    assert P.as_utc(naive) == datetime(2026, 11, 1, 10, 30, tzinfo=UTC) and P.as_utc(naive).tzinfo is UTC
    plus_two = datetime(2026, 11, 1, 12, 30, tzinfo=timezone(timedelta(hours=2)))
    assert P.as_utc(plus_two) == naive.replace(tzinfo=UTC) and P.as_utc(plus_two).tzinfo is UTC
    assert P.as_utc(plus_two).hour == 10  # the wall time changes, not only the zone label
    assert P.as_utc(datetime(2026, 11, 1, 10, 30, tzinfo=UTC)).hour == 10


@pytest.mark.parametrize("ts, on_boundary", [
    (datetime(2026, 11, 1, 10, 5, tzinfo=UTC), True),
    (datetime(2026, 11, 1, 10, 5), True),  # naive: UTC
    (datetime(2026, 11, 1, 10, 5, 0, 1, tzinfo=UTC), False),
    (datetime(2026, 11, 1, 10, 7, tzinfo=UTC), False),
    (datetime(2026, 11, 1, 15, 35, tzinfo=timezone(timedelta(hours=5, minutes=30))), True),  # 10:05 UTC
    (datetime(2026, 11, 1, 15, 35, tzinfo=timezone(timedelta(hours=5, minutes=33))), False),  # 10:02 UTC
])
def test_on_pane_boundary(ts, on_boundary):
    assert P.on_pane_boundary(ts) is on_boundary
