"""``traffic`` — the command line: ingest, close, run, status, show, report, accept, replay, bill, alerts, spark, demo,
collect, metrics, export.

Errors a person can fix print one line and exit 2 (a file or folder this user may not write, or
a full or read-only disk, among them); a failed check exits 3; anything unexpected prints one line
(and the details with ``--debug``) and exits 1. When the reader of the output goes away
(``traffic status | head``) the command stops quietly with 141, as a shell tool killed by SIGPIPE
does. Names and reasons from outside are printed with their control characters escaped
(``traffic.core.text``), so no file name or record can send escape sequences to the terminal.

Each command is declared once, in ``COMMANDS`` (name, help, arguments, function); the parser and the dispatch
are built from it. Exit codes and failure lines: ``app/exits.py``; the reading commands' text: ``app/printouts.py``.

Each command imports what it runs inside its function (``# deferred: per command``): ``traffic
status`` or ``--help`` never loads pyspark, Great Expectations or the Delta writer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable

from traffic import __version__
from traffic.app.collect.options import COLLECT_ARGUMENTS
from traffic.app.console import print_batch, print_close, print_timings, progress
from traffic.app.exits import EXIT_CHECK, EXIT_PIPE, EXIT_USER, FIXABLE, fixable_problem, reader_gone, unexpected
from traffic.app.printouts import print_alerts, print_bills, print_status, print_top
from traffic.app.spark_holder import SparkHolder
from traffic.core.location import ObjectLocation, StoreUnreachable, is_object_url
from traffic.core.text import printable, printable_lines

_SETTING_OPTIONS = {
    "warehouse": "warehouse root (default ./warehouse)",
    "inbox": "inbox directory (default ./inbox)",
    "keep_hours": "hours of raw detail to keep after freezing (default 24)",
    "allowed_lateness": "seconds the watermark trails the source clocks (default 0)",
    "source_timeout": "seconds after which a quiet source stops holding the watermark (default 3600)",
    "local_networks": "comma-separated CIDRs of the local side (captures)",
    "expected_sources": "comma-separated sources expected every 5 minutes (completeness)",
    "engine": "Delta engine: auto, rs or spark",
    "spark_master": "Spark master (default auto: the warm server of `traffic spark start`, else local[2])",
}


def _settings(args):
    from traffic.core.settings import load_settings  # deferred: per command (see the docstring)

    overrides = {name: getattr(args, name, None) for name in _SETTING_OPTIONS}
    for item in getattr(args, "set", None) or []:
        name, sep, value = item.partition("=")
        if not sep:
            from traffic.core.settings import SettingsError  # deferred: per command (see the docstring)

            raise SettingsError(f"--set {item!r}: expected name=value")
        overrides[name.strip().replace("-", "_")] = value
    return load_settings(args.config, overrides=overrides)


def cmd_ingest(args, settings, spark) -> int:
    from traffic.app.runs import ingest  # deferred: per command (see the docstring)

    result = ingest(settings, spark, progress)
    print_batch(result)
    print_timings(args, "ingest", result, spark)
    return 0


def _until(args):
    if not getattr(args, "until", None):
        return None
    from traffic.core.settings import parse_time  # deferred: per command (see the docstring)

    return parse_time("--until", args.until)


def close_facts(result) -> dict:
    """What a close did, as ``traffic close --report`` writes it (JSON: ISO times, dates, months as YYYY-MM)."""
    hours = result.hours_frozen
    return {"hours_frozen": len(hours), "first_hour_frozen": hours[0].isoformat() if hours else None,
            "last_hour_frozen": hours[-1].isoformat() if hours else None,
            "days_rolled": [day.isoformat() for day in result.days_rolled],
            "months_rolled": [f"{month:%Y-%m}" for month in result.months_rolled],
            "bills_stored": list(result.bills_stored), "expired_hours": result.expired_hours,
            "watermark": result.watermark.isoformat() if result.watermark else None, "failed": list(result.failed)}


def write_report(path: str, result) -> None:
    """``--report``: the close's facts written to a file beside ``path`` then renamed onto it, so a reader
    finds the whole report or none (the hourly DAG reads it to say what its step did)."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(close_facts(result), indent=1) + "\n")
    os.replace(temporary, target)


