"""Billing: periods in any zone land on panes, the 95th percentile takes exactly rank ceil(0.95·N), bills add up."""

from __future__ import annotations

import random
from datetime import datetime, time, timedelta, timezone

import numpy as np
import pytest

from traffic.core.billing import (
    Bill,
    BillingCycle,
    BillingError,
    BillingPeriod,
    bill_from_series,
    compute_bill,
    p95,
    percentile_rank,
    rate_bps,
)

PANE = timedelta(minutes=5)
LOW, HIGH = 1_000_000, 1_000_000_000


def _utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


def _span(period: BillingPeriod) -> tuple[datetime, datetime, int]:
    return period.start_utc, period.end_utc, period.pane_count


def _burst(n_panes: int, high: int) -> dict[int, int]:
    """``high`` panes at HIGH, the rest at LOW, at shuffled positions (order must not matter)."""
    values = [HIGH] * high + [LOW] * (n_panes - high)
    random.Random(n_panes + high).shuffle(values)
    return dict(enumerate(values))


@pytest.mark.parametrize("n,rank", [
    (1, 1), (19, 19), (20, 19), (21, 20), (100, 95), (101, 96),
    (8064, 7661),   # 28-day February: 7660.8 rounds up
    (8640, 8208),   # 30 days: exactly 8208
    (8928, 8482),   # 31 days: 8481.6 rounds up
    (8652, 8220), (8916, 8471), (8940, 8493),   # DST months, an hour longer or shorter
    (10 ** 18 + 1, 950_000_000_000_000_001),    # a float 0.95·N would give ...000
])
def test_percentile_rank_is_the_exact_ceiling_of_95_percent(n, rank):
    assert percentile_rank(n) == rank


def test_percentile_rank_needs_a_pane():
    with pytest.raises(BillingError, match="needs at least one pane, not 0"):
        percentile_rank(0)


def test_p95_is_the_value_at_rank_8208_of_a_30_day_month():
    # Pane bytes 1..8640 in shuffled panes: the k-th smallest is k, so rank 8207 or 8209 would show.
    values = list(range(1, 8641))
    random.Random(7).shuffle(values)
    result = p95(dict(enumerate(values)), 8640)
    assert (result.rank, result.panes, result.pane_bytes) == (8208, 8640, 8208)
    assert result.bps == 218.88


@pytest.mark.parametrize("n_panes,free", [(8640, 432), (8928, 446), (8064, 403)])
def test_the_busiest_n_minus_rank_panes_are_free_and_one_more_is_billed(n_panes, free):
    # 432 panes of a 30-day month (36 hours) are free. Rank 8207 would bill 432 bursts, rank 8209
    # (or, for 31 days, the floor 8481) would let 433 go free.
    assert p95(_burst(n_panes, free), n_panes).pane_bytes == LOW
    assert p95(_burst(n_panes, free + 1), n_panes).pane_bytes == HIGH


def test_ties_around_the_rank():
    values = {i: 3 for i in range(8000)} | {i: 7 for i in range(8000, 8640)}
    assert p95(values, 8640).pane_bytes == 7
    values = {i: 3 for i in range(8300)} | {i: 7 for i in range(8300, 8640)}
    assert p95(values, 8640).pane_bytes == 3


def test_missing_panes_are_zero():
    # 5% of a 30-day month has traffic: 432 panes, all above the rank, so the 95th percentile is 0.
    assert p95({i * 20: 5_000 + i for i in range(432)}, 8640).pane_bytes == 0
    # One more pane with traffic: the rank reaches the smallest of them.
    assert p95({i * 19: 5_000 + i for i in range(433)}, 8640).pane_bytes == 5_000
    # 500 panes of 1..500: 8140 zeros, so rank 8208 is the 68th smallest traffic pane.
    assert p95({i * 17: i + 1 for i in range(500)}, 8640).pane_bytes == 68
    assert p95({}, 8640).pane_bytes == 0


@pytest.mark.parametrize("values,message", [
    ({8640: 1}, "pane index 8640 is outside 0..8639"),
    ({-1: 1}, "pane index -1 is outside 0..8639"),
    ({3: -5}, r"pane 3 has negative bytes \(-5\)"),
])
def test_p95_refuses_impossible_panes(values, message):
    with pytest.raises(BillingError, match=message):
        p95(values, 8640)


def test_rate_is_bytes_times_8_over_300():
    assert (rate_bps(0), rate_bps(75), rate_bps(3_750_000)) == (0.0, 2.0, 100_000.0)
    assert rate_bps(1) == 8 / 300


