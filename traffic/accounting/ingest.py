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
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from traffic.accounting import batch_tasks as B
from traffic.accounting import panes as P
from traffic.accounting import parts
from traffic.accounting.batch_tasks import CHANGED_SINCE_PLANNED, LATE, ON_TIME, OUTCOME_DDL, TICK, VANISHED, task_function
from traffic.accounting.parts import file_part
from traffic.core.clock import ClockState, advance
from traffic.core.periods import from_micros, future_limit, history_floor, hour_floor, hours_between, micros, month_start
from traffic.core.settings import Settings
from traffic.io import inbox as inbox_mod
from traffic.io.readers import FLOWS
from traffic.io.telemetry import TelemetryState, close_gaps_by, expire_waiting_by
from traffic.runtime import jvm
from traffic.runtime.spark import task_slots
from traffic.storage import state as st
from traffic.storage.staging import DRIVER_THREADS, Staged, discard_staged, write_staged
from traffic.storage.warehouse import Warehouse

log = logging.getLogger(__name__)
UTC = timezone.utc
APP = "ingest"
_RAW = ("packets", "late_packets", "rejects")


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


def announce_work(plan: dict) -> None:
    """Tell the JVM about to start whether this batch is big (``spark_jit = auto`` picks its JIT by it)."""
    size = sum(f["size"] - f["start"] for f in plan["files"] if f["status"] in inbox_mod.TO_READ)
    if size > jvm.QUICK_MAX_BYTES:
        jvm.expect_big_job(f"a batch of {size / 2**20:,.0f} MiB")


def cutting(settings: Settings) -> inbox_mod.Cutting:
    """How this warehouse's batches cut files into parse tasks (``inbox.survey``)."""
    return inbox_mod.Cutting(split_bytes=settings.split_bytes, parallelism=settings.shuffle_partitions,
                             slots=task_slots(settings),
                             partial_line_grace=settings.partial_line_grace.total_seconds(),
                             telemetry_sources=frozenset(settings.telemetry_sources))


def _chunks(plan: dict, how: inbox_mod.Cutting) -> list[dict]:
    """One row per parse task: a planned piece of a file to read (``inbox.survey`` cut it when planned).

    A journal written before pieces were planned has files without them: they are surveyed now,
    and a file whose content is no longer the planned sha256 gets the ``problem`` of a changed file.
    """

    rows = []
    telemetry: dict[str, list[dict]] = {}
    for f in plan["files"]:
        if f["status"] not in inbox_mod.TO_READ:
            continue
        if f["format"] == FLOWS:
            telemetry.setdefault(f["source"], []).append(f)
            continue
        problem = None
        if "pieces" not in f:
            try:
                surveyed, _ = inbox_mod.survey(inbox_mod.InboxFile(**{**f, "pieces": ()}), how)
                f = {**f, **asdict(surveyed), "sha256": f["sha256"], "status": f["status"], "note": f["note"]}
                problem = None if surveyed.sha256 == f["sha256"] else CHANGED_SINCE_PLANNED
            except OSError:
                problem = VANISHED
        pieces = f["pieces"] or [(f["start"], f["size"], f["sha256"])]
        for start, end, digest in pieces:
            rows.append({"chunk": len(rows), "path": f["path"], "source": f["source"], "name": f["name"],
                         "format": f["format"], "start": start, "end": end, "sha256": digest,
                         "header": f.get("header", ""), "file_end": f["size"], "problem": problem})
    # A source's telemetry files are one task, read in the order they were written: a template sent
    # in one file decodes the data of the next (DESIGN §7a). All of them count, or none.
    for source, files in sorted(telemetry.items()):
        files = sorted(files, key=lambda f: f["name"])
        rows.append({"chunk": len(rows), "path": files[0]["path"], "source": source, "name": files[0]["name"],
                     "format": FLOWS, "start": 0, "end": 0, "sha256": "", "header": "", "file_end": 0,
                     "problem": None, "files": [{k: f[k] for k in ("path", "name", "start", "size", "sha256")}
                                                for f in files]})
    return rows


