"""The team stack for real: docker-compose.yml up on this machine, DAGs driving jobs on its Spark cluster.

Images: the bases from Debian's packages (scripts/local-images.sh), then the stack's image (compose build).
`up`, every health check waited for, the UI and the collector's ports on 127.0.0.1 only, and no volume
shared between services: the warehouse and the inbox are on the stack's object store (SeaweedFS). Then,
through Airflow's REST API and the store's inbox:

* **spark-submit** (the spark-connect service stopped): the seed example (the demo's deliveries, with
  its late records, bad lines and a re-delivered file) and a router feed for six hours across a
  midnight; `traffic_ingest` twice; a backfill of `traffic_hourly` over the closed hours;
* **the warm Spark** (spark-connect started): three more hours; `traffic_ingest`; a backfill of those.

The accounting tables fetched from the store must equal, row for row, the embedded pipeline's (the
in-process harness on ``local[2]``) fed the same deliveries in the same order. The Spark master's
JSON API must list the spark-submit applications as finished with executors on the worker, and the
warm server as running with its executors there; Airflow's runs must be rows in Postgres; each run's
data-quality verdict must be readable through the API; the task logs must say which way Spark ran
and which Delta engine, and every commit of every table must be delta-spark's (the image's jars). Then one 1 M-packet batch with one worker and with two, and each of four services
restarted mid-batch. Last, ``down -v`` must leave nothing of the project. (The per-hour close latency of
both ways is measured by ``bench/compose.py``, on the same two phases: a timing belongs to the benchmark,
not to a test run beside others.)
"""

from __future__ import annotations

import functools
import json
import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from bench.run import generate as generate_feed
from tests.compose.conftest import LOCAL_NETWORKS, Stack, running_stack
from tests.support.airflow_api import ApiError, backfill_completed, create_backfill, log_events, write_router_feed
from tests.support.harness import Harness
from tests.support.tables import differences, tables
from traffic.app import demo
from traffic.core.periods import PUBLISHED

pytestmark = pytest.mark.slow

UTC = timezone.utc
#: Compared tables, with the columns that name where a file was read (host vs volume paths) left out.
COMPARED = ("packets", "late_packets", "rejects", "hourly", "daily", "monthly", "periods", "source_panes", "panes",
            "dq_results")
LEAVE_OUT = {"packets": {"input_file", "batch_id"}, "late_packets": {"input_file", "batch_id"},
             "rejects": {"input_file", "batch_id"}, "dq_results": {"run_id"}}
MILLION = 1_000_000


def say(record_property, line: str) -> None:
    """A figure of this test: printed, and kept for the run's closing summary (tests/conftest.py)."""
    print("\n" + line, flush=True)
    record_property("figure", line)


@functools.cache
def midnight() -> datetime:
    """Two days back: finished intervals (backfills take no others), well within max_history. Read once per
    run, so that tests on either side of midnight UTC agree on the day."""
    return datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=2)


def committed_by(warehouse: Path) -> dict[str, list[str]]:
    """Each Delta table under ``warehouse``: the ``engineInfo`` of every commit in its history (delta-rs's
    reader; a commit delta-rs made has none, delta-spark's names Delta-Lake)."""
    from deltalake import DeltaTable

    return {str(log.parent.relative_to(warehouse)): [commit.get("engineInfo", "")
                                                     for commit in DeltaTable(str(log.parent)).history()]
            for log in sorted(warehouse.rglob("_delta_log"))}


def assert_delta_spark_committed_all(warehouse: Path, tables_expected) -> dict[str, list[str]]:
    engines = committed_by(warehouse)
    assert set(tables_expected) <= set(engines), f"tables under {warehouse}: {sorted(engines)}"
    for name, seen in engines.items():
        assert seen and all("Delta-Lake" in engine for engine in seen), f"{name}: commits by {seen}"
    return engines


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def seed_and_feed(folder: Path, start: datetime, end: datetime, seed: int) -> dict[str, bytes]:
    """The demo's delivery of ``[start, end)`` (three sources) and a router feed of the same hours."""
    demo.generate(folder, start, end, seed=seed)
    write_router_feed(folder / "edge" / f"feed-{start:%Y%m%dT%H}.csv", start, end, seed=seed)
    return files_under(folder)


