"""The report's bills pages and top-talkers tables: their numbers equal the tables; a real browser draws a bill.

One source sends every 5-minute pane from 2026-10-30 08:00 to 2026-11-01 02:00 UTC for two accounts
(``acme``: a daily wave with one spike, in and out, plus traffic of unknown direction; ``globex``:
inbound only) and one unassigned host; a tick at 03:00 lets one close freeze every hour. October
closes (its bills are stored), November is provisional. The report is written by that close; the
test reads each bills page back — figures, the 95th-percentile lines, the rate chart's points — and
compares them with the ``bills`` table, with ``compute_period`` and with the final panes, checks the
top-talkers tables against ``top_talkers``, then screenshots acme's October bill with headless
Chromium into ``test-output/bills.png``.
"""

from __future__ import annotations

import json
import math
import struct
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.integration.test_report import Rows
from tests.support.accounts import V1
from tests.support.harness import Harness
from tests.support.screenshots import chromium_screenshot
from traffic.app import cli
from traffic.accounting.bills import account_totals, bill_rows, compute_period, final_panes
from traffic.core.billing import BillingCycle
from traffic.reporting.html_bills import page_name
from traffic.reporting.top import top_talkers

UTC = timezone.utc
PANE = timedelta(minutes=5)
START = datetime(2026, 10, 30, 8, tzinfo=UTC)
PANES = 42 * 12  # to 2026-11-01 02:00: 480 of October's panes carry traffic, more than 5 % of its 8,928
TICK = datetime(2026, 11, 1, 3, tzinfo=UTC)
FIGURES = ("bytes_in", "bytes_out", "bytes_internal", "bytes_transit", "bytes_unknown", "bytes_total", "panes",
           "p95_rank", "p95_in_pane_bytes", "p95_out_pane_bytes", "billable_pane_bytes")
RATES = ("p95_in_bps", "p95_out_bps", "billable_bps")


def _records() -> list[dict]:
    records = []
    for i in range(PANES):
        t = START + PANE * i
        wave = int(15_000 * (1 + math.sin(2 * math.pi * i / 288)))
        spike = 20_000 if i == 400 else 0
        records += [
            {"ts": t + timedelta(minutes=1), "local_ip": "10.0.0.5", "remote_ip": "192.0.2.1",
             "bytes": 10_000 + wave + spike, "direction": "in"},
            {"ts": t + timedelta(minutes=2), "local_ip": "10.0.0.6", "remote_ip": "192.0.2.2",
             "bytes": 4_000 + 10 * i, "direction": "out"},
            {"ts": t + timedelta(minutes=3), "local_ip": "10.0.0.5", "remote_ip": "192.0.2.3", "bytes": 1_000,
             "direction": None},
            {"ts": t + timedelta(minutes=3), "local_ip": "10.0.1.9", "remote_ip": "192.0.2.1",
             "bytes": 2_000 + 100 * (i % 12), "direction": "in"},
            {"ts": t + timedelta(minutes=4), "local_ip": "10.9.9.9", "remote_ip": "192.0.2.4", "bytes": 300,
             "direction": "out"},
        ]
    return records


def _jsonl(records: list[dict]) -> str:
    lines = []
    for r in records:
        doc = {"ts": r["ts"].isoformat(), "local_ip": r["local_ip"], "remote_ip": r["remote_ip"],
               "local_port": 40000, "remote_port": 443, "protocol": 6, "bytes": r["bytes"]}
        if r["direction"]:
            doc["direction"] = r["direction"]
        lines.append(json.dumps(doc))
    return "\n".join(lines + [json.dumps({"ts": TICK.isoformat()})]) + "\n"


def _parse(path: Path) -> Rows:
    parsed = Rows()
    parsed.feed(path.read_text(encoding="utf-8"))
    return parsed


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("bills-report")
    (root / "accounts.toml").write_text(V1)
    harness = Harness(root, spark, accounts_file=root / "accounts.toml", keep_hours=1000)
    harness.deliver("flows", _jsonl(_records()), "flows.jsonl")
    harness.ingest()
    assert harness.table("rejects") == []  # every record within the bounds: the bills are as designed
    result = harness.close()  # stores October's bills and writes the report
    assert result.bills_stored == ["2026-10"]
    return harness, harness.settings.warehouse / "_reports"


