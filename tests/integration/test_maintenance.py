"""What the close's maintenance does to the files of a warehouse, and that it changes no row.

Frozen days of the tables kept forever are merged into one file each (``Table.merge``), and every
``VACUUM_EVERY`` the files no current row is in are deleted from disk (``Table.vacuum``). Here the
retention of removed files is cut to zero and the vacuum runs at every close, so that a short
scenario shows what a long one would: on disk, only the live files; in the tables, the same rows
as a warehouse whose close neither merges nor vacuums.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.support.harness import Harness, feed_line, tick_line
from traffic.accounting.close import maintenance as close_mod
from traffic.storage import table as delta_table
from traffic.storage.engines.rs import RsTable
from traffic.storage.schemas import TABLES, columns

UTC = timezone.utc
T0 = datetime(2026, 10, 30, 20, tzinfo=UTC)
#: The module values the ``runs`` fixture patches, as imported.
BEFORE = (close_mod.MERGED, close_mod.VACUUM_EVERY, dict(delta_table.TABLE_CONFIGURATION))


def _run(harness: Harness) -> None:
    """Three days in four deliveries of 18 hours each, a close after each (days and a month roll up)."""
    for n in range(4):
        start = T0 + timedelta(hours=18 * n)
        lines = [feed_line(start + timedelta(minutes=m), f"10.0.0.{m % 3 + 1}", f"192.0.2.{n + 1}", size=100 + m)
                 for m in range(0, 18 * 60, 17)]
        harness.deliver("r1", "\n".join(lines + [tick_line(start + timedelta(hours=18, minutes=5))]) + "\n")
        harness.ingest()
        harness.close()


def _on_disk(table) -> set[str]:
    return {p.relative_to(Path(table.path)).as_posix() for p in Path(table.path).rglob("*.parquet") if "_delta_log" not in p.parts}


@pytest.fixture(scope="module")
def runs(spark, tmp_path_factory):
    base = tmp_path_factory.mktemp("maintenance")
    plain = Harness(base / "plain", spark, keep_hours=3)
    # (``MonkeyPatch.context``: the module-scoped form of the ``monkeypatch`` fixture, undone even when a run
    # fails, so no later test runs with these module values.)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(close_mod, "MERGED", ())
        patch.setattr(close_mod, "VACUUM_EVERY", timedelta(days=365))
        _run(plain)
    kept = Harness(base / "kept", spark, keep_hours=3)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(delta_table.TABLE_CONFIGURATION, "delta.deletedFileRetentionDuration", "interval 0 seconds")
        patch.setattr(close_mod, "VACUUM_EVERY", timedelta(0))
        _run(kept)
    return plain, kept


def test_merging_and_vacuuming_change_no_row(runs):
    plain, kept = runs
    for name in TABLES:
        if name in ("batches", "dq_results"):  # wall-clock stamps and run ids differ by design
            continue
        assert plain.tables({name: columns(name)}) == kept.tables({name: columns(name)}), name


def test_frozen_days_are_one_file_each(runs):
    plain, kept = runs
    assert kept.watermark >= datetime(2026, 11, 2, 19, tzinfo=UTC)  # Oct 30 to Nov 1 are frozen and rolled up
    for name in ("hourly", "panes"):
        keys = sorted(f.key for f in kept.warehouse().table(name).files())
        assert keys[:3] == ["2026-10-30", "2026-10-31", "2026-11-01"], (name, keys)
        assert all(k >= "2026-11-02T00" for k in keys[3:]), (name, keys)
        assert len(plain.warehouse().table(name).files()) >= 52  # an hour a file without the merge
    assert sorted(f.key for f in kept.warehouse().table("daily").files()) == ["2026-10", "2026-11-01"]


def test_only_live_files_stay_on_disk(runs):
    plain, kept = runs
    for name in TABLES:
        table = kept.warehouse().table(name)
        live = {f.path for f in table.files()}
        assert _on_disk(table) == live, name
        folders = [p for p in Path(table.path).rglob("*") if p.is_dir() and "_delta_log" not in p.parts]
        assert all(any(folder.iterdir()) for folder in folders), name  # no empty folder left behind
    # Without the vacuum, every file a commit ever removed is still there.
    hourly = plain.warehouse().table("hourly")
    assert len(_on_disk(hourly)) >= 2 * len(hourly.files())  # each hour written open, then final


def test_the_runs_leave_the_module_settings_as_they_were(runs):
    """What the fixture patched is undone: later tests close with the real merge, vacuum period and retention."""
    assert (close_mod.MERGED, close_mod.VACUUM_EVERY, delta_table.TABLE_CONFIGURATION) == BEFORE


def test_a_new_warehouse_waits_a_vacuum_period_before_its_first(spark, tmp_path, monkeypatch):
    harness = Harness(tmp_path, spark)
    harness.deliver("r1", "\n".join([feed_line(T0), tick_line(T0 + timedelta(hours=1, minutes=5))]) + "\n")
    harness.ingest()
    calls = []
    monkeypatch.setattr(RsTable, "vacuum", lambda self, retention_hours=None: calls.append(self.name) or [])
    harness.close()
    stamp = harness.warehouse().state_dir() / "vacuumed"
    assert stamp.exists() and not calls
    monkeypatch.setattr(close_mod, "VACUUM_EVERY", timedelta(0))
    close_mod.maintain(harness.warehouse())
    assert sorted(calls) == sorted(close_mod.MAINTAINED + ("monthly", "bills", "alerts"))
