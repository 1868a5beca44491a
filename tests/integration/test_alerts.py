"""Alerts through the real pipeline: quota and commit crossings land once, across reruns, backfills and replays.

One stream (acme: 1,000 bytes in per 5-minute pane, globex: 10 bytes in per pane, every pane from
2026-10-30 08:00 to 2026-11-01 00:00 UTC: 480 panes, then ticks into November) is ingested in two
batches with a close after each; acme has ``quota_bytes = 120,000`` and ``commit_bps = 20`` (751 bytes
a pane), globex a quota it never reaches. By hand:

* quota: 12,000 bytes an hour, so the period total reaches 120,000 exactly at the end of the tenth
  hour, 2026-10-30 17:00 (reaching the quota exactly counts);
* commit: October has 8,928 panes, rank ceil(0.95·8,928) = 8,482, burst allowance 446: every acme pane
  is over the commit, so the 447th pane tips it — pane 446 lies in hour 37 (2026-10-31 21:00), at
  whose end 456 panes are over (threshold 447).
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timedelta, timezone

import pytest

from tests.support.accounts import V1
from tests.support.exports import assert_same_rows, read_back
from tests.support.harness import Harness, feed_line, tick_line
from tests.support.mailbox import Mailbox
from traffic.accounting.alerts import alert_id
from traffic.app import cli
from traffic.app.runs import replay
from traffic.core.accounts import load_accounts
from traffic.core.billing import BillingCycle
from traffic.orchestration.notify import notify_pending, read_sent
from traffic.storage import state as st

UTC = timezone.utc
PANE = timedelta(minutes=5)
START = datetime(2026, 10, 30, 8, tzinfo=UTC)
PANES = 480
SPLIT = 300  # the first batch ends at 2026-10-31 09:00: the quota is crossed in it, the commit in the second
NOW = "2026-12-01T00:00:00+00:00"
ACCOUNTS = V1 + """
[version.limits.acme]
quota_bytes = 120_000
commit_bps = 20

