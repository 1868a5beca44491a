"""Exports (issue 24): ``traffic show|top|bill --format`` and ``traffic export`` read back to the table rows exactly.

One warehouse is built through the real pipeline (two sources with accounts, 2026-10-30 20:00 to
2026-11-01 03:30 UTC, one ingest and one close): October's days and month are rolled up (the frozen
days of ``hourly`` and ``panes`` merged into a file per day), October's bills are stored, and the hour
2026-11-01 03:00 is still open. Every file each command writes in CSV, JSON lines and Parquet is read
back — CSV with pyarrow.csv and the table's schema, JSON line by line, Parquet with pyarrow — and
compared with the rows read from the Delta table itself: same columns, types and values, times in UTC.
``export``'s gating (final rows of published periods only, unless ``--include-open``; a failed period
never) is checked against the ledger, and a month of ``hourly`` written straight through the Delta
layer is exported in a fresh process whose peak Arrow memory is compared with the month's size.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from tests.support.accounts import V1
from tests.support.exports import assert_same_rows, read_back
from tests.support.harness import Harness, feed_line, tick_line
from traffic.app import cli
from traffic.reporting import export
from traffic.reporting.top import top_talkers
from traffic.storage import state as st
from traffic.storage.table import Table
from traffic.storage.schemas import arrow_schema

UTC = timezone.utc
PANE = timedelta(minutes=5)
START = datetime(2026, 10, 30, 20, tzinfo=UTC)
END = datetime(2026, 11, 1, 3, 30, tzinfo=UTC)
NOW = "2026-12-01T00:00:00+00:00"
BEFORE = START - timedelta(minutes=110)
FORMATS = ["csv", "json", "parquet"]
#: Published, as the contract (DESIGN §6) says it: what export may write of an accounting table.
PUBLISHED = {"passed", "warning", "accepted"}
#: Per exported table: the time column ``--from/--to`` applies to, and the ledger (column, grain) gating it.
TIME = {"hourly": "hour", "daily": "day", "monthly": "month", "periods": "period_start", "panes": "pane_start",
        "bills": "period_start", "source_panes": "pane_start", "packets": "ts", "late_packets": "ts",
        "rejects": "hour", "batches": "started_at", "dq_results": "period_start", "alerts": "period_start"}
GATED = {"hourly": ("hour", "hour"), "panes": ("hour", "hour"), "source_panes": ("pane_start", "hour"),
         "packets": ("hour", "hour"), "daily": ("day", "day"), "monthly": ("month", "month")}


def _stream() -> tuple[str, str]:
    """(JSON lines of source ``flows`` with directions, router-feed lines of source ``feed``) over START → END."""
    flows, feed = [], []
    t, i = START, 0
    while t < END:
        for offset, local, remote, size, direction in (
                (timedelta(minutes=1), "10.0.0.5", "192.0.2.1", 1000 + i, "in"),
                (timedelta(minutes=2), "10.0.1.7", "198.51.100.2", 300 + i % 7, "out"),
                (timedelta(minutes=3), "10.9.9.9", "192.0.2.3", 3, None)):
            doc = {"ts": (t + offset).isoformat(), "local_ip": local, "remote_ip": remote, "local_port": 40000,
                   "remote_port": 443, "protocol": 6, "bytes": size}
            if direction:
                doc["direction"] = direction
            flows.append(json.dumps(doc))
        # Microseconds in the times: the formats must carry them exactly.
        feed.append(feed_line(t + timedelta(seconds=30, microseconds=123457 + i), "10.0.0.9", "192.0.2.9",
                              40000 + i % 3, 80, 100 + i % 13))
        t, i = t + PANE, i + 1
    feed.append(tick_line(BEFORE))  # a clock tick before the first packet: a source pane before the first hour
    feed.append("new,OP_INSERT,not-a-time,10.0.0.9")  # one reject
    feed.append(tick_line(END))
    return "\n".join(flows) + "\n", "\n".join(feed) + "\n"


@pytest.fixture(scope="module")
def built(spark, tmp_path_factory) -> Harness:
    root = tmp_path_factory.mktemp("exports")
    (root / "accounts.toml").write_text(V1)
    harness = Harness(root, spark, accounts_file=root / "accounts.toml", keep_hours=1000)
    flows, feed = _stream()
    harness.deliver("flows", flows, "a.jsonl")
    harness.deliver("feed", feed, "a.csv")
    harness.ingest()
    harness.close()
    return harness


def _args(harness: Harness) -> list[str]:
    return ["--warehouse", str(harness.settings.warehouse), "--inbox", str(harness.settings.inbox),
            "--set", f"now={NOW}", "--set", f"accounts_file={harness.settings.accounts_file}"]


def _rows(harness: Harness, name: str) -> pa.Table:
    """The table's rows as the Delta layer reads them (whole)."""
    return harness.warehouse().table(name).read_arrow()


