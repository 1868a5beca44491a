"""Small driver-side state tables (clocks, batches, the ledger), read and written with Arrow.

These are tiny (a row per source, per batch, per closed period), so they never need a JVM:
``traffic status`` and the "nothing to do" checks answer in well under a second.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.compute as pc

from traffic.core.clock import ClockState
from traffic.core.periods import EPOCH, as_utc, period_end, month_start
from traffic.storage.warehouse import Warehouse
from traffic.storage.keys import cluster_key
from traffic.storage.schemas import arrow_schema

UTC = timezone.utc


def rows(table: pa.Table) -> list[dict]:
    """Arrow rows as dicts with timestamps in plain UTC.

    Timestamps are made from their microseconds: pyarrow builds each zone-aware value through
    the zone database, about three times slower, and the ledger has a row per closed hour.
    """
    return [dict(zip(table.column_names, values)) for values in zip(*map(_values, table.columns))]


def _values(column: pa.ChunkedArray) -> list:
    if not pa.types.is_timestamp(column.type):
        return column.to_pylist()
    micros = column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64()).to_pylist()
    return [None if v is None else EPOCH + timedelta(microseconds=v) for v in micros]


def read_clock_state(warehouse: Warehouse) -> ClockState:
    clocks = rows(warehouse.table("clocks").read_arrow())
    if not clocks:
        return ClockState()
    return ClockState(
        clocks={r["source"]: r["clock"] for r in clocks},
        last_batch={r["source"]: r["last_batch_id"] for r in clocks},
        watermark=clocks[0]["watermark"],
        first_hour=clocks[0]["first_hour"],
        # Written before marks existed: no mark (ClockState uses the source's own clock).
        seen_at={r["source"]: r["last_seen_at"] for r in clocks if r.get("last_seen_at") is not None},
        ahead={r["source"]: tuple(tuple(None if t is None else as_utc(t) for t in (s["after"], s["upto"]))
                                  for s in r["ahead_spans"])
               for r in clocks if r.get("ahead_spans")},
    )


def clock_table(state: ClockState) -> pa.Table:
    sources = sorted(state.clocks)
    return pa.table(
        {
            "source": sources,
            "clock": [state.clocks[s] for s in sources],
            "last_batch_id": [state.last_batch.get(s) for s in sources],
            "watermark": [state.watermark] * len(sources),
            "first_hour": [state.first_hour] * len(sources),
            "last_seen_at": [state.last_seen_at(s) for s in sources],
            "ahead_spans": [[{"after": a, "upto": u} for a, u in state.ahead.get(s, ())] or None for s in sources],
        },
        schema=arrow_schema("clocks"),
    )


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def state_to_json(state: ClockState) -> dict:
    return {
        "clocks": {s: c.isoformat() for s, c in state.clocks.items()},
        "last_batch": dict(state.last_batch),
        "watermark": _iso(state.watermark),
        "first_hour": _iso(state.first_hour),
        "seen_at": {s: c.isoformat() for s, c in state.seen_at.items()},
        "ahead": {s: [[_iso(a), _iso(u)] for a, u in spans] for s, spans in state.ahead.items()},
    }


def state_from_json(doc: dict) -> ClockState:
    """The state a batch plan recorded (a plan written before marks existed has none: see ``read_clock_state``)."""
    parse = datetime.fromisoformat
    return ClockState(
        clocks={s: parse(c) for s, c in doc["clocks"].items()},
        last_batch={s: int(b) for s, b in doc["last_batch"].items()},
        watermark=parse(doc["watermark"]) if doc["watermark"] else None,
        first_hour=parse(doc["first_hour"]) if doc["first_hour"] else None,
        seen_at={s: parse(c) for s, c in doc.get("seen_at", {}).items()},
        ahead={s: tuple((parse(a) if a else None, parse(u)) for a, u in spans)
               for s, spans in doc.get("ahead", {}).items()},
    )


def known_files(warehouse: Warehouse) -> list[dict]:
    """Every file earlier batches recorded, with its batch id."""
    table = warehouse.table("batches").read_arrow(columns=["batch_id", "files"])
    known = []
    for batch_id, files in zip(table.column("batch_id").to_pylist(), table.column("files").to_pylist()):
        for f in files or []:
            known.append({**f, "batch_id": batch_id})
    known.sort(key=lambda k: k["batch_id"])
    return known


def last_batch_id(warehouse: Warehouse) -> int:
    table = warehouse.table("batches").read_arrow(columns=["batch_id"])
    value = pc.max(table.column("batch_id")).as_py() if table.num_rows else None
    return value or 0


def watermark_history(warehouse: Warehouse) -> list[tuple[int, datetime]]:
    """(batch_id, watermark_after) of every batch, in order (for ``closed_at_watermark``)."""
    table = warehouse.table("batches").read_arrow(columns=["batch_id", "watermark_after"])
    pairs = [(b, as_utc(w)) for b, w in zip(table.column("batch_id").to_pylist(),
                                         table.column("watermark_after").to_pylist()) if w is not None]
    return sorted(pairs)


def closed_at(history: list[tuple[int, datetime]], period_end: datetime) -> datetime | None:
    """The watermark of the first batch that reached ``period_end`` (``history`` in batch order: W never
    moves back, so it is sorted by watermark too and a binary search finds it)."""
    index = bisect_left(history, period_end, key=lambda pair: pair[1])
    return history[index][1] if index < len(history) else None


def frozen_frontier(ledger: list[dict]) -> datetime | None:
    """The end of the frozen hours: hours freeze in order, so every hour from here on is still open."""
    hours = [r["period_start"] for r in ledger if r["grain"] == "hour"]
    return period_end(max(hours), "hour") if hours else None


#: The ledger columns that say which periods are closed and how they stand.
LEDGER_STATUS = ["grain", "period_start", "dq_status"]


def read_ledger(warehouse: Warehouse, grain: str | None = None, keys=None, key_min=None, key_max=None,
                columns: list[str] | None = None) -> list[dict]:
    """Ledger rows (optionally of one grain, pruned to month keys, only some columns: the ledger has a
    row per closed hour, and turning every column of all of them into Python grows with history)."""
    table = warehouse.table("periods").read_arrow(keys=keys, key_min=key_min, key_max=key_max, columns=columns)
    if grain is not None:
        table = table.filter(pc.equal(table.column("grain"), grain))
    return rows(table)


def write_ledger_rows(warehouse: Warehouse, changed: list[dict], txn=None, op: str = "ledger") -> bool:
    """Upsert ledger rows by (grain, period_start): replaces the month files they fall in, atomically."""
    if not changed:
        return False
    table = warehouse.table("periods")
    keys = sorted({cluster_key(month_start(r["period_start"]), "month") for r in changed})
    existing = rows(table.read_arrow(keys=keys))
    merged = {(r["grain"], r["period_start"]): r for r in existing}
    for r in changed:
        merged[(r["grain"], r["period_start"])] = r
    ordered = sorted(merged.values(), key=lambda r: (r["period_start"], r["grain"]))
    data = pa.Table.from_pylist(ordered, schema=table.arrow_schema)
    return table.replace(data, keys=keys, txn=txn, op=op)


def read_flow_states(warehouse: Warehouse, sources, waiting: bool = False) -> dict[str, dict]:
    """The flow telemetry state each of ``sources`` left (DESIGN §7a), as JSON documents; none if never seen.

    With ``waiting``, also the state of every other source that holds data waiting for its template
    (ingest expires it by the watermark even when its source sends nothing more).
    """
    wanted = set(sources)
    if (not wanted and not waiting) or not warehouse.table("flow_state").exists():
        return {}  # (a warehouse made before flow telemetry has no such table until its next ingest)
    table = warehouse.table("flow_state").read_arrow(columns=["source", "state"])
    states = {}
    for source, text in zip(table.column("source").to_pylist(), table.column("state").to_pylist()):
        if not text:
            continue
        doc = json.loads(text)
        if source in wanted or (waiting and _waiting_sets(doc)):
            states[source] = doc
    return states


def _waiting_sets(doc: dict) -> list[dict]:
    """The waiting data sets of a telemetry state document (``TelemetryState.to_json``: ``waiting`` is a list
    of sets, each with its receive time in µs and its body in hex)."""
    sets = doc.get("waiting") if isinstance(doc, dict) else None
    return sets if isinstance(sets, list) else []


def waiting_by_source(warehouse: Warehouse, every_source: bool = False) -> dict[str, dict]:
    """Per flow source with data waiting for its template (``every_source``: per flow source, 0 without):
    ``sets``, ``bytes`` (of the sets' records) and ``oldest`` (the receive time of the oldest set, UTC, or
    None). For ``traffic status`` and the metrics."""
    out = {}
    every = _all_flow_sources(warehouse) if every_source else ()
    for source, doc in read_flow_states(warehouse, every, waiting=True).items():
        sets = _waiting_sets(doc)
        received = [s["receive_ts"] for s in sets if isinstance(s.get("receive_ts"), int)]
        out[source] = {"sets": len(sets), "bytes": sum(len(s.get("body") or "") // 2 for s in sets),
                       "oldest": EPOCH + timedelta(microseconds=min(received)) if received else None}
    return out


def _all_flow_sources(warehouse: Warehouse) -> list[str]:
    if not warehouse.table("flow_state").exists():
        return []
    return warehouse.table("flow_state").read_arrow(columns=["source"]).column("source").to_pylist()


def write_flow_states(warehouse: Warehouse, states: dict[str, dict], batch_id: int, txn=None, op: str = "ingest"
                      ) -> bool:
    """Replace the states of these sources (the others stay), in one commit."""
    if not states:
        return False
    table = warehouse.table("flow_state")
    kept = [r for r in rows(table.read_arrow()) if r["source"] not in states]
    fresh = [{"source": s, "state": json.dumps(doc, sort_keys=True), "batch_id": batch_id}
             for s, doc in sorted(states.items())]
    return table.overwrite(pa.Table.from_pylist(kept + fresh, schema=table.arrow_schema), txn=txn, op=op)
