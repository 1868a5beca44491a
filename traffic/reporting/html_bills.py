"""The bills pages of the HTML report: ``<warehouse>/_reports/bills/<period>/<account>.html`` and an index.

One page per account per billing period that has final panes: the bill's figures, the account's
rate per 5-minute pane over the whole period (in and out, a missing pane is 0) with each direction's
95th percentile drawn as a labelled line, and the account's monthly totals. A period whose bills are
stored shows the stored rows, marked final; any other period is computed from its final panes the
way ``traffic bill`` does, marked provisional. Like the rest of the report: Arrow reads only, inline
CSS and SVG, no script, no network, exact values in ``data-*`` attributes. A page's file name is the
account's name escaped for any file system and URL, cut and given a hash of the whole name when it
would pass ``MAX_PAGE_NAME`` bytes (``page_name``), so no account name can stop the report.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from traffic.storage import state as st
from traffic.accounting.bills import (
    account_series,
    account_totals,
    bill_rows,
    billing_cycle,
    compute_period,
    final_panes,
    read_final_panes,
)
from traffic.core.billing import BillingPeriod, billed_series, rate_bps
from traffic.core.periods import PANE_SECONDS, hour_floor, next_month
from traffic.storage.warehouse import Warehouse
from traffic.reporting.html import CSS, human_bytes, number_cell as _num
from traffic.reporting.html import escape as _e

#: Pixel columns of the rate chart's plot area: a month (~8,640 panes) is drawn as the least and
#: the greatest rate of the panes in each column, so the page stays small and no spike is lost.
PLOT_WIDTH = 870
DIRECTION_COLOURS = {"in": "#1f5f99", "out": "#d9822b"}
#: Part of every ``DerivedCache`` fingerprint here: change it when a chart or the monthly totals change form.
CACHE_FORMAT = 1
#: The longest bill page name, in bytes: a file name may have 255, and the page's temporary name
#: (``.<name>.tmp``) and its chart's cache entry (``.chart-<period>-<name>.svg.tmp``) add up to 23.
MAX_PAGE_NAME = 200
BILL_CSS = """
.chart .rate{fill:none;stroke-width:1}.chart .p95{stroke-width:1.5;stroke-dasharray:6 3}
.chart .pl{font-size:11px;font-weight:600}.badge.final{background:#2f7d4f}.badge.provisional{background:#c98a00}
.badge.unstored{background:#7048a8}nav{margin:8px 0 0;font-size:13px}nav a{color:#cfe2f5;margin-right:14px}
"""


@dataclass
class PeriodPage:
    """The bills of one period as the report shows them: rows like the ``bills`` table's, and their status."""

    period: BillingPeriod
    rows: list[dict]
    status: str  # final (stored), unstored (closed, not stored yet) or provisional
    note: str
    panes: pa.Table | None = None  # the period's final panes (``final_panes``), when already read


def human_bps(value: float) -> str:
    """A rate in bits/s with an SI prefix: ``30.19 kbit/s``."""
    for unit in ("bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s"):
        if abs(value) < 1000 or unit == "Tbit/s":
            return f"{value:,.0f} {unit}" if unit == "bit/s" else f"{value:,.2f} {unit}"
        value /= 1000
    return str(value)


def page_name(account: str | None) -> str:
    """A file name for an account that is safe on any file system and in a URL, and at most
    ``MAX_PAGE_NAME`` bytes whatever the account's name.

    Every byte but ``A-Za-z0-9_-`` is written ``~xx``, so a 32-character name in a non-Latin script
    takes 288 bytes or more, past the 255 a file name may have. A name whose escaped form does not fit
    is cut (at an escape's boundary) and followed by ``.`` and 20 hex digits of a SHA-256 of the whole
    name: still unique (an escaped form has no ``.``, so it never equals a cut one) and the same on
    every run; a name that fits keeps the page name it always had.
    """
    name = "(none)" if account is None else account
    safe = re.sub(r"[^A-Za-z0-9_-]", lambda m: "".join(f"~{b:02x}" for b in m.group().encode()), name)
    if len(safe) + len(".html") <= MAX_PAGE_NAME:
        return f"{safe}.html"
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:20]
    cut = MAX_PAGE_NAME - len(f".{digest}.html")
    cut -= 2 if safe[cut - 2:cut - 1] == "~" else 1 if safe[cut - 1:cut] == "~" else 0  # never half an escape
    return f"{safe[:cut]}.{digest}.html"


# -- data --------------------------------------------------------------------------------------

def _stored_periods(warehouse: Warehouse) -> dict[tuple[datetime, datetime], list[dict]]:
    by_period: dict[tuple[datetime, datetime], list[dict]] = defaultdict(list)
    for row in st.rows(warehouse.table("bills").read_arrow()):
        by_period[(row["period_start"], row["period_end"])].append(row)
    return dict(by_period)


def bill_periods(warehouse: Warehouse, cache: "DerivedCache | None" = None) -> list[PeriodPage]:
    """Every period with stored bills, then every later period of the current cycle that has final panes.

    With a ``cache``, the final panes of past days are kept there (``cached_final_panes``).
    """
    stored = _stored_periods(warehouse)
    pages = [PeriodPage(BillingPeriod(rows[0]["period"], start, end),
                        sorted(rows, key=lambda r: (r["account"] is None, r["account"] or "")), "final",
                        "final: stored when the period closed")
             for (start, end), rows in sorted(stored.items())]
    # As the close does: billing resumes where the stored bills end, so only later panes are read
    # (reading every final pane's start made each report slower as history grew). They are read
    # once, from the start of the period billing resumes in, for every page after the stored ones.
    cycle = billing_cycle(warehouse.settings)
    billed_until = max((end for _, end in stored), default=None)
    resume = cycle.period_containing(billed_until).start_utc if billed_until else None
    first_hour = hour_floor(resume) if resume else None
    rows = cached_final_panes(warehouse, cache, first_hour) if cache else read_final_panes(warehouse, first_hour)
    starts = rows.column("pane_start")
    if billed_until:
        starts = starts.filter(pc.greater_equal(starts, pa.scalar(hour_floor(billed_until), starts.type)))
    if len(starts) == 0:
        return pages
    bounds = pc.min_max(starts).as_py()
    first = max(bounds["min"], billed_until) if billed_until else bounds["min"]
    period = cycle.period_containing(first)
    while period.start_utc <= bounds["max"]:
        panes = final_panes(warehouse, period, rows)
        result = compute_period(warehouse, period.label, panes=panes)
        if result.final:
            status, note = "unstored", "final (every hour is published) but not stored yet: the next close stores it"
        else:
            status, note = "provisional", (f"provisional: {result.hours_final} of {result.hours_needed} hour(s) "
                                           f"final; computed from the final panes so far, not stored")
        pages.append(PeriodPage(result.period, bill_rows(result), status, note, panes))
        period = cycle.period_containing(period.end_utc)
    return pages


def cached_final_panes(warehouse: Warehouse, cache: "DerivedCache", start: datetime | None) -> pa.Table:
    """``read_final_panes(warehouse, start)``, a day at a time: each day's rows are kept in ``cache``,
    keyed by the data files of its hours, so a report reads only the days whose files changed (today's)."""
    days = warehouse.table("panes").files_by_span(start)
    if days is None:
        return read_final_panes(warehouse, start)
    parts = []
    for day, paths in days.items():
        lo = max(start, day) if start else day
        parts.append(cache.table(f"panes-{day:%Y-%m-%d}.arrow", [CACHE_FORMAT, lo.isoformat(), sorted(paths)],
                                 lambda lo=lo, day=day: read_final_panes(warehouse, lo, day + timedelta(days=1))))
    return pa.concat_tables(parts) if parts else read_final_panes(warehouse, start)


def rate_series(panes: pa.Table, period: BillingPeriod, unknown_direction: str) -> dict[str | None, dict]:
    """Per account, the bytes per pane index of the billed inbound and outbound series (as ``compute_bill``).

    ``panes`` is the period's ``final_panes``.
    """
    series: dict[str | None, dict] = defaultdict(lambda: {"in": {}, "out": {}})
    for account, by_direction in account_series(panes, period).items():
        series[account] = dict(zip(("in", "out"), billed_series(by_direction, unknown_direction)))
    return series


def envelope(pane_bytes: dict[int, int], n_panes: int, columns: int) -> list[tuple[int, int]]:
    """(least, greatest) bytes of the panes in each of ``columns`` columns (missing panes are 0)."""
    out = []
    for c in range(columns):
        lo, hi = c * n_panes // columns, (c + 1) * n_panes // columns
        values = [pane_bytes.get(i, 0) for i in range(lo, hi)]
        out.append((min(values), max(values)))
    return out


# -- rendering ---------------------------------------------------------------------------------

def _nice_ceiling(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude = 10 ** (len(str(int(value))) - 1)
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return 10 * magnitude


def rate_chart(series: dict[str, dict[int, int]], row: dict, period: BillingPeriod, width: int = 960,
               height: int = 320) -> str:
    """In and out rate (bits/s) per pane over the whole period, with each direction's 95th percentile."""
    left, top, bottom = width - PLOT_WIDTH - 10, 30, 40
    plot_h = height - top - bottom
    n_panes = period.pane_count
    columns = min(n_panes, PLOT_WIDTH)
    peak = max([rate_bps(max(s.values(), default=0)) for s in series.values()]
               + [row["p95_in_bps"], row["p95_out_bps"]])
    y_max = _nice_ceiling(peak)

    def y(bps: float) -> float:
        return round(top + plot_h * (1 - bps / y_max), 1)

    parts = [f'<svg class="chart" id="rate" role="img" aria-label="rate per 5-minute pane" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" '
             f'data-panes="{n_panes}" data-columns="{columns}" data-y-max-bps="{y_max!r}" data-plot-top="{top}" '
             f'data-plot-height="{plot_h}">',
             f'<text x="{left}" y="15" class="ct">rate per 5-minute pane, {period.start_utc:%Y-%m-%d %H:%M} → '
             f'{period.end_utc:%Y-%m-%d %H:%M} UTC ({n_panes:,} panes; missing panes count as 0)</text>']
    for fraction in (0, 0.25, 0.5, 0.75, 1):
        at = top + plot_h * (1 - fraction)
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{at:.1f}" y2="{at:.1f}" class="grid"/>'
                     f'<text x="{left - 6}" y="{at + 4:.1f}" class="ax" text-anchor="end">'
                     f'{_e(human_bps(y_max * fraction))}</text>')
    panes_per_day = 86400 // PANE_SECONDS
    days = n_panes // panes_per_day
    for day in range(0, days + 1, 1 if days <= 10 else 7 if days > 40 else 3):
        x = left + PLOT_WIDTH * day * panes_per_day / n_panes
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + plot_h}" class="grid"/>'
                     f'<text x="{x:.1f}" y="{top + plot_h + 14}" class="ax" text-anchor="middle">'
                     f'{period.start_utc + timedelta(days=day):%m-%d}</text>')
    for direction in ("in", "out"):
        points = []
        for c, (lo, hi) in enumerate(envelope(series[direction], n_panes, columns)):
            x = f"{left + PLOT_WIDTH * (c + 0.5) / columns:.1f}"
            points.append(f"{x},{y(rate_bps(lo))} {x},{y(rate_bps(hi))}" if columns < n_panes
                          else f"{x},{y(rate_bps(hi))}")
        parts.append(f'<polyline class="rate" data-direction="{direction}" data-panes="{n_panes}" '
                     f'data-bytes="{sum(series[direction].values())}" stroke="{DIRECTION_COLOURS[direction]}" '
                     f'points="{" ".join(points)}"/>')
    for direction, offset in (("in", -4), ("out", 12)):
        bps, pane_bytes = row[f"p95_{direction}_bps"], row[f"p95_{direction}_pane_bytes"]
        at = y(bps)
        parts.append(f'<line class="p95" data-direction="{direction}" data-bps="{bps!r}" '
                     f'data-pane-bytes="{pane_bytes}" data-rank="{row["p95_rank"]}" x1="{left}" x2="{width - 10}" '
                     f'y1="{at}" y2="{at}" stroke="{DIRECTION_COLOURS[direction]}"/>'
                     f'<text class="pl" x="{width - 12}" y="{at + offset:.1f}" text-anchor="end" '
                     f'fill="{DIRECTION_COLOURS[direction]}">95th percentile {direction}: {_e(human_bps(bps))}</text>')
    legend_y = height - 8
    parts.append(f'<rect x="{left}" y="{legend_y - 9}" width="10" height="10" fill="{DIRECTION_COLOURS["in"]}"/>'
                 f'<text x="{left + 14}" y="{legend_y}" class="ax">in</text>'
                 f'<rect x="{left + 40}" y="{legend_y - 9}" width="10" height="10" fill="{DIRECTION_COLOURS["out"]}"/>'
                 f'<text x="{left + 54}" y="{legend_y}" class="ax">out (dashed: 95th percentile; each column spans '
                 f'the least and greatest pane it covers)</text></svg>')
    return "".join(parts)


