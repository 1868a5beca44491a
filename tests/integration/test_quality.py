"""Data quality: corrupt each Delta table the way real trouble would, run the real job, see it caught.

One stream (two sources, a packet and a tick every five minutes each, 2026-10-31 21:00 → 2026-11-01
02:00) is ingested once; the warehouse is copied at three points — ingested, hours frozen, days
rolled up — and each copy is damaged on disk through the Delta layer: a negative byte count in
``packets``, a duplicated key and an ``open`` row in frozen ``hourly`` hours, a daily total off by
one byte, a source's panes missing. Each time the real close runs (in-process, shared Spark
session) and the test asserts the exit code, the failed expectation in ``dq_results``, the
period's ``dq_status`` and that nothing was published over it. Accepting a failed period lets
the roll-up proceed.
"""

from __future__ import annotations

import shutil
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from tests.support.harness import Harness, feed_line, tick_line
from traffic.app import cli
from traffic.storage import state as st
from traffic.accounting.close import CheckFailed
from traffic.app.runs import close
from traffic.storage.warehouse import Warehouse

UTC = timezone.utc
START = datetime(2026, 10, 31, 21, tzinfo=UTC)
END = datetime(2026, 11, 1, 2, tzinfo=UTC)
H22, H23 = datetime(2026, 10, 31, 22, tzinfo=UTC), datetime(2026, 10, 31, 23, tzinfo=UTC)
OCT31, OCTOBER = datetime(2026, 10, 31, tzinfo=UTC), datetime(2026, 10, 1, tzinfo=UTC)
NOW = "2026-12-01T00:00:00+00:00"


def _stream(source: str, local: str) -> str:
    lines, t = [], START
    while t < END:
        lines.append(feed_line(t + timedelta(minutes=1), local, "192.0.2.7", 40000, 443, 100 + t.minute))
        lines.append(tick_line(t + timedelta(minutes=4)))
        t += timedelta(minutes=5)
    lines.append(tick_line(END))
    return "\n".join(lines) + "\n"


def _quiet(*_args, **_kwargs):
    return None


@pytest.fixture(scope="module")
def stages(spark, tmp_path_factory):
    """Warehouse copies: ``ingested`` (nothing closed), ``frozen`` (hours only), ``rolled`` (hours and days)."""
    base = tmp_path_factory.mktemp("stages")
    harness = Harness(base / "run", spark)
    harness.deliver("r1", _stream("r1", "10.0.0.1"))
    harness.deliver("r2", _stream("r2", "2001:db8::1"))
    harness.ingest()
    shutil.copytree(harness.root, base / "ingested")
    close(harness.settings, lambda: spark, None, _quiet, only=("freeze",))
    shutil.copytree(harness.root, base / "frozen")
    close(harness.settings, lambda: spark, None, _quiet, only=("days",))
    shutil.copytree(harness.root, base / "rolled")
    return base


def _copy(stages: Path, stage: str, dest: Path, spark, **overrides) -> Harness:
    shutil.copytree(stages / stage, dest)
    return Harness(dest, spark, **overrides)


def _run_close(harness: Harness, spark, *extra: str) -> int:
    """``traffic close`` through the real CLI entry point, in this process's Spark session."""
    return cli.main(["close", "--warehouse", str(harness.settings.warehouse), "--inbox", str(harness.settings.inbox),
                     "--set", f"now={NOW}", *extra], spark=spark)


def _ledger(harness: Harness) -> dict:
    return {(r["grain"], r["period_start"]): r for r in harness.table("periods")}


def _failed_results(harness: Harness, suite: str) -> list[dict]:
    return [r for r in harness.table("dq_results") if r["suite"] == suite and not r["success"]]


def _nothing_published_over(harness: Harness, day: datetime) -> None:
    ledger = _ledger(harness)
    assert ("day", day) not in ledger, "a day was rolled up over a failed period"
    assert ("month", day.replace(day=1)) not in ledger, "a month was rolled up over a failed period"
    assert [r for r in harness.table("daily") if r["day"] == day.date()] == []
    assert [r for r in harness.table("monthly") if r["month"] == day.date().replace(day=1)] == []