def _close_and_print(args, settings, spark, until, only=None) -> int:
    """Run a close and print what it did; a failed critical check is re-raised (exit 3) after printing."""
    from traffic.accounting.close import CheckFailed  # deferred: per command (see the docstring)
    from traffic.app.runs import close  # deferred: per command (see the docstring)

    report = getattr(args, "report", None)
    try:
        result = close(settings, spark, until, progress, only=only)
    except CheckFailed as error:
        if error.result is not None:
            print_close(error.result)
            if report:
                write_report(report, error.result)
        raise
    print_close(result)
    if report:
        write_report(report, result)
    print_timings(args, "close", result, spark)
    return EXIT_CHECK if result.failed else 0


def cmd_close(args, settings, spark) -> int:
    only = tuple(step.strip() for step in args.only.split(",")) if args.only else None
    return _close_and_print(args, settings, spark, _until(args), only)


def cmd_run(args, settings, spark) -> int:
    from traffic.app.runs import ingest  # deferred: per command (see the docstring)

    result = ingest(settings, spark, progress)
    print_batch(result)
    print_timings(args, "ingest", result, spark)
    return _close_and_print(args, settings, spark, _until(args))


def cmd_report(args, settings, spark) -> int:
    from traffic.reporting.html_report import write_report  # deferred: per command (see the docstring)
    from traffic.storage.report_copy import fetch_reports, publish_reports  # deferred: per command (see the docstring)
    from traffic.storage.place import Place  # deferred: per command (see the docstring)
    from traffic.storage.warehouse import Warehouse  # deferred: per command (see the docstring)
    from traffic.core.settings import SettingsError, parse_duration  # deferred: per command (see the docstring)

    top_last = parse_duration("--top-last", args.top_last)
    if top_last.total_seconds() <= 0:
        raise SettingsError("--top-last must be a positive duration (24h, 7d, 90m)")
    warehouse = Warehouse.reader(settings)
    fetch_reports(warehouse)  # a warehouse on object storage: the runs other hosts published, for the links
    path = write_report(settings, top_last)
    sent, _ = publish_reports(warehouse)
    print(f"report: {printable(path)}" + (f" (sent to {Place.of(settings.warehouse).uri}/_reports/index.html)"
                                          if sent else ""))
    return 0


def cmd_accept(args, settings, spark) -> int:
    import getpass

    from traffic.app.runs import refresh_metrics  # deferred: per command (see the docstring)
    from traffic.reporting.html_report import refresh_report  # deferred: per command (see the docstring)
    from traffic.quality.acceptance import accept  # deferred: per command (see the docstring)
    from traffic.quality.suite_documents import period_label  # deferred: per command (see the docstring)

    row = accept(settings, args.period, args.reason, args.by or getpass.getuser(), spark=spark)
    print(f"accept: {row['grain']} {period_label(row['grain'], row['period_start'])} is accepted by "
          f"{printable(row['accepted_by'])} ({printable(row['accepted_reason'])}); "
          f"it failed: {printable(row.get('dq_note') or '-')}")
    print("accept: roll-ups over it proceed at the next `traffic close`")
    refresh_report(settings, progress)
    refresh_metrics(settings, progress)
    return 0


def cmd_status(args, settings, spark) -> int:
    from traffic.reporting.report import status  # deferred: per command (see the docstring)

    info = status(settings)
    if args.json:
        print(json.dumps(info, indent=1, default=str))
        return 0
    print_status(settings, info)
    return 0


def _output(args):
    """The file of ``--out`` for a machine ``--format`` (None: stdout), checked before any work."""
    from traffic.core.settings import SettingsError  # deferred: per command (see the docstring)
    from traffic.reporting.export import output_path  # deferred: per command (see the docstring)

    if getattr(args, "json", False) and args.format != "table":
        raise SettingsError(f"--json and --format {args.format}: give one of them (--format json is a JSON object "
                            "per row)")
    if args.format == "table":
        if args.out:
            raise SettingsError("--out writes a machine format: add --format csv, json or parquet")
        return None
    return output_path(args.format, args.out)


def _write_machine(args, table, out) -> int:
    """Rows in ``--format`` csv/json/parquet to ``--out`` (a one-line summary on stderr) or stdout."""
    from traffic.reporting.export import write_rows  # deferred: per command (see the docstring)

    written = write_rows(table, args.format, out, sys.stdout)
    if out is not None:
        print(f"traffic {args.command}: {written.rows:,} rows, {written.bytes:,} bytes written to {written.where()}",
              file=sys.stderr)
    return 0


