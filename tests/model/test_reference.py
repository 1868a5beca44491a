"""Hand-computed cases for the reference model, so property tests can trust it as an oracle."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import date, datetime, timedelta, timezone

import pytest

from .reference import (
    ModelSettings,
    ParsedRecord,
    ReferenceModel,
    parse_router_feed_line,
    split_records,
    to_us,
)

UTC = timezone.utc
NOW = datetime(2024, 6, 1, tzinfo=UTC)  # the processing clock, well after every event
LOCAL, REMOTE = "10.0.0.1", "192.0.2.1"


def at(text: str) -> datetime:
    """A UTC instant from ISO text without offset."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def packet(moment: datetime, size: int = 100, local: str = LOCAL, remote: str = REMOTE,
           local_port: int = 40000, remote_port: int = 443) -> str:
    return f"new,OP_INSERT,{to_us(moment)},{local},{remote},{local_port},{remote_port},{size}"


def tick(moment: datetime) -> str:
    return f"new,OP_INSERT,{to_us(moment)}"


def feed(*lines: str) -> str:
    return "".join(line + "\n" for line in lines)


def packet_row(moment: datetime, batch_id: int, source: str, size: int = 100,
               local: str = LOCAL, remote: str = REMOTE) -> dict:
    return dict(ts=moment, source=source, local_ip=local, remote_ip=remote, local_port=40000,
                remote_port=443, protocol=None, bytes=size, direction=None,
                hour=moment.replace(minute=0, second=0, microsecond=0), batch_id=batch_id)


def batch_row(batch_id: int, before: datetime | None, after: datetime | None, **counts) -> dict:
    row = dict(batch_id=batch_id, records_read=0, packets_on_time=0, packets_late=0,
               records_rejected=0, ticks=0, bytes_on_time=0, bytes_late=0, duplicate_files=0,
               watermark_before=before, watermark_after=after)
    row.update(counts)
    return row


def hourly_row(hour: datetime, size: int, count: int, status: str, local: str = LOCAL,
               remote: str = REMOTE) -> dict:
    return dict(hour=hour, day=hour.date(), local_ip=local, remote_ip=remote, bytes=size,
                packets=count, bytes_in=0, bytes_out=0, status=status)


def period_row(grain: str, start: datetime, size: int, count: int, closed_at: datetime, *,
               reporting: int, expected: int, panes: int, late_bytes: int = 0,
               late_packets: int = 0) -> dict:
    # Completeness (data-quality issue): an hour with fewer than 12 active panes, or a source
    # missing, is published as a warning; days and months are checked by their reconciliation only.
    incomplete = grain == "hour" and (panes < 12 or reporting < expected)
    return dict(grain=grain, period_start=start, bytes=size, packets=count, late_bytes=late_bytes,
                late_packets=late_packets, sources_reporting=reporting, sources_expected=expected,
                panes_active=panes, closed_at_watermark=closed_at,
                dq_status="warning" if incomplete else "passed", restated=None)


def ledger(model: ReferenceModel, grain: str) -> list[dict]:
    return [row for row in model.tables()["periods"] if row["grain"] == grain]


def without_reason(rows: list[dict], column: str) -> list[dict]:
    """Rows minus a free-text column, after checking it is a non-empty string in every row."""
    assert all(isinstance(row[column], str) and row[column] for row in rows), rows
    return [{k: v for k, v in row.items() if k != column} for row in rows]


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("line", [
    "new,OP_INSERT",                                        # two fields
    "new,OP_INSERT,1,",                                     # four fields
    "new,OP_INSERT,1,,,,,",                                 # eight fields, empty: not a tick here
    " new,OP_INSERT,1",                                     # space before the marker
    "old,OP_INSERT,1",
    "new,OP_DELETE,1,10.0.0.1,192.0.2.1,1,2,3",             # unknown opcode
    "new,OP_INSERT,-1",
    "new,OP_INSERT,+1",
    "new,OP_INSERT, 1",
    "new,OP_INSERT,1_000",
    "new,OP_INSERT,١٢٣",                                     # non-ASCII digits
    "new,OP_INSERT,",
    "new,OP_INSERT,253402300800000000",                      # year 10000
    "new,OP_INSERT,1,10.0.0.1,::1,1,2,3",                   # families mixed
    "new,OP_INSERT,1,10.0.0.256,192.0.2.1,1,2,3",
    "new,OP_INSERT,1,010.0.0.1,192.0.2.1,1,2,3",             # leading zero octet
    "new,OP_INSERT,1,10.0.0.1,192.0.2.1,65536,2,3",
    "new,OP_INSERT,1,10.0.0.1,192.0.2.1,1,-2,3",
    "new,OP_INSERT,1,10.0.0.1,192.0.2.1,1,2,65536",          # larger than an IPv4 packet
    "new,OP_INSERT,1,::1,2001:db8::1,1,2,4294967336",        # larger than an IPv6 jumbogram
    "new,OP_INSERT,1,10.0.0.1,192.0.2.1,1,2,1" + "0" * 5000,  # huge number
])
def test_unreadable_lines_are_rejects(line):
    parsed = parse_router_feed_line(line)
    assert parsed.kind == "reject" and parsed.reason, parsed