def test_clean_stream_passes_every_check(stages, spark, tmp_path):
    harness = _copy(stages, "rolled", tmp_path / "w", spark)
    assert _run_close(harness, spark) == 0
    ledger = _ledger(harness)
    assert {r["dq_status"] for r in ledger.values()} == {"passed"}, ledger
    assert ledger[("month", OCTOBER)]["bytes"] == sum(r["bytes"] for r in harness.table("monthly"))
    results = harness.table("dq_results")
    assert results and all(r["success"] for r in results)
    suites = {r["suite"] for r in results}
    assert {"packets", "hourly", "daily", "monthly", "periods"} <= suites
    # One validation run per suite and step covers all its periods (5 hours frozen in one run).
    freeze_runs = {r["run_id"] for r in results if r["suite"] == "packets"}
    assert len(freeze_runs) == 1 and len({r["period_start"] for r in results if r["suite"] == "packets"}) == 5
    docs = harness.settings.warehouse / "_reports" / "data_docs"
    assert (docs / "index.html").exists() and list((docs / "validations").glob("*/*/*/*.html"))


def _with_a_negative_packet(stages: Path, spark, tmp_path: Path) -> Harness:
    """The ingested warehouse with one raw packet of -40 bytes in 22:00, which no micro-batch saw."""
    harness = _copy(stages, "ingested", tmp_path / "w", spark)
    Warehouse(harness.settings).table("packets").append(pa.Table.from_pylist([{
        "ts": H22 + timedelta(minutes=33), "source": "r1", "local_ip": "10.0.0.9", "remote_ip": "192.0.2.9",
        "local_port": 1, "remote_port": 2, "protocol": 6, "bytes": -40, "hour": H22, "batch_id": 1,
        "input_file": "part-00001.csv"}]))
    return harness


def test_negative_byte_count_in_packets_fails_the_hour_and_blocks_the_day(stages, spark, tmp_path):
    harness = _with_a_negative_packet(stages, spark, tmp_path)
    with pytest.raises(CheckFailed) as caught:
        close(harness.settings, lambda: spark, None, _quiet)
    message = str(caught.value)
    assert "hour 2026-10-31T22:00Z: expect_column_values_to_be_between(bytes ≥ 0) failed: 1 row, min -40" in message
    failed = [r for r in _failed_results(harness, "packets") if r["period_start"] == H22]
    assert [(r["expectation"], r["observed"], r["critical"], r["table"]) for r in failed] == [
        ("expect_column_values_to_be_between(bytes ≥ 0)", "1 row, min -40", True, "packets")]
    # The built-in check (open rows = recomputed totals) fails too: the micro-batches never saw that row.
    assert any(r["expectation"].endswith("(open rows = totals recomputed from packets)")
               for r in _failed_results(harness, "periods") if r["period_start"] == H22)
    ledger = _ledger(harness)
    assert ledger[("hour", H22)]["dq_status"] == "failed"
    assert "bytes ≥ 0" in ledger[("hour", H22)]["dq_note"]
    assert ledger[("hour", H23)]["dq_status"] == "passed"  # later hours still freeze and pass
    _nothing_published_over(harness, OCT31)


def test_non_canonical_address_in_packets_fails_the_hour_through_its_final_rows(stages, spark, tmp_path):
    """The packets suite leaves address form to the hourly suite (the final rows' addresses are exactly the
    distinct addresses of the hour's packets): a raw row with a leading-zero address still fails its hour."""
    harness = _copy(stages, "ingested", tmp_path / "w", spark)
    Warehouse(harness.settings).table("packets").append(pa.Table.from_pylist([{
        "ts": H22 + timedelta(minutes=33), "source": "r1", "local_ip": "10.0.0.09", "remote_ip": "192.0.2.9",
        "local_port": 1, "remote_port": 2, "protocol": 6, "bytes": 40, "direction": "out", "hour": H22, "batch_id": 1,
        "input_file": "part-00001.csv"}]))
    with pytest.raises(CheckFailed) as caught:
        close(harness.settings, lambda: spark, None, _quiet)
    assert "hour 2026-10-31T22:00Z: expect_column_values_to_match_regex(local_ip is canonical IPv4/IPv6 text) " \
           "failed" in str(caught.value)
    failed = [r for r in _failed_results(harness, "hourly") if r["period_start"] == H22]
    assert [(r["expectation"], r["critical"], r["table"]) for r in failed] == [
        ("expect_column_values_to_match_regex(local_ip is canonical IPv4/IPv6 text)", True, "hourly")]
    assert "10.0.0.09" in failed[0]["observed"]
    assert _failed_results(harness, "packets") == []  # every row rule of the raw detail itself holds
    ledger = _ledger(harness)
    assert ledger[("hour", H22)]["dq_status"] == "failed"
    assert ledger[("hour", H23)]["dq_status"] == "passed"
    _nothing_published_over(harness, OCT31)


