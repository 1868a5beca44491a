"""Each time rule of the contract (DESIGN §2–§5), on small inline cases, both ways."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

import numpy as np

from traffic.core import periods as P

UTC = timezone.utc


def t(day: int, hour: int = 0, minute: int = 0, month: int = 11) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


def test_calendar_periods_are_utc_and_half_open():
    assert P.hour_floor(t(1, 10, 59)) == t(1, 10)
    assert P.month_start(t(30, 23)) == t(1) and P.next_month(t(1, month=12)) == datetime(2027, 1, 1, tzinfo=UTC)
    assert P.hours_between(t(1, 22), t(2, 1)) == [t(1, 22), t(1, 23), t(2, 0)]
    assert P.hours_between(t(1, 22), t(1, 22, 30)) == [t(1, 22)]  # an hour starting inside counts
    assert P.hours_between(t(2), t(1)) == [] and P.days_between(t(1), t(3)) == [t(1), t(2)]
    assert P.from_micros(P.micros(t(1, 10, 5))) == t(1, 10, 5)


def test_sanity_bounds():
    assert P.future_limit(t(1), timedelta(days=1)) == t(2)
    assert P.history_floor(t(30), timedelta(days=10)) == t(20) and P.history_floor(None, timedelta(1)) is None


def test_an_hour_is_closed_once_its_end_is_at_or_before_the_watermark():
    assert P.is_closed(t(1, 10), t(1, 11)) and not P.is_closed(t(1, 10), t(1, 10, 59))
    assert not P.is_closed(t(1, 10), None)


def test_a_record_is_late_when_its_hour_was_closed_before_its_batch():
    assert P.is_late(t(1, 10, 30), t(1, 11)) and not P.is_late(t(1, 11, 0), t(1, 11))
    ts = np.array([P.micros(t(1, 10, 59)), P.micros(t(1, 11)), P.micros(t(1, 9))], dtype=np.int64)
    assert P.late_mask(ts, t(1, 11)).tolist() == [True, False, True]
    assert P.late_mask(ts, None).tolist() == [False, False, False]


def test_closed_hours_run_from_the_frontier_while_closed_and_before_until():
    assert P.closed_hours(t(1, 10), None, t(1, 12, 30)) == [t(1, 10), t(1, 11)]
    assert P.closed_hours(t(1, 10), t(1, 11), t(1, 12, 30)) == [t(1, 11)]
    assert P.closed_hours(t(1, 10), None, t(1, 13), until=t(1, 12)) == [t(1, 10), t(1, 11)]
    assert P.closed_hours(t(1, 10), None, t(1, 10, 59)) == [] and P.closed_hours(None, None, t(2)) == []


def test_a_day_is_due_when_closed_and_all_its_hours_from_the_first_are_published():
    first = t(1, 20)
    published = set(P.hours_between(first, t(3)))
    assert P.days_due(first, t(3), set(), published) == [date(2026, 11, 1), date(2026, 11, 2)]
    assert P.days_due(first, t(2, 23), set(), published) == [date(2026, 11, 1)]  # day 2 not closed
    assert P.days_due(first, t(3), {t(1)}, published) == [date(2026, 11, 2)]  # rolled up once
    assert P.days_due(first, t(3), set(), published - {t(1, 21)}) == []  # a failed hour blocks, in order
    assert P.days_due(first, t(3), set(), published, until=t(2)) == [date(2026, 11, 1)]
    assert P.days_due(first, t(3), set(), published, frozen_end=t(2, 5)) == [date(2026, 11, 1)]
    assert P.hours_of_day(t(1), first) == [t(1, 20), t(1, 21), t(1, 22), t(1, 23)]


def test_a_month_is_due_on_the_day_change_that_rolls_up_its_last_day():
    first = t(29, 5, month=10)
    oct_days = set(P.days_between(t(29, month=10), t(1)))
    assert P.months_due(first, t(1), oct_days, set()) == [t(1, month=10)]
    assert P.months_due(first, t(1), oct_days - {t(31, month=10)}, set()) == []  # last day not rolled up
    assert P.months_due(first, t(1), oct_days, {t(1, month=10)}) == []  # rolled up once
    assert P.months_due(first, t(1), oct_days, set(), unpublished_days={t(30, month=10)}) == []
    assert P.months_due(first, t(31, 23, month=10), oct_days, set()) == []  # not closed yet
    assert P.days_of_month(t(1, month=10), first) == [t(29, month=10), t(30, month=10), t(31, month=10)]


def test_expiry_keeps_n_hours_and_never_an_unfrozen_hour():
    assert P.expiry_cutoff(t(2, 10, 30), 24, t(2, 10)) == t(1, 10)
    assert P.expiry_cutoff(t(2, 10, 30), 0, t(2, 8)) == t(2, 8)  # hours after the frontier are not frozen yet
    assert P.retention_floor(t(2, 10, 30), timedelta(hours=3)) == t(2, 7)


def test_published_statuses():
    assert [s for s in ("passed", "warning", "accepted", "failed", None) if P.is_published(s)] == list(P.PUBLISHED)
    rows = [{"grain": "day", "period_start": t(1), "dq_status": "failed"},
            {"grain": "day", "period_start": t(2), "dq_status": "passed"},
            {"grain": "hour", "period_start": t(2, 1), "dq_status": "passed"}]
    assert P.starts(rows, "day") == {t(1), t(2)} and P.starts(rows, "day", P.PUBLISHED) == {t(2)}


def test_period_ends_ceilings_panes_and_the_expected_sources_window():
    assert [P.period_end(t(1, 10), "hour"), P.period_end(t(1), "day"), P.period_end(t(1), "month")] == \
        [t(1, 11), t(2), t(1, month=12)]
    assert P.hour_ceil(t(1, 10)) == t(1, 10) and P.hour_ceil(t(1, 10, 1)) == t(1, 11)
    assert P.panes_of(t(1, 10))[::11] == [t(1, 10), t(1, 10, 55)] and len(P.panes_of(t(1, 10))) == 12
    assert P.expected_sources_window(t(2, 10)) == (t(1, 11), t(2, 11))
