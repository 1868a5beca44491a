"""Replay decodes flow telemetry with its own state and never writes the live one (DESIGN §7a, issue 34 item 7).

A live batch teaches the source a template, a sampling rate of 100 (IPFIX options data) and leaves one
data set waiting for its template. An archive file of the same exporter from two days before, with its
own template layout and rate, is replayed. The next live batch must still decode with the live
template and rate, and the data that waited must be read when its template arrives.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from tests.support import flow_encoder as fe
from tests.support.harness import Harness
from traffic.app.runs import replay
from traffic.io.telemetry import TelemetryState

UTC = timezone.utc
US = 1_000_000
LIVE = datetime(2026, 11, 3, 10, tzinfo=UTC)
ARCHIVE = LIVE - timedelta(days=2)
ROUTER = "192.0.2.7"
LOCAL = "10.1.0.0/16,2001:db8:1::/48"
DOMAIN = 7
#: The live exporter's layout (8-byte counters) and the archive's (4-byte counters) of the same template id.
V4 = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8)]
V4_OLD = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 4), (2, 4), (152, 8), (153, 8)]
V6 = [(27, 16), (28, 16), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8)]
OPTIONS = [(149, 4)], [(305, 4), (306, 4)]  # scope observationDomainId; samplingPacketInterval/Space


def _us(ts: datetime) -> int:
    return int(ts.timestamp()) * US


def _flow(src, dst, size, packets, at: datetime) -> dict:
    return fe.flow_values(fe.Flow(src, dst, 40000, 443, 6, size, packets, _us(at), _us(at)))


def _message(at: datetime, sets, sequence: int) -> tuple[int, str, int, bytes]:
    return _us(at), ROUTER, 4739, fe.ipfix(sets, export_s=_us(at) // US, sequence=sequence, domain=DOMAIN)


def _rate(interval: int, space: int) -> list[bytes]:
    """Options template 400 and its data: 1 packet sampled of every ``interval + space``."""
    scope, fields = OPTIONS
    return [fe.options_template_set(400, scope, fields),
            fe.data_set(400, [fe.record([*scope, *fields], {149: DOMAIN, 305: interval, 306: space})])]


def _write(folder, name: str, datagrams) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(fe.collector_file(datagrams))


def _pairs(rows) -> dict:
    out: dict = {}
    for r in rows:
        key = (r["local_ip"], r["remote_ip"])
        b, p = out.get(key, (0, 0))
        out[key] = (b + r["bytes"], p + r["packets"])
    return out


def _state(harness) -> TelemetryState:
    (row,) = [r for r in harness.table("flow_state") if r["source"] == "edge"]
    return TelemetryState.from_json(json.loads(row["state"]))


def test_a_replay_of_an_old_archive_leaves_the_live_templates_rates_and_waiting_data_alone(spark, tmp_path):
    harness = Harness(tmp_path / "w", spark, local_networks=LOCAL)
    inbox = harness.settings.inbox / "edge"
    at = LIVE + timedelta(minutes=1)
    # Live batch 1: template 256, rate 100, a flow of 1,000 bytes; a v6 data set whose template (300) is not here yet.
    _write(inbox, "1.flows.pcap", [
        _message(at, [fe.template_set({256: V4}), *_rate(1, 99),
                      fe.data_set(256, [fe.record(V4, _flow("10.1.0.5", "198.51.100.9", 1000, 2, at))])], 0),
        _message(at + timedelta(seconds=1), [fe.data_set(300, [fe.record(V6, _flow(
            "2001:db8:ffff::1", "2001:db8:1::5", 600, 3, at))])], 2),
    ])
    first = harness.ingest()
    assert (first.bytes_on_time, first.records_rejected) == (100_000, 0)
    live = _state(harness)
    assert len(live.waiting) == 1 and live.flows.sampling[(ROUTER, "ipfix", DOMAIN)] == 100

    # The archive, two days older: the same exporter with another layout of template 256, its own rate (10),
    # and template 300 (which must not unlock the live data waiting for it: that belongs to the live source).
    old = ARCHIVE + timedelta(minutes=1)
    archive = tmp_path / "archive"
    _write(archive / "edge", "old.flows.pcap", [
        _message(old, [fe.template_set({256: V4_OLD, 300: V6}), *_rate(1, 9),
                       fe.data_set(256, [fe.record(V4_OLD, _flow("10.1.0.6", "198.51.100.9", 50, 1, old))])], 5000),
    ])
    batch, _ = replay(harness.settings, lambda: spark, archive, ARCHIVE, ARCHIVE + timedelta(hours=1), None, None,
                      lambda *_: None)
    assert (batch.bytes_on_time + batch.bytes_late, batch.records_rejected) == (500, 0)  # the archive's own rate
    after = _state(harness)
    assert after.to_json() == live.to_json()  # the live decoder state is untouched, waiting data and sequence too

    # Live batch 2: template 300 arrives; new data of template 256 in the live layout.
    later = LIVE + timedelta(minutes=10)
    _write(inbox, "2.flows.pcap", [
        _message(later, [fe.template_set({300: V6}),
                         fe.data_set(256, [fe.record(V4, _flow("10.1.0.5", "198.51.100.9", 2000, 4, later))])], 3),
    ])
    second = harness.ingest()
    assert second.records_rejected == 0
    assert second.bytes_on_time == 2000 * 100 + 600 * 100  # the live rate, and the flow that waited
    live_rows = [r for r in harness.table("packets") if r["ts"] >= LIVE]
    assert _pairs(live_rows) == {("10.1.0.5", "198.51.100.9"): (300_000, 600),
                                 ("2001:db8:1::5", "2001:db8:ffff::1"): (60_000, 300)}
    assert {r["sampling_rate"] for r in live_rows} == {100}
    assert sum(r["lost"] or 0 for r in harness.table("source_panes")) == 0  # the live sequence went on
    assert len(_state(harness).waiting) == 0

