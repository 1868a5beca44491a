"""What one freeze task does on an executor: recompute whole hours' totals from their raw detail.

A freeze recomputes the final hourly rows and panes of its hours from ``packets``. The raw
files of those hours are shared out between tasks by size (a file holds one hour of one ingest
task, so a large hour spreads over several tasks). A task reads its files with Arrow and leaves
in the job's scratch folder the same partial totals an ingest task leaves — per (hour, local_ip,
remote_ip), per (pane, source, local_ip, direction) — and the hours' raw Σ bytes and rows. The
driver sums the parts (``close.freeze_hours``); only one row per task crosses into the JVM.
"""

from __future__ import annotations

import heapq

import pyarrow as pa

from traffic.batch_tasks import (
    HOURLY_PARTS,
    PANE_PARTS,
    RAW_SUMS,
    group_sums,
    hourly_parts,
    pane_parts,
    save_part,
)

#: The raw columns a freeze reads.
COLUMNS = ["ts", "hour", "source", "local_ip", "remote_ip", "bytes", "direction"]
OUTCOME = pa.schema([("task", pa.int32()), ("rows", pa.int64())])
OUTCOME_DDL = "task int, rows long"
_SUMS = {"hourly": (["hour", "local_ip", "remote_ip"], ("bytes", "packets", "bytes_in", "bytes_out"), HOURLY_PARTS),
         "panes": (["pane_start", "source", "local_ip", "direction"], ("bytes", "packets"), PANE_PARTS),
         "raw": (["hour"], ("bytes", "packets"), RAW_SUMS)}


def share_out(files: list[tuple[str, int]], tasks: int) -> list[list[str]]:
    """Files (path, size) in at most ``tasks`` groups of about equal size (largest first, each to the lightest)."""
    groups: list[list[str]] = [[] for _ in range(max(1, min(tasks, len(files))))]
    load = [(0, i) for i in range(len(groups))]
    for path, size in sorted(files, key=lambda f: (-f[1], f[0])):
        weight, i = heapq.heappop(load)
        groups[i].append(path)
        heapq.heappush(load, (weight + size, i))
    return [g for g in groups if g]


def combine(parts: pa.Table, what: str) -> pa.Table:
    """Sum partial totals of one kind (``hourly``, ``panes`` or ``raw``) per their key."""
    keys, amounts, schema = _SUMS[what]
    return group_sums(parts, keys, {c: (c, "sum") for c in amounts}, schema)


def raw_sums(packets: pa.Table) -> pa.Table:
    """Per-hour Σ bytes and rows of raw detail."""
    return group_sums(packets, ["hour"], {"bytes": ("bytes", "sum"), "packets": ([], "count_all")}, RAW_SUMS)


def recompute(paths: list[str], scratch: str, task: int) -> dict:
    """Read ``paths`` one file at a time and leave their summed parts; returns the task's outcome row."""
    import pyarrow.parquet as pq

    parts: dict[str, list[pa.Table]] = {"hourly": [], "panes": [], "raw": []}
    rows = 0
    for path in paths:
        packets = pq.read_table(path, columns=COLUMNS)
        rows += packets.num_rows
        parts["hourly"].append(hourly_parts(packets))
        parts["panes"].append(pane_parts(packets))
        parts["raw"].append(raw_sums(packets))
    for what, tables in parts.items():
        save_part(scratch, what, task, 0, combine(pa.concat_tables(tables), what))
    return {"task": task, "rows": rows}


def task_function(groups: list[list[str]], scratch: str):
    """The function Spark runs per task (``mapInArrow`` over ``spark.range``): id i recomputes ``groups[i]``."""

    def run(batches):
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield pa.RecordBatch.from_pylist([recompute(groups[index], scratch, index)], schema=OUTCOME)

    return run
