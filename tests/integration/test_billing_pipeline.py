"""Billing through the real pipeline: panes, a mapping change mid-month, a hand-computed bill, idempotence.

One stream (two sources, every 5-minute pane from 2026-10-30 08:00 to 2026-11-01 00:00 UTC: 480
panes) is ingested in two batches with a close after each. Between them the operator adds a
mapping version effective 2026-10-31 12:00 — after the hour 12:00 was frozen, so that hour keeps the
old version and the change takes effect for the panes still open (13:00 on). October's bill is
computed by hand below and checked in the CLI's output and in the ``bills`` table.
"""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from tests.support.accounts import V1, V2
from tests.support.harness import Harness, feed_line, tick_line
from traffic.app import cli
from traffic.storage import state as st
from traffic.core.accounts import load_accounts
from traffic.accounting.bills import account_totals, compute_period, final_panes, store_bills
from traffic.core.billing import BillingCycle
from traffic.core.periods import hour_floor
from traffic.accounting.close import CheckFailed
from traffic.quality.acceptance import accept

UTC = timezone.utc
PANE = timedelta(minutes=5)
START = datetime(2026, 10, 30, 8, tzinfo=UTC)
PANES = 480  # 40 hours: START → 2026-11-01 00:00
SPLIT = 360  # the first batch ends at 2026-10-31 14:00
CHANGE = datetime(2026, 10, 31, 12, tzinfo=UTC)
NOW = "2026-12-01T00:00:00+00:00"

def _records(first: int, last: int) -> tuple[list[dict], list[dict]]:
    """(JSON-lines records of source ``flows``, router-feed records of source ``feed``) of panes [first, last)."""
    flows, feed = [], []
    for i in range(first, last):
        t = START + PANE * i
        flows += [
            {"ts": t + timedelta(minutes=1), "local_ip": "10.0.0.5", "remote_ip": "192.0.2.1", "bytes": 1000 + i,
             "direction": "in"},
            {"ts": t + timedelta(minutes=2), "local_ip": "10.0.0.5", "remote_ip": "192.0.2.1", "bytes": 500,
             "direction": "out"},
            {"ts": t + timedelta(minutes=3), "local_ip": "10.0.1.200", "remote_ip": "192.0.2.2", "bytes": 7,
             "direction": "in"},
            {"ts": t + timedelta(minutes=4), "local_ip": "10.9.9.9", "remote_ip": "192.0.2.3", "bytes": 3,
             "direction": None},
        ]
        feed.append({"ts": t + timedelta(seconds=30), "local_ip": "10.0.0.5", "remote_ip": "192.0.2.9", "bytes": 100,
                     "direction": None})
    return flows, feed


def _jsonl(records: list[dict]) -> str:
    lines = []
    for r in records:
        doc = {"ts": r["ts"].isoformat(), "local_ip": r["local_ip"], "remote_ip": r["remote_ip"],
               "local_port": 40000, "remote_port": 443, "protocol": 6, "bytes": r["bytes"]}
        if r["direction"]:
            doc["direction"] = r["direction"]
        lines.append(json.dumps(doc))
    return "\n".join(lines) + "\n"


def _feed(records: list[dict], ticks=()) -> str:
    lines = [feed_line(r["ts"], r["local_ip"], r["remote_ip"], 40000, 443, r["bytes"]) for r in records]
    return "\n".join(lines + [tick_line(t) for t in ticks]) + "\n"


def _owner(ip: str, pane: datetime, changed: bool) -> tuple[str, str]:
    """(account, version name) by hand: v2 applies from 13:00 (hour 12:00 was frozen before the change)."""
    v2 = changed and pane >= CHANGE + timedelta(hours=1)
    if ip.startswith("10.0.0."):
        return "acme", "v2" if v2 else "v1"
    if ip == "10.0.1.200":
        return ("acme" if v2 else "globex"), "v2" if v2 else "v1"
    return "unassigned", "v2" if v2 else "v1"