def test_readable_lines_parse_to_canonical_values():
    assert parse_router_feed_line("new,OP_INSERT,253402300799999999") == ParsedRecord(
        "tick", ts=253402300799999999)
    assert parse_router_feed_line("new,OP_INSERT,007") == ParsedRecord("tick", ts=7)
    assert parse_router_feed_line("new,OP_INSERT,0,2001:DB8:0:0::1,FE80::A,0,65535,4294967335") == \
        ParsedRecord("packet", ts=0, local_ip="2001:db8::1", remote_ip="fe80::a",
                     local_port=0, remote_port=65535, bytes=4294967335)
    # An IPv4-mapped IPv6 address is stored as its IPv4 address (issue 20), so it pairs with IPv4 and is
    # held to the IPv4 bound; an address with a zone id is no stored address at all.
    assert parse_router_feed_line("new,OP_INSERT,0,10.0.0.1,::ffff:1.2.3.4,0,0,0") == ParsedRecord(
        "packet", ts=0, local_ip="10.0.0.1", remote_ip="1.2.3.4", local_port=0, remote_port=0, bytes=0)
    assert parse_router_feed_line("new,OP_INSERT,0,10.0.0.1,::ffff:1.2.3.4,0,0,65536").kind == "reject"
    assert parse_router_feed_line("new,OP_INSERT,0,fe80::1%eth0,fe80::2,0,0,0").kind == "reject"
    assert parse_router_feed_line("new,OP_INSERT,5,10.0.0.1,192.0.2.1,1,2,65535") == \
        ParsedRecord("packet", ts=5, local_ip="10.0.0.1", remote_ip="192.0.2.1",
                     local_port=1, remote_port=2, bytes=65535)


def test_records_are_lines_without_blank_ones():
    assert split_records("a\r\n\r\nb\n\n") == ["a", "b"]
    assert split_records("a\r\r\nb") == ["a\r", "b"]
    assert split_records("") == []


# --------------------------------------------------------------------------- batches


def test_batch_ids_duplicates_and_rejects():
    model = ReferenceModel(ModelSettings())
    content = feed(packet(at("2024-01-10T10:00")), "garbage")
    model.ingest([], NOW)  # no files: no batch
    model.ingest([("a", content), ("a", content), ("b", content)], NOW)
    model.ingest([("a", content)], NOW)  # only duplicates: still a batch
    model.ingest([("a", "")], NOW)  # an empty file is a file
    model.ingest([("a", "")], NOW)
    w = at("2024-01-10T10:00")
    tables = model.tables()
    assert tables["batches"] == [
        batch_row(1, None, w, records_read=4, packets_on_time=2, records_rejected=2,
                  bytes_on_time=200, duplicate_files=1),
        batch_row(2, w, w, duplicate_files=1),
        batch_row(3, w, w),
        batch_row(4, w, w, duplicate_files=1),
    ]
    assert without_reason(tables["rejects"], "reason") == [
        dict(batch_id=1, source="a", input_file=None, record="garbage"),
        dict(batch_id=1, source="b", input_file=None, record="garbage"),
    ]
    assert tables["clocks"] == [dict(source="a", clock=w, last_batch_id=1, last_seen_at=w),
                                dict(source="b", clock=w, last_batch_id=1, last_seen_at=w)]


# --------------------------------------------------------------------------- clocks and W


