"""The ``periods`` suite judges each period of a close on its own, however many fail (DESIGN §6)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from traffic.accounting.close.ledger import _ledger_frame, _ledger_row
from traffic.core.settings import load_settings
from traffic.quality.suites import Validation
from traffic.storage.warehouse import Warehouse

UTC = timezone.utc


def _hour_row(start: datetime, ahead: str | None) -> dict:
    row = _ledger_row("hour", start, (0, 0), (0, 0), (1, 1, 12), start + timedelta(hours=1), None)
    return {**row, "table_bytes": 0, "table_packets": 0, "source_bytes": 0, "source_packets": 0,
            "late_kept_bytes": 0, "rows_differing": 0, "panes_bytes": 0, "panes_packets": 0, "sources_ahead": ahead}


def test_a_catch_up_where_most_hours_fail_a_check_still_passes_the_hours_that_held(tmp_path):
    """A close of 1,200 hours, 1,150 closed while a source was far ahead: those are warnings, the last 50
    passed (found by the model property test: beyond a fixed sample every hour of the close was flagged)."""
    warehouse = Warehouse(load_settings(environ={}, overrides={"warehouse": tmp_path / "wh"}), engine="rs")
    first = datetime(2026, 9, 16, 20, tzinfo=UTC)
    rows = [_hour_row(first + timedelta(hours=i), "b" if i < 1150 else None) for i in range(1200)]
    periods = [("hour", r["period_start"]) for r in rows]
    check = Validation(warehouse, "freeze", periods)
    check.validate("periods", _ledger_frame(rows), periods)
    verdicts = [check.status("hour", start) for _, start in periods]
    assert {status for status, _ in verdicts[:1150]} == {"warning"}
    assert all("far ahead" in note for _, note in verdicts[:1150])
    assert verdicts[1150:] == [("passed", None)] * 50
