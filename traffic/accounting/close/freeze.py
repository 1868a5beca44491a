"""The freeze: closed hours recomputed from raw detail into final rows and panes, checked, given their
ledger rows, and their billing periods' alerts raised (DESIGN §3–§4): ``raise_alerts`` is the one place a
close raises alerts, here and for the billing periods whose bills it stores.

Arrow tasks recompute hours whose files list by hour (``traffic.accounting.freeze_tasks``); Spark
recomputes hours read by key (files another writer made that hold several hours).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from traffic.accounting import freeze_tasks
from traffic.accounting import panes as P
from traffic.accounting import parts
from traffic.accounting import transforms as T
from traffic.accounting.alerts import refresh_alerts
from traffic.accounting.close.ledger import (_arrow_sums, _judge, _late_kept, _ledger_frame, _ledger_row, _store,
                                             _side_table_runs, _sums)
from traffic.core.periods import as_utc, expected_sources_window, hour_floor, panes_of, period_end
from traffic.core.settings import Settings
from traffic.quality.suites import Validation
from traffic.runtime.spark import task_slots
from traffic.storage import state as st
from traffic.storage.warehouse import Warehouse


@dataclass
class _Recomputed:
    """A freeze's hours recomputed from raw detail: final rows and panes to commit (staged files or Spark
    frames), per-hour raw Σ (bytes, rows), the rows differing from the open ones, and the raw detail as
    Spark reads it (for the checks)."""

    final: object
    final_panes: object
    raw: dict[datetime, tuple[int, int]]
    differing: dict[datetime, int]
    packets: object
    cached: tuple = ()
    estimated: dict = field(default_factory=dict)  # per hour, bytes estimated from samples


class Frozen(NamedTuple):
    """What a freeze found: the hours that failed a critical check (each with the message naming the check
    and the value it failed with) and the messages of the billing periods whose alerts failed one."""

    failed: dict[datetime, str]
    alerts_failed: list[str]


def freeze_hours(settings: Settings, warehouse: Warehouse, hours: list[datetime], check=None,
                 restated: str | None = None) -> Frozen:
    """Write final rows and panes, check them and write the ledger rows for ``hours`` in one pass.

    Returns the hours that failed a critical check and the billing periods whose alerts did
    (``Frozen``). A failed hour keeps its final rows but is not published
    (``dq_status = failed``), so no day is rolled up over it. ``restated`` is the reason when the
    hours are frozen again after a restatement replaced their raw detail.
    """
    check = check or Validation(warehouse, "freeze", [("hour", h) for h in hours], [])
    periods = [("hour", h) for h in hours]
    # Only hours with rows cost work: an empty hour (no packets, no open rows or panes) has nothing to
    # recompute, write or check but its ledger row, which is built and checked with the others below.
    # A year of empty hours (one stray old record) closes at the cost of the hours with data.
    busy = set(_hours_with_rows(warehouse, hours))
    busy_hours = [h for h in hours if h in busy]
    if busy_hours:
        # Arrow tasks read each hour's own files; where a file holds several hours (one another writer
        # made) the tables cannot be listed by hour, and Spark reads them by key instead.
        raw_files = warehouse.table("packets").paths_by_period(busy_hours)
        open_files = warehouse.table("hourly").paths_by_period(busy_hours)
        totals = recompute_arrow(warehouse, busy_hours, raw_files, open_files) \
            if raw_files is not None and open_files is not None else recompute_spark(warehouse, busy_hours)
        warehouse.table("hourly").replace(totals.final, keys=busy_hours, op="freeze")
        warehouse.table("panes").replace(totals.final_panes, keys=busy_hours, op="freeze")
    else:
        totals = _Recomputed(None, None, {}, {}, None)
    stored = _arrow_sums(warehouse.table("hourly").read_arrow(keys=busy_hours, columns=["hour", "bytes", "packets"]),
                         "hour")
    pane_sums = _arrow_sums(warehouse.table("panes").read_arrow(keys=busy_hours, columns=["hour", "bytes", "packets"]),
                            "hour")

    late = warehouse.table("late_packets").read_arrow(keys=hours, columns=["hour", "bytes", "packets"])
    late_totals = _arrow_sums(late.set_column(2, "packets", parts.weights(late)), "hour")
    late_kept = _late_kept(settings, warehouse, hours)
    completeness = _completeness(settings, warehouse, hours)
    history = st.watermark_history(warehouse)
    clocks = st.read_clock_state(warehouse)
    rows = []
    for hour in hours:
        late_bytes, late_packets = late_totals.get(hour, (0, 0))
        reporting, expected, active, lost = completeness[hour]
        table_bytes, table_packets = stored.get(hour, (0, 0))
        source_bytes, source_packets = totals.raw.get(hour, (0, 0))
        rows.append({
            **_ledger_row("hour", hour, (table_bytes, table_packets), (late_bytes, late_packets),
                          (reporting, expected, active), st.closed_at(history, period_end(hour, "hour")), restated,
                          lost=lost, estimated_bytes=totals.estimated.get(hour, 0)),
            # reconciliation (checked by the `periods` suite, not stored)
            "table_bytes": table_bytes, "table_packets": table_packets,
            "source_bytes": source_bytes, "source_packets": source_packets,
            "late_kept_bytes": late_kept[hour], "rows_differing": totals.differing.get(hour, 0),
            "panes_bytes": pane_sums.get(hour, (0, 0))[0], "panes_packets": pane_sums.get(hour, (0, 0))[1],
            "sources_ahead": ", ".join(clocks.ahead_when_closed(hour)) or None,
        })
    _validate_freeze(warehouse, check, periods, busy_hours, totals, rows)
    for frame in totals.cached:
        frame.unpersist()
    _judge(check, rows)
    failed = {row["period_start"]: check.message("hour", row["period_start"])
              for row in rows if row["dq_status"] == "failed"}
    # Alerts of the billing periods over these hours, from their published final panes: written before
    # the ledger rows that mark the hours done, so a crash in between freezes (and alerts) them again.
    alerts_failed = raise_alerts(warehouse, check, hours, rows)
    check.record()
    st.write_ledger_rows(warehouse, _store(rows), op="freeze")
    return Frozen(failed, alerts_failed)


def _validate_freeze(warehouse: Warehouse, check, periods: list, busy_hours: list[datetime], totals: _Recomputed,
                     rows: list[dict]) -> None:
    """Every check of a freeze, each run once over all its hours: the row suites over the hours with rows
    (an empty hour is checked by its ledger row), ingest health, then the ledger rows themselves."""
    busy_periods = [("hour", h) for h in busy_hours]
    runs = []
    if busy_hours:
        # The final rows and panes as stored (an Arrow freeze wrote them from its tasks).
        runs += [("packets", totals.packets, busy_periods, "packets.freeze"),
                 ("hourly", warehouse.table("hourly").read(keys=busy_hours), busy_periods, "hourly.freeze"),
                 ("panes", warehouse.table("panes").read(keys=busy_hours), busy_periods, "panes.freeze")]
    # Every row suite's pass in one Spark job, then the ledger rows themselves.
    check.validate_together(runs + _side_table_runs(warehouse, periods, "freeze")
                            + [("periods", _ledger_frame(rows), periods, "periods.freeze")])


def _hours_with_rows(warehouse: Warehouse, hours: list[datetime]) -> set[datetime]:
    """The hours among ``hours`` with rows in ``packets``, ``hourly`` or ``panes`` (from the file lists
    alone). A merged file spanning several hours (a restated range) counts for every hour it may hold."""
    return {h for name in ("packets", "hourly", "panes") for h in warehouse.table(name).periods_with_files(hours)}


def recompute_arrow(warehouse: Warehouse, hours: list[datetime], raw_files: dict, open_files: dict) -> _Recomputed:
    """Recompute in Arrow tasks (``traffic.accounting.freeze_tasks``) that write the hours' final rows and panes
    to staged folders; the driver only sums the tasks' per-hour raw totals and differing rows. ``raw_files``
    and ``open_files`` are the hours' files of ``packets`` and ``hourly`` (``Table.paths_by_period``)."""

    packets, hourly = warehouse.table("packets"), warehouse.table("hourly")
    work = [(freeze_tasks.Hour(hour, tuple(path for path, _ in raw_files.get(hour, ())),
                               tuple(path for path, _ in open_files.get(hour, ()))),
             sum(size for _, size in raw_files.get(hour, ())))
            for hour in hours if hour in raw_files or hour in open_files]
    # Two tasks per slot: an uneven split leaves a core idle for less of the job.
    groups = freeze_tasks.share_out(work, 2 * task_slots(warehouse.settings))
    scratch = warehouse.scratch("freeze")
    job = freeze_tasks.Job(scratch, hourly.staging(), warehouse.table("panes").staging(),
                P.Mapping.of(warehouse.settings.accounts_file))
    if groups:
        warehouse.spark.range(0, len(groups), 1, len(groups)) \
            .mapInArrow(freeze_tasks.task_function(groups, job), freeze_tasks.OUTCOME_DDL).collect()
    attempts = {task: 0 for task in range(len(groups))}
    raw = parts.read_parts(scratch, "raw", attempts)
    differing = parts.read_parts(scratch, "differing", attempts)
    warehouse.drop_scratch(scratch)
    return _Recomputed(job.hourly, job.panes, {h: tuple(v) for h, v in _arrow_sums(raw, "hour").items()},
                       {as_utc(h): n for h, n in zip(differing.column("hour").to_pylist(),
                                                        differing.column("n").to_pylist())},
                       packets.read(keys=hours),
                       estimated={as_utc(h): e for h, e in zip(*freeze_tasks.sum_raw(raw).select(
                           ["hour", "estimated_bytes"]).to_pydict().values())})


