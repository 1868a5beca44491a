"""The traffic report a person opens in a browser: ``<warehouse>/_reports/index.html``.

One static, self-contained page (inline CSS, charts as inline SVG, no script, no network),
written from the tables with Arrow reads only — no Spark — so ``traffic close`` refreshes it
cheaply after every run that froze or rolled up something, and ``traffic report`` writes it
on demand. Numbers carry ``data-*`` attributes with their exact values (tests read them).
Beside it, ``bills/`` holds a page per account per billing period (``traffic.reporting.html_bills``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from traffic.storage import state as st
from traffic.accounting.alerts import read_alerts
from traffic.core.periods import day_start, next_month
from traffic.storage.table import StorageError
from traffic.storage.warehouse import Warehouse
from traffic.quality.data_docs import docs_pages
from traffic.quality.gx_context import reports_dir
from traffic.quality.suite_documents import period_label
from traffic.reporting.html import CSS, human_bytes, number_cell as _num
from traffic.reporting.html import escape as _e
from traffic.reporting.report import clock_warnings, telemetry_health
from traffic.core.settings import Settings
from traffic.reporting.html_bills import write_bill_pages
from traffic.reporting.top import TopError, top_talkers_by
from traffic.reporting.html_bills import bills_table, human_bps

UTC = timezone.utc
HOURS_SHOWN = 72
#: Closed hours the data-quality section lists (besides those that did not simply pass).
QUALITY_HOURS = 48
TOP = 10
#: The window of the top-talkers tables: the last day before the watermark (``traffic report --top-last``).
TOP_LAST = timedelta(hours=24)
STATUS_COLOURS = {"passed": "#2f7d4f", "warning": "#c98a00", "failed": "#c0392b", "accepted": "#7048a8",
                  None: "#8a8a8a"}


def write_report(settings: Settings, top_last: timedelta = TOP_LAST) -> Path:
    """Write the report (``index.html`` and the bills pages under ``bills/``); returns the index's path."""

    warehouse = Warehouse.reader(settings)
    if not warehouse.exists():
        raise StorageError(f"no warehouse at {settings.warehouse} yet (run `traffic ingest` or `traffic demo`)")
    generated = settings.now or datetime.now(UTC)
    out = reports_dir(warehouse)
    out.mkdir(parents=True, exist_ok=True)
    bills = write_bill_pages(warehouse, out, generated)
    page = render(warehouse, generated, top_last, bills)
    path = out / "index.html"
    tmp = out / ".index.html.tmp"
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)  # readers never see half a page
    return path


# -- data --------------------------------------------------------------------------------------

