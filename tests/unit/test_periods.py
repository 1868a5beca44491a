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


# -- apportioning a flow to panes (§7a) ----------------------------------------------------------------

from fractions import Fraction

import numpy as np
from hypothesis import given, settings as hsettings
from hypothesis import strategies as st

from traffic.core.periods import apportion_to_panes

_P = 300_000_000


def _shares(start, end, amount):
    flow, ts, (share,) = apportion_to_panes(np.array([start]), np.array([end]), [np.array([amount])])
    return list(zip(ts.tolist(), share.tolist()))


def test_a_flow_inside_one_pane_is_one_share_at_its_start():
    assert _shares(_P + 5, 2 * _P - 1, 1500) == [(_P + 5, 1500)]
    assert _shares(7, 7, 40) == [(7, 40)]  # lasts no time


def test_an_end_on_a_pane_boundary_does_not_reach_the_next_pane():
    assert _shares(0, _P, 10) == [(0, 10)]


def test_shares_follow_the_overlap_and_add_up_exactly():
    # 100 µs in pane 0, all of pane 1, 100 µs of pane 2: the middle pane holds half
    assert _shares(_P - 100, 2 * _P + 100, 1000) == [(_P - 100, 0), (_P, 1000), (2 * _P, 0)]
    assert _shares(_P - 100, 2 * _P + 100, 3_000_002) == [(_P - 100, 1), (_P, 3_000_000), (2 * _P, 1)]


def test_a_remainder_goes_to_the_largest_fraction_then_the_earlier_pane():
    # 7 over two equal halves: 3.5 each, the earlier pane takes the odd unit
    assert _shares(_P // 2, _P + _P // 2, 7) == [(_P // 2, 4), (_P, 3)]
    # 5 over twelve equal panes: the first five get one each
    assert [s for _, s in _shares(0, 12 * _P, 5)] == [1] * 5 + [0] * 7


def test_a_share_lies_inside_its_pane():
    for ts, _ in _shares(123, 7 * _P + 9, 10**9):
        assert ts // _P * _P <= ts < ts // _P * _P + _P


def test_counts_past_64_bit_products_stay_exact():
    big = (1 << 62) + 12345
    shares = _shares(0, 10 * 86_400_000_000, big)  # ten days
    assert sum(s for _, s in shares) == big and len(shares) == 2880


flows = st.lists(st.tuples(st.integers(0, 10**12), st.integers(0, 4 * 3_600_000_000), st.integers(0, 10**15),
                           st.integers(0, 10**6)), min_size=1, max_size=20)


@hsettings(max_examples=200, deadline=None)
@given(flows)
def test_shares_match_the_exact_proportions(cases):
    """Against exact fractions: each share is the floor or the ceiling of amount × overlap / duration,
    the shares of a flow add up to it, and their times step through consecutive panes."""
    start = np.array([c[0] for c in cases])
    end = start + np.array([c[1] for c in cases])
    flow, ts, (byte_shares, packet_shares) = apportion_to_panes(
        start, end, [np.array([c[2] for c in cases]), np.array([c[3] for c in cases])])
    for i, (s, length, amount, packets) in enumerate(cases):
        mine = np.flatnonzero(flow == i)
        assert byte_shares[mine].sum() == amount and packet_shares[mine].sum() == packets
        panes = ts[mine] // _P
        assert list(panes) == list(range(panes[0], panes[0] + len(mine)))
        assert ts[mine][0] == s
        for j, at in zip(mine, ts[mine].tolist()):
            if len(mine) == 1:
                assert byte_shares[j] == amount
                continue
            overlap = min(s + length, (at // _P + 1) * _P) - at
            exact = Fraction(amount * overlap, length)
            assert exact - 1 < int(byte_shares[j]) < exact + 1


def test_a_restatement_refuses_a_part_of_a_day_or_month_that_retention_may_have_thinned():
    """Restating rolls each day (month) it touches up again from ``hourly`` (``daily``): only whole ones are
    safe once rows of the period may have expired; without retention, or inside it, any range is."""
    utc = timezone.utc
    w = datetime(2026, 11, 20, 5, tzinfo=utc)
    day, h = datetime(2026, 11, 10, tzinfo=utc), timedelta(hours=1)
    past = P.restatement_past_retention
    assert past(day + 3 * h, day + 5 * h, w, None, None) is None
    assert past(day + 3 * h, day + 5 * h, w, timedelta(days=30), None) is None  # nothing of the day expired yet
    reason = past(day + 3 * h, day + 5 * h, w, timedelta(days=2), None)
    assert reason.startswith("the restatement covers part of the day of 2026-11-10") and "hourly_retention" in reason
    assert past(day, day + 24 * h, w, timedelta(days=2), None) is None  # the whole day
    assert past(day, day + 48 * h, w, timedelta(days=2), None) is None  # whole days
    month = datetime(2026, 10, 1, tzinfo=utc)
    assert "daily_retention" in past(day, day + 24 * h, w, None, timedelta(days=2))  # part of November
    assert past(month, datetime(2026, 11, 1, tzinfo=utc), w, timedelta(days=2), timedelta(days=2)) is None
    assert past(day + 3 * h, day + 5 * h, None, timedelta(days=2), timedelta(days=2)) is None  # nothing ingested
