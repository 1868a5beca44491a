"""What the command line prints: progress, one batch, one close, timings (one byte formatter: ``core.text``)."""

from __future__ import annotations

import sys

from traffic.core.text import human_bytes, printable


def progress(message: str) -> None:
    """One line of progress on stderr (names from the input escaped)."""
    print(f"  {printable(message)}", file=sys.stderr, flush=True)


def fmt_ts(value) -> str:
    """A time as the console shows it (``-`` for none)."""
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def print_batch(result) -> None:
    """One ingest batch, as ``traffic ingest`` reports it."""
    if result.nothing_to_do:
        print("ingest: nothing new in the inbox")
        return
    print(f"ingest: batch {result.batch_id}{' (resumed)' if result.resumed else ''}: "
          f"{result.records_read:,} records from {result.files} file(s) → "
          f"{result.packets_on_time:,} on time ({human_bytes(result.bytes_on_time)}), "
          f"{result.packets_late:,} late ({human_bytes(result.bytes_late)}), "
          f"{result.records_rejected:,} rejected, {result.ticks:,} ticks"
          + (f", {result.duplicate_files} duplicate file(s) ignored" if result.duplicate_files else ""))
    print(f"        watermark {fmt_ts(result.watermark_before)} → {fmt_ts(result.watermark_after)}")
    if getattr(result, "skipped", None):
        print("        flow telemetry skipped (not traffic): "
              + ", ".join(f"{count:,} {printable(kind)}" for kind, count in sorted(result.skipped.items())))


def print_close(result) -> None:
    """One close, as ``traffic close`` reports it."""
    if not (result.hours_frozen or result.days_rolled or result.months_rolled or result.expired_hours
            or getattr(result, "bills_stored", None)):
        print(f"close: nothing to close (watermark {fmt_ts(result.watermark)})")
        return
    parts = [f"{len(result.hours_frozen)} hour(s) frozen"]
    if result.days_rolled:
        parts.append("day(s) rolled up: " + ", ".join(d.isoformat() for d in result.days_rolled))
    if result.months_rolled:
        parts.append("month(s) rolled up: " + ", ".join(f"{m:%Y-%m}" for m in result.months_rolled))
    if result.expired_hours:
        parts.append(f"raw detail of {result.expired_hours} hour(s) expired")
    if getattr(result, "bills_stored", None):
        parts.append("bills stored: " + ", ".join(result.bills_stored))
    print("close: " + "; ".join(parts))
    for warning in getattr(result, "warnings", []):
        print(f"close: warning {printable(warning)}")
    for failure in result.failed:
        print(f"close: FAILED {printable(failure)}")


def print_timings(args, label: str, result, spark=None) -> None:
    """With ``--timings``: where a step's time went (stderr, one line), and how long Spark took to start."""
    if not getattr(args, "timings", False) or result is None:
        return
    parts = [f"{'(of which checks' if name == 'quality' else name} {seconds:.2f} s{')' if name == 'quality' else ''}"
             for name, seconds in (result.seconds or {}).items() if seconds >= 0.005]
    if spark is not None and spark.started_in and label in ("ingest", "replay"):
        parts.insert(0, f"spark start {spark.started_in:.2f} s")
    print(f"timings: {label}: {', '.join(parts) or 'nothing timed'}", file=sys.stderr, flush=True)