@pytest.mark.parametrize("label,start,end,panes", [
    ("2026-02", _utc(2026, 2, 1), _utc(2026, 3, 1), 8064),
    ("2028-02", _utc(2028, 2, 1), _utc(2028, 3, 1), 8352),
    ("2026-09", _utc(2026, 9, 1), _utc(2026, 10, 1), 8640),
    ("2026-12", _utc(2026, 12, 1), _utc(2027, 1, 1), 8928),
])
def test_default_cycle_is_the_utc_calendar_month(label, start, end, panes):
    assert _span(BillingCycle().period_for(label)) == (start, end, panes)


def test_a_cycle_starting_on_the_15th_is_labelled_by_the_month_it_starts_in():
    cycle = BillingCycle(start_day=15)
    assert _span(cycle.period_for("2026-10")) == (_utc(2026, 10, 15), _utc(2026, 11, 15), 8928)
    assert _span(cycle.period_for("2026-12")) == (_utc(2026, 12, 15), _utc(2027, 1, 15), 8928)
    assert cycle.period_containing(_utc(2026, 10, 10)).label == "2026-09"
    assert cycle.period_containing(_utc(2026, 10, 14, 23, 59, 59, 999999)).label == "2026-09"
    assert cycle.period_containing(_utc(2026, 10, 15)).label == "2026-10"
    assert cycle.period_containing(datetime(2026, 11, 14, 23, 55)).label == "2026-10"  # naive is UTC
    berlin = BillingCycle(start_day=15, tz="Europe/Berlin")
    # Oct 15 00:00 CEST → Nov 15 00:00 CET: the October 25 fall-back hour makes it 31 days + 1 hour.
    assert _span(berlin.period_for("2026-10")) == (_utc(2026, 10, 14, 22), _utc(2026, 11, 14, 23), 8940)


@pytest.mark.parametrize("tz,label,start,end,panes", [
    # DST ends Nov 1 2026 (EDT → EST): 30 days + 1 hour.
    ("America/New_York", "2026-11", _utc(2026, 11, 1, 4), _utc(2026, 12, 1, 5), 8652),
    # DST starts Mar 8 2026 (EST → EDT): 31 days − 1 hour.
    ("America/New_York", "2026-03", _utc(2026, 3, 1, 5), _utc(2026, 4, 1, 4), 8916),
    # DST ends Oct 25 2026 (CEST → CET): 31 days + 1 hour.
    ("Europe/Berlin", "2026-10", _utc(2026, 9, 30, 22), _utc(2026, 10, 31, 23), 8940),
    # +05:30, no DST: the same 8928 panes, shifted by half an hour.
    ("Asia/Kolkata", "2026-10", _utc(2026, 9, 30, 18, 30), _utc(2026, 10, 31, 18, 30), 8928),
    # +05:45 still lands on the 5-minute grid.
    ("Asia/Kathmandu", "2026-10", _utc(2026, 9, 30, 18, 15), _utc(2026, 10, 31, 18, 15), 8928),
    # +09:30 → +10:30 on Oct 4 2026: 31 days − 1 hour, boundaries on half hours.
    ("Australia/Adelaide", "2026-10", _utc(2026, 9, 30, 14, 30), _utc(2026, 10, 31, 13, 30), 8916),
    # +10:30 → +09:30 on Apr 5 2026: 30 days + 1 hour.
    ("Australia/Adelaide", "2026-04", _utc(2026, 3, 31, 13, 30), _utc(2026, 4, 30, 14, 30), 8652),
])
def test_periods_follow_the_zone_and_its_dst(tz, label, start, end, panes):
    assert _span(BillingCycle(tz=tz).period_for(label)) == (start, end, panes)


@pytest.mark.parametrize("tz", ["UTC", "America/New_York", "Europe/Berlin", "Asia/Kolkata", "Australia/Adelaide"])
def test_periods_tile_the_year_without_gap_or_overlap(tz):
    cycle = BillingCycle(start_day=3, tz=tz)
    periods = [cycle.period_for(f"2026-{month:02d}") for month in range(1, 13)]
    assert all(a.end_utc == b.start_utc for a, b in zip(periods, periods[1:]))
    # 365 days: the spring and autumn DST hours cancel out over a year.
    assert sum(p.pane_count for p in periods) == 365 * 288


