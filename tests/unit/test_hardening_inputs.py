"""Inputs from outside the flows that used to stop a job or cost more than themselves (issue 34).

An account name with a newline, a long non-ASCII account name, ``--out`` onto a FIFO, a duration
setting too large for datetime arithmetic, an IPv4-mapped accounts block: each either works or is
refused with one line (exit 2 from the CLI), and never costs anything else.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from tests.support.mailbox import Mailbox

REPO = Path(__file__).resolve().parents[2]
TRAFFIC = REPO / ".venv" / "bin" / "traffic"
UTC = timezone.utc


def _traffic(*args, env=None):
    command = [str(TRAFFIC)] if TRAFFIC.exists() else [sys.executable, "-m", "traffic.app.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "GX_ANALYTICS_ENABLED": "false", **(env or {})})


def _one_error_line(result, *expected):
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    return lines[0]


# -- (a) an account name with a control character; one failed mail never stops the next ----------

NEWLINE_ACCOUNTS = """
[[version]]
effective_from = 2026-01-01
[version.accounts]
acme = ["10.0.0.0/8"]
"evil\\nname" = ["192.0.2.0/24"]
"""


def test_an_account_name_with_a_newline_is_refused_when_the_accounts_file_loads(tmp_path):
    accounts = tmp_path / "accounts.toml"
    accounts.write_text(NEWLINE_ACCOUNTS)
    result = _traffic("status", "--warehouse", str(tmp_path / "warehouse"), "--set", f"accounts_file={accounts}")
    _one_error_line(result, "accounts_file", str(accounts), "'evil\\nname'", "control character")


def _alert(account: str, alert_id: str) -> dict:
    return {"kind": "quota", "account": account, "period": "2026-10", "observed": 120_000, "quota_bytes": 100_000,
            "hour": datetime(2026, 10, 5, 7, tzinfo=UTC), "mapping_version": "v1@0123456789", "alert_id": alert_id}


@pytest.fixture
def smtp(monkeypatch):
    mailbox = Mailbox()
    monkeypatch.setenv("AIRFLOW_CONN_TRAFFIC_SMTP", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": mailbox.port,
        "extra": {"disable_ssl": True, "disable_tls": True, "from_email": "traffic@example.org"}}))
    yield mailbox
    mailbox.stop()


def test_an_alert_of_an_account_with_a_newline_does_not_stop_the_next_mail(smtp):
    """An alert stored before names were checked (or any name) is mailed with its name escaped, and the
    alerts after it are mailed too."""
    from traffic.orchestration.notify import AlertNotifier

    sent = []
    notifier = AlertNotifier([_alert("evil\nBcc: x@example.org", "a1"), _alert("acme", "a2")], "traffic_smtp",
                             ("noc@example.org",), on_sent=sent.append)
    notifier({})
    assert sent == ["a1", "a2"] and notifier.failed == []
    subjects = [data.split("Subject: ", 1)[1].splitlines()[0] for data in smtp.texts]
    assert subjects == ["[traffic] quota alert: evil\\nBcc: x@example.org (2026-10)",
                        "[traffic] quota alert: acme (2026-10)"]
    assert all("Bcc:" not in data.split("Subject: ", 1)[0] for data in smtp.texts)


def test_one_failed_mail_is_logged_counted_and_the_next_is_still_sent(smtp, monkeypatch):
    from airflow.providers.smtp.hooks.smtp import SmtpHook

    from traffic.orchestration.notify import AlertNotifier, AlertsNotSent

    real = SmtpHook.send_email_smtp

    def refuse_one(self, *args, subject, **kwargs):
        if "refused" in subject:
            raise RuntimeError("550 mailbox unavailable")
        return real(self, *args, subject=subject, **kwargs)

    monkeypatch.setattr(SmtpHook, "send_email_smtp", refuse_one)
    sent = []
    notifier = AlertNotifier([_alert("refused", "a1"), _alert("acme", "a2"), _alert("globex", "a3")], "traffic_smtp",
                             ("noc@example.org",), on_sent=sent.append)
    with pytest.raises(AlertsNotSent, match=r"1 of 3 alert\(s\) not mailed.*550 mailbox unavailable"):
        notifier({})
    assert sent == ["a2", "a3"]  # the failed one is not recorded: the next run sends it again
    assert [alert_id for alert_id, _ in notifier.failed] == ["a1"]
    assert len(smtp.texts) == 2


# -- (b) bill page names stay within the file system's limit -----------------------------------

LONG_NAMES = ["株" * 32, "𝔘" * 32, "é" * 255, "a" * 300, "a" * 195, "a" * 196, "~" * 100, "." * 80]


@pytest.mark.parametrize("account", LONG_NAMES + ["acme", None, "a b/c"])
def test_bill_page_names_fit_the_file_system_with_room_for_their_cache_and_temp_names(account):
    from traffic.reporting.html_bills import page_name

    name = page_name(account)
    assert name.endswith(".html") and name == page_name(account)  # stable
    assert len(f".chart-2026-10-{name}.svg.tmp".encode()) <= 255
    assert all(c.isascii() and (c.isalnum() or c in "_-~.") for c in name)


def test_bill_page_names_are_unique_and_short_ones_keep_their_old_form():
    from traffic.reporting.html_bills import page_name

    assert page_name("acme") == "acme.html" and page_name("a b") == "a~20b.html" and page_name(None) == "~28none~29.html"
    names = LONG_NAMES + ["株" * 31, "株" * 33, "a" * 301, "a" * 194 + "~", "a" * 194 + "b", None]
    assert len({page_name(n) for n in names}) == len(names)


def _row(account: str) -> dict:
    row = {name: 1000 for name in ("bytes_in", "bytes_out", "bytes_internal", "bytes_transit", "bytes_unknown",
                                   "bytes_total", "panes", "p95_rank", "p95_in_pane_bytes", "p95_out_pane_bytes",
                                   "billable_pane_bytes")}
    row |= {"p95_in_bps": 10.0, "p95_out_bps": 5.0, "billable_bps": 10.0, "commit_bps": None, "overage_bps": None,
            "billing_rule": "max", "billing_unknown_direction": "in", "billing_cycle_day": 1,
            "billing_timezone": "UTC", "mapping_versions": ["v1@0123456789"], "account": account}
    return row


def test_a_32_character_non_ascii_account_gets_its_bill_page_and_the_index_links_it(tmp_path, monkeypatch):
    from traffic.core.billing import BillingPeriod
    from traffic.reporting import html_bills

    accounts = ["株式会社" * 8, "acme"]
    period = BillingPeriod("2026-10", datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC))
    page = html_bills.PeriodPage(period, [_row(a) for a in accounts], "final", "final", panes=pa.table({"x": [1]}))
    monkeypatch.setattr(html_bills, "bill_periods", lambda warehouse, cache: [page])
    monkeypatch.setattr(html_bills, "account_month_totals", lambda warehouse, cache: [])
    monkeypatch.setattr(html_bills, "rate_series",
                        lambda panes, period, unknown: {a: {"in": {0: 100}, "out": {}} for a in accounts})
    html_bills.write_bill_pages(None, tmp_path, datetime(2026, 11, 2, tzinfo=UTC))
    index = (tmp_path / "bills" / "index.html").read_text()
    for account in accounts:
        name = html_bills.page_name(account)
        assert (tmp_path / "bills" / "2026-10" / name).is_file()
        assert f'href="2026-10/{name}"' in index
        assert account in (tmp_path / "bills" / "2026-10" / name).read_text()


# -- (c) --out onto a FIFO or a device file ----------------------------------------------------

@pytest.fixture(scope="module")
def empty_warehouse(tmp_path_factory) -> Path:
    """A warehouse with every table and no rows (delta-rs, no Spark): each command reaches its writing."""
    from traffic.core.settings import build_settings
    from traffic.storage.warehouse import Warehouse

    root = tmp_path_factory.mktemp("hardening") / "warehouse"
    Warehouse(build_settings({"warehouse": root}), engine="rs").create_all()
    return root


def test_writing_rows_onto_a_fifo_is_refused_and_the_fifo_stays(tmp_path):
    from traffic.core.settings import SettingsError
    from traffic.reporting.export import write_rows

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(SettingsError, match="not a regular file"):
        write_rows(pa.table({"x": [1, 2]}), "csv", fifo)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


@pytest.mark.parametrize("command", [["show", "batches"], ["top", "--last", "1h"], ["bill", "--period", "2026-10"],
                                     ["alerts"], ["export", "--table", "batches", "--from", "2026-10-01",
                                                  "--to", "2026-11-01"]])
def test_every_out_refuses_a_fifo_with_one_line_and_exit_2(tmp_path, empty_warehouse, command):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = _traffic(*command, "--warehouse", str(empty_warehouse), "--format", "csv", "--out", str(fifo))
    _one_error_line(result, "--out", "not a regular file", "FIFO")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_out_refuses_a_device_file(tmp_path):
    from traffic.core.settings import SettingsError
    from traffic.reporting.export import output_path

    with pytest.raises(SettingsError, match="character device"):
        output_path("csv", os.devnull)
    link = tmp_path / "link"
    link.symlink_to(os.devnull)
    with pytest.raises(SettingsError, match="character device"):
        output_path("csv", link)
    regular = tmp_path / "rows.csv"
    regular.write_text("old")
    assert output_path("csv", regular) == regular and output_path("csv", tmp_path / "new.csv") == tmp_path / "new.csv"


# -- (d) settings too large for datetime arithmetic --------------------------------------------

@pytest.mark.parametrize("setting", ["max_history=99999999d", "keep_hours=99999999999", "allowed_lateness=99999999d",
                                     "max_future_skew=99999999d", "late_retention=99999999d",
                                     "source_lateness=edge-1=99999999d", "lock_timeout=9999999999999999999d",
                                     "shuffle_partitions=99999999999", "split_bytes=99999999999999999",
                                     "compact_min_files=99999999999", "template_wait=99999999d",
                                     "now=9999-12-31T00:00:00"])
def test_a_setting_too_large_for_the_jobs_is_refused_with_one_line_and_exit_2(tmp_path, setting):
    name = setting.partition("=")[0]
    result = _traffic("status", "--warehouse", str(tmp_path / "none"), "--set", setting)
    _one_error_line(result, f"error: {name}")


def test_the_largest_durations_accepted_still_compute(tmp_path):
    from traffic.core.periods import expiry_cutoff, future_limit, history_floor, retention_floor
    from traffic.core.settings import MAX_DURATION, SettingsError, build_settings

    assert MAX_DURATION == timedelta(days=36_525)
    settings = build_settings({"max_history": "36525d", "max_future_skew": "36525d", "late_retention": "36525d",
                               "keep_hours": str(36_525 * 24), "now": "9898-12-31T23:59:59"})
    newest = datetime(1970, 1, 1, tzinfo=UTC)
    assert history_floor(newest, settings.max_history) == datetime(1869, 12, 31, tzinfo=UTC)
    assert future_limit(settings.processing_now(), settings.max_future_skew).year == 9999
    assert retention_floor(newest, settings.late_retention).year == 1869
    assert expiry_cutoff(newest, settings.keep_hours, newest).year == 1869
    with pytest.raises(SettingsError, match="now"):
        build_settings({"now": "9899-01-01T00:00:00"})
    with pytest.raises(SettingsError, match="max_history.*100 years"):
        build_settings({"max_history": "36526d"})
    with pytest.raises(SettingsError, match="keep_hours"):
        build_settings({"keep_hours": str(36_525 * 24 + 1)})
    with pytest.raises(SettingsError, match="template_wait"):  # from a TOML config file: a float
        build_settings({"template_wait": float("inf")})


# -- (e) an IPv4-mapped accounts block ---------------------------------------------------------

MAPPED_ACCOUNTS = """
[[version]]
effective_from = 2026-01-01
[version.accounts]
acme = ["::ffff:10.0.0.0/104", "2001:db8::/32"]
globex = ["::ffff:192.0.2.7/128"]
"""


def test_an_ipv4_mapped_block_matches_the_ipv4_addresses_it_maps():
    from traffic.core.accounts import AccountsError, parse_accounts
    from traffic.core.records import canonical_ip

    version = parse_accounts(MAPPED_ACCOUNTS).versions[0]
    assert version.accounts == {"acme": ("10.0.0.0/8", "2001:db8::/32"), "globex": ("192.0.2.7/32",)}
    stored = [canonical_ip(a) for a in ("10.1.2.3", "::ffff:10.9.9.9", "192.0.2.7", "2001:db8::1", "11.0.0.1")]
    assert version.lookup_many(stored).to_pylist() == ["acme", "acme", "globex", "acme", "unassigned"]
    assert [version.lookup(a) for a in stored] == ["acme", "acme", "globex", "acme", "unassigned"]
    with pytest.raises(AccountsError, match="listed twice"):  # the same block, written both ways
        parse_accounts(MAPPED_ACCOUNTS.replace("globex = [", "globex = [\"192.0.2.7/32\", "))