def test_watermark_never_moves_back():
    model = ReferenceModel(ModelSettings())
    model.ingest([("a", feed(packet(at("2024-01-10T10:30"))))], NOW)
    model.ingest([("a", feed(packet(at("2024-01-10T10:10"), size=50)))], NOW)  # older, same source
    model.ingest([("b", feed(packet(at("2024-01-10T10:05"), size=7)))], NOW)  # new, slower source
    model.ingest([("b", feed(tick(at("2024-01-10T10:40"))))], NOW)  # min is a's 10:30 again
    model.ingest([("a", feed(tick(at("2024-01-10T11:00"))))], NOW)  # min is b's 10:40
    w1, w2 = at("2024-01-10T10:30"), at("2024-01-10T10:40")
    tables = model.tables()
    assert tables["batches"] == [
        batch_row(1, None, w1, records_read=1, packets_on_time=1, bytes_on_time=100),
        batch_row(2, w1, w1, records_read=1, packets_on_time=1, bytes_on_time=50),
        batch_row(3, w1, w1, records_read=1, packets_on_time=1, bytes_on_time=7),
        batch_row(4, w1, w1, records_read=1, ticks=1),
        batch_row(5, w1, w2, records_read=1, ticks=1),
    ]
    assert tables["clocks"] == [
        dict(source="a", clock=at("2024-01-10T11:00"), last_batch_id=5, last_seen_at=at("2024-01-10T11:00")),
        dict(source="b", clock=w2, last_batch_id=4, last_seen_at=w2)]
    assert model.watermark == w2


def test_single_source_watermark_is_clock_minus_lateness():
    model = ReferenceModel(ModelSettings(allowed_lateness=timedelta(minutes=15)))
    model.ingest([("a", feed(packet(at("2024-01-10T10:40")), tick(at("2024-01-10T10:50"))))], NOW)
    assert model.watermark == at("2024-01-10T10:35")
    # Against W=10:35, hour 09 is closed (late) and hour 10 is open; the tick is on time.
    model.ingest([("a", feed(packet(at("2024-01-10T09:59"), size=5),
                             packet(at("2024-01-10T10:01"), size=6),
                             tick(at("2024-01-10T10:20"))))], NOW)
    assert model.watermark == at("2024-01-10T10:35")
    tables = model.tables()
    assert tables["packets"] == [packet_row(at("2024-01-10T10:01"), 2, "a", size=6),
                                 packet_row(at("2024-01-10T10:40"), 1, "a")]
    assert without_reason(tables["late_packets"], "late_reason") == [
        packet_row(at("2024-01-10T09:59"), 2, "a", size=5)]
    assert tables["source_panes"] == [
        dict(source="a", pane_start=at("2024-01-10T10:00"), packets=1, bytes=6, ticks=0),
        dict(source="a", pane_start=at("2024-01-10T10:20"), packets=0, bytes=0, ticks=1),
        dict(source="a", pane_start=at("2024-01-10T10:40"), packets=1, bytes=100, ticks=0),
        dict(source="a", pane_start=at("2024-01-10T10:50"), packets=0, bytes=0, ticks=1),
    ]
    assert tables["batches"][1] == batch_row(
        2, at("2024-01-10T10:35"), at("2024-01-10T10:35"), records_read=3, packets_on_time=1,
        packets_late=1, ticks=1, bytes_on_time=6, bytes_late=5)
    assert tables["hourly"] == [hourly_row(at("2024-01-10T10:00"), 106, 2, "open")]


def _stall_scenario(settings: ModelSettings) -> ReferenceModel:
    model = ReferenceModel(settings)
    model.ingest([("a", feed(packet(at("2024-01-10T10:00")))),
                  ("b", feed(packet(at("2024-01-10T10:00"), size=200, local="10.0.0.2")))], NOW)
    model.ingest([("a", feed(packet(at("2024-01-10T10:50"), size=10)))], NOW)
    model.ingest([("a", feed(tick(at("2024-01-10T11:30"))))], NOW)  # b (10:00) now stalled
    return model


