"""What one freeze task does on an executor: recompute whole hours from their raw detail and write them.

A freeze recomputes the final hourly rows and panes of its hours from ``packets``. The hours
are shared out between tasks by the size of their raw files. For each of its hours a task
reads the raw files with Arrow, one file at a time, and sums the same partial totals an ingest
task does; it writes the hour's final ``hourly`` rows and ``panes`` (attributed to accounts
here) as parquet into the tables' staged folders, and compares the final rows with the hour's
open rows (the freeze's built-in check). It leaves in the job's scratch folder only the hour's
raw Σ bytes and rows and its count of differing rows. The driver commits the staged files
(``close.freeze_hours``): no hourly row passes through the driver or the JVM.

Every sum is overflow-checked (``parts.group_sums``, DESIGN §7a): an hour whose total would pass
2**63 − 1 fails its freeze with one line naming the row, never publishes a wrapped (negative) total.
"""

from __future__ import annotations

import heapq
from datetime import datetime
from dataclasses import dataclass
from typing import Iterable, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from traffic.accounting.parts import (
    ACCOUNT_PARTS,
    AMOUNTS,
    DIFFERING,
    HOURLY_PARTS,
    RAW_SUMS,
    estimated_bytes,
    file_part,
    group_sums,
    hourly_parts,
    save_part,
    sum_hourly,
    weights,
)
from traffic.storage.staging import write_staged
from traffic.storage.place import Place
from traffic.storage.schemas import arrow_schema
from traffic.accounting.panes import account_parts, sum_pane_rows

#: The raw columns a freeze reads.
#: Raw files written before a column existed read it as null (a null weight is 1 packet).
_RAW_SCHEMA = arrow_schema("packets")
COLUMNS = ["ts", "hour", "source", "local_ip", "remote_ip", "bytes", "direction", "packets", "sampling_rate"]
OUTCOME = pa.schema([("task", pa.int32()), ("rows", pa.int64())])
OUTCOME_DDL = "task int, rows long"
T = TypeVar("T")


@dataclass(frozen=True)
class Hour:
    """One hour to freeze: its start, its raw files and its ``hourly`` files (local or on the warehouse's store)."""

    hour: datetime
    packets: tuple[Place, ...]
    open_rows: tuple[Place, ...]


@dataclass(frozen=True)
class Job:
    """What every task of one freeze shares (pickled to the executors)."""

    scratch: Place
    hourly: object  # delta.Staged
    panes: object  # delta.Staged
    mapping: object  # panes.Mapping

    def __post_init__(self):
        object.__setattr__(self, "scratch", Place.of(self.scratch))  # a folder's path given: the place it names


def share_out(items: Iterable[tuple[T, int]], tasks: int) -> list[list[T]]:
    """Items (item, size) in at most ``tasks`` groups of about equal size (largest first, each to the lightest)."""
    items = list(items)
    groups: list[list[T]] = [[] for _ in range(max(1, min(tasks, len(items))))]
    load = [(0, i) for i in range(len(groups))]
    for item, size in sorted(items, key=lambda entry: -entry[1]):
        weight, i = heapq.heappop(load)
        groups[i].append(item)
        heapq.heappush(load, (weight + size, i))
    return [g for g in groups if g]


def sum_raw(parts: pa.Table) -> pa.Table:
    """Per-hour raw Σ bytes and rows from several parts."""
    return group_sums(parts, ["hour"], {"bytes": ("bytes", "sum"), "packets": ("packets", "sum"),
                                        "estimated_bytes": ("estimated_bytes", "sum")}, RAW_SUMS)


