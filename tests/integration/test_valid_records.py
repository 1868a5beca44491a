"""Records a reader accepts pass the checks; no record value reaches an HTML page as markup.

Real ingest and close (shared Spark session) over a stream with the records that used to fail
their whole hour — a JSON ``"direction": "transit"``, a zone id, IPv4-mapped IPv6, a capture's
neither-local packets kept with ``keep_transit`` — and over a warehouse whose every text path
(source folder, record source, input file name, reject reasons, a corrupt stored row that fails
the checks) carries an HTML-injection marker; every page generated is then scanned for it.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from tests.support import capture_factory as cf
from tests.support.harness import Harness, micros
from traffic.accounting.close import CheckFailed
from traffic.app.runs import close
from traffic.storage.warehouse import Warehouse

UTC = timezone.utc
START = datetime(2026, 10, 31, 21, tzinfo=UTC)
END = datetime(2026, 10, 31, 23, tzinfo=UTC)
H21, H22 = START, START + timedelta(hours=1)
MARKER = '"><svg onload=alert(1)>'
#: The marker as live markup: it must never appear in a page (the report's own charts are ``<svg class=…``).
LIVE = "<svg onload=alert(1)>"


def _line(ts: datetime, **fields) -> str:
    return json.dumps({"ts": micros(ts), **fields})


def _stream(local: str = "10.0.0.1") -> str:
    """A packet and a tick every five minutes from START to END, then a tick at END (complete hours)."""
    lines, t = [], START
    while t < END:
        lines.append(_line(t + timedelta(minutes=1), local_ip=local, remote_ip="192.0.2.7", local_port=40000,
                           remote_port=443, bytes=100, direction="out"))
        lines.append(_line(t + timedelta(minutes=4)))
        t += timedelta(minutes=5)
    lines.append(_line(END))
    return "\n".join(lines) + "\n"


def _ns(ts: datetime) -> int:
    return micros(ts) * 1000


def _write(harness: Harness, source: str, name: str, data: bytes) -> Path:
    folder = harness.root / "inbox" / source
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    return folder / name


def test_records_that_used_to_fail_their_hour_are_rejected_or_stored_valid_and_the_hour_is_published(spark, tmp_path):
    harness = Harness(tmp_path, spark, local_networks="10.0.0.0/8", keep_transit="true")
    at = START + timedelta(minutes=31)
    harness.deliver("edge", _stream(), name="stream.jsonl")
    harness.deliver("edge", "\n".join([
        _line(at, local_ip="10.0.0.1", remote_ip="192.0.2.7", bytes=64, direction="transit"),
        _line(at, local_ip="fe80::1%" + MARKER, remote_ip="fe80::2", bytes=64),
        _line(at, local_ip="::ffff:10.0.0.5", remote_ip="192.0.2.7", bytes=1500, direction="in"),
        _line(at, local_ip="::ffff:10.0.0.5", remote_ip="192.0.2.7", bytes=70_000),
    ]) + "\n", name="poison.jsonl")
    _write(harness, "edge", "tap.pcap", cf.pcap([
        cf.Packet(cf.ethernet(cf.ipv4("198.51.100.1", "203.0.113.9", 17, cf.udp(1, 2, b"x" * 100))),
                  _ns(at + timedelta(minutes=1))),
        cf.Packet(cf.ethernet(cf.ipv6("::ffff:10.0.0.7", "::ffff:192.0.2.9", 17, cf.udp(3, 4, b"y" * 52)), 0x86DD),
                  _ns(at + timedelta(minutes=2))),
    ]))
    harness.ingest()
    odd = sorted((r["local_ip"], r["remote_ip"], r["bytes"], r["direction"]) for r in harness.table("packets")
                 if r["local_ip"] != "10.0.0.1")
    assert odd == [("10.0.0.5", "192.0.2.7", 1500, "in"),  # IPv4-mapped: stored as IPv4
                   ("10.0.0.7", "192.0.2.9", 100, "out"),  # a captured IPv6 packet between mapped addresses
                   ("198.51.100.1", "203.0.113.9", 128, None)]  # neither local, kept: direction unknown
    assert sorted(r["reason"] for r in harness.table("rejects")) == [
        "byte count 70000 is more than an IPv4 packet can carry (65535)",
        "direction 'transit' is not in/out/internal (or empty: unknown)",
        f"local_ip 'fe80::1%{MARKER}' has a zone id (the part after %): an address is accounted without one",
    ]

    harness.close()  # raised CheckFailed when one of these rows failed its hour
    ledger = {r["period_start"]: r for r in harness.table("periods") if r["grain"] == "hour"}
    assert {h: ledger[h]["dq_status"] for h in (H21, H22)} == {H21: "passed", H22: "passed"}, ledger
    assert [r for r in harness.table("dq_results") if not r["success"]] == []
    hourly = {(r["local_ip"], r["remote_ip"]): r for r in harness.table("hourly") if r["hour"] == H21}
    assert (hourly[("10.0.0.5", "192.0.2.7")]["bytes_in"], hourly[("198.51.100.1", "203.0.113.9")]["bytes"]) == \
        (1500, 128)


def test_no_record_value_reaches_any_generated_page_unescaped(spark, tmp_path):
    """Markers through every path that still takes text, and through a stored row that fails the checks
    (what a zone id did before readers refused it): every page is scanned, and the marker must have
    reached the report and Data Docs, escaped, for the scan to mean anything."""
    harness = Harness(tmp_path, spark)
    harness.deliver("edge" + MARKER, _stream(), name="stream.jsonl")  # the source is the folder's name
    harness.deliver("edge", _stream("10.0.0.2").replace('"direction": "out"', f'"source": "{MARKER[1:]}"'),
                    name=MARKER + ".jsonl")
    harness.deliver("edge", "\n".join([
        _line(START + timedelta(minutes=7), local_ip="10.0.0.1", remote_ip="192.0.2.7", bytes=1, direction=MARKER),
        _line(START + timedelta(minutes=7), local_ip="fe80::1%" + MARKER, remote_ip="fe80::2", bytes=1),
        json.dumps({"ts": MARKER, "local_ip": "10.0.0.1", "remote_ip": "192.0.2.7", "bytes": 1}),
    ]) + "\n", name=f"bad{MARKER}.jsonl")
    harness.ingest()
    assert any(MARKER in (r["reason"] or "") for r in harness.table("rejects"))
    Warehouse(harness.settings).table("packets").append(pa.Table.from_pylist([{
        "ts": H21 + timedelta(minutes=33), "source": MARKER, "local_ip": "fe80::1%" + MARKER, "remote_ip": "fe80::2",
        "local_port": 1, "remote_port": 2, "protocol": 6, "bytes": 40, "direction": "out", "hour": H21,
        "batch_id": 1, "input_file": MARKER}]))
    said = []
    with pytest.raises(CheckFailed):
        close(harness.settings, lambda: spark, None, said.append)
    assert not [line for line in said if line.startswith("warning")], said  # report and Data Docs were written

    pages = sorted(harness.settings.warehouse.rglob("*.html"))
    live = [str(p.relative_to(harness.settings.warehouse)) for p in pages if LIVE in p.read_text(encoding="utf-8")]
    assert live == [], f"pages with the marker as live markup: {live}"
    report = (harness.settings.warehouse / "_reports" / "index.html").read_text(encoding="utf-8")
    assert "&lt;svg onload=alert(1)&gt;" in report  # the reject reasons and the failed hour's note, escaped
    docs = [p for p in pages if "data_docs" in p.parts and "\\x3csvg onload=alert(1)\\x3e" in p.read_text()]
    assert docs, "no Data Docs page shows the failing values (markup-free)"
