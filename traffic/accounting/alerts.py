"""Alerts: the quota and commit crossings of each billing period, from final panes, in the ``alerts`` table.

The freeze step (``close.freeze_hours``) calls ``refresh_alerts`` after its hours are checked and
before their ledger rows are written: for every billing period the frozen hours fall in, the
crossings (``traffic.core.alerts``) are recomputed from the period's final panes over its
**published** hours in order — from the period's first hour up to the first hour that is not
published (not frozen yet, or failed: its panes are not published, and evaluating later hours
without them would move a crossing once it is accepted). The rows are checked
(``expectations/alerts.json``) and replace the period's rows in ``alerts`` (keyed by the month
the period starts in). Recomputed, never appended: a rerun, a backfill of the same hours or a
replay computes the same rows, and a crash before the ledger rows leaves the hours unfrozen, so
the rerun freezes them again and rewrites the same alerts. A restatement freezes its hours
again and so recomputes the periods over them.

The bills step recomputes the alerts of the periods it closes too (before their bills): an hour
accepted after it failed (``traffic accept``) lets the evaluation continue past it, and a closed
period has no later freeze to do it.

``traffic alerts`` reads the table (no Spark); the hourly DAG's ``notify_alerts`` sends each row
once (``traffic.orchestration.notify``).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.compute as pc

from traffic.accounting.bills import account_series, billing_cycle, final_panes, hours_of
from traffic.accounting.panes import account_map
from traffic.core.accounts import AccountMap, AccountVersion
from traffic.core.alerts import KINDS, commit_crossing, pane_bytes_over, burst_allowance, quota_crossing
from traffic.core.billing import BillingPeriod, billed_series
from traffic.core.periods import PANE, PUBLISHED, hour_floor, period_end
from traffic.storage import state as st
from traffic.storage.warehouse import Warehouse

UTC = timezone.utc
HOUR = timedelta(hours=1)


def alert_id(kind: str, account: str, period: BillingPeriod) -> str:
    """The stable id of a crossing: at most one per (kind, account, billing period)."""
    key = json.dumps([kind, account, period.start_utc.isoformat(), period.end_utc.isoformat()])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def periods_of_hours(warehouse: Warehouse, hours: list[datetime]) -> list[BillingPeriod]:
    """The billing periods the hours fall in (an hour across a period boundary is in both), in order."""
    cycle = billing_cycle(warehouse.settings)
    found: dict[tuple[datetime, datetime], BillingPeriod] = {}
    for hour in hours:
        for moment in (hour, period_end(hour, "hour") - PANE):
            period = cycle.period_containing(moment)
            found.setdefault((period.start_utc, period.end_utc), period)
    return [found[key] for key in sorted(found)]


def _version_of_hour(mapping: AccountMap, panes_versions: dict[datetime, str], hour: datetime,
                     period: BillingPeriod) -> AccountVersion:
    """The version whose limits apply at an hour: the one its last final pane was attributed with (by id),
    else (an hour without panes, or a version edited since) the one in force at its last pane."""
    version = mapping.by_id(panes_versions.get(hour))
    if version is None:
        version = mapping.version_at(min(period_end(hour, "hour"), period.end_utc) - PANE)
    return version


def evaluate_period(warehouse: Warehouse, period: BillingPeriod, published: set[datetime],
                    first_hour: datetime | None, mapping: AccountMap | None = None) -> list[dict]:
    """The alert rows of one billing period over its published hours in order (see the module docstring)."""
    settings = warehouse.settings
    mapping = account_map(settings) if mapping is None else mapping
    hours = []
    for hour in hours_of(period, first_hour):
        if hour not in published:
            break
        hours.append(hour)
    if not hours or not mapping.has_limits:
        return []
    panes = final_panes(warehouse, period)
    stamp = pa.timestamp("us", tz="UTC")
    panes = panes.filter(pc.less(panes.column("pane_start"), pa.scalar(period_end(hours[-1], "hour"), stamp)))
    last_version: dict[datetime, tuple[datetime, str]] = {}
    for start, version in zip(st.rows(panes.select(["pane_start"])), panes.column("mapping_version").to_pylist()):
        when = start["pane_start"]
        hour = hour_floor(when)
        if hour not in last_version or last_version[hour][0] < when:
            last_version[hour] = (when, version)
    by_hour = {hour: version for hour, (_, version) in last_version.items()}
    versions = {hour: _version_of_hour(mapping, by_hour, hour, period) for hour in hours}
    accounts = sorted({a for v in versions.values() for a in v.limits})
    if not accounts:
        return []
    series = account_series(panes, period)
    history = st.watermark_history(warehouse)
    rows = []
    for account in accounts:
        by_direction = series.get(account, {})
        total = {hour: 0 for hour in hours}
        for values in by_direction.values():
            for index, nbytes in values.items():
                hour = hour_floor(period.start_utc + PANE * index)
                total[hour] = total.get(hour, 0) + nbytes
        inbound, outbound = billed_series(by_direction, settings.billing_unknown_direction)
        quota = quota_crossing((h, total[h], versions[h].limits_of(account).quota_bytes) for h in hours)
        commit = commit_crossing(((h, _of_hour(inbound, period, h), _of_hour(outbound, period, h),
                                   versions[h].limits_of(account).commit_bps) for h in hours),
                                 period.pane_count, settings.billing_rule)
        for kind, crossing in (("quota", quota), ("commit", commit)):
            if crossing is None:
                continue
            version = versions[crossing.hour]
            limits = version.limits_of(account)
            rows.append({
                "alert_id": alert_id(kind, account, period), "kind": kind, "account": account,
                "period": period.label, "period_start": period.start_utc, "period_end": period.end_utc,
                "hour": crossing.hour, "observed": crossing.observed, "threshold": crossing.threshold,
                "unit": crossing.unit, "quota_bytes": limits.quota_bytes if kind == "quota" else None,
                "commit_bps": float(limits.commit_bps) if kind == "commit" else None,
                "observed_bps": crossing.observed_bps, "mapping_version": version.id,
                "billing_rule": settings.billing_rule,
                "billing_unknown_direction": settings.billing_unknown_direction,
                "closed_at_watermark": st.closed_at(history, period_end(crossing.hour, "hour")),
            })
    return rows


def _of_hour(series: dict[int, int], period: BillingPeriod, hour: datetime) -> dict[int, int]:
    """The panes of ``series`` (pane index → bytes) that lie in ``hour``."""
    first = max(0, (hour - period.start_utc) // PANE)
    last = min(period.pane_count, (period_end(hour, "hour") - period.start_utc) // PANE)
    return {i: series[i] for i in range(first, last) if i in series}


def published_hours(warehouse: Warehouse, judged: list[dict] = ()) -> set[datetime]:
    """Published hours: the ledger's, with ``judged`` (ledger rows this run is about to write) in their place."""
    status = {r["period_start"]: r["dq_status"] for r in st.read_ledger(warehouse, "hour", columns=st.LEDGER_STATUS)}
    status.update({r["period_start"]: r["dq_status"] for r in judged if r["grain"] == "hour"})
    return {hour for hour, verdict in status.items() if verdict in PUBLISHED}