def _gather(warehouse: Warehouse) -> dict:
    state = st.read_clock_state(warehouse)
    ledger = sorted(st.read_ledger(warehouse), key=lambda r: (r["period_start"], r["grain"]))
    pairs = ["local_ip", "remote_ip", "bytes", "packets"]
    monthly = warehouse.table("monthly").read_arrow(columns=["month", *pairs])
    # Totals are summed in Arrow, and ``daily`` (a row per pair and day) is read only for the days after
    # the last rolled-up month: the months before are in ``monthly`` (Σ of their days, checked when
    # rolled up), and each day's totals are in its ledger row. A report written by every close must
    # not read or turn into Python rows all of history (after 30 days that alone took ~2 s).
    last_month = pc.max(monthly.column("month")).as_py() if monthly.num_rows else None
    daily = warehouse.table("daily").read_arrow(
        key_min=next_month(day_start(last_month)) if last_month else None, columns=["day", *pairs])
    # Open rows exist only after the frozen hours (hours freeze in order).
    frontier = st.frozen_frontier(ledger)
    open_rows = warehouse.table("hourly").read_arrow(
        key_min=frontier, columns=["hour", "bytes", "packets"],
        filter=pc.field("status") == "open")
    rejects = st.rows(warehouse.table("rejects").read_arrow(columns=["hour", "source", "reason"]))
    late = st.rows(warehouse.table("late_packets").read_arrow(columns=["hour", "bytes"]))
    checks = warehouse.table("dq_results").read_arrow(columns=["grain", "period_start", "suite", "run_id", "success"])
    checks = checks.filter(_shown_in_quality(checks, ledger))  # dq_results keeps ~90 days of every check
    checks = checks.set_column(4, "success", pc.fill_null(checks.column("success"), False))  # unknown is not a pass
    results = st.rows(checks.group_by(["grain", "period_start", "suite", "run_id"], use_threads=False)
                      .aggregate([("success", "all")]).rename_columns(["grain", "period_start", "suite", "run_id",
                                                                       "success"]))
    by_month = monthly.group_by("month", use_threads=False).aggregate([("bytes", "sum"), ("packets", "sum")])
    month_totals = {day_start(m): [b, p] for m, b, p in zip(by_month.column("month").to_pylist(),
                                                          by_month.column("bytes_sum").to_pylist(),
                                                          by_month.column("packets_sum").to_pylist())}
    day_totals = {r["period_start"]: [r["bytes"], r["packets"]] for r in ledger if r["grain"] == "day"}
    closed = pa.concat_tables([monthly.select(pairs), daily.select(pairs)])
    open_totals: dict[datetime, list[int]] = defaultdict(lambda: [0, 0])
    for h, b, p in zip(open_rows.column("hour").to_pylist(), open_rows.column("bytes").to_pylist(),
                       open_rows.column("packets").to_pylist()):
        key = h.astimezone(UTC)
        open_totals[key][0] += b
        open_totals[key][1] += p
    return {"state": state, "ledger": ledger, "months": dict(month_totals), "days": dict(day_totals),
            "top": {column: _top(closed, column) for column in ("local_ip", "remote_ip")},
            "open": dict(open_totals), "rejects": rejects, "late": late, "results": results,
            "pages": docs_pages(warehouse)}


def _quality_periods(ledger: list[dict]) -> list[dict]:
    """The ledger rows the quality section shows: those that did not simply pass, every day and month,
    and the last ``QUALITY_HOURS`` hours (``ledger`` in period order)."""
    hours = [r for r in ledger if r["grain"] == "hour"]
    return [r for r in ledger if r["dq_status"] != "passed" or r["grain"] != "hour"] + hours[-QUALITY_HOURS:]


def _shown_in_quality(checks: pa.Table, ledger: list[dict]) -> pa.Array:
    """Which ``dq_results`` rows belong to a period the quality section shows."""
    hours = [r["period_start"] for r in _quality_periods(ledger) if r["grain"] == "hour"]
    return pc.or_(pc.not_equal(checks.column("grain"), "hour"),
                  pc.is_in(checks.column("period_start"), value_set=pa.array(hours, checks.schema.field(
                      "period_start").type)))


def _top(closed: pa.Table, column: str) -> list[tuple[str, int, int]]:
    """The ``TOP`` addresses of ``column`` by bytes over all closed days (ties by address)."""
    totals = closed.group_by(column, use_threads=False).aggregate([("bytes", "sum"), ("packets", "sum")])
    ranked = totals.sort_by([("bytes_sum", "descending"), (column, "ascending")]).slice(0, TOP)
    return list(zip(ranked.column(column).to_pylist(), ranked.column("bytes_sum").to_pylist(),
                    ranked.column("packets_sum").to_pylist()))


# -- rendering helpers -------------------------------------------------------------------------

def _badge(status: str | None) -> str:
    colour = STATUS_COLOURS.get(status, STATUS_COLOURS[None])
    return f'<span class="badge" style="background:{colour}" data-status="{_e(status)}">{_e(status or "open")}</span>'


