"""What ``traffic export`` writes of a period, and which rows a range holds, on inline cases."""

from __future__ import annotations

from datetime import date, datetime, timezone

import pyarrow as pa
import pytest

from traffic.core.settings import SettingsError
from traffic.reporting.export import EXPORTS, Exportable, Publication, _final_rows, _in_range, exportable
from traffic.storage.schemas import TABLES, cluster

UTC = timezone.utc
H = [datetime(2026, 11, 1, h, tzinfo=UTC) for h in range(6)]


def _publication() -> Publication:
    """Hours 1-3 frozen (2 failed, 3 accepted), hour 0 before the first hour, day 2026-10-31 rolled up."""
    status = {("hour", H[1]): "passed", ("hour", H[2]): "failed", ("hour", H[3]): "accepted",
              ("day", datetime(2026, 10, 31, tzinfo=UTC)): "warning"}
    return Publication(status, frontier=H[4])


def test_a_period_is_published_failed_or_open_by_the_ledger():
    publication = _publication()
    assert [publication.state("hour", h) for h in H] == ["published", "published", "unpublished", "published",
                                                         "open", "open"]
    assert publication.state("day", datetime(2026, 10, 31, tzinfo=UTC)) == "published"
    assert publication.state("day", datetime(2026, 11, 1, tzinfo=UTC)) == "open"  # no roll-up in the ledger yet
    assert Publication({}, None).state("hour", H[0]) == "open"  # nothing frozen: every hour is open


def test_final_rows_leave_out_open_and_failed_rows_and_include_open_only_adds_open_ones():
    spec = Exportable("hour", ("local_ip",), "hour", "hour", status=True)
    rows = pa.table({"hour": pa.array([H[1], H[1], H[2], H[3], H[4], H[5]], pa.timestamp("us", tz="UTC")),
                     "local_ip": ["a", "b", "c", "d", "e", "f"],
                     "status": ["final", "open", "final", "final", "open", "open"]})
    kept, left_open, failed = _final_rows(rows, spec, _publication(), include_open=False)
    assert kept.column("local_ip").to_pylist() == ["a", "d"] and (left_open, failed) == (3, 1)
    kept, left_open, failed = _final_rows(rows, spec, _publication(), include_open=True)
    assert kept.column("local_ip").to_pylist() == ["a", "b", "d", "e", "f"] and (left_open, failed) == (0, 1)


def test_a_pane_belongs_to_its_hour_and_a_day_to_its_ledger_day():
    panes = Exportable("pane_start", ("source",), "pane_start", "hour")
    rows = pa.table({"pane_start": pa.array([datetime(2026, 11, 1, 2, 55, tzinfo=UTC),
                                             datetime(2026, 11, 1, 3, 5, tzinfo=UTC)], pa.timestamp("us", tz="UTC")),
                     "source": ["r1", "r1"]})
    assert _final_rows(rows, panes, _publication(), False)[0].num_rows == 1  # hour 2 failed, hour 3 accepted
    days = Exportable("day", (), "day", "day")
    rows = pa.table({"day": pa.array([date(2026, 10, 31), date(2026, 11, 1)], pa.date32())})
    kept, left_open, failed = _final_rows(rows, days, _publication(), False)
    assert kept.column("day").to_pylist() == [date(2026, 10, 31)] and (left_open, failed) == (1, 0)


def test_a_range_is_half_open_and_a_date_is_in_it_when_it_starts_in_it():
    stamp = pa.timestamp("us", tz="UTC")
    rows = pa.table({"ts": pa.array([datetime(2026, 11, 1, 9, 59, 59, 999999, tzinfo=UTC), H[0].replace(hour=10),
                                      datetime(2026, 11, 1, 10, 59, 59, tzinfo=UTC), H[0].replace(hour=11)], stamp)})
    kept = _in_range(rows, "ts", H[0].replace(hour=10), H[0].replace(hour=11))
    assert kept.column("ts").to_pylist() == [H[0].replace(hour=10), datetime(2026, 11, 1, 10, 59, 59, tzinfo=UTC)]
    days = pa.table({"day": pa.array([date(2026, 10, 31), date(2026, 11, 1), date(2026, 11, 2)], pa.date32())})
    assert _in_range(days, "day", datetime(2026, 10, 31, 10, tzinfo=UTC),
                     datetime(2026, 11, 2, tzinfo=UTC)).column("day").to_pylist() == [date(2026, 11, 1)]
    assert _in_range(days, "day", datetime(2026, 10, 31, tzinfo=UTC),
                     datetime(2026, 11, 2, 0, 0, 1, tzinfo=UTC)).column("day").to_pylist() == \
        [date(2026, 10, 31), date(2026, 11, 1), date(2026, 11, 2)]


def test_every_export_names_real_columns_and_reads_by_the_tables_own_keys():
    from traffic.storage.schemas import columns

    assert set(EXPORTS) <= set(TABLES) and {"clocks", "flow_state"}.isdisjoint(EXPORTS)
    for name, spec in EXPORTS.items():
        assert {spec.time, *spec.order, *([spec.period] if spec.period else [])} <= set(columns(name)), name
        key = cluster(name)
        # The time column is the file key's column, or one whose floor it is (packets: ts → hour).
        assert key is None and name == "batches" or key.column in (spec.time, "hour"), name
    with pytest.raises(SettingsError, match="choose one of hourly, daily, monthly"):
        exportable("clocks")