def test_duplicated_key_in_a_frozen_hour_is_caught_when_its_day_rolls_up(stages, spark, tmp_path):
    harness = _copy(stages, "frozen", tmp_path / "w", spark)
    table = Warehouse(harness.settings).table("hourly")
    row = st.rows(table.read_arrow(keys=["2026-10-31T22"]))[0]
    table.append(pa.Table.from_pylist([row]))  # the same final row committed twice
    assert _run_close(harness, spark) == 3
    ledger = _ledger(harness)
    assert ledger[("hour", H22)]["dq_status"] == "failed"
    assert ledger[("hour", H22)]["dq_note"].startswith("re-check: ")
    hourly = [r for r in _failed_results(harness, "hourly") if r["period_start"] == H22]
    assert [r["expectation"] for r in hourly] == ["expect_compound_columns_to_be_unique((hour, local_ip, remote_ip) unique)"]
    assert hourly[0]["observed"].startswith("2 rows share a key: (2026-10-31T22:00:00, ")
    ledger_check = [r for r in _failed_results(harness, "periods") if r["period_start"] == H22]
    assert any("ledger bytes = Σ bytes of the period's rows" in r["expectation"] for r in ledger_check)
    _nothing_published_over(harness, OCT31)


def test_open_row_in_a_frozen_hour_fails_it_and_accepting_lets_the_roll_up_proceed(stages, spark, tmp_path):
    harness = _copy(stages, "frozen", tmp_path / "w", spark)
    Warehouse(harness.settings).table("hourly").append(pa.Table.from_pylist([{
        "hour": H23, "day": date(2026, 10, 31), "local_ip": "10.0.0.5", "remote_ip": "192.0.2.5", "bytes": 10,
        "packets": 1, "bytes_in": 0, "bytes_out": 0, "status": "open"}]))
    assert _run_close(harness, spark) == 3
    assert _ledger(harness)[("hour", H23)]["dq_status"] == "failed"
    status = [r for r in _failed_results(harness, "hourly") if r["period_start"] == H23]
    assert [(r["expectation"], r["observed"]) for r in status] == [
        ("expect_column_values_to_be_in_set(a frozen hour's rows are all final)", "1 row: 'open'")]
    _nothing_published_over(harness, OCT31)

    # Accepting anything but a failed period is refused; accepting the failed hour is audited.
    warehouse = ["--warehouse", str(harness.settings.warehouse)]
    assert cli.main(["accept", "--period", "2026-10-31T21:00Z", "--reason", "x", *warehouse], spark=spark) == 2
    assert cli.main(["accept", "--period", "2026-10-31T23:00Z", "--reason", "stray row from a test writer, "
                     "not in any total", "--by", "noc-oncall", *warehouse], spark=spark) == 0
    hour = _ledger(harness)[("hour", H23)]
    assert (hour["dq_status"], hour["accepted_by"]) == ("accepted", "noc-oncall")
    assert hour["accepted_reason"].startswith("stray row") and hour["accepted_at"] is not None
    assert hour["dq_note"].startswith("re-check: ")  # why it failed is kept
    assert any(r["suite"] == "operator" and r["period_start"] == H23 for r in harness.table("dq_results"))

    assert _run_close(harness, spark) == 0
    ledger = _ledger(harness)
    assert ledger[("day", OCT31)]["dq_status"] == "passed"
    assert ledger[("month", OCTOBER)]["dq_status"] == "passed"
    assert ledger[("day", OCT31)]["bytes"] == sum(r["bytes"] for r in harness.table("daily") if r["day"] == OCT31.date())
    assert ledger[("hour", H23)]["dq_status"] == "accepted"  # the re-check failure is recorded, not re-failed