def bar_chart(items: list[tuple[str, int, str | None]], title: str, width: int = 960, height: int = 220,
              label_every: int = 1) -> str:
    """Bars (label, value, status) as inline SVG: the bar's colour is the period's data-quality status."""
    if not items:
        return f'<p class="empty">{_e(title)}: nothing yet.</p>'
    left, bottom, top = 70, 46, 24
    plot_w, plot_h = width - left - 10, height - bottom - top
    peak = max(v for _, v, _ in items) or 1
    step = plot_w / len(items)
    bar_w = min(max(1.0, step * 0.8), 90.0)
    parts = [f'<svg class="chart" role="img" aria-label="{_e(title)}" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
             f'<text x="{left}" y="15" class="ct">{_e(title)}</text>']
    for fraction in (0, 0.5, 1):
        y = top + plot_h * (1 - fraction)
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" class="ax" text-anchor="end">'
                     f'{_e(human_bytes(int(peak * fraction)))}</text>')
    for i, (label, value, status) in enumerate(items):
        h = plot_h * (value / peak) if peak else 0
        x = left + i * step + (step - bar_w) / 2
        colour = STATUS_COLOURS.get(status, STATUS_COLOURS[None])
        parts.append(f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w:.1f}" height="{max(h, 0.5):.1f}" '
                     f'fill="{colour}" data-label="{_e(label)}" data-bytes="{value}"><title>{_e(label)}: '
                     f'{value:,} bytes ({_e(status or "open")})</title></rect>')
        if i % label_every == 0:
            parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{top + plot_h + 14}" class="ax" text-anchor="middle">'
                         f'{_e(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def completeness_strip(hours: list[dict], width: int = 960) -> str:
    """One cell per closed hour: shade = panes_active/12, red outline when a source was missing."""
    if not hours:
        return '<p class="empty">No closed hours yet.</p>'
    left, cell_h = 70, 26
    step = (width - left - 10) / len(hours)
    parts = [f'<svg class="chart" role="img" aria-label="completeness per hour" width="{width}" height="{cell_h + 40}" '
             f'viewBox="0 0 {width} {cell_h + 40}" xmlns="http://www.w3.org/2000/svg">',
             '<text x="0" y="30" class="ax">panes of 12</text>']
    for i, r in enumerate(hours):
        active = r["panes_active"] or 0
        shade = 0.12 + 0.88 * (active / 12)
        missing = (r["sources_reporting"] or 0) < (r["sources_expected"] or 0)
        x = left + i * step
        outline = ' stroke="#c0392b" stroke-width="2"' if missing else ""
        parts.append(f'<rect x="{x:.1f}" y="12" width="{max(step - 1, 1):.1f}" height="{cell_h}" '
                     f'fill="#1f5f99" fill-opacity="{shade:.2f}"{outline} data-hour="{r["period_start"]:%Y-%m-%dT%H}" '
                     f'data-panes="{active}"><title>{r["period_start"]:%Y-%m-%d %H:00}: {active}/12 panes, '
                     f'{r["sources_reporting"]}/{r["sources_expected"]} sources</title></rect>')
        if r["period_start"].hour % 6 == 0:
            parts.append(f'<text x="{x:.1f}" y="{cell_h + 28}" class="ax">{r["period_start"]:%d %H:00}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _telemetry_card(ledger: list[dict]) -> str:
    """A card for flow telemetry (DESIGN §7a), when a source sampled or lost anything in the last day."""
    health = telemetry_health(ledger)
    if health is None:
        return ""
    return (f'<div class="card" id="telemetry"><b data-estimated-share="{health["estimated_share"]:.6f}">'
            f'{health["estimated_share"]:.1%}</b><span>of bytes estimated from samples (last {health["hours"]} '
            f'closed hours); <span data-lost="{health["lost"]}">{health["lost"]:,}</span> export sequence units '
            f'lost in {health["hours_with_losses"]} hour(s)</span></div>')


def _share_bar(value: int, peak: int) -> str:
    w = int(160 * value / peak) if peak else 0
    return (f'<svg width="164" height="12" xmlns="http://www.w3.org/2000/svg"><rect x="0" y="1" width="{w}" '
            f'height="10" fill="#1f5f99"/></svg>')


# -- the page ----------------------------------------------------------------------------------



def render(warehouse: Warehouse, generated: datetime, top_last: timedelta = TOP_LAST, bills=()) -> str:
    """The whole page as one string (``bills``: the periods whose bills pages were written)."""
    data = _gather(warehouse)
    state, ledger = data["state"], data["ledger"]
    by_grain: dict[str, list[dict]] = defaultdict(list)
    for r in ledger:
        by_grain[r["grain"]].append(r)
    statuses = Counter(r["dq_status"] for r in ledger)
    months = sorted(data["months"].items())
    month_status = {r["period_start"]: r for r in by_grain["month"]}
    day_status = {r["period_start"]: r for r in by_grain["day"]}
    days = sorted(data["days"].items())
    hours = by_grain["hour"][-HOURS_SHOWN:]
    late_bytes = sum(r["bytes"] for r in data["late"])
    out = [f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Traffic report</title>'
           f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{CSS}</style></head><body>']
    last = {g: (max(r["period_start"] for r in rs) if rs else None) for g, rs in by_grain.items()}
    out.append(
        f'<header><h1>Traffic report</h1><div class="meta">warehouse {_e(warehouse.root)} · watermark '
        f'<b data-watermark="{_e(state.watermark.isoformat() if state.watermark else "")}">'
        f'{_e(f"{state.watermark:%Y-%m-%d %H:%M} UTC" if state.watermark else "none yet")}</b> · last closed hour '
        f'{_e(period_label("hour", last["hour"]) if last.get("hour") else "-")}, day '
        f'{_e(period_label("day", last["day"]) if last.get("day") else "-")}, month '
        f'{_e(period_label("month", last["month"]) if last.get("month") else "-")} · generated '
        f'{generated:%Y-%m-%d %H:%M} UTC</div></header><main>')
    warnings = clock_warnings(warehouse.settings, state, ledger, data["open"])
    if warnings:
        out.append('<p class="note" id="clock-warnings">' + "<br>".join(f"⚠ {_e(w)}" for w in warnings) + '</p>')
    total = sum(b for _, (b, _) in months)
    out.append('<div class="cards">'
               f'<div class="card"><b data-bytes="{total}">{_e(human_bytes(total))}</b><span>in closed months</span></div>'
               f'<div class="card"><b>{len(by_grain["day"])}</b><span>days closed</span></div>'
               f'<div class="card"><b data-bytes="{late_bytes}">{_e(human_bytes(late_bytes))}</b>'
               f'<span>late ({len(data["late"]):,} records)</span></div>'
               f'<div class="card"><b data-rejects="{len(data["rejects"])}">{len(data["rejects"]):,}</b>'
               f'<span>records rejected</span></div>'
               f'<div class="card"><b>' + " ".join(
                   f'<span data-count-{_e(s)}="{statuses.get(s, 0)}">{statuses.get(s, 0)}&nbsp;{_badge(s)}</span>'
                   for s in ("passed", "warning", "failed", "accepted") if statuses.get(s)) +
               '</b><span>periods by data-quality status</span></div>' + _telemetry_card(ledger) + '</div>')
    legend = '<div class="legend">' + "".join(
        f'<span><i style="background:{STATUS_COLOURS[s]}"></i>{s}</span>'
        for s in ("passed", "warning", "failed", "accepted")) + '<span><i style="background:#8a8a8a"></i>open / not closed</span></div>'

    # Months
    rows = "".join(
        f'<tr data-month="{m:%Y-%m}"><td>{m:%Y-%m}</td>{_num(b)}{_num(p, "packets")}'
        f'{_num((month_status.get(m) or {}).get("late_bytes"))}<td>{_badge((month_status.get(m) or {}).get("dq_status"))}</td></tr>'
        for m, (b, p) in months)
    out.append('<section id="months"><h2>Months</h2>' + legend +
               bar_chart([(f"{m:%Y-%m}", b, (month_status.get(m) or {}).get("dq_status")) for m, (b, _) in months],
                         "bytes per month", height=180) +
               '<table><tr><th>month</th><th>bytes</th><th>packets</th><th>late bytes</th><th>data quality</th></tr>'
               + (rows or '<tr><td colspan="5" class="empty">No month closed yet.</td></tr>') + '</table></section>')

    # Days
    rows = "".join(
        f'<tr data-day="{d:%Y-%m-%d}"><td>{d:%Y-%m-%d}</td>{_num(b)}{_num(p, "packets")}'
        f'{_num((day_status.get(d) or {}).get("late_bytes"))}<td>{_badge((day_status.get(d) or {}).get("dq_status"))}</td></tr>'
        for d, (b, p) in days)
    out.append('<section id="days"><h2>Days</h2>' +
               bar_chart([(f"{d:%m-%d}", b, (day_status.get(d) or {}).get("dq_status")) for d, (b, _) in days],
                         "bytes per day", label_every=max(1, len(days) // 20)) +
               '<table><tr><th>day</th><th>bytes</th><th>packets</th><th>late bytes</th><th>data quality</th></tr>'
               + (rows or '<tr><td colspan="5" class="empty">No day closed yet.</td></tr>') + '</table></section>')

    # Hours: closed ones from the ledger, open ones ("so far") from hourly
    items = [(f"{r['period_start']:%H}", r["bytes"], r["dq_status"]) for r in hours]
    items += [(f"{h:%H}", b, None) for h, (b, _) in sorted(data["open"].items())]
    out.append(f'<section id="hours"><h2>Hours (last {HOURS_SHOWN} closed, then open hours so far)</h2>' +
               bar_chart(items, "bytes per hour", label_every=max(1, len(items) // 24)) +
               '<h2>Completeness per closed hour</h2>' + completeness_strip(hours) +
               '<p class="note">Darker = more of the hour\'s twelve 5-minute panes in which every expected source sent '
               'a packet or a tick; a red outline marks an hour in which an expected source sent nothing.</p></section>')
    out.append(_quality_section(ledger, data["results"], data["pages"]))

    # Top talkers
    tables = []
    for column, title in (("local_ip", "Top local hosts"), ("remote_ip", "Top remote peers")):
        top = data["top"][column]
        peak = top[0][1] if top else 0
        body = "".join(f'<tr data-{column.replace("_", "-")}="{_e(name)}"><td>{_e(name)}</td>{_num(b)}'
                       f'{_num(p, "packets")}<td>{_share_bar(b, peak)}</td></tr>' for name, b, p in top)
        tables.append(f'<div><h2>{title}</h2><p class="note">over all closed days</p><table><tr><th>address</th>'
                      f'<th>bytes</th><th>packets</th><th></th></tr>'
                      + (body or '<tr><td colspan="4" class="empty">No day closed yet.</td></tr>') + '</table></div>')
    out.append('<section id="top"><div class="cols">' + "".join(tables) + '</div></section>')
    out.append(_top_talkers_section(warehouse, top_last))
    out.append(_bills_section(bills))
    out.append(_alerts_section(warehouse))

    # Late and rejected
    late_by_day: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in data["late"]:
        key = f"{r['hour']:%Y-%m-%d}"
        late_by_day[key][0] += r["bytes"]
        late_by_day[key][1] += 1
    rejects_by_day: Counter = Counter(f"{r['hour']:%Y-%m-%d}" if r["hour"] else "before any watermark"
                                      for r in data["rejects"])
    reasons = Counter(r["reason"] for r in data["rejects"]).most_common(8)
    body = "".join(f'<tr data-late-day="{d}"><td>{d}</td>{_num(late_by_day[d][0])}'
                   f'{_num(late_by_day[d][1], "records")}{_num(rejects_by_day.get(d, 0), "rejects")}</tr>'
                   for d in sorted(set(late_by_day) | set(rejects_by_day)))
    reason_rows = "".join(f'<tr><td>{_e(reason)}</td>{_num(n, "rejects")}</tr>' for reason, n in reasons)
    out.append('<section id="late"><h2>Late and rejected records</h2><div class="cols"><div><table><tr><th>day</th>'
               '<th>late bytes</th><th>late records</th><th>rejected</th></tr>'
               + (body or '<tr><td colspan="4" class="empty">None.</td></tr>') +
               '</table><p class="note">Late records never change a frozen hour; they grow its ledger row\'s '
               'late_bytes. Kept for late_retention.</p></div><div><table><tr><th>why rejected (top)</th><th>records</th></tr>'
               + (reason_rows or '<tr><td colspan="2" class="empty">None.</td></tr>') + '</table></div></div></section>')

    out.append('</main></body></html>')
    return "".join(out)


def duration_label(span: timedelta) -> str:
    """``24 h``, ``7 d``, ``90 min``, ``45 s``: the largest unit that divides the span."""
    seconds = int(span.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _top_talkers_section(warehouse: Warehouse, last: timedelta) -> str:
    """Top hosts, peers and (with an accounts file) accounts over ``[W - last, W)`` (``traffic top``)."""

    groupings = [("host", "local host"), ("peer", "remote peer")]
    if warehouse.settings.accounts_file:
        groupings.append(("account", "account"))
    tables, window = [], ""
    try:  # one read of each part of the window for every grouping
        results = top_talkers_by(warehouse, last, [by for by, _ in groupings], TOP)
    except TopError as error:
        return (f'<section id="top-talkers"><h2>Top talkers, last {duration_label(last)}</h2>'
                f'<p class="empty">{_e(error)}</p></section>')
    for by, label in groupings:
        result = results[by]
        window = (f'<span data-top-start="{result.start.isoformat()}" data-top-end="{result.end.isoformat()}">'
                  f'{result.start:%Y-%m-%d %H:%M} → {result.end:%Y-%m-%d %H:%M} UTC</span>'
                  + (f' <span class="note">({_e(result.note)})</span>' if result.note else ""))
        peak = result.rows[0]["bytes"] if result.rows else 0
        body = "".join(f'<tr data-top-{by}="{_e(r["key"])}"><td>{_e(r["key"] if r["key"] is not None else "-")}</td>'
                       f'{_num(r["bytes"])}{_num(r["packets"], "packets")}{_num(r["bytes_in"])}{_num(r["bytes_out"])}'
                       f'<td>{_share_bar(r["bytes"], peak)}</td></tr>' for r in result.rows)
        tables.append(f'<div><h2>Top {label}s</h2><p class="note">{len(result.rows)} of {result.keys:,}</p><table>'
                      f'<tr><th>{label}</th><th>bytes</th><th>packets</th><th>in</th><th>out</th><th></th></tr>'
                      + (body or '<tr><td colspan="6" class="empty">No traffic in the window.</td></tr>')
                      + '</table></div>')
    return (f'<section id="top-talkers"><h2>Top talkers, last {duration_label(last)} to the watermark: {window}</h2>'
            '<p class="note">Exact totals over the window (<code>traffic top --last</code>): whole hours from the '
            'hourly totals (per account from the panes), the partial hours at its edges from raw detail. '
            '<code>traffic report --top-last 7d</code> chooses another window.</p><div class="cols">'
            + "".join(tables) + '</div></section>')


def _bills_section(bills) -> str:
    """The bills of every period with final panes, linking to each account's bills page."""

    return ('<section id="bills"><h2>Bills</h2><p class="note">Per account and billing period: volume and the '
            '95th-percentile rate, for the last two periods with final panes. Each account links to its bills page '
            '(rate per 5-minute pane with the 95th percentile, monthly totals); every period: '
            '<a href="bills/index.html">all bills</a>.</p>' + bills_table(list(bills)[-2:], "bills/") + '</section>')


def _alerts_section(warehouse: Warehouse) -> str:
    """The quota and commit alerts of the latest billing periods that have any (``traffic alerts``)."""
    rows = read_alerts(warehouse)
    body = "".join(
        f'<tr data-alert="{_e(r["alert_id"])}" data-kind="{_e(r["kind"])}"><td>{_e(r["period"])}</td>'
        f'<td>{_e(r["kind"])}</td><td>{_e(r["account"])}</td><td class="p">{r["hour"]:%Y-%m-%d %H:00}</td>'
        f'<td class="n" data-observed="{r["observed"]}">{r["observed"]:,} {_e(r["unit"])}</td>'
        f'<td class="n" data-threshold="{r["threshold"]}">{r["threshold"]:,} {_e(r["unit"])}</td>'
        f'<td class="n">{_e(_limit_text(r))}</td><td>{_e(r["mapping_version"])}</td></tr>'
        for r in reversed(rows))
    return ('<section id="alerts"><h2>Alerts</h2><p class="note">Quota and commit crossings per account and billing '
            'period (limits in the accounts file), from final panes of published hours: the hour at whose end the '
            'period\'s bytes reached the quota, or the 95th percentile became certain to exceed the commit. One per '
            'crossing; <code>traffic alerts</code> lists them all.</p><table><tr><th>period</th><th>kind</th>'
            '<th>account</th><th>hour (UTC)</th><th>observed</th><th>threshold</th><th>limit</th><th>version</th></tr>'
            + (body or '<tr><td colspan="8" class="empty">No alert.</td></tr>') + '</table></section>')


def _limit_text(alert: dict) -> str:
    if alert["kind"] == "quota":
        return f"{alert['quota_bytes']:,} bytes"
    return human_bps(alert["commit_bps"])


def _quality_section(ledger: list[dict], results: list[dict], pages: dict) -> str:
    """Data-quality outcome per period, newest first: status, why, and links into Data Docs."""
    runs: dict[tuple[str, datetime], dict[tuple[str, str], bool]] = defaultdict(dict)
    for r in results:  # one row per period, suite and run: did all its checks pass
        runs[(r["grain"], r["period_start"])][(r["suite"], r["run_id"])] = bool(r["success"])
    chosen = sorted({(r["grain"], r["period_start"]): r for r in _quality_periods(ledger)}.values(),
                    key=lambda r: (r["dq_status"] != "passed", r["period_start"], r["grain"]), reverse=True)
    body = []
    for r in chosen:
        key = (r["grain"], r["period_start"])
        links = []
        for (suite, run_id), ok in sorted(runs.get(key, {}).items(), key=lambda kv: (kv[1], kv[0])):
            found = pages.get((suite, run_id), {})
            for asset, page in sorted(found.items()):
                label = suite if len(found) == 1 else f"{suite} ({asset.split('.', 1)[-1]})"
                links.append(f'<a href="{_e(page)}" style="color:{STATUS_COLOURS["passed" if ok else "failed"]}">'
                             f'{_e(label)}</a>')
        why = r.get("dq_note") or ""
        if r["dq_status"] == "accepted":
            why = (f'accepted by {r.get("accepted_by")} at {r["accepted_at"]:%Y-%m-%d %H:%M} UTC: '
                   f'{r.get("accepted_reason")} — {why}') if r.get("accepted_at") else why
        body.append(f'<tr data-period="{r["grain"]}:{_e(period_label(r["grain"], r["period_start"]))}">'
                    f'<td>{r["grain"]}</td><td class="p">{_e(period_label(r["grain"], r["period_start"]))}</td>'
                    f'<td>{_badge(r["dq_status"])}</td><td class="note">{_e(why)}</td><td>{" ".join(links)}</td></tr>')
    return ('<section id="quality"><h2>Data quality per period</h2><p class="note">Periods that did not simply pass '
            f'first, then every closed day and month and the last {QUALITY_HOURS} closed hours. Failed periods are not '
            'published and '
            'nothing is rolled up over them until an operator accepts them (<code>traffic accept</code>). Suites link to '
            'their Great Expectations Data Docs pages; the newest runs: <a href="data_docs/index.html">Data Docs</a>.</p>'
            '<table><tr><th>grain</th><th>period</th><th>status</th><th>why</th><th>checks (Data Docs)</th></tr>'
            + ("".join(body) or '<tr><td colspan="5" class="empty">No period closed yet.</td></tr>')
            + '</table></section>')


def refresh_report(settings: Settings, progress=print) -> None:
    """Rewrite ``<warehouse>/_reports/index.html`` (Arrow reads only); a failure here never fails a close."""
    try:
        write_report(settings)
    except Exception as error:  # noqa: BLE001 - the report is a view; the tables are the truth
        progress(f"warning: report not refreshed: {type(error).__name__}: {error}")
