"""The ledger's side of every close step: a period's ledger row and its verdict, the figures its checks
compare, and what the steps share to build and check them.

A step writes its ledger rows last, after its output is replaced and checked: the row's ``dq_status``
is the verdict, ``passed``/``warning`` (published) or ``failed`` (not published, until ``traffic accept``).
"""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa

from traffic.accounting import parts
from traffic.core.periods import PUBLISHED, as_utc, retention_floor
from traffic.core.settings import Settings
from traffic.storage import state as st
from traffic.storage.schemas import columns
from traffic.storage.warehouse import Warehouse


def _sums(frame, column: str, extra=()) -> dict:
    """Per-period Σ bytes and Σ packets of a Spark frame (one small collect)."""
    from pyspark.sql import functions as F

    aggs = [F.sum("bytes").alias("bytes"), *extra]
    return {r[column]: r for r in frame.groupBy(column).agg(*aggs).collect()}


def _arrow_sums(table: pa.Table, column: str, counted: str = "packets") -> dict[datetime, list[int]]:
    """Per-period [Σ bytes, Σ packets] of an Arrow table (``counted=None``: count rows as packets).

    Grouped in Arrow (an hour of hourly rows at real-world cardinality is millions of rows); only one
    entry per period reaches Python.
    """
    import pyarrow.compute as pc

    amounts = {"bytes": ("bytes", "sum"), "packets": (counted, "sum") if counted else ([], "count_all")}
    grouped = parts.group_sums(table.select([column, "bytes", *([counted] if counted else [])]), [column], amounts)
    sums: dict[datetime, list[int]] = {}
    for value, size, count in zip(grouped.column(column).to_pylist(),
                                  pc.fill_null(grouped.column("bytes"), 0).to_pylist(),
                                  pc.fill_null(grouped.column("packets"), 0).to_pylist()):
        key = value if isinstance(value, datetime) else datetime(value.year, value.month, value.day)
        entry = sums.setdefault(as_utc(key), [0, 0])
        entry[0] += size
        entry[1] += count
    return sums


def _ledger_frame(rows: list[dict]):
    """The ledger rows beside their reconciliation totals, as the pandas frame the ``periods`` suite checks."""
    import pandas as pd

    columns = ["grain", "period_start", "bytes", "packets", "late_bytes", "late_packets", "sources_reporting",
               "sources_expected", "panes_active", "table_bytes", "table_packets", "source_bytes", "source_packets",
               "parts_bytes", "late_kept_bytes", "rows_differing", "panes_bytes", "panes_packets", "lost",
               "seconds_past_start", "sources_ahead"]
    records = []
    for r in rows:
        estimated, total = r.get("estimated_bytes") or 0, r.get("bytes") or 0
        start = r["period_start"]
        aligned = {"hour": start.replace(minute=0, second=0, microsecond=0),
                   "day": start.replace(hour=0, minute=0, second=0, microsecond=0),
                   "month": start.replace(day=1, hour=0, minute=0, second=0, microsecond=0)}.get(r["grain"], start)
        records.append({**{c: r.get(c) for c in columns},
                        "seconds_past_start": int((start - aligned).total_seconds()),
                        "estimated_share": estimated / total if total else (0 if not estimated else 2)})
    frame = pd.DataFrame.from_records(records, columns=columns)
    for name in columns[2:-1]:
        frame[name] = frame[name].astype("Int64")
    frame["sources_ahead"] = frame["sources_ahead"].astype("object")
    frame["estimated_share"] = pd.Series([r["estimated_share"] for r in records], dtype="float64")
    return frame


def _late_kept(settings: Settings, warehouse: Warehouse, hours: list[datetime]) -> dict[datetime, int | None]:
    """Σ late_packets bytes per hour, or None for hours whose late records may already have expired."""
    watermark = st.read_clock_state(warehouse).watermark
    bound = retention_floor(watermark, settings.late_retention) if watermark else None
    late = warehouse.table("late_packets").read_arrow(keys=hours,
                                                      columns=["hour", "bytes"])
    sums = _arrow_sums(late, "hour", counted=None)
    return {h: (None if bound is not None and h < bound else sums.get(h, [0, 0])[0]) for h in hours}