#: The commit and the overage over it: shown as "-" (no exact value) when the account has no commit.
COMMIT = ("commit_bps", "overage_bps")


def _figures(parsed: Rows) -> dict:
    shown = {}
    for name, row in parsed.keyed("data-figure").items():
        attrs = row["cells"][1]["attrs"]
        shown[name] = (int(attrs.get("data-bytes", attrs.get("data-value", 0))) if name in FIGURES
                       else float(attrs["data-bps"]) if name in RATES
                       else (float(attrs["data-bps"]) if attrs["data-bps"] else None) if name in COMMIT
                       else attrs["data-value"])
    return shown


def _expected(row: dict) -> dict:
    return {**{k: row[k] for k in FIGURES + RATES + COMMIT}, "mapping_versions": ", ".join(row["mapping_versions"]),
            **{k: str(row[k]) for k in ("billing_rule", "billing_unknown_direction", "billing_cycle_day",
                                        "billing_timezone")}}


def _svg(parsed: Rows, tag_filter) -> list[dict]:
    return [a for a in parsed.attrs_seen if tag_filter(a)]


def test_octobers_bills_pages_equal_the_bills_table_and_compute_period(run):
    harness, reports = run
    stored = {r["account"]: r for r in harness.table("bills")}
    assert set(stored) == {"acme", "globex", "unassigned"} and {r["period"] for r in stored.values()} == {"2026-10"}
    computed = {r["account"]: r for r in bill_rows(compute_period(harness.warehouse(), "2026-10"))}
    for account, row in stored.items():
        parsed = _parse(reports / "bills" / "2026-10" / page_name(account))
        assert _figures(parsed) == _expected(row) == _expected(computed[account]), account
        assert {a["data-bill-status"] for a in parsed.attrs_seen if "data-bill-status" in a} == {"final"}
        lines = {a["data-direction"]: a for a in _svg(parsed, lambda a: a.get("class") == "p95")}
        for direction in ("in", "out"):
            assert float(lines[direction]["data-bps"]) == row[f"p95_{direction}_bps"]
            assert int(lines[direction]["data-pane-bytes"]) == row[f"p95_{direction}_pane_bytes"]
    acme = stored["acme"]
    assert acme["p95_in_pane_bytes"] > 10_000 and acme["billable_bps"] == acme["p95_in_pane_bytes"] * 8 / 300


