"""Reading an ingest batch: its parse tasks over the planned pieces of its files, and what they left.

Spark runs one parse task per piece (``traffic.accounting.batch_tasks``), which writes raw detail
straight to staged parquet and small partial totals beside it. A file one of whose pieces could
not be read as planned is left out whole; tasks holding records older than the history bound
allows are judged again. The outcome is kept beside the parts before the batch's first commit,
so a batch resumed after it ends as planned whatever happened to its files since.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from datetime import datetime

import pyarrow as pa

from traffic.accounting import batch_tasks as B
from traffic.accounting import panes as P
from traffic.accounting import parts
from traffic.accounting.batch_tasks import CHANGED_SINCE_PLANNED, OUTCOME_DDL, VANISHED, task_function
from traffic.accounting.ingest.batch import APP, RAW_TABLES, BatchRead
from traffic.accounting.parts import file_part
from traffic.core.location import ObjectLocation, is_object_url
from traffic.core.periods import from_micros, future_limit, history_floor, micros
from traffic.core.settings import Settings
from traffic.io import inbox as inbox_mod
from traffic.io.readers import FLOWS
from traffic.runtime.spark import task_slots
from traffic.storage import state as st
from traffic.storage.place import Place
from traffic.storage.staging import Staged, discard_staged
from traffic.storage.warehouse import Warehouse


def cutting(settings: Settings) -> inbox_mod.Cutting:
    """How this warehouse's batches cut files into parse tasks (``inbox.survey``), on this Spark's slots."""
    return inbox_mod.cutting(settings, task_slots(settings))


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


def _keep_tasks_done(scratch: Place, outcomes: dict[int, dict], unread: dict[str, str], staged: dict) -> None:
    """Record the finished tasks' outcome beside their parts, before the batch's first commit."""
    doc = {"outcomes": list(outcomes.values()), "unread": unread,
           "staged": {name: {"table": handle.table, "folder": handle.folder.uri} if handle is not None else None
                      for name, handle in staged.items()}}
    (scratch / _DONE).write_atomic(json.dumps(doc))


def _tasks_done(warehouse: Warehouse, batch_id: int) -> dict | None:
    """The first run's task outcome of a batch that has committed something, or None (run the tasks)."""

    scratch = warehouse.scratch(f"batch-{batch_id}", fresh=False)
    try:
        doc = json.loads((scratch / _DONE).read_text())
    except (OSError, ValueError):
        return None
    return {"scratch": scratch, "outcomes": {o["chunk"]: o for o in doc["outcomes"]}, "unread": doc["unread"],
            "staged": {name: Staged(value["table"], warehouse.root.resolve(value["folder"])) if value else None
                       for name, value in doc["staged"].items()}}


def read_batch(warehouse: Warehouse, plan: dict, progress) -> BatchRead:
    """Run the batch's parse tasks, or, resumed after its first commit, take the first run's outcome."""
    settings, batch_id = warehouse.settings, plan["batch_id"]
    files = plan["files"]
    chunk_rows = _chunks(plan, cutting(settings))
    progress(f"batch {batch_id}: {len(chunk_rows)} parse task(s) over "
             f"{sum(1 for f in files if f['status'] in inbox_mod.TO_READ)} file(s)")
    if not settings.local_networks and any(row["format"] == "capture" for row in chunk_rows):
        progress("warning: local_networks is empty, so every captured packet is neither-local and rejected "
                 "(set TRAFFIC_LOCAL_NETWORKS, e.g. 10.0.0.0/8,2001:db8::/32)")
    raw = {name: warehouse.table(name) for name in RAW_TABLES}
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
                        packets=staged["packets"], late_packets=staged["late_packets"], scratch=scratch,
                        settings_doc={"local_networks": list(settings.local_networks),
                                      "keep_transit": settings.keep_transit,
                                      "sampling_rates": dict(settings.sampling_rates),
                                      "template_wait": settings.template_wait.total_seconds(),
                                      "max_flow_duration": settings.max_flow_duration.total_seconds(),
                                      "max_flow_bps": settings.max_flow_bps},
                        flow_states=plan.get("flow_state", {}),
                        mapping=P.Mapping.of(settings.accounts_file),
                        inbox=ObjectLocation.parse(settings.inbox) if is_object_url(settings.inbox) else None)
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
    summary = st.rows(parts.combine_summary(pa.concat_tables([parts.read_parts(scratch, "summary", attempts),
                                                              changed_summary])))
    return BatchRead(scratch, attempts, staged, files, changed_rejects, summary)
