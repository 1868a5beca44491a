"""An ingest batch's writes: raw detail (packets, late packets, rejects), then the open hours and panes
(a restatement: its range's final ones), the sources' panes and the late counters of closed periods.

Every write is idempotent by the batch id (Delta app transaction ``ingest``/``batch_id``).
"""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa

from traffic.accounting import batch_tasks as B
from traffic.accounting import panes as P
from traffic.accounting import parts
from traffic.accounting.batch_tasks import LATE, ON_TIME, TICK
from traffic.accounting.ingest.batch import APP, RAW_TABLES, BatchRead, BatchTally, restated_hours
from traffic.core.periods import hour_floor, month_start
from traffic.storage import state as st
from traffic.storage.staging import DRIVER_THREADS, write_staged
from traffic.storage.warehouse import Warehouse


def write_raw(warehouse: Warehouse, plan: dict, read: BatchRead, tally: BatchTally) -> None:
    """Commit the staged raw detail: packets (or a restated range's), late packets, rejects."""
    txn, restated = (APP, plan["batch_id"]), restated_hours(plan)
    packets, late, rejects = (warehouse.table(name) for name in RAW_TABLES)
    if restated:
        packets.replace(read.staged["packets"], keys=restated, txn=txn, op="restate")
        late.delete_keys(restated, txn=txn, op="restate")
    elif tally.counts[B.ON_TIME]:
        packets.append(read.staged["packets"], txn=txn, op="ingest")
    if tally.counts[B.LATE]:
        late.append(read.staged["late_packets"], txn=txn, op="ingest")
    if tally.counts[B.REJECT] and read.staged["rejects"] is not None:
        # Rejects are filed under the hour the watermark reached, known only now: written here, a chunk at a time.
        reject_hour = hour_floor(tally.after.watermark) if tally.after.watermark else None
        for chunk, attempt in [*sorted(read.attempts.items()), (None, None)]:
            rows = (parts.read_parts(read.scratch, "rejects", {chunk: attempt}) if chunk is not None
                    else read.changed_rejects)
            rows = rows.append_column("batch_id", pa.repeat(pa.scalar(plan["batch_id"], pa.int64()), rows.num_rows)) \
                       .append_column("hour", pa.repeat(pa.scalar(reject_hour, parts.REJECT_ROWS.field("ts").type),
                                                        rows.num_rows))
            write_staged(rows, read.staged["rejects"],
                         parts.file_part(chunk, attempt) if chunk is not None else "part-changed")
        rejects.append(read.staged["rejects"], txn=txn, op="ingest")


def write_hours(warehouse: Warehouse, plan: dict, read: BatchRead, tally: BatchTally) -> None:
    """Add the batch's totals to its hours' open rows and panes (a restatement replaces its range's
    final ones), then to the sources' panes and the late counters of closed periods."""
    import pyarrow.compute as pc

    txn, restated = (APP, plan["batch_id"]), restated_hours(plan)
    hourly_parts = parts.read_parts(read.scratch, "hourly", read.attempts)
    account_parts = account_pane_parts(warehouse, read)
    hourly, panes = warehouse.table("hourly"), warehouse.table("panes")
    if restated:
        hourly.replace(parts.sum_hourly(hourly_parts, "final", DRIVER_THREADS), keys=restated, txn=txn, op="restate")
        panes.replace(P.sum_pane_rows(account_parts, "final"), keys=restated, txn=txn, op="restate")
    elif tally.on_time_hours:
        hours = tally.on_time_hours
        is_open = pc.field("status") == "open"
        existing = hourly.read_arrow(keys=hours, filter=is_open).select(parts.HOURLY_PARTS.names)
        hourly.replace(parts.sum_hourly(pa.concat_tables([hourly_parts, existing.cast(parts.HOURLY_PARTS)]), "open",
                                        DRIVER_THREADS),
                       keys=hours, txn=txn, op="ingest")
        # The panes of the same hours, kept the same way (their freeze recomputes them from raw detail).
        open_panes = panes.read_arrow(keys=hours, filter=is_open).select(parts.ACCOUNT_PARTS.names)
        panes.replace(P.sum_pane_rows(pa.concat_tables([account_parts, open_panes.cast(parts.ACCOUNT_PARTS)]), "open"),
                      keys=hours, txn=txn, op="ingest")
    lost = st.rows(parts.read_parts(read.scratch, "lost", read.attempts)) + read.lost
    _write_panes(warehouse, read.summary, txn, replace_hours=restated, lost=lost)
    _grow_late_counters(warehouse, read.summary, txn)


