"""Replay: import archived input files for a time range, then close what can be closed — one Spark app.

Into a range that is still open (a new warehouse, or history older than anything ingested)
the records count normally; into a closed range they are late (DESIGN §3, §8). A
**restatement** (``--restate --reason …``) instead replaces a frozen range from the archive:
its raw detail, late records, hourly rows and ledger rows are recomputed, the days and
months over it are rolled up again, and every rewritten ledger row says ``restated`` and why.
The bytes the range held before are recorded as ``bytes_withdrawn`` on the batch, so the
accounting still reconciles to the byte.

Files are keyed by (source, content) and range: replaying the same file over the same (or an
overlapping) range again is a recorded duplicate, not a second count — except in a
restatement, which replaces the range by design.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from traffic import inbox as inbox_mod
from traffic import jvm
from traffic import state as st
from traffic.clock import DAY, HOUR, hour_floor, month_start, next_month
from traffic.delta import Warehouse, cluster_key
from traffic.ingest import BatchResult, announce_work, complete, cutting, finish_pending
from traffic.settings import Settings, SettingsError

UTC = timezone.utc


def plan_replay(settings: Settings, warehouse: Warehouse, input_dir: Path, start: datetime, end: datetime,
                source: str | None = None, restate: str | None = None) -> dict | None:
    """The replay batch's plan, or None when every file was already counted for this range."""
    if end <= start:
        raise SettingsError(f"replay range is empty: --from {start.isoformat()} is not before --to {end.isoformat()}")
    state = st.read_clock_state(warehouse)
    withdrawn = 0
    if restate is not None:
        if not restate.strip():
            raise SettingsError("a restatement needs --reason (it is recorded in the ledger)")
        if start != hour_floor(start) or end != hour_floor(end):
            raise SettingsError("a restatement covers whole hours: --from and --to must be on the hour")
        frozen = {r["period_start"]: r for r in st.read_ledger(warehouse, "hour")}
        hour = start
        while hour < end:
            if hour not in frozen:
                raise SettingsError(f"only frozen hours can be restated; {hour:%Y-%m-%d %H:00} is not frozen "
                                    "(replay without --restate, or wait until it is closed)")
            withdrawn += frozen[hour]["bytes"] + frozen[hour]["late_bytes"]
            hour += HOUR
    found = inbox_mod.scan(input_dir)
    if not found:
        raise SettingsError(f"no input files in {input_dir}")
    known = st.known_files(warehouse)
    whole = {(k["source"], k["sha256"]) for k in known if k["status"] in (inbox_mod.ACCOUNTED, inbox_mod.APPENDED)}
    replayed: dict[tuple[str, str], list[tuple[datetime, datetime]]] = {}
    for k in known:
        if k["status"] == inbox_mod.REPLAYED and k.get("range_from"):
            replayed.setdefault((k["source"], k["sha256"]), []).append(
                (st._utc(k["range_from"]), st._utc(k["range_to"])))
    files = []
    how = replace(cutting(settings), partial_line_grace=0)  # an archive is complete: its last line counts as it is
    for f in found:
        file_source = source or f.source
        if f.status == inbox_mod.SKIPPED:  # never opened: recorded by name (the inbox's rule)
            files.append({**asdict(f), "source": file_source})
            continue
        try:
            f, _ = inbox_mod.survey(replace(f, source=file_source), how)
        except OSError as error:
            files.append({**asdict(f), "source": file_source, "status": inbox_mod.UNREADABLE,
                          "note": f"cannot be read ({inbox_mod.why(error)}): nothing of it was counted"})
            continue
        key = (file_source, f.sha256)
        overlap = any(a < end and start < b for a, b in replayed.get(key, []))
        if restate is None and (key in whole or overlap):
            status, note = inbox_mod.DUPLICATE, "already counted (from the inbox or an overlapping replay)"
        else:
            status, note = inbox_mod.REPLAYED, ""
        files.append({**asdict(f), "status": status, "note": note})
    if all(f["status"] not in inbox_mod.TO_READ for f in files):
        return None
    return {
        "batch_id": st.last_batch_id(warehouse) + 1,
        "mode": "restate" if restate is not None else "replay",
        "started_at": datetime.now(UTC).isoformat(),
        "now": settings.processing_now().isoformat(),
        "state_before": st.state_to_json(state),
        "range": [start.isoformat(), end.isoformat()],
        "restate": restate,
        "bytes_withdrawn": withdrawn,
        "files": files,
    }