def _badge(status: str) -> str:
    return f'<span class="badge {status}" data-bill-status="{status}">{_e(status)}</span>'


def _figures(row: dict) -> str:
    cells = [("bytes in", "bytes_in", "bytes"), ("bytes out", "bytes_out", "bytes"),
             ("bytes internal", "bytes_internal", "bytes"), ("bytes transit", "bytes_transit", "bytes"),
             ("bytes of unknown direction", "bytes_unknown", "bytes"), ("bytes in total", "bytes_total", "bytes"),
             ("panes in the period", "panes", "value"), ("rank of the 95th percentile", "p95_rank", "value"),
             ("95th-percentile pane in (bytes)", "p95_in_pane_bytes", "bytes"),
             ("95th-percentile pane out (bytes)", "p95_out_pane_bytes", "bytes"),
             ("billable pane (bytes)", "billable_pane_bytes", "bytes")]
    body = "".join(f'<tr data-figure="{name}"><td>{label}</td>{_num(row[name], kind)}</tr>' for label, name, kind in cells)
    for label, name in (("95th percentile in", "p95_in_bps"), ("95th percentile out", "p95_out_bps"),
                        ("billable rate", "billable_bps"), ("committed rate", "commit_bps"),
                        ("overage over the commit", "overage_bps")):
        if row.get(name) is None:  # no commit (or a bill stored before commits existed)
            body += f'<tr data-figure="{name}"><td>{label}</td><td class="n" data-bps="">-</td></tr>'
            continue
        body += (f'<tr data-figure="{name}"><td>{label}</td><td class="n" data-bps="{row[name]!r}">'
                 f'{row[name]:,.3f} bit/s ({_e(human_bps(row[name]))})</td></tr>')
    for label, name in (("billing rule", "billing_rule"), ("unknown direction counts as", "billing_unknown_direction"),
                        ("billing cycle day", "billing_cycle_day"), ("billing time zone", "billing_timezone")):
        body += f'<tr data-figure="{name}"><td>{label}</td><td data-value="{_e(row[name])}">{_e(row[name])}</td></tr>'
    versions = ", ".join(row["mapping_versions"] or [])
    body += (f'<tr data-figure="mapping_versions"><td>mapping version(s)</td><td data-value="{_e(versions)}">'
             f'{_e(versions or "-")}</td></tr>')
    return '<table><tr><th>figure</th><th>value</th></tr>' + body + '</table>'