@pytest.fixture(scope="module")
def stack(docker_env, tmp_path_factory):
    # The scheduler loops at Airflow's default 1 s when idle, not the stack's 0.1 s: these tests judge what the
    # runs produce, not how soon (bench/compose.py times the default), and the 0.1 s loop took a seventh of
    # a core for the whole module from the test worker beside it.
    with running_stack(docker_env, tmp_path_factory.mktemp("compose"), f"traffic-test-{os.getpid()}",
                       AIRFLOW_SCHEDULER_IDLE_SLEEP_TIME="1") as stack:
        yield stack


def backfill(stack: Stack, first: datetime, last: datetime, timeout: float = 1200) -> list[dict]:
    api = stack.api
    made = create_backfill(api, "traffic_hourly", first, last)
    api.unpause("traffic_hourly")
    deadline = time.monotonic() + timeout
    while not (done := backfill_completed(api, made))[1]:
        made = done[0]
        assert time.monotonic() < deadline, f"backfill {first}…{last} not complete after {timeout:.0f} s"
        time.sleep(3)
    runs = [r for r in api.runs("traffic_hourly", run_type="backfill")
            if first.isoformat() <= _iso(r["logical_date"]) <= last.isoformat()]
    for run in runs:
        run["tasks"] = api.task_states("traffic_hourly", run["dag_run_id"])
        run["close"] = api.xcom("traffic_hourly", run["dag_run_id"], "close")
        assert run["state"] == "success", failed_logs(stack, "traffic_hourly", run["dag_run_id"])
    return sorted(runs, key=lambda r: r["logical_date"])


def _iso(text: str) -> str:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).isoformat()


#: Task states of work under way: a run with one of these will end by itself, paused or not.
IN_FLIGHT = {"queued", "running", "up_for_retry", "up_for_reschedule", "restarting", "deferred"}


def _ingest_runs_finish(stack: Stack, timeout: float, paused: bool = False) -> list[dict]:
    """Every unfinished `traffic_ingest` run ends; the runs, as they ended (those deleted left out). With the
    DAG ``paused``, Airflow's scheduler neither queues a task of it nor closes its runs: a run the schedule
    made just before the pause, none of whose tasks is under way, would wait forever. One with a task not
    started has not ingested (``ingest`` is its last task): it is deleted, and its files go to the next run;
    one whose tasks all ended gets the state the scheduler would give it. A run at work ends by itself.
    (Unpaused, the schedule may make another run meanwhile: the next call waits for that one.)"""
    api, deadline, ended = stack.api, time.monotonic() + timeout, []
    for run in api.runs("traffic_ingest"):
        run_id = run["dag_run_id"]
        path = api.run_path("traffic_ingest", run_id)
        while run["state"] not in ("success", "failed"):
            states = set(api.task_states("traffic_ingest", run_id).values())
            if paused and not IN_FLIGHT & states:
                if states & {None, "scheduled"}:
                    _delete_run(api, path)
                    run = None
                else:
                    api.patch(path, {"state": "failed" if states & {"failed", "upstream_failed"} else "success"})
                    run = api.run("traffic_ingest", run_id)
                break
            if time.monotonic() > deadline:
                api.wait_run("traffic_ingest", run_id, timeout=0)  # fails, saying where every task is
            time.sleep(2)
            run = api.run("traffic_ingest", run_id)
        if run is not None:
            ended.append(run)
    return ended


def _delete_run(api, path: str) -> None:
    """Delete a run of the paused `traffic_ingest`. Airflow deletes only a queued or ended run (409 else);
    one the scheduler set running just before the pause, none of whose tasks started, is queued first: the
    scheduler starts no queued run of a paused DAG, so it stays queued until deleted."""
    try:
        api.delete(path)
    except ApiError as error:
        if error.status != 409:
            raise
        api.patch(path, {"state": "queued"})
        api.delete(path)


def deliver_and_trigger(stack: Stack, files: dict[str, bytes], timeout: float = 900) -> dict:
    """Deliver ``files`` while `traffic_ingest` is paused (so no scheduled batch takes half of them), then
    unpause and trigger it; the triggered run."""
    stack.api.patch("/api/v2/dags/traffic_ingest", {"is_paused": True})
    _ingest_runs_finish(stack, timeout, paused=True)
    stack.deliver(files)
    stack.api.unpause("traffic_ingest")
    return stack.api.post("/api/v2/dags/traffic_ingest/dagRuns", {"logical_date": None})


