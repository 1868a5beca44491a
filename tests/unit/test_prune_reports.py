"""Which stored validation runs dq_retention removes: decided by the last period in the run's name."""

from __future__ import annotations

from datetime import datetime, timezone

from traffic.storage.warehouse import Warehouse
from traffic.quality.data_docs import prune_reports, run_periods_end
from traffic.quality.gx_context import reports_dir
from traffic.core.settings import load_settings

UTC = timezone.utc


def test_the_last_period_is_read_from_every_kind_of_run_name():
    assert run_periods_end("freeze-20261031T2200Z-20261031T2300Z-1a2b3c4d") == datetime(2026, 10, 31, 23, tzinfo=UTC)
    assert run_periods_end("freeze-20261101T0000Z-be32ddba") == datetime(2026, 11, 1, tzinfo=UTC)
    assert run_periods_end("days-20261031-968b5f39") == datetime(2026, 10, 31, tzinfo=UTC)
    assert run_periods_end("months-202610-0f0f0f0f") == datetime(2026, 10, 1, tzinfo=UTC)
    assert run_periods_end("bills-20261015T0000Z-aa55aa55") == datetime(2026, 10, 15, tzinfo=UTC)
    for foreign in ("manual", "freeze-yesterday-1a2b3c4d", "days-20261399-1a2b3c4d", "x-1a2b3c4d"):
        assert run_periods_end(foreign) is None, foreign


def test_runs_before_the_bound_go_from_both_stores_and_nothing_else_does(tmp_path):
    warehouse = Warehouse(load_settings(environ={}, overrides={"warehouse": tmp_path / "wh"}), engine="rs")
    root = reports_dir(warehouse)
    runs = {"freeze-20261031T2200Z-20261031T2300Z-1a2b3c4d": False, "days-20261031-968b5f39": False,
            "months-202610-0f0f0f0f": False, "freeze-20261031T2300Z-20261101T0100Z-5e5e5e5e": True,
            "days-20261101-c6a881de": True, "somebody-elses-run": True}
    for store, suffix in (("gx", "json"), ("data_docs", "html")):
        for run in runs:
            page = root / store / "validations" / "hourly" / run / "20261122T140233.014627Z" / f"batch.{suffix}"
            page.parent.mkdir(parents=True)
            page.write_text("{}")
    (root / "data_docs" / "index.html").write_text("<html></html>")
    assert prune_reports(warehouse, datetime(2026, 11, 1, tzinfo=UTC)) == 3
    for store in ("gx", "data_docs"):
        kept = {p.name for p in (root / store / "validations" / "hourly").iterdir()}
        assert kept == {run for run, keep in runs.items() if keep}, store
    assert (root / "data_docs" / "index.html").is_file()
    assert prune_reports(warehouse, datetime(2026, 11, 1, tzinfo=UTC)) == 0


def test_the_store_keeps_the_newest_results_and_the_rest_moves_to_the_archive(tmp_path):
    """GX lists its whole store to rebuild the Data Docs index after every close: older results move to
    ``gx/archive`` (same layout, their Data Docs pages untouched), and retention expires them there too."""
    from traffic.quality.data_docs import archive_results
    from traffic.quality.gx_context import DOCS_INDEX_RUNS

    warehouse = Warehouse(load_settings(environ={}, overrides={"warehouse": tmp_path / "wh"}), engine="rs")
    root = reports_dir(warehouse)
    store, archive = root / "gx" / "validations", root / "gx" / "archive"
    made = []
    for n in range(DOCS_INDEX_RUNS + 6):
        suite = ("hourly", "packets")[n % 2]
        run = f"freeze-202610{1 + n // 24:02d}T{n % 24:02d}00Z-{n:08x}"
        result = store / suite / run / f"20261122T14{n // 60:02d}{n % 60:02d}.000000Z" / f"traffic-{suite}.json"
        result.parent.mkdir(parents=True)
        result.write_text("{}")
        page = root / "data_docs" / "validations" / suite / run / result.parent.name / "page.html"
        page.parent.mkdir(parents=True)
        page.write_text("<html></html>")
        made.append(result)
    assert archive_results(root) == 6
    kept = sorted(p.relative_to(store) for p in store.glob("*/*/*/*.json"))
    assert kept == sorted(p.relative_to(store) for p in made[6:])
    assert sorted(p.relative_to(archive) for p in archive.glob("*/*/*/*.json")) == \
        sorted(p.relative_to(store) for p in made[:6])
    assert not (store / "hourly" / made[0].parts[-3]).exists()  # the moved run's folders are gone
    assert len(list((root / "data_docs" / "validations").glob("*/*/*/*.html"))) == DOCS_INDEX_RUNS + 6
    assert archive_results(root) == 0
    # Retention removes runs whose periods all end before the bound, from the archive as from the store.
    assert prune_reports(warehouse, datetime(2026, 10, 1, 6, tzinfo=UTC)) == 6
    assert not list(archive.glob("*/*/*/*.json")) and len(kept) == DOCS_INDEX_RUNS
