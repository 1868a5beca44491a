"""Export sequence losses (DESIGN §7a "Loss"): the pipeline's rule against the reference model.

Random streams with reordering, duplicates, drops, restarts and wraps at 2**32 go through
``traffic.io.telemetry``'s loss counting in random batches (the stream state serialised between
them, as ingest keeps it) and through ``tests.model.reference.LossModel`` in one go: the lost units
per pane must be equal. Without restarts, with every datagram at most a few places out of order,
the total must also equal the units really dropped (independent of either implementation).
"""

from __future__ import annotations

import random

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.model.reference import REORDER_WINDOW, SEQUENCE_SPACE, LossModel
from traffic.io import telemetry
from traffic.io.flows import SEQUENCE_SCHEMA
from traffic.io.telemetry import TelemetryState

PANE = 300_000_000
T0 = 1_793_000_000 * 1_000_000


def _stream(rng: random.Random, n: int, *, restarts: bool, unknown: bool, reorder: int, drop: float,
            duplicate: float, wrap: bool = True) -> tuple[list[tuple], int, int]:
    """(number, units, uptime) datagrams in arrival order, the units really dropped, and the number
    that was to follow."""
    start = rng.choice([0, rng.randrange(SEQUENCE_SPACE - 10_000 * (not wrap)),
                        SEQUENCE_SPACE - rng.randrange(1, 200) if wrap else 0, 2**31 + rng.randrange(2**30)])
    number, uptime, sent, dropped = start, 10_000_000, [], 0  # uptime in ms
    for i in range(n):
        if restarts and i and rng.random() < 0.03:  # an exporter restart: a new number, maybe a new uptime
            # 2**31 or more away from the old numbers either way, so that an old datagram arriving after
            # the restart is no gap of a billion in the new sequence (the model keeps each missing number).
            if rng.random() < 0.3:  # a reboot seen only in the uptime: the number goes on a little ahead
                number = (number + rng.randrange(1, 2_000)) % SEQUENCE_SPACE
                uptime = rng.randrange(0, 5_000)
            else:
                for new in [0, *(rng.randrange(SEQUENCE_SPACE) for _ in range(20))]:
                    if _restart_is_clear(new, number, [x for x, _, _ in sent]):
                        number = new
                        break
                if rng.random() < 0.5:
                    uptime = rng.randrange(0, 5_000)
        units = None if unknown and rng.random() < 0.05 else rng.choice([0, 1, 1, 30, rng.randrange(1, 40)])
        if i and rng.random() < drop:
            dropped += units or 0
        else:
            sent.append((number, units, uptime))
        number = (number + (units if units is not None else rng.randrange(1, 40))) % SEQUENCE_SPACE
        uptime += rng.choice([0, 10, 1_000, 30_000])
    # Reordering: each datagram after the first moves back by at most ``reorder`` places.
    arrived = sent[:1]
    for item in sent[1:]:
        arrived.insert(len(arrived) - rng.randint(0, min(reorder, len(arrived) - 1)), item)
    for i in range(len(arrived) - 1, 0, -1):  # a duplicate arrives near its original (a stray from far
        if rng.random() < duplicate:          # away could open a gap of a billion the model cannot hold)
            arrived.insert(min(len(arrived), i + rng.randint(0, reorder + 3)), arrived[i])
    return arrived, dropped, number


def _restart_is_clear(new: int, following: int, old: list[int]) -> bool:
    """Whether a restart at ``new`` is 2**31 or more (raw) from the number that was to follow, and no old
    number arriving after it lies ahead of it by less than 2**31 (a gap the model could not hold) or just
    behind it (a duplicate: harmless, but then the restart is not seen)."""
    margin = 2**21
    if 0 < new - following < 2**31 + margin or following - new < margin:
        return False
    return all(x < new - margin or x > new + 2**31 + margin for x in old)


def _times(rng: random.Random, n: int, spacing: list[int]) -> list[int]:
    """Receive times: each datagram one of ``spacing`` (µs) after the one before."""
    times, at = [], T0
    for _ in range(n):
        times.append(at)
        at += rng.choice(spacing)
    return times


def _pipeline(datagrams: list[tuple], times: list[int], cuts: list[int], with_uptime: bool) -> dict[int, int]:
    """Lost units per pane through ``telemetry``'s counting, batch by batch, state through JSON."""
    lost: dict[int, int] = {}
    state = TelemetryState()
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(datagrams)}), len(datagrams)]
    for lo, hi in zip(bounds, bounds[1:]):
        rows = datagrams[lo:hi]
        table = pa.table({
            "receive_ts": pa.array(times[lo:hi], pa.int64()).cast(SEQUENCE_SCHEMA.field("receive_ts").type),
            "exporter": ["192.0.2.1"] * len(rows), "format": ["netflow5"] * len(rows),
            "domain": pa.array([0] * len(rows), pa.int64()),
            "sequence": pa.array([r[0] for r in rows], pa.int64()),
            "units": pa.array([r[1] for r in rows], pa.int64()),
            "export_ts": pa.nulls(len(rows), SEQUENCE_SCHEMA.field("export_ts").type),
            **({"uptime_ms": pa.array([r[2] for r in rows], pa.int64())} if with_uptime else {}),
        })
        streams = dict(state.streams)
        streams = {k: v.copy() for k, v in streams.items()}
        telemetry._count_losses(table, streams, lost)
        telemetry.close_gaps_by(streams, max(times[lo:hi]), lost)  # as read_telemetry does at the end of a batch
        state = TelemetryState.from_json(TelemetryState(streams=streams).to_json())
    return {p: v for p, v in lost.items() if v}