def test_stalled_source_stops_holding_back_the_watermark():
    model = _stall_scenario(ModelSettings())
    assert [b["watermark_after"] for b in model.tables()["batches"]] == [
        at("2024-01-10T10:00"), at("2024-01-10T10:00"), at("2024-01-10T11:30")]
    model.close()
    hour = at("2024-01-10T10:00")
    # Both sources seen in the 24 h to 11:00; both sent something only in the 10:00 pane.
    frozen = period_row("hour", hour, 310, 3, at("2024-01-10T11:30"), reporting=2, expected=2, panes=1)
    assert model.tables()["periods"] == [frozen]
    # b comes back: its packet's hour is closed, and b (10:59) is live again without moving W back.
    model.ingest([("b", feed(packet(at("2024-01-10T10:59"), size=7, local="10.0.0.2")))], NOW)
    assert model.watermark == at("2024-01-10T11:30")
    model.close()
    tables = model.tables()
    assert tables["periods"] == [dict(frozen, late_bytes=7, late_packets=1)]
    assert tables["hourly"] == [hourly_row(hour, 110, 2, "final"),
                                hourly_row(hour, 200, 1, "final", local="10.0.0.2")]


def test_a_source_exactly_source_timeout_past_its_mark_is_still_live():
    model = ReferenceModel(ModelSettings())
    model.ingest([("a", feed(tick(at("2024-01-10T10:00")))), ("b", feed(tick(at("2024-01-10T09:00"))))], NOW)
    # b delivered in this batch: its mark is the largest clock (10:00), so it is live however far behind.
    assert model.watermark == at("2024-01-10T09:00")
    model.ingest([("a", feed(tick(at("2024-01-10T11:00"))))], NOW)  # exactly source_timeout past b's mark
    assert model.watermark == at("2024-01-10T09:00")
    model.ingest([("a", feed(tick(at("2024-01-10T11:00:00.000001"))))], NOW)
    assert model.watermark == at("2024-01-10T11:00:00.000001")


def test_a_source_far_behind_but_delivering_is_never_stalled_and_the_one_ahead_is_flagged():
    """Issue 20 item 8: b's exporter clock is two hours ahead; a keeps delivering and stays on time."""
    model = ReferenceModel(ModelSettings(completeness_min_panes=0))  # the far-ahead warning alone
    model.ingest([("a", feed(packet(at("2024-01-10T10:05")))), ("b", feed(packet(at("2024-01-10T12:05"))))], NOW)
    assert model.watermark == at("2024-01-10T10:05")
    model.ingest([("a", feed(packet(at("2024-01-10T10:40"), size=7), packet(at("2024-01-10T11:10"), size=8))),
                  ("b", feed(packet(at("2024-01-10T13:10"), size=9)))], NOW)
    tables = model.tables()
    assert tables["batches"][1] == batch_row(2, at("2024-01-10T10:05"), at("2024-01-10T11:10"), records_read=3,
                                             packets_on_time=3, bytes_on_time=24)
    assert tables["late_packets"] == []
    model.close()
    # Hour 10 was closed by batch 2, after which b was still two hours ahead of a: a warning, though
    # the hour is complete (b's panes are all in its future, so only a is expected).
    assert ledger(model, "hour") == [dict(
        period_row("hour", at("2024-01-10T10:00"), 107, 2, at("2024-01-10T11:10"), reporting=1, expected=1,
                   panes=2), dq_status="warning")]
    # b's exporter is fixed: its clock stops, a catches up to one hour behind (not more than
    # source_timeout), and hour 11 closes with nobody far ahead.
    model.ingest([("a", feed(packet(at("2024-01-10T12:20"), size=1))), ("b", feed(tick(at("2024-01-10T13:20"))))],
                 NOW)
    model.close()
    assert [(h["period_start"], h["dq_status"]) for h in ledger(model, "hour")] == [
        (at("2024-01-10T10:00"), "warning"), (at("2024-01-10T11:00"), "passed")]


def test_a_source_absent_from_deliveries_stalls_once_the_others_move_on():
    model = ReferenceModel(ModelSettings())
    model.ingest([("a", feed(tick(at("2024-01-10T10:00")))), ("b", feed(tick(at("2024-01-10T10:30"))))], NOW)
    # b stops delivering. Its mark is the largest clock when it last delivered (its own 10:30): it
    # holds W back until the others have moved source_timeout past that mark, not a moment longer.
    for minute in (40, 70, 90):
        model.ingest([("a", feed(tick(at("2024-01-10T10:00") + timedelta(minutes=minute))))], NOW)
    assert model.watermark == at("2024-01-10T10:30")  # b (10:30, last seen at 10:30) is live until 11:30
    model.ingest([("a", feed(tick(at("2024-01-10T11:31"))))], NOW)
    assert model.watermark == at("2024-01-10T11:31")  # more than source_timeout past b's mark: stalled
    clocks = {r["source"]: r for r in model.tables()["clocks"]}
    assert clocks["b"]["last_seen_at"] == at("2024-01-10T10:30")
    assert clocks["a"]["last_seen_at"] == at("2024-01-10T11:31")