def cmd_show(args, settings, spark) -> int:
    from traffic.reporting.report import show, show_rows  # deferred: per command (see the docstring)

    out = _output(args)
    if args.format != "table":
        rows = show_rows(settings, args.what, args.__dict__.get("from"), args.to, args.top, every_column=True)
        return _write_machine(args, rows, out)
    print(printable_lines(show(settings, args.what, args.__dict__.get("from"), args.to, args.top)))
    return 0


def cmd_export(args, settings, spark) -> int:
    """Write a table's rows over ``[--from, --to)``, streamed one storage key at a time (docs/exports.md)."""
    from traffic.core.settings import parse_time  # deferred: per command (see the docstring)
    from traffic.reporting.export import export_table, exportable, output_path, summary  # deferred: per command
    from traffic.storage.warehouse import Warehouse  # deferred: per command (see the docstring)

    exportable(args.table)
    out = output_path(args.format, args.out)
    start, end = parse_time("--from", args.__dict__["from"]), parse_time("--to", args.to)
    written = export_table(Warehouse.reader(settings), args.table, start, end, args.format, out,
                           include_open=args.include_open, progress=progress, stream=sys.stdout)
    print(summary(args.table, start, end, written), file=sys.stderr)
    return 0


def cmd_top(args, settings, spark) -> int:
    from traffic.storage.warehouse import Warehouse  # deferred: per command (see the docstring)
    from traffic.core.settings import parse_duration  # deferred: per command (see the docstring)
    from traffic.reporting.top import talkers_table, top_talkers  # deferred: per command (see the docstring)

    out = _output(args)
    result = top_talkers(Warehouse.reader(settings), parse_duration("--last", args.last), args.by, args.limit)
    if args.format != "table":
        if result.note:
            print(f"note: {printable(result.note)}", file=sys.stderr)
        return _write_machine(args, talkers_table(result), out)
    if args.json:
        print(json.dumps({"by": result.by, "start": result.start, "end": result.end, "keys": result.keys,
                          "note": result.note, "rows": result.rows}, indent=1, default=str))
        return 0
    print_top(result, args.by)
    return 0


def cmd_replay(args, settings, spark) -> int:
    from traffic.app.runs import replay  # deferred: per command (see the docstring)
    from traffic.core.settings import SettingsError, parse_time  # deferred: per command (see the docstring)

    if args.restate and not args.reason:
        raise SettingsError("--restate needs --reason (it is recorded in the ledger)")
    start, end = parse_time("--from", args.__dict__["from"]), parse_time("--to", args.to)
    batch, closed = replay(settings, spark, Path(args.input), start, end, args.source,
                           args.reason if args.restate else None, progress)
    if batch.nothing_to_do:
        print(f"replay: every file in {printable(args.input)} was already counted for this range")
    else:
        print_batch(batch)
        if batch.records_skipped:
            print(f"        {batch.records_skipped:,} record(s) outside {start:%Y-%m-%d %H:%M} → {end:%Y-%m-%d %H:%M} "
                  "were not counted")
    print_close(closed)
    print_timings(args, "replay", batch, spark)
    print_timings(args, "close", closed)
    return EXIT_CHECK if closed.failed else 0