def account_pane_parts(warehouse: Warehouse, read: BatchRead) -> pa.Table:
    """The tasks' pane totals per account. A batch whose tasks ran under an earlier version (interrupted
    after its first commit, then finished after an upgrade) left per-address parts: attributed here."""
    scratch = read.scratch
    if read.attempts and not parts.has_parts(scratch, "accounts", read.attempts) \
            and parts.has_parts(scratch, "panes", read.attempts):
        return P.account_parts_of_addresses(parts.read_parts(scratch, "panes", read.attempts),
                                            P.Mapping.of(warehouse.settings.accounts_file))
    return parts.read_parts(scratch, "accounts", read.attempts)


def _write_panes(warehouse: Warehouse, summary: list[dict], txn, replace_hours: list[datetime] = (),
                 lost: list[dict] = ()) -> None:
    """Add on-time packets, ticks and lost export datagrams to ``source_panes`` (per source and 5-minute pane).

    With ``replace_hours`` (a restatement) the panes of those hours are replaced, not added to.
    """

    fresh: dict[tuple[str, datetime], dict] = {}
    for r in summary:
        if r["fate"] not in (ON_TIME, TICK):
            continue
        row = fresh.setdefault((r["source"], r["pane"]), {"source": r["source"], "pane_start": r["pane"],
                                                          "packets": 0, "bytes": 0, "ticks": 0, "lost": 0})
        if r["fate"] == ON_TIME:
            row["packets"] += r["packets"]
            row["bytes"] += r["bytes"]
        else:
            row["ticks"] += r["records"]
    for r in lost:
        row = fresh.setdefault((r["source"], r["pane_start"]), {"source": r["source"], "pane_start": r["pane_start"],
                                                                "packets": 0, "bytes": 0, "ticks": 0, "lost": 0})
        row["lost"] += r["lost"]
    if not fresh and not replace_hours:
        return
    table = warehouse.table("source_panes")
    replaced = set(replace_hours)
    hours = sorted({hour_floor(pane) for _, pane in fresh} | replaced)
    merged = {(r["source"], r["pane_start"]): r for r in st.rows(table.read_arrow(keys=hours))
              if hour_floor(r["pane_start"]) not in replaced}
    for key, row in fresh.items():
        old = merged.get(key)
        if old:
            row = {**row, **{c: (old[c] or 0) + row[c] for c in ("packets", "bytes", "ticks", "lost")}}
        merged[key] = row
    data = pa.Table.from_pylist(sorted(merged.values(), key=lambda r: (r["pane_start"], r["source"])),
                                schema=table.arrow_schema)
    table.replace(data, keys=hours, txn=txn, op="ingest")


def _grow_late_counters(warehouse: Warehouse, summary: list[dict], txn) -> None:
    """Late packets for already-closed periods grow those ledger rows' late counters (DESIGN §6)."""

    late_by_hour: dict[datetime, list[int]] = {}
    for r in summary:
        if r["fate"] == LATE:
            totals = late_by_hour.setdefault(hour_floor(r["pane"]), [0, 0])
            totals[0] += r["bytes"]
            totals[1] += r["packets"]
    if not late_by_hour:
        return
    months = sorted({month_start(h) for h in late_by_hour})
    ledger = {(r["grain"], r["period_start"]): r for r in st.read_ledger(warehouse, keys=months)}
    changed = {}
    for hour, (late_bytes, late_packets) in late_by_hour.items():
        day = hour.replace(hour=0)
        for key in (("hour", hour), ("day", day), ("month", month_start(hour))):
            row = changed.get(key) or ledger.get(key)
            if row is None:
                continue
            changed[key] = {**row, "late_bytes": row["late_bytes"] + late_bytes,
                            "late_packets": row["late_packets"] + late_packets}
    st.write_ledger_rows(warehouse, list(changed.values()), txn=txn, op="ingest")
