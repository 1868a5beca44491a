"""What an ingest task decides on its own: each record's fate, the texts of rejects and late rows, partial totals.

These are the Arrow functions the parse tasks run on the executors (``traffic.accounting.batch_tasks``);
the integration tests run them through Spark and compare every table with the reference model.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq

from traffic.storage.place import Place
from traffic.accounting import batch_tasks as B
from traffic.accounting import parts
from traffic.accounting.panes import Mapping, account_parts
from traffic.core.accounts import UNASSIGNED
from traffic.storage.staging import Staged, write_staged
from traffic.core.records import PARSED_SCHEMA

UTC = timezone.utc
W = datetime(2026, 11, 1, 12, tzinfo=UTC)  # watermark before the batch: hours before 12:00 are closed


def _rules(**changes) -> B.Rules:
    values = dict(batch_id=7, watermark_before=W, future_limit=datetime(2026, 11, 2, tzinfo=UTC),
                  history_floor=datetime(2026, 10, 1, tzinfo=UTC), time_range=None, packets=None,
                  late_packets=None, scratch="/nonexistent", settings_doc={})
    values.update(changes)
    return B.Rules(**values)


def _parsed(rows: list[dict]) -> pa.Table:
    base = {"source": "r1", "local_ip": "10.0.0.1", "remote_ip": "192.0.2.1", "local_port": 1000,
            "remote_port": 443, "protocol": 6, "bytes": 100, "direction": "out", "input_file": "r1/a.csv"}
    return pa.Table.from_pylist([{**base, **row} for row in rows], schema=PARSED_SCHEMA)


def _names(parsed: pa.Table, rules: B.Rules) -> list[str]:
    return B._FATE_NAMES.take(pa.array(B.fates(parsed, rules))).to_pylist()


def test_each_record_gets_the_first_fate_of_the_chain():
    parsed = _parsed([
        {"kind": "reject", "ts": None, "reason": "bad", "record": "x"},
        {"kind": "packet", "ts": datetime(2026, 11, 3, tzinfo=UTC)},           # beyond the future limit
        {"kind": "packet", "ts": datetime(2026, 9, 1, tzinfo=UTC)},            # before the history floor
        {"kind": "tick", "ts": datetime(2026, 11, 1, 11, 30, tzinfo=UTC)},     # its hour is closed
        {"kind": "tick", "ts": datetime(2026, 11, 1, 12, 5, tzinfo=UTC)},
        {"kind": "packet", "ts": datetime(2026, 11, 1, 11, 59, 59, 999999, tzinfo=UTC)},
        {"kind": "packet", "ts": W},                                            # hour 12:00 is still open
    ])
    assert _names(parsed, _rules()) == ["reject", "reject", "reject", "late_tick", "tick", "late", "packet"]
    # Without a history floor (a task's first pass) the old record is a packet; without a watermark nothing is late.
    assert _names(parsed, _rules(history_floor=None, watermark_before=None)) == \
        ["reject", "reject", "packet", "tick", "tick", "packet", "packet"]


def test_outside_a_replay_range_comes_before_the_sanity_bounds():
    parsed = _parsed([{"kind": "packet", "ts": datetime(2026, 11, 3, tzinfo=UTC)},
                      {"kind": "packet", "ts": datetime(2026, 11, 1, 13, tzinfo=UTC)},
                      {"kind": "packet", "ts": datetime(2026, 11, 1, 14, tzinfo=UTC)}])
    rules = _rules(time_range=(datetime(2026, 11, 1, 13, tzinfo=UTC), datetime(2026, 11, 1, 14, tzinfo=UTC)),
                   watermark_before=None)
    assert _names(parsed, rules) == ["outside", "packet", "outside"]


def test_reject_and_late_texts_name_the_time_the_bound_and_the_record():
    parsed = _parsed([
        {"kind": "packet", "ts": datetime(2026, 11, 3, 0, 0, 5, 123, tzinfo=UTC), "direction": None},
        {"kind": "packet", "ts": datetime(2026, 9, 1, tzinfo=UTC), "local_port": None},
        {"kind": "reject", "ts": None, "reason": "expected 8 fields", "record": "new,OP_INSERT"},
        {"kind": "packet", "ts": datetime(2026, 11, 1, 11, 30, tzinfo=UTC)},
    ])
    parts = B.split_by_fate(parsed, _rules())
    rejects = parts["rejects"].to_pylist()
    assert [r["reason"] for r in rejects] == [
        "time 2026-11-03T00:00:05.000123Z is more than the allowed future skew ahead of this machine's clock "
        "(limit 2026-11-02T00:00:00+00:00)",
        "time 2026-09-01T00:00:00.000000Z is more than max_history behind the newest record of its batch "
        "(floor 2026-10-01T00:00:00+00:00)",
        "expected 8 fields"]
    # A sanity-bound reject keeps the record as text; a missing field is left out, as Spark's concat_ws does.
    assert [r["record"] for r in rejects] == [
        "2026-11-03T00:00:05.000123Z,r1,10.0.0.1,192.0.2.1,1000,443,6,100",
        "2026-09-01T00:00:00.000000Z,r1,10.0.0.1,192.0.2.1,443,6,100,out",
        "new,OP_INSERT"]
    late = parts["late"].to_pylist()
    assert [r["late_reason"] for r in late] == ["hour 2026-11-01T11:00Z was closed (watermark 2026-11-01T12:00:00+00:00)"]
    assert late[0]["hour"] == datetime(2026, 11, 1, 11, tzinfo=UTC)
    assert parts["packets"].num_rows == 0
    summary = {(r["fate"], r["pane"]): (r["records"], r["bytes"]) for r in parts["summary"].to_pylist()}
    assert summary == {("reject", datetime(2026, 11, 3, tzinfo=UTC)): (1, 100),
                       ("reject", datetime(2026, 9, 1, tzinfo=UTC)): (1, 100),
                       ("reject", None): (1, 100), ("late", datetime(2026, 11, 1, 11, 30, tzinfo=UTC)): (1, 100)}


def test_hourly_parts_count_known_directions_only_and_sum_across_tasks():
    hour = datetime(2026, 11, 1, 12, tzinfo=UTC)
    parsed = _parsed([{"kind": "packet", "ts": hour + timedelta(minutes=m), "direction": d, "bytes": b}
                      for m, d, b in ((1, "in", 10), (2, "out", 20), (3, None, 40), (4, "internal", 80))])
    packets = B.split_by_fate(parsed, _rules())["packets"]
    part = parts.hourly_parts(packets)
    assert part.to_pylist() == [{"hour": hour, "local_ip": "10.0.0.1", "remote_ip": "192.0.2.1", "bytes": 150,
                                 "packets": 4, "bytes_in": 10, "bytes_out": 20}]
    summed = parts.sum_hourly(pa.concat_tables([part, part]), "open").to_pylist()
    assert summed == [{"hour": hour, "local_ip": "10.0.0.1", "remote_ip": "192.0.2.1", "bytes": 300, "packets": 8,
                       "bytes_in": 20, "bytes_out": 40, "day": date(2026, 11, 1), "status": "open"}]
    panes = account_parts(packets, Mapping()).to_pylist()
    assert sorted(((p["pane_start"], p["account"], p["direction"] or "", p["bytes"], p["packets"]) for p in panes)) == [
        (hour, UNASSIGNED, "", 40, 1), (hour, UNASSIGNED, "in", 10, 1), (hour, UNASSIGNED, "internal", 80, 1),
        (hour, UNASSIGNED, "out", 20, 1)]


def test_a_batch_whose_tasks_left_per_address_pane_parts_still_gets_its_account_totals(tmp_path):
    """A batch interrupted after its first commit under the previous version finishes under this one: its
    tasks left per-address pane parts, which the driver attributes as the tasks now do themselves."""
    from types import SimpleNamespace

    from traffic.accounting.ingest import writes

    accounts = tmp_path / "accounts.toml"
    accounts.write_text('[[version]]\nname = "v1"\neffective_from = 2026-10-01\n[version.accounts]\n'
                        'acme = ["10.0.0.1/32"]\n\n[[version]]\nname = "v2"\neffective_from = 2026-11-01T12:10:00Z\n'
                        '[version.accounts]\nbeta = ["10.0.0.0/30"]\n')
    hour = datetime(2026, 11, 1, 12, tzinfo=UTC)
    parsed = _parsed([{"kind": "packet", "ts": hour + timedelta(minutes=m), "local_ip": ip, "bytes": b}
                      for m, ip, b in ((1, "10.0.0.1", 10), (2, "10.0.0.1", 20), (3, "10.0.0.2", 40),
                                       (11, "10.0.0.1", 80), (12, "10.0.0.9", 160))])
    packets = B.split_by_fate(parsed, _rules())["packets"]
    old_parts = pa.table({"pane_start": parts.floor_to(packets.column("ts"), parts.PANE_US),
                          "source": packets.column("source"), "local_ip": packets.column("local_ip"),
                          "direction": packets.column("direction"), "bytes": packets.column("bytes"),
                          "packets": parts.weights(packets)})
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    parts.save_part(Place.of(scratch), "panes", 0, 0, old_parts.slice(0, 3))
    parts.save_part(Place.of(scratch), "panes", 1, 0, old_parts.slice(3))
    read = SimpleNamespace(scratch=Place.of(scratch), attempts={0: 0, 1: 0})
    warehouse = SimpleNamespace(settings=SimpleNamespace(accounts_file=accounts))
    got = writes.account_pane_parts(warehouse, read)

    def rows(table):
        return sorted(tuple(r.values()) for r in table.to_pylist())

    assert rows(got) == rows(account_parts(packets, Mapping.of(accounts)))
    assert {(r["account"], r["mapping_version"].split("@")[0], r["bytes"]) for r in got.to_pylist()} == {
        ("acme", "v1", 30), (UNASSIGNED, "v1", 40), ("beta", "v2", 80), (UNASSIGNED, "v2", 160)}
    # This version's tasks leave account parts: those are read as they are.
    parts.save_part(Place.of(scratch), "accounts", 0, 0, account_parts(packets, Mapping.of(accounts)))
    parts.save_part(Place.of(scratch), "accounts", 1, 0, account_parts(packets.slice(0, 0), Mapping.of(accounts)))
    assert rows(writes.account_pane_parts(warehouse, read)) == rows(got)


def _parts_over_hours(hours: int, pairs: int, repeats: int) -> pa.Table:
    """Hourly parts with every pair of every hour ``repeats`` times, plus rows without an hour."""
    start = datetime(2026, 11, 1, tzinfo=UTC)
    rows = [{"hour": start + timedelta(hours=h) if (h + p) % 97 else None, "local_ip": f"10.0.{p % 7}.{p % 251}",
             "remote_ip": f"192.0.2.{p % 13}", "bytes": 10 * p + h + r, "packets": 1 + r, "bytes_in": r, "bytes_out": h}
            for r in range(repeats) for h in range(hours) for p in range(pairs)]
    return pa.Table.from_pylist(rows, schema=parts.HOURLY_PARTS)


def test_the_driver_sums_hourly_parts_in_hour_ranges_to_the_same_rows(monkeypatch):
    table = _parts_over_hours(hours=11, pairs=300, repeats=3)
    monkeypatch.setattr(parts, "PARALLEL_ROWS", 1)
    # Ranges of whole hours, every row in exactly one of them (the rows without an hour in their own).
    masks = parts._hour_ranges(table, 4)
    assert 2 <= len(masks) <= 5
    assert sum(table.filter(m).num_rows for m in masks) == table.num_rows
    for mask in masks:
        hours = set(table.filter(mask).column("hour").to_pylist())
        assert all(not hours & set(table.filter(other).column("hour").to_pylist()) for other in masks if other is not mask)

    def rows(result):
        return sorted(result.to_pylist(), key=lambda r: (str(r["hour"]), r["local_ip"], r["remote_ip"]))

    one, many = parts.sum_hourly(table, "open"), parts.sum_hourly(table, "open", threads=2)
    assert rows(many) == rows(one)
    assert many.num_rows == one.num_rows == len({(r["hour"], r["local_ip"], r["remote_ip"]) for r in table.to_pylist()})
    assert sum(many.column("bytes").to_pylist()) == sum(table.column("bytes").to_pylist())


def test_files_written_by_several_threads_equal_those_written_by_one(tmp_path):
    table = parts.sum_hourly(_parts_over_hours(hours=6, pairs=50, repeats=1), "open")
    for threads, folder in ((1, "one"), (3, "three")):
        assert write_staged_threads(table, tmp_path / folder, threads) == table.num_rows

    def files(folder):
        return {p.relative_to(tmp_path / folder).as_posix(): pq.read_table(p).to_pylist()
                for p in sorted((tmp_path / folder).rglob("*.parquet"))}

    assert files("one") == files("three") and len(files("one")) == 7  # six hours and the rows without one


def write_staged_threads(table: pa.Table, folder, threads: int) -> int:
    from traffic.storage.staging import write_keyed

    return write_keyed(table, "hourly", folder, "part", threads=threads)


def test_staged_files_hold_one_cluster_key_each(tmp_path):
    rows = pa.table({"ts": [datetime(2026, 11, 1, 10, 5, tzinfo=UTC), datetime(2026, 11, 1, 11, 0, tzinfo=UTC),
                            datetime(2026, 11, 1, 10, 59, tzinfo=UTC)],
                     "hour": [datetime(2026, 11, 1, 10, tzinfo=UTC), datetime(2026, 11, 1, 11, tzinfo=UTC),
                              datetime(2026, 11, 1, 10, tzinfo=UTC)],
                     "bytes": [1, 2, 3]})
    assert write_staged(rows, Staged("packets", str(tmp_path)), "part-c00001-a0") == 3
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.parquet"))
    assert files == ["k=2026-11-01T10/part-c00001-a0.parquet", "k=2026-11-01T11/part-c00001-a0.parquet"]
    assert pq.read_table(tmp_path / files[0]).column("bytes").to_pylist() == [1, 3]
    # Month keys group days; a missing key value goes to the null key.
    months = pa.table({"month": [date(2026, 11, 1), date(2026, 12, 1), None], "bytes": [1, 2, 3]})
    write_staged(months, Staged("monthly", str(tmp_path / "m")), "part")
    assert sorted(p.parent.name for p in (tmp_path / "m").rglob("*.parquet")) == [
        "k=2026-11", "k=2026-12", "k=__HIVE_DEFAULT_PARTITION__"]


def test_rows_in_time_order_are_split_by_key_the_same_way(tmp_path):
    hours = [datetime(2026, 11, 1, h, tzinfo=UTC) for h in (9, 9, 10, 12, 12, 12)]
    rows = pa.table({"ts": hours, "hour": hours, "local_ip": ["10.0.0.1"] * 6, "bytes": [1, 2, 3, 4, 5, 6]})
    write_staged(rows, Staged("packets", str(tmp_path)), "part")
    by_key = {p.parent.name: pq.read_table(p).column("bytes").to_pylist() for p in tmp_path.rglob("*.parquet")}
    assert by_key == {"k=2026-11-01T09": [1, 2], "k=2026-11-01T10": [3], "k=2026-11-01T12": [4, 5, 6]}
    # Raw detail keeps statistics only for the columns it is filtered by (time and batch).
    columns = pq.read_metadata(tmp_path / "k=2026-11-01T12" / "part.parquet").row_group(0)
    stats = {columns.column(i).path_in_schema: columns.column(i).is_stats_set for i in range(columns.num_columns)}
    assert stats["ts"] and stats["hour"] and stats["batch_id"] and not stats["local_ip"]


def test_freeze_files_are_shared_out_once_each_by_size():
    from traffic.accounting.freeze_tasks import share_out

    files = [(f"f{i}", size) for i, size in enumerate([90, 10, 40, 40, 30, 30, 5, 5])]
    groups = share_out(files, 4)
    assert sorted(p for g in groups for p in g) == sorted(p for p, _ in files)
    sizes = dict(files)
    loads = sorted(sum(sizes[p] for p in g) for g in groups)
    # Largest first, each to the lightest group: the 90 alone, the rest within 50-60 (a round-robin gives 130).
    assert len(groups) == 4 and loads == [50, 50, 60, 90] and groups[0] == ["f0"]
    assert share_out(files[:2], 4) == [["f0"], ["f1"]]
    assert share_out([], 4) == []


def test_a_freeze_task_writes_an_hour_from_its_files_and_compares_it_with_the_open_rows(tmp_path):
    """Two raw files of one hour sum to its final row and panes (written staged); an open row that
    differs is counted twice (it and its final row), the hour's raw Σ is left for the ledger."""
    from traffic.accounting.freeze_tasks import COLUMNS, Hour, Job, recompute
    from traffic.accounting.panes import Mapping

    hour = datetime(2026, 11, 1, 10, tzinfo=UTC)
    rows = [(hour + timedelta(minutes=m), "r1", "10.0.0.1", "192.0.2.1", size, d)
            for m, size, d in ((1, 100, "in"), (2, 50, "out"), (7, 30, None), (8, None, "in"))]
    for i, part in enumerate((rows[:2], rows[2:])):
        table = pa.table({c: [r[j] for r in part] for j, c in enumerate(["ts", "source", "local_ip", "remote_ip",
                                                                          "bytes", "direction"])})
        table = table.append_column("hour", pa.array([hour] * len(part), pa.timestamp("us", tz="UTC")))
        # Files as written before rows carried weights: no packets/sampling_rate column, each row is 1 packet.
        pq.write_table(table.select([c for c in COLUMNS if c in table.column_names]), tmp_path / f"{i}.parquet")
    open_row = pa.table({"hour": pa.array([hour], pa.timestamp("us", tz="UTC")), "local_ip": ["10.0.0.1"],
                         "remote_ip": ["192.0.2.1"], "bytes": [150], "packets": [2], "bytes_in": [100],
                         "bytes_out": [50]})
    pq.write_table(open_row, tmp_path / "open.parquet")
    (tmp_path / "scratch").mkdir()
    job = Job(str(tmp_path / "scratch"), Staged("hourly", str(tmp_path / "h")), Staged("panes", str(tmp_path / "p")),
              Mapping())
    the_hour = Hour("2026-11-01T10", (str(tmp_path / "0.parquet"), str(tmp_path / "1.parquet")),
                    (str(tmp_path / "open.parquet"),))
    assert recompute([the_hour], job, 3) == {"task": 3, "rows": 4}
    written = pq.read_table(tmp_path / "h" / "k=2026-11-01T10" / "part-c00003-a0.parquet").to_pylist()
    assert [(r["bytes"], r["packets"], r["bytes_in"], r["bytes_out"], r["status"]) for r in written] == [
        (180, 4, 100, 50, "final")]
    raw = parts.read_parts(Place.of(tmp_path / "scratch"), "raw", {3: 0}).to_pylist()
    assert [(r["hour"], r["bytes"], r["packets"]) for r in raw] == [(hour, 180, 4)]
    assert parts.read_parts(Place.of(tmp_path / "scratch"), "differing", {3: 0}).to_pylist() == [{"hour": hour, "n": 2}]
    # Pane rows leave the task attributed to accounts (none here: every address unassigned).
    panes = pq.read_table(tmp_path / "p" / "k=2026-11-01T10" / "part-c00003-a0.parquet").to_pylist()
    assert {(r["account"], r["status"]) for r in panes} == {("unassigned", "final")}
    assert sorted((r["pane_start"].minute, r["direction"] or "", r["bytes"], r["packets"]) for r in panes) == [
        (0, "in", 100, 1), (0, "out", 50, 1), (5, "", 30, 1), (5, "in", None, 1)]