def deliver_and_ingest(stack: Stack, files: dict[str, bytes], timeout: float = 900) -> dict:
    """Deliver ``files`` while `traffic_ingest` is paused (so no scheduled batch takes half of them), then
    trigger it and wait until no ingest run is left unfinished; the last ingest task that ran."""
    api = stack.api
    triggered = deliver_and_trigger(stack, files, timeout)
    api.wait_run("traffic_ingest", triggered["dag_run_id"], timeout=timeout)
    ran = []
    # The runs as they ended, not listed again: the schedule may have made a new one since (it finds no file).
    for run in _ingest_runs_finish(stack, timeout):
        assert run["state"] == "success", failed_logs(stack, "traffic_ingest", run["dag_run_id"])
        task = api.get(f"/api/v2/dags/traffic_ingest/dagRuns/{run['dag_run_id']}/taskInstances/ingest")
        if task["state"] == "success":
            ran.append({**task, "dag_run_id": run["dag_run_id"]})
    return max(ran, key=lambda t: t["end_date"])


def task_log(stack: Stack, dag_id: str, run_id: str, task_id: str) -> str:
    path = f"/opt/airflow/logs/dag_id={dag_id}/run_id={run_id}/task_id={task_id}/attempt=1.log"
    return "\n".join(log_events(stack.exec("airflow-scheduler", "cat", path).splitlines()))


def failed_logs(stack: Stack, dag_id: str, run_id: str) -> str:
    """The end of each failed task's log in a run: what a failing test should print."""
    failed = [task for task, state in stack.api.task_states(dag_id, run_id).items() if state in ("failed", "up_for_retry")]
    return f"{dag_id} {run_id}: failed {failed}\n" + "\n".join(
        f"--- {task}\n{task_log(stack, dag_id, run_id, task)[-2500:]}" for task in failed)


def spark_json(stack: Stack, service: str, container: str | None = None) -> dict:
    """A Spark master's or worker's JSON API (its first container, or ``container``)."""
    return json.loads(stack.docker("exec", container or stack.container(service), "curl", "-fsS",
                                   "http://localhost:8081/json/").stdout)


def run_phases(stack: Stack, base: Path) -> tuple[dict, list[dict[str, bytes]]]:
    """Both phases in the stack (what each saw) and the deliveries, in order; ``bench/compose.py`` times them.

    Phase A, spark-submit (spark-connect stopped): hours h0 … h0+6 in two deliveries, then a backfill of
    h0 … h0+4. Phase B, the warm Spark: hours h0+6 … h0+9, then a backfill of h0+5 … h0+7."""
    m = midnight()
    h0 = m - timedelta(hours=3)
    facts: dict = {"midnight": m}

    # Phase A, spark-submit: hours h0 … h0+6 (the last stays open: the demo's clocks stop 1 µs short of it).
    first = seed_and_feed(base / "d1", h0, h0 + timedelta(hours=6), seed=7)
    demo.add_trouble(base / "d1", h0 + timedelta(hours=1))
    second = {k: v for k, v in files_under(base / "d1").items() if k not in first}
    third = seed_and_feed(base / "d3", h0 + timedelta(hours=6), h0 + timedelta(hours=9), seed=8)
    deliveries = [first, second, third]

    clock = time.monotonic()
    facts["ingest spark-submit"] = deliver_and_ingest(stack, first)
    deliver_and_ingest(stack, second)
    facts["backfill spark-submit"] = backfill(stack, h0, h0 + timedelta(hours=4))
    stack.seconds["phase spark-submit"] = time.monotonic() - clock
    facts["master after spark-submit"] = spark_json(stack, "spark-master")
    facts["worker after spark-submit"] = spark_json(stack, "spark-worker")

    # Phase B, the warm Spark: hours h0+5 … h0+7 close.
    clock = time.monotonic()
    stack.up("--scale", "spark-connect=1", "spark-connect")
    stack.wait_healthy()
    stack.seconds["spark-connect up"] = time.monotonic() - clock
    clock = time.monotonic()
    facts["ingest connect"] = deliver_and_ingest(stack, third)
    facts["backfill connect"] = backfill(stack, h0 + timedelta(hours=5), h0 + timedelta(hours=7))
    stack.seconds["phase connect"] = time.monotonic() - clock
    facts["master with connect"] = spark_json(stack, "spark-master")
    facts["worker with connect"] = spark_json(stack, "spark-worker")
    return facts, deliveries


