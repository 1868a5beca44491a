"""How every run starts and ends: the warehouse lock, the tables, an interrupted batch, then the step.

Each entry point here (ingest, close, replay) takes the warehouse lock, creates any missing table,
finishes a batch an earlier run left journaled, does its step, refreshes the report when
periods were closed, and writes the Prometheus metrics before it lets the lock go, whether the
step succeeded or failed (``traffic.reporting.metrics``; a failure to write them is a warning).
The steps themselves live in ``traffic.accounting``; the CLI, the demo and the DAG helpers call
these.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Callable

from traffic.accounting.close.execute import CheckFailed, CloseResult, close_locked
from traffic.accounting.close.restate import rewrite_restated_periods
from traffic.accounting.ingest import BatchResult, big_batch, plan_batch, run_batch
from traffic.accounting.replay import plan_replay
from traffic.core.periods import HOUR
from traffic.core.settings import Settings
from traffic.reporting.html_report import refresh_report
from traffic.reporting.metrics import written_after
from traffic.runtime import jvm
from traffic.runtime.spark import start_spark
from traffic.storage.warehouse import Warehouse
from traffic.storage.journal import Journal


def ingest(settings: Settings, spark_factory: Callable[[], object], progress=print) -> BatchResult:
    """Run one micro-batch (resuming an interrupted one first). Holds the warehouse lock."""
    warehouse = Warehouse(settings, spark=spark_factory)
    with warehouse.lock("traffic ingest"), \
            written_after(warehouse, progress) as metrics:
        warehouse.create_all()
        journal = Journal(warehouse.state_dir())
        plan = journal.load()
        resumed = plan is not None
        if plan is None:
            plan = plan_batch(settings, warehouse)
            if plan is None:
                metrics.nothing_done()
                return BatchResult()
            journal.save(plan)
        if resumed:
            progress(f"resuming interrupted batch {plan['batch_id']}")
        warehouse = warehouse.with_spark(start_spark(spark_factory, big_batch(plan)))
        result = complete(warehouse, plan, progress)
        result.resumed = resumed
        journal.clear()
        return result


def finish_pending(settings: Settings, warehouse: Warehouse, spark_factory, progress=print) -> bool:
    """Complete an interrupted batch (close and replay call this under the lock)."""
    journal = Journal(warehouse.state_dir())
    plan = journal.load()
    if plan is None:
        return False
    progress(f"finishing interrupted {plan.get('mode', 'ingest')} batch {plan['batch_id']} first")
    complete(warehouse.with_spark(start_spark(spark_factory, big_batch(plan))), plan, progress)
    journal.clear()
    return True


def complete(warehouse: Warehouse, plan: dict, progress=print) -> BatchResult:
    """Run a journaled plan to its end: the batch, then a restatement's ledger and roll-up rewrite."""
    result = run_batch(warehouse, plan, progress)
    if plan.get("restate"):
        rewrite_restated_periods(warehouse, plan, progress)
    return result


def close(settings: Settings, spark_factory: Callable[[], object], until: datetime | None = None,
          progress=print, only: tuple[str, ...] | None = None) -> CloseResult:
    """Freeze, roll up and expire everything the watermark allows (up to ``until``). Holds the lock.

    ``only`` limits the run to some of ``STEPS``; days and months are still only rolled up
    once all their hours are frozen and published, so running steps separately is safe.
    Every period produced is checked before it is published; when a critical check fails the
    run still writes everything else it may, then raises ``CheckFailed`` (CLI exit 3).
    """
    warehouse = Warehouse(settings, spark=spark_factory)
    with warehouse.lock("traffic close"), \
            written_after(warehouse, progress) as metrics:
        warehouse.create_all()
        finished = finish_pending(settings, warehouse, spark_factory, progress)
        result = close_locked(settings, warehouse, spark_factory, until, progress, only)
        _refresh_if_closed(settings, result, progress)
        if finished or result.seconds:  # a close that ran a plan times its steps; an empty plan runs none
            metrics.closed(only, len(result.failed))
        else:
            metrics.nothing_done()
    if result.failed:
        raise CheckFailed("; ".join(result.failed), result)
    return result


def replay(settings: Settings, spark_factory: Callable[[], object], input_dir: Path, start: datetime,
           end: datetime, source: str | None = None, restate: str | None = None, progress=print):
    """Import the archive for ``[start, end)`` and close what the watermark allows, under the lock."""
    warehouse = Warehouse(settings, spark=spark_factory)
    with warehouse.lock("traffic replay"), \
            written_after(warehouse, progress) as metrics:
        warehouse.create_all()
        finish_pending(settings, warehouse, spark_factory, progress)
        plan = plan_replay(settings, warehouse, Path(input_dir), start, end, source, restate)
        result = BatchResult()
        long_range = f"a replay of {(end - start) / HOUR:,.0f} hours" if end - start > jvm.QUICK_MAX_HOURS * HOUR \
            else None
        if plan is not None:
            journal = Journal(warehouse.state_dir())
            journal.save(plan)
            result = complete(warehouse.with_spark(start_spark(spark_factory, big_batch(plan) or long_range)), plan,
                              progress)
            journal.clear()
        closing = time.perf_counter()
        closed = close_locked(settings, warehouse, spark_factory, None, progress, big_job=long_range)
        _refresh_if_closed(settings, closed, progress)
        metrics.closed(None, len(closed.failed), since=closing)
        return result, closed


def refresh_metrics(settings: Settings, progress=print) -> None:
    """Rewrite ``metrics.prom`` under the warehouse lock, after a change that is not a job (``traffic accept``
    turns a failed period into an accepted one); a failure to write is a warning, as after a job."""
    warehouse = Warehouse.reader(settings)
    with warehouse.lock("traffic accept"), \
            written_after(warehouse, progress):
        pass


def _refresh_if_closed(settings: Settings, result: CloseResult, progress) -> None:
    """Rewrite the report when the run closed periods (its time goes into the close's timings)."""
    if result.hours_frozen or result.days_rolled or result.months_rolled:
        clock = time.perf_counter()
        refresh_report(settings, progress)
        result.seconds["report"] = time.perf_counter() - clock
