"""Read-only views for people: ``traffic status`` and ``traffic show`` (Arrow only, no JVM)."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from traffic.storage import state as st
from traffic.core.clock import FIRST_HOUR_GAP, ClockState, first_hour_gap
from traffic.core.periods import hours_between
from traffic.storage.table import StorageError
from traffic.storage.warehouse import Warehouse
from traffic.storage.journal import pending_batch
from traffic.storage.schemas import TABLES
from traffic.core.settings import Settings, parse_time
from traffic.core.text import printable

UTC = timezone.utc


def _warehouse(settings: Settings) -> Warehouse:
    warehouse = Warehouse.reader(settings)
    if not warehouse.exists():
        raise StorageError(f"no warehouse at {settings.warehouse} yet (run `traffic ingest` or `traffic demo`)")
    return warehouse


def status(settings: Settings) -> dict:
    """Watermark, clocks, open hours, last closed periods, flow data waiting for its template, table versions."""
    warehouse = _warehouse(settings)
    state = st.read_clock_state(warehouse)
    ledger = st.read_ledger(warehouse)
    last = {}
    for grain in ("hour", "day", "month"):
        starts = [r["period_start"] for r in ledger if r["grain"] == grain]
        last[grain] = max(starts).strftime({"hour": "%Y-%m-%d %H:00", "day": "%Y-%m-%d", "month": "%Y-%m"}[grain]) \
            if starts else None
    open_hours = warehouse.table("hourly").read_arrow(columns=["hour", "status"],
                                                      filter=pc.field("status") == "open")
    pending = pending_batch(warehouse.root)
    open_starts = {h.astimezone(UTC) for h in open_hours.column("hour").to_pylist()}
    return {
        "watermark": state.watermark,
        "first_hour": state.first_hour,
        "clocks": dict(state.clocks),
        "live_sources": sorted(state.live_sources(settings.source_timeout)),
        "far_ahead": state.far_ahead(settings.source_timeout),
        "warnings": clock_warnings(settings, state, ledger, open_starts),
        "open_hours": sorted({h.astimezone(UTC).strftime("%Y-%m-%d %H:00")
                              for h in open_hours.column("hour").to_pylist()}),
        "last_closed": last,
        "pending_batch": pending["batch_id"] if pending else None,
        "telemetry": telemetry_health(ledger),
        # Flow data waiting for its template, per source (DESIGN §7a): it is rejected once the watermark
        # passes its receive time by template_wait.
        "waiting": st.waiting_by_source(warehouse),
        # A table added by an upgrade is created by the next ingest or close; until then it has no version.
        "versions": {name: warehouse.table(name).version() for name in TABLES if warehouse.table(name).exists()},
    }


def telemetry_health(ledger: list[dict], hours: int = 24) -> dict | None:
    """Of the last ``hours`` closed hours: the share of bytes estimated from samples and the export
    datagrams lost (DESIGN §7a), or None when no flow source ever sampled or lost anything."""
    recent = sorted((r for r in ledger if r["grain"] == "hour"), key=lambda r: r["period_start"])[-hours:]
    estimated = sum(r.get("estimated_bytes") or 0 for r in recent)
    lost = sum(r.get("lost") or 0 for r in recent)
    if not estimated and not lost:
        return None
    total = sum(r["bytes"] or 0 for r in recent)
    return {"hours": len(recent), "estimated_share": estimated / total if total else 0.0, "lost": lost,
            "hours_with_losses": sum(1 for r in recent if r.get("lost"))}


def clock_warnings(settings: Settings, state: ClockState, ledger: list[dict], open_hours) -> list[str]:
    """One line per thing about the clocks an operator should look at: a source far ahead of the others
    (its clock, or theirs, is wrong), and a first hour far before the data after it (a stray old record)."""
    notes = [f"source {source}'s clock is {_span(gap)} ahead of every other live source's (more than "
             f"source_timeout {_span(settings.source_timeout)}): a wrong exporter clock? the hours closed "
             "meanwhile are flagged" for source, gap in sorted(state.far_ahead(settings.source_timeout).items())]
    data_hours = {r["period_start"] for r in ledger if r["grain"] == "hour" and r["packets"]} | set(open_hours)
    gap = first_hour_gap(state.first_hour, data_hours, state.newest())
    if gap is not None:
        notes.append(f"first hour {state.first_hour:%Y-%m-%d %H:00} is {_span(gap)} before the next hour with data, "
                     f"{len(hours_between(state.first_hour, state.first_hour + gap)) - 1:,} empty hours between, each closed and in the ledger: a stray old "
                     f"record? (warned beyond {_span(FIRST_HOUR_GAP)})")
    return notes


def _span(value) -> str:
    """``2 h``, ``300 d 1 h``: a duration as a person says it."""
    days, rest = divmod(int(value.total_seconds()), 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    parts = [f"{days} d" if days else "", f"{hours} h" if hours else "", f"{minutes} min" if minutes else ""]
    return " ".join(p for p in parts if p) or f"{value.total_seconds():g} s"


_VIEWS = {
    "hourly": ("hourly", "hour", ["hour", "local_ip", "remote_ip", "bytes", "packets", "bytes_in", "bytes_out", "status"]),
    "daily": ("daily", "day", ["day", "local_ip", "remote_ip", "bytes", "packets", "bytes_in", "bytes_out"]),
    "monthly": ("monthly", "month", ["month", "local_ip", "remote_ip", "bytes", "packets", "bytes_in", "bytes_out"]),
    "periods": ("periods", "period_start", ["grain", "period_start", "bytes", "packets", "late_bytes", "late_packets",
                                            "sources_reporting", "sources_expected", "panes_active", "lost",
                                            "estimated_bytes", "dq_status"]),
    "late": ("late_packets", "hour", ["ts", "source", "local_ip", "remote_ip", "bytes", "late_reason"]),
    "rejects": ("rejects", "hour", ["batch_id", "source", "input_file", "reason", "record"]),
    "batches": ("batches", None, ["batch_id", "records_read", "packets_on_time", "packets_late", "records_rejected",
                                  "ticks", "duplicate_files", "watermark_after"]),
}


def show(settings: Settings, what: str, start: str | None, end: str | None, top: int) -> str:
    """A text table of one table, filtered to ``[start, end)``, largest by bytes first (ledger: in time order)."""
    return format_table(show_rows(settings, what, start, end, top))


def show_rows(settings: Settings, what: str, start: str | None, end: str | None, top: int,
              every_column: bool = False) -> pa.Table:
    """The rows ``traffic show`` prints: ``[start, end)``, in its order, the first ``top`` (0: all); the view's
    columns, or with ``every_column`` every column of the rows (the machine formats)."""
    warehouse = _warehouse(settings)
    if what in ("account-daily", "account-monthly"):
        from traffic.accounting.bills import account_totals  # deferred: status and show never load pyspark (bills -> panes)

        bound = [parse_time("--from/--to", b) if b else None for b in (start, end)]
        totals = account_totals(warehouse, "day" if what == "account-daily" else "month", *bound)
        return _first(totals, top)
    if what == "sources":
        return _first(source_totals(warehouse, start, end), top)
    table_name, time_column, columns = _VIEWS[what]
    table = warehouse.table(table_name).read_arrow()
    if time_column and (start or end):
        values = table.column(time_column)
        is_date = pa.types.is_date(values.type)
        for bound, op in ((start, pc.greater_equal), (end, pc.less)):
            if bound:
                moment = parse_time("--from/--to", bound)
                scalar = pa.scalar(moment.date() if is_date else moment,
                                   values.type if not is_date else pa.date32())
                table = table.filter(op(values, scalar))
                values = table.column(time_column)
    if what in ("periods", "batches"):
        order = [(time_column or "batch_id", "ascending")] + ([("grain", "ascending")] if what == "periods" else [])
    elif "bytes" in table.column_names:
        order = [("bytes", "descending")]
    else:
        order = [(time_column, "ascending")]
    table = _first(table.sort_by(order), top)
    return table if every_column else table.select(columns)


def _first(table: pa.Table, top: int) -> pa.Table:
    """The first ``top`` rows (``--top 0``: all of them)."""
    return table.slice(0, top) if top else table


def source_totals(warehouse: Warehouse, start: str | None = None, end: str | None = None) -> pa.Table:
    """Per source, over ``[start, end)``: 5-minute panes with traffic or ticks, on-time packets and bytes,
    ticks and lost export datagrams (``source_panes``), busiest first."""
    bound = [parse_time("--from/--to", b) if b else None for b in (start, end)]
    panes = warehouse.table("source_panes").read_arrow(key_min=bound[0], key_max=bound[1])
    for moment, op in zip(bound, (pc.greater_equal, pc.less)):
        if moment is not None:
            panes = panes.filter(op(panes.column("pane_start"), pa.scalar(moment, panes.schema.field("pane_start").type)))
    panes = panes.set_column(panes.schema.get_field_index("lost"), "lost", pc.fill_null(panes.column("lost"), 0))
    totals = panes.group_by("source").aggregate([("pane_start", "count"), ("packets", "sum"), ("bytes", "sum"),
                                                 ("ticks", "sum"), ("lost", "sum")])
    totals = totals.rename_columns([{"pane_start_count": "panes", "packets_sum": "packets", "bytes_sum": "bytes",
                                     "ticks_sum": "ticks", "lost_sum": "lost"}.get(c, c) for c in totals.column_names])
    return totals.select(["source", "panes", "packets", "bytes", "ticks", "lost"]).sort_by([("bytes", "descending")])


def format_table(table: pa.Table) -> str:
    """Plain aligned text, numbers right-aligned with thousands separators."""
    header = table.column_names
    body = []
    for row in table.to_pylist():
        cells = []
        for name in header:
            value = row[name]
            if isinstance(value, datetime):
                value = value.astimezone(UTC).strftime("%Y-%m-%d %H:%M" if value.second == 0 and value.microsecond == 0
                                                       else "%Y-%m-%d %H:%M:%S.%f")
            elif isinstance(value, int):
                value = f"{value:,}"
            cells.append("" if value is None else printable(str(value))[:60])  # a stored name may hold control characters
        body.append(cells)
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(header)]
    numeric = [all(c.replace(",", "").isdigit() for c in (r[i] for r in body) if c) and body for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines.append("  ".join("-" * w for w in widths))
    for r in body:
        lines.append("  ".join(c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
    if not body:
        lines.append("(no rows)")
    return "\n".join(lines)
