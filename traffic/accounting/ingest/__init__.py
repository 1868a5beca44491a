"""Micro-batch ingest: new inbox files → packets, late_packets, rejects, open hours and panes, clocks.

One batch is planned on the driver without Spark (an empty inbox never starts a JVM),
journaled, then executed by Spark. Every table write is idempotent by the batch id
(Delta app transaction ``ingest``/``batch_id``), and the ``batches`` row is written last,
so a batch killed at any point and run again ends exactly as an uninterrupted one.

Flow telemetry's data waiting for its template (DESIGN §7a) expires by the watermark too: once the
watermark after a batch has passed a waiting set's receive time plus ``template_wait``, that batch
rejects the set ("its template never arrived") and writes the source's state without it, even when
the source sent nothing in the batch (its state is journaled with the plan, so a batch run again
rejects the same sets, once). Sequence gaps are decided the same way (DESIGN §7a "Loss"): once the
watermark after a batch lies a minute past the datagram that revealed a gap, or has closed the gap's
hour, that batch counts what is still missing as lost in the gap's pane (``source_panes``), so the
freeze that follows sees every loss of the hours it freezes. A replay or restatement decodes with its own state and never writes
the live one (``traffic.accounting.replay``); what of the archive still waits when it ends is rejected.

This module plans a batch, runs its steps in order and commits it; the steps live beside it:
``read`` (the parse tasks), ``tally`` (counts, clocks, what the watermark decides of flow
telemetry) and ``writes`` (raw detail, hours, panes, late counters).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

import pyarrow as pa

from traffic.accounting import batch_tasks as B
from traffic.accounting import parts
from traffic.accounting.ingest.batch import APP, BatchRead, BatchTally
from traffic.accounting.ingest.read import cutting, read_batch
from traffic.accounting.ingest.tally import expire_waiting, tally_batch, totals_fit
from traffic.accounting.ingest.writes import write_hours, write_raw
from traffic.core.settings import Settings
from traffic.io import inbox as inbox_mod
from traffic.io.readers import FLOWS
from traffic.io.telemetry import TelemetryState
from traffic.runtime import jvm
from traffic.storage import state as st
from traffic.storage.warehouse import Warehouse

log = logging.getLogger(__name__)
UTC = timezone.utc


@dataclass
class BatchResult:
    """What one ingest batch did (printed by the CLI, returned to Airflow)."""

    batch_id: int | None = None
    files: int = 0
    duplicate_files: int = 0
    records_read: int = 0
    records_skipped: int = 0
    packets_on_time: int = 0
    packets_late: int = 0
    records_rejected: int = 0
    ticks: int = 0
    bytes_on_time: int = 0
    bytes_late: int = 0
    watermark_before: datetime | None = None
    watermark_after: datetime | None = None
    resumed: bool = False
    skipped: dict = field(default_factory=dict)  # flow telemetry that is not traffic, by kind
    seconds: dict = field(default_factory=dict)

    @property
    def nothing_to_do(self) -> bool:
        return self.batch_id is None


def plan_batch(settings: Settings, warehouse: Warehouse) -> dict | None:
    """The next batch's plan (files, id, clocks before), or None when the inbox has nothing new."""
    found = inbox_mod.scan(settings.inbox, settings.min_file_age.total_seconds())
    planned = inbox_mod.plan_files(found, st.known_files(warehouse), cutting(settings))
    for f in planned:
        if f.status in (inbox_mod.SKIPPED, inbox_mod.UNREADABLE):
            log.warning("inbox: %s %s: %s", f.status, f.name, f.note)
    if not planned:
        return None
    before = st.read_clock_state(warehouse)
    telemetry = {f.source for f in planned if f.format == FLOWS and f.status in inbox_mod.TO_READ}
    return {
        "batch_id": st.last_batch_id(warehouse) + 1,
        "started_at": datetime.now(UTC).isoformat(),
        "now": settings.processing_now().isoformat(),
        "state_before": st.state_to_json(before),
        # Journaled with the plan, so a batch run again decodes with the templates it first had (and
        # expires the same waiting data, and decides the same gaps, of sources that sent nothing this time).
        "flow_state": _flow_states_to_journal(warehouse, telemetry),
        "files": [asdict(f) for f in planned],
    }


def _flow_states_to_journal(warehouse: Warehouse, telemetry: set[str]) -> dict[str, dict]:
    """The flow states a batch needs: of the sources with files in it, and of every source holding data
    waiting for its template or a sequence gap not yet decided (the watermark decides both)."""
    every = st.read_flow_states(warehouse, _flow_sources(warehouse), waiting=True)
    return {source: doc for source, doc in every.items() if source in telemetry or _undecided(doc)}


def _flow_sources(warehouse: Warehouse) -> list[str]:
    table = warehouse.table("flow_state")
    return table.read_arrow(columns=["source"]).column("source").to_pylist() if table.exists() else []


def _undecided(doc: dict) -> bool:
    """Whether a flow state holds something the watermark decides: waiting data or an open sequence gap."""
    state = TelemetryState.from_json(doc)
    return bool(state.waiting.sets) or any(stream.gaps for stream in state.streams.values())