def test_expected_sources_setting_counts_a_silent_source():
    model = _stall_scenario(ModelSettings(expected_sources=("a", "b", "c")))
    model.close()
    assert model.tables()["periods"] == [
        period_row("hour", at("2024-01-10T10:00"), 310, 3, at("2024-01-10T11:30"),
                   reporting=2, expected=3, panes=0)]


# --------------------------------------------------------------------------- late and ticks


def test_late_packet_goes_to_late_packets_and_grows_only_the_frozen_hours_late_columns():
    model = ReferenceModel(ModelSettings())
    model.ingest([("a", feed(tick(at("2024-01-10T12:00"))))], NOW)
    model.ingest([("a", feed(packet(at("2024-01-10T11:30"), size=9),  # before the first hour
                             packet(at("2024-01-10T12:10"), size=40)))], NOW)
    model.ingest([("a", feed(tick(at("2024-01-10T13:05"))))], NOW)
    model.close()
    hour12 = at("2024-01-10T12:00")
    assert model.tables()["periods"] == [
        period_row("hour", hour12, 40, 1, at("2024-01-10T13:05"), reporting=1, expected=1, panes=2)]
    model.ingest([("a", feed(packet(at("2024-01-10T12:59"), size=3),
                             packet(at("2024-01-10T12:30"), size=4),
                             packet(at("2024-01-10T11:00"), size=5)))], NOW)
    model.close()  # freezing again is a no-op
    tables = model.tables()
    assert tables["periods"] == [
        period_row("hour", hour12, 40, 1, at("2024-01-10T13:05"), reporting=1, expected=1, panes=2,
                   late_bytes=7, late_packets=2)]
    assert tables["hourly"] == [hourly_row(hour12, 40, 1, "final")]
    assert without_reason(tables["late_packets"], "late_reason") == [
        packet_row(at("2024-01-10T11:00"), 4, "a", size=5),
        packet_row(at("2024-01-10T11:30"), 2, "a", size=9),
        packet_row(at("2024-01-10T12:30"), 4, "a", size=4),
        packet_row(at("2024-01-10T12:59"), 4, "a", size=3),
    ]
    # Late packets never touch source_panes.
    assert [(p["pane_start"], p["packets"], p["ticks"]) for p in tables["source_panes"]] == [
        (at("2024-01-10T12:00"), 0, 1), (at("2024-01-10T12:10"), 1, 0), (at("2024-01-10T13:05"), 0, 1)]


def test_first_day_covers_only_hours_from_the_first_hour():
    model = ReferenceModel(ModelSettings())
    # t ticks once at 08:00 and stalls; a's tick starts no hour, its 11:30 packet is already late.
    model.ingest([("t", feed(tick(at("2024-01-10T08:00"))))], NOW)
    model.ingest([("a", feed(tick(at("2024-01-10T12:00"))))], NOW)  # 4 h past t's last-seen-at mark
    model.ingest([("a", feed(packet(at("2024-01-10T11:30"), size=9), packet(at("2024-01-10T12:10"), size=40)))], NOW)
    model.ingest([("a", feed(tick(at("2024-01-11T00:00"))))], NOW)
    model.close()
    # Late records after the roll-up: two packets (one before the first hour) and a tick.
    model.ingest([("a", feed(packet(at("2024-01-10T12:30"), size=4), packet(at("2024-01-10T10:00"), size=5),
                             tick(at("2024-01-10T12:20"))))], NOW)
    model.close()
    tables = model.tables()
    midnight = at("2024-01-11T00:00")
    # t (seen at 08:00, within 24 h of every hour's end) is expected all day but never reports
    # from the first hour on; late packets before the first hour have no ledger row to grow.
    assert ledger(model, "day") == [
        period_row("day", at("2024-01-10T00:00"), 40, 1, midnight, reporting=1, expected=2, panes=0,
                   late_bytes=4, late_packets=1)]
    assert ledger(model, "hour")[0] == period_row(
        "hour", at("2024-01-10T12:00"), 40, 1, midnight, reporting=1, expected=2, panes=0,
        late_bytes=4, late_packets=1)
    assert [h["period_start"].hour for h in ledger(model, "hour")] == list(range(12, 24))
    assert tables["batches"][-1] == batch_row(5, midnight, midnight, records_read=3, packets_late=2,
                                              ticks=1, bytes_late=9)
    # The late tick moved nothing: no pane, and a's clock was already later.
    assert [(p["source"], p["pane_start"]) for p in tables["source_panes"]] == [
        ("a", at("2024-01-10T12:00")), ("a", at("2024-01-10T12:10")), ("a", midnight),
        ("t", at("2024-01-10T08:00"))]
    assert tables["clocks"] == [dict(source="a", clock=midnight, last_batch_id=5, last_seen_at=midnight),
                                dict(source="t", clock=at("2024-01-10T08:00"), last_batch_id=1,
                                     last_seen_at=at("2024-01-10T08:00"))]
    assert sum(r["bytes"] for r in tables["hourly"]) + sum(r["bytes"] for r in tables["late_packets"]) == 58


