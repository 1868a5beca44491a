"""Roll-ups: closed days summed from their frozen hours into ``daily``, closed months from their days into
``monthly``, each re-checking the periods it is built from first (DESIGN §4).

A frozen hour (a rolled-up day) found corrupt since is marked failed and the roll-up over it waits;
days (months) roll up in order, and the first one that cannot stops the rest.
"""

from __future__ import annotations

from datetime import date, datetime

import pyarrow as pa
import pyarrow.compute as pc

from traffic.accounting import transforms as T
from traffic.accounting.close.ledger import (_arrow_sums, _children_summary, _judge, _late_kept, _ledger_frame,
                                             _ledger_row, _published, _recheck, _side_table_runs, _sources_between,
                                             _store, _sums)
from traffic.accounting.parts import AMOUNTS, group_sums
from traffic.core.periods import (as_utc, day_start, days_between, days_of_month, hours_between, hours_of_day,
                                  month_start, period_end)
from traffic.core.settings import Settings
from traffic.quality.suites import Validation
from traffic.storage import state as st
from traffic.storage.schemas import arrow_schema
from traffic.storage.warehouse import Warehouse


def roll_up_days(settings: Settings, warehouse: Warehouse, days: list[date], frozen_now=frozenset(),
                 restated: str | None = None):
    """``daily`` for closed days in one pass: re-check their hours, roll up, check, publish.

    The day's hours are checked again first (their rows and ledger rows, except hours this run
    has just frozen): an hour found corrupt is marked failed and its day waits. Days roll up in
    order; the first one that cannot stops the rest. Returns (days rolled, failure messages, check).
    """
    from pyspark.sql import functions as F

    state = st.read_clock_state(warehouse)
    starts = sorted(day_start(d) for d in days)
    begin, end = starts[0], period_end(starts[-1], "day")
    ledger = st.read_ledger(warehouse, keys=sorted({month_start(s) for s in starts}))
    hours = {r["period_start"]: r for r in ledger if r["grain"] == "hour" and begin <= r["period_start"] < end}
    check = Validation(warehouse, "days", [("day", s) for s in starts], list(hours.values()))
    recheck = sorted(h for h in hours if h not in frozen_now)
    failures: list[str] = []
    changed: list[dict] = []
    if recheck:
        periods = [("hour", h) for h in recheck]
        rows_of = warehouse.table("hourly").read(keys=recheck)
        # As when they were frozen: the row suite checks the hours that have rows, every hour its ledger row.
        with_rows = {as_utc(h) for h in warehouse.table("hourly").read_arrow(keys=recheck, columns=["hour"])
                     .column("hour").to_pylist()}
        row_periods = [p for p in periods if p[1] in with_rows]
        runs = [("hourly", rows_of, row_periods, "hourly.recheck")] if row_periods else []
        check.validate_together(runs + _side_table_runs(warehouse, periods, "days"))
        final_sums = _arrow_sums(warehouse.table("hourly").read_arrow(
            keys=recheck, columns=["hour", "bytes", "packets"], filter=pc.field("status") == "final"), "hour")
        present = warehouse.table("packets").periods_with_files(recheck)
        raw = {}
        if present:
            packets = warehouse.table("packets").read(keys=present)
            raw = {as_utc(k): v for k, v in _sums(packets, "hour", [F.sum(T.weight()).alias("packets")]).items()}
        late_kept = _late_kept(settings, warehouse, recheck)
        view = []
        for h in recheck:
            source = raw.get(h)
            view.append({**hours[h], "table_bytes": final_sums.get(h, (0, 0))[0],
                         "table_packets": final_sums.get(h, (0, 0))[1],
                         "source_bytes": int(source["bytes"]) if source else None,
                         "source_packets": int(source["packets"]) if source else None,
                         "late_kept_bytes": late_kept[h]})
        check.validate("periods", _ledger_frame(view), periods, asset="periods.recheck-hours")
        changed = _recheck(check, [hours[h] for h in recheck], "hour")
        for row in changed:
            hours[row["period_start"]] = row
            failures.append(check.message("hour", row["period_start"]))
    rollable = _ready(starts, lambda day: hours_of_day(day, state.first_hour or day), hours)
    day_rows = []
    if rollable:
        day_rows = _roll_up_into(warehouse, check, "day", rollable, hours, restated, state.first_hour)
        failures += _judge(check, day_rows)
    check.record()
    st.write_ledger_rows(warehouse, _store(changed + day_rows), op="roll_up")
    return [s.date() for s in rollable], failures, check