def cmd_bill(args, settings, spark) -> int:
    """Print the bills of a period: stored ones when it is closed, else computed from final panes (provisional)."""
    from traffic.accounting.bills import compute_period, stored_bills  # deferred: per command (see the docstring)
    from traffic.core.billing import BillingError  # deferred: per command (see the docstring)
    from traffic.storage.warehouse import Warehouse  # deferred: per command (see the docstring)
    from traffic.core.settings import SettingsError  # deferred: per command (see the docstring)

    out = _output(args)
    warehouse = Warehouse.reader(settings)
    if not warehouse.exists():
        raise SettingsError(f"no warehouse at {settings.warehouse}")
    try:
        result = compute_period(warehouse, args.period, args.account)
        stored = stored_bills(warehouse, result.period)
    except BillingError as error:
        raise SettingsError(str(error)) from None
    if stored:
        rows = [r for r in stored if args.account is None or r["account"] == args.account]
        status = "final, stored"
    else:
        from traffic.accounting.bills import bill_rows  # deferred: per command (see the docstring)

        rows = bill_rows(result)
        status = ("final, not stored (a close stores closed periods in order)" if result.final else
                  f"provisional: {result.hours_final} of {result.hours_needed} hour(s) final; not stored")
    if args.format != "table":
        from traffic.reporting.export import rows_table  # deferred: per command (see the docstring)
        from traffic.storage.schemas import arrow_schema  # deferred: per command (see the docstring)

        table = rows_table(rows, arrow_schema("bills"), final=result.final, stored=bool(stored))
        return _write_machine(args, table, out)
    if args.json:
        doc = {"period": result.period.label, "period_start": result.period.start_utc.isoformat(),
               "period_end": result.period.end_utc.isoformat(), "final": result.final, "stored": bool(stored),
               "bills": [{k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in r.items()} for r in rows]}
        print(json.dumps(doc, indent=1))
        return 0
    print_bills(result, rows, status)
    return 0


def cmd_alerts(args, settings, spark) -> int:
    """Print the stored quota and commit alerts: of one billing period, or of the latest periods that have any."""
    from traffic.accounting.alerts import read_alerts  # deferred: per command (see the docstring)
    from traffic.accounting.bills import billing_cycle  # deferred: per command (see the docstring)
    from traffic.core.billing import BillingError  # deferred: per command (see the docstring)
    from traffic.core.settings import SettingsError  # deferred: per command (see the docstring)
    from traffic.storage.warehouse import Warehouse  # deferred: per command (see the docstring)

    warehouse = Warehouse.reader(settings)
    if not warehouse.exists():
        raise SettingsError(f"no warehouse at {settings.warehouse}")
    try:
        period = billing_cycle(settings).period_for(args.period) if args.period else None
    except BillingError as error:
        raise SettingsError(str(error)) from None
    out = _output(args)
    rows = read_alerts(warehouse, period, args.account)
    if args.format != "table":
        from traffic.reporting.export import rows_table  # deferred: per command (see the docstring)
        from traffic.storage.schemas import arrow_schema  # deferred: per command (see the docstring)

        return _write_machine(args, rows_table(rows, arrow_schema("alerts")), out)
    if args.json:
        print(json.dumps([{k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in r.items()} for r in rows],
                         indent=1))
        return 0
    print_alerts(rows, period, args.account)
    return 0


def cmd_spark(args, settings, spark) -> int:
    """Start, stop or show the warehouse's warm Spark Connect server (127.0.0.1 only)."""
    from traffic.runtime import connect  # deferred: per command (see the docstring)
    from traffic.storage.warehouse import Warehouse  # deferred: per command (see the docstring)

    state_dir = Warehouse.reader(settings).host_dir()
    if args.action == "start":
        clock = time.perf_counter()
        print("starting Spark Connect (127.0.0.1) …", file=sys.stderr, flush=True)
        record, started = connect.start_recorded(state_dir, args.port, os.environ.get("SPARK_DRIVER_MEMORY", "2g"),
                                                 settings.shuffle_partitions, jars_dir=settings.spark_jars_dir)
        if not started:
            print(f"spark: already running at {record['url']} (pid {record['pid']}, since {record['started_at']})")
            return 0
        print(f"spark: warm server ready at {record['url']} in {time.perf_counter() - clock:.1f} s "
              f"(pid {record['pid']}, log {printable(record['log'])}); jobs on {printable(settings.warehouse)} "
              "use it until `traffic spark stop`")
        return 0
    if args.action == "stop":
        record = connect.stop_recorded(state_dir)
        print(f"spark: stopped the server at {record['url']} (pid {record['pid']})" if record
              else "spark: no warm server is running for this warehouse")
        return 0
    record = connect.recorded_server(state_dir)
    print(f"spark: running at {record['url']} (pid {record['pid']}, since {record['started_at']}, "
          f"log {printable(record['log'])})"
          if record else "spark: no warm server; jobs start their own local Spark (`traffic spark start` keeps one warm)")
    return 0


def cmd_demo(args, settings, spark) -> int:
    from traffic.app import runs  # deferred: per command (see the docstring)
    from traffic.app.demo.run import run_demo  # deferred: see above

    return run_demo(settings, spark, Path(args.dir), runs.ingest, runs.close, progress=progress)


