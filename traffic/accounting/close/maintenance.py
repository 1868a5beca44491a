"""Expiry and maintenance: raw detail past ``keep_hours``, side tables and per-address rows past their
retention, old check results and their reports go (DESIGN §5); then every table's files and log are
kept bounded (merge, compact, checkpoint, vacuum).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from traffic.accounting.close.plan import PER_ADDRESS_RETENTION, ClosePlan, per_address_expiry
from traffic.core.settings import Settings
from traffic.quality.data_docs import prune_reports
from traffic.storage import state as st
from traffic.storage.warehouse import Warehouse


def expire(settings: Settings, warehouse: Warehouse, plan: ClosePlan, watermark: datetime | None,
           progress=print) -> int:
    """Delete what ``plan`` found past its retention (``watermark``: the close's); the hours of raw detail expired."""
    if plan.expire_packets:
        warehouse.table("packets").delete_keys(plan.expire_packets, op="expire")
        progress(f"expired raw detail of {len(plan.expire_packets)} hour(s)")
    for table, keys in plan.expire_other.items():
        if table == "dq_results" and plan.dq_bound is not None:
            # Listed again now: this run's own checks of periods already past dq_retention (a catch-up over
            # months) go too, as they would at a rerun of this close after a crash, which finds them written.
            keys = warehouse.table(table).keys_before(plan.dq_bound)
        elif table in PER_ADDRESS_RETENTION and watermark is not None:
            # Listed again now, with the days and months this run has just rolled up and published: as at
            # a rerun of this close after a crash, which finds them in the ledger.
            keys = per_address_expiry(settings, warehouse, watermark,
                                      st.read_ledger(warehouse, columns=st.LEDGER_STATUS)).get(table, [])
        if keys:
            warehouse.table(table).delete_keys(keys, op="expire")
    if plan.dq_bound is not None:
        # The validation results and Data Docs pages behind expired dq_results go with them.
        pruned = prune_reports(warehouse, plan.dq_bound)
        if pruned:
            progress(f"removed {pruned} Great Expectations run(s) of periods before {plan.dq_bound:%Y-%m}")
    return len(plan.expire_packets)


#: Tables kept forever and keyed finer than a month: their frozen days (``daily``: months) are merged.
MERGED = ("hourly", "panes", "daily")
#: Tables a close compacts and checkpoints (``monthly``, ``bills`` and ``alerts`` take few commits a month).
MAINTAINED = ("packets", "hourly", "panes", "source_panes", "periods", "batches", "clocks", "rejects", "late_packets",
              "daily", "dq_results")
#: How often a close deletes the files no table needs any more. Wall-clock time, as their retention
#: (a day after a commit removed them) is: files on disk are the live ones plus at most ~30 hours of
#: removed ones, whatever the history.
VACUUM_EVERY = timedelta(hours=6)


def maintain(warehouse: Warehouse, merge_before: datetime | None = None) -> None:
    """Keep every table's files and log bounded: merge the files of frozen days (months) of the tables
    kept forever, compact small files, checkpoint after either or after a long run of commits (opening
    a table costs more with each file and with each commit since its checkpoint), and every
    ``VACUUM_EVERY`` delete the files no longer needed and bring older tables to today's settings."""
    vacuum = _vacuum_due(warehouse)
    for name in MAINTAINED + (("monthly", "bills", "alerts") if vacuum else ()):
        table = warehouse.table(name)
        changed = table.configure() if vacuum else False
        merged = table.merge(merge_before) if merge_before is not None and name in MERGED else 0
        if table.compact() or merged or changed or table.checkpoint_due():
            table.checkpoint()
        if vacuum:
            table.vacuum()
    if vacuum:
        _vacuumed(warehouse)


def _vacuum_stamp(warehouse: Warehouse):
    return warehouse.state_dir() / "vacuumed"


def _vacuum_due(warehouse: Warehouse) -> bool:
    """Whether ``VACUUM_EVERY`` has passed since the last vacuum (a new warehouse starts counting now)."""
    stamp = _vacuum_stamp(warehouse)
    try:
        last = float(stamp.read_text())  # the time of the last vacuum (a store keeps no usable mtime)
    except FileNotFoundError:
        _vacuumed(warehouse)
        return False
    except ValueError:
        last = 0.0  # an empty stamp from before: due now
    return time.time() - last >= VACUUM_EVERY.total_seconds()


def _vacuumed(warehouse: Warehouse) -> None:
    _vacuum_stamp(warehouse).write_atomic(f"{time.time():.3f}")