def _monthly(totals: list[dict]) -> str:
    directions = ("in", "out", "internal", "transit", None)
    months: dict[str, dict] = defaultdict(lambda: defaultdict(int))
    for r in totals:
        months[f"{r['month']:%Y-%m}"][r["direction"]] += r["bytes"]
    body = "".join(
        f'<tr data-month-total="{m}"><td>{m}</td>'
        + "".join(_num(values.get(d, 0)) for d in directions) + _num(sum(values.values())) + '</tr>'
        for m, values in sorted(months.items()))
    return ('<table><tr><th>month</th><th>in</th><th>out</th><th>internal</th><th>transit</th><th>unknown</th>'
            '<th>total</th></tr>' + (body or '<tr><td colspan="7" class="empty">No month rolled up yet.</td></tr>')
            + '</table><p class="note">Calendar months (UTC) that are rolled up, from the final panes '
              '(<code>traffic show account-monthly</code>); they reconcile to the byte with the monthly totals.</p>')


def _page(title: str, meta: str, body: str, depth: int) -> str:
    up = "../" * depth
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{CSS}{BILL_CSS}</style>'
            f'</head><body><header><h1>{_e(title)}</h1><div class="meta">{meta}</div><nav>'
            f'<a href="{up}index.html">traffic report</a><a href="{up}bills/index.html">all bills</a></nav></header>'
            f'<main>{body}</main></body></html>')