_ROLLED_UP = {"day": "daily", "month": "monthly"}


def _ready(periods: list, parts_of, ledger: dict) -> list:
    """The leading ``periods`` each of whose parts (the hours of a day, the days of a month) is published in
    ``ledger``; the first that is not holds back every later one, as roll-ups go in order."""
    ready = []
    for period in periods:
        if not all(_published(ledger.get(part)) for part in parts_of(period)):
            break
        ready.append(period)
    return ready


def _rolled_in_arrow(warehouse: Warehouse, grain: str, periods: list[datetime]
                     ) -> tuple[pa.Table, dict[datetime, list[int]]]:
    """The rows of ``periods`` of a day (``daily``) or a month (``monthly``): their parts' final rows (hourly or
    daily) summed per address pair in Arrow; and per period the [Σ bytes, Σ packets] of the parts read,
    which the rolled rows as stored must equal (the ``periods`` suite's reconciliation).

    The parts were grouped per pair when they were made; a period adds up at most 24 or 31 such groups,
    which Arrow does on the driver faster than a Spark shuffle into the one task that writes a period
    (measured: a day of ~1.35 M hourly rows, 9.6 s so). Parts are read a few at a time and folded into
    the period's running sums, so memory stays near one period's distinct pairs, not all its parts'
    rows. Sums are overflow-checked (``group_sums``): a pair past 2**63 − 1 stops the roll-up in one line.
    """
    finer, part, parts_of = ("hourly", "hour", hours_between) if grain == "day" else ("daily", "day", days_between)
    final = (pc.field("status") == "final") if grain == "day" else None  # daily rows are final by making
    amounts = {c: (c, "sum") for c in AMOUNTS}
    schema = arrow_schema(_ROLLED_UP[grain])
    out, sums = [], {}
    for start in periods:
        running, total = None, [0, 0]
        parts = parts_of(start, period_end(start, grain))
        for i in range(0, len(parts), _PARTS_PER_FOLD):
            rows = warehouse.table(finer).read_arrow(keys=parts[i:i + _PARTS_PER_FOLD],
                                                     columns=[part, "local_ip", "remote_ip", *AMOUNTS], filter=final)
            for size, count in _arrow_sums(rows, part).values():
                total[0], total[1] = total[0] + size, total[1] + count
            rows = rows.drop_columns([part])
            running = group_sums(pa.concat_tables([running, rows] if running is not None else [rows]),
                                 ["local_ip", "remote_ip"], amounts)
        sums[start] = total
        stamps = {"day": start.date(), "month": start.date().replace(day=1)}
        for column in ("day", "month"):
            if column in schema.names:
                running = running.append_column(column, pa.array([stamps[column]] * running.num_rows, pa.date32()))
        out.append(running.select(schema.names).cast(schema))
    return (pa.concat_tables(out) if out else schema.empty_table()), sums


#: Parts (hours, days) read before they are folded into a period's running sums (``_rolled_in_arrow``).
_PARTS_PER_FOLD = 4


def _roll_up_into(warehouse: Warehouse, check, grain: str, rollable: list[datetime],
                  parts_by_start: dict[datetime, dict], restated: str | None, first_hour: datetime | None
                  ) -> list[dict]:
    """What a day's and a month's roll-up share: sum the parts into the coarser table (``_rolled_in_arrow``,
    replacing its periods), check the rows as stored, and build their ledger rows (their verdicts are set
    by the caller, ``_judge``). ``parts_by_start``: the parts' ledger rows by start; ``first_hour``: where the
    warehouse's hours begin (sources count as reporting in a period from there).
    """
    table = _ROLLED_UP[grain]
    keys = rollable
    rolled, from_parts = _rolled_in_arrow(warehouse, grain, rollable)
    warehouse.table(table).replace(rolled, keys=keys, op="roll_up")
    rolled = warehouse.table(table).read(keys=keys)
    stored = _arrow_sums(warehouse.table(table).read_arrow(keys=keys, columns=[grain, "bytes", "packets"]), grain)
    periods = [(grain, s) for s in rollable]
    check.validate(table, rolled, periods, asset=f"{table}.{grain}s")
    history = st.watermark_history(warehouse)
    rows = []
    for start in rollable:
        parts = [r for s, r in parts_by_start.items() if start <= s < period_end(start, grain)]
        rows.append(_rolled_up_row(warehouse, grain, start, period_end(start, grain), parts, stored.get(start, (0, 0)),
                                   from_parts.get(start), history, restated, first_hour))
    check.validate("periods", _ledger_frame(rows), periods, asset=f"periods.{grain}s")
    return rows


