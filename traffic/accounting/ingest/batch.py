"""What one ingest batch's steps hand each other: the Delta app id its writes carry, the raw tables,
what its parse tasks left (``BatchRead``) and what its records decide (``BatchTally``).

Kept apart from the steps (``read``, ``tally``, ``writes``) so that none of them
imports another: ``ingest`` runs them in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import pyarrow as pa

from traffic.core.clock import ClockState
from traffic.core.periods import hour_floor, hours_between
from traffic.storage.staging import Staged
from traffic.storage.place import Place

APP = "ingest"
RAW_TABLES = ("packets", "late_packets", "rejects")


@dataclass
class BatchRead:
    """What a batch's parse tasks left: their parts and staged raw files, and the files as they were read."""

    scratch: Place
    attempts: dict[int, int]  # chunk → the attempt whose parts count
    staged: dict[str, Staged | None]  # raw table → staged files (None: already committed)
    files: list[dict]  # the plan's files, with what reading them found
    changed_rejects: pa.Table  # rejects made on the driver: a planned file not read, waiting data expired
    summary: list[dict]  # per (fate, source, pane): records, bytes, newest time
    lost: list[dict] = field(default_factory=list)  # sequence gaps the watermark decided on the driver


@dataclass
class BatchTally:
    """A batch's counts by fate, and the clocks after it."""

    counts: dict[str, int]  # rows
    weights: dict[str, int]  # packets (on time, late)
    volume: dict[str, int]  # bytes (on time, late)
    on_time_hours: list[datetime]
    before: ClockState
    after: ClockState
    summary: list[dict] = field(default_factory=list)  # what it was computed from


def restated_hours(plan: dict) -> list[datetime]:
    """The hours a restatement replaces (none for an ordinary batch)."""
    if not plan.get("restate"):
        return []
    start, end = (datetime.fromisoformat(t) for t in plan["range"])
    return hours_between(hour_floor(start), end)
