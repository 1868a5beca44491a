"""What the reading commands print for a person: the status, top talkers, bills and alerts as text.

The commands (``traffic.app.cli``) fetch the figures; these functions only lay them out. Names and
reasons from outside are printed with their control characters escaped (``traffic.core.text``).
"""

from __future__ import annotations

from datetime import timedelta

from traffic.app.console import fmt_ts
from traffic.core.text import printable


def print_status(settings, info: dict) -> None:
    """``traffic status``: watermark, clocks, open hours, last closed periods, waiting flow sets, versions."""
    from traffic.reporting.report import _span  # deferred: per command (see traffic.app.cli's docstring)

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


def print_top(result, by: str) -> None:
    """``traffic top``: the window, a note if any, and one line per talker."""
    print(f"top {len(result.rows)} of {result.keys:,} {by}s by bytes, "
          f"{fmt_ts(result.start)} → {fmt_ts(result.end)} (the watermark)")
    if result.note:
        print(f"note: {printable(result.note)}")
    label = "account" if by == "account" else "address"
    print(f"{label:<40} {'bytes':>16} {'packets':>12} {'in':>16} {'out':>16}")
    for row in result.rows:
        print(f"{printable(row['key'] or '-'):<40} {row['bytes']:>16,} {row['packets']:>12,} {row['bytes_in']:>16,} "
              f"{row['bytes_out']:>16,}")


def print_bills(result, rows: list[dict], status: str) -> None:
    """``traffic bill``: the period, its rule and ``status`` (final or provisional), one line per account."""
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


def print_alerts(rows: list[dict], period, account: str | None) -> None:
    """``traffic alerts``: of one billing period (or the latest with alerts), one line per alert."""
    scope = f"period {period.label}" if period else "the latest billing periods with alerts"
    print(f"alerts of {scope}" + (f", account {printable(account)}" if account else "") + f": {len(rows)}")
    if rows:
        print(f"{'period':<8} {'kind':<7} {'account':<20} {'hour (UTC)':<17} {'observed':>22} {'threshold':>22} "
              f"{'limit':>24}  version")
    for r in rows:
        limit = f"{r['quota_bytes']:,} bytes" if r["kind"] == "quota" else f"{r['commit_bps']:,.0f} bit/s"
        print(f"{printable(r['period']):<8} {r['kind']:<7} {printable(r['account']):<20} {r['hour']:%Y-%m-%d %H:%M} "
              f"{r['observed']:>16,} {r['unit']:<5} {r['threshold']:>16,} {r['unit']:<5} {limit:>24}  "
              f"{printable(r['mapping_version'])}")