def big_batch(plan: dict) -> str | None:
    """Why this batch is big work for the JVM about to start (``spark_jit = auto`` picks its JIT by it), or None."""
    size = sum(f["size"] - f["start"] for f in plan["files"] if f["status"] in inbox_mod.TO_READ)
    return f"a batch of {size / 2**20:,.0f} MiB" if size > jvm.QUICK_MAX_BYTES else None


def run_batch(warehouse: Warehouse, plan: dict, progress=print) -> BatchResult:
    """Execute a planned batch with Spark; every write is skipped if this batch already made it.

    Four steps: read (Spark runs the parse tasks, ``traffic.accounting.batch_tasks``, which write raw
    detail straight to staged parquet), tally (the driver sums the tasks' small partial totals with
    Arrow and moves the clocks), write (raw detail, then the open hours and panes, or a restated
    range's final ones) and commit (clocks, then the ``batches`` row, last).
    """
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    read = read_batch(warehouse, plan, progress)
    timings["read_parse"] = time.perf_counter() - clock
    tally = tally_batch(warehouse.settings, plan, read.summary)
    read, flow_states = expire_waiting(warehouse.settings, plan, read, tally)
    if read.summary is not tally.summary:
        tally = tally_batch(warehouse.settings, plan, read.summary)  # (rejects move no clock: only the counts change)
    totals_fit(plan["batch_id"], tally)  # (before any write: a lower max_flow_bps then applies to the retry)
    clock = time.perf_counter()
    write_raw(warehouse, plan, read, tally)
    timings["write_raw"] = time.perf_counter() - clock
    clock = time.perf_counter()
    write_hours(warehouse, plan, read, tally)
    timings["write_hours"] = time.perf_counter() - clock
    clock = time.perf_counter()
    result = _commit(warehouse, plan, read, tally, flow_states)
    timings["commit_state"] = time.perf_counter() - clock
    warehouse.drop_scratch(read.scratch)
    result.seconds = timings
    return result


def _commit(warehouse: Warehouse, plan: dict, read: BatchRead, tally: BatchTally, flow_states: dict[str, dict]
            ) -> BatchResult:
    """Write the flow states and clocks, then the ``batches`` row: the batch is done once that row exists."""
    txn, counts, volume = (APP, plan["batch_id"]), tally.counts, tally.volume
    telemetry = st.rows(parts.read_parts(read.scratch, "telemetry", read.attempts))
    skipped: dict[str, int] = {}
    for row in telemetry:
        for kind, count in json.loads(row["skipped"]).items():
            skipped[kind] = skipped.get(kind, 0) + count
    st.write_flow_states(warehouse, flow_states, plan["batch_id"], txn=txn)
    warehouse.table("clocks").overwrite(st.clock_table(tally.after), txn=txn, op="ingest")
    files = read.files
    time_range = tuple(datetime.fromisoformat(t) for t in plan["range"]) if plan.get("range") else None
    result = BatchResult(
        batch_id=plan["batch_id"],
        files=sum(1 for f in files if f["status"] != inbox_mod.DUPLICATE),
        duplicate_files=sum(1 for f in files if f["status"] == inbox_mod.DUPLICATE),
        records_read=sum(counts.values()) - counts[B.OUTSIDE],
        records_skipped=counts[B.OUTSIDE],
        packets_on_time=tally.weights[B.ON_TIME],
        packets_late=tally.weights[B.LATE],
        records_rejected=counts[B.REJECT],
        ticks=counts[B.TICK] + counts[B.LATE_TICK],
        bytes_on_time=volume[B.ON_TIME],
        bytes_late=volume[B.LATE],
        watermark_before=tally.before.watermark,
        watermark_after=tally.after.watermark,
        skipped=skipped,
    )
    batch_row = {
        "batch_id": plan["batch_id"],
        "mode": plan.get("mode", "ingest"),
        "records_skipped": counts[B.OUTSIDE],
        "bytes_withdrawn": plan.get("bytes_withdrawn", 0),
        "note": plan.get("restate"),
        "skipped": json.dumps(skipped, sort_keys=True) if skipped else None,
        "started_at": datetime.fromisoformat(plan["started_at"]),
        "committed_at": datetime.now(UTC),
        "files": [{"name": f["name"], "source": f["source"], "sha256": f["sha256"], "size": f["size"],
                   "status": f["status"], "mtime_ns": f["mtime_ns"], "start": f["start"],
                   "range_from": time_range[0] if time_range else None,
                   "range_to": time_range[1] if time_range else None} for f in files],
        **{k: getattr(result, k) for k in ("records_read", "packets_on_time", "packets_late", "records_rejected",
                                           "ticks", "bytes_on_time", "bytes_late", "duplicate_files",
                                           "watermark_before", "watermark_after")},
    }
    batches = warehouse.table("batches")
    batches.append(pa.Table.from_pylist([batch_row], schema=batches.arrow_schema), txn=txn, op="ingest")
    return result
