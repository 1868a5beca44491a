"""Replay: import archived input files for a time range, then close what can be closed — one Spark app.

Into a range that is still open (a new warehouse, or history older than anything ingested)
the records count normally; into a closed range they are late (DESIGN §3, §8). A
**restatement** (``--restate --reason …``) instead replaces a frozen range from the archive:
its raw detail, late records, hourly rows and ledger rows are recomputed, the days and
months over it are rolled up again, and every rewritten ledger row says ``restated`` and why.
The bytes the range held before are recorded as ``bytes_withdrawn`` on the batch, so the
accounting still reconciles to the byte.

Files are keyed by (source, content) and range: replaying the same file over the same (or an
overlapping) range again is a recorded duplicate, not a second count — except in a
restatement, which replaces the range by design.

Flow telemetry (DESIGN §7a) is decoded with the replay's own state: the templates and rates the
archive teaches, falling back to a **read-only copy** of the live source's templates and rates,
journaled with the plan. The copy leaves out the live data waiting for its template (it belongs to
the live source: a replay never decodes, expires or drops it) and the live sequence numbers (an
archive's sequence is its own, so a replay counts neither false losses nor false restarts against
the live stream). Nothing a replay decodes is written back: the live decoder state after a replay
or restatement is the one before it. Data of the archive still waiting for its template when the
replayed files end is rejected by the replay batch ("its template never arrived"): no later file of
the replay can bring that template.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

from traffic.io import inbox as inbox_mod
from traffic.io.readers import FLOWS
from traffic.io.telemetry import TelemetryState
from traffic.storage import state as st
from traffic.core.periods import as_utc, hour_floor, hours_between, restatement_past_retention
from traffic.storage.warehouse import Warehouse
from traffic.runtime.spark import task_slots
from traffic.core.settings import Settings, SettingsError

UTC = timezone.utc


def plan_replay(settings: Settings, warehouse: Warehouse, input_dir: Path, start: datetime, end: datetime,
                source: str | None = None, restate: str | None = None) -> dict | None:
    """The replay batch's plan, or None when every file was already counted for this range."""
    if end <= start:
        raise SettingsError(f"replay range is empty: --from {start.isoformat()} is not before --to {end.isoformat()}")
    state = st.read_clock_state(warehouse)
    withdrawn = 0
    if restate is not None:
        if not restate.strip():
            raise SettingsError("a restatement needs --reason (it is recorded in the ledger)")
        if start != hour_floor(start) or end != hour_floor(end):
            raise SettingsError("a restatement covers whole hours: --from and --to must be on the hour")
        frozen = {r["period_start"]: r for r in st.read_ledger(warehouse, "hour")}
        for hour in hours_between(start, end):
            if hour not in frozen:
                raise SettingsError(f"only frozen hours can be restated; {hour:%Y-%m-%d %H:00} is not frozen "
                                    "(replay without --restate, or wait until it is closed)")
            withdrawn += frozen[hour]["bytes"] + frozen[hour]["late_bytes"]
        blocked = restatement_past_retention(start, end, state.watermark, settings.hourly_retention,
                                             settings.daily_retention)
        if blocked:
            raise SettingsError(blocked)
    found = inbox_mod.scan(input_dir)
    if not found:
        raise SettingsError(f"no input files in {input_dir}")
    known = st.known_files(warehouse)
    whole = {(k["source"], k["sha256"]) for k in known if k["status"] in (inbox_mod.ACCOUNTED, inbox_mod.APPENDED)}
    replayed: dict[tuple[str, str], list[tuple[datetime, datetime]]] = {}
    for k in known:
        if k["status"] == inbox_mod.REPLAYED and k.get("range_from"):
            replayed.setdefault((k["source"], k["sha256"]), []).append(
                (as_utc(k["range_from"]), as_utc(k["range_to"])))
    files = []
    how = replace(inbox_mod.cutting(settings, task_slots(settings)), partial_line_grace=0)  # an archive is complete: its last line counts as it is
    for f in found:
        file_source = source or f.source
        if f.status == inbox_mod.SKIPPED:  # never opened: recorded by name (the inbox's rule)
            files.append({**asdict(f), "source": file_source})
            continue
        try:
            f, _ = inbox_mod.survey(replace(f, source=file_source), how)
        except OSError as error:
            files.append({**asdict(f), "source": file_source, "status": inbox_mod.UNREADABLE,
                          "note": f"cannot be read ({inbox_mod.why(error)}): nothing of it was counted"})
            continue
        key = (file_source, f.sha256)
        overlap = any(a < end and start < b for a, b in replayed.get(key, []))
        if restate is None and (key in whole or overlap):
            status, note = inbox_mod.DUPLICATE, "already counted (from the inbox or an overlapping replay)"
        else:
            status, note = inbox_mod.REPLAYED, ""
        files.append({**asdict(f), "status": status, "note": note})
    if all(f["status"] not in inbox_mod.TO_READ for f in files):
        return None
    return {
        "batch_id": st.last_batch_id(warehouse) + 1,
        "mode": "restate" if restate is not None else "replay",
        "started_at": datetime.now(UTC).isoformat(),
        "now": settings.processing_now().isoformat(),
        "state_before": st.state_to_json(state),
        "range": [start.isoformat(), end.isoformat()],
        "restate": restate,
        "bytes_withdrawn": withdrawn,
        # Journaled with the plan, so a replay run again decodes with the copy it first had.
        "flow_state": read_only_flow_states(warehouse, {f["source"] for f in files if f.get("format") == FLOWS
                                                        and f["status"] in inbox_mod.TO_READ}),
        "files": files,
    }


def read_only_flow_states(warehouse: Warehouse, sources) -> dict[str, dict]:
    """The live decoder knowledge of ``sources`` a replay may fall back on: templates and sampling facts only.

    Waiting data and sequence numbers stay with the live source (see the module docstring); ingest
    never writes the flow state of a replay or restatement batch back.
    """
    copies = {}
    for source, doc in st.read_flow_states(warehouse, sources).items():
        live = TelemetryState.from_json(doc)
        copies[source] = TelemetryState(flows=live.flows).to_json()
    return copies