@pytest.fixture(scope="module")
def scenario(stack, spark, tmp_path_factory):
    """Both phases in the stack and the same deliveries through the embedded pipeline; what each saw."""
    base = tmp_path_factory.mktemp("deliveries")
    facts, deliveries = run_phases(stack, base)
    facts["stack warehouse"] = stack.fetch_warehouse(base / "stack" / "warehouse")

    # The embedded pipeline on the same deliveries, in the same order, closing where the backfills did.
    clock = time.monotonic()
    reference = Harness(base / "embedded", spark, local_networks=LOCAL_NETWORKS,
                        now=datetime.now(UTC).isoformat(), keep_hours=24)
    for number, delivery in enumerate(deliveries):
        for name, data in delivery.items():
            path = reference.root / "inbox" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        reference.ingest()
        if number in (1, 2):
            reference.close()
    stack.seconds["embedded run"] = time.monotonic() - clock
    facts["embedded warehouse"] = reference.root / "warehouse"
    return facts


def test_the_stack_comes_up_healthy_with_only_loopback_ports(stack, record_property):
    states = stack.wait_healthy()
    assert {name.split("#")[0] for name in states} == {
        "postgres", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
        "spark-master", "spark-worker", "collector", "seaweedfs"}, states
    published = {}
    for cid in stack.containers():
        info = json.loads(stack.docker("inspect", cid).stdout)[0]
        for port, bindings in (info["NetworkSettings"]["Ports"] or {}).items():
            for binding in bindings or []:
                published[(info["Config"]["Labels"]["com.docker.compose.service"], port)] = binding["HostIp"]
    assert published, "nothing is published: the UI should be"
    assert set(published.values()) == {"127.0.0.1"}, published
    assert {service for service, _ in published} == {"airflow-apiserver", "collector"}, published
    say(record_property, f"compose: {', '.join(f'{k} {v:.0f} s' for k, v in stack.seconds.items())}")


def test_no_volume_is_shared_and_the_warehouse_and_inbox_are_on_the_store(stack):
    """Nothing but the object store is shared: no volume or host folder is mounted by two of Airflow, the Spark
    services, the collector and the store (Airflow's own services share their home: its logs and login file);
    every service that runs the pipeline is told an ``s3://`` warehouse and inbox on the stack's store."""
    mounted_by: dict[str, set] = {}
    for cid in stack.containers():
        info = json.loads(stack.docker("inspect", cid).stdout)[0]
        service = info["Config"]["Labels"]["com.docker.compose.service"]
        for mount in info["Mounts"]:
            mounted_by.setdefault(mount.get("Name") or mount["Source"], set()).add(service)
    def group(service: str) -> str:
        return "airflow" if service.startswith("airflow-") else service
    shared = {name: sorted(services) for name, services in mounted_by.items() if len(set(map(group, services))) > 1}
    assert mounted_by and shared == {}, shared
    for service in ("airflow-scheduler", "spark-worker", "spark-master", "collector"):
        env = dict(line.split("=", 1) for line in stack.exec(service, "env").splitlines() if "=" in line)
        assert env["TRAFFIC_WAREHOUSE"] == "s3://lake/warehouse" and env["TRAFFIC_INBOX"] == "s3://lake/inbox", service
        assert env["AWS_ENDPOINT_URL"] == "http://seaweedfs:8333", service


def test_the_cluster_run_equals_the_embedded_run(scenario, record_property):
    got = tables(scenario["stack warehouse"], COMPARED, LEAVE_OUT)
    expected = tables(scenario["embedded warehouse"], COMPARED, LEAVE_OUT)
    # A backfill's later runs re-check final hours (DAG runs only): the same verdicts again, under other run ids.
    reruns = len(got["dq_results"]) - len(set(got["dq_results"]))
    for side in (got, expected):
        side["dq_results"] = sorted(set(side["dq_results"]))
    assert got == expected, differences(got, expected, sides=("stack", "embedded"))
    sizes = {name: len(rows) for name, rows in expected.items()}
    say(record_property, f"compose vs embedded: equal tables (rows): {sizes}; {reruns} re-check verdicts of final hours")
    for name in ("packets", "late_packets", "rejects", "hourly", "daily", "periods"):
        assert sizes[name], f"{name} is empty: the comparison proves nothing about it"