def refresh_alerts(warehouse: Warehouse, hours: list[datetime], judged: list[dict], check,
                   periods: list[BillingPeriod] | None = None) -> list[str]:
    """Recompute, check and store the alerts of the billing periods ``hours`` fall in (or of ``periods``);
    the failure messages.

    ``judged``: the hours' ledger rows with their verdicts, not yet written (``check`` is the step's
    ``Validation``). A period whose alerts fail a critical check keeps its stored rows.
    """
    periods = periods_of_hours(warehouse, hours) if periods is None else periods
    if not periods:
        return []
    mapping = account_map(warehouse.settings)
    table = warehouse.table("alerts")
    if not table.exists():
        table.create()  # a warehouse made before alerts existed
    stored = table.read_arrow(keys=[p.start_utc for p in periods])
    if not mapping.has_limits and stored.num_rows == 0:
        return []  # no limits, nothing stored: nothing to compute or write
    first_hour = st.read_clock_state(warehouse).first_hour
    published = published_hours(warehouse, judged)
    fresh = {(p.start_utc, p.end_utc): evaluate_period(warehouse, p, published, first_hour, mapping) for p in periods}
    checked = [(p, fresh[(p.start_utc, p.end_utc)]) for p in periods if fresh[(p.start_utc, p.end_utc)]]
    failures = []  # also found in ``check`` (``close.freeze.raise_alerts``)
    if checked:
        check.validate("alerts", check_frame([row for _, rows in checked for row in rows]),
                       [("alert", p.start_utc) for p, _ in checked], asset="alerts.freeze")
        for period, _ in checked:
            if check.status("alert", period.start_utc)[0] == "failed":
                failures.append(f"alerts {period.label}: " + check.message("alert", period.start_utc))
                fresh.pop((period.start_utc, period.end_utc))
    write_alerts(warehouse, fresh, stored)
    return failures