def bill_page(page: PeriodPage, row: dict, chart: str, totals: list[dict], generated: datetime) -> str:
    """One account's bill for one period (``chart``: its ``rate_chart``)."""
    period = page.period
    cards = (f'<div class="cards"><div class="card"><b data-bytes="{row["bytes_in"]}">{_e(human_bytes(row["bytes_in"]))}'
             f'</b><span>in</span></div><div class="card"><b data-bytes="{row["bytes_out"]}">'
             f'{_e(human_bytes(row["bytes_out"]))}</b><span>out</span></div><div class="card"><b data-bytes='
             f'"{row["bytes_total"]}">{_e(human_bytes(row["bytes_total"]))}</b><span>in total</span></div>'
             f'<div class="card"><b>{_e(human_bps(row["p95_in_bps"]))}</b><span>95th percentile in</span></div>'
             f'<div class="card"><b>{_e(human_bps(row["p95_out_bps"]))}</b><span>95th percentile out</span></div>'
             f'<div class="card"><b>{_e(human_bps(row["billable_bps"]))}</b><span>billable rate (rule '
             f'{_e(row["billing_rule"])})</span></div></div>')
    meta = (f'{period.start_utc:%Y-%m-%d %H:%M} → {period.end_utc:%Y-%m-%d %H:%M} UTC · {_badge(page.status)} '
            f'{_e(page.note)} · generated {generated:%Y-%m-%d %H:%M} UTC')
    body = (cards + '<section id="rate-chart"><h2>Rate per 5-minute pane</h2>' + chart
            + '<p class="note">The 95th percentile of a direction is the pane at rank ⌈0.95·N⌉ of the N panes of '
              'the period sorted by size (missing panes are 0); the billable rate is the larger of the two (rule '
              '<code>max</code>) or their sum (<code>sum</code>).</p></section>'
            + f'<section id="figures"><h2>Bill</h2>{_figures(row)}</section>'
            + f'<section id="monthly"><h2>Monthly totals of {_e(row["account"])}</h2>{_monthly(totals)}</section>')
    return _page(f"Bill {period.label} · {row['account']}", meta, body, depth=2)