def test_each_backfill_run_closed_its_hour_and_the_day_once(scenario):
    submit, connect = scenario["backfill spark-submit"], scenario["backfill connect"]
    assert [r["state"] for r in submit + connect] == ["success"] * 8, [(r["logical_date"], r["tasks"]) for r in submit + connect]
    assert [r["close"]["rolled_up_day"] for r in submit] == [False, False, True, False, False]
    assert [r["close"]["froze"] for r in submit] == [True] + [False] * 4  # one freeze for the backfill
    assert [r["close"]["spark"] for r in submit] == ["spark-submit", None, "spark-submit", None, None]
    assert [r["close"]["froze"] for r in connect] == [True, False, False]
    assert [r["close"]["spark"] for r in connect] == ["warm server", None, None]
    assert not any(r["close"]["rolled_up_day"] for r in connect)
    assert not any(r["close"]["rolled_up_month"] for r in submit + connect)
    assert all(r["tasks"] == {"wait_for_watermark": "success", "close": "success", "publish_data_quality": "success"}
               for r in submit + connect), [r["tasks"] for r in submit + connect]


def test_the_spark_master_lists_the_applications_and_their_executors_on_the_worker(scenario):
    master, worker = scenario["master after spark-submit"], scenario["worker after spark-submit"]
    apps = {app["id"]: app["name"] for app in master["completedapps"]}
    # two ingest batches, then the backfill's one freeze and its one day roll-up: each its own application
    assert sorted(apps.values()) == ["traffic-close"] * 2 + ["traffic-ingest"] * 2, apps
    assert all(app["state"] == "FINISHED" for app in master["completedapps"]), master["completedapps"]
    on_worker = {executor["appid"] for executor in worker["finishedexecutors"]}
    assert set(apps) <= on_worker, f"applications {apps}; executors on the worker for {sorted(on_worker)}"
    assert master["aliveworkers"] == 1 and master["workers"][0]["id"] == worker["id"]
    # the warm server: one running application, its executors on the worker
    master, worker = scenario["master with connect"], scenario["worker with connect"]
    active = {app["id"]: app["name"] for app in master["activeapps"]}
    assert list(active.values()) == ["traffic-spark-connect"], master["activeapps"]
    assert set(active) <= {executor["appid"] for executor in worker["executors"]}, worker["executors"]


def test_the_task_logs_say_how_spark_ran_and_which_delta_engine(stack, scenario):
    submit = scenario["backfill spark-submit"][0]
    freeze = task_log(stack, "traffic_hourly", submit["dag_run_id"], "close")
    assert "does not answer: spark-submit instead" in freeze and "Spark-Submit cmd: spark-submit --master spark://spark-master:7077" in freeze
    warm = scenario["backfill connect"][0]
    freeze = task_log(stack, "traffic_hourly", warm["dag_run_id"], "close")
    assert "Spark: a client of the warm Spark Connect server sc://spark-connect:15002" in freeze, freeze[-3000:]
    assert "Spark-Submit cmd" not in freeze
    ingest = task_log(stack, "traffic_ingest", scenario["ingest connect"]["dag_run_id"], "ingest")
    assert "client of the warm Spark Connect server" in ingest, ingest[-3000:]
    for log in (freeze, ingest):
        assert "Delta layer: spark (delta-spark, Delta's jars in /opt/delta-jars)" in log, log[-2000:]
        assert stack.values["SPARK_CONNECT_TOKEN"] not in log


def test_every_table_of_the_stack_is_committed_by_delta_spark(scenario, record_property):
    """The image's verified jars make delta-spark the stack's engine: no commit of delta-rs's in any table."""
    engines = assert_delta_spark_committed_all(scenario["stack warehouse"], COMPARED)
    versions = sorted({engine for seen in engines.values() for engine in seen})
    say(record_property, f"compose tables committed by delta-spark: {len(engines)} tables, "
                         f"{sum(map(len, engines.values()))} commits, all by {versions}")