def test_daily_total_off_by_one_byte_fails_the_day_and_blocks_the_month(stages, spark, tmp_path):
    harness = _copy(stages, "rolled", tmp_path / "w", spark)
    table = Warehouse(harness.settings).table("daily")
    rows = st.rows(table.read_arrow(keys=["2026-10-31"]))
    rows[0] = {**rows[0], "bytes": rows[0]["bytes"] + 1}
    table.replace(pa.Table.from_pylist(rows), keys=["2026-10-31"])
    assert _run_close(harness, spark) == 3
    ledger = _ledger(harness)
    assert ledger[("day", OCT31)]["dq_status"] == "failed"
    day_checks = [r for r in _failed_results(harness, "periods") if r["period_start"] == OCT31]
    expected_bytes = ledger[("day", OCT31)]["bytes"]
    assert [(r["expectation"], r["observed"]) for r in day_checks] == [
        ("expect_column_pair_values_to_be_equal(ledger bytes = Σ bytes of the period's rows)",
         f"1 row: bytes {expected_bytes} ≠ table_bytes {expected_bytes + 1}")]
    assert ("month", OCTOBER) not in ledger
    assert harness.table("monthly") == []


def test_missing_source_is_a_warning_by_default_and_a_failure_when_configured(stages, spark, tmp_path):
    def damaged(name: str, **overrides) -> Harness:
        harness = _copy(stages, "ingested", tmp_path / name, spark, **overrides)
        Warehouse(harness.settings).table("source_panes").delete_where(
            [("source", "=", "r2"), ("pane_start", ">=", H22), ("pane_start", "<", H23)])
        return harness

    warned = damaged("warning")
    result = close(warned.settings, lambda: spark, None, _quiet)
    ledger = _ledger(warned)
    assert (ledger[("hour", H22)]["sources_reporting"], ledger[("hour", H22)]["panes_active"]) == (1, 0)
    assert ledger[("hour", H22)]["dq_status"] == "warning"
    assert ledger[("day", OCT31)]["dq_status"] == "passed"  # a warning is published: the roll-up went on
    assert any("hour 2026-10-31T22:00Z" in w for w in result.warnings)
    completeness = {r["expectation"]: r for r in _failed_results(warned, "periods") if r["period_start"] == H22}
    panes = completeness["expect_column_values_to_be_between(panes with every expected source ≥ completeness_min_panes)"]
    assert (panes["observed"], panes["critical"]) == ("1 row, min 0", False)
    assert not completeness["expect_column_pair_values_a_to_be_greater_than_b(sources_reporting ≥ sources_expected)"][
        "critical"]

    strict = damaged("failure")
    assert _run_close(strict, spark, "--set", "completeness_action=failure") == 3
    assert _ledger(strict)[("hour", H22)]["dq_status"] == "failed"
    _nothing_published_over(strict, OCT31)


def test_an_oversized_ipv4_packet_is_found_by_the_one_pass_with_its_value(stages, spark, tmp_path):
    """The one pass (DESIGN §6a) names the rule, the row count and the value, as GX's own engine did."""
    harness = _copy(stages, "ingested", tmp_path / "w", spark)
    Warehouse(harness.settings).table("packets").append(pa.Table.from_pylist([{
        "ts": H22 + timedelta(minutes=33), "source": "r1", "local_ip": "10.0.0.1", "remote_ip": "192.0.2.7",
        "local_port": 40000, "remote_port": 443, "protocol": 6, "bytes": 70000, "hour": H22, "batch_id": 1}]))
    with pytest.raises(CheckFailed):
        close(harness.settings, lambda: spark, None, _quiet, only=("freeze",))
    packets = {r["expectation"]: r for r in _failed_results(harness, "packets") if r["period_start"] == H22}
    assert packets["expect_column_values_to_be_between(IPv4 bytes per packet ≤ 65,535 (IPv4 total length))"]["observed"] == \
        "1 row, min 70000"
    assert not packets["expect_column_values_to_be_between(IPv4 bytes per packet ≤ 65,535 (IPv4 total length))"]["critical"]
    # Critical here: the micro-batches' open rows never saw the packet, so the hour fails.
    assert _ledger(harness)[("hour", H22)]["dq_status"] == "failed"


