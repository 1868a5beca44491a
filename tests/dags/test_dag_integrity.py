"""Every DAG file parses with no top-level I/O or heavy imports, and declares what the contract asks.

What a parse does is observed in a fresh interpreter per file (Airflow itself is imported first, as
in the DAG processor, so only the DAG file's own imports and side effects count); the DAG objects are
then loaded the way Airflow loads them, with a DagBag over ``dags/``. What makes a parse fast is
asserted here (no heavy module, no I/O); how long it takes is measured by ``bench/timings.py
--only dag-parse`` (targets: first parse < 2.0 s, a re-parse < 0.5 s), not on busy test workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DAG_FILES = sorted((ROOT / "dags").glob("*.py"))
DAG_IDS = {"traffic_ingest", "traffic_hourly", "traffic_replay"}
HEAVY = ("pyspark", "pandas", "great_expectations", "traffic", "deltalake", "pyarrow")
#: What a DAG file may import of the project at parse: how it declares a Spark task (Airflow only, nothing heavy).
PARSE_TIME = {"traffic", "traffic.orchestration", "traffic.orchestration.dag_operators"}

# Runs in a fresh interpreter: import Airflow's SDK (as the DAG processor has), then run the DAG file
# twice under an audit hook — the first run includes Airflow's own lazy imports (cold), the second
# is what every re-parse costs (warm). I/O done while a library module is being imported is
# Airflow's, not the DAG file's, and is left out.
_PROBE = r"""
import json, runpy, sys, time
from airflow.sdk import dag, task  # noqa: F401

path = sys.argv[1]
prefixes = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
events = []

def importing():
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False

def hook(event, args):
    if event == "open":
        name = str(args[0])
        if name.endswith((".py", ".pyc", ".so")) or name.startswith(prefixes) or importing():
            return
        events.append(f"open {name}")
    elif event in ("socket.connect", "subprocess.Popen", "os.system", "sqlite3.connect", "urllib.Request",
                   "os.exec", "os.posix_spawn", "shutil.rmtree", "os.remove", "os.mkdir") and not importing():
        events.append(f"{event} {args[0] if args else ''}")

before = set(sys.modules)
sys.addaudithook(hook)
seconds = []
for _ in range(2):
    clock = time.perf_counter()
    runpy.run_path(path, run_name="dag_under_test")
    seconds.append(time.perf_counter() - clock)
print(json.dumps({"cold": seconds[0], "warm": seconds[1], "new_modules": sorted(set(sys.modules) - before),
                  "io": events}))
"""


def _probe(path: Path, **env) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "AIRFLOW_HOME": env.pop("airflow_home"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", **env},
    )
    assert result.returncode == 0, f"{path.name} failed to import:\n{result.stderr[-3000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("airflow-home"))


@pytest.fixture(scope="module")
def dagbag(airflow_home):
    """The DAGs as Airflow's own loader sees them (in this process, with a throw-away AIRFLOW_HOME)."""
    os.environ.setdefault("AIRFLOW_HOME", airflow_home)
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert not bag.import_errors, f"import errors: {bag.import_errors}"
    return bag


def test_there_are_the_three_dags():
    assert {p.stem for p in DAG_FILES} == DAG_IDS


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_dag_file_imports_without_io_or_heavy_imports(path, airflow_home):
    # Settings are read when a task runs, never at parse time: bogus ones must not matter here.
    report = _probe(path, airflow_home=airflow_home, TRAFFIC_WAREHOUSE="/nonexistent/warehouse",
                    TRAFFIC_CONFIG="/nonexistent/config.toml")
    heavy = [m for m in report["new_modules"] if m.split(".")[0] in HEAVY and m not in PARSE_TIME]
    assert heavy == [], f"{path.name} imports at top level: {heavy}"
    assert report["io"] == [], f"{path.name} does I/O at parse time: {report['io']}"


def test_every_dag_declares_docs_tags_retries_and_a_utc_start(dagbag):
    assert set(dagbag.dags) == DAG_IDS
    for dag_id, dag in dagbag.dags.items():
        assert dag.doc_md and len(dag.doc_md) > 200, f"{dag_id}: doc_md should be the module docstring"
        assert dag.tags and "traffic" in dag.tags, f"{dag_id}: tags {dag.tags}"
        assert dag.start_date is not None and dag.start_date.utcoffset() == timedelta(0), f"{dag_id}: start_date"
        assert dag.catchup is False, f"{dag_id}: catchup"
        assert dag.max_active_runs == 1, f"{dag_id}: max_active_runs"
        for task in dag.tasks:
            assert task.retries >= 1, f"{dag_id}.{task.task_id}: retries={task.retries}"