def test_period_containing_in_a_zone_uses_utc_instants():
    new_york = BillingCycle(tz="America/New_York")
    assert new_york.period_containing(_utc(2026, 11, 1, 3, 59, 59)).label == "2026-10"
    assert new_york.period_containing(_utc(2026, 11, 1, 4)).label == "2026-11"
    kolkata = BillingCycle(tz="Asia/Kolkata")
    assert kolkata.period_containing(_utc(2026, 9, 30, 18, 25)).label == "2026-09"
    assert kolkata.period_containing(_utc(2026, 9, 30, 18, 30)).label == "2026-10"


def test_a_start_time_in_a_dst_gap_or_fold_resolves_as_zoneinfo_fold_0():
    # Mar 8 2026 02:30 does not exist in New York: read with the offset before the change (EST).
    gap = BillingCycle(start_day=8, tz="America/New_York", start_time=time(2, 30)).period_for("2026-03")
    assert gap.start_utc == _utc(2026, 3, 8, 7, 30)
    # Nov 1 2026 01:30 happens twice: the first time (EDT).
    fold = BillingCycle(tz="America/New_York", start_time=time(1, 30)).period_for("2026-11")
    assert fold.start_utc == _utc(2026, 11, 1, 5, 30)


@pytest.mark.parametrize("cycle,label,message", [
    (BillingCycle(tz="Africa/Monrovia"), "1970-01",
     "billing period 1970-01: start_utc 1970-01-01T00:44:30+00:00 is not on a 5-minute UTC pane boundary, "
     "so it cannot be billed exactly from panes"),
    (BillingCycle(start_time=time(0, 2)), "2026-10",
     "billing period 2026-10: start_utc 2026-10-01T00:02:00+00:00 is not on a 5-minute UTC pane boundary, "
     "so it cannot be billed exactly from panes"),
    (BillingCycle(), "2026-13", "billing period '2026-13' is not YYYY-MM (the month the period starts in)"),
    (BillingCycle(), "2026-1", "billing period '2026-1' is not YYYY-MM (the month the period starts in)"),
    (BillingCycle(), "October", "billing period 'October' is not YYYY-MM (the month the period starts in)"),
])
def test_periods_that_cannot_be_billed_exactly_are_refused(cycle, label, message):
    with pytest.raises(BillingError) as error:
        cycle.period_for(label)
    assert str(error.value) == message


@pytest.mark.parametrize("kwargs,message", [
    ({"start_day": 0}, "billing start_day: 0 is not a day 1–28 (every month has it)"),
    ({"start_day": 29}, "billing start_day: 29 is not a day 1–28 (every month has it)"),
    ({"start_day": "1"}, "billing start_day: '1' is not a day 1–28 (every month has it)"),
    ({"tz": "Mars/Olympus"},
     "billing tz: 'Mars/Olympus' is not an IANA time zone (e.g. UTC, Europe/Berlin, Asia/Kolkata)"),
    ({"tz": "America"}, "billing tz: 'America' is not an IANA time zone (e.g. UTC, Europe/Berlin, Asia/Kolkata)"),
    ({"start_time": time(0, tzinfo=timezone.utc)},
     "billing start_time: datetime.time(0, 0, tzinfo=datetime.timezone.utc) must be a wall-clock time "
     "without a zone (the zone is tz)"),
])
def test_cycle_settings_are_validated(kwargs, message):
    with pytest.raises(BillingError) as error:
        BillingCycle(**kwargs)
    assert str(error.value) == message


def test_a_period_must_end_after_it_starts():
    with pytest.raises(BillingError, match="billing period x: end 2026-10-01T00:00:00\\+00:00 is not after start"):
        BillingPeriod("x", _utc(2026, 10, 1), _utc(2026, 10, 1))


SEPTEMBER = BillingCycle().period_for("2026-09")   # 8640 panes, rank 8208: the busiest 432 are free


def _mixed_panes():
    """500 panes with in 1500 (from two sources), out 3000, unknown 750; a little internal and transit."""
    rows = []
    for index in range(500):
        start = SEPTEMBER.start_utc + index * PANE
        rows += [(start, "in", 600), (start, "in", np.int64(900)), (start, "out", 3000), (start, None, 750)]
    rows += [(SEPTEMBER.start_utc, "internal", 7), (SEPTEMBER.start_utc + PANE, "transit", 11)]
    random.Random(3).shuffle(rows)
    return rows