def test_rows_differing_counts_the_multiset_difference_both_ways(spark):
    """The freeze's built-in check: per hour, rows of either side without an equal row on the other."""
    from traffic.accounting.close import spark_rows_differing
    from traffic.accounting.freeze_tasks import rows_differing

    schema = "hour timestamp, local_ip string, remote_ip string, bytes long, packets long, bytes_in long, bytes_out long"
    h1, h2, h3 = (datetime(2026, 10, 31, h, tzinfo=UTC) for h in (20, 21, 22))
    same = (h1, "10.0.0.1", "192.0.2.1", 100, 1, 100, 0)
    final = spark.createDataFrame([same, (h2, "10.0.0.1", "192.0.2.1", 70, 1, 0, 70),
                                   (h2, "10.0.0.2", "192.0.2.1", 5, 1, 0, 0), (h3, "10.0.0.3", None, 9, 1, 0, 0)],
                                  schema)
    open_rows = spark.createDataFrame([same, (h2, "10.0.0.1", "192.0.2.1", 60, 1, 0, 60),  # other amounts: 2
                                       (h3, "10.0.0.3", None, 9, 1, 0, 0),  # a null key matches itself
                                       (h3, "10.0.0.4", "192.0.2.4", 1, 1, 1, 0)], schema)  # open side only: 1
    # h2: one pair differs (2) and one is on the final side only (1); h1 equal; h3 one extra open row.
    assert spark_rows_differing(final, open_rows) == {h2: 3, h3: 1}
    # The Arrow twin the delta-rs freeze tasks use counts the same.
    arrow = rows_differing(final.toArrow(), open_rows.toArrow())
    assert dict(zip(arrow.column("hour").to_pylist(), arrow.column("n").to_pylist())) == {h2: 3, h3: 1}
    expected = {}
    cols = ["hour", "local_ip", "remote_ip", "bytes", "packets", "bytes_in", "bytes_out"]
    for row in final.select(*cols).exceptAll(open_rows.select(*cols)).union(
            open_rows.select(*cols).exceptAll(final.select(*cols))).collect():
        expected[row["hour"].replace(tzinfo=UTC)] = expected.get(row["hour"].replace(tzinfo=UTC), 0) + 1
    assert expected == {h2: 3, h3: 1}