def write_alerts(warehouse: Warehouse, fresh: dict[tuple[datetime, datetime], list[dict]], stored: pa.Table) -> bool:
    """Replace the stored rows of these periods with ``fresh`` (other periods in the same month keys stay);
    nothing is committed when the rows are the same."""
    table = warehouse.table("alerts")
    keys = sorted({start for start, _ in fresh})
    if not keys:
        return False
    replaced = {table.key_of(k) for k in keys}
    order = (lambda r: (r["period_start"], r["account"], r["kind"]))
    before = sorted((r for r in st.rows(stored) if table.key_of(r["period_start"]) in replaced), key=order)
    kept = [r for r in before if (r["period_start"], r["period_end"]) not in fresh]
    rows = sorted(kept + [r for rows in fresh.values() for r in rows], key=order)
    if rows == before:
        return False  # a rerun: the same rows are stored already
    return table.replace(pa.Table.from_pylist(rows, schema=table.arrow_schema), keys=keys, op="alert")


def check_frame(rows: list[dict]):
    """The alert rows beside what they must agree with, as the pandas frame the ``alerts`` suite checks."""
    import pandas as pd

    records = []
    for row in rows:
        period_end_ = row["period_end"]
        records.append({**row, "grain": "alert", "hour_end": row["hour"] + HOUR,
                        "threshold_expected": _threshold(row), "kind_known": row["kind"] in KINDS,
                        "before_end": row["hour"] < period_end_})
    frame = pd.DataFrame.from_records(records)
    for name in frame.columns:
        if frame[name].dtype.kind in "iu":
            frame[name] = frame[name].astype("Int64")
    for name in ("commit_bps", "observed_bps"):
        frame[name] = frame[name].astype("float64")
    return frame


def _threshold(row: dict) -> int | None:
    """The threshold a row must carry, from its own limit and period (independently of the rules)."""
    if row["kind"] == "quota":
        return row["quota_bytes"]
    if row["kind"] == "commit" and row["commit_bps"] is not None:
        if row["unit"] == "panes":
            panes = (row["period_end"] - row["period_start"]) // PANE
            return burst_allowance(panes) + 1
        return pane_bytes_over(row["commit_bps"])
    return None


def read_alerts(warehouse: Warehouse, period: BillingPeriod | None = None, account: str | None = None,
                latest: int = 2) -> list[dict]:
    """Stored alerts, oldest period first: of ``period`` (else of the ``latest`` periods that have any), of
    one ``account`` or all."""
    table = warehouse.table("alerts")
    if not table.exists():
        return []
    rows = st.rows(table.read_arrow(keys=[period.start_utc] if period else None))
    if period is not None:
        rows = [r for r in rows if (r["period_start"], r["period_end"]) == (period.start_utc, period.end_utc)]
    if account is not None:
        rows = [r for r in rows if r["account"] == account]
    if period is None:
        starts = sorted({r["period_start"] for r in rows})[-latest:]
        rows = [r for r in rows if r["period_start"] in starts]
    return sorted(rows, key=lambda r: (r["period_start"], r["hour"], r["account"], r["kind"]))
