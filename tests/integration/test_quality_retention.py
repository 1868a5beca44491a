"""dq_retention expires the check results of old periods everywhere: dq_results, GX's stores, Data Docs."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tests.support.harness import Harness, feed_line, tick_line
from traffic.quality.gx_context import reports_dir

UTC = timezone.utc
T0 = datetime(2026, 10, 31, 22, tzinfo=UTC)


def _runs(harness: Harness, store: str) -> set[str]:
    root = reports_dir(harness.warehouse()) / store / "validations"
    return {run.name for run in root.glob("*/*")}


def test_a_close_past_the_retention_removes_the_old_months_validation_runs_and_pages(spark, tmp_path):
    harness = Harness(tmp_path, spark, dq_retention="1h")
    harness.deliver("r1", "\n".join([feed_line(T0 + timedelta(minutes=m)) for m in range(0, 120, 10)]
                                    + [tick_line(T0 + timedelta(hours=2, minutes=30))]) + "\n")
    harness.ingest()
    harness.close()  # freezes 22:00, 23:00; rolls up Oct 31 and October; retention bound: October 1
    october = {run for run in _runs(harness, "gx") if "202610" in run.split("-")[-2]}
    assert {run.split("-")[0] for run in october} >= {"freeze", "days", "months"}, october
    assert october <= _runs(harness, "data_docs")

    harness.deliver("r1", "\n".join([feed_line(T0 + timedelta(hours=3, minutes=m)) for m in range(0, 60, 10)]
                                    + [tick_line(T0 + timedelta(days=1, hours=3))]) + "\n")
    harness.ingest()
    harness.close()  # watermark Nov 2 01:00: bound month_start(Nov 1 23:00) = November 1
    left = _runs(harness, "gx")
    assert not october & left and not october & _runs(harness, "data_docs")
    assert any(run.startswith("freeze-20261101") for run in left), left  # November's runs stay
    assert not [r for r in harness.table("dq_results") if r["period_start"] < datetime(2026, 11, 1, tzinfo=UTC)]
    index = (reports_dir(harness.warehouse()) / "data_docs" / "index.html").read_text()
    assert not any(run in index for run in october)