def cmd_collect(args, settings, spark) -> int:
    """Receive flow telemetry over UDP into the inbox until SIGTERM or Ctrl-C (docs/collect.md)."""
    from traffic.app.collect.options import CollectError, build_options  # deferred: per command (see the docstring)
    from traffic.app.collect.service import run  # deferred: per command (see the docstring)

    # --allow replaces the allowed_exporters setting (config < environment < command line)
    allow = [block for text in args.allow for block in text.split(",")] if args.allow else settings.allowed_exporters
    options = build_options(args.listen, args.rotate, args.flush, args.flush_datagrams, args.rcvbuf, args.status,
                            args.status_every, args.log_every, args.metrics, allow, args.allow_any, args.upload)
    if is_object_url(settings.inbox):
        raise CollectError(f"the inbox is {settings.inbox}, and collect writes its files to a local folder: give that "
                           f"folder as --inbox, and --upload {settings.inbox} to send each completed file there")
    return run(settings.inbox, settings.exporters, options)


def cmd_metrics(args, settings, spark) -> int:
    """Print the warehouse's Prometheus metrics, recomputed from its tables (no Spark); --write refreshes the file."""
    from traffic.reporting import metrics  # deferred: per command (see the docstring)

    warehouse = metrics.existing(settings)
    families = metrics.collect(warehouse)
    if args.write:
        path = metrics.write_metrics(warehouse, families)
        print(f"metrics: wrote {printable(path)}", file=sys.stderr)
    print(printable_lines(metrics.exposition(families).rstrip("\n")))
    return 0


@dataclass(frozen=True)
class Command:
    """A ``traffic`` command, declared once: the parser and the dispatch are both built from ``COMMANDS``."""

    name: str
    help: str
    run: Callable[..., int]  # (args, settings, spark holder) -> exit code
    arguments: tuple = ()  # ``arg(...)`` each: what ``add_argument`` takes, after the options every command has
    description: str | None = None


def arg(*flags: str, **spec) -> tuple[tuple[str, ...], dict]:
    """One argument of a command, as ``ArgumentParser.add_argument`` takes it."""
    return flags, spec


#: What every command takes: the config file, the settings' own options, ``--set`` and ``--debug``.
COMMON = (arg("--config", help="TOML config file (or TRAFFIC_CONFIG)"),
          *(arg(f"--{name.replace('_', '-')}", dest=name, help=text) for name, text in _SETTING_OPTIONS.items()),
          arg("--set", action="append", metavar="NAME=VALUE", help="any other setting (repeatable)"),
          arg("--debug", action="store_true", help="show full tracebacks"))
TIMED = (arg("--timings", action="store_true", help="print where the time went, per step (stderr)"),)
FORMATS = (arg("--format", default="table", choices=["table", "csv", "json", "parquet"],
               help="table (default: text for people), or every column with exact values and ISO-8601 UTC times: "
                    "csv, json (JSON lines: one object per row), parquet (needs --out); docs/exports.md"),
           arg("--out", metavar="PATH", help="write the --format file here, atomically (default: stdout)"))
_METRICS_HELP = ("print the Prometheus metrics (docs/metrics.md), recomputed from the warehouse's tables, so they "
                 "are right even when no job has run since an upgrade (no Spark); every job writes them to "
                 "<warehouse>/_reports/metrics.prom")