def test_ticks_advance_clocks_but_are_not_packets_and_do_not_start_the_first_hour():
    model = ReferenceModel(ModelSettings())
    model.ingest([("r1", feed(tick(at("2024-01-10T08:00")), tick(at("2024-01-10T08:03")),
                              tick(at("2024-01-10T09:07"))))], NOW)
    model.close()
    tables = model.tables()
    assert model.watermark == at("2024-01-10T09:07")
    assert tables["batches"] == [batch_row(1, None, at("2024-01-10T09:07"), records_read=3, ticks=3)]
    assert tables["clocks"] == [dict(source="r1", clock=at("2024-01-10T09:07"), last_batch_id=1,
                                     last_seen_at=at("2024-01-10T09:07"))]
    assert tables["source_panes"] == [
        dict(source="r1", pane_start=at("2024-01-10T08:00"), packets=0, bytes=0, ticks=2),
        dict(source="r1", pane_start=at("2024-01-10T09:05"), packets=0, bytes=0, ticks=1),
    ]
    for name in ("packets", "late_packets", "rejects", "hourly", "daily", "monthly", "periods"):
        assert tables[name] == [], name


# --------------------------------------------------------------------------- roll-ups


def test_zero_traffic_day_gets_a_ledger_row_with_zero_bytes():
    model = ReferenceModel(ModelSettings())
    model.ingest([("a", feed(packet(at("2024-03-10T23:10"))))], NOW)
    model.ingest([("a", feed(tick(at("2024-03-12T00:00"))))], NOW)
    model.close()
    w = at("2024-03-12T00:00")
    tables = model.tables()
    assert ledger(model, "day") == [
        # the first day covers its hours from the first hour (23:00)
        period_row("day", at("2024-03-10T00:00"), 100, 1, w, reporting=1, expected=1, panes=1),
        # 00:00-22:00 expect a (seen at 23:10 the day before) and get nothing; 23:00 expects none
        period_row("day", at("2024-03-11T00:00"), 0, 0, w, reporting=0, expected=1, panes=12),
    ]
    assert len(ledger(model, "hour")) == 25
    assert ledger(model, "hour")[1] == period_row("hour", at("2024-03-11T00:00"), 0, 0, w,
                                                  reporting=0, expected=1, panes=0)
    assert ledger(model, "hour")[-1] == period_row("hour", at("2024-03-11T23:00"), 0, 0, w,
                                                   reporting=0, expected=0, panes=12)
    assert tables["daily"] == [dict(day=date(2024, 3, 10), month=date(2024, 3, 1), local_ip=LOCAL,
                                    remote_ip=REMOTE, bytes=100, packets=1, bytes_in=0, bytes_out=0)]
    assert tables["monthly"] == [] and ledger(model, "month") == []