def test_the_rate_chart_covers_every_pane_of_the_period_from_the_final_panes(run):
    harness, reports = run
    period = BillingCycle().period_for("2026-10")
    assert period.pane_count == 31 * 288
    series: dict[str, list[int]] = {"in": [0] * period.pane_count, "out": [0] * period.pane_count}
    for p in final_panes(harness.warehouse(), period).to_pylist():
        if p["account"] == "acme":  # unknown direction counts as in (billing_unknown_direction = in)
            series["in" if p["direction"] in ("in", None) else "out"][period.pane_index(p["pane_start"])] += p["bytes"]
    row = next(r for r in harness.table("bills") if r["account"] == "acme")
    parsed = _parse(reports / "bills" / "2026-10" / "acme.html")
    chart = next(a for a in parsed.attrs_seen if a.get("id") == "rate")
    columns = int(chart["data-columns"])
    assert int(chart["data-panes"]) == period.pane_count == row["panes"] and columns < period.pane_count
    y_max, top, height = float(chart["data-y-max-bps"]), float(chart["data-plot-top"]), float(chart["data-plot-height"])
    polylines = {a["data-direction"]: a for a in _svg(parsed, lambda a: a.get("class") == "rate")}
    assert int(polylines["in"]["data-bytes"]) == sum(series["in"]) == row["bytes_in"] + row["bytes_unknown"]
    assert int(polylines["out"]["data-bytes"]) == sum(series["out"]) == row["bytes_out"]
    for direction, values in series.items():
        points = [tuple(map(float, p.split(","))) for p in polylines[direction]["points"].split()]
        assert int(polylines[direction]["data-panes"]) == period.pane_count
        assert len(points) == 2 * columns  # each pixel column: its least and its greatest pane
        expected = []
        for c in range(columns):
            covered = values[c * period.pane_count // columns:(c + 1) * period.pane_count // columns]
            expected += [min(covered), max(covered)]
        drawn = [top + height * (1 - b * 8 / 300 / y_max) for b in expected]
        assert max(abs(p[1] - y) for p, y in zip(points, drawn)) <= 0.051, direction
    # The spike (pane 400) is the highest point drawn; the p95 lines sit under it.
    assert min(y for _, y in (tuple(map(float, p.split(","))) for p in polylines["in"]["points"].split())) == \
        pytest.approx(top + height * (1 - max(series["in"]) * 8 / 300 / y_max), abs=0.051)


def test_a_period_not_closed_is_provisional_and_computed_like_traffic_bill(run):
    harness, reports = run
    assert "2026-11" not in {r["period"] for r in harness.table("bills")}
    result = compute_period(harness.warehouse(), "2026-11")
    assert not result.final and result.hours_final == 3  # 00:00-02:00 frozen
    for row in bill_rows(result):
        parsed = _parse(reports / "bills" / "2026-11" / page_name(row["account"]))
        assert _figures(parsed) == _expected(row), row["account"]
        assert {a["data-bill-status"] for a in parsed.attrs_seen if "data-bill-status" in a} == {"provisional"}
    index = _parse(reports / "bills" / "index.html").keyed("data-bill")
    assert sorted(index) == sorted(f"{p}/{a}" for p in ("2026-10", "2026-11") for a in ("acme", "globex", "unassigned"))


def test_monthly_totals_on_the_bills_page_equal_account_totals(run):
    harness, reports = run
    totals = defaultdict(dict)
    for r in account_totals(harness.warehouse(), "month").to_pylist():
        if r["account"] == "acme":
            totals[f"{r['month']:%Y-%m}"][r["direction"]] = r["bytes"]
    shown = _parse(reports / "bills" / "2026-10" / "acme.html").keyed("data-month-total")
    assert list(totals) == ["2026-10"] == list(shown)
    cells = [int(c["attrs"]["data-bytes"]) for c in shown["2026-10"]["cells"][1:]]
    assert cells == [totals["2026-10"].get(d, 0) for d in ("in", "out", "internal", "transit", None)] + \
        [sum(totals["2026-10"].values())]


def test_the_index_links_the_bills_and_shows_top_talkers_of_the_last_day(run):
    harness, reports = run
    parsed = _parse(reports / "index.html")
    warehouse = harness.warehouse()
    for by in ("host", "peer", "account"):
        expected = top_talkers(warehouse, timedelta(hours=24), by, 10)
        assert expected.end == TICK and expected.rows
        shown = [r for r in parsed.rows if f"data-top-{by}" in r["attrs"]]
        assert [(r["attrs"][f"data-top-{by}"], *(int(c["attrs"]["data-bytes" if i != 2 else "data-packets"])
                                                 for i, c in enumerate(r["cells"][1:5], 1))) for r in shown] == \
            [(e["key"], e["bytes"], e["packets"], e["bytes_in"], e["bytes_out"]) for e in expected.rows], by
    window = next(a for a in parsed.attrs_seen if "data-top-start" in a)
    assert window["data-top-start"] == (TICK - timedelta(hours=24)).isoformat()
    links = [link for link in parsed.links if link.startswith("bills/")]
    assert "bills/index.html" in links and "bills/2026-10/acme.html" in links
    assert all((reports / link).exists() for link in links)


def test_traffic_report_top_last_chooses_the_window(run, capsys):
    harness, reports = run
    assert cli.main(["report", "--warehouse", str(harness.settings.warehouse), "--set",
                     f"accounts_file={harness.root / 'accounts.toml'}", "--set", "now=2026-12-01T00:00:00+00:00",
                     "--top-last", "90m"]) == 0
    parsed = _parse(reports / "index.html")
    window = next(a for a in parsed.attrs_seen if "data-top-start" in a)
    assert window["data-top-start"] == (TICK - timedelta(minutes=90)).isoformat()
    expected = top_talkers(harness.warehouse(), timedelta(minutes=90), "account", 10)
    assert expected.raw_hours  # the window starts inside an hour: that part is read from raw detail
    assert [(r["attrs"]["data-top-account"], int(r["cells"][1]["attrs"]["data-bytes"]))
            for r in parsed.rows if "data-top-account" in r["attrs"]] == [(e["key"], e["bytes"]) for e in expected.rows]
    capsys.readouterr()
    assert cli.main(["report", "--warehouse", str(harness.settings.warehouse), "--top-last", "0"]) == 2
    assert "--top-last must be a positive duration" in capsys.readouterr().err


def test_a_later_report_reads_only_the_open_periods_panes_and_writes_the_same_pages(run, monkeypatch):
    """Stored bills' charts, the monthly totals and past days' final panes are kept in ``_reports/.cache``: a
    report after them reads none of those panes again, and its pages equal those made without the cache."""
    from traffic.reporting import html_bills

    harness, reports = run
    warehouse = harness.warehouse()
    generated = datetime(2026, 11, 1, 4, tzinfo=UTC)
    html_bills.write_bill_pages(warehouse, reports, generated)
    pages = {p: p.read_bytes() for p in (reports / "bills").rglob("*.html")}
    assert {p.name for p in (reports / ".cache").iterdir()} == {
        "account-month-2026-10.arrow", "panes-2026-11-01.arrow",
        *(f"chart-2026-10-{a}.html.svg" for a in ("acme", "globex", "unassigned"))}
    read = []
    real_final_panes, real_totals, real_read = html_bills.final_panes, html_bills.account_totals, \
        html_bills.read_final_panes
    monkeypatch.setattr(html_bills, "final_panes", lambda w, period, rows=None: read.append(
        (period.label, rows is not None)) or real_final_panes(w, period, rows))
    monkeypatch.setattr(html_bills, "account_totals", lambda *a: read.append(("totals", a[1:])) or real_totals(*a))
    monkeypatch.setattr(html_bills, "read_final_panes", lambda w, *keys: read.append(("panes", keys)) or
                        real_read(w, *keys))
    html_bills.write_bill_pages(warehouse, reports, generated)
    assert read == [("2026-11", True)]  # the open period, from the cached panes after the stored bills
    assert {p: p.read_bytes() for p in (reports / "bills").rglob("*.html")} == pages
    # Without the cache, everything is derived again, to the same pages.
    for path in (reports / ".cache").iterdir():
        path.unlink()
    read.clear()
    html_bills.write_bill_pages(warehouse, reports, generated)
    assert sorted(read, key=str) == sorted([("2026-11", True), ("2026-10", False), ("totals", (
        "month", datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC))),
        ("panes", (datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 2, tzinfo=UTC)))], key=str)
    assert {p: p.read_bytes() for p in (reports / "bills").rglob("*.html")} == pages


def test_bills_pages_are_self_contained_and_small(run):
    _, reports = run
    for page in (reports / "bills").rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert not {"script", "link", "img", "iframe"} & _parse(page).tags, page
        external = [w for w in text.replace('"', " ").split() if w.startswith(("http://", "https://", "//"))]
        assert set(external) <= {"http://www.w3.org/2000/svg"}, (page, set(external))
        assert len(text) < 80_000, (page, len(text))


def test_screenshot_of_a_bills_page_in_headless_chromium(run):
    _, reports = run
    data = chromium_screenshot(reports / "bills" / "2026-10" / "acme.html", "bills.png", 1200, 1300)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1200, 1300) and len(data) > 30_000  # a drawn page, not a blank one