def _side_table_runs(warehouse: Warehouse, periods: list, step: str) -> list[tuple]:
    """The runs (``Validation.validate_together``) of ingest health over the hours that have late records or
    rejects: one per table over all of them."""
    runs = []
    for name in ("late_packets", "rejects"):
        present = set(warehouse.table(name).periods_with_files([start for _, start in periods]))
        if present:
            covered = [p for p in periods if p[1] in present]
            runs.append((name, warehouse.table(name).read(keys=sorted(present)), covered, f"{name}.{step}"))
    return runs


def _ledger_row(grain: str, start: datetime, totals: tuple[int, int], late: tuple[int, int],
                completeness: tuple[int, int, int], closed_at: datetime | None, restated: str | None,
                lost: int = 0, estimated_bytes: int = 0) -> dict:
    """A period's ledger row (DESIGN §6), its verdict still to be set from its checks (``_judge``).

    ``totals`` are the (bytes, packets) of the period's final rows as stored, ``late`` its late
    (bytes, packets) so far, ``completeness`` (sources reporting, sources expected, panes active);
    ``lost`` the export sequence units flow sources lost, ``estimated_bytes`` the bytes estimated
    from sampled records (DESIGN §7a).
    """
    return {"grain": grain, "period_start": start, "bytes": totals[0], "packets": totals[1],
            "late_bytes": late[0], "late_packets": late[1], "sources_reporting": completeness[0],
            "sources_expected": completeness[1], "panes_active": completeness[2],
            "closed_at_watermark": closed_at, "dq_status": None, "restated": restated, "dq_note": None,
            "lost": lost, "estimated_bytes": estimated_bytes}


def _judge(check, rows: list[dict]) -> list[str]:
    """Set each ledger row's verdict from the checks; the messages of the failed ones."""
    failures = []
    for row in rows:
        row["dq_status"], row["dq_note"] = check.status(row["grain"], row["period_start"])
        if row["dq_status"] == "failed":
            failures.append(check.message(row["grain"], row["period_start"]))
    return failures


def _children_summary(ledger_rows: list[dict]) -> dict:
    return {
        "late_bytes": sum(r["late_bytes"] for r in ledger_rows),
        "late_packets": sum(r["late_packets"] for r in ledger_rows),
        "sources_expected": max((r["sources_expected"] for r in ledger_rows), default=0),
        "panes_active": sum(r["panes_active"] for r in ledger_rows),
        "lost": sum(r.get("lost") or 0 for r in ledger_rows),
        "estimated_bytes": sum(r.get("estimated_bytes") or 0 for r in ledger_rows),
    }


def _published(row: dict | None) -> bool:
    return row is not None and row["dq_status"] in PUBLISHED


def _recheck(check, rows: list[dict], grain: str) -> list[dict]:
    """Ledger rows to rewrite after a re-check: published periods that now fail a critical check.

    Accepted periods stay accepted (an operator looked at them); the failure is still recorded.
    """
    changed = []
    for row in rows:
        status, note = check.status(grain, row["period_start"])
        if status == "failed" and row["dq_status"] in ("passed", "warning"):
            changed.append({**row, "dq_status": "failed", "dq_note": f"re-check: {note}"})
    return changed


def _store(rows: list[dict]) -> list[dict]:
    """Ledger rows without the reconciliation columns (those are checked, not stored)."""

    names = columns("periods")
    return [{k: r.get(k) for k in names} for r in rows]


def _sources_between(warehouse: Warehouse, start: datetime, end: datetime) -> int:
    panes = warehouse.table("source_panes").read_arrow(
        key_min=start, key_max=end, columns=["source"])
    return len(set(panes.column("source").to_pylist()))