def test_the_warehouse_has_what_the_exports_need(built):
    """Merged days, stored bills, an open hour, a reject, microsecond times: each export below covers them."""
    assert any(len(f.key) == 10 for f in built.warehouse().table("hourly").files())  # a merged day (a span)
    hourly = _rows(built, "hourly")
    assert set(hourly.column("status").to_pylist()) == {"open", "final"}
    assert {r["period"] for r in built.table("bills")} == {"2026-10"}
    assert _rows(built, "rejects").num_rows == 1 and _rows(built, "monthly").num_rows
    assert any(ts.microsecond for ts in _rows(built, "packets").column("ts").to_pylist())
    assert BEFORE in _rows(built, "source_panes").column("pane_start").to_pylist()


def test_source_panes_before_the_first_hour_are_exported_and_open_ones_are_not(built, tmp_path):
    out = tmp_path / "panes.json"
    assert _export(built, "source_panes", "json", out, "2026-10-30T18:00", "2026-11-02") == 0
    got = read_back(out, "json", arrow_schema("source_panes"))
    starts = got.column("pane_start").to_pylist()
    assert starts[0] == datetime(2026, 10, 30, 18, 10, tzinfo=UTC) and got.column("ticks")[0].as_py() == 1
    assert max(starts) < datetime(2026, 11, 1, 3, tzinfo=UTC) <= max(_rows(built, "source_panes").column(
        "pane_start").to_pylist())


