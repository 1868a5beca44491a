"""Alert rules: when an account's final panes cross its quota or its committed rate (pure, no I/O).

Both rules read a billing period's hours **in hour order**, each hour with the account's final
traffic in it and the limit in force at it, and answer with the first hour at whose end the limit
is crossed (or None). Fed the same final panes they give the same hour, however often and
whenever they run, and adding later hours never moves an earlier crossing: so an alert is raised
once per (kind, account, billing period), and a rerun, a backfill or a replay raises the same one.

* **quota**: the first hour at whose end the account's cumulative ``bytes_total`` in the period
  reaches ``quota_bytes`` (reaching it exactly counts).
* **commit**: the first hour at whose end the period's bill is certain to exceed ``commit_bps``:
  the bill computed from the panes so far, every later pane counted as 0, is a lower bound of the
  final one (an order statistic never falls when a pane grows), so once it exceeds the commit
  the final bill will too. For rule ``max`` that is: in one direction more panes are over the
  commit than the period's burst allowance (its pane count minus the 95th-percentile rank, 432
  of a 30-day month) — the observed value is that pane count, the threshold the allowance + 1.
  For rule ``sum`` (p95 in + p95 out, not a percentile of one series) the observed value is the
  provisional billable pane's bytes, the threshold the least pane bytes whose rate exceeds the
  commit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from typing import Iterable, Mapping

from traffic.core.billing import PANE_SECONDS, p95, percentile_rank, rate_bps

KINDS = ("quota", "commit")
UNITS = ("bytes", "panes", "pane_bytes")


@dataclass(frozen=True)
class Crossing:
    """Where a limit was crossed: the hour, what was observed there and the threshold it reached."""

    hour: datetime
    observed: int
    threshold: int
    unit: str
    observed_bps: float | None = None


def quota_crossing(hours: Iterable[tuple[datetime, int, int | None]]) -> Crossing | None:
    """The first hour at whose end the cumulative bytes reach the quota in force at that hour.

    ``hours``: ``(hour, bytes of the account in the hour, quota_bytes in force or None)`` in hour order,
    from the period's first hour.
    """
    total = 0
    for hour, nbytes, quota in hours:
        total += nbytes
        if quota is not None and total >= quota:
            return Crossing(hour, total, quota, "bytes")
    return None


def pane_bytes_over(commit_bps: float | int) -> int:
    """The least bytes a pane needs for its rate (``bytes·8/300``) to exceed ``commit_bps``, exactly."""
    return math.floor(Fraction(commit_bps) * PANE_SECONDS / 8) + 1


def burst_allowance(n_panes: int) -> int:
    """Panes of a period that may exceed a rate without its 95th percentile doing so: ``N − ceil(0.95·N)``."""
    return n_panes - percentile_rank(n_panes)


def commit_crossing(hours: Iterable[tuple[datetime, Mapping[int, int], Mapping[int, int], float | int | None]],
                    n_panes: int, rule: str = "max") -> Crossing | None:
    """The first hour at whose end the period's bill is certain to exceed the commit in force at that hour.

    ``hours``: ``(hour, inbound, outbound, commit_bps or None)`` in hour order, where ``inbound`` and
    ``outbound`` are the billed series (``billing.billed_series``) of that hour's panes only, as
    {pane index in the period: bytes}; ``n_panes`` is the period's pane count.
    """
    inbound: dict[int, int] = {}
    outbound: dict[int, int] = {}
    allowance = burst_allowance(n_panes)
    counted_for: int | None = None  # the pane-bytes bound the counts below are of
    over = {"in": 0, "out": 0}
    for hour, hour_in, hour_out, commit in hours:
        fresh = []
        for series, direction, new in ((inbound, "in", hour_in), (outbound, "out", hour_out)):
            for index, value in new.items():
                before = series.get(index, 0)
                series[index] = before + value
                fresh.append((direction, before, before + value))
        if commit is None:
            counted_for = None  # the counts miss this hour's panes: count afresh at the next commit
            continue
        bound = pane_bytes_over(commit)
        if rule == "max":
            if bound != counted_for:  # a new commit (or the first): count afresh
                over = {"in": sum(1 for v in inbound.values() if v >= bound),
                        "out": sum(1 for v in outbound.values() if v >= bound)}
                counted_for = bound
            else:
                for direction, before, after in fresh:
                    over[direction] += (after >= bound) - (before >= bound)
            observed = max(over.values())
            if observed > allowance:
                billable = max(p95(inbound, n_panes).pane_bytes, p95(outbound, n_panes).pane_bytes)
                return Crossing(hour, observed, allowance + 1, "panes", rate_bps(billable))
        else:
            billable = p95(inbound, n_panes).pane_bytes + p95(outbound, n_panes).pane_bytes
            if billable >= bound:
                return Crossing(hour, billable, bound, "pane_bytes", rate_bps(billable))
    return None


def overage_bps(billable_bps: float, commit_bps: float | int | None) -> float | None:
    """The billable rate above the commit (0 when within it); None when the account has no commit."""
    if commit_bps is None:
        return None
    return max(0.0, billable_bps - float(commit_bps))