def test_spark_tasks_submit_the_jobs_with_the_settings_passed_at_run_time(dagbag):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    jobs = {}
    for dag in dagbag.dags.values():
        for task in dag.tasks:
            if isinstance(task, SparkSubmitOperator):
                jobs[(dag.dag_id, task.task_id)] = (Path(task.application), task.application_args)
                assert Path(task.application).is_file(), task.application
                assert task.env_vars is None, "env_vars are filled in when the task runs, not at parse time"
                assert task._pre_execute_hook is not None
                assert task._conn_id == "spark_default"
    assert {k: v[0].name for k, v in jobs.items()} == {
        ("traffic_ingest", "ingest"): "ingest.py",
        ("traffic_replay", "replay"): "replay.py",
    }  # the hourly close submits jobs/close.py from its one `close` task (tests/unit/test_spark_step.py)


def test_spark_submit_env_passes_traffic_settings_and_the_venv_python():
    from traffic.orchestration.spark_tasks import spark_submit_env

    env = spark_submit_env({"TRAFFIC_WAREHOUSE": "/w", "TRAFFIC_KEEP_HOURS": "2", "HOME": "/root", "PATH": "/usr/bin"})
    assert env["TRAFFIC_WAREHOUSE"] == "/w" and env["TRAFFIC_KEEP_HOURS"] == "2"
    assert "HOME" not in env
    assert env["PYSPARK_PYTHON"] == sys.executable and env["TZ"] == "UTC"
    assert env["PATH"].split(os.pathsep) == [str(Path(sys.executable).parent), "/usr/bin"]


def test_spark_tasks_start_the_jvm_their_job_needs(dagbag, monkeypatch):
    """Micro-batches and hourly closes get the quick-starting JVM, replays the full JIT; TRAFFIC_SPARK_JIT overrides."""
    from types import SimpleNamespace

    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from traffic.runtime.jvm import QUICK_FLAGS

    def java_options() -> dict[tuple[str, str], str]:
        seen = {}
        for dag in dagbag.dags.values():
            for task in dag.tasks:
                if isinstance(task, SparkSubmitOperator):
                    fake = SimpleNamespace(conf=None, env_vars=None)
                    task._pre_execute_hook({"task": fake, "dag_run": SimpleNamespace(run_type="scheduled"),
                                            "data_interval_end": "2026-11-20T03:00:00+00:00"})
                    assert "TZ" in fake.env_vars
                    seen[(dag.dag_id, task.task_id)] = fake.conf["spark.driver.extraJavaOptions"]
        assert all("-Dlog4j.configurationFile=file:" in options for options in seen.values()), seen
        return seen

    monkeypatch.delenv("TRAFFIC_SPARK_JIT", raising=False)
    quick = {key for key, options in java_options().items() if QUICK_FLAGS in options}
    assert quick == {("traffic_ingest", "ingest")}  # and the hourly close's steps: tests/unit/test_spark_step.py
    monkeypatch.setenv("TRAFFIC_SPARK_JIT", "full")
    assert not any(QUICK_FLAGS in options for options in java_options().values())
    monkeypatch.setenv("TRAFFIC_SPARK_JIT", "quick")
    assert all(QUICK_FLAGS in options for options in java_options().values())


def test_hourly_timetable_gives_one_hour_data_intervals(dagbag):
    import pendulum
    from airflow.serialization.encoders import coerce_to_core_timetable
    from airflow.timetables.base import DataInterval, TimeRestriction

    timetable = coerce_to_core_timetable(dagbag.dags["traffic_hourly"].timetable)
    restriction = TimeRestriction(earliest=pendulum.datetime(2026, 11, 19, 21, 30, tz="UTC"), latest=None, catchup=True)
    first = timetable.next_dagrun_info(last_automated_data_interval=None, restriction=restriction)
    assert first.data_interval == DataInterval(pendulum.datetime(2026, 11, 19, 22, tz="UTC"),
                                               pendulum.datetime(2026, 11, 19, 23, tz="UTC"))
    second = timetable.next_dagrun_info(last_automated_data_interval=first.data_interval, restriction=restriction)
    assert second.data_interval.start == first.data_interval.end
    assert second.data_interval.end - second.data_interval.start == timedelta(hours=1)
    manual = timetable.infer_manual_data_interval(run_after=pendulum.datetime(2026, 11, 20, 0, 10, tz="UTC"))
    assert manual == DataInterval(pendulum.datetime(2026, 11, 19, 23, tz="UTC"), pendulum.datetime(2026, 11, 20, tz="UTC"))


def test_an_hourly_run_is_three_tasks_wait_close_publish(dagbag):
    """Issue 26: each task costs Airflow about a second to start, so the checks and steps of a close are one
    task (its XCom says what it did) and the data-quality verdict is the run's last task."""
    dag = dagbag.dags["traffic_hourly"]
    assert [task.task_id for task in dag.topological_sort()] == ["wait_for_watermark", "close", "publish_data_quality"]
    assert dag.get_task("wait_for_watermark").downstream_task_ids == {"close"}
    assert dag.get_task("close").downstream_task_ids == {"publish_data_quality"}
    sensor = dag.get_task("wait_for_watermark")
    assert sensor.mode == "reschedule" and sensor.timeout == timedelta(hours=2).total_seconds()
    assert dag.get_task("close").execution_timeout == timedelta(minutes=30)
    assert {task.trigger_rule for task in dag.tasks} == {"all_success"}  # a failed close is never published