# -- show, top, bill ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("what, table", [("hourly", "hourly"), ("periods", "periods"), ("batches", "batches")])
def test_show_writes_every_row_and_column_exactly(built, tmp_path, capsys, what, table, fmt):
    out = tmp_path / f"show.{fmt}"
    assert cli.main(["show", what, "--top", "0", "--format", fmt, "--out", str(out), *_args(built)]) == 0
    expected = _rows(built, table)
    assert_same_rows(read_back(out, fmt, expected.schema), expected)
    assert f"{expected.num_rows:,} rows, {out.stat().st_size:,} bytes written to {out}" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_show_to_stdout_keeps_its_order_and_top_limits_rows(built, capsys, fmt):
    assert cli.main(["show", "hourly", "--top", "3", "--format", fmt, *_args(built)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert len(lines) == 3 + (fmt == "csv")
    hourly = _rows(built, "hourly").sort_by([("bytes", "descending")])
    if fmt == "json":
        assert [json.loads(line)["bytes"] for line in lines] == hourly.column("bytes").to_pylist()[:3]
        assert all(list(json.loads(line)) == hourly.column_names for line in lines)
    else:
        assert lines[0] == ",".join(f'"{c}"' for c in hourly.column_names)
        assert [int(line.split(",")[4]) for line in lines[1:]] == hourly.column("bytes").to_pylist()[:3]


def test_show_table_output_is_unchanged_and_machine_output_has_no_separators(built, capsys):
    assert cli.main(["show", "hourly", "--top", "2", *_args(built)]) == 0
    table_text = capsys.readouterr().out
    assert table_text.splitlines()[0].split() == ["hour", "local_ip", "remote_ip", "bytes", "packets", "bytes_in",
                                                  "bytes_out", "status"]
    biggest = _rows(built, "hourly").sort_by([("bytes", "descending")]).slice(0, 1).to_pylist()[0]
    assert f"{biggest['bytes']:,}" in table_text  # people get thousands separators …
    assert cli.main(["show", "hourly", "--top", "1", "--format", "csv", *_args(built)]) == 0
    row = capsys.readouterr().out.splitlines()[1]
    assert f",{biggest['bytes']}," in row and biggest["hour"].isoformat() in row  # … machines the exact value


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("by, key", [("host", "local_ip"), ("account", "account")])
def test_top_writes_the_ranking_exactly(built, tmp_path, capsys, by, key, fmt):
    out = tmp_path / f"top.{fmt}"
    args = ["top", "--last", "24h", "--by", by, "--limit", "50", *_args(built)]
    assert cli.main([*args, "--format", fmt, "--out", str(out)]) == 0
    assert cli.main([*args, "--json"]) == 0  # the one-document form stays as it was
    doc = json.loads(capsys.readouterr().out)
    result = top_talkers(built.warehouse(), timedelta(hours=24), by, 50)
    assert doc["rows"] == result.rows and len(result.rows) >= 2
    stamp = pa.timestamp("us", tz="UTC")
    expected = pa.table({key: pa.array([r["key"] for r in result.rows], pa.string()),
                         **{c: pa.array([r[c] for r in result.rows], pa.int64())
                            for c in ("bytes", "packets", "bytes_in", "bytes_out")},
                         "window_start": pa.array([result.start] * len(result.rows), stamp),
                         "window_end": pa.array([result.end] * len(result.rows), stamp)})
    got = read_back(out, fmt, expected.schema)
    assert got.schema == expected.schema and got.equals(expected)  # in rank order
    assert got.column("window_end")[0].as_py() == built.watermark


@pytest.mark.parametrize("fmt", FORMATS)
def test_bill_writes_the_stored_bills_exactly(built, tmp_path, capsys, fmt):
    out = tmp_path / f"bill.{fmt}"
    assert cli.main(["bill", "--period", "2026-10", "--format", fmt, "--out", str(out), *_args(built)]) == 0
    stored = _rows(built, "bills")
    stored = stored.filter(pc.equal(stored.column("period"), "2026-10"))
    expected = stored.append_column("final", pa.array([True] * stored.num_rows)) \
                     .append_column("stored", pa.array([True] * stored.num_rows))
    assert stored.num_rows >= 2 and "commit_bps" in stored.column_names  # columns added since are written too
    assert_same_rows(read_back(out, fmt, expected.schema), expected)
    assert cli.main(["bill", "--period", "2026-10", "--json", *_args(built)]) == 0  # the document form is unchanged
    doc = json.loads(capsys.readouterr().out)
    assert doc["final"] and doc["stored"] and {b["account"] for b in doc["bills"]} == \
        set(stored.column("account").to_pylist())


def test_a_provisional_bill_says_so_on_every_row(built, tmp_path):
    out = tmp_path / "november.json"
    assert cli.main(["bill", "--period", "2026-11", "--format", "json", "--out", str(out), *_args(built)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(r["final"] is False and r["stored"] is False and r["period"] == "2026-11" for r in rows)
    assert all(type(r["bytes_total"]) is int and type(r["billable_bps"]) is float for r in rows)


# -- export ------------------------------------------------------------------------------------------

def _expected(harness: Harness, table: str, start: datetime, end: datetime, include_open: bool) -> pa.Table:
    """Rows an export must write, worked out from the table and the ledger directly."""
    rows = _rows(harness, table)
    values = rows.column(TIME[table])
    if pa.types.is_date(values.type):  # a day or month is in the range when it starts in it
        keep = [start <= datetime(v.year, v.month, v.day, tzinfo=UTC) < end for v in values.to_pylist()]
    else:
        keep = [v is not None and start <= v < end for v in values.to_pylist()]
    rows = rows.filter(pa.array(keep, pa.bool_()))
    if table not in GATED:
        return rows
    column, grain = GATED[table]
    ledger = st.read_ledger(harness.warehouse())
    status = {r["period_start"]: r["dq_status"] for r in ledger if r["grain"] == grain}
    frontier = max(r["period_start"] for r in ledger if r["grain"] == "hour") + timedelta(hours=1)
    keep = []
    for row in rows.to_pylist():
        moment = row[column]
        moment = datetime(moment.year, moment.month, moment.day, tzinfo=UTC) if not isinstance(moment, datetime) \
            else moment.replace(minute=0, second=0, microsecond=0)
        known = status.get(moment)
        if known is not None:
            keep.append(known in PUBLISHED and (include_open or row.get("status", "final") == "final"))
        elif grain == "hour" and moment < frontier:  # before the first hour: no period the ledger holds back
            keep.append(True)
        else:  # not closed yet
            keep.append(include_open)
    return rows.filter(pa.array(keep, pa.bool_()))


def _export(harness: Harness, table: str, fmt: str, out: Path, start="2026-10-01", end="2026-11-02",
            *extra: str) -> int:
    return cli.main(["export", "--table", table, "--from", start, "--to", end, "--format", fmt, "--out", str(out),
                     *extra, *_args(harness)])


def _range(table: str) -> tuple[datetime, datetime]:
    """Event time for every table but ``batches``, whose time is when each batch ran (the wall clock)."""
    if table == "batches":
        today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        return today - timedelta(days=1), today + timedelta(days=2)
    return datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 11, 2, tzinfo=UTC)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("table", sorted(TIME))
def test_export_writes_the_published_rows_of_a_range_in_time_order(built, tmp_path, capsys, table, fmt):
    out = tmp_path / f"{table}.{fmt}"
    start, end = _range(table)
    assert _export(built, table, fmt, out, start.isoformat(), end.isoformat()) == 0
    expected = _expected(built, table, start, end, False)
    got = read_back(out, fmt, expected.schema)
    assert_same_rows(got, expected)
    times = got.column(TIME[table]).to_pylist()
    assert times == sorted(times)  # time order
    if table not in ("late_packets", "alerts"):
        assert expected.num_rows, "a table that should hold rows is empty: the comparison proves nothing"
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"export: {expected.num_rows:,} rows of {table} from {start:%Y-%m-%d %H:%M} to "
                              f"{end:%Y-%m-%d %H:%M} UTC")
    assert f"({out.stat().st_size:,} bytes) written to {out}" in err[-1]


@pytest.mark.parametrize("table", ["hourly", "panes", "packets", "source_panes"])
def test_open_rows_are_left_out_unless_include_open(built, tmp_path, capsys, table):
    start, end = datetime(2026, 10, 31, 22, tzinfo=UTC), datetime(2026, 11, 1, 6, tzinfo=UTC)
    final, everything = tmp_path / "final.parquet", tmp_path / "all.parquet"
    assert _export(built, table, "parquet", final, start.isoformat(), end.isoformat()) == 0
    left = capsys.readouterr().err
    assert _export(built, table, "parquet", everything, start.isoformat(), end.isoformat(), "--include-open") == 0
    got_final, got_all = pq.read_table(final), pq.read_table(everything)
    assert_same_rows(got_final, _expected(built, table, start, end, False))
    assert_same_rows(got_all, _expected(built, table, start, end, True))
    open_hour = datetime(2026, 11, 1, 3, tzinfo=UTC)
    hour_of = (lambda t: t.replace(minute=0, second=0, microsecond=0))
    column = GATED[table][0]
    assert open_hour not in {hour_of(v) for v in got_final.column(column).to_pylist()}
    assert open_hour in {hour_of(v) for v in got_all.column(column).to_pylist()}
    opened = got_all.num_rows - got_final.num_rows
    assert opened > 0 and f"left out: {opened:,} open row(s)" in left


def test_a_range_cuts_times_exactly_and_a_day_is_in_it_when_it_starts_in_it(built, tmp_path):
    start, end = datetime(2026, 10, 31, 5, 30, tzinfo=UTC), datetime(2026, 10, 31, 7, 1, 30, 123457, tzinfo=UTC)
    out = tmp_path / "packets.json"
    assert _export(built, "packets", "json", out, start.isoformat(), end.isoformat()) == 0
    got = read_back(out, "json", arrow_schema("packets"))
    assert_same_rows(got, _expected(built, "packets", start, end, False))
    times = got.column("ts").to_pylist()
    assert times[0] >= start and times[-1] < end and got.num_rows > 20
    days = tmp_path / "daily.csv"
    assert _export(built, "daily", "csv", days, "2026-10-30T10:00", "2026-11-02") == 0
    assert set(read_back(days, "csv", arrow_schema("daily")).column("day").to_pylist()) == {date(2026, 10, 31)}


def test_a_failed_period_is_never_exported(built, spark, tmp_path, capsys):
    shutil.copytree(built.root, tmp_path / "copy")
    copy = Harness(tmp_path / "copy", spark, accounts_file=tmp_path / "copy" / "accounts.toml", keep_hours=1000)
    warehouse = copy.warehouse()
    hour, day = datetime(2026, 10, 31, 5, tzinfo=UTC), datetime(2026, 10, 31, tzinfo=UTC)
    ledger = {(r["grain"], r["period_start"]): r for r in st.read_ledger(warehouse)}
    st.write_ledger_rows(warehouse, [{**ledger[("hour", hour)], "dq_status": "failed", "dq_note": "test: corrupt"},
                                     {**ledger[("day", day)], "dq_status": "failed", "dq_note": "test: corrupt"}])
    hourly = _rows(copy, "hourly")
    failed_rows = pc.sum(pc.equal(hourly.column("hour"), pa.scalar(hour, hourly.schema.field("hour").type))).as_py()
    assert failed_rows > 0
    for extra in ((), ("--include-open",)):
        out = tmp_path / f"hourly{len(extra)}.csv"
        assert _export(copy, "hourly", "csv", out, "2026-10-30", "2026-11-02", *extra) == 0
        got = read_back(out, "csv", hourly.schema)
        assert hour not in set(got.column("hour").to_pylist())
        assert hour - timedelta(hours=1) in set(got.column("hour").to_pylist())
        assert_same_rows(got, _expected(copy, "hourly", datetime(2026, 10, 30, tzinfo=UTC),
                                        datetime(2026, 11, 2, tzinfo=UTC), bool(extra)))
        assert f"{failed_rows:,} row(s) of failed periods" in capsys.readouterr().err
    daily = tmp_path / "daily.json"
    assert _export(copy, "daily", "json", daily) == 0
    assert set(read_back(daily, "json", arrow_schema("daily")).column("day").to_pylist()) == {date(2026, 10, 30)}


def test_one_read_per_file_group_with_progress_and_a_failed_export_leaves_no_file(built, tmp_path, monkeypatch):
    reads, fail_at = [], []
    real = Table.read_arrow

    def counted(self, *args, **kwargs):
        if self.name == "hourly":
            reads.append(kwargs.get("keys"))
            if len(reads) in fail_at:
                raise OSError(5, "Input/output error")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Table, "read_arrow", counted)
    lines = []
    out = tmp_path / "hourly.csv"
    written = export.export_table(built.warehouse(), "hourly", datetime(2026, 10, 30, tzinfo=UTC),
                                  datetime(2026, 11, 2, tzinfo=UTC), "csv", out, progress=lines.append,
                                  progress_every=0)
    assert written.rows > 0 and written.bytes == out.stat().st_size and written.path == out
    # 2026-10-30 and 10-31 are merged into a file each: one read per day; 2026-11-01's hours 00-03 one read each.
    assert [len(keys) for keys in reads] == [24, 24, 1, 1, 1, 1]
    assert reads[2:] == [[datetime(2026, 11, 1, h, tzinfo=UTC)] for h in range(4)]
    assert written.periods == 52 and len(lines) == 6
    assert all(line.startswith("export hourly: ") for line in lines)
    assert lines[0].endswith("through 2026-10-31 00:00 …") and lines[-1].endswith("through 2026-11-02 00:00 …")
    assert f"{written.rows:,} rows of 52 hour(s) written" in lines[-1]

    before = out.read_bytes()
    reads.clear()
    fail_at.append(2)
    with pytest.raises(OSError):
        export.export_table(built.warehouse(), "hourly", datetime(2026, 10, 30, tzinfo=UTC),
                            datetime(2026, 11, 2, tzinfo=UTC), "csv", out)
    assert out.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [out.name]


@pytest.mark.parametrize("case, args, message", [
    ("unknown table", ["export", "--table", "clocks", "--from", "2026-10-30", "--to", "2026-11-01", "--format", "csv"],
     "--table 'clocks': not a table export writes; choose one of hourly, daily"),
    ("parquet without --out", ["export", "--table", "hourly", "--from", "2026-10-30", "--to", "2026-11-01",
                               "--format", "parquet"], "--format parquet writes a binary file"),
    ("show parquet without --out", ["show", "hourly", "--format", "parquet"], "give --out PATH"),
    ("from after to", ["export", "--table", "hourly", "--from", "2026-11-01", "--to", "2026-10-30", "--format", "csv"],
     "--from 2026-11-01 00:00:00 is not before --to 2026-10-30 00:00:00"),
    ("no such folder", ["export", "--table", "hourly", "--from", "2026-10-30", "--to", "2026-11-01", "--format", "csv",
                        "--out", "/nonexistent/folder/x.csv"], "folder /nonexistent/folder does not exist"),
    ("bill --out folder missing", ["bill", "--period", "2026-10", "--format", "json", "--out", "/nonexistent/b.json"],
     "folder /nonexistent does not exist"),
    ("--json with --format", ["top", "--last", "1h", "--json", "--format", "csv"], "give one of them"),
    ("--out without a format", ["show", "hourly", "--out", "x.csv"], "add --format csv, json or parquet"),
    ("bad time", ["export", "--table", "hourly", "--from", "yesterday", "--to", "2026-11-01", "--format", "csv"],
     "is not an ISO-8601 time"),
])
def test_mistakes_are_one_line_and_exit_2(built, capsys, case, args, message):
    assert cli.main([*args, *_args(built)]) == 2, case
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], (case, captured.err)
    assert lines[0].startswith(f"traffic {args[0]}: error: ") and captured.out == ""