def _rolled_up_row(warehouse: Warehouse, grain: str, start: datetime, end: datetime, parts: list[dict],
                   stored: tuple[int, int], source: list[int] | None, history, restated: str | None,
                   first_hour: datetime | None) -> dict:
    """The ledger row of a rolled-up day or month, with the figures its checks compare.

    Its sources reporting are those with panes from the warehouse's first hour on (DESIGN §6), as for its
    hours: a month's first day starts at midnight, and a source's tick before the first hour that day
    counted it as reporting in the month but not in the day (found by the model's property test).
    """
    table_bytes, table_packets = stored
    children = _children_summary(parts)
    reporting = _sources_between(warehouse, max(start, first_hour or start), end)
    return {
        **_ledger_row(grain, start, stored, (children["late_bytes"], children["late_packets"]),
                      (reporting, children["sources_expected"], children["panes_active"]),
                      st.closed_at(history, end), restated, lost=children["lost"],
                      estimated_bytes=children["estimated_bytes"]),
        "table_bytes": table_bytes, "table_packets": table_packets,
        "source_bytes": int(source[0]) if source else 0,
        "source_packets": int(source[1]) if source else 0,
        "parts_bytes": sum(r["bytes"] for r in parts),
    }


def roll_up_months(warehouse: Warehouse, months: list[datetime], rolled_now=frozenset(), restated: str | None = None):
    """``monthly`` for closed months in one pass: re-check their days, roll up, check, publish.

    Like ``roll_up_days`` one level up: a day found corrupt (its rows no longer add up to its
    ledger row) is marked failed and its month waits. Returns (months rolled, failures, check).
    """
    months = sorted(months)
    ledger = st.read_ledger(warehouse, keys=months)
    days = {r["period_start"]: r for r in ledger if r["grain"] == "day"}
    hours = [r for r in ledger if r["grain"] == "hour"]
    check = Validation(warehouse, "months", [("month", m) for m in months], list(days.values()))
    recheck = sorted(d for d in days if d not in rolled_now)
    failures: list[str] = []
    changed: list[dict] = []
    if recheck:
        periods = [("day", d) for d in recheck]
        rows_of = warehouse.table("daily").read(keys=recheck)
        check.validate("daily", rows_of, periods, asset="daily.recheck")
        sums = _arrow_sums(warehouse.table("daily").read_arrow(keys=recheck,
                                                                columns=["day", "bytes", "packets"]), "day")
        view = [{**days[d], "table_bytes": sums.get(d, (0, 0))[0], "table_packets": sums.get(d, (0, 0))[1],
                 "parts_bytes": sum(h["bytes"] for h in hours if d <= h["period_start"] < period_end(d, "day"))}
                for d in recheck]
        check.validate("periods", _ledger_frame(view), periods, asset="periods.recheck-days")
        changed = _recheck(check, [days[d] for d in recheck], "day")
        for row in changed:
            days[row["period_start"]] = row
            failures.append(check.message("day", row["period_start"]))
    state = st.read_clock_state(warehouse)
    rollable = _ready(months, lambda month: days_of_month(month, state.first_hour or month), days)
    month_rows = []
    if rollable:
        month_rows = _roll_up_into(warehouse, check, "month", rollable, days, restated, state.first_hour)
        failures += _judge(check, month_rows)
    check.record()
    st.write_ledger_rows(warehouse, _store(changed + month_rows), op="roll_up")
    return rollable, failures, check


def roll_up_day(settings: Settings, warehouse: Warehouse, day: date, restated: str | None = None) -> None:
    """``daily`` for one closed day (checked like any roll-up; kept for restatements)."""
    roll_up_days(settings, warehouse, [day], restated=restated)


def roll_up_month(warehouse: Warehouse, month: datetime, restated: str | None = None) -> None:
    """``monthly`` for one closed month (checked like any roll-up; kept for restatements)."""
    roll_up_months(warehouse, [month], restated=restated)
