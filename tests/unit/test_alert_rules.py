"""The alert rules on inline cases (quota, commit, overage) and the accounts file's limits."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tests.support.accounts import V1
from traffic.core.accounts import AccountsError, Limits, parse_accounts
from traffic.core.alerts import (Crossing, burst_allowance, commit_crossing, overage_bps, pane_bytes_over,
                                 quota_crossing)
from traffic.core.billing import compute_bill, BillingPeriod

UTC = timezone.utc
H0 = datetime(2026, 10, 1, tzinfo=UTC)


def _h(n: int) -> datetime:
    return H0 + timedelta(hours=n)


# -- quota -----------------------------------------------------------------------------------------

def test_quota_reached_exactly_counts_and_the_first_hour_wins():
    hours = [(_h(0), 40, 100), (_h(1), 60, 100), (_h(2), 500, 100)]
    assert quota_crossing(hours) == Crossing(_h(1), 100, 100, "bytes")


def test_quota_one_byte_short_is_no_crossing():
    assert quota_crossing([(_h(0), 40, 100), (_h(1), 59, 100)]) is None


def test_quota_without_a_limit_in_force_is_not_evaluated_but_bytes_still_count():
    # Hours 0-1 under a version without a quota; from hour 2 a quota of 150 applies to the period's total.
    hours = [(_h(0), 100, None), (_h(1), 100, None), (_h(2), 0, 150)]
    assert quota_crossing(hours) == Crossing(_h(2), 200, 150, "bytes")


def test_quota_crossing_does_not_move_when_later_hours_are_added():
    first = [(_h(0), 70, 100), (_h(1), 30, 100)]
    assert quota_crossing(first) == quota_crossing(first + [(_h(2), 999, 100)])


# -- commit ----------------------------------------------------------------------------------------

def test_pane_bytes_over_is_the_least_pane_above_the_rate():
    # 8 bits/s over a 300 s pane is 300 bytes: 300 bytes is exactly the commit, 301 is over it.
    assert pane_bytes_over(8) == 301
    assert pane_bytes_over(8.5) == 319  # 318.75 bytes is the commit
    assert 301 * 8 / 300 > 8 and not 300 * 8 / 300 > 8


def test_burst_allowance_is_panes_minus_the_percentile_rank():
    assert burst_allowance(8640) == 432  # a 30-day month: 36 hours
    assert burst_allowance(24) == 1  # rank ceil(22.8) = 23
    assert burst_allowance(20) == 1


def _pane_hours(values_in: list[int], values_out: list[int] | None = None, commit=8, per_hour=4):
    """Hours of ``per_hour`` panes: (hour, inbound, outbound, commit) with pane i in hour i // per_hour."""
    values_out = values_out or [0] * len(values_in)
    hours = []
    for h in range(len(values_in) // per_hour):
        span = range(h * per_hour, (h + 1) * per_hour)
        hours.append((_h(h), {i: values_in[i] for i in span if values_in[i]},
                      {i: values_out[i] for i in span if values_out[i]}, commit))
    return hours


def test_commit_one_pane_over_the_allowance_and_not_before():
    # 24 panes, allowance 1: the second pane over the commit (301 bytes ≥ 301) crosses, the first does not.
    values = [0] * 24
    values[1] = 301  # hour 0: one pane over = the allowance
    values[6] = 300  # hour 1: exactly the commit is not over it
    values[9] = 5000  # hour 2: the second pane over
    crossing = commit_crossing(_pane_hours(values), 24)
    assert (crossing.hour, crossing.observed, crossing.threshold, crossing.unit) == (_h(2), 2, 2, "panes")
    # From then on the final 95th percentile exceeds the commit, whatever the later panes.
    period = BillingPeriod("x", H0, H0 + timedelta(minutes=5 * 24))
    bill = compute_bill([(H0 + timedelta(minutes=5 * i), "in", v) for i, v in enumerate(values) if v], period, "a")
    assert bill.billable_bps > 8
    assert crossing.observed_bps == bill.billable_bps  # every later pane is 0 here: the bound is the bill
    values[9] = 0
    assert commit_crossing(_pane_hours(values), 24) is None  # one pane over: within the allowance
    assert compute_bill([(H0 + timedelta(minutes=5 * i), "in", v) for i, v in enumerate(values) if v],
                        period, "a").billable_bps <= 8


def test_commit_rule_max_counts_each_direction_not_the_larger_of_each_pane():
    # One pane over inbound, another over outbound: each direction within its allowance of 1, so the
    # bill (max of the two percentiles) stays within the commit. Counting max(in, out) per pane would fire.
    values_in, values_out = [0] * 24, [0] * 24
    values_in[2], values_out[7] = 1000, 1000
    assert commit_crossing(_pane_hours(values_in, values_out), 24, "max") is None
    values_out[13] = 1000  # a second outbound pane over: now the outbound percentile is over
    assert commit_crossing(_pane_hours(values_in, values_out), 24, "max").hour == _h(3)


def test_commit_rule_sum_adds_the_percentiles():
    # Two panes of 200 bytes in each direction: each percentile is 200 bytes (5.33 bit/s, under 8), the
    # sum 400 bytes (10.67 bit/s) is over the commit of 8 bit/s: 301 pane bytes.
    values_in, values_out = [0] * 24, [0] * 24
    values_in[0] = values_in[5] = 200
    values_out[1] = values_out[6] = 200
    crossing = commit_crossing(_pane_hours(values_in, values_out), 24, "sum")
    assert (crossing.hour, crossing.observed, crossing.threshold, crossing.unit) == (_h(1), 400, 301, "pane_bytes")
    assert commit_crossing(_pane_hours(values_in, values_out), 24, "max") is None


def test_commit_changed_by_a_later_version_is_counted_afresh():
    values = [0] * 24
    values[0] = values[1] = 400  # over 8 bit/s (301), under 16 bit/s (601)
    hours = _pane_hours(values, commit=16)
    assert commit_crossing(hours, 24) is None
    later = hours[:1] + [(hour, i, o, 8) for hour, i, o, _ in hours[1:]]  # from hour 1 the commit is 8
    assert commit_crossing(later, 24).hour == _h(1)
    skipped = [(hours[0][0], hours[0][1], hours[0][2], None)] + later[1:]
    assert commit_crossing(skipped, 24).hour == _h(1)


def test_overage_is_the_billable_rate_above_the_commit():
    assert overage_bps(150.0, 100) == 50.0
    assert overage_bps(90.0, 100) == 0.0
    assert overage_bps(90.0, None) is None


# -- limits in the accounts file --------------------------------------------------------------------

BASE = V1


def test_limits_are_parsed_per_account_and_change_the_id_only_when_present():
    plain = parse_accounts(BASE).versions[0]
    assert plain.id == "v1@cd8d933a4a"  # the id it had before limits existed
    limited = parse_accounts(BASE + "\n[version.limits.acme]\nquota_bytes = 5_000_000_000_000\n"
                                    "commit_bps = 100_000_000\n[version.limits.globex]\ncommit_bps = 2.5e6\n")
    version = limited.versions[0]
    assert version.limits == {"acme": Limits(5_000_000_000_000, 100_000_000), "globex": Limits(None, 2.5e6)}
    assert version.limits_of("acme").quota_bytes == 5_000_000_000_000
    assert version.limits_of("unassigned") == Limits()
    assert version.id != plain.id and version.id.startswith("v1@")
    other = parse_accounts(BASE + "\n[version.limits.acme]\nquota_bytes = 5_000_000_000_001\n").versions[0]
    assert other.id not in (plain.id, version.id)
    assert limited.has_limits and not parse_accounts(BASE).has_limits
    assert limited.by_id(version.id) is version and limited.by_id(plain.id) is None


@pytest.mark.parametrize("extra, line, message", [
    ("[version.limits.acme]\nquota_bytes = -5\n", 11, "quota_bytes = -5 is not a positive whole number of bytes"),
    ("[version.limits.acme]\nquota_bytes = 1.5\n", 11, "quota_bytes = 1.5 is not a positive whole number"),
    ("[version.limits.acme]\ncommit_bps = 0\n", 11, "commit_bps = 0 is not a positive number of bits/s"),
    ("[version.limits.acme]\ncommit_bps = true\n", 11, "commit_bps = True is not a positive number"),
    ("[version.limits.acme]\ncommit_bps = \"1G\"\n", 11, "commit_bps = '1G' is not a positive number"),
    ("[version.limits.acme]\nquota = 5\n", 11, "unknown key 'quota' (known: quota_bytes, commit_bps)"),
    ("[version.limits.initech]\nquota_bytes = 5\n", 10, "limits of account 'initech': the account is not in this "
                                                         "version's [version.accounts]"),
    ("[version.limits.globex]\ncommit_bps = 1\n\n[version.limits.acme]\ncommit_bps = -1\n", 14,
     "limits of account 'acme': commit_bps = -1"),
])
def test_bad_limits_name_file_line_and_entry(extra, line, message):
    with pytest.raises(AccountsError) as error:
        parse_accounts(BASE + "\n" + extra, "accounts.toml")
    text = str(error.value)
    assert text.startswith(f"accounts.toml:{line}: version 1 (v1), limits of account "), text
    assert message in text, text


def test_an_empty_limits_table_is_an_error():
    with pytest.raises(AccountsError, match="give quota_bytes and/or commit_bps"):
        parse_accounts(BASE + "\n[version.limits.acme]\n", "accounts.toml")