def bills_table(pages: list[PeriodPage], prefix: str) -> str:
    """Every bill, newest period first, each linking to its page (``prefix`` + period/account.html)."""
    body = "".join(
        f'<tr data-bill="{_e(page.period.label)}/{_e(row["account"])}"><td>{_e(page.period.label)}</td>'
        f'<td><a href="{prefix}{_e(page.period.label)}/{_e(page_name(row["account"]))}">{_e(row["account"])}</a></td>'
        f'<td>{_badge(page.status)}</td>{_num(row["bytes_in"])}{_num(row["bytes_out"])}{_num(row["bytes_total"])}'
        f'<td class="n" data-bps="{row["p95_in_bps"]!r}">{_e(human_bps(row["p95_in_bps"]))}</td>'
        f'<td class="n" data-bps="{row["p95_out_bps"]!r}">{_e(human_bps(row["p95_out_bps"]))}</td>'
        f'<td class="n" data-bps="{row["billable_bps"]!r}">{_e(human_bps(row["billable_bps"]))}</td></tr>'
        for page in reversed(pages) for row in page.rows)
    return ('<table><tr><th>period</th><th>account</th><th>status</th><th>bytes in</th><th>bytes out</th>'
            '<th>bytes total</th><th>p95 in</th><th>p95 out</th><th>billable</th></tr>'
            + (body or '<tr><td colspan="9" class="empty">No billing period has final panes yet.</td></tr>')
            + '</table>')


