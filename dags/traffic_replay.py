"""Replay: import archived input files for a date range in one Spark application (manual, form in the UI).

Trigger it from the UI (**Trigger** → the form below) or the REST API with `conf`:

| field | meaning |
|---|---|
| `from`, `to` | the event-time range `[from, to)` to import (UTC date-times) |
| `input` | folder of archived files on the worker's filesystem, laid out like the inbox (`<source>/<file>`) |
| `source` | optional: the source of every file (default: the sub-folder name) |
| `restate` | replace an already frozen range from the archive (audited; whole hours only) |
| `reason` | why the range is restated — required with `restate`, recorded in the ledger |

`check_request` validates the form without a JVM (a missing reason fails there, visibly);
`replay` runs `jobs/replay.py` with those arguments: into a range that is still open the
records count normally, into a closed range they are late unless the run restates it, and
what can be closed afterwards is closed in the same application.

**Backfill or replay?** `traffic_hourly`'s backfill re-runs the close of hours whose data is
already in the warehouse (idempotent, seconds per final hour). `traffic_replay` brings data
that never went through the inbox (an archive, a re-export after a fix) into the warehouse.

Manual only (`schedule=None`), one run at a time.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from airflow.sdk import Param, dag, task

from traffic.orchestration.dag_operators import spark_job

ROOT = Path(__file__).absolute().parent.parent


def _replay_args(params) -> list[str]:
    """Template macro: the form's values as `jobs/replay.py` arguments (optional ones only when given)."""
    from traffic.orchestration.replay_form import replay_arguments

    return replay_arguments(params)


@dag(
    dag_id="traffic_replay",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["traffic", "replay", "spark"],
    default_args={"owner": "traffic", "retries": 1, "retry_delay": timedelta(minutes=1)},
    # The argument list is rendered as a real list (optional flags appear only when set).
    render_template_as_native_obj=True,
    user_defined_macros={"replay_args": _replay_args},
    params={
        "from": Param(type="string", format="date-time", title="From (UTC)",
                      description="Start of the event-time range to import, inclusive."),
        "to": Param(type="string", format="date-time", title="To (UTC)",
                    description="End of the event-time range, exclusive."),
        "input": Param(type="string", minLength=1, title="Input folder",
                       description="Folder of archived files on the worker (sub-folder = source)."),
        "source": Param(None, type=["null", "string"], title="Source",
                        description="Optional: the source of every file (default: the sub-folder name)."),
        "restate": Param(False, type="boolean", title="Restate a frozen range",
                         description="Replace already frozen hours from the archive (audited, whole hours)."),
        "reason": Param(None, type=["null", "string"], title="Reason",
                        description="Why the range is restated: required when restating, recorded in the ledger."),
    },
)
def traffic_replay():
    @task
    def check_request(params=None) -> list[str]:
        """Validate the form (dates, folder, reason when restating) before any JVM starts."""
        from traffic.orchestration.replay_form import replay_arguments

        return replay_arguments(params)

    # The full JIT (big work), and always spark-submit: a replay is not a warm server's client.
    replay = spark_job(ROOT, "replay", timeout=timedelta(hours=2), quick_by_default=False,
                       application_args="{{ replay_args(params) }}")

    check_request() >> replay


traffic_replay()