def test_a_bill_in_full():
    bill = compute_bill(_mixed_panes(), SEPTEMBER, "acme", mapping_versions=["v1@0123456789"])
    assert bill == Bill(
        account="acme", period="2026-09", period_start=_utc(2026, 9, 1), period_end=_utc(2026, 10, 1),
        panes=8640, rule="max", unknown_direction="in",
        bytes_in=750_000, bytes_out=1_500_000, bytes_internal=7, bytes_transit=11, bytes_unknown=375_000,
        bytes_total=2_625_018,
        p95_rank=8208, p95_in_pane_bytes=2250, p95_out_pane_bytes=3000, billable_pane_bytes=3000,
        p95_in_bps=60.0, p95_out_bps=80.0, billable_bps=80.0,
        mapping_versions=("v1@0123456789",),
    )


@pytest.mark.parametrize("unknown_direction,rule,p95_in,p95_out,billable", [
    ("in", "max", 2250, 3000, 3000),
    ("in", "sum", 2250, 3000, 5250),
    ("out", "max", 1500, 3750, 3750),
    ("out", "sum", 1500, 3750, 5250),
    ("both", "max", 2250, 3750, 3750),
    ("ignore", "max", 1500, 3000, 3000),
    ("ignore", "sum", 1500, 3000, 4500),
])
def test_unknown_direction_enters_the_rate_series_as_configured(unknown_direction, rule, p95_in, p95_out, billable):
    bill = compute_bill(_mixed_panes(), SEPTEMBER, "acme", rule=rule, unknown_direction=unknown_direction)
    assert (bill.p95_in_pane_bytes, bill.p95_out_pane_bytes, bill.billable_pane_bytes) == (p95_in, p95_out, billable)
    assert bill.billable_bps == billable * 8 / 300
    # Volumes are measured, whatever the setting: unknown bytes are always in the total.
    assert (bill.bytes_in, bill.bytes_out, bill.bytes_unknown, bill.bytes_total) == (750_000, 1_500_000, 375_000,
                                                                                     2_625_018)


def test_a_feed_without_directions_bills_the_percentile_of_its_total():
    rows = [(SEPTEMBER.start_utc + i * PANE, None, 750 + i) for i in range(500)]
    # 8140 empty panes, so rank 8208 is the 68th smallest of 750..1249.
    for rule in ("max", "sum"):
        bill = compute_bill(rows, SEPTEMBER, "router-only", rule=rule)
        assert (bill.p95_in_pane_bytes, bill.p95_out_pane_bytes, bill.billable_pane_bytes) == (817, 0, 817)
        assert (bill.bytes_in, bill.bytes_unknown, bill.bytes_total) == (0, sum(range(750, 1250)),
                                                                         sum(range(750, 1250)))


def test_sources_are_summed_per_pane_before_the_percentile():
    # 433 panes carrying 600 from each of two sources: 433 panes of 1200, one more than the free 432.
    rows = [(SEPTEMBER.start_utc + i * PANE, "in", 600) for i in range(433) for _source in range(2)]
    bill = compute_bill(rows, SEPTEMBER, "acme")
    assert (bill.p95_in_pane_bytes, bill.bytes_in) == (1200, 433 * 1200)


def test_a_half_hour_zone_bills_from_its_own_first_pane():
    period = BillingCycle(tz="Asia/Kolkata").period_for("2026-10")
    rows = [(period.start_utc + i * PANE, "out", 75) for i in range(447)]
    bill = compute_bill(rows, period, "acme")
    # 8928 panes, rank 8482: 446 are free, so 447 busy panes put the percentile on one.
    assert (bill.panes, bill.p95_rank, bill.p95_out_pane_bytes, bill.p95_out_bps) == (8928, 8482, 75, 2.0)
    with pytest.raises(BillingError) as error:
        compute_bill([(_utc(2026, 9, 30, 18, 25), "out", 75)], period, "acme")
    assert str(error.value) == ("pane 2026-09-30T18:25:00+00:00 is outside billing period 2026-10 "
                                "[2026-09-30T18:30:00+00:00, 2026-10-31T18:30:00+00:00)")