def test_airflows_runs_are_rows_in_postgres_and_the_verdicts_are_in_the_api(stack, scenario):
    counts = stack.exec("postgres", "psql", "-U", "airflow", "-d", "airflow", "-tA", "-c",
                        "select run_type, state, count(*) from dag_run where dag_id = 'traffic_hourly' "
                        "and run_type = 'backfill' group by run_type, state")
    assert counts.strip() == "backfill|success|8", counts
    for run in scenario["backfill spark-submit"] + scenario["backfill connect"]:
        verdict = stack.api.xcom("traffic_hourly", run["dag_run_id"], "publish_data_quality")
        assert verdict["failed"] == [] and verdict["periods"] >= 1, verdict
        assert set(verdict["by_status"]) <= set(PUBLISHED), verdict  # the contract's statuses, from their one definition


def test_a_million_packet_batch_on_one_worker_and_on_two(stack, scenario, tmp_path, record_property):
    """1 M packets in one file, one micro-batch each (spark-submit, so every worker's cores are the job's)."""
    stack.up("--scale", "spark-connect=0", "spark-connect")
    m = scenario["midnight"]
    seconds = {}
    for workers, hour in ((1, m + timedelta(hours=7)), (2, m + timedelta(hours=8))):
        if workers == 2:
            stack.up("--scale", "spark-worker=2", "spark-worker")
            stack.wait_healthy()
            deadline = time.monotonic() + 120
            while spark_json(stack, "spark-master")["aliveworkers"] != 2:
                assert time.monotonic() < deadline, "the second worker never registered"
                time.sleep(2)
        path = tmp_path / f"million-{workers}.csv"
        generate_feed(path, MILLION, 1, 20_000, seed=workers, start=hour)
        task = deliver_and_ingest(stack, {f"bulk/{path.name}": path.read_bytes()})
        log = task_log(stack, "traffic_ingest", task["dag_run_id"], "ingest")
        assert f"{MILLION:,} records" in log or f"{MILLION + 1:,} records" in log, log[-2000:]
        seconds[workers] = task["duration"]
    # the last batch's application ran executors on both workers
    last = max(spark_json(stack, "spark-master")["completedapps"], key=lambda app: app["starttime"])
    per_worker = [{e["appid"] for e in spark_json(stack, "spark-worker", cid)["finishedexecutors"]}
                  for cid in stack.containers("spark-worker")]
    assert len(per_worker) == 2 and all(last["id"] in apps for apps in per_worker), (last["id"], per_worker)
    say(record_property, f"compose 1 M-packet batch: one worker {seconds[1]:.1f} s, two workers {seconds[2]:.1f} s "
          f"(ingest task, spark-submit; 2 cores on this machine)")


RESTARTED = ("postgres", "spark-worker", "spark-master", "airflow-scheduler")
#: What each restarted service says in `docker compose logs` every time it (re)starts.
STARTED_SAYS = {"postgres": "database system is ready to accept connections",
                "spark-worker": "Successfully registered with master", "spark-master": "Starting Spark master at",
                "airflow-scheduler": "Starting the scheduler"}


