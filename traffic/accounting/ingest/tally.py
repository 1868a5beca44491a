"""What an ingest batch's records decide on the driver: counts and bytes by fate, the clocks after
it, flow telemetry the watermark expires or counts as lost, and whether its totals fit a ``batches`` row."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime

import pyarrow as pa

from traffic.accounting import batch_tasks as B
from traffic.accounting import parts
from traffic.accounting.ingest.batch import BatchRead, BatchTally
from traffic.core.clock import advance
from traffic.core.periods import from_micros, hour_floor, micros
from traffic.core.settings import Settings
from traffic.io.sequence_losses import close_gaps_by
from traffic.io.telemetry import TelemetryState, expire_waiting_by
from traffic.storage import state as st


def tally_batch(settings: Settings, plan: dict, summary: list[dict]) -> BatchTally:
    """Counts and bytes by fate, and the clocks the batch's records and ticks move (DESIGN §2)."""
    counts = {fate: sum(r["records"] for r in summary if r["fate"] == fate)
              for fate in (B.ON_TIME, B.LATE, B.TICK, B.LATE_TICK, B.REJECT, B.OUTSIDE)}
    # Packets are weights (a flow share stands for many, DESIGN §7a); records are rows.
    weights = {fate: sum(r["packets"] for r in summary if r["fate"] == fate) for fate in (B.ON_TIME, B.LATE)}
    volume = {fate: sum(r["bytes"] for r in summary if r["fate"] == fate) for fate in (B.ON_TIME, B.LATE)}
    batch_clocks: dict[str, datetime] = {}
    for r in summary:
        if r["fate"] not in (B.REJECT, B.OUTSIDE) and r["max_ts"] is not None:
            batch_clocks[r["source"]] = max(r["max_ts"], batch_clocks.get(r["source"], r["max_ts"]))
    on_time_hours = sorted({hour_floor(r["pane"]) for r in summary if r["fate"] == B.ON_TIME})
    before = st.state_from_json(plan["state_before"])
    after = advance(before, batch_clocks, plan["batch_id"], settings.allowed_lateness, settings.source_timeout,
                    on_time_hours[0] if on_time_hours else None, settings.source_lateness)
    return BatchTally(counts, weights, volume, on_time_hours, before, after, summary)


def _replays(plan: dict) -> bool:
    """A replay or restatement batch: it decodes with its own flow state and never writes the live one."""
    return plan.get("mode") in ("replay", "restate")


def expire_waiting(settings: Settings, plan: dict, read: BatchRead, tally: BatchTally) -> tuple[BatchRead, dict[str, dict]]:
    """The flow states this batch leaves, and ``read`` with what the watermark decided in them: waiting
    data as rejects, sequence gaps as losses.

    An ingest batch, with the watermark after it (DESIGN §7a), in the states its tasks left and in the
    journaled states of sources that sent nothing this batch: rejects the waiting sets the watermark
    has passed by ``template_wait`` (their template never arrived, ``expire_waiting_by``), and counts
    as lost the sequence gaps revealed a minute before the watermark or in an hour it has closed
    (``close_gaps_by``), so the freeze that follows this batch sees the losses of the hours it
    freezes. Both are written with the batch (rejects, ``source_panes``, the states): exactly once.
    A replay or restatement rejects every set its own decoding left waiting (the archive has no
    later file) and writes no state.
    """
    telemetry = st.rows(parts.read_parts(read.scratch, "telemetry", read.attempts))
    after = {r["source"]: json.loads(r["state"]) for r in telemetry}
    watermark = None if _replays(plan) or tally.after.watermark is None else micros(tally.after.watermark)
    if _replays(plan):
        watermark_us, journaled = _NEVER, {}
    else:
        watermark_us, journaled = watermark, {s: doc for s, doc in plan.get("flow_state", {}).items() if s not in after}
    template_wait_us = int(settings.template_wait.total_seconds() * 1_000_000)
    closed_before = None if watermark is None else micros(hour_floor(tally.after.watermark))
    expired, lost, states = [], [], {}
    for source, doc in sorted({**journaled, **after}.items()):
        state = TelemetryState.from_json(doc)
        rejects, kept = expire_waiting_by(state.waiting, newest_us=None, watermark_us=watermark_us,
                                          template_wait_us=template_wait_us, source=source)
        decided: dict[int, int] = {}
        if watermark is not None:
            close_gaps_by(state.streams, watermark, decided, closed_before_us=closed_before)
        if rejects.num_rows or decided:
            expired += [rejects] if rejects.num_rows else []
            lost += [{"source": source, "pane_start": from_micros(pane), "lost": units}
                     for pane, units in sorted(decided.items()) if units]
            doc = replace(state, waiting=kept).to_json()
        elif source in journaled:
            continue  # a source that sent nothing and had nothing decided: its state stays as it is
        states[source] = doc
    states = {} if _replays(plan) else states
    if not expired and not lost:
        return read, states
    rejects = pa.concat_tables(expired).select(parts.REJECT_ROWS.names).cast(parts.REJECT_ROWS) if expired else \
        parts.REJECT_ROWS.empty_table()
    rows = [{"fate": B.REJECT, "source": source, "pane": None, "records": count, "packets": 0, "bytes": 0,
             "max_ts": None} for source, count in sorted(_count_by(rejects.column("source").to_pylist()).items())]
    read = replace(read, changed_rejects=pa.concat_tables([read.changed_rejects, rejects]),
                   summary=read.summary + rows if rows else read.summary, lost=read.lost + lost)
    return read, states


#: Before any receive time: a replay's waiting data all expires when its files end.
_NEVER = 1 << 62


def _count_by(values: list) -> dict:
    counts: dict = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


#: The largest total a ``batches`` row holds (its counters are 64-bit).
_INT64_MAX = (1 << 63) - 1


def totals_fit(batch_id: int, tally: BatchTally) -> None:
    """The batch's totals (packets and bytes, on time and late) fit the ``batches`` row's 64-bit
    counters, or ``SumOverflow`` says so in one line, naming the batch and the source with the largest
    total: before, ``_commit`` raised OverflowError ("Python int too large to convert to C long")
    after every other write, and so did each retry.

    Each flow record is bounded (``io.telemetry``: at most what a ``max_flow_bps`` link carries), so
    this takes records that together claim more than a link could: 67 of 8 days at the full 1.6 Tb/s
    (2**63 bytes / 1.4 × 10**17), or 5,604 for packets, in one batch.
    """
    for fate, label in ((B.ON_TIME, "on time"), (B.LATE, "late")):
        for what, total in (("packets", tally.weights[fate]), ("bytes", tally.volume[fate])):
            if total <= _INT64_MAX:
                continue
            by_source: dict[str, int] = {}
            for r in tally.summary:
                if r["fate"] == fate:
                    by_source[r["source"]] = by_source.get(r["source"], 0) + (r[what] or 0)
            source, most = max(by_source.items(), key=lambda item: item[1])
            raise parts.SumOverflow(
                f"batch {batch_id}: its {what} {label} add up to {total:,}, past 2**63 − 1 (the batches row's "
                f"64-bit total), so it was not committed; source {source} has the most ({most:,}): its flow "
                f"records claim more than its links carry. Set max_flow_bps to their speed, or move its files "
                f"out of the inbox, and run the batch again")