@pytest.mark.parametrize("rows,kwargs,message", [
    ([], {"rule": "average"}, "billing rule 'average' is not one of max, sum"),
    ([], {"unknown_direction": "guess"}, "unknown_direction 'guess' is not one of in, out, both, ignore"),
    ([], {"rule": "sum", "unknown_direction": "both"},
     "unknown_direction 'both' with rule 'sum' would count unknown traffic twice; use 'in' or 'out'"),
    ([(_utc(2026, 9, 1), "sideways", 1)], {},
     "pane 2026-09-01 00:00:00+00:00: direction 'sideways' is not in/out/internal/transit/null"),
    ([(_utc(2026, 9, 1), "in", -1)], {}, "pane 2026-09-01 00:00:00+00:00: bytes -1 is not a whole number of bytes"),
    ([(_utc(2026, 9, 1), "in", 2.5)], {}, "pane 2026-09-01 00:00:00+00:00: bytes 2.5 is not a whole number of bytes"),
    ([(_utc(2026, 9, 1, 0, 1), "in", 1)], {}, "pane 2026-09-01T00:01:00+00:00 does not start on a 5-minute UTC "
                                              "boundary"),
    ([(_utc(2026, 10, 1), "in", 1)], {}, "pane 2026-10-01T00:00:00+00:00 is outside billing period 2026-09 "
                                         "[2026-09-01T00:00:00+00:00, 2026-10-01T00:00:00+00:00)"),
])
def test_compute_bill_refuses_what_it_cannot_bill(rows, kwargs, message):
    with pytest.raises(BillingError) as error:
        compute_bill(rows, SEPTEMBER, "acme", **kwargs)
    assert str(error.value) == message


def _pane_table(rows: list[tuple]) -> "pa.Table":
    import pyarrow as pa

    return pa.table({"pane_start": pa.array([r[0] for r in rows], pa.timestamp("us", tz="UTC")),
                     "account": pa.array([r[1] for r in rows], pa.string()),
                     "direction": pa.array([r[2] for r in rows], pa.string()),
                     "bytes": pa.array([r[3] for r in rows], pa.int64()),
                     "mapping_version": pa.array(["v1"] * len(rows), pa.string())})


def test_account_series_in_arrow_equals_the_row_by_row_series():
    """The bills of a period are summed in Arrow (``bills.account_series``); they must equal
    ``pane_series`` of each account's rows: repeated panes added, unknown directions kept apart,
    an account that is null (a damaged pane) billed on its own."""
    from traffic.accounting.bills import account_series
    from traffic.core.billing import pane_series

    rng = random.Random(7)
    accounts, directions = ["acme", "beta", None], ["in", "out", "internal", "transit", None]
    rows = [(SEPTEMBER.start_utc + PANE * rng.randrange(SEPTEMBER.pane_count), rng.choice(accounts),
             rng.choice(directions), rng.randrange(0, 10**12)) for _ in range(20_000)]
    rows += rows[:500]  # the same pane, account and direction twice (two sources)
    got = account_series(_pane_table(rows), SEPTEMBER)
    assert set(got) == set(accounts)
    for account in accounts:
        want = pane_series([(t, d, b) for t, a, d, b in rows if a == account], SEPTEMBER)
        assert {d: dict(v) for d, v in got[account].items()} == {d: dict(v) for d, v in want.items()}
        assert compute_bill([(t, d, b) for t, a, d, b in rows if a == account], SEPTEMBER, "x", rule="sum") == \
            bill_from_series(got[account], SEPTEMBER, "x", rule="sum")
    assert account_series(_pane_table([]), SEPTEMBER) == {}


@pytest.mark.parametrize("row,message", [
    ((_utc(2026, 9, 1, 0, 1), "acme", "in", 1), "pane 2026-09-01T00:01:00+00:00 does not start on a 5-minute UTC "
                                                "boundary"),
    ((_utc(2026, 10, 1), "acme", "in", 1), "pane 2026-10-01T00:00:00+00:00 is outside billing period 2026-09 "
                                           "[2026-09-01T00:00:00+00:00, 2026-10-01T00:00:00+00:00)"),
    ((_utc(2026, 8, 31, 23, 55), "acme", "in", 1), "pane 2026-08-31T23:55:00+00:00 is outside billing period "
                                                   "2026-09 [2026-09-01T00:00:00+00:00, 2026-10-01T00:00:00+00:00)"),
    ((_utc(2026, 9, 1), "acme", "sideways", 1),
     "pane 2026-09-01 00:00:00+00:00: direction 'sideways' is not in/out/internal/transit/null"),
    ((_utc(2026, 9, 1), "acme", "in", -1), "pane 2026-09-01 00:00:00+00:00: bytes -1 is not a whole number of bytes"),
])
def test_account_series_refuses_what_the_row_by_row_series_refuses(row, message):
    from traffic.accounting.bills import account_series

    good = (_utc(2026, 9, 2), "acme", "out", 5)
    with pytest.raises(BillingError) as error:
        account_series(_pane_table([good, row]), SEPTEMBER)
    assert str(error.value) == message