#: Every command, in the order ``traffic --help`` lists them.
COMMANDS = {command.name: command for command in (
    Command("ingest", "ingest what is new in the inbox (one micro-batch)", cmd_ingest, TIMED),
    Command("close", "freeze closed hours, roll up days/months, expire", cmd_close, (
        *TIMED,
        arg("--until", help="stop at this hour (ISO time): freeze hours ending by then"),
        arg("--only", help="comma-separated steps to run: freeze, days, months, expire (default all)"),
        arg("--report", metavar="FILE", help="also write what the close did (hours frozen, days and months rolled "
            "up, hours expired) to FILE as JSON, atomically (the hourly DAG reads it)"))),
    Command("run", "ingest then close: one tick", cmd_run, (*TIMED, arg("--until", help="as for close"))),
    Command("status", "watermark, clocks, open hours, last closed periods", cmd_status,
            (arg("--json", action="store_true"),)),
    Command("show", "print a table", cmd_show, (
        *FORMATS,
        arg("what", choices=["hourly", "daily", "monthly", "periods", "late", "rejects", "batches", "sources",
                             "account-daily", "account-monthly"]),
        arg("--from", help="first period (ISO date or time)"),
        arg("--to", help="end of the range, exclusive (ISO date or time)"),
        arg("--top", type=int, default=20,
            help="rows to print, largest by bytes first (default 20; 0: all), in every --format"))),
    Command("replay", "import archived files for a time range (or restate a frozen range), then close", cmd_replay, (
        *TIMED,
        arg("--from", required=True, help="start of the range (ISO time, inclusive)"),
        arg("--to", required=True, help="end of the range (ISO time, exclusive)"),
        arg("--input", required=True, help="folder of archived files (sub-folder = source)"),
        arg("--source", help="source of every file (default: sub-folder name, else 'default')"),
        arg("--restate", action="store_true", help="replace the frozen range from the archive (audited)"),
        arg("--reason", help="why the range is restated (required with --restate)"))),
    Command("top", "top talkers over a window ending at the watermark (no Spark)", cmd_top, (
        *FORMATS,
        arg("--last", required=True, help="window length: 15m, 1h, 24h, 7d (any duration)"),
        arg("--by", default="host", choices=["host", "peer", "account"],
            help="host = local address, peer = remote address, account = accounts_file (default host)"),
        arg("--limit", type=int, default=10, help="rows to print (default 10)"),
        arg("--json", action="store_true",
            help="one JSON document: the window and its rows (--format json: a JSON object per row)"))),
    Command("report", "write the HTML traffic report to <warehouse>/_reports/index.html (no Spark)", cmd_report, (
        arg("--top-last", default="24h",
            help="window of the top-talkers tables, ending at the watermark (default 24h; 7d, 90m …)"),)),
    Command("metrics", _METRICS_HELP, cmd_metrics, (
        arg("--write", action="store_true",
            help="also rewrite <warehouse>/_reports/metrics.prom (atomically) with these figures"),),
            description=_METRICS_HELP[0].upper() + _METRICS_HELP[1:] + "."),
    Command("accept", "accept a period that failed its checks (audited); roll-ups then proceed", cmd_accept, (
        arg("--period", required=True, help="the failed period: 2026-11 (month), 2026-11-01 (day) or "
            "2026-11-01T10:00Z (hour)"),
        arg("--reason", required=True, help="why it is accepted (kept in the ledger)"),
        arg("--by", help="who accepts it (default: the user running the command)"))),
    Command("bill", "bills of a billing period per account: volume and 95th-percentile rate (no Spark)", cmd_bill, (
        *FORMATS,
        arg("--period", required=True, help="the billing period, by the month it starts in (2026-10)"),
        arg("--account", help="one account (default: every account)"),
        arg("--json", action="store_true", help="print the bills as one JSON document (exact integers and rates; "
            "--format json: a JSON object per bill)"))),
    Command("export", "write a table's rows over a time range as CSV, JSON lines or Parquet, streamed one storage key "
            "at a time; published periods only unless --include-open (no Spark)", cmd_export, (
        arg("--table", required=True, help="hourly, daily, monthly, periods, panes, bills, alerts, source_panes, "
            "packets (while raw detail is kept), late_packets, rejects, batches or dq_results"),
        arg("--from", required=True, help="start of the range on the table's time column (ISO date or time, "
            "inclusive; docs/exports.md names each table's column)"),
        arg("--to", required=True, help="end of the range (ISO date or time, exclusive)"),
        arg("--format", required=True, choices=["csv", "json", "parquet"],
            help="csv, json (JSON lines: one object per row) or parquet (needs --out)"),
        arg("--out", metavar="PATH", help="the file, written atomically (default: stdout, csv and json)"),
        arg("--include-open", action="store_true",
            help="also rows of periods not closed yet (open hours); a failed period is never exported"))),
    Command("alerts", "quota and commit alerts per account and billing period (no Spark)", cmd_alerts, (
        *FORMATS,
        arg("--period", help="the billing period, by the month it starts in (2026-10); default: the latest periods "
            "with alerts"),
        arg("--account", help="one account (default: every account)"),
        arg("--json", action="store_true",
            help="print the alerts as one JSON document (--format json: a JSON object per alert)"))),
    Command("spark", "keep a warm Spark for this warehouse: start, stop or status of a local Spark Connect server "
            "that later jobs use (spark_master auto)", cmd_spark, (
        arg("action", choices=["start", "stop", "status"]),
        arg("--port", type=int, help="port on 127.0.0.1 (default: a free one)"))),
    Command("demo", "generate sample traffic and run the whole pipeline on it", cmd_demo, (
        arg("--dir", default="demo", help="folder for the demo's inbox and warehouse (default ./demo)"),)),
    Command("collect", "receive sFlow/NetFlow/IPFIX datagrams over UDP into inbox/<source>/ as pcap files (decodes "
            "nothing; runs until SIGTERM or Ctrl-C)", cmd_collect, COLLECT_ARGUMENTS),
)}


