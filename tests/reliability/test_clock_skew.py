"""One source's wrong clock (issue 20 item 8): it never makes another, still delivering, source late.

Two sources deliver in the same batches; one exporter stamps its records two hours ahead. The
other is live because it delivers (stall is decided by absence, not by distance: docs/semantics.md,
"Clocks and the watermark"), so its next batch is on time. The source far ahead is flagged in
``traffic status``, in the report, and as a data-quality warning on the hours closed meanwhile.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from tests.support.harness import Harness, feed_line, tick_line
from traffic.reporting.report import status

UTC = timezone.utc
T0 = datetime(2026, 11, 1, 10, tzinfo=UTC)
NOW = datetime(2026, 11, 2, tzinfo=UTC)
AHEAD = timedelta(hours=2)


def _h(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def _lines(start: float, end: float, shift: timedelta = timedelta(0), local: str = "10.0.0.1") -> str:
    return "\n".join(feed_line(_h(m) + shift, local) for m in range(int(start), int(end), 5)) + "\n"


def test_a_source_stamped_two_hours_ahead_never_makes_a_delivering_source_late(spark, tmp_path):
    harness = Harness(tmp_path, spark, now=NOW.isoformat(), source_timeout=3600)
    # Batch 1: a (right clock) 10:00-10:55, b (exporter clock two hours ahead) "12:00-12:55".
    harness.deliver("a", _lines(0, 60))
    harness.deliver("b", _lines(0, 60, AHEAD, "10.0.0.2"))
    harness.ingest()
    # a delivered in this batch, so it is live: W follows a, not b.
    assert harness.watermark == _h(55)
    # Batch 2: both go on. Every one of a's records is on time.
    harness.deliver("a", _lines(60, 120))
    harness.deliver("b", _lines(60, 120, AHEAD, "10.0.0.2"))
    result = harness.ingest()
    assert (result.packets_late, result.packets_on_time) == (0, 24), result
    assert harness.table("late_packets") == []
    assert harness.watermark == _h(115)
    clocks = {r["source"]: r for r in harness.table("clocks")}
    assert clocks["a"]["last_seen_at"] == clocks["b"]["last_seen_at"] == _h(115) + AHEAD

    # Flagged: status (and its one line in `traffic status`), the hour it closed, the report.
    info = status(harness.settings)
    assert info["live_sources"] == ["a", "b"]
    assert info["far_ahead"] == {"b": AHEAD}
    assert any("source b's clock is 2 h ahead" in w for w in info["warnings"]), info["warnings"]
    harness.close()
    hours = {r["period_start"]: r for r in harness.table("periods") if r["grain"] == "hour"}
    assert sorted(hours) == [T0]  # W 11:55 closes hour 10 only
    assert hours[T0]["dq_status"] == "warning"
    assert "no source clock far ahead of the others when the hour closed" in hours[T0]["dq_note"]
    assert "'b'" in hours[T0]["dq_note"]
    page = (harness.settings.warehouse / "_reports" / "index.html").read_text()
    assert 'id="clock-warnings"' in page and "source b&#x27;s clock is 2 h ahead" in page

    # b's exporter is fixed: its clock waits for real time to catch up (a tick at its last time), a
    # goes on to one hour behind it and closes hour 11 with nobody far ahead: that hour passes.
    harness.deliver("a", _lines(120, 180))
    harness.deliver("b", tick_line(_h(115) + AHEAD) + "\n")
    harness.ingest()
    assert status(harness.settings)["far_ahead"] == {}
    harness.close()
    hours = {r["period_start"]: r for r in harness.table("periods") if r["grain"] == "hour"}
    assert hours[T0 + timedelta(hours=1)]["dq_status"] == "passed"
    assert hours[T0]["dq_status"] == "warning"  # a published period keeps its verdict


def test_status_command_prints_the_far_ahead_source(spark, tmp_path, capsys):
    from traffic.app.cli import main

    harness = Harness(tmp_path, spark, now=NOW.isoformat(), source_timeout=3600)
    harness.deliver("a", _lines(0, 30))
    harness.deliver("b", _lines(0, 30, AHEAD, "10.0.0.2"))
    harness.ingest()
    args = ["--warehouse", str(harness.settings.warehouse), "--inbox", str(harness.settings.inbox)]
    assert main(["status", *args]) == 0
    out = capsys.readouterr().out
    assert "source b" in out and "(live, 2:00:00 ahead of the others)" in out
    assert "source a" in out and "clock 2026-11-01 10:25" in out
    assert [line for line in out.splitlines() if line.startswith("warning")] == [
        "warning     source b's clock is 2 h ahead of every other live source's (more than source_timeout 1 h): "
        "a wrong exporter clock? the hours closed meanwhile are flagged"]
    assert main(["status", "--json", *args]) == 0
    assert json.loads(capsys.readouterr().out)["far_ahead"] == {"b": "2:00:00"}