def _concat(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    return pa.concat_tables(tables) if tables else schema.empty_table()


def raw_sums(packets: pa.Table) -> pa.Table:
    """Per-hour Σ bytes and packet weights of raw detail, and the bytes estimated from samples."""
    table = pa.table({"hour": packets.column("hour"), "bytes": packets.column("bytes"), "weight": weights(packets),
                      "estimated": estimated_bytes(packets)})
    return group_sums(table, ["hour"], {"bytes": ("bytes", "sum"), "packets": ("weight", "sum"),
                                        "estimated_bytes": ("estimated", "sum")}, RAW_SUMS)


def rows_differing(final: pa.Table, open_rows: pa.Table) -> pa.Table:
    """Per hour, rows of either side without an equal row on the other (``close.rows_differing`` in Arrow).

    Both sides hold one row per (hour, local_ip, remote_ip): one full outer join on that key finds
    them (a null key equals a null key); a key on one side only is one row, on both with other
    amounts two. Returns (hour, n) for the hours with n > 0.
    """
    key = ["hour", "local_ip", "remote_ip"]
    missing = "\x00null"

    def side(table: pa.Table, tag: str) -> pa.Table:
        columns = {c: table.column(c).cast(HOURLY_PARTS.field(c).type) for c in key}
        columns.update({c: pc.fill_null(columns[c], missing) for c in key[1:]})
        columns.update({f"{tag}_{c}": table.column(c).cast(pa.int64()) for c in AMOUNTS})
        columns[f"{tag}_row"] = pa.repeat(pa.scalar(1, pa.int64()), table.num_rows)
        return pa.table(columns)

    joined = side(final, "a").join(side(open_rows, "b"), keys=key, join_type="full outer")
    same = pa.repeat(pa.scalar(True), joined.num_rows)
    for c in AMOUNTS:
        a, b = joined.column(f"a_{c}"), joined.column(f"b_{c}")
        same = pc.and_(same, pc.if_else(pc.and_(pc.is_null(a), pc.is_null(b)), True,
                                        pc.fill_null(pc.equal(a, b), False)))
    both = pc.and_(pc.is_valid(joined.column("a_row")), pc.is_valid(joined.column("b_row")))
    rows = pc.if_else(both, pc.if_else(same, 0, 2), 1)
    per_hour = group_sums(pa.table({"hour": joined.column("hour"), "n": rows}), ["hour"], {"n": ("n", "sum")},
                          DIFFERING)
    return per_hour.filter(pc.greater(per_hour.column("n"), 0))


def freeze_hour(hour: Hour, job: Job, part: str) -> tuple[pa.Table, pa.Table, int]:
    """Recompute, write (staged) and compare one hour; returns its raw sums, differing rows and rows read."""
    import pyarrow.parquet as pq


    parts: dict[str, list[pa.Table]] = {"hourly": [], "accounts": [], "raw": []}
    rows = 0
    for place in map(Place.of, hour.packets):
        packets = pq.read_table(place.fs_path, columns=COLUMNS, schema=_RAW_SCHEMA, filesystem=place.fs)
        rows += packets.num_rows
        parts["hourly"].append(hourly_parts(packets))
        parts["accounts"].append(account_parts(packets, job.mapping))
        parts["raw"].append(raw_sums(packets))
    # Each sum groups the parts of all the hour's files by its key: the hour's final totals.
    final = sum_hourly(_concat(parts["hourly"], HOURLY_PARTS), "final")
    write_staged(final, job.hourly, part)
    write_staged(sum_pane_rows(_concat(parts["accounts"], ACCOUNT_PARTS), "final"), job.panes, part)
    open_rows = pa.concat_tables([pq.read_table(place.fs_path, columns=["hour", "local_ip", "remote_ip", *AMOUNTS],
                                                filesystem=place.fs).cast(HOURLY_PARTS) for place in map(Place.of, hour.open_rows)]) \
        if hour.open_rows else HOURLY_PARTS.empty_table()
    return sum_raw(_concat(parts["raw"], RAW_SUMS)), rows_differing(final, open_rows), rows


def recompute(hours: list[Hour], job: Job, task: int) -> dict:
    """Freeze ``hours`` one at a time, leave their raw sums and differing rows; returns the task's outcome row."""
    raw, differing, rows = [], [], 0
    for hour in hours:
        hour_raw, hour_differing, hour_rows = freeze_hour(hour, job, file_part(task, 0))
        raw.append(hour_raw)
        differing.append(hour_differing)
        rows += hour_rows
    save_part(job.scratch, "raw", task, 0, pa.concat_tables(raw))
    save_part(job.scratch, "differing", task, 0, pa.concat_tables(differing))
    # The worker process outlives the task: hand the memory of the files read back to the system.
    pa.default_memory_pool().release_unused()
    return {"task": task, "rows": rows}


def task_function(groups: list[list[Hour]], job: Job):
    """The function Spark runs per task (``mapInArrow`` over ``spark.range``): id i freezes ``groups[i]``."""

    def run(batches):
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield pa.RecordBatch.from_pylist([recompute(groups[index], job, index)], schema=OUTCOME)

    return run