[version.limits.globex]
quota_bytes = 5_000_000
"""
QUOTA_HOUR = datetime(2026, 10, 30, 17, tzinfo=UTC)
COMMIT_HOUR = datetime(2026, 10, 31, 21, tzinfo=UTC)
OCTOBER = BillingCycle().period_for("2026-10")


def _feed(first: int, last: int, ticks=()) -> str:
    lines = []
    for i in range(first, last):
        t = START + PANE * i
        lines.append(feed_line(t + timedelta(minutes=1), "10.0.0.5", "192.0.2.1", 40000, 443, 1000))
        lines.append(feed_line(t + timedelta(minutes=2), "10.0.1.5", "192.0.2.1", 40000, 443, 10))
    return "\n".join(lines + [tick_line(t) for t in ticks]) + "\n"


def _harness(root, spark) -> Harness:
    return Harness(root, spark, accounts_file=root / "accounts.toml", keep_hours=1000)


def _key(rows: list[dict], skip=()) -> list[dict]:
    return sorted(({k: v for k, v in r.items() if k not in skip} for r in rows),
                  key=lambda r: (r["period_start"], r["account"], r["kind"]))


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("alerts")
    (root / "accounts.toml").write_text(ACCOUNTS)
    archive = root / "archive" / "feed"
    archive.mkdir(parents=True)
    (archive / "a.csv").write_text(_feed(0, SPLIT))
    (archive / "b.csv").write_text(_feed(SPLIT, PANES, ticks=[datetime(2026, 11, 1, 1, tzinfo=UTC)]))
    harness = _harness(root, spark)
    harness.deliver("feed", (archive / "a.csv").read_text(), "a.csv")
    harness.ingest()
    harness.close()
    after_first = harness.table("alerts")
    harness.deliver("feed", (archive / "b.csv").read_text(), "b.csv")
    harness.ingest()
    harness.close()
    return harness, after_first


def test_quota_and_commit_cross_once_at_the_hours_computed_by_hand(run):
    harness, after_first = run
    version = load_accounts(harness.root / "accounts.toml").versions[0]
    # After the first batch (frozen up to 09:00 on the 31st) only the quota is crossed.
    assert [(r["kind"], r["account"], r["hour"]) for r in after_first] == [("quota", "acme", QUOTA_HOUR)]
    rows = {(r["kind"], r["account"]): r for r in harness.table("alerts")}
    assert set(rows) == {("quota", "acme"), ("commit", "acme")}  # globex never reaches its quota
    quota, commit = rows[("quota", "acme")], rows[("commit", "acme")]
    assert {k: quota[k] for k in ("period", "period_start", "period_end", "hour", "observed", "threshold", "unit",
                                  "quota_bytes", "commit_bps", "mapping_version")} == {
        "period": "2026-10", "period_start": OCTOBER.start_utc, "period_end": OCTOBER.end_utc, "hour": QUOTA_HOUR,
        "observed": 120_000, "threshold": 120_000, "unit": "bytes", "quota_bytes": 120_000, "commit_bps": None,
        "mapping_version": version.id}
    assert {k: commit[k] for k in ("hour", "observed", "threshold", "unit", "commit_bps", "quota_bytes")} == {
        "hour": COMMIT_HOUR, "observed": 456, "threshold": 447, "unit": "panes", "commit_bps": 20.0,
        "quota_bytes": None}
    assert commit["observed_bps"] == 1000 * 8 / 300  # the provisional billable rate: every acme pane is 1,000 bytes
    assert quota["alert_id"] == alert_id("quota", "acme", OCTOBER) != commit["alert_id"]
    # The watermark that closed the crossing hour, as the ledger records for that hour.
    ledger = {r["period_start"]: r for r in st.read_ledger(harness.warehouse(), "hour")}
    assert quota["closed_at_watermark"] == ledger[QUOTA_HOUR]["closed_at_watermark"]
    assert commit["closed_at_watermark"] == ledger[COMMIT_HOUR]["closed_at_watermark"]
    # The alerts suite ran and held.
    checks = [r for r in harness.table("dq_results") if r["grain"] == "alert"]
    assert checks and all(r["success"] for r in checks)
    assert {r["expectation"] for r in checks} >= {
        "expect_compound_columns_to_be_unique((kind, account, period) unique)",
        "expect_column_pair_values_a_to_be_greater_than_b(observed ≥ threshold)"}


def test_a_rerun_and_a_backfill_of_the_same_hours_write_nothing_new(run):
    harness, _ = run
    table = harness.warehouse().table("alerts")
    before, version = harness.table("alerts"), table.version()
    harness.close()  # a rerun: nothing left to freeze
    harness.close(until=datetime(2026, 11, 1, tzinfo=UTC))  # a backfill run of October's last hour
    assert harness.table("alerts") == before
    assert harness.warehouse().table("alerts").version() == version  # not even an identical rewrite


def test_a_replay_and_a_restatement_of_the_same_hours_leave_the_same_alerts(run, spark, tmp_path):
    harness, _ = run
    shutil.copytree(harness.root, tmp_path / "copy")
    copy = _harness(tmp_path / "copy", spark)
    before = copy.table("alerts")
    archive = tmp_path / "copy" / "archive"
    start, end = START, datetime(2026, 11, 1, tzinfo=UTC)
    # The same archive replayed over the same range: recorded duplicates, nothing counted again.
    replay(copy.settings, lambda: spark, archive, start, end, None, None, lambda *a: None)
    assert copy.table("alerts") == before
    # Restated from the archive: every hour frozen again, and the period's alerts recomputed from it.
    replay(copy.settings, lambda: spark, archive, start, end, None, "test: same archive", lambda *a: None)
    restated = [r for r in st.read_ledger(copy.warehouse(), "hour") if r["restated"]]
    assert len(restated) == 40
    assert _key(copy.table("alerts")) == _key(before)


def test_feeding_everything_at_once_gives_the_same_crossings(spark, tmp_path, run):
    harness, _ = run
    root = tmp_path / "once"
    root.mkdir()
    (root / "accounts.toml").write_text(ACCOUNTS)
    once = _harness(root, spark)
    for name in ("a.csv", "b.csv"):
        once.deliver("feed", (harness.root / "archive" / "feed" / name).read_text(), name)
    once.ingest()
    once.close()
    # Frozen later, in one run: the same rows (the watermark that closed each hour differs, by design).
    skip = {"closed_at_watermark"}
    assert _key(once.table("alerts"), skip) == _key(harness.table("alerts"), skip)


def test_only_published_hours_count_in_hour_order(run, spark, tmp_path):
    from traffic.accounting.alerts import evaluate_period, published_hours
    from traffic.quality.acceptance import accept

    harness, _ = run
    shutil.copytree(harness.root, tmp_path / "copy")
    copy = _harness(tmp_path / "copy", spark)
    warehouse = copy.warehouse()
    first_hour = st.read_clock_state(warehouse).first_hour
    # Hour 12:00 of the 30th failed its checks: its panes are not published, and the hours after it wait
    # (evaluating them without it would move the crossing once it is accepted).
    hour = datetime(2026, 10, 30, 12, tzinfo=UTC)
    row = next(r for r in st.read_ledger(warehouse, "hour") if r["period_start"] == hour)
    st.write_ledger_rows(warehouse, [{**row, "dq_status": "failed", "dq_note": "test: corrupt"}])
    assert evaluate_period(warehouse, OCTOBER, published_hours(warehouse), first_hour) == []
    # As if October had not been billed yet: a close neither bills it nor raises its alerts while it waits.
    warehouse.table("alerts").delete_keys([OCTOBER.start_utc])
    warehouse.table("bills").delete_keys([OCTOBER.start_utc])
    copy.close()
    assert copy.table("alerts") == [] and copy.table("bills") == []
    accept(copy.settings, "2026-10-30T12:00Z", "checked by hand", "tester")
    assert _key(evaluate_period(warehouse, OCTOBER, published_hours(warehouse), first_hour)) == \
        _key(harness.table("alerts"))
    # The next close stores October's bills, and its alerts with them (no later freeze falls in October).
    assert copy.close().bills_stored == ["2026-10"]
    assert _key(copy.table("alerts")) == _key(harness.table("alerts"))


def test_limits_come_from_the_version_the_frozen_panes_carry(run):
    from traffic.accounting.alerts import evaluate_period, published_hours
    from traffic.core.accounts import parse_accounts

    harness, _ = run
    warehouse = harness.warehouse()
    first_hour = st.read_clock_state(warehouse).first_hour
    published = published_hours(warehouse)
    # A version appended later, in force from before these hours by its date: the frozen panes keep v1
    # (by id), and so do their limits — its quota of one byte does not reach them.
    later = parse_accounts(ACCOUNTS + """