def _brute_force(records: list[tuple[str, dict]]) -> dict[tuple, list]:
    """Panes from raw detail by hand: (pane, source, account, direction, version name) → [bytes, packets]."""
    panes: dict[tuple, list] = defaultdict(lambda: [0, 0])
    for source, r in records:
        pane = START + PANE * ((r["ts"] - START) // PANE)
        account, version = _owner(r["local_ip"], pane, changed=True)
        entry = panes[(pane, source, account, r["direction"], version)]
        entry[0] += r["bytes"]
        entry[1] += 1
    return dict(panes)


def _bill(harness: Harness, *args: str) -> int:
    return cli.main(["bill", "--warehouse", str(harness.settings.warehouse), "--inbox", str(harness.settings.inbox),
                     "--set", f"now={NOW}", "--set", f"accounts_file={harness.root / 'accounts.toml'}", *args])


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("billing")
    accounts = root / "accounts.toml"
    accounts.write_text(V1)
    harness = Harness(root, spark, accounts_file=accounts, keep_hours=1000)
    flows, feed = _records(0, SPLIT)
    harness.deliver("flows", _jsonl(flows), "a.jsonl")
    harness.deliver("feed", _feed(feed))
    harness.ingest()
    harness.close()
    after_first = {"watermark": harness.watermark, "panes": harness.table("panes")}
    accounts.write_text(V1 + V2)  # the operator's change, effective 12:00 — an hour already frozen
    flows2, feed2 = _records(SPLIT, PANES)
    nov = {"ts": datetime(2026, 11, 1, 0, 10, tzinfo=UTC), "local_ip": "10.0.0.5", "remote_ip": "192.0.2.1",
           "bytes": 50, "direction": "in"}
    late = {"ts": START + timedelta(hours=1, minutes=7), "local_ip": "10.0.0.5", "remote_ip": "192.0.2.1",
            "bytes": 60_000, "direction": "in"}
    tick = json.dumps({"ts": datetime(2026, 11, 1, 1, tzinfo=UTC).isoformat()}) + "\n"
    harness.deliver("flows", _jsonl(flows2 + [nov, late]) + tick, "b.jsonl")
    harness.deliver("feed", _feed(feed2, ticks=[datetime(2026, 11, 1, 1, tzinfo=UTC)]))
    harness.ingest()
    harness.close()
    on_time = [("flows", r) for r in flows + flows2 + [nov]] + [("feed", r) for r in feed + feed2]
    return harness, after_first, on_time


def test_open_panes_after_the_first_batch_equal_brute_force_and_are_refreshed_not_final(run):
    harness, after_first, on_time = run
    frozen_end = hour_floor(after_first["watermark"])
    first = [(s, r) for s, r in on_time if r["ts"] < START + PANE * SPLIT]
    # Before the change every pane was attributed by v1 (the change had not been written yet).
    expected = {}
    for source, r in first:
        pane = START + PANE * ((r["ts"] - START) // PANE)
        account, _ = _owner(r["local_ip"], pane, changed=False)
        entry = expected.setdefault((pane, source, account, r["direction"]), [0, 0])
        entry[0] += r["bytes"]
        entry[1] += 1
    got = {(p["pane_start"], p["source"], p["account"], p["direction"]): [p["bytes"], p["packets"]]
           for p in after_first["panes"]}
    assert got == expected
    status = {p["pane_start"]: p["status"] for p in after_first["panes"]}
    assert {s for t, s in status.items() if t < frozen_end} == {"final"}
    assert {s for t, s in status.items() if t >= frozen_end} == {"open"}
    assert frozen_end == datetime(2026, 10, 31, 13, tzinfo=UTC)  # hour 12:00 frozen before the change


def test_final_panes_equal_brute_force_from_raw_detail_with_the_mapping_in_force(run):
    harness, _, on_time = run
    names = {v.name: v.id for v in load_accounts(harness.root / "accounts.toml").versions}
    expected = {(pane, source, account, direction, names[version]): value
                for (pane, source, account, direction, version), value in _brute_force(on_time).items()}
    panes = harness.table("panes")
    got = {(p["pane_start"], p["source"], p["account"], p["direction"], p["mapping_version"]): [p["bytes"], p["packets"]]
           for p in panes}
    assert got == expected
    assert {p["status"] for p in panes} == {"final"}
    # The late packet (60,000 bytes for a frozen hour) is in late_packets and in no pane.
    assert [r["bytes"] for r in harness.table("late_packets")] == [60_000]


def test_a_mapping_change_mid_month_attributes_before_and_after_to_different_accounts(run):
    harness, _, _ = run
    versions = {v.name: v.id for v in load_accounts(harness.root / "accounts.toml").versions}
    switch = CHANGE + timedelta(hours=1)  # the first pane still open when v2 was written
    panes = harness.table("panes")
    # 10.0.1.200 (7 bytes in, every pane) is globex's before the switch and acme's after it.
    globex = sorted(p["pane_start"] for p in panes if p["account"] == "globex")
    assert globex == [START + PANE * i for i in range(348)] and globex[-1] < switch
    acme_in = {p["pane_start"]: p["bytes"] for p in panes
               if p["account"] == "acme" and p["source"] == "flows" and p["direction"] == "in"}
    assert acme_in == {START + PANE * i: 1000 + i + (7 if i >= 348 else 0) for i in range(PANES)} | \
        {datetime(2026, 11, 1, 0, 10, tzinfo=UTC): 50}
    # Hour 12:00 was frozen under v1 before v2 (effective 12:00) was written: it keeps v1.
    by_version = defaultdict(set)
    for p in panes:
        by_version[p["mapping_version"]].add(p["pane_start"])
    assert set(by_version) == {versions["v1"], versions["v2"]}
    assert max(by_version[versions["v1"]]) == switch - PANE
    assert min(by_version[versions["v2"]]) == switch


def test_panes_sum_to_hourly_daily_and_monthly_to_the_byte(run):
    harness, _, _ = run
    hourly, panes = defaultdict(lambda: [0, 0]), defaultdict(lambda: [0, 0])
    for r in harness.table("hourly"):
        hourly[r["hour"]][0] += r["bytes"]
        hourly[r["hour"]][1] += r["packets"]
    for p in harness.table("panes"):
        assert hour_floor(p["pane_start"]) == p["hour"]
        panes[p["hour"]][0] += p["bytes"]
        panes[p["hour"]][1] += p["packets"]
    assert dict(panes) == dict(hourly)
    october = sum(r["bytes"] for r in harness.table("monthly") if r["month"].month == 10)
    assert october == sum(p["bytes"] for p in harness.table("panes") if p["pane_start"].month == 10)
    oct31 = sum(r["bytes"] for r in harness.table("daily") if r["day"].day == 31)
    assert oct31 == sum(p["bytes"] for p in harness.table("panes") if p["pane_start"].day == 31)


def test_account_totals_per_day_and_month_reconcile_with_daily_and_monthly(run, capsys):
    harness, _, _ = run
    warehouse = harness.warehouse()
    for grain, table, column in (("day", "daily", "day"), ("month", "monthly", "month")):
        totals = account_totals(warehouse, grain).to_pylist()
        by_period = defaultdict(lambda: [0, 0])
        for r in totals:
            by_period[r[grain]][0] += r["bytes"]
            by_period[r[grain]][1] += r["packets"]
        expected = defaultdict(lambda: [0, 0])
        for r in harness.table(table):
            expected[r[column]][0] += r["bytes"]
            expected[r[column]][1] += r["packets"]
        assert dict(by_period) == dict(expected) and by_period, grain
    october = {(r["account"], r["direction"]): r["bytes"] for r in account_totals(warehouse, "month").to_pylist()}
    assert october[("acme", "in")] == ACME["bytes_in"] and october[("acme", None)] == ACME["bytes_unknown"]
    assert october[("globex", "in")] == GLOBEX["bytes_in"]
    assert cli.main(["show", "account-monthly", "--warehouse", str(harness.settings.warehouse)]) == 0
    assert f"{ACME['bytes_in']}" in capsys.readouterr().out.replace(",", "")


# October, by hand. N = 31 · 288 = 8,928 panes; rank = ceil(0.95 · 8,928) = 8,482; 8,448 panes carry no
# traffic, so the percentile is the 34th smallest of the 480 panes that do.
# acme inbound per pane i: 1,000 + i (known) + 100 (router feed, unknown → in) + 7 from 13:00 on (i ≥ 348):
# increasing in i, so the 34th smallest is pane 33: 1,133 bytes. Outbound: 500 every pane.
ACME = {"bytes_in": 480 * 1000 + 479 * 480 // 2 + 7 * (480 - 348), "bytes_out": 500 * 480, "bytes_unknown": 100 * 480,
        "p95_in_pane_bytes": 1133, "p95_out_pane_bytes": 500, "billable_pane_bytes": 1133, "p95_rank": 8482,
        "panes": 8928}
# globex: 7 bytes in 348 panes (< 446 non-zero panes): its percentile is 0.
GLOBEX = {"bytes_in": 7 * 348, "bytes_out": 0, "bytes_unknown": 0, "p95_in_pane_bytes": 0, "billable_pane_bytes": 0}
# unassigned: 3 unknown bytes in all 480 panes: the 34th smallest non-zero pane is 3.
UNASSIGNED = {"bytes_in": 0, "bytes_unknown": 3 * 480, "p95_in_pane_bytes": 3, "billable_pane_bytes": 3}


def test_octobers_bill_by_hand_through_traffic_bill_and_the_bills_table(run, capsys):
    harness, _, _ = run
    assert _bill(harness, "--period", "2026-10", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["final"] and doc["stored"]
    bills = {b["account"]: b for b in doc["bills"]}
    assert set(bills) == {"acme", "globex", "unassigned"}
    for account, expected in (("acme", ACME), ("globex", GLOBEX), ("unassigned", UNASSIGNED)):
        assert {k: bills[account][k] for k in expected} == expected, account
    assert bills["acme"]["bytes_total"] == ACME["bytes_in"] + ACME["bytes_out"] + ACME["bytes_unknown"]
    assert bills["acme"]["billable_bps"] == 1133 * 8 / 300
    versions = {v.name: v.id for v in load_accounts(harness.root / "accounts.toml").versions}
    assert bills["acme"]["mapping_versions"] == [versions["v1"], versions["v2"]]
    assert bills["acme"]["billing_rule"] == "max" and bills["acme"]["billing_timezone"] == "UTC"

    stored = {r["account"]: r for r in harness.table("bills")}
    assert set(stored) == set(bills)
    for account, row in stored.items():
        assert row["period"] == "2026-10"
        assert {k: row[k] for k in ACME if k in row} == {k: bills[account][k] for k in ACME}
    # Σ of the bills = Σ of October's final panes.
    period = BillingCycle().period_for("2026-10")
    assert sum(r["bytes_total"] for r in stored.values()) == \
        sum(final_panes(harness.warehouse(), period).column("bytes").to_pylist())

    assert _bill(harness, "--period", "2026-10", "--account", "acme") == 0
    text = capsys.readouterr().out
    assert "final, stored" in text and "8,928 panes" in text
    line = next(row for row in text.splitlines() if row.startswith("acme"))
    assert line.split() == ["acme", f"{ACME['bytes_in']:,}", f"{ACME['bytes_out']:,}",
                            f"{ACME['bytes_in'] + ACME['bytes_out'] + ACME['bytes_unknown']:,}",
                            f"{1133 * 8 / 300:,.3f}", f"{500 * 8 / 300:,.3f}", f"{1133 * 8 / 300:,.3f}", "-", "-"]


def test_an_open_period_is_provisional_and_not_stored(run, capsys):
    harness, _, _ = run
    assert _bill(harness, "--period", "2026-11", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert not doc["final"] and not doc["stored"]
    assert {b["account"]: b["bytes_in"] for b in doc["bills"]}["acme"] == 50
    assert {r["period"] for r in harness.table("bills")} == {"2026-10"}
    assert _bill(harness, "--period", "2026-11") == 0
    assert "provisional: 1 of 720 hour(s) final; not stored" in capsys.readouterr().out


def _bills_check(warehouse):
    """What the close hands ``store_bills``: the check of the ``bills`` suite."""
    from traffic.quality.suites import Validation

    return lambda periods: Validation(warehouse, "bills", list(periods))


def test_rerunning_gives_the_same_bills(run):
    harness, _, _ = run
    before = harness.table("bills")
    harness.close()  # nothing left to close: stored bills are not recomputed
    assert harness.table("bills") == before
    warehouse = harness.warehouse()
    stored, failures, _ = store_bills(warehouse, [BillingCycle().period_for("2026-10")], _bills_check(warehouse))
    assert (stored, failures) == (["2026-10"], [])
    assert sorted(harness.table("bills"), key=lambda r: r["account"]) == \
        sorted(before, key=lambda r: r["account"])
    assert compute_period(warehouse, "2026-10").final


def test_an_unknown_account_is_a_clear_error(run, capsys):
    harness, _, _ = run
    assert _bill(harness, "--period", "2026-10", "--account", "initech") == 2
    assert "account 'initech' has no final traffic in period 2026-10" in capsys.readouterr().err


def test_a_failed_hour_holds_its_period_back_until_it_is_accepted(run, spark, tmp_path, capsys):
    harness, _, _ = run
    shutil.copytree(harness.root, tmp_path / "copy")
    copy = Harness(tmp_path / "copy", spark, accounts_file=tmp_path / "copy" / "accounts.toml", keep_hours=1000)
    warehouse = copy.warehouse()
    hour = datetime(2026, 10, 31, 10, tzinfo=UTC)
    row = next(r for r in st.read_ledger(warehouse, "hour") if r["period_start"] == hour)
    st.write_ledger_rows(warehouse, [{**row, "dq_status": "failed", "dq_note": "test: corrupt"}])
    warehouse.table("bills").delete_keys(["2026-10"])
    period = BillingCycle().period_for("2026-10")
    assert store_bills(warehouse, [period], _bills_check(warehouse)) == ([], [], None)
    assert _bill(copy, "--period", "2026-10") == 0
    assert "provisional: 39 of 40 hour(s) final; not stored" in capsys.readouterr().out
    accept(copy.settings, "2026-10-31T10:00Z", "checked by hand", "tester")
    result = copy.close()
    assert result.bills_stored == ["2026-10"]
    assert sorted((r["account"], r["bytes_total"]) for r in copy.table("bills")) == \
        sorted((r["account"], r["bytes_total"]) for r in harness.table("bills"))


def test_bills_that_fail_their_checks_are_not_stored_and_the_close_fails(run, spark, tmp_path):
    harness, _, _ = run
    shutil.copytree(harness.root, tmp_path / "copy")
    copy = Harness(tmp_path / "copy", spark, accounts_file=tmp_path / "copy" / "accounts.toml", keep_hours=1000)
    warehouse = copy.warehouse()
    # Damage one final pane on disk: its account is lost, so a bill without an account would be made.
    key = "2026-10-30T09"
    panes = warehouse.table("panes")
    rows = st.rows(panes.read_arrow(keys=[key]))
    rows[0]["account"] = None
    panes.replace(pa.Table.from_pylist(rows, schema=panes.arrow_schema), keys=[key])
    warehouse.table("bills").delete_keys(["2026-10"])
    with pytest.raises(CheckFailed, match="bills 2026-10: .*account present"):
        copy.close()
    assert copy.table("bills") == []
    failed = {r["expectation"] for r in copy.table("dq_results") if r["grain"] == "bill" and not r["success"]}
    assert "expect_column_values_to_not_be_null(account present)" in failed
