"""Export sequence losses through ``read_telemetry`` (DESIGN §7a "Loss"), NetFlow v5 datagrams as an
exporter sends them: reordering and restarts are not loss; a gap nobody fills is, in its own pane.

(The rule against the reference model on random streams: ``tests/model/test_sequence_losses.py``.)
"""

from __future__ import annotations

import json

from tests.support import flow_encoder as fe
from traffic.io.sequence_losses import REORDER_WINDOW
from traffic.io.telemetry import TelemetryRules, TelemetryState, read_telemetry

US = 1_000_000
T0 = 1_793_000_000 * US // (300 * US) * (300 * US)  # a pane start in 2026
ROUTER = "192.0.2.7"
RULES = TelemetryRules(local_networks=("10.1.0.0/16",))


def _v5(sequence: int, at: int, records: int = 30, uptime_ms: int = 3_600_000) -> bytes:
    flows = [fe.Flow("10.1.0.5", "198.51.100.9", 40000 + i, 443, 6, 100, 1, at - US, at) for i in range(records)]
    return fe.netflow5(flows, export_us=at, uptime_ms=uptime_ms, sequence=sequence)


def _batch(sequences: list[int], state: TelemetryState, *, first: int = 0, records: int = 30, spacing: int = US,
           uptimes: list[int] | None = None):
    """One collector file of v5 datagrams ``spacing`` µs apart (the ``first``-th on) carrying ``sequences``
    (and ``uptimes``, ms, when given); returns (lost per pane, state)."""
    uptimes = uptimes or [3_600_000 + (first + i) * spacing // 1000 for i in range(len(sequences))]
    datagrams = [(T0 + (first + i) * spacing, ROUTER, 40000,
                  _v5(s % 2**32, T0 + (first + i) * spacing, records, uptimes[i])) for i, s in enumerate(sequences)]
    out = read_telemetry([(fe.collector_file(datagrams), f"f{first}.flows.pcap", 0)], state, source="edge",
                         rules=RULES)
    lost = dict(zip(out.lost.column("pane_start").cast("int64").to_pylist(), out.lost.column("lost").to_pylist()))
    # The state goes through JSON between batches, as ingest keeps it.
    return lost, TelemetryState.from_json(json.loads(json.dumps(out.state.to_json())))


def test_reordered_datagrams_are_not_lost():
    """The issue's case: sequences 0, 60, 30, 90 (30 records each) lost 60 before; nothing is missing."""
    lost, _ = _batch([0, 60, 30, 90], TelemetryState())
    assert lost == {}


def test_a_late_datagram_in_the_next_batch_fills_its_gap():
    lost, state = _batch([0, 60], TelemetryState())
    lost2, state = _batch([30, 90, 120], state, first=2)
    assert (lost, lost2) == ({}, {})


def test_an_exporter_restart_from_above_2_31_loses_nothing():
    """Before: 1,294,967,236 units lost (and the hour failed with completeness_action = failure)."""
    high = 3_000_000_000
    lost, state = _batch([high, high + 30, high + 60], TelemetryState())
    lost2, _ = _batch([0, 30, 60, 90], state, first=3)
    assert (lost, lost2) == ({}, {})


def test_a_restart_to_a_lower_number_loses_nothing():
    lost, _ = _batch([5000, 5030, 5060, 0, 30, 60], TelemetryState())
    assert lost == {}


def test_a_restart_seen_in_the_uptime_going_back_loses_nothing():
    """The exporter rebooted (uptime 1 h → 1 s) and its sequence went on a little ahead, as if 110
    records were missing: the decoder gives the header's uptime, so the restart is seen, nothing lost.
    (Before the sequence rows carried the uptime, the next datagram two minutes on decided 110 lost.)"""
    spacing = 2 * 60 * US
    lost, state = _batch([0, 30, 60], TelemetryState(), spacing=spacing)
    lost2, _ = _batch([200, 230, 260], state, first=3, spacing=spacing, uptimes=[1_000, 121_000, 241_000])
    assert (lost, lost2) == ({}, {})
    # The same numbers without the reboot are a gap nobody fills: lost in the pane that revealed it.
    lost3, _ = _batch([200, 230, 260], state, first=3, spacing=spacing)
    assert lost3 == {T0 + 3 * spacing // (300 * US) * (300 * US): 110}


def test_duplicates_lose_nothing():
    lost, _ = _batch([0, 30, 30, 60, 0, 90], TelemetryState())
    assert lost == {}


def test_a_gap_nobody_fills_is_lost_once_the_window_passes_in_the_pane_that_revealed_it():
    """Datagram 30 never comes: its 30 records are lost when the 64th datagram after the one that
    revealed the gap (60, received in the first pane) arrives, whichever batch that is in."""
    after = list(range(90, 90 + 30 * REORDER_WINDOW, 30))
    lost, state = _batch([0, 60, *after[:10]], TelemetryState())
    assert lost == {}  # not decided yet: datagram 30 may still come
    lost2, _ = _batch(after[10:], state, first=12)
    assert lost2 == {T0: 30}


def test_a_slow_exporters_gap_is_decided_by_its_next_datagram_a_minute_on():
    """An exporter sending a datagram every few minutes: the gap waits a minute at most (receive
    time), then the next datagram decides it, in the pane that revealed it (the first one)."""
    lost, state = _batch([0, 60], TelemetryState(), spacing=3 * US)
    assert lost == {}
    lost2, _ = _batch([90], state, first=1, spacing=20 * 60 * US)  # 20 minutes later, the next batch
    assert lost2 == {T0: 30}


def test_state_kept_before_the_window_existed_still_loads():
    """A stream state written by the earlier version ([exporter, format, domain, last sequence, units])."""
    old = {"streams": [[ROUTER, "netflow5", 0, 60, 30]]}
    lost, _ = _batch([90, 150, 120], TelemetryState.from_json(old))
    assert lost == {}


def test_the_last_gap_of_a_source_that_stops_is_decided_by_the_watermark():
    """No later datagram comes: a batch whose watermark is a minute past the gap decides it."""
    lost, state = _batch([0, 60], TelemetryState())
    assert lost == {}
    rules = TelemetryRules(local_networks=RULES.local_networks, watermark_us=T0 + 61 * US)
    out = read_telemetry([], state, source="edge", rules=rules)
    assert dict(zip(out.lost.column("pane_start").cast("int64").to_pylist(), out.lost.column("lost").to_pylist())) \
        == {T0: 30}
    assert read_telemetry([], state, source="edge", rules=TelemetryRules(watermark_us=T0 + 30 * US)).lost.num_rows == 0