def build_parser() -> argparse.ArgumentParser:
    """The ``traffic`` parser, built from ``COMMANDS``: a sub-command each, with the common options first."""
    parser = argparse.ArgumentParser(prog="traffic", description="Traffic accounting lakehouse.")
    parser.add_argument("--version", action="version", version=f"traffic {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        added = sub.add_parser(command.name, help=command.help, description=command.description)
        for flags, spec in (*COMMON, *command.arguments):
            added.add_argument(*flags, **spec)
    return parser


def main(argv: list[str] | None = None, spark=None) -> int:
    """Entry point of the console script (and of ``jobs/*.py`` with their own session)."""
    from traffic.accounting.close import CheckFailed  # deferred: per command (see the docstring)
    from traffic.storage.table import StorageError  # deferred: per command (see the docstring)
    from traffic.io.inbox import InboxError  # deferred: per command (see the docstring)
    from traffic.storage.journal import LockTimeout  # deferred: per command (see the docstring)
    from traffic.quality.acceptance import AcceptError  # deferred: per command (see the docstring)
    from traffic.core.settings import SettingsError  # deferred: per command (see the docstring)
    from traffic.reporting.top import TopError  # deferred: per command (see the docstring)
    from traffic.app.collect.options import CollectError  # deferred: per command (see the docstring)
    from traffic.accounting.parts import SumOverflow  # deferred: per command (see the docstring)

    args = build_parser().parse_args(argv)
    holder = None
    try:
        settings = _settings(args)
        if args.command == "demo":
            base = Path(args.dir).absolute()
            settings = settings.replace(warehouse=base / "warehouse", inbox=base / "inbox")
        elif args.command != "collect":  # a wrong endpoint fails here, at once
            reads_inbox = args.command in ("ingest", "run")
            for place in (settings.warehouse, *([settings.inbox] if reads_inbox else [])):
                if is_object_url(place):
                    ObjectLocation.parse(place).check_reachable()
        holder = SparkHolder(settings, f"traffic-{args.command}", spark)
        code = COMMANDS[args.command].run(args, settings, holder)
        sys.stdout.flush()  # here, not at exit: a reader gone by now is handled below
        return code
    except BrokenPipeError as error:
        return EXIT_PIPE if reader_gone() else unexpected(args, error)
    except (SettingsError, InboxError, LockTimeout, StorageError, AcceptError, TopError, CollectError,
            SumOverflow, StoreUnreachable) as error:
        print(f"traffic {args.command}: error: {printable(error)}", file=sys.stderr)
        return EXIT_USER
    except CheckFailed as error:
        print(f"traffic {args.command}: check failed: {printable(error)}", file=sys.stderr)
        return EXIT_CHECK
    except KeyboardInterrupt:
        print(f"traffic {args.command}: interrupted (an interrupted batch is finished by the next run)",
              file=sys.stderr)
        return 130
    except OSError as error:
        if error.errno not in FIXABLE:
            return unexpected(args, error)
        print(f"traffic {args.command}: error: {fixable_problem(error)}", file=sys.stderr)
        return EXIT_USER
    except Exception as error:  # noqa: BLE001 - the last line of defence: one line, not a JVM trace
        return unexpected(args, error)
    finally:
        if holder is not None and spark is None:
            holder.stop()


if __name__ == "__main__":
    sys.exit(main())