def write_bill_pages(warehouse: Warehouse, out: Path, generated: datetime) -> list[PeriodPage]:
    """Write ``out/bills/index.html`` and one page per (period, account); remove pages no longer produced.

    What seldom changes (the accounts' monthly totals, the rate charts of stored bills, the final panes
    of past days) is kept in ``out/.cache`` (``DerivedCache``), each with a fingerprint of what it was
    derived from, so a report reads today's final panes only, however long the history.
    """
    cache = DerivedCache(out / ".cache")
    pages = bill_periods(warehouse, cache)
    folder = out / "bills"
    folder.mkdir(parents=True, exist_ok=True)
    totals = account_month_totals(warehouse, cache)
    written = set()
    for page in pages:
        by_rule: dict[str, dict] = {}

        def chart(row: dict, page: PeriodPage = page, by_rule: dict = by_rule) -> str:
            unknown = row["billing_unknown_direction"]
            if unknown not in by_rule:
                if page.panes is None:
                    page.panes = final_panes(warehouse, page.period)
                by_rule[unknown] = rate_series(page.panes, page.period, unknown)
            return rate_chart(by_rule[unknown][row["account"]], row, page.period)

        for row in page.rows:
            name = page_name(row["account"])
            # A stored bill's chart changes only if its stored row does.
            svg = cache.text(f"chart-{page.period.label}-{name}.svg", [CACHE_FORMAT, row], lambda: chart(row)) \
                if page.status == "final" else chart(row)
            mine = [r for r in totals if r["account"] == row["account"]]
            path = folder / page.period.label / name
            _write(path, bill_page(page, row, svg, mine, generated))
            written.add(path)
    cache.forget_unused()
    _write(folder / "index.html", _page(
        "Bills", f'per account and billing period · generated {generated:%Y-%m-%d %H:%M} UTC',
        '<section id="bills"><h2>Bills</h2>' + bills_table(pages, "") + '<p class="note">Final bills are the stored '
        'rows of the <code>bills</code> table (written when a period closes); provisional ones are computed from the '
        'final panes so far, as <code>traffic bill</code> prints them.</p></section>', depth=1))
    written.add(folder / "index.html")
    for stale in folder.rglob("*.html"):
        if stale not in written:
            stale.unlink()
    return pages


def account_month_totals(warehouse: Warehouse, cache: "DerivedCache") -> list[dict]:
    """``account_totals(warehouse, "month")``, each rolled-up month computed once and kept in ``cache``
    (keyed by the month's ledger row, so a month rolled up again is computed again)."""
    parts = [cache.table(f"account-month-{row['period_start']:%Y-%m}.arrow", [CACHE_FORMAT, row],
                         lambda row=row: account_totals(warehouse, "month", row["period_start"],
                                                        next_month(row["period_start"])))
             for row in sorted(st.read_ledger(warehouse, "month"), key=lambda r: r["period_start"])]
    return [row for part in parts for row in st.rows(part)]


class DerivedCache:
    """Things the report derives from data that seldom changes, each stored with a fingerprint of its inputs.

    ``text``/``table`` return the stored value when the fingerprint of ``inputs`` (any JSON-able
    value) matches, else make, store and return it. Entries not asked for in a run are removed by
    ``forget_unused``. Deleting the folder only costs the next report the time to rebuild it.
    """

    def __init__(self, folder: Path):
        self.folder = folder
        self.used: set[str] = set()

    @staticmethod
    def fingerprint(inputs) -> str:
        return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()

    def text(self, name: str, inputs, make) -> str:
        path, fingerprint = self._entry(name), self.fingerprint(inputs)
        try:
            stored, _, value = path.read_text(encoding="utf-8").partition("\n")
            if stored == fingerprint:
                return value
        except OSError:
            pass
        value = make()
        _write(path, f"{fingerprint}\n{value}")
        return value

    def table(self, name: str, inputs, make) -> pa.Table:
        import pyarrow.feather as feather

        path, fingerprint = self._entry(name), self.fingerprint(inputs)
        try:
            stored = feather.read_table(str(path), memory_map=False)
            if (stored.schema.metadata or {}).get(b"fingerprint") == fingerprint.encode():
                return stored.replace_schema_metadata(None)
        except (OSError, pa.ArrowInvalid):
            pass
        value = make()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        feather.write_feather(value.replace_schema_metadata({"fingerprint": fingerprint}), str(tmp),
                              compression="uncompressed")
        tmp.replace(path)
        return value

    def _entry(self, name: str) -> Path:
        self.used.add(name)
        return self.folder / name

    def forget_unused(self) -> None:
        if self.folder.exists():
            for path in self.folder.iterdir():
                if path.name not in self.used:
                    path.unlink()


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)  # readers never see half a page
