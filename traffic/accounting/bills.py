"""Bills from the ``panes`` table: ``traffic bill``, and the ``bills`` table written when a period closes.

A billing period (``traffic.core.billing``: cycle day, time zone) is **closed** when every hour it
overlaps, from the first hour on, is frozen and published — the same rule as a day's roll-up.
Only then are its bills final: ``close`` (its freeze step) computes them from the period's final
panes, checks them, and stores them in ``bills``, replacing the period's key (the month of its
start) so a rerun writes the same rows. A stored bill is not recomputed by later closes. Before
that, ``traffic bill`` reports the bill from the final panes so far, marked provisional, and
stores nothing.

Bills are computed on the driver from Arrow reads (a month of panes is small), so neither
``traffic bill`` nor the bill step needs Spark. Every sum goes through ``parts.group_sums``
(DESIGN §7a: all sums are overflow-checked): Arrow's own sum wraps silently, so a total that
would pass 2**63 − 1 stops the bill with one line (``SumOverflow``) instead of billing a wrapped,
negative number.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from traffic.storage import state as st
from traffic.core.accounts import load_accounts
from traffic.core.billing import (
    DIRECTIONS,
    PANE_SECONDS,
    Bill,
    BillingCycle,
    BillingError,
    BillingPeriod,
    bill_from_series,
    check_rule,
    pane_series,
)
from traffic.core.periods import PANE, PUBLISHED, hour_ceil, hour_floor, hours_between, month_start, next_month
from traffic.storage.warehouse import Warehouse
from traffic.accounting.panes import account_map
from traffic.accounting.parts import group_sums
from traffic.core.alerts import overage_bps
from traffic.core.billing import percentile_rank

UTC = timezone.utc


def billing_cycle(settings) -> BillingCycle:
    """The cycle the settings describe (periods start on ``billing_cycle_day`` in ``billing_timezone``)."""
    return BillingCycle(start_day=settings.billing_cycle_day, tz=settings.billing_timezone)


def hours_of(period: BillingPeriod, first_hour: datetime | None) -> list[datetime]:
    """The hours a period needs frozen: every hour it overlaps, from the first hour on."""
    if first_hour is None:
        return []
    return hours_between(max(hour_floor(period.start_utc), first_hour), hour_ceil(period.end_utc))


def _published_hours(warehouse: Warehouse, period: BillingPeriod) -> set[datetime]:
    start = month_start(period.start_utc)
    months, month = [], start
    while month < hour_ceil(period.end_utc):
        months.append(month)
        month = next_month(month)
    ledger = st.read_ledger(warehouse, "hour", keys=months, columns=st.LEDGER_STATUS)
    return {r["period_start"] for r in ledger if r["dq_status"] in PUBLISHED}


@dataclass
class PeriodBills:
    """The bills of one period, and whether they are final (every hour of the period frozen and published)."""

    period: BillingPeriod
    bills: list[Bill]
    final: bool
    hours_needed: int
    hours_final: int
    stored: bool = False
    settings: dict = field(default_factory=dict)


def _period_state(warehouse: Warehouse, period: BillingPeriod) -> tuple[bool, int, int]:
    first_hour = st.read_clock_state(warehouse).first_hour
    needed = hours_of(period, first_hour)
    if not needed or first_hour >= period.end_utc:
        return False, len(needed), 0  # nothing ingested in or before it yet: nothing can be final
    published = _published_hours(warehouse, period)
    done = sum(1 for h in needed if h in published)
    return done == len(needed), len(needed), done


#: The columns of ``panes`` a bill is computed from.
BILL_COLUMNS = ["pane_start", "account", "direction", "bytes", "mapping_version"]


def read_final_panes(warehouse: Warehouse, start: datetime | None = None, end: datetime | None = None) -> pa.Table:
    """The final pane rows (``BILL_COLUMNS``) of the hours from ``start`` to ``end`` (exclusive)."""
    return warehouse.table("panes").read_arrow(key_min=start, key_max=end, columns=BILL_COLUMNS,
                                               filter=pc.field("status") == "final")


def final_panes(warehouse: Warehouse, period: BillingPeriod, rows: pa.Table | None = None) -> pa.Table:
    """The period's final panes, summed over sources: pane_start, account, direction, bytes, mapping_version.

    ``rows`` are final pane rows already read that cover the period (``read_final_panes``); without
    them, the period's hours are read.
    """
    if rows is None:
        rows = read_final_panes(warehouse, hour_floor(period.start_utc), hour_ceil(period.end_utc))
    stamp = pa.timestamp("us", tz="UTC")
    start, end = pa.scalar(period.start_utc, stamp), pa.scalar(period.end_utc, stamp)
    when = rows.column("pane_start")
    rows = rows.filter(pc.and_(pc.greater_equal(when, start), pc.less(when, end)))
    return group_sums(rows, ["pane_start", "account", "direction", "mapping_version"], {"bytes": ("bytes", "sum")})


def account_series(panes: pa.Table, period: BillingPeriod) -> dict[str | None, dict[str | None, dict[int, int]]]:
    """Per account, ``billing.pane_series`` of its rows of ``panes`` (pane_start, account, direction, bytes).

    Summed in Arrow: a month of panes is ~9,000 rows per account, and turning each into Python objects
    made every report slower as the month went on. A table holding a row ``pane_series`` refuses (off
    the period's grid, unknown direction, bytes not a count) goes to it row by row, so the error is
    the same and names the row.
    """
    if panes.num_rows == 0:
        return {}
    pane_us = PANE_SECONDS * 1_000_000
    start_us = int(period.start_utc.timestamp()) * 1_000_000
    when = panes.column("pane_start").cast(pa.timestamp("us", tz="UTC"))
    valid = (when.null_count == 0 and panes.column("bytes").null_count == 0
             and pc.all(pc.greater_equal(panes.column("bytes"), 0)).as_py()
             and pc.all(pc.or_kleene(pc.is_null(panes.column("direction")), pc.is_in(
                 panes.column("direction"), value_set=pa.array([d for d in DIRECTIONS if d is not None])))).as_py())
    offset = when.cast(pa.int64()).to_numpy() - start_us if valid else None
    if offset is None or not ((offset >= 0) & (offset < period.pane_count * pane_us) & (offset % pane_us == 0)).all():
        rows: dict[str | None, list[tuple]] = {}
        for row in st.rows(panes.select(["pane_start", "account", "direction", "bytes"])):
            rows.setdefault(row["account"], []).append((row["pane_start"], row["direction"], row["bytes"]))
        return {account: pane_series(items, period) for account, items in rows.items()}  # raises, naming the row
    sums = group_sums(pa.table({"account": panes.column("account"), "direction": panes.column("direction"),
                                "index": pa.array(offset // pane_us), "bytes": panes.column("bytes")}),
                      ["account", "direction", "index"], {"bytes": ("bytes", "sum")})
    series: dict[str | None, dict[str | None, dict[int, int]]] = {}
    for account, direction, index, nbytes in zip(*(sums.column(c).to_pylist()
                                                   for c in ("account", "direction", "index", "bytes"))):
        series.setdefault(account, {d: {} for d in DIRECTIONS})[direction][index] = nbytes
    return series


def compute_period(warehouse: Warehouse, label: str, account: str | None = None,
                   panes: pa.Table | None = None) -> PeriodBills:
    """The bills of period ``label`` (all accounts, or one) from final panes, and whether they are final.

    ``panes`` is the period's ``final_panes`` when the caller has them already.
    """

    settings = warehouse.settings
    check_rule(settings.billing_rule, settings.billing_unknown_direction)
    period = billing_cycle(settings).period_for(label)
    final, needed, done = _period_state(warehouse, period)
    panes = final_panes(warehouse, period) if panes is None else panes
    mapping = account_map(settings)
    firsts = panes.group_by("mapping_version", use_threads=False).aggregate([("pane_start", "min")])
    first_seen = dict(zip(firsts.column("mapping_version").to_pylist(), firsts.column("pane_start_min").to_pylist()))
    versions = tuple(sorted(first_seen, key=lambda v: (first_seen[v], v))) or tuple(
        v.id for v in mapping.versions_during(period.start_utc, period.end_utc))
    by_account = account_series(panes, period)
    known = set(by_account) | {name for v in mapping.versions_during(period.start_utc, period.end_utc)
                               for name in v.accounts}
    if account is not None:
        if account not in known:
            raise BillingError(f"account {account!r} has no final traffic in period {label} and is not in the "
                               f"accounts mapping for it (accounts: {', '.join(sorted(known)) or 'none'})")
        known = {account}
    bills = [bill_from_series(by_account.get(name, {}), period, name, settings.billing_rule,
                              settings.billing_unknown_direction, versions)
             for name in sorted(known, key=lambda n: (n is None, n or ""))]  # a damaged pane may lack one
    bills = [_with_commit(bill, commit_of(mapping, versions, period, bill.account)) for bill in bills]
    return PeriodBills(period, bills, final, needed, done, settings=_settings_row(settings))


def commit_of(mapping, versions: tuple[str, ...], period: BillingPeriod, account: str | None):
    """The commit a bill is measured against: ``commit_bps`` of the latest mapping version of the period's
    panes (by id; by time, at the period's last pane, if that version is no longer in the file), or None."""
    version = mapping.by_id(versions[-1]) if versions else None
    if version is None:
        version = mapping.version_at(period.end_utc - PANE)
    value = version.limits_of(account).commit_bps
    return None if value is None else float(value)


def _with_commit(bill: Bill, commit: float | None) -> Bill:
    return replace(bill, commit_bps=commit, overage_bps=overage_bps(bill.billable_bps, commit))


def _settings_row(settings) -> dict:
    return {"billing_rule": settings.billing_rule, "billing_unknown_direction": settings.billing_unknown_direction,
            "billing_cycle_day": settings.billing_cycle_day, "billing_timezone": settings.billing_timezone}


def bill_rows(result: PeriodBills) -> list[dict]:
    """``bills`` table rows of a period's bills (with the settings that produced them)."""
    rows = []
    for bill in result.bills:
        row = asdict(bill)
        for name in ("rule", "unknown_direction"):
            row.pop(name)
        row["mapping_versions"] = list(bill.mapping_versions)
        rows.append({**row, **result.settings})
    return rows


def stored_bills(warehouse: Warehouse, period: BillingPeriod) -> list[dict]:
    """The stored bills of exactly this period (same start and end), if any."""
    rows = st.rows(warehouse.table("bills").read_arrow(keys=[period.start_utc]))
    return [r for r in rows if r["period_start"] == period.start_utc and r["period_end"] == period.end_utc]


def due_periods(warehouse: Warehouse, first_hour: datetime | None, frontier: datetime | None,
                published: set[datetime]) -> list[BillingPeriod]:
    """Closed billing periods without stored bills, in order, up to the first that cannot close yet.

    ``frontier`` is the end of the frozen hours, ``published`` the hours that are (or are being) published.
    """
    if first_hour is None or frontier is None:
        return []
    mapping = load_accounts(warehouse.settings.accounts_file)
    cycle = billing_cycle(warehouse.settings)
    stored = {(r["period_start"], r["period_end"]) for r in st.rows(
        warehouse.table("bills").read_arrow(columns=["period_start", "period_end"]))}
    # Time already billed stays billed as it was: after a change of cycle, billing resumes where the
    # stored bills end instead of re-cutting history into the new periods.
    billed_until = max((end for _, end in stored), default=None)
    period, due = cycle.period_containing(max(first_hour, billed_until or first_hour)), []
    while hour_ceil(period.end_utc) <= frontier:
        if (period.start_utc, period.end_utc) not in stored and (billed_until is None
                                                                 or period.start_utc >= billed_until):
            if not all(h in published for h in hours_of(period, first_hour)):
                break
            if _has_bills(warehouse, period, mapping):
                due.append(period)
        period = cycle.period_containing(period.end_utc)
    return due


def _has_bills(warehouse: Warehouse, period: BillingPeriod, mapping) -> bool:
    """Whether a closed period has any bill: final panes in it, or an account in force during it. One with
    neither (no traffic and no mapping, e.g. months of empty hours after a stray old record) has nothing
    to store: left due, it would be computed and checked (an empty check fails) at every close."""
    if any(version.accounts for version in mapping.versions_during(period.start_utc, period.end_utc)):
        return True
    return bool(warehouse.table("panes").files(key_min=hour_floor(period.start_utc), key_max=hour_ceil(period.end_utc)))


def store_bills(warehouse: Warehouse, periods: list[BillingPeriod], validation):
    """Compute, check and store the bills of closed periods, in order. Returns (stored labels, failures, check).

    A period whose hours are not all published (one failed its checks in this run) waits, and so do the
    periods after it. Bills that fail a critical check are not stored (nor those of later periods); the
    failure is reported. ``validation(periods)`` makes the check of the ``bills`` suite (the close's).
    """
    stored, failures, rows_by_period, results = [], [], {}, []
    for period in periods:
        result = compute_period(warehouse, period.label)
        if not result.final or (result.period.start_utc, result.period.end_utc) != (period.start_utc, period.end_utc):
            break
        results.append(result)
    if not results:
        return stored, failures, None
    check = validation([("bill", r.period.start_utc) for r in results])
    frame = _check_frame(warehouse, results)
    check.validate("bills", frame, [("bill", r.period.start_utc) for r in results], asset="bills.close")
    for result in results:
        status, _ = check.status("bill", result.period.start_utc)
        if status == "failed":
            # Periods are billed in order: the ones after a failed period wait with it.
            failures.append(f"bills {result.period.label}: " + check.message("bill", result.period.start_utc))
            break
        rows_by_period[result.period.label] = (result, bill_rows(result))
    check.record()
    table = warehouse.table("bills")
    for label, (result, rows) in rows_by_period.items():
        table.replace(pa.Table.from_pylist(rows, schema=table.arrow_schema), keys=[result.period.start_utc], op="bill")
        stored.append(label)
    return stored, failures, check


def _check_frame(warehouse: Warehouse, results: list[PeriodBills]):
    """The bills beside what they must reconcile with, as the pandas frame the ``bills`` suite checks."""
    import pandas as pd


    records = []
    for result in results:
        pane_bytes = sum(final_panes(warehouse, result.period).column("bytes").to_pylist())
        billed = sum(b.bytes_total for b in result.bills)
        for row, bill in zip(bill_rows(result), result.bills):
            combine = max if row["billing_rule"] == "max" else (lambda a, b: a + b)
            records.append({**{k: v for k, v in row.items() if k != "mapping_versions"}, "grain": "bill",
                            "mapping_version_count": len(bill.mapping_versions),
                            "bytes_parts": bill.bytes_in + bill.bytes_out + bill.bytes_internal + bill.bytes_transit
                            + bill.bytes_unknown,
                            "billable_expected": combine(bill.p95_in_pane_bytes, bill.p95_out_pane_bytes),
                            "rank_expected": percentile_rank(bill.panes),
                            "overage_expected": None if bill.commit_bps is None
                            else max(0.0, bill.billable_bps - bill.commit_bps),
                            "period_pane_bytes": pane_bytes, "period_billed_bytes": billed})
    frame = pd.DataFrame.from_records(records)
    for name in frame.columns:
        if frame[name].dtype.kind in "iu":
            frame[name] = frame[name].astype("Int64")
    for name in ("commit_bps", "overage_bps", "overage_expected"):  # None (no commit) → NaN, the column a float
        if name in frame.columns:
            frame[name] = frame[name].astype("float64")
    return frame


def account_totals(warehouse: Warehouse, grain: str, start: datetime | None = None,
                   end: datetime | None = None) -> pa.Table:
    """Daily or monthly totals per (account, direction), derived from final panes of rolled-up periods.

    Only days (months) that are rolled up are listed, so each reconciles to the byte with ``daily``
    (``monthly``): the same final hours, cut by account instead of address.
    """
    if grain not in ("day", "month"):
        raise BillingError(f"account totals are per day or month, not {grain!r}")
    rolled = {r["period_start"] for r in st.read_ledger(warehouse, grain)}
    table = warehouse.table("panes").read_arrow(
        key_min=start, key_max=end,
        columns=["pane_start", "account", "direction", "bytes", "packets", "status"],
        filter=pc.field("status") == "final")
    unit = "day" if grain == "day" else "month"
    periods = pc.floor_temporal(table.column("pane_start"), unit=unit)
    table = table.append_column(grain, periods)
    wanted = pa.array(sorted(rolled), pa.timestamp("us", tz="UTC"))
    table = table.filter(pc.is_in(table.column(grain), value_set=wanted))
    if start is not None:
        table = table.filter(pc.greater_equal(table.column(grain), pa.scalar(start, pa.timestamp("us", tz="UTC"))))
    if end is not None:
        table = table.filter(pc.less(table.column(grain), pa.scalar(end, pa.timestamp("us", tz="UTC"))))
    totals = group_sums(table, [grain, "account", "direction"], {"bytes": ("bytes", "sum"),
                                                                 "packets": ("packets", "sum")})
    date_column = pc.cast(totals.column(grain), pa.date32())
    return totals.set_column(0, grain, date_column).sort_by([(grain, "ascending"), ("account", "ascending")])