def _run_tasks(spark, chunk_rows: list[dict], rules) -> dict[int, dict]:
    """Run one parse task per chunk (Spark schedules them); returns each chunk's outcome row.

    The tasks are ``spark.range`` with one id per partition, the id indexing ``chunk_rows``: no
    shuffle stage to spread a small local table over tasks (0.2-0.4 s less per batch).
    """

    n = len(chunk_rows)
    frame = spark.range(0, n, 1, n).mapInArrow(task_function(rules, chunk_rows), OUTCOME_DDL)
    return {r["chunk"]: r.asDict() for r in frame.collect()}


def _parse(spark, chunk_rows: list[dict], rules, staged: dict, max_history, progress
           ) -> tuple[dict[int, dict], dict[str, str]]:
    """Run the parse tasks, then again those holding records older than the history bound allows.

    Returns each chunk's outcome, and {path: problem} of the files left out whole because a chunk
    of theirs could not be read as planned.
    """

    outcomes = {row["chunk"]: {"chunk": row["chunk"], "attempt": 0, "newest": None, "oldest": None,
                               "problem": row["problem"]} for row in chunk_rows if row["problem"]}
    runnable = [row for row in chunk_rows if not row["problem"]]
    outcomes.update(_run_tasks(spark, runnable, rules) if runnable else {})
    unread = _leave_out_unread(outcomes, chunk_rows, staged)
    newest_us = max((o["newest"] for o in outcomes.values() if o["newest"] is not None), default=None)
    newest = from_micros(newest_us) if newest_us is not None else None
    floor = history_floor(newest, max_history)
    redo = sorted(c for c, o in outcomes.items() if floor is not None and o["oldest"] is not None
                  and o["oldest"] < micros(floor))
    if redo:
        progress(f"batch {rules.batch_id}: {len(redo)} parse task(s) hold records more than max_history before "
                 f"the batch's newest ({newest.isoformat()}); judging them again")
        for chunk in redo:
            for name in ("packets", "late_packets"):
                if staged[name] is not None:
                    discard_staged(staged[name], parts.file_part(chunk, 0))
        outcomes.update(_run_tasks(spark, [chunk_rows[c] for c in redo], replace(rules, history_floor=floor,
                                                                                 attempt=1)))
        unread.update(_leave_out_unread(outcomes, chunk_rows, staged))
    return outcomes, unread


_UNREAD_STATUS = {"vanished": inbox_mod.VANISHED, "changed": inbox_mod.RETRY, "unreadable": inbox_mod.UNREADABLE}
_RECORDED_AS_REJECT = (inbox_mod.CHANGED, inbox_mod.SKIPPED, inbox_mod.UNREADABLE, inbox_mod.VANISHED,
                       inbox_mod.RETRY)


def _leave_out_unread(outcomes: dict[int, dict], chunk_rows: list[dict], staged: dict) -> dict[str, str]:
    """Leave out every file one of whose chunks could not be read as planned: all of it or none counts.

    Returns {path: problem}; the file's other chunks lose their outcome and their staged files.
    """

    unread = {path: o["problem"] for c, o in outcomes.items() if o.get("problem") for path in _paths(chunk_rows[c])}
    for chunk in [c for c in outcomes if any(path in unread for path in _paths(chunk_rows[c]))]:
        for handle in (staged["packets"], staged["late_packets"]):
            if handle is not None:
                discard_staged(handle, file_part(chunk, outcomes[chunk]["attempt"]))
        del outcomes[chunk]
    return unread


def _paths(chunk_row: dict) -> list[str]:
    """The files a chunk reads: a piece of one, or all of a source's telemetry files."""
    return [f["path"] for f in chunk_row["files"]] if chunk_row.get("files") else [chunk_row["path"]]


def _unread_note(f: dict, problem: str) -> str:
    """The reason recorded for a planned file that could not be read as planned."""
    if problem.startswith("changed"):
        return (f"file changed after its batch was planned (planned {f['size'] - f['start']} bytes, sha256 "
                f"{f['sha256'][:12]}…): nothing of it was counted; the next batch reads it as it is then")
    if problem.startswith("vanished"):
        return "file vanished before its batch read it: nothing of it was counted"
    return f"cannot be read ({problem.split(': ', 1)[-1]}): nothing of it was counted; it is read once it can be"


_DONE = "tasks-done.json"