def test_ingest_runs_every_five_minutes_unless_configured(dagbag, airflow_home):
    assert dagbag.dags["traffic_ingest"].timetable.delta == timedelta(minutes=5)
    dag = dagbag.dags["traffic_ingest"]
    assert dag.get_task("inbox_has_new_files").downstream_task_ids == {"ingest"}
    probe = subprocess.run(
        [sys.executable, "-c", "import runpy, sys; g = runpy.run_path(sys.argv[1]); print(g['_every_minutes']())",
         str(ROOT / "dags" / "traffic_ingest.py")],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "AIRFLOW_HOME": airflow_home, "TRAFFIC_INGEST_EVERY_MINUTES": "15"})
    assert probe.stdout.strip().splitlines()[-1] == "15", probe.stderr[-2000:]


def schema_type(param) -> list:
    kind = param.schema.get("type")
    return kind if isinstance(kind, list) else [kind]


def test_replay_params_render_as_a_form(dagbag):
    dag = dagbag.dags["traffic_replay"]
    assert type(dag.timetable).__name__ == "NullTimetable"  # schedule=None: manual only
    schema = {name: dag.params.get_param(name).schema for name in dag.params}
    required = [name for name in dag.params if not dag.params.get_param(name).has_value
                and "null" not in schema_type(dag.params.get_param(name))]
    assert list(schema) == ["from", "to", "input", "source", "restate", "reason"]
    assert schema["from"]["type"] == "string" and schema["from"]["format"] == "date-time"
    assert schema["to"]["type"] == "string" and schema["to"]["format"] == "date-time"
    assert schema["input"]["type"] == "string" and schema["input"]["minLength"] == 1
    assert schema["source"]["type"] == ["null", "string"]
    assert schema["restate"]["type"] == "boolean"
    assert schema["reason"]["type"] == ["null", "string"]
    assert required == ["from", "to", "input"]  # the form will not submit without them
    assert {name: dag.params.get_param(name).value for name in ("source", "restate", "reason")} == {
        "source": None, "restate": False, "reason": None}
    for name in schema:
        assert schema[name].get("title") and dag.params.get_param(name).description, f"{name}: form label and help"


@pytest.fixture()
def archive(tmp_path, monkeypatch):
    """A folder under the worker's replay root (``replay_roots``): the only place the form may read."""
    folder = tmp_path / "archive"
    folder.mkdir()
    monkeypatch.setenv("TRAFFIC_REPLAY_ROOTS", str(tmp_path))
    return folder.resolve()


def test_replay_arguments_follow_the_form(archive):
    from traffic.orchestration.replay_form import replay_arguments
    from traffic.core.settings import SettingsError

    form = {"from": "2026-11-19T22:00:00Z", "to": "2026-11-20T02:00:00+00:00", "input": str(archive),
            "source": None, "restate": False, "reason": None}
    assert replay_arguments(form) == ["--from=2026-11-19T22:00:00+00:00", "--to=2026-11-20T02:00:00+00:00",
                                      f"--input={archive}"]
    assert replay_arguments({**form, "source": "edge-a", "restate": True, "reason": "clock fix"})[-3:] == [
        "--source=edge-a", "--restate", "--reason=clock fix"]
    with pytest.raises(SettingsError, match="reason"):
        replay_arguments({**form, "restate": True, "reason": "  "})
    with pytest.raises(SettingsError, match="empty"):
        replay_arguments({**form, "to": form["from"]})
    with pytest.raises(SettingsError, match="input"):
        replay_arguments({**form, "input": ""})


def test_replay_template_renders_the_argument_list(dagbag, archive):
    dag = dagbag.dags["traffic_replay"]
    task = dag.get_task("replay")
    rendered = dag.get_template_env().from_string(task.application_args).render(
        params={"from": "2026-11-19T22:00:00+00:00", "to": "2026-11-19T23:00:00+00:00", "input": str(archive),
                "source": "edge", "restate": False, "reason": None})
    assert rendered == ["--from=2026-11-19T22:00:00+00:00", "--to=2026-11-19T23:00:00+00:00",
                        f"--input={archive}", "--source=edge"]


def test_the_freeze_says_in_its_log_how_far_it_goes(caplog):
    import logging
    from datetime import datetime, timezone

    from traffic.orchestration.dag_support import say_freeze_bound

    end = datetime(2026, 11, 20, 3, tzinfo=timezone.utc)
    with caplog.at_level(logging.INFO):
        say_freeze_bound("backfill", end)
        say_freeze_bound("scheduled", end)
    assert "backfill run: freezing every hour the watermark has closed" in caplog.records[0].getMessage()
    assert caplog.records[1].getMessage().startswith("freezing the closed hours up to 2026-11-20")
