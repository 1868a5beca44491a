"""``traffic`` — the command line: ingest, close, run, status, show, report, accept, replay, bill, alerts, spark, demo,
collect, metrics, export.

Errors a person can fix print one line and exit 2 (a file or folder this user may not write, or
a full or read-only disk, among them); a failed check exits 3; anything unexpected prints one line
(and the details with ``--debug``) and exits 1. When the reader of the output goes away
(``traffic status | head``) the command stops quietly with 141, as a shell tool killed by SIGPIPE
does. Names and reasons from outside are printed with their control characters escaped
(``traffic.core.text``), so no file name or record can send escape sequences to the terminal.

Each command imports what it runs inside its function (``# deferred: per command``): ``traffic
status`` or ``--help`` never loads pyspark, Great Expectations or the Delta writer.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import select
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from traffic import __version__
from traffic.app.console import fmt_ts, print_batch, print_close, print_timings, progress
from traffic.core.text import printable, printable_lines

UTC = timezone.utc
EXIT_USER, EXIT_CHECK, EXIT_BUG = 2, 3, 1
EXIT_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool whose reader went away

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


class SparkHolder:
    """Starts Spark on first use only (so 'nothing to do' never pays for a JVM), then reuses it."""

    def __init__(self, settings, app_name: str, spark=None):
        self.settings = settings
        self.app_name = app_name
        self.spark = spark
        self.started_in = 0.0

    def __call__(self):
        if self.spark is None:
            from traffic.runtime import jvm  # deferred: per command (see the docstring)
            from traffic.runtime.spark import build_spark, resolve_master  # deferred: only a command that needs Spark

            clock = time.perf_counter()
            master = resolve_master(self.settings)
            if master.startswith("sc://"):
                from traffic.runtime.connect import without_token  # deferred: with the session, not at CLI start

                print(f"connecting to the warm Spark at {without_token(master)} …", file=sys.stderr, flush=True)
            else:
                jit = "quick-start JVM" if jvm.quick(self.settings.spark_jit) else \
                    f"full JIT: {jvm.big_job()}" if jvm.big_job() else "full JIT"
                print(f"starting Spark ({jit}) …", file=sys.stderr, flush=True)
            self.spark = build_spark(self.settings.replace(spark_master=master), self.app_name)
            self.started_in = time.perf_counter() - clock
        return self.spark

    def stop(self):
        if self.spark is not None:
            self.spark.stop()
            self.spark = None


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
    from traffic.core.settings import SettingsError, parse_duration  # deferred: per command (see the docstring)

    top_last = parse_duration("--top-last", args.top_last)
    if top_last.total_seconds() <= 0:
        raise SettingsError("--top-last must be a positive duration (24h, 7d, 90m)")
    path = write_report(settings, top_last)
    print(f"report: {printable(path)}")
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
    from datetime import timedelta

    from traffic.reporting.report import _span, status  # deferred: per command (see the docstring)

    info = status(settings)
    if args.json:
        print(json.dumps(info, indent=1, default=str))
        return 0
    print(f"warehouse   {printable(settings.warehouse)}")
    print(f"watermark   {fmt_ts(info['watermark'])}")
    print(f"first hour  {fmt_ts(info['first_hour'])}")
    for source, clock in sorted(info["clocks"].items()):
        live = "live" if source in info["live_sources"] else "stalled"
        if source in info["far_ahead"]:
            live += f", {info['far_ahead'][source]} ahead of the others"
        print(f"  source {printable(source):<16} clock {fmt_ts(clock)}  ({printable(live)})")
    print(f"open hours  {', '.join(info['open_hours']) or '-'}")
    for grain in ("hour", "day", "month"):
        print(f"last closed {grain:<5} {info['last_closed'].get(grain) or '-'}")
    if info["pending_batch"]:
        print(f"pending     batch {info['pending_batch']} was interrupted; the next ingest or close finishes it")
    if info.get("telemetry"):
        flows = info["telemetry"]
        print(f"flows       last {flows['hours']} closed hours: {flows['estimated_share']:.1%} of bytes estimated "
              f"from samples; {flows['lost']:,} export sequence units lost in {flows['hours_with_losses']} hour(s)")
    for source, waiting in sorted(info.get("waiting", {}).items()):
        # Receive times are the collector's wall clock: the age is measured by this machine's (or `now`).
        oldest = waiting["oldest"]
        age = max(settings.processing_now() - oldest, timedelta(0)) if oldest else None
        since = (f" since {fmt_ts(oldest)} ({_span(age)} ago; rejected once the watermark passes "
                 f"{fmt_ts(oldest + settings.template_wait)})") if oldest else ""
        print(f"  waiting {printable(source):<15} {waiting['sets']:,} flow data set(s), {waiting['bytes']:,} bytes "
              f"for their template{since}")
    print("tables      " + ", ".join(f"{t} v{v}" for t, v in info["versions"].items()))
    for warning in info["warnings"]:
        print(f"warning     {printable(warning)}")
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
    print(f"top {len(result.rows)} of {result.keys:,} {args.by}s by bytes, "
          f"{fmt_ts(result.start)} → {fmt_ts(result.end)} (the watermark)")
    if result.note:
        print(f"note: {printable(result.note)}")
    label = "account" if args.by == "account" else "address"
    print(f"{label:<40} {'bytes':>16} {'packets':>12} {'in':>16} {'out':>16}")
    for row in result.rows:
        print(f"{printable(row['key'] or '-'):<40} {row['bytes']:>16,} {row['packets']:>12,} {row['bytes_in']:>16,} "
              f"{row['bytes_out']:>16,}")
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
    period = result.period
    first = rows[0] if rows else {**result.settings, "panes": period.pane_count, "p95_rank": None}
    print(f"bill {period.label}: {period.start_utc:%Y-%m-%d %H:%M} → {period.end_utc:%Y-%m-%d %H:%M} UTC, "
          f"{first['panes']:,} panes (95th percentile = pane {first['p95_rank'] or '-'} of them by size), "
          f"rule {first['billing_rule']}, unknown direction → {first['billing_unknown_direction']}; {status}")
    print(f"{'account':<20} {'bytes_in':>18} {'bytes_out':>18} {'bytes_total':>18} {'p95_in_bps':>16} "
          f"{'p95_out_bps':>16} {'billable_bps':>16} {'commit_bps':>16} {'overage_bps':>16}")
    for r in rows:
        commit, overage = r.get("commit_bps"), r.get("overage_bps")  # null: no commit (or stored before commits)
        print(f"{printable(r['account']):<20} {r['bytes_in']:>18,} {r['bytes_out']:>18,} {r['bytes_total']:>18,} "
              f"{r['p95_in_bps']:>16,.3f} {r['p95_out_bps']:>16,.3f} {r['billable_bps']:>16,.3f} "
              f"{'-' if commit is None else f'{commit:,.3f}':>16} {'-' if overage is None else f'{overage:,.3f}':>16}")
    versions = sorted({v for r in rows for v in r["mapping_versions"]})
    print(f"mapping version(s): {printable(', '.join(versions) or '-')}")
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
    scope = f"period {period.label}" if period else "the latest billing periods with alerts"
    print(f"alerts of {scope}" + (f", account {printable(args.account)}" if args.account else "") + f": {len(rows)}")
    if rows:
        print(f"{'period':<8} {'kind':<7} {'account':<20} {'hour (UTC)':<17} {'observed':>22} {'threshold':>22} "
              f"{'limit':>24}  version")
    for r in rows:
        limit = f"{r['quota_bytes']:,} bytes" if r["kind"] == "quota" else f"{r['commit_bps']:,.0f} bit/s"
        print(f"{printable(r['period']):<8} {r['kind']:<7} {printable(r['account']):<20} {r['hour']:%Y-%m-%d %H:%M} "
              f"{r['observed']:>16,} {r['unit']:<5} {r['threshold']:>16,} {r['unit']:<5} {limit:>24}  "
              f"{printable(r['mapping_version'])}")
    return 0


def cmd_spark(args, settings, spark) -> int:
    """Start, stop or show the warehouse's warm Spark Connect server (127.0.0.1 only)."""
    from traffic.runtime import connect  # deferred: per command (see the docstring)
    from traffic.storage.warehouse import Warehouse  # deferred: per command (see the docstring)

    state_dir = Warehouse.reader(settings).state_dir()
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
    from traffic.app.demo import run_demo  # deferred: see above

    return run_demo(settings, spark, Path(args.dir), runs.ingest, runs.close, progress=progress)


