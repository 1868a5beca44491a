"""The stall rule by last-seen-at marks, the far-ahead flag and the first-hour gap (pure, plus the clocks table)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from traffic.storage import state as st
from traffic.core.clock import FIRST_HOUR_GAP, ClockState, advance, first_hour_gap

UTC = timezone.utc
T = datetime(2026, 11, 1, 10, tzinfo=UTC)
TIMEOUT = timedelta(hours=1)
ZERO = timedelta(0)


def _m(minutes: float) -> datetime:
    return T + timedelta(minutes=minutes)


def _run(*batches: dict, lateness: timedelta = ZERO) -> ClockState:
    state = ClockState()
    for number, clocks in enumerate(batches, start=1):
        state = advance(state, clocks, number, lateness, TIMEOUT)
    return state


def test_a_source_delivering_in_every_batch_is_never_stalled_however_far_behind():
    state = _run({"a": _m(0), "b": _m(600)}, {"a": _m(10), "b": _m(610)}, {"a": _m(20), "b": _m(620)})
    assert state.live_sources(TIMEOUT) == {"a", "b"}
    assert state.watermark == _m(20)
    assert state.seen_at == {"a": _m(620), "b": _m(620)}


def test_an_absent_source_stalls_once_the_largest_clock_is_more_than_the_timeout_past_its_mark():
    state = _run({"a": _m(0), "b": _m(30)}, {"a": _m(60)}, {"a": _m(90)})
    assert state.seen_at["b"] == _m(30)
    assert state.live_sources(TIMEOUT) == {"a", "b"} and state.watermark == _m(30)  # 90 - 30 = exactly 1 h
    state = advance(state, {"a": _m(90.01)}, 4, ZERO, TIMEOUT)
    assert state.live_sources(TIMEOUT) == {"a"} and state.watermark == _m(90.01)
    # Back with an old record: live again (it delivered), W never moves back.
    state = advance(state, {"b": _m(40)}, 5, ZERO, TIMEOUT)
    assert state.live_sources(TIMEOUT) == {"a", "b"} and state.watermark == _m(90.01)


def test_a_batch_without_accepted_records_changes_no_mark():
    state = _run({"a": _m(0), "b": _m(30)})
    assert advance(state, {}, 2, ZERO, TIMEOUT) == state


def test_far_ahead_is_the_leader_more_than_the_timeout_ahead_of_every_other_live_source():
    assert _run({"a": _m(0), "b": _m(61), "c": _m(5)}).far_ahead(TIMEOUT) == {}  # 61 min past a, 56 past c
    state = _run({"a": _m(0), "b": _m(125), "c": _m(5)})
    assert state.far_ahead(TIMEOUT) == {"b": timedelta(minutes=120)}
    assert _run({"a": _m(0), "b": _m(60)}).far_ahead(TIMEOUT) == {}  # exactly the timeout: not far
    assert _run({"a": _m(0)}).far_ahead(TIMEOUT) == {}  # a lone source
    # b stops; a stalls nobody but outruns b: once b is stalled, a is alone, not far ahead.
    state = _run({"a": _m(0), "b": _m(0)}, {"a": _m(200)})
    assert state.live_sources(TIMEOUT) == {"a"} and state.far_ahead(TIMEOUT) == {}


def test_the_hours_closed_while_a_source_was_far_ahead_are_the_spans_its_batches_crossed():
    state = _run({"a": _m(0), "b": _m(180)}, {"a": _m(70), "b": _m(250)}, {"a": _m(130), "b": _m(250)},
                 {"a": _m(200), "b": _m(250)})
    # W: 10:00, 11:10, 12:10, 13:20; b far ahead after batches 1-3 (gaps 3 h, 3 h, 2 h), not after 4 (50 min).
    assert state.ahead == {"b": ((None, _m(130)),)}
    assert state.ahead_when_closed(T) == ["b"]  # closed by batch 2 (W 11:10)
    assert state.ahead_when_closed(T + timedelta(hours=1)) == ["b"]  # closed by batch 3 (W 12:10)
    assert state.ahead_when_closed(T + timedelta(hours=2)) == []  # closed by batch 4 (W 13:20)


def test_clock_state_survives_the_batch_plan_and_a_plan_from_before_marks():
    state = _run({"a": _m(0), "b": _m(180)}, {"a": _m(70)})
    assert st.state_from_json(st.state_to_json(state)) == state
    old = {"clocks": {"a": _m(0).isoformat()}, "last_batch": {"a": 1}, "watermark": _m(0).isoformat(),
           "first_hour": None}
    loaded = st.state_from_json(old)
    assert loaded.seen_at == {} and loaded.ahead == {} and loaded.last_seen_at("a") == _m(0)


def test_a_clocks_table_written_before_marks_loads_with_each_source_clock_as_its_mark(tmp_path):
    from deltalake import DeltaTable, Schema

    from traffic.storage.warehouse import Warehouse
    from traffic.core.settings import load_settings

    settings = load_settings(environ={}, overrides={"warehouse": tmp_path / "w", "inbox": tmp_path / "in"})
    warehouse = Warehouse(settings, engine="rs")
    columns = ["source", "clock", "last_batch_id", "watermark", "first_hour"]
    old_schema = pa.schema([warehouse.table("clocks").arrow_schema.field(c) for c in columns])
    DeltaTable.create(str(warehouse.root / "clocks"), schema=Schema.from_arrow(old_schema), name="clocks")
    from deltalake import write_deltalake

    write_deltalake(str(warehouse.root / "clocks"), pa.table(
        {"source": ["a", "b"], "clock": [_m(0), _m(200)], "last_batch_id": [1, 2], "watermark": [_m(0)] * 2,
         "first_hour": [T] * 2}, schema=old_schema), mode="append")
    state = st.read_clock_state(warehouse)
    assert state.clocks == {"a": _m(0), "b": _m(200)} and state.seen_at == {}
    # The rule it followed then: a is 200 min behind b's clock, so stalled.
    assert state.live_sources(TIMEOUT) == {"b"}
    after = advance(state, {"b": _m(210)}, 3, ZERO, TIMEOUT)
    warehouse.table("clocks").overwrite(st.clock_table(after))  # the next batch writes the new columns
    assert {f.name for f in DeltaTable(str(warehouse.root / "clocks")).schema().fields} >= {"last_seen_at",
                                                                                          "ahead_spans"}
    assert st.read_clock_state(warehouse) == after


@pytest.mark.parametrize(("data_hours", "newest", "gap"), [
    ([T + timedelta(days=300)], None, timedelta(days=300)),     # a stray record 300 days before the data
    ([T + timedelta(hours=1), T + timedelta(days=300)], None, None),  # the next hour has data
    ([], T + timedelta(days=8, minutes=5), timedelta(days=8)),   # only ticks after it
    ([T + FIRST_HOUR_GAP], None, None),                          # exactly the threshold
])
def test_first_hour_gap(data_hours, newest, gap):
    assert first_hour_gap(T, [T, *data_hours], newest) == gap


def test_a_source_with_its_own_lateness_holds_the_watermark_back_by_that_much():
    """DESIGN §7a: a flow source's allowed lateness covers its exporter's active timeout; the others keep theirs."""
    lateness = {"router": timedelta(minutes=30)}
    state = advance(ClockState(), {"feed": _m(60), "router": _m(60)}, 1, timedelta(minutes=5), TIMEOUT,
                    source_lateness=lateness)
    assert state.watermark == _m(30)  # min(60 - 5, 60 - 30)
    state = advance(state, {"feed": _m(120), "router": _m(100)}, 2, timedelta(minutes=5), TIMEOUT,
                    source_lateness=lateness)
    assert state.watermark == _m(70)  # the router: 100 - 30; the feed alone would allow 115
    without = advance(ClockState(), {"feed": _m(60), "router": _m(60)}, 1, timedelta(minutes=5), TIMEOUT)
    assert without.watermark == _m(55)