# -- memory --------------------------------------------------------------------------------------------

MONTH = datetime(2026, 9, 1, tzinfo=UTC)
PAIRS = 1500  # rows an hour: 720 hours → 1,080,000 rows


@pytest.fixture(scope="module")
def month(tmp_path_factory) -> Harness:
    """September 2026 of ``hourly`` (every hour final and passed), written straight through the Delta layer a
    day at a time: 24 files, one per hour key, each day."""
    harness = Harness(tmp_path_factory.mktemp("month"), None)
    warehouse = harness.warehouse()
    warehouse.create_all()
    table = warehouse.table("hourly")
    rng = np.random.default_rng(3)
    local = pa.array([f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(PAIRS)])
    remote = pa.array([f"198.51.{i % 7}.{i % 251}" for i in range(PAIRS)])
    ledger = []
    for day in range(30):
        start = MONTH + timedelta(days=day)
        hours = np.repeat(np.arange(24, dtype=np.int64) * 3_600_000_000 + int(start.timestamp()) * 1_000_000, PAIRS)
        size = rng.integers(1, 10 ** 12, len(hours))
        table.append(pa.table({
            "hour": pa.array(hours, pa.timestamp("us", tz="UTC")),
            "day": pa.array([start.date()] * len(hours), pa.date32()),
            "local_ip": pa.concat_arrays([local] * 24), "remote_ip": pa.concat_arrays([remote] * 24),
            "bytes": size, "packets": rng.integers(1, 10 ** 6, len(hours)), "bytes_in": size // 2,
            "bytes_out": size // 3, "status": pa.array(["final"] * len(hours))}, schema=table.arrow_schema))
        ledger += [{"grain": "hour", "period_start": start + timedelta(hours=h), "bytes": 0, "packets": 0,
                    "dq_status": "passed"} for h in range(24)]
    st.write_ledger_rows(warehouse, ledger)
    return harness


#: Runs ``traffic`` in a fresh interpreter and prints the Arrow memory pool's peak at the end.
_PEAK = ("import sys, pyarrow as pa\nfrom traffic.app.cli import main\ncode = main(sys.argv[1:])\n"
         "print('PEAK', pa.default_memory_pool().max_memory(), file=sys.stderr)\nsys.exit(code)\n")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_month_of_hourly_streams_in_the_memory_of_one_key(month, tmp_path, fmt):
    warehouse = month.warehouse()
    whole = warehouse.table("hourly").read_arrow()
    one_key = warehouse.table("hourly").read_arrow(keys=[MONTH + timedelta(days=12, hours=5)])
    assert whole.num_rows == 720 * PAIRS and one_key.num_rows == PAIRS
    out = tmp_path / f"september.{fmt}"
    run = subprocess.run([sys.executable, "-c", _PEAK, "export", "--table", "hourly", "--from", "2026-09-01",
                          "--to", "2026-10-01", "--format", fmt, "--out", str(out), "--warehouse",
                          str(month.settings.warehouse), "--inbox", str(month.settings.inbox)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    peak = int(run.stderr.split("PEAK ")[1])
    print(f"{fmt}: peak Arrow memory {peak / 2 ** 20:.1f} MiB; the month's rows {whole.nbytes / 2 ** 20:.1f} MiB, "
          f"one hour key's {one_key.nbytes / 2 ** 20:.2f} MiB; file {out.stat().st_size / 2 ** 20:.1f} MiB")
    assert f"export: {whole.num_rows:,} rows of hourly" in run.stderr
    # Measured here: 0.6-1.0 MiB against 0.12 MiB a key and 85 MiB the month; reading the month at once: 265 MiB.
    assert peak < 16 * one_key.nbytes and peak < whole.nbytes / 40, (peak, one_key.nbytes, whole.nbytes)
    # The file holds the whole month, in time order.
    if fmt == "parquet":
        hours = pq.read_table(out, columns=["hour"]).column("hour")
    elif fmt == "csv":
        hours = pacsv.read_csv(out, convert_options=pacsv.ConvertOptions(
            column_types={"hour": pa.timestamp("us", tz="UTC")}, include_columns=["hour"])).column("hour")
    else:
        with out.open() as lines:
            hours = pa.array([datetime.fromisoformat(json.loads(line)["hour"]) for line in lines],
                             pa.timestamp("us", tz="UTC"))
    assert len(hours) == whole.num_rows
    assert pc.all(pc.greater_equal(hours.slice(1), hours.slice(0, len(hours) - 1))).as_py()