def cmd_collect(args, settings, spark) -> int:
    """Receive flow telemetry over UDP into the inbox until SIGTERM or Ctrl-C (docs/collect.md)."""
    from traffic.app.collect import build_options, run  # deferred: per command (see the docstring)

    # --allow replaces the allowed_exporters setting (config < environment < command line)
    allow = [block for text in args.allow for block in text.split(",")] if args.allow else settings.allowed_exporters
    options = build_options(args.listen, args.rotate, args.flush, args.flush_datagrams, args.rcvbuf, args.status,
                            args.status_every, args.log_every, args.metrics, allow, args.allow_any)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="traffic", description="Traffic accounting lakehouse.")
    parser.add_argument("--version", action="version", version=f"traffic {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="TOML config file (or TRAFFIC_CONFIG)")
    for name, text in _SETTING_OPTIONS.items():
        common.add_argument(f"--{name.replace('_', '-')}", dest=name, help=text)
    common.add_argument("--set", action="append", metavar="NAME=VALUE", help="any other setting (repeatable)")
    common.add_argument("--debug", action="store_true", help="show full tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    timed = argparse.ArgumentParser(add_help=False)
    timed.add_argument("--timings", action="store_true", help="print where the time went, per step (stderr)")
    sub.add_parser("ingest", parents=[common, timed], help="ingest what is new in the inbox (one micro-batch)")
    close = sub.add_parser("close", parents=[common, timed], help="freeze closed hours, roll up days/months, expire")
    close.add_argument("--until", help="stop at this hour (ISO time): freeze hours ending by then")
    close.add_argument("--only", help="comma-separated steps to run: freeze, days, months, expire (default all)")
    close.add_argument("--report", metavar="FILE", help="also write what the close did (hours frozen, days and "
                       "months rolled up, hours expired) to FILE as JSON, atomically (the hourly DAG reads it)")
    run = sub.add_parser("run", parents=[common, timed], help="ingest then close: one tick")
    run.add_argument("--until", help="as for close")
    status = sub.add_parser("status", parents=[common], help="watermark, clocks, open hours, last closed periods")
    status.add_argument("--json", action="store_true")
    formats = argparse.ArgumentParser(add_help=False)
    formats.add_argument("--format", default="table", choices=["table", "csv", "json", "parquet"],
                         help="table (default: text for people), or every column with exact values and ISO-8601 "
                              "UTC times: csv, json (JSON lines: one object per row), parquet (needs --out); "
                              "docs/exports.md")
    formats.add_argument("--out", metavar="PATH", help="write the --format file here, atomically (default: stdout)")
    show = sub.add_parser("show", parents=[common, formats], help="print a table")
    show.add_argument("what", choices=["hourly", "daily", "monthly", "periods", "late", "rejects", "batches", "sources",
                                       "account-daily", "account-monthly"])
    show.add_argument("--from", help="first period (ISO date or time)")
    show.add_argument("--to", help="end of the range, exclusive (ISO date or time)")
    show.add_argument("--top", type=int, default=20,
                      help="rows to print, largest by bytes first (default 20; 0: all), in every --format")
    replay = sub.add_parser("replay", parents=[common, timed],
                            help="import archived files for a time range (or restate a frozen range), then close")
    replay.add_argument("--from", required=True, help="start of the range (ISO time, inclusive)")
    replay.add_argument("--to", required=True, help="end of the range (ISO time, exclusive)")
    replay.add_argument("--input", required=True, help="folder of archived files (sub-folder = source)")
    replay.add_argument("--source", help="source of every file (default: sub-folder name, else 'default')")
    replay.add_argument("--restate", action="store_true", help="replace the frozen range from the archive (audited)")
    replay.add_argument("--reason", help="why the range is restated (required with --restate)")
    top = sub.add_parser("top", parents=[common, formats],
                         help="top talkers over a window ending at the watermark (no Spark)")
    top.add_argument("--last", required=True, help="window length: 15m, 1h, 24h, 7d (any duration)")
    top.add_argument("--by", default="host", choices=["host", "peer", "account"],
                     help="host = local address, peer = remote address, account = accounts_file (default host)")
    top.add_argument("--limit", type=int, default=10, help="rows to print (default 10)")
    top.add_argument("--json", action="store_true",
                     help="one JSON document: the window and its rows (--format json: a JSON object per row)")
    report = sub.add_parser("report", parents=[common],
                            help="write the HTML traffic report to <warehouse>/_reports/index.html (no Spark)")
    report.add_argument("--top-last", default="24h",
                        help="window of the top-talkers tables, ending at the watermark (default 24h; 7d, 90m …)")
    metrics_help = ("print the Prometheus metrics (docs/metrics.md), recomputed from the warehouse's tables, so they "
                    "are right even when no job has run since an upgrade (no Spark); every job writes them to "
                    "<warehouse>/_reports/metrics.prom")
    metrics = sub.add_parser("metrics", parents=[common], help=metrics_help, description=metrics_help[0].upper()
                             + metrics_help[1:] + ".")
    metrics.add_argument("--write", action="store_true",
                         help="also rewrite <warehouse>/_reports/metrics.prom (atomically) with these figures")
    accept = sub.add_parser("accept", parents=[common],
                            help="accept a period that failed its checks (audited); roll-ups then proceed")
    accept.add_argument("--period", required=True, help="the failed period: 2026-11 (month), 2026-11-01 (day) "
                        "or 2026-11-01T10:00Z (hour)")
    accept.add_argument("--reason", required=True, help="why it is accepted (kept in the ledger)")
    accept.add_argument("--by", help="who accepts it (default: the user running the command)")
    bill = sub.add_parser("bill", parents=[common, formats],
                          help="bills of a billing period per account: volume and 95th-percentile rate (no Spark)")
    bill.add_argument("--period", required=True, help="the billing period, by the month it starts in (2026-10)")
    bill.add_argument("--account", help="one account (default: every account)")
    bill.add_argument("--json", action="store_true", help="print the bills as one JSON document (exact integers and "
                                                          "rates; --format json: a JSON object per bill)")
    export = sub.add_parser("export", parents=[common],
                            help="write a table's rows over a time range as CSV, JSON lines or Parquet, streamed one "
                                 "storage key at a time; published periods only unless --include-open (no Spark)")
    export.add_argument("--table", required=True,
                        help="hourly, daily, monthly, periods, panes, bills, alerts, source_panes, packets (while raw "
                             "detail is kept), late_packets, rejects, batches or dq_results")
    export.add_argument("--from", required=True, help="start of the range on the table's time column (ISO date or "
                                                      "time, inclusive; docs/exports.md names each table's column)")
    export.add_argument("--to", required=True, help="end of the range (ISO date or time, exclusive)")
    export.add_argument("--format", required=True, choices=["csv", "json", "parquet"],
                        help="csv, json (JSON lines: one object per row) or parquet (needs --out)")
    export.add_argument("--out", metavar="PATH", help="the file, written atomically (default: stdout, csv and json)")
    export.add_argument("--include-open", action="store_true",
                        help="also rows of periods not closed yet (open hours); a failed period is never exported")
    alerts = sub.add_parser("alerts", parents=[common, formats],
                            help="quota and commit alerts per account and billing period (no Spark)")
    alerts.add_argument("--period", help="the billing period, by the month it starts in (2026-10); default: the "
                                         "latest periods with alerts")
    alerts.add_argument("--account", help="one account (default: every account)")
    alerts.add_argument("--json", action="store_true",
                        help="print the alerts as one JSON document (--format json: a JSON object per alert)")
    spark = sub.add_parser("spark", parents=[common],
                           help="keep a warm Spark for this warehouse: start, stop or status of a local Spark Connect "
                                "server that later jobs use (spark_master auto)")
    spark.add_argument("action", choices=["start", "stop", "status"])
    spark.add_argument("--port", type=int, help="port on 127.0.0.1 (default: a free one)")
    demo = sub.add_parser("demo", parents=[common], help="generate sample traffic and run the whole pipeline on it")
    demo.add_argument("--dir", default="demo", help="folder for the demo's inbox and warehouse (default ./demo)")
    collect = sub.add_parser("collect", parents=[common],
                             help="receive sFlow/NetFlow/IPFIX datagrams over UDP into inbox/<source>/ as pcap files "
                                  "(decodes nothing; runs until SIGTERM or Ctrl-C)")
    collect.add_argument("--listen", action="append", metavar="HOST:PORT",
                         help="address and UDP port to listen on, [v6]:port for IPv6 (repeatable; default "
                              "127.0.0.1:2055, 127.0.0.1:4739 and 127.0.0.1:6343: loopback only)")
    collect.add_argument("--allow", action="append", metavar="BLOCKS",
                         help="address blocks whose datagrams are taken, e.g. 192.0.2.0/24,2001:db8::1 (repeatable; "
                              "replaces the allowed_exporters setting); others are dropped and counted")
    collect.add_argument("--allow-any", action="store_true",
                         help="take datagrams from any sender, also on an address other machines reach")
    collect.add_argument("--rotate", default="60", help="period per file and source: seconds or 90s, 15m, 1h "
                                                        "(default 60)")
    collect.add_argument("--flush", default="1",
                         help="seconds (0.05) or a duration (2s, 1m) between hand-overs to the OS: what a SIGKILL "
                              "may lose (default 1)")
    collect.add_argument("--flush-datagrams", type=int, default=10_000,
                         help="hand over to the OS after this many datagrams too (default 10000)")
    collect.add_argument("--rcvbuf", default="32M", help="socket receive buffer to ask for, per address (default 32M)")
    collect.add_argument("--status", help="JSON status file, rewritten atomically every --status-every seconds")
    collect.add_argument("--status-every", default="5", help="seconds or a duration between status files (default 5)")
    collect.add_argument("--log-every", default="60",
                         help="seconds or a duration between status lines on stderr (default 60; 0: none)")
    collect.add_argument("--metrics", metavar="HOST:PORT", help="serve Prometheus metrics here (e.g. 127.0.0.1:9155)")
    return parser


COMMANDS = {"ingest": cmd_ingest, "close": cmd_close, "run": cmd_run, "status": cmd_status, "show": cmd_show,
            "top": cmd_top, "bill": cmd_bill, "report": cmd_report, "accept": cmd_accept, "replay": cmd_replay,
            "spark": cmd_spark, "demo": cmd_demo, "collect": cmd_collect, "alerts": cmd_alerts,
            "metrics": cmd_metrics, "export": cmd_export}


#: File-system errors a person fixes (ownership and permissions, a read-only mount, a full disk), with the hint.
_FIXABLE = {
    errno.EACCES: "this user may not use it: run as the warehouse's owner, or fix its owner and permissions",
    errno.EPERM: "this user may not use it: run as the warehouse's owner, or fix its owner and permissions",
    errno.EROFS: "it is on a read-only file system",
    errno.ENOSPC: "the disk is full: free some space (an interrupted batch is finished by the next run)",
    errno.EDQUOT: "this user's disk quota is used up (an interrupted batch is finished by the next run)",
}


def _fixable_problem(error: OSError) -> str:
    """One line for a file-system error a person can fix: the path, what went wrong, what to do."""
    where = " → ".join(printable(name) for name in (error.filename, error.filename2) if name is not None)
    what = error.strerror or type(error).__name__
    return f"{where}: {what} ({_FIXABLE[error.errno]})" if where else f"{what} ({_FIXABLE[error.errno]})"


def _unexpected(args, error: BaseException) -> int:
    """The last line of defence: one line, not a JVM trace (the details with ``--debug``)."""
    if getattr(args, "debug", False):
        raise error
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    print(f"traffic {args.command}: failed: {type(error).__name__}: {printable(first[:500])} (rerun with --debug)",
          file=sys.stderr)
    return EXIT_BUG


def _reader_gone() -> bool:
    """After a ``BrokenPipeError``: if stdout's (or stderr's) reader has gone, point it at /dev/null so
    nothing more (the interpreter's last flush included) fails on it, and say so; False otherwise."""
    gone = False
    for stream in (sys.stdout, sys.stderr):
        try:
            poller = select.poll()
            poller.register(stream.fileno(), select.POLLOUT)
            broken = any(events & select.POLLERR for _, events in poller.poll(0))
        except (OSError, ValueError):  # not a file descriptor (a test's capture): nothing to redirect
            continue
        if broken:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
            gone = True
    return gone


def main(argv: list[str] | None = None, spark=None) -> int:
    """Entry point of the console script (and of ``jobs/*.py`` with their own session)."""
    from traffic.accounting.close import CheckFailed  # deferred: per command (see the docstring)
    from traffic.storage.table import StorageError  # deferred: per command (see the docstring)
    from traffic.io.inbox import InboxError  # deferred: per command (see the docstring)
    from traffic.storage.journal import LockTimeout  # deferred: per command (see the docstring)
    from traffic.quality.acceptance import AcceptError  # deferred: per command (see the docstring)
    from traffic.core.settings import SettingsError  # deferred: per command (see the docstring)
    from traffic.reporting.top import TopError  # deferred: per command (see the docstring)
    from traffic.app.collect import CollectError  # deferred: per command (see the docstring)
    from traffic.accounting.parts import SumOverflow  # deferred: per command (see the docstring)

    args = build_parser().parse_args(argv)
    holder = None
    try:
        settings = _settings(args)
        if args.command == "demo":
            base = Path(args.dir).absolute()
            settings = settings.replace(warehouse=base / "warehouse", inbox=base / "inbox")
        holder = SparkHolder(settings, f"traffic-{args.command}", spark)
        code = COMMANDS[args.command](args, settings, holder)
        sys.stdout.flush()  # here, not at exit: a reader gone by now is handled below
        return code
    except BrokenPipeError as error:
        if _reader_gone():
            return EXIT_PIPE
        return _unexpected(args, error)
    except (SettingsError, InboxError, LockTimeout, StorageError, AcceptError, TopError, CollectError,
            SumOverflow) as error:
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
        if error.errno not in _FIXABLE:
            return _unexpected(args, error)
        print(f"traffic {args.command}: error: {_fixable_problem(error)}", file=sys.stderr)
        return EXIT_USER
    except Exception as error:  # noqa: BLE001 - the last line of defence: one line, not a JVM trace
        return _unexpected(args, error)
    finally:
        if holder is not None and spark is None:
            holder.stop()


if __name__ == "__main__":
    sys.exit(main())