def _model(datagrams: list[tuple], times: list[int], with_uptime: bool) -> dict[int, int]:
    model = LossModel()
    for receive, (number, units, uptime) in zip(times, datagrams):
        model.datagram("stream", number, units, receive, uptime if with_uptime else None)
    model.flush(max(times))
    return {p: v for p, v in model.lost.items() if v}


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 160), st.booleans(), st.booleans(), st.integers(0, 80),
       st.floats(0, 0.3), st.floats(0, 0.2), st.booleans(), st.lists(st.integers(0, 400), max_size=4))
def test_losses_per_pane_match_the_model(seed, n, restarts, unknown, reorder, drop, duplicate, with_uptime, cuts):
    """Whatever the stream (reordered further than the window, duplicated, restarted, wrapping) and
    however it falls into batches, the pipeline loses what the model loses, pane by pane."""
    rng = random.Random(seed)
    datagrams, _, _ = _stream(rng, n, restarts=restarts, unknown=unknown, reorder=reorder, drop=drop,
                           duplicate=duplicate)
    # Mostly close together, sometimes seconds or minutes apart (the window's time bound).
    times = _times(rng, len(datagrams), [0, 1_000, 200_000, 5_000_000, 59_999_999, 60_000_000, 400_000_000])
    assert _pipeline(datagrams, times, cuts, with_uptime) == _model(datagrams, times, with_uptime)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 120), st.integers(0, REORDER_WINDOW // 4), st.floats(0, 0.3),
       st.floats(0, 0.2), st.lists(st.integers(0, 400), max_size=4))
def test_reordering_and_duplicates_lose_nothing_and_drops_are_counted_exactly(seed, n, reorder, drop, duplicate,
                                                                              cuts):
    """No restarts, every length known, no datagram later than the window: the units lost are
    exactly the units dropped (once the window has passed them), whatever the reordering. (Not
    across the wrap at 2**32: a gap straddling it is taken for a restart, as documented.)"""
    rng = random.Random(seed)
    datagrams, dropped, number = _stream(rng, n, restarts=False, unknown=False, reorder=reorder, drop=drop,
                                 duplicate=duplicate, wrap=False)
    # The window passes: the stream goes on in order after the last number sent.
    for _ in range(REORDER_WINDOW + 1):
        datagrams.append((number, 1, 0))
        number = (number + 1) % SEQUENCE_SPACE
    times = _times(rng, len(datagrams), [0, 10_000, 100_000])  # a window's worth of reordering within a minute
    got = _pipeline(datagrams, times, cuts, False)
    assert sum(got.values()) == dropped
    assert got == _model(datagrams, times, False)


def test_the_model_by_hand():
    """The issue's cases: v5 0, 60, 30, 90 (30 records each) lose nothing; a restart from above 2**31
    loses nothing; a gap nobody fills is lost once 64 more datagrams came, in its own pane."""
    def lost(numbers, units=30):
        return _model([(x % SEQUENCE_SPACE, units, 0) for x in numbers], [T0 + i for i in range(len(numbers))], False)

    assert lost([0, 60, 30, 90]) == {}
    assert lost([3_000_000_000, 3_000_000_030, 0, 30, 60]) == {}
    assert lost([2**32 - 60, 2**32 - 30, 0, 30]) == {}  # a wrap
    assert lost([0, 60, *range(90, 90 + 30 * 63, 30)]) == {}  # 63 more datagrams: still inside the window
    assert lost([0, 60, *range(90, 90 + 30 * 64, 30)]) == {T0 // PANE * PANE: 30}  # the 64th closes it
    assert lost([0, 60, *range(90, 90 + 30 * 63, 30), 30, 1980]) == {}  # the last moment to fill it
    assert lost([0, 30, 30, 60, 0, 90]) == {}  # duplicates
    # A reboot seen in the uptime only (the number goes on ahead): nothing lost; without the uptime, a gap.
    reboot = [(0, 30, 900_000), (30, 30, 901_000), (500, 30, 2_000), (530, 30, 3_000), *((560 + 30 * i, 30, 4_000)
                                                                                       for i in range(64))]
    times = [T0 + i for i in range(len(reboot))]
    assert _model(reboot, times, True) == {} and _model(reboot, times, False) == {T0 // PANE * PANE: 440}
    # A slow exporter: the gap is decided by the next datagram a minute or more after the one that revealed it.
    slow = [(0, 30, 0), (60, 30, 0), (90, 30, 0), (30, 30, 0)]
    assert _model(slow, [T0, T0 + 1, T0 + 59_999_999, T0 + 60_000_000], False) == {}
    assert _model(slow, [T0, T0 + 1, T0 + 60_000_001, T0 + 60_000_002], False) == {T0 // PANE * PANE: 30}
