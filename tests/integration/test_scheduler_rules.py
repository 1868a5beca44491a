"""The hourly close decides its steps by the close's own rules (``plan_close``, under the warehouse lock)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tests.support.harness import Harness, feed_line, tick_line
from traffic.app.runs import close
from traffic.orchestration.dag_support import decide_close
from traffic.storage import state as st

UTC = timezone.utc
T0 = datetime(2026, 11, 1, 20, tzinfo=UTC)


def test_a_day_with_a_failed_hour_is_not_waiting_so_no_roll_up_is_submitted(spark, tmp_path):
    harness = Harness(tmp_path, spark)
    harness.deliver("r1", "".join(feed_line(T0 + timedelta(minutes=20 * m)) + "\n" for m in range(12))
                    + tick_line(datetime(2026, 11, 2, 2, tzinfo=UTC)) + "\n")
    harness.ingest()
    close(harness.settings, lambda: spark, progress=lambda *_: None, only=("freeze",))
    midnight = datetime(2026, 11, 2, tzinfo=UTC)
    assert decide_close(harness.settings, midnight).days == [T0.date()]  # its hours are frozen and published
    warehouse = harness.warehouse()
    hour = next(r for r in st.read_ledger(warehouse, "hour") if r["period_start"] == T0 + timedelta(hours=1))
    st.write_ledger_rows(warehouse, [{**hour, "dq_status": "failed", "dq_note": "test: a failed check"}])
    # The close would not roll the day up (its hour 21:00 is not published), so the DAG must not wait for it.
    decision = decide_close(harness.settings, midnight)
    assert (decision.days, decision.months) == ([], [])
