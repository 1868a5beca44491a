"""The HTML traffic report: rendered from a demo-like run, its numbers equal the tables; a real browser draws it.

Two deliveries of the demo's sample traffic (2026-10-31 20:00 → 2026-11-02 02:00, three sources)
are ingested, then one close runs; the second carries the demo's trouble (late records for a closed
hour, bad lines, a re-delivered file) and ``edge-b`` is silent for one hour (an exporter outage: a
completeness warning). The close writes ``_reports/index.html``; the test reads the numbers back
out of it and compares them with the tables, checks it is self-contained, then screenshots it
with headless Chromium into ``test-output/report.png`` (``make screenshots`` also refreshes ``docs/img/``).
"""

from __future__ import annotations

import json
import struct
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.support.harness import Harness
from tests.support.screenshots import chromium_screenshot
from traffic.app import demo
from traffic.app.runs import close
from traffic.reporting.html_report import write_report
from traffic.quality.suite_documents import period_label

UTC = timezone.utc
START = datetime(2026, 10, 31, 20, tzinfo=UTC)
OUTAGE = datetime(2026, 11, 1, 9, tzinfo=UTC)


class Rows(HTMLParser):
    """Every ``<tr>`` with ``data-*`` attributes: its attributes and its cells' attributes and text."""

    def __init__(self):
        super().__init__()
        self.rows: list[dict] = []
        self.links: list[str] = []
        self.tags: set[str] = set()
        self.attrs_seen: list[dict] = []
        self._row = self._cell = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        self.attrs_seen.append(attrs)
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag == "tr" and any(k.startswith("data-") for k in attrs):
            self._row = {"attrs": attrs, "cells": []}
        elif tag == "td" and self._row is not None:
            self._cell = {"attrs": attrs, "text": ""}
        elif tag == "span" and self._row is not None and "data-status" in attrs:
            self._row["status"] = attrs["data-status"]

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._row["cells"].append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None

    def keyed(self, attribute: str) -> dict[str, dict]:
        return {r["attrs"][attribute]: r for r in self.rows if attribute in r["attrs"]}


def _outage(inbox: Path) -> None:
    """edge-b sent nothing between 09:00 and 10:00 on 2026-11-01 (its exporter was down)."""
    for path in (inbox / "edge-b").glob("*.jsonl"):
        kept = [line for line in path.read_text().splitlines()
                if not (OUTAGE <= datetime.fromisoformat(json.loads(line)["ts"]) < OUTAGE + timedelta(hours=1))]
        path.write_text("\n".join(kept) + "\n")


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):
    harness = Harness(tmp_path_factory.mktemp("report"), spark)
    inbox = harness.settings.inbox
    for number, (start, end) in enumerate([(START, START + timedelta(hours=6)),
                                           (START + timedelta(hours=6), START + timedelta(hours=30))]):
        demo.generate(inbox, start, end)
        if number == 1:
            demo.add_trouble(inbox, START + timedelta(hours=1))
            _outage(inbox)
        harness.ingest()  # the trouble's late records are late already: the first batch closed their hour
    close(harness.settings, lambda: spark, None, lambda *_: None)
    page = harness.settings.warehouse / "_reports" / "index.html"
    parser = Rows()
    parser.feed(page.read_text(encoding="utf-8"))
    return harness, page, parser


def _cell(row: dict, index: int, kind: str = "bytes") -> int:
    return int(row["cells"][index]["attrs"][f"data-{kind}"])


def test_close_wrote_the_report_and_its_totals_equal_the_tables(run):
    harness, page, parsed = run
    months = defaultdict(int)
    for r in harness.table("monthly"):
        months[f"{r['month']:%Y-%m}"] += r["bytes"]
    shown = parsed.keyed("data-month")
    assert months and {m: _cell(shown[m], 1) for m in months} == dict(months)
    days: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in harness.table("daily"):
        days[f"{r['day']:%Y-%m-%d}"][0] += r["bytes"]
        days[f"{r['day']:%Y-%m-%d}"][1] += r["packets"]
    shown = parsed.keyed("data-day")
    assert sorted(days) == ["2026-10-31", "2026-11-01"] == sorted(shown)
    assert {d: [_cell(shown[d], 1), _cell(shown[d], 2, "packets")] for d in days} == {d: v for d, v in days.items()}
    ledger = {(r["grain"], r["period_start"]): r for r in harness.table("periods")}
    assert _cell(shown["2026-10-31"], 3) == ledger[("day", datetime(2026, 10, 31, tzinfo=UTC))]["late_bytes"] == 4500