def running_ingest(stack: Stack, timeout: float = 300) -> str:
    """The run whose `ingest` task is running (waited for)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run in stack.api.runs("traffic_ingest", state="running"):
            if stack.api.task_states("traffic_ingest", run["dag_run_id"]).get("ingest") == "running":
                return run["dag_run_id"]
        time.sleep(0.5)
    raise AssertionError(f"no ingest task ran within {timeout:.0f} s")


def test_a_service_restarted_mid_batch_loses_nothing_and_counts_nothing_twice(stack, spark, tmp_path, record_property):
    """One hour of the router feed per service; while its micro-batch runs (spark-submit, one worker) the
    service is restarted, and the run must still succeed (Airflow retries a task that died with it). The
    hours' rows must equal an undisturbed embedded run of the same files."""
    stack.up("--scale", "spark-connect=0", "--scale", "spark-worker=1", "spark-worker", "spark-connect")
    stack.wait_healthy()
    api, first = stack.api, midnight() + timedelta(hours=9)  # after every hour the tests above deliver
    reference = Harness(tmp_path / "undisturbed", spark, local_networks=LOCAL_NETWORKS,
                        now=datetime.now(UTC).isoformat(), keep_hours=24)
    report = []
    for number, service in enumerate(RESTARTED):
        hour = first + timedelta(hours=number)
        name = f"edge/restart-{hour:%Y%m%dT%H}.csv"
        write_router_feed(tmp_path / name, hour, hour + timedelta(hours=1), seed=100 + number)
        data = (tmp_path / name).read_bytes()
        (reference.root / "inbox" / name).parent.mkdir(parents=True, exist_ok=True)
        (reference.root / "inbox" / name).write_bytes(data)
        deliver_and_trigger(stack, {name: data})
        run_id = running_ingest(stack)  # the triggered run's, or a scheduled one's that took the file first
        clock = time.monotonic()
        stack.compose("restart", "-t", "10", service)
        finished = api.wait_run("traffic_ingest", run_id, timeout=900)
        _ingest_runs_finish(stack, 900)
        tries = api.get(f"/api/v2/dags/traffic_ingest/dagRuns/{run_id}/taskInstances/ingest")["try_number"]
        report.append(f"{service}: run {finished['state']} {time.monotonic() - clock:.0f} s after the restart "
                      f"(ingest try {tries})")
        assert finished["state"] == "success", (service, failed_logs(stack, "traffic_ingest", run_id))
        stack.wait_healthy()
    say(record_property, "compose restarts mid-batch — " + "; ".join(report))
    for service, line in STARTED_SAYS.items():  # `docker compose logs` tells what happened: two starts each
        logs = stack.compose("logs", "--no-color", service).stdout
        assert logs.count(line) >= 2, f"{service}: {logs.count(line)} × {line!r} in its logs:\n{logs[-2000:]}"
    reference.ingest()
    hours = {first + timedelta(hours=n) for n in range(len(RESTARTED))}
    copied = stack.fetch_warehouse(tmp_path / "after-restarts" / "warehouse")
    got = tables(copied, ("hourly",), where={"hourly": lambda row: row["hour"] in hours})["hourly"]
    expected = tables(reference.root / "warehouse", ("hourly",))["hourly"]
    assert expected and got == expected, differences({"hourly": got}, {"hourly": expected}, sides=("stack", "undisturbed"))
    assert_delta_spark_committed_all(copied, ("packets", "hourly", "batches"))  # retried tasks too


def test_the_collector_sends_its_files_to_the_stores_inbox(stack, record_property):
    """NetFlow v5 datagrams sent to the collector's published port (127.0.0.1:2055) reach the store's inbox as
    one object when the collector's file rotates (every 60 s): the collector shares no folder with the pipeline."""
    import socket

    from tests.support import flow_encoder as fe

    now_us = int(time.time()) * 1_000_000
    flows = [fe.Flow("10.1.2.3", "192.0.2.7", 40000 + n, 443, 6, 1500 * (n + 1), n + 1, now_us - 60_000_000,
                     now_us - 1_000_000) for n in range(3)]
    datagrams = [fe.netflow5(flows, export_us=now_us, uptime_ms=3_600_000, sequence=n * 3) for n in range(4)]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for datagram in datagrams:
            sender.sendto(datagram, ("127.0.0.1", 2055))
    deadline, status = time.monotonic() + 240, {}
    while time.monotonic() < deadline:
        status = json.loads(stack.exec("collector", "cat", "/data/collector-status.json"))
        if status.get("upload", {}).get("sent", 0) >= 1 and status["upload"]["pending"] == 0:
            break
        time.sleep(5)
    upload = status.get("upload", {})
    assert upload.get("sent", 0) >= 1 and upload.get("pending") == 0 and not upload.get("last_error"), status
    objects = {name: size for name, size in stack.list_objects("TRAFFIC_INBOX").items() if name.endswith(".flows.pcap")}
    assert objects, "no collector file in the store's inbox"
    assert sum(objects.values()) >= sum(map(len, datagrams)), objects  # every datagram, whole, in them
    assert stack.exec("collector", "sh", "-c", "find /data/spool -type f -name '*.flows.pcap' ! -name '.*' | wc -l").strip() == "0"
    say(record_property, f"compose collector: {len(datagrams)} datagrams in {upload['sent']} object(s) "
                         f"({upload.get('sent_bytes')} bytes) on the store's inbox, the spool empty")


def test_down_leaves_nothing(stack, record_property):
    left = stack.down()
    assert left == [], f"left after down -v: {left}"
    say(record_property, f"compose stack test: {time.monotonic() - stack.started:.0f} s in all, images and teardown included")