def test_month_rolls_up_only_after_its_last_day():
    model = ReferenceModel(ModelSettings())
    model.ingest([("a", feed(packet(at("2024-01-30T10:00")),
                             packet(at("2024-01-31T10:00"), size=200, remote="192.0.2.2")))], NOW)
    model.ingest([("a", feed(tick(at("2024-01-31T23:59:59.999999"))))], NOW)
    model.close()
    assert [row["day"] for row in model.tables()["daily"]] == [date(2024, 1, 30)]
    assert model.tables()["monthly"] == [] and ledger(model, "month") == []
    assert ledger(model, "hour")[-1]["period_start"] == at("2024-01-31T22:00")

    model.ingest([("a", feed(tick(at("2024-02-01T00:00"))))], NOW)
    model.close(until=at("2024-01-31T23:00"))  # `until` holds the last hour, so the day and month
    assert ledger(model, "month") == [] and len(ledger(model, "day")) == 1
    model.close()
    feb = at("2024-02-01T00:00")
    assert ledger(model, "day") == [
        period_row("day", at("2024-01-30T00:00"), 100, 1, at("2024-01-31T10:00"),
                   reporting=1, expected=1, panes=1),
        period_row("day", at("2024-01-31T00:00"), 200, 1, feb, reporting=1, expected=1, panes=2),
    ]
    assert ledger(model, "month") == [
        period_row("month", at("2024-01-01T00:00"), 300, 2, feb, reporting=1, expected=1, panes=3)]
    assert model.tables()["monthly"] == [
        dict(month=date(2024, 1, 1), local_ip=LOCAL, remote_ip=REMOTE, bytes=100, packets=1,
             bytes_in=0, bytes_out=0),
        dict(month=date(2024, 1, 1), local_ip=LOCAL, remote_ip="192.0.2.2", bytes=200, packets=1,
             bytes_in=0, bytes_out=0),
    ]


# --------------------------------------------------------------------------- expiry


def test_expiry_keeps_unfrozen_hours_and_applies_retention():
    settings = ModelSettings(keep_hours=1, late_retention=timedelta(hours=2),
                             reject_retention=timedelta(hours=2))
    model = ReferenceModel(settings)
    model.ingest([("z", feed("garbage"))], NOW)  # no watermark yet: kept for ever
    model.ingest([("a", feed(*(packet(at(f"2024-01-10T{h}:00"), size=h) for h in (10, 11, 12, 13)),
                             "bad,line"))], NOW)
    model.ingest([("a", feed(tick(at("2024-01-10T15:00")), packet(at("2024-01-10T09:30"), size=5)))], NOW)
    model.close(until=at("2024-01-10T12:00"))  # freezes 10 and 11 only
    tables = model.tables()
    # cut-off 15:00 - 1 h = 14:00: frozen 10 and 11 go, closed-but-unfrozen 12 and 13 stay
    assert tables["packets"] == [packet_row(at(f"2024-01-10T{h}:00"), 2, "a", size=h) for h in (12, 13)]
    assert tables["hourly"] == [
        hourly_row(at("2024-01-10T10:00"), 10, 1, "final"),
        hourly_row(at("2024-01-10T11:00"), 11, 1, "final"),
        hourly_row(at("2024-01-10T12:00"), 12, 1, "open"),
        hourly_row(at("2024-01-10T13:00"), 13, 1, "open"),
    ]
    assert tables["late_packets"] == []  # hour 09 < 15:00 - 2 h
    # rejects by the hour of their batch's watermark_after: 13:00 is not < 13:00
    assert [r["record"] for r in tables["rejects"]] == ["garbage", "bad,line"]

    model.ingest([("a", feed(tick(at("2024-01-10T16:00"))))], NOW)
    model.close()
    tables = model.tables()
    assert tables["packets"] == []
    assert [(r["hour"].hour, r["bytes"], r["status"]) for r in tables["hourly"]] == [
        (10, 10, "final"), (11, 11, "final"), (12, 12, "final"), (13, 13, "final")]
    assert [r["record"] for r in tables["rejects"]] == ["garbage"]
    assert [(r["period_start"].hour, r["bytes"]) for r in ledger(model, "hour")] == [
        (10, 10), (11, 11), (12, 12), (13, 13), (14, 0), (15, 0)]


# --------------------------------------------------------------------------- sanity bounds


def test_sanity_bounds_reject_records_and_never_move_clocks():
    model = ReferenceModel(ModelSettings())
    newest = NOW + timedelta(days=1)
    lines = [packet(newest), packet(newest + timedelta(microseconds=1)),
             tick(newest - timedelta(days=400)), packet(newest - timedelta(days=400, microseconds=1))]
    model.ingest([("a", feed(*lines))], NOW)
    tables = model.tables()
    assert without_reason(tables["rejects"], "reason") == [
        dict(batch_id=1, source="a", input_file=None, record=lines[3]),  # rows sort by record
        dict(batch_id=1, source="a", input_file=None, record=lines[1]),
    ]
    assert tables["clocks"] == [dict(source="a", clock=newest, last_batch_id=1, last_seen_at=newest)]
    assert tables["batches"] == [batch_row(1, None, newest, records_read=4, packets_on_time=1,
                                           records_rejected=2, ticks=1, bytes_on_time=100)]