def recompute_spark(warehouse: Warehouse, hours: list[datetime]) -> _Recomputed:
    """Recompute with Spark over the tables read by key (files that hold several hours)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    # Many hours at once (a replay, a catch-up) are cached on local disk, not in the JVM heap.
    packets = warehouse.table("packets").read(keys=hours).persist(
        StorageLevel.DISK_ONLY if len(hours) > 24 else StorageLevel.MEMORY_AND_DISK_DESER)
    final = T.hourly_totals(packets, "final").persist()
    # Built-in check: the open rows the micro-batches maintained equal the totals recomputed from raw detail.
    differing = spark_rows_differing(final, warehouse.table("hourly").read(keys=hours))
    sampled = F.when(F.coalesce(F.col("sampling_rate"), F.lit(1)) > 1, F.col("bytes")).otherwise(F.lit(0))
    sums = _sums(packets, "hour", [F.sum(T.weight()).alias("packets"), F.sum(sampled).alias("estimated")])
    raw = {as_utc(k): (int(v["bytes"] or 0), int(v["packets"])) for k, v in sums.items()}
    # The hour's final panes, from the same raw detail, attributed with the mapping in force at each pane.
    final_panes = P.pane_totals(packets, P.Mapping.of(warehouse.settings.accounts_file), "final").persist()
    return _Recomputed(final, final_panes, raw, differing, packets, (packets, final, final_panes),
                       estimated={as_utc(k): int(v["estimated"] or 0) for k, v in sums.items()})


def spark_rows_differing(final, open_rows) -> dict[datetime, int]:
    """Per hour, rows of either side without an equal row on the other (a multiset difference both ways).

    Both sides hold one row per (hour, local_ip, remote_ip), so one full outer join on that key
    finds them: a key on one side only is one differing row, a key on both with other amounts two.
    """
    from pyspark.sql import functions as F

    key = ["hour", "local_ip", "remote_ip"]

    def side(frame, tag: str):
        return frame.select(*[F.col(c).alias(f"{tag}_{c}") for c in (*key, *T.AMOUNTS)], F.lit(1).alias(f"{tag}_row"))

    joined = side(final, "a").join(side(open_rows, "b"), how="full_outer",
                                   on=[F.col(f"a_{c}").eqNullSafe(F.col(f"b_{c}")) for c in key]) \
        .withColumn("hour", F.coalesce("a_hour", "b_hour"))
    same = F.lit(True)
    for c in T.AMOUNTS:
        same = same & F.col(f"a_{c}").eqNullSafe(F.col(f"b_{c}"))
    both = F.col("a_row").isNotNull() & F.col("b_row").isNotNull()
    rows = F.when(both & same, 0).when(both, 2).otherwise(1)
    return {as_utc(r["hour"]): r["n"] for r in
            joined.groupBy("hour").agg(F.sum(rows).alias("n")).where(F.col("n") > 0).collect()}


def _completeness(settings: Settings, warehouse: Warehouse,
                  hours: list[datetime]) -> dict[datetime, tuple[int, int, int, int]]:
    """(sources_reporting, sources_expected, panes_active, lost) per hour, from ``source_panes``; ``lost``
    is the export sequence units flow sources lost in the hour (DESIGN §7a)."""
    lo, hi = expected_sources_window(hours[0])[0], expected_sources_window(hours[-1])[1]
    panes = st.rows(warehouse.table("source_panes").read_arrow(key_min=lo, key_max=hi,
                                                               columns=["source", "pane_start", "lost"]))
    by_pane: dict[datetime, set[str]] = {}
    lost_by_hour: dict[datetime, int] = {}
    for p in panes:
        by_pane.setdefault(p["pane_start"], set()).add(p["source"])
        if p["lost"]:
            lost_by_hour[hour_floor(p["pane_start"])] = lost_by_hour.get(hour_floor(p["pane_start"]), 0) + p["lost"]
    result = {}
    starts = sorted(by_pane)
    for hour in hours:
        reporting = set().union(*[by_pane.get(pane, set()) for pane in panes_of(hour)])
        if settings.expected_sources:
            expected = set(settings.expected_sources)
        else:
            # The panes of the 24 hours ending at the hour's end (a slice of the sorted starts: a long
            # run of hours costs per pane with data, not per hour times panes).
            first, end = expected_sources_window(hour)
            window = starts[bisect_left(starts, first):bisect_left(starts, end)]
            expected = set().union(*[by_pane[pane] for pane in window])
        active = sum(1 for pane in panes_of(hour) if expected <= by_pane.get(pane, set()))
        result[hour] = (len(reporting), len(expected), active, lost_by_hour.get(hour, 0))
    return result


def raise_alerts(warehouse: Warehouse, check, hours: list[datetime] = (), judged: list[dict] = (),
                 periods: list | None = None) -> list[str]:
    """The one place a close raises alerts: recompute, check (in ``check``) and store the alerts of the
    billing periods ``hours`` fall in, or of ``periods``; the messages of those whose alerts failed a
    critical check (they keep their stored rows).

    ``judged``: the hours' ledger rows with their verdicts, not yet written. Called before the ledger
    rows (or bills) that mark the step done, so a crash in between raises them again.
    """
    refresh_alerts(warehouse, list(hours), list(judged), check, periods=periods)
    starts = sorted({o.period_start for o in check.outcomes if o.grain == "alert" and o.critical and not o.success})
    return [f"alerts: {check.message('alert', start)}" for start in starts]