def replay(settings: Settings, spark_factory: Callable[[], object], input_dir: Path, start: datetime,
           end: datetime, source: str | None = None, restate: str | None = None, progress=print):
    """Import the archive for ``[start, end)`` and close what the watermark allows, under the lock."""
    from traffic.close import close_locked

    warehouse = Warehouse(settings)
    with inbox_mod.warehouse_lock(warehouse.state_dir(), settings.lock_timeout.total_seconds(), "traffic replay"):
        warehouse.create_all()
        finish_pending(settings, warehouse, spark_factory, progress)
        plan = plan_replay(settings, warehouse, Path(input_dir), start, end, source, restate)
        result = BatchResult()
        if end - start > jvm.QUICK_MAX_HOURS * HOUR:
            jvm.expect_big_job(f"a replay of {(end - start) / HOUR:,.0f} hours")
        if plan is not None:
            journal = inbox_mod.Journal(warehouse.state_dir())
            journal.save(plan)
            announce_work(plan)
            result = complete(warehouse.with_spark(spark_factory()), plan, progress)
            journal.clear()
        closed = close_locked(settings, warehouse, spark_factory, None, progress)
        return result, closed


def rewrite_restated_periods(warehouse: Warehouse, plan: dict, progress=print) -> None:
    """After a restatement batch: new ledger rows for its hours, then its rolled-up days and months again.

    Recomputed from the tables each time, so a crash here is repaired by running it again.
    """
    from traffic.close import _completeness, roll_up_day, roll_up_month

    reason = plan["restate"]
    start, end = (datetime.fromisoformat(t) for t in plan["range"])
    hours = []
    hour = start
    while hour < end:
        hours.append(hour)
        hour += HOUR
    keys = [cluster_key(h, "hour") for h in hours]
    hourly = warehouse.table("hourly").read_arrow(keys=keys, columns=["hour", "bytes", "packets"])
    totals: dict[datetime, list[int]] = {}
    for h, b, p in zip(hourly.column("hour").to_pylist(), hourly.column("bytes").to_pylist(),
                       hourly.column("packets").to_pylist()):
        entry = totals.setdefault(h.astimezone(UTC), [0, 0])
        entry[0] += b
        entry[1] += p
    old = {r["period_start"]: r for r in st.read_ledger(warehouse, "hour")}
    completeness = _completeness(warehouse, hours)
    rows = []
    for h in hours:
        reporting, expected, active = completeness[h]
        rows.append({**old[h], "bytes": totals.get(h, [0, 0])[0], "packets": totals.get(h, [0, 0])[1],
                     "late_bytes": 0, "late_packets": 0, "sources_reporting": reporting,
                     "sources_expected": expected, "panes_active": active, "dq_status": "passed",
                     "restated": reason, "dq_note": None})
    st.write_ledger_rows(warehouse, rows, op="restate")
    days = {r["period_start"] for r in st.read_ledger(warehouse, "day")}
    day = start.replace(hour=0)
    redo_days = []
    while day < end:
        if day in days:
            redo_days.append(day)
        day += DAY
    for day in redo_days:
        roll_up_day(warehouse, day.date(), restated=reason)
    months = {r["period_start"] for r in st.read_ledger(warehouse, "month")}
    month = month_start(start)
    while month < end:
        if month in months:
            roll_up_month(warehouse, month, restated=reason)
        month = next_month(month)
    restore_bills(warehouse, start, end)
    progress(f"restated {len(hours)} hour(s), {len(redo_days)} day(s): {reason}")


def restore_bills(warehouse: Warehouse, start: datetime, end: datetime) -> list[str]:
    """Bills already stored for billing periods overlapping a restated range are recomputed from its new panes."""
    from traffic.bills import billing_cycle, store_bills, stored_bills

    cycle = billing_cycle(warehouse.settings)
    period, overlapping = cycle.period_containing(start), []
    while period.start_utc < end:
        if stored_bills(warehouse, period):
            overlapping.append(period)
        period = cycle.period_containing(period.end_utc)
    if not overlapping:
        return []
    stored, _, _ = store_bills(warehouse, overlapping)
    return stored