[[version]]
name = "v2"
effective_from = 2026-10-30

[version.accounts]
acme = ["10.0.0.0/24"]

[version.limits.acme]
quota_bytes = 1
""")
    rows = evaluate_period(warehouse, OCTOBER, published, first_hour, later)
    assert _key(rows) == _key(harness.table("alerts"))
    # v1 edited in place (a quota of 240,000): its id changes, the panes' id is no longer in the file, and
    # the version in force by time applies — the edited one, crossed at the end of the twentieth hour.
    edited = parse_accounts(ACCOUNTS.replace("quota_bytes = 120_000", "quota_bytes = 240_000"))
    quota = next(r for r in evaluate_period(warehouse, OCTOBER, published, first_hour, edited) if r["kind"] == "quota")
    assert (quota["hour"], quota["observed"], quota["mapping_version"]) == (
        datetime(2026, 10, 31, 3, tzinfo=UTC), 240_000, edited.versions[0].id)


def test_traffic_alerts_lists_them(run, capsys):
    harness, _ = run
    base = ["--warehouse", str(harness.settings.warehouse), "--set", f"accounts_file={harness.root / 'accounts.toml'}"]
    assert cli.main(["alerts", *base]) == 0
    out = capsys.readouterr().out
    assert "alerts of the latest billing periods with alerts: 2" in out
    lines = [line.split() for line in out.splitlines() if line.startswith("2026-10")]
    assert [line[:5] for line in lines] == [["2026-10", "quota", "acme", "2026-10-30", "17:00"],
                                            ["2026-10", "commit", "acme", "2026-10-31", "21:00"]]
    assert lines[0][5:9] == ["120,000", "bytes", "120,000", "bytes"] and lines[1][5:9] == ["456", "panes", "447",
                                                                                          "panes"]
    assert cli.main(["alerts", *base, "--period", "2026-10", "--account", "acme", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(a["kind"], a["hour"]) for a in doc] == [("quota", QUOTA_HOUR.isoformat()),
                                                     ("commit", COMMIT_HOUR.isoformat())]
    assert cli.main(["alerts", *base, "--period", "2026-11"]) == 0
    assert "alerts of period 2026-11: 0" in capsys.readouterr().out
    assert cli.main(["alerts", *base, "--period", "October"]) == 2


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_traffic_alerts_formats_read_back_to_the_table_rows(run, tmp_path, capsys, fmt):
    harness, _ = run
    out = tmp_path / f"alerts.{fmt}"
    assert cli.main(["alerts", "--warehouse", str(harness.settings.warehouse), "--set",
                     f"accounts_file={harness.root / 'accounts.toml'}", "--period", "2026-10", "--format", fmt,
                     "--out", str(out)]) == 0
    stored = harness.warehouse().table("alerts").read_arrow()
    assert stored.num_rows == 2
    assert_same_rows(read_back(out, fmt, stored.schema), stored)


def test_status_reads_a_warehouse_made_before_the_alerts_table(run, tmp_path, capsys):
    harness, _ = run
    older = tmp_path / "older"
    shutil.copytree(harness.settings.warehouse, older)
    shutil.rmtree(older / "alerts")
    assert cli.main(["status", "--warehouse", str(older), "--json"]) == 0
    versions = json.loads(capsys.readouterr().out)["versions"]
    assert "alerts" not in versions and versions["hourly"] >= 1


def test_the_bill_shows_the_overage_over_the_commit(run, capsys):
    harness, _ = run
    stored = {r["account"]: r for r in harness.table("bills")}
    acme = stored["acme"]
    assert acme["billable_bps"] == 1000 * 8 / 300
    assert acme["commit_bps"] == 20.0 and acme["overage_bps"] == 1000 * 8 / 300 - 20
    assert stored["globex"]["commit_bps"] is None and stored["globex"]["overage_bps"] is None
    assert cli.main(["bill", "--period", "2026-10", "--warehouse", str(harness.settings.warehouse),
                     "--set", f"accounts_file={harness.root / 'accounts.toml'}"]) == 0
    line = next(row for row in capsys.readouterr().out.splitlines() if row.startswith("acme"))
    assert line.split()[-2:] == ["20.000", f"{1000 * 8 / 300 - 20:,.3f}"]


def test_the_report_lists_the_alerts_escaped(run, spark, tmp_path):
    from traffic.reporting.html_report import write_report

    harness, _ = run
    page = write_report(harness.settings).read_text()
    assert 'id="alerts"' in page
    assert f'data-alert="{alert_id("quota", "acme", OCTOBER)}"' in page
    assert f'data-alert="{alert_id("commit", "acme", OCTOBER)}"' in page
    bill = (harness.settings.warehouse / "_reports" / "bills" / "2026-10" / "acme.html").read_text()
    assert 'data-figure="overage_bps"' in bill and 'data-figure="commit_bps"' in bill
    # An account name with markup is shown as text.
    hostile = tmp_path / "hostile"
    shutil.copytree(harness.root, hostile)
    copy = _harness(hostile, spark)
    table = copy.warehouse().table("alerts")
    rows = copy.table("alerts")
    rows[0]["account"] = "<script>alert(1)</script>"
    import pyarrow as pa

    table.replace(pa.Table.from_pylist(rows, schema=table.arrow_schema), keys=[OCTOBER.start_utc])
    page = write_report(copy.settings).read_text()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_the_notifier_mails_each_alert_once_across_two_calls(run, tmp_path, monkeypatch):
    harness, _ = run
    shutil.copytree(harness.root, tmp_path / "copy")
    mailbox = Mailbox()
    try:
        monkeypatch.setenv("AIRFLOW_CONN_TRAFFIC_SMTP", json.dumps({
            "conn_type": "smtp", "host": "127.0.0.1", "port": mailbox.port,
            "extra": {"disable_ssl": True, "disable_tls": True, "from_email": "traffic@example.org"}}))
        settings = harness.settings.replace(warehouse=tmp_path / "copy" / "warehouse",
                                            alerts_smtp_conn_id="traffic_smtp", alerts_email_to=("noc@example.org",))
        first = notify_pending(settings)
        assert first["channel"] == "smtp" and len(first["sent"]) == 2
        assert notify_pending(settings) == {"sent": [], "channel": None}  # the second call: nothing new
        assert len(mailbox.messages) == 2
        subjects = sorted(data.split("Subject: ", 1)[1].splitlines()[0] for _, _, data in mailbox.messages)
        assert subjects == ["[traffic] commit alert: acme (2026-10)", "[traffic] quota alert: acme (2026-10)"]
        assert {to for _, rcpt, _ in mailbox.messages for to in rcpt} == {"noc@example.org"}
    finally:
        mailbox.stop()
    from traffic.storage.warehouse import Warehouse

    assert read_sent(Warehouse(settings, engine="rs")) == {r["alert_id"] for r in harness.table("alerts")}


def test_without_an_smtp_connection_each_alert_is_a_log_line_once(run, tmp_path, capfd, monkeypatch):
    from traffic.orchestration import dag_support

    harness, _ = run
    shutil.copytree(harness.root, tmp_path / "copy")
    settings = harness.settings.replace(warehouse=tmp_path / "copy" / "warehouse",
                                        alerts_smtp_conn_id="no_such_connection", alerts_email_to=("noc@x.org",))
    capfd.readouterr()
    first = notify_pending(settings)
    # The second call as the DAG's task makes it, with the worker's TRAFFIC_* settings.
    for name, value in (("WAREHOUSE", settings.warehouse), ("ACCOUNTS_FILE", tmp_path / "copy" / "accounts.toml"),
                        ("ALERTS_SMTP_CONN_ID", "no_such_connection"), ("ALERTS_EMAIL_TO", "noc@x.org")):
        monkeypatch.setenv(f"TRAFFIC_{name}", str(value))
    second = dag_support.notify_alerts()
    assert first["channel"] == "log" and len(first["sent"]) == 2 and second["sent"] == []
    # The notifier logs through Airflow's task logger (structlog: the task's log, here the process's output).
    out = capfd.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if "alert: account 'acme'" in line]
    assert len(lines) == 2, lines
    assert any("quota alert: account 'acme', billing period 2026-10: bytes_total reached 120,000" in line
               and "no SMTP connection 'no_such_connection'" in line for line in lines)
