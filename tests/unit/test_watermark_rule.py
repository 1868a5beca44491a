"""The watermark's rule, defined once (``conditions.watermark_reached``) and asked by the hourly DAG's sensor."""

from datetime import datetime, timedelta, timezone

import pytest

from traffic.orchestration import conditions, dag_support
from traffic.orchestration.conditions import watermark_reached

UTC = timezone.utc
END = datetime(2026, 11, 20, 1, tzinfo=UTC)


@pytest.mark.parametrize("watermark, passed", [
    (None, False),  # no data yet: no interval has passed
    (END - timedelta(microseconds=1), False),
    (END, True),  # W = the interval's end: every hour ending by then is closed
    (END + timedelta(hours=3), True),
])
def test_an_interval_has_passed_once_the_watermark_reaches_its_end(watermark, passed):
    assert watermark_reached(watermark, END) is passed, (watermark, END)


@pytest.mark.parametrize("watermark, passed, said", [(None, False, "none yet"), (END, True, "passed"),
                                                     (END - timedelta(minutes=5), False, "waiting")])
def test_the_sensor_reads_the_watermark_once_and_says_what_it_decided(monkeypatch, caplog, watermark, passed, said):
    reads = []
    monkeypatch.setattr(dag_support, "settings_from_env", lambda: "settings")
    monkeypatch.setattr(conditions, "watermark", lambda settings: reads.append(settings) or watermark)
    with caplog.at_level("INFO", logger=dag_support.__name__):
        assert dag_support.watermark_sensor("2026-11-20T01:00:00+00:00") is passed
    assert reads == ["settings"]
    assert said in caplog.text and "2026-11-20 01:00:00" in caplog.text, caplog.text