def test_a_bogus_future_record_does_not_set_the_history_bound():
    model = ReferenceModel(ModelSettings())
    lines = [packet(NOW + timedelta(days=1000)), packet(NOW - timedelta(days=2))]
    model.ingest([("a", feed(*lines))], NOW)
    tables = model.tables()
    assert [r["record"] for r in tables["rejects"]] == [lines[0]]
    assert tables["packets"] == [packet_row(NOW - timedelta(days=2), 1, "a")]
    assert model.watermark == NOW - timedelta(days=2)


# --------------------------------------------------------------------------- whole-stream properties


def _random_stream(seed: int) -> list[list[tuple[str, str]]]:
    """Batches of two sources' packets and ticks, drifting forward with late stragglers."""
    rng = random.Random(seed)
    start = at("2024-01-30T20:00")
    batches = []
    for step in range(60):
        files = []
        for source in ("a", "b"):
            if rng.random() < 0.2:
                continue  # a quiet batch for this source
            base = start + timedelta(minutes=50 * step + (30 if source == "b" else 0))
            lines = [packet(base - timedelta(minutes=rng.randrange(0, 180)), size=rng.randrange(0, 1500),
                            remote=f"192.0.2.{rng.randrange(1, 4)}") for _ in range(rng.randrange(0, 4))]
            if rng.random() < 0.5:
                lines.append(tick(base))
            if rng.random() < 0.1:
                lines.append("new,OP_UPDATE,1")
            files.append((source, feed(*lines)))
        batches.append(files)
    return batches


def test_freezing_early_or_late_gives_the_same_tables():
    eager, lazy = ReferenceModel(ModelSettings()), ReferenceModel(ModelSettings())
    for files in _random_stream(seed=7):
        eager.ingest(files, NOW)
        eager.close()
        lazy.ingest(files, NOW)
    lazy.close()
    assert eager.tables() == lazy.tables()
    assert len(ledger(lazy, "day")) >= 1 and len(ledger(lazy, "month")) == 1


def test_conservation_holds_per_period_and_in_total():
    model = ReferenceModel(ModelSettings(keep_hours=2))
    for files in _random_stream(seed=11):
        model.ingest(files, NOW)
        model.close()
    tables = model.tables()
    accepted = sum(b["bytes_on_time"] + b["bytes_late"] for b in tables["batches"])
    assert accepted == sum(r["bytes"] for r in tables["hourly"]) + sum(r["bytes"] for r in tables["late_packets"])
    assert sum(b["records_read"] for b in tables["batches"]) == sum(
        b["packets_on_time"] + b["packets_late"] + b["records_rejected"] + b["ticks"] for b in tables["batches"])

    hourly, late = defaultdict(int), defaultdict(int)
    for row in tables["hourly"]:
        hourly[row["hour"]] += row["bytes"]
    for row in tables["late_packets"]:
        late[row["hour"]] += row["bytes"]
    for row in ledger(model, "hour"):
        start = row["period_start"]
        assert row["bytes"] == hourly[start] and row["late_bytes"] == late[start], row
    first_hour = min(row["period_start"] for row in ledger(model, "hour"))
    for row in ledger(model, "day"):
        hours = [h for h in hourly if row["period_start"] <= h < row["period_start"] + timedelta(days=1)]
        assert row["bytes"] == sum(hourly[h] for h in hours)
        assert row["bytes"] == sum(d["bytes"] for d in tables["daily"] if d["day"] == row["period_start"].date())
        assert row["late_bytes"] == sum(v for h, v in late.items()
                                        if max(first_hour, row["period_start"]) <= h
                                        < row["period_start"] + timedelta(days=1))
    for row in ledger(model, "month"):
        month = row["period_start"].date()
        assert row["bytes"] == sum(d["bytes"] for d in tables["daily"] if d["month"] == month)
        assert row["bytes"] == sum(m["bytes"] for m in tables["monthly"] if m["month"] == month)
    assert all(row["status"] == "final" for row in tables["hourly"]
               if row["hour"] + timedelta(hours=1) <= model.watermark)
    assert len(tables["late_packets"]) > 0 and len(ledger(model, "day")) >= 1