def _keep_tasks_done(scratch: Path, outcomes: dict[int, dict], unread: dict[str, str], staged: dict) -> None:
    """Record the finished tasks' outcome beside their parts, before the batch's first commit."""
    doc = {"outcomes": list(outcomes.values()), "unread": unread,
           "staged": {name: asdict(handle) if handle is not None else None for name, handle in staged.items()}}
    tmp = scratch / (_DONE + ".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(scratch / _DONE)


def _tasks_done(warehouse: Warehouse, batch_id: int) -> dict | None:
    """The first run's task outcome of a batch that has committed something, or None (run the tasks)."""

    scratch = warehouse.scratch(f"batch-{batch_id}", fresh=False)
    try:
        doc = json.loads((scratch / _DONE).read_text())
    except (OSError, ValueError):
        return None
    return {"scratch": scratch, "outcomes": {o["chunk"]: o for o in doc["outcomes"]}, "unread": doc["unread"],
            "staged": {name: Staged(**value) if value else None for name, value in doc["staged"].items()}}


def run_batch(warehouse: Warehouse, plan: dict, progress=print) -> BatchResult:
    """Execute a planned batch with Spark; every write is skipped if this batch already made it.

    Four steps: read (Spark runs the parse tasks, ``traffic.accounting.batch_tasks``, which write raw
    detail straight to staged parquet), tally (the driver sums the tasks' small partial totals with
    Arrow and moves the clocks), write (raw detail, then the open hours and panes, or a restated
    range's final ones) and commit (clocks, then the ``batches`` row, last).
    """
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    read = _read(warehouse, plan, progress)
    timings["read_parse"] = time.perf_counter() - clock
    tally = _tally(warehouse.settings, plan, read.summary)
    read, flow_states = _expire_waiting(warehouse.settings, plan, read, tally)
    if read.summary is not tally.summary:
        tally = _tally(warehouse.settings, plan, read.summary)  # (rejects move no clock: only the counts change)
    _totals_fit(plan["batch_id"], tally)  # (before any write: a lower max_flow_bps then applies to the retry)
    clock = time.perf_counter()
    _write_raw(warehouse, plan, read, tally)
    timings["write_raw"] = time.perf_counter() - clock
    clock = time.perf_counter()
    _write_hours(warehouse, plan, read, tally)
    timings["write_hours"] = time.perf_counter() - clock
    clock = time.perf_counter()
    result = _commit(warehouse, plan, read, tally, flow_states)
    timings["commit_state"] = time.perf_counter() - clock
    warehouse.drop_scratch(read.scratch)
    result.seconds = timings
    return result


@dataclass
class _Read:
    """What a batch's parse tasks left: their parts and staged raw files, and the files as they were read."""

    scratch: Path
    attempts: dict[int, int]  # chunk → the attempt whose parts count
    staged: dict[str, Staged | None]  # raw table → staged files (None: already committed)
    files: list[dict]  # the plan's files, with what reading them found
    changed_rejects: pa.Table  # rejects made on the driver: a planned file not read, waiting data expired
    summary: list[dict]  # per (fate, source, pane): records, bytes, newest time
    lost: list[dict] = field(default_factory=list)  # sequence gaps the watermark decided on the driver


@dataclass
class _Tally:
    """A batch's counts by fate, and the clocks after it."""

    counts: dict[str, int]  # rows
    weights: dict[str, int]  # packets (on time, late)
    volume: dict[str, int]  # bytes (on time, late)
    on_time_hours: list[datetime]
    before: ClockState
    after: ClockState
    summary: list[dict] = field(default_factory=list)  # what it was computed from


def _restated_hours(plan: dict) -> list[datetime]:
    """The hours a restatement replaces (none for an ordinary batch)."""
    if not plan.get("restate"):
        return []
    start, end = (datetime.fromisoformat(t) for t in plan["range"])
    return hours_between(hour_floor(start), end)


def _read(warehouse: Warehouse, plan: dict, progress) -> _Read:
    """Run the batch's parse tasks, or, resumed after its first commit, take the first run's outcome."""
    settings, batch_id = warehouse.settings, plan["batch_id"]
    files = plan["files"]
    chunk_rows = _chunks(plan, cutting(settings))
    progress(f"batch {batch_id}: {len(chunk_rows)} parse task(s) over "
             f"{sum(1 for f in files if f['status'] in inbox_mod.TO_READ)} file(s)")
    if not settings.local_networks and any(row["format"] == "capture" for row in chunk_rows):
        progress("warning: local_networks is empty, so every captured packet is neither-local and rejected "
                 "(set TRAFFIC_LOCAL_NETWORKS, e.g. 10.0.0.0/8,2001:db8::/32)")
    raw = {name: warehouse.table(name) for name in _RAW}
    committed = {name: (table.txn_version(APP) or -1) >= batch_id for name, table in raw.items()}
    done = _tasks_done(warehouse, batch_id) if any(committed.values()) else None
    if done is not None:
        # Resumed after its first commit: the tasks' outcome, parts and staged files are the first
        # run's, so the batch ends as planned whatever has happened to its files since.
        scratch, outcomes, unread = done["scratch"], done["outcomes"], done["unread"]
        staged = {name: None if committed[name] else done["staged"][name] for name in raw}
    else:
        # A table this batch already committed to (a journal from before outcomes were kept) gets no staged files.
        staged = {name: None if committed[name] else table.staging() for name, table in raw.items()}
        scratch = warehouse.scratch(f"batch-{batch_id}")
        time_range = tuple(datetime.fromisoformat(t) for t in plan["range"]) if plan.get("range") else None
        # The future bound uses the machine clock recorded in the plan; the history bound uses the
        # newest record of the batch that passed the future bound. A restatement replaces a frozen
        # range from the archive: its records are the range's new truth, never late.
        before = st.state_from_json(plan["state_before"])
        rules = B.Rules(batch_id=batch_id, watermark_before=None if plan.get("restate") else before.watermark,
                        future_limit=future_limit(datetime.fromisoformat(plan["now"]), settings.max_future_skew),
                        history_floor=None, time_range=time_range,
                        packets=staged["packets"], late_packets=staged["late_packets"], scratch=str(scratch),
                        settings_doc={"local_networks": list(settings.local_networks),
                                      "keep_transit": settings.keep_transit,
                                      "sampling_rates": dict(settings.sampling_rates),
                                      "template_wait": settings.template_wait.total_seconds(),
                                      "max_flow_duration": settings.max_flow_duration.total_seconds(),
                                      "max_flow_bps": settings.max_flow_bps},
                        flow_states=plan.get("flow_state", {}),
                        mapping=P.Mapping.of(settings.accounts_file))
        outcomes, unread = _parse(warehouse.spark, chunk_rows, rules, staged, settings.max_history, progress)
        _keep_tasks_done(scratch, outcomes, unread, staged)
    attempts = {chunk: o["attempt"] for chunk, o in outcomes.items()}
    files = [{**f, "status": _UNREAD_STATUS[unread[f["path"]].split(":")[0]], "note": _unread_note(f, unread[f["path"]])}
             if f["status"] in inbox_mod.TO_READ and f["path"] in unread else f for f in files]
    changed = [f for f in files if f["status"] in _RECORDED_AS_REJECT]
    # A file that changed under its name is one reject: its old rows are counted, its new ones cannot be.
    # So is every inbox entry not read (not a regular file, unreadable, vanished, changed while read): by name only.
    changed_rejects = pa.table({
        "source": [f["source"] for f in changed], "input_file": [f["name"] for f in changed],
        "record": [f"file {f['name']}" for f in changed], "reason": [f["note"] for f in changed],
        "ts": pa.nulls(len(changed), parts.REJECT_ROWS.field("ts").type)}, schema=parts.REJECT_ROWS)
    changed_summary = pa.table({
        "fate": [B.REJECT] * len(changed), "source": changed_rejects.column("source"),
        "pane": changed_rejects.column("ts"), "records": pa.array([1] * len(changed), pa.int64()),
        "packets": pa.array([0] * len(changed), pa.int64()), "bytes": pa.array([0] * len(changed), pa.int64()),
        "max_ts": changed_rejects.column("ts")},
        schema=parts.SUMMARY)
    summary = st.rows(parts.combine_summary(pa.concat_tables([parts.read_parts(str(scratch), "summary", attempts),
                                                              changed_summary])))
    return _Read(scratch, attempts, staged, files, changed_rejects, summary)


def _tally(settings: Settings, plan: dict, summary: list[dict]) -> _Tally:
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
    return _Tally(counts, weights, volume, on_time_hours, before, after, summary)


def _write_raw(warehouse: Warehouse, plan: dict, read: _Read, tally: _Tally) -> None:
    """Commit the staged raw detail: packets (or a restated range's), late packets, rejects."""
    txn, restated = (APP, plan["batch_id"]), _restated_hours(plan)
    packets, late, rejects = (warehouse.table(name) for name in _RAW)
    if restated:
        packets.replace(read.staged["packets"], keys=restated, txn=txn, op="restate")
        late.delete_keys(restated, txn=txn, op="restate")
    elif tally.counts[B.ON_TIME]:
        packets.append(read.staged["packets"], txn=txn, op="ingest")
    if tally.counts[B.LATE]:
        late.append(read.staged["late_packets"], txn=txn, op="ingest")
    if tally.counts[B.REJECT] and read.staged["rejects"] is not None:
        # Rejects are filed under the hour the watermark reached, known only now: written here, a chunk at a time.
        reject_hour = hour_floor(tally.after.watermark) if tally.after.watermark else None
        for chunk, attempt in [*sorted(read.attempts.items()), (None, None)]:
            rows = (parts.read_parts(str(read.scratch), "rejects", {chunk: attempt}) if chunk is not None
                    else read.changed_rejects)
            rows = rows.append_column("batch_id", pa.repeat(pa.scalar(plan["batch_id"], pa.int64()), rows.num_rows)) \
                       .append_column("hour", pa.repeat(pa.scalar(reject_hour, parts.REJECT_ROWS.field("ts").type),
                                                        rows.num_rows))
            write_staged(rows, read.staged["rejects"],
                         parts.file_part(chunk, attempt) if chunk is not None else "part-changed")
        rejects.append(read.staged["rejects"], txn=txn, op="ingest")


def _write_hours(warehouse: Warehouse, plan: dict, read: _Read, tally: _Tally) -> None:
    """Add the batch's totals to its hours' open rows and panes (a restatement replaces its range's
    final ones), then to the sources' panes and the late counters of closed periods."""
    import pyarrow.compute as pc

    txn, restated = (APP, plan["batch_id"]), _restated_hours(plan)
    hourly_parts = parts.read_parts(str(read.scratch), "hourly", read.attempts)
    account_parts = _account_parts(warehouse, read)
    hourly, panes = warehouse.table("hourly"), warehouse.table("panes")
    if restated:
        hourly.replace(parts.sum_hourly(hourly_parts, "final", DRIVER_THREADS), keys=restated, txn=txn, op="restate")
        panes.replace(P.sum_pane_rows(account_parts, "final"), keys=restated, txn=txn, op="restate")
    elif tally.on_time_hours:
        hours = tally.on_time_hours
        is_open = pc.field("status") == "open"
        existing = hourly.read_arrow(keys=hours, filter=is_open).select(parts.HOURLY_PARTS.names)
        hourly.replace(parts.sum_hourly(pa.concat_tables([hourly_parts, existing.cast(parts.HOURLY_PARTS)]), "open",
                                        DRIVER_THREADS),
                       keys=hours, txn=txn, op="ingest")
        # The panes of the same hours, kept the same way (their freeze recomputes them from raw detail).
        open_panes = panes.read_arrow(keys=hours, filter=is_open).select(parts.ACCOUNT_PARTS.names)
        panes.replace(P.sum_pane_rows(pa.concat_tables([account_parts, open_panes.cast(parts.ACCOUNT_PARTS)]), "open"),
                      keys=hours, txn=txn, op="ingest")
    lost = st.rows(parts.read_parts(str(read.scratch), "lost", read.attempts)) + read.lost
    _write_panes(warehouse, read.summary, txn, replace_hours=restated, lost=lost)
    _grow_late_counters(warehouse, read.summary, txn)


def _account_parts(warehouse: Warehouse, read: _Read) -> pa.Table:
    """The tasks' pane totals per account. A batch whose tasks ran under an earlier version (interrupted
    after its first commit, then finished after an upgrade) left per-address parts: attributed here."""
    scratch = str(read.scratch)
    if read.attempts and not parts.has_parts(scratch, "accounts", read.attempts) \
            and parts.has_parts(scratch, "panes", read.attempts):
        return P.account_parts_of_addresses(parts.read_parts(scratch, "panes", read.attempts),
                                            P.Mapping.of(warehouse.settings.accounts_file))
    return parts.read_parts(scratch, "accounts", read.attempts)


def _replays(plan: dict) -> bool:
    """A replay or restatement batch: it decodes with its own flow state and never writes the live one."""
    return plan.get("mode") in ("replay", "restate")


def _expire_waiting(settings: Settings, plan: dict, read: _Read, tally: _Tally) -> tuple[_Read, dict[str, dict]]:
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
    telemetry = st.rows(parts.read_parts(str(read.scratch), "telemetry", read.attempts))
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


def _totals_fit(batch_id: int, tally: _Tally) -> None:
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


def _commit(warehouse: Warehouse, plan: dict, read: _Read, tally: _Tally, flow_states: dict[str, dict]
            ) -> BatchResult:
    """Write the flow states and clocks, then the ``batches`` row: the batch is done once that row exists."""
    txn, counts, volume = (APP, plan["batch_id"]), tally.counts, tally.volume
    telemetry = st.rows(parts.read_parts(str(read.scratch), "telemetry", read.attempts))
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


def _write_panes(warehouse: Warehouse, summary: list[dict], txn, replace_hours: list[datetime] = (),
                 lost: list[dict] = ()) -> None:
    """Add on-time packets, ticks and lost export datagrams to ``source_panes`` (per source and 5-minute pane).

    With ``replace_hours`` (a restatement) the panes of those hours are replaced, not added to.
    """

    fresh: dict[tuple[str, datetime], dict] = {}
    for r in summary:
        if r["fate"] not in (ON_TIME, TICK):
            continue
        row = fresh.setdefault((r["source"], r["pane"]), {"source": r["source"], "pane_start": r["pane"],
                                                          "packets": 0, "bytes": 0, "ticks": 0, "lost": 0})
        if r["fate"] == ON_TIME:
            row["packets"] += r["packets"]
            row["bytes"] += r["bytes"]
        else:
            row["ticks"] += r["records"]
    for r in lost:
        row = fresh.setdefault((r["source"], r["pane_start"]), {"source": r["source"], "pane_start": r["pane_start"],
                                                                "packets": 0, "bytes": 0, "ticks": 0, "lost": 0})
        row["lost"] += r["lost"]
    if not fresh and not replace_hours:
        return
    table = warehouse.table("source_panes")
    replaced = set(replace_hours)
    hours = sorted({hour_floor(pane) for _, pane in fresh} | replaced)
    merged = {(r["source"], r["pane_start"]): r for r in st.rows(table.read_arrow(keys=hours))
              if hour_floor(r["pane_start"]) not in replaced}
    for key, row in fresh.items():
        old = merged.get(key)
        if old:
            row = {**row, **{c: (old[c] or 0) + row[c] for c in ("packets", "bytes", "ticks", "lost")}}
        merged[key] = row
    data = pa.Table.from_pylist(sorted(merged.values(), key=lambda r: (r["pane_start"], r["source"])),
                                schema=table.arrow_schema)
    table.replace(data, keys=hours, txn=txn, op="ingest")


def _grow_late_counters(warehouse: Warehouse, summary: list[dict], txn) -> None:
    """Late packets for already-closed periods grow those ledger rows' late counters (DESIGN §6)."""

    late_by_hour: dict[datetime, list[int]] = {}
    for r in summary:
        if r["fate"] == LATE:
            totals = late_by_hour.setdefault(hour_floor(r["pane"]), [0, 0])
            totals[0] += r["bytes"]
            totals[1] += r["packets"]
    if not late_by_hour:
        return
    months = sorted({month_start(h) for h in late_by_hour})
    ledger = {(r["grain"], r["period_start"]): r for r in st.read_ledger(warehouse, keys=months)}
    changed = {}
    for hour, (late_bytes, late_packets) in late_by_hour.items():
        day = hour.replace(hour=0)
        for key in (("hour", hour), ("day", day), ("month", month_start(hour))):
            row = changed.get(key) or ledger.get(key)
            if row is None:
                continue
            changed[key] = {**row, "late_bytes": row["late_bytes"] + late_bytes,
                            "late_packets": row["late_packets"] + late_packets}
    st.write_ledger_rows(warehouse, list(changed.values()), txn=txn, op="ingest")