def test_freeze_recomputes_the_same_with_arrow_tasks_as_with_spark(spark, tmp_path):
    """The delta-rs freeze recomputes hours in Arrow tasks; it must give what Spark's recompute gives.

    Two batches leave two raw files per hour, shared out over more tasks than hours; an open row is
    tampered with so both sides also find the same differing rows.
    """
    import pyarrow.parquet as pq

    from traffic.accounting.close import recompute_arrow, recompute_spark
    from traffic.storage.staging import Staged
    from traffic.storage.keys import cluster_key

    accounts = tmp_path / "accounts.toml"
    accounts.write_text('[[version]]\nname = "v1"\neffective_from = 2026-10-01\n'
                        '[version.accounts]\nacme = ["10.0.0.2/32"]\n\n'
                        '[[version]]\nname = "v2"\neffective_from = 2026-10-31T22:35:00Z\n'
                        '[version.accounts]\nbeta = ["10.0.0.0/30"]\n')
    harness = Harness(tmp_path / "w", spark, accounts_file=accounts)
    r2 = _stream("r2", "10.0.0.2").splitlines()
    harness.deliver("r2", "\n".join(line for line in r2 if line.count(",") > 2) + "\n")
    harness.ingest()
    harness.deliver("r1", _stream("r1", "10.0.0.1"))
    harness.deliver("r2", "\n".join(line for line in r2 if line.count(",") == 2) + "\n")
    harness.deliver("r3", feed_line(START + timedelta(minutes=7), "10.0.0.9", "198.51.100.1", 1, 2, 60000) + "\n")
    harness.ingest()
    warehouse = Warehouse(harness.settings, spark=spark, engine="rs")
    hourly = warehouse.table("hourly")
    rows = hourly.read_arrow(keys=[cluster_key(H22, "hour")])
    bumped = pa.array([b + 1 if i == 0 else b for i, b in enumerate(rows.column("bytes").to_pylist())], pa.int64())
    hourly.replace(rows.set_column(rows.column_names.index("bytes"), "bytes", bumped), keys=[cluster_key(H22, "hour")])
    hours = [START + timedelta(hours=i) for i in range(5)]
    keys = [cluster_key(h, "hour") for h in hours]
    assert len(warehouse.table("packets").files(keys=keys)) > len(keys)

    listed = warehouse.table("packets").paths_by_period(keys), warehouse.table("hourly").paths_by_period(keys)
    arrow, spark_side = recompute_arrow(warehouse, keys, *listed), recompute_spark(warehouse, keys)
    try:
        def rows_of(frame, columns):
            if isinstance(frame, Staged):  # what the Arrow tasks wrote, not yet committed
                table = pa.concat_tables([pq.read_table(p) for p in sorted(Path(frame.folder).rglob("*.parquet"))])
            else:
                table = frame.toArrow()
            return sorted(tuple(r[c] for c in columns) for r in table.select(columns).to_pylist())

        hourly_columns = ["hour", "local_ip", "remote_ip", "bytes", "packets", "bytes_in", "bytes_out", "day", "status"]
        assert rows_of(arrow.final, hourly_columns) == rows_of(spark_side.final, hourly_columns)
        pane_columns = ["pane_start", "source", "account", "direction", "mapping_version", "hour", "bytes", "packets",
                        "status"]
        assert rows_of(arrow.final_panes, pane_columns) == rows_of(spark_side.final_panes, pane_columns)
        # Both mapping versions are in play, each with its own account: attribution happened in the tasks.
        assert {(account, version.split("@")[0]) for account, version in
                rows_of(arrow.final_panes, ["account", "mapping_version"])} == {
            ("acme", "v1"), ("beta", "v2")}
        raw_rows = warehouse.table("packets").read_arrow(keys=keys).num_rows
        assert arrow.raw == spark_side.raw and sum(n for _, n in arrow.raw.values()) == raw_rows
        assert arrow.differing == spark_side.differing == {H22: 2}
        assert arrow.packets.count() == spark_side.packets.count() == raw_rows
    finally:
        for frame in spark_side.cached:
            frame.unpersist()


def test_data_docs_of_a_failed_hour_show_the_rule_its_observed_value_and_example_rows(stages, spark, tmp_path):
    """DESIGN §6a: the one pass feeds GX, and Data Docs show each expectation, what it saw, and the rows."""
    from tests.support.screenshots import chromium_screenshot

    harness = _with_a_negative_packet(stages, spark, tmp_path)
    with pytest.raises(CheckFailed):
        close(harness.settings, lambda: spark, None, _quiet, only=("freeze",))
    docs = harness.settings.warehouse / "_reports" / "data_docs" / "validations" / "packets"
    pages = sorted(docs.rglob("*.html"))
    assert len(pages) == 1, pages
    text = pages[0].read_text()
    assert "bytes ≥ 0" in text  # the rule, by its label
    assert "1 row, min -40" in text  # what it saw in the failed hour
    assert "2026-10-31T22:00Z" in text and "10.0.0.9" in text  # the period and an example row
    assert text.count("[critical]") + text.count("[warning]") >= len(
        __import__("traffic.quality.suite_documents", fromlist=["x"]).suite_document("packets")["expectations"])
    assert chromium_screenshot(pages[0], "data-docs-failed-hour.png", 1300, 4300)