def test_top_talkers_late_and_rejects_match_the_tables(run):
    harness, _, parsed = run
    daily = harness.table("daily")
    for column, attribute in (("local_ip", "data-local-ip"), ("remote_ip", "data-remote-ip")):
        totals = defaultdict(int)
        for r in daily:
            totals[r[column]] += r["bytes"]
        expected = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
        shown = [(r["attrs"][attribute], _cell(r, 1)) for r in parsed.rows if attribute in r["attrs"]]
        assert shown == expected, column
    rejects = harness.table("rejects")
    cards = [a for a in parsed.attrs_seen if "data-rejects" in a and len(a) == 1]
    assert len(rejects) == 4 and int(cards[0]["data-rejects"]) == len(rejects)
    late = harness.table("late_packets")
    late_rows = parsed.keyed("data-late-day")
    assert _cell(late_rows["2026-10-31"], 1) == sum(r["bytes"] for r in late) == 4500
    assert _cell(late_rows["2026-10-31"], 2, "records") == len(late) == 3


def test_data_quality_per_period_matches_the_ledger_and_links_into_data_docs(run):
    harness, page, parsed = run
    ledger = {(r["grain"], r["period_start"]): r for r in harness.table("periods")}
    outage = ledger[("hour", OUTAGE)]
    assert outage["dq_status"] == "warning" and outage["sources_reporting"] < outage["sources_expected"]
    shown = parsed.keyed("data-period")
    assert shown["hour:2026-11-01T09:00Z"]["status"] == "warning"
    assert "completeness" in shown["hour:2026-11-01T09:00Z"]["cells"][3]["text"]
    for (grain, start), row in ledger.items():
        if grain != "hour" or row["dq_status"] != "passed":  # every day, month and flagged hour is listed
            assert shown[f"{grain}:{period_label(grain, start)}"]["status"] == row["dq_status"]
    statuses = {r["dq_status"] for r in ledger.values()}
    assert statuses == {"passed", "warning"}
    docs = [link for link in parsed.links if link.startswith("data_docs/")]
    assert "data_docs/index.html" in docs and len(docs) > 20
    assert all((page.parent / link).exists() for link in docs)


def test_the_report_is_self_contained(run):
    _, page, parsed = run
    text = page.read_text(encoding="utf-8")
    assert not {"script", "link", "img", "iframe"} & parsed.tags
    assert "<svg" in text and text.count("<rect") > 50
    external = [w for w in text.replace('"', " ").split() if w.startswith(("http://", "https://", "//"))]
    assert set(external) <= {"http://www.w3.org/2000/svg"}, set(external)


def test_traffic_report_command_writes_the_same_page(run):
    harness, page, _ = run
    before = page.read_text(encoding="utf-8")
    assert write_report(harness.settings) == page
    assert page.read_text(encoding="utf-8") == before


def test_screenshot_in_headless_chromium(run):
    _, page, _ = run
    data = chromium_screenshot(page, "report.png", 1200, 2400)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1200, 2400) and len(data) > 50_000  # a drawn page, not a blank one


def test_the_hours_chart_ends_with_the_open_hours_as_the_hourly_table_holds_them(run):
    """Open rows are read only after the last frozen hour (hours freeze in order): the open bars must still be
    every open hour of ``hourly``, with its bytes."""
    import re

    from traffic.reporting.html_report import STATUS_COLOURS

    harness, page, _ = run
    open_hours: dict[str, int] = defaultdict(int)
    for r in harness.table("hourly"):
        if r["status"] == "open":
            open_hours[f"{r['hour']:%H}"] += r["bytes"]
    assert open_hours  # the fixture leaves the newest hours open
    chart = page.read_text(encoding="utf-8").split('aria-label="bytes per hour"', 1)[1].split("</svg>", 1)[0]
    bars = re.findall(r'fill="([^"]+)" data-label="(\d\d)" data-bytes="(\d+)"', chart)
    shown = [(label, int(value)) for colour, label, value in bars if colour == STATUS_COLOURS[None]]
    assert shown == sorted(open_hours.items())
