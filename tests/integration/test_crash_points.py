"""Crash anywhere: stop ingest and close at every named write step, run again, get the same tables.

Every fault point of the Delta layer (files written / committed, per table and operation)
reached by a scenario of two ingests and two closes is enumerated from a clean run. Each ingest
takes a router feed and a flow telemetry file (IPFIX, one of whose data sets waits a batch for
its template), so the telemetry state's writes are killed too; the first also brings a source
that sends nothing more, whose waiting data the watermark expires in the second ingest (a reject
and a state written by a batch without that source's files: counted once). A step that
recurs in the second ingest (close) is killed there only, so each distinct write step is killed
once (48 of the 80 points the scenario passes). For each one, the scenario runs up to the command
in which that point happens, runs that command as a
separate process that kills itself with SIGKILL at the point, and then runs the command again
and the rest of the scenario: the tables must equal the uninterrupted run's, row for row, and
conservation must hold. The killed processes are clients of a warm Spark Connect server,
forked from a warm interpreter (``tests/support/forkserver.py``), so a kill costs neither a JVM's
start-up nor a fresh interpreter's imports; one point is also killed in a process started from
scratch with its own classic JVM.

With the warehouse on object storage (issue 38: its tables, journal, scratch and lease objects on a real
SeaweedFS), a twelfth of the distinct write steps are killed each run (a kill there costs ~45 s, twice one
on disk, and the suite is over its time budget), every ``S3_SHARE``-th from an offset the run draws and
prints (``TRAFFIC_CRASH_S3_OFFSET`` repeats a run; ``TRAFFIC_CRASH_S3=all`` kills every step), so twelve
runs cover them all; three ingest kill points run with the inbox on the store.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.support import flow_encoder as fe
from tests.support.forkserver import ForkServer
from tests.support.harness import Harness, feed_line, tick_line
from traffic.storage import faults

UTC = timezone.utc
T0 = datetime(2026, 10, 31, 22, tzinfo=UTC)


def _deliveries():
    first = [feed_line(T0 + timedelta(minutes=m), "10.0.0.1", "192.0.2.1", size=100 + m) for m in range(0, 120, 7)]
    first += ["new,OP_INSERT,bad,1,2,3,4,5", tick_line(T0 + timedelta(hours=2, minutes=5))]
    second = [feed_line(T0 + timedelta(hours=1, minutes=3), size=999)]  # late by then
    second += [feed_line(T0 + timedelta(hours=2, minutes=m), "10.0.0.2", size=50) for m in range(10, 200, 9)]
    second += [tick_line(T0 + timedelta(hours=27))]  # crosses midnight: a day and a month roll up
    return [("r1", "\n".join(first) + "\n"), ("r1", "\n".join(second) + "\n")]


def _telemetry(number: int) -> bytes:
    """The flow telemetry file of delivery ``number``: IPFIX from one router (DESIGN §7a)."""
    v4 = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8)]
    v6 = [(27, 16), (28, 16), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8)]

    def us(ts: datetime) -> int:
        return int(ts.timestamp()) * 1_000_000

    def flow(src, dst, size, start: datetime, minutes: int) -> dict:
        return fe.flow_values(fe.Flow(src, dst, 40000, 443, 6, size, 10, us(start),
                                      us(start + timedelta(minutes=minutes))))

    def message(at: datetime, sets, sequence) -> tuple[int, str, int, bytes]:
        return (us(at), "192.0.2.250", 4739, fe.ipfix(sets, export_s=us(at) // 1_000_000, sequence=sequence))

    if number == 0:
        datagrams = [
            message(T0 + timedelta(minutes=40), [fe.data_set(300, [fe.record(v6, flow(
                "2001:db8:ffff::1", "2001:db8:1::5", 3000, T0 + timedelta(minutes=20), 15))])], 0),
            message(T0 + timedelta(minutes=41), [fe.template_set({256: v4}), fe.data_set(256, [fe.record(v4, flow(
                "10.0.0.1", "192.0.2.9", 5000, T0 + timedelta(minutes=50), 20))])], 1),
            message(T0 + timedelta(hours=2, minutes=5), [fe.template_set({256: v4})], 2)]
    else:
        datagrams = [
            message(T0 + timedelta(hours=2, minutes=30), [fe.template_set({300: v6}), fe.data_set(256, [
                fe.record(v4, flow("10.0.0.2", "192.0.2.9", 7000, T0 + timedelta(hours=2, minutes=10), 40))])], 3),
            message(T0 + timedelta(hours=27), [fe.template_set({256: v4})], 9)]  # 5 records lost before it
    return fe.collector_file(datagrams)


def _quiet_telemetry() -> bytes:
    """A second exporter's only file: one IPFIX data set whose template never comes (DESIGN §7a)."""
    v6 = [(27, 16), (28, 16), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8)]
    at = int((T0 + timedelta(hours=1, minutes=50)).timestamp()) * 1_000_000
    data = fe.data_set(400, [fe.record(v6, fe.flow_values(fe.Flow("2001:db8:ffff::2", "2001:db8:1::7", 53, 5353, 17,
                                                                  800, 2, at, at)))])
    return fe.collector_file([(at, "192.0.2.251", 4739, fe.ipfix([data], export_s=at // 1_000_000, domain=5))])


def _deliver(harness: Harness, number: int) -> None:
    """Delivery ``number``: a router feed and a telemetry file (already there when a command is rerun)."""
    source, text = _deliveries()[number]
    if not (harness.root / "inbox" / source / f"d{number}.csv").exists():
        harness.deliver(source, text, name=f"d{number}.csv")
    folder = harness.root / "inbox" / "rtr"
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / f"t{number}.flows.pcap").exists():
        (folder / f"t{number}.flows.pcap").write_bytes(_telemetry(number))
    quiet = harness.root / "inbox" / "quiet"
    if number == 0 and not (quiet / "q.flows.pcap").exists():
        quiet.mkdir(parents=True, exist_ok=True)
        (quiet / "q.flows.pcap").write_bytes(_quiet_telemetry())


SCENARIO = ["ingest", "close", "ingest", "close"]
#: The telemetry's networks (its flows are oriented by them), for the harness and the killed commands.
LOCAL = "10.0.0.0/8,2001:db8:1::/48"
#: An accounts file with a quota the first close crosses, so the freeze's alerts write is killed too.
ACCOUNTS = """
[[version]]
name = "v1"
effective_from = 2026-10-01

[version.accounts]
lan = ["10.0.0.0/24"]

[version.limits.lan]
quota_bytes = 1000
"""


def _accounts(root: Path) -> Path:
    """The scenario's accounts file, inside the harness root (so every copy of a state has it)."""
    path = Path(root) / "accounts.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text(ACCOUNTS)
    return path


def _snapshot(harness: Harness) -> dict:
    from traffic.storage.schemas import TABLES, columns

    # Wall-clock stamps differ by design; dq_results is an audit log of evaluations, and a rerun
    # evaluates again: compare its distinct evaluations without their run ids.
    skip = {"batches": {"started_at", "committed_at", "files"}, "dq_results": {"run_id"}}
    if not harness.warehouse().exists():
        return {name: [] for name in TABLES}
    snapshot = {name: sorted(map(repr, ({c: r[c] for c in columns(name) if c not in skip.get(name, ())}
                                        for r in harness.table(name)))) for name in TABLES}
    snapshot["dq_results"] = sorted(set(snapshot["dq_results"]))
    return snapshot


@pytest.fixture(scope="module")
def scenario(spark, tmp_path_factory):
    """One uninterrupted run: the state before each command (copied per point), its tables, and its kill points."""
    base = tmp_path_factory.mktemp("scenario")
    harness = Harness(base / "running", spark, keep_hours=1, local_networks=LOCAL,
                      accounts_file=_accounts(base / "running"))
    states, tables, points, counts = [], [], [], {}
    for index in range(len(SCENARIO) + 1):
        snapshot = base / f"before-{index}"
        shutil.copytree(harness.root, snapshot, copy_function=shutil.copy2)
        states.append(snapshot)
        tables.append(_snapshot(harness))
        if index == len(SCENARIO):
            break
        faults.STEPS_REACHED.clear()
        _run_one(harness, index)
        for step in faults.STEPS_REACHED:
            counts[step] = counts.get(step, 0) + 1
            points.append((f"{step}#{counts[step]}", index))
    return states, tables, points


def test_scenario_reaches_many_kill_points(scenario):
    points = [p for p, _ in scenario[2]]
    assert len(points) >= 30, points
    assert any(p.startswith("packets.ingest.files_written") for p in points)
    assert any(p.startswith("daily.roll_up.committed") for p in points)
    assert any(p.startswith("monthly.roll_up.committed") for p in points)
    assert any(p.startswith("packets.expire.committed") for p in points)
    assert any(p.startswith("hourly.merge.committed") for p in points)  # the frozen day merged into one file
    assert any(p.startswith("flow_state.ingest.committed") for p in points)
    assert any(p.startswith("alerts.alert.committed") for p in points)  # the quota crossing, before the ledger


def _run_one(harness: Harness, index: int) -> None:
    if SCENARIO[index] == "ingest":
        _deliver(harness, SCENARIO[: index + 1].count("ingest") - 1)
        harness.ingest()
    else:
        harness.close()


@pytest.fixture(scope="module")
def connect_server():
    from traffic.runtime.connect import start_server

    server = start_server(shuffle_partitions=2)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def forks(tmp_path_factory):
    server = ForkServer(tmp_path_factory.mktemp("forked-commands"))
    yield server
    server.stop()


def _kill_and_rerun(spark, root: Path, scenario, point: str, index: int, master: str | None,
                    forks: ForkServer | None = None, store: dict | None = None) -> Harness:
    """From the state before command ``index``, SIGKILL that command at ``point`` in its own process, rerun it.
    With ``store`` (``{"url": s3://…, "env": AWS variables}``) the warehouse of that state is put on the store
    first, and both commands use it there."""
    states, _, points = scenario
    shutil.copytree(states[index], root, copy_function=shutil.copy2)
    warehouse = str(root / "warehouse")
    if store is not None:
        warehouse = store["url"]
        _upload(root / "warehouse", warehouse)
        shutil.rmtree(root / "warehouse", ignore_errors=True)  # nothing may read the local copy by mistake
    harness = Harness(root, spark, keep_hours=1, local_networks=LOCAL, accounts_file=_accounts(root),
                      warehouse=warehouse)
    # Occurrences count from the killed process's own start: the n-th inside that command.
    name = point.split("#")[0]
    nth = [p for p, i in points if p.split("#")[0] == name and i == index].index(point) + 1
    if SCENARIO[index] == "ingest":
        _deliver(harness, SCENARIO[: index + 1].count("ingest") - 1)
    command = [SCENARIO[index], "--warehouse", warehouse,
               "--inbox", str(root / "inbox"), "--set", "keep_hours=1", "--set", "shuffle_partitions=2",
               "--set", f"local_networks={LOCAL}", "--set", f"accounts_file={root / 'accounts.toml'}",
               "--set", f"now={harness.settings.now.isoformat()}", "--set", f"fault_at={name}#{nth}"]
    if master:
        command += ["--spark-master", master]
    if forks is not None:
        code, output = forks.run(command, env={"TZ": "UTC", **(store or {}).get("env", {})})
    else:
        completed = subprocess.run([sys.executable, "-m", "traffic.app.cli", *command], env={**os.environ, "TZ": "UTC"},
                                   capture_output=True, text=True, timeout=300)
        code, output = completed.returncode, completed.stderr
    assert code == -signal.SIGKILL, f"{point}: exit {code}: {output[-2000:]}"
    _run_one(harness, index)  # the rerun: the same command, as an operator or Airflow's retry would
    return harness


def _upload(folder: Path, url: str) -> None:
    """Every file under ``folder`` as an object under ``url``, at the same relative key."""
    from tests.support.harness import put_object

    for path in sorted(folder.rglob("*")):
        if path.is_file():
            put_object(f"{url}/{path.relative_to(folder).as_posix()}", path.read_bytes())


def _assert_converged(harness: Harness, expected: dict, point: str) -> None:
    """The tables equal the uninterrupted run's after the same command, and conservation holds."""
    got = _snapshot(harness)
    for table in expected:
        assert got[table] == expected[table], f"after SIGKILL at {point}, table {table} differs"
    batches = harness.table("batches")
    accepted = sum(b["bytes_on_time"] + b["bytes_late"] for b in batches)
    assert accepted == sum(r["bytes"] for r in harness.table("hourly")) + sum(
        r["bytes"] for r in harness.table("late_packets")), point


def _distinct_points(points: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Each write step once: the n-th occurrence of a step inside an ingest (or a close) is the same
    step in both ingests (closes); it is killed in the last command that reaches it, whose state
    has more history (late records, an earlier freeze) than the first one's."""
    chosen: dict[tuple[str, str, int], tuple[str, int]] = {}
    for point, index in points:
        name = point.split("#")[0]
        nth = [p for p, i in points if p.split("#")[0] == name and i == index].index(point) + 1
        chosen[(SCENARIO[index], name, nth)] = (point, index)
    return sorted(chosen.values(), key=points.index)


def test_every_write_step_is_killed_and_each_only_once():
    """The selection keeps one kill per distinct step, prefers the later command, and drops nothing else."""
    points = [("a.ingest.committed#1", 0), ("b.ingest.committed#1", 0), ("q.freeze.committed#1", 1),
              ("q.freeze.committed#2", 1), ("a.ingest.committed#2", 2), ("q.freeze.committed#3", 3)]
    assert _distinct_points(points) == [("b.ingest.committed#1", 0), ("q.freeze.committed#2", 1),
                                        ("a.ingest.committed#2", 2), ("q.freeze.committed#3", 3)]


@pytest.mark.slow
def test_sigkill_at_every_write_step_then_rerun_equals_uninterrupted(spark, scenario, connect_server, forks, tmp_path):
    """Every distinct write step, one test: a fresh copy per point, a real SIGKILL there, the rerun, a comparison."""
    _, tables, points = scenario
    killed = _distinct_points(points)
    assert len(killed) >= 30 and {p.split("#")[0] for p, _ in killed} == {p.split("#")[0] for p, _ in points}
    for number, (point, index) in enumerate(killed):
        harness = _kill_and_rerun(spark, tmp_path / f"p{number}", scenario, point, index, connect_server.url, forks)
        _assert_converged(harness, tables[index + 1], point)


def test_waiting_data_expired_by_the_watermark_is_rejected_once_whatever_the_kill(spark, scenario, connect_server,
                                                                                 forks, tmp_path):
    """The second ingest rejects the quiet source's waiting data (no file of it in that batch): killed after its
    rejects are committed, or after the states are, the rerun neither loses nor repeats the reject."""
    _, tables, points = scenario
    second = SCENARIO.index("ingest", 1)
    before, after = ([r for r in tables[i]["rejects"] if "'source': 'quiet'" in r] for i in (second, second + 1))
    assert not before and len(after) == 1 and "its template never arrived" in after[0]
    for number, step in enumerate(("rejects.ingest.committed", "flow_state.ingest.committed")):
        point = next(p for p, i in points if p.startswith(step) and i == second)
        harness = _kill_and_rerun(spark, tmp_path / f"w{number}", scenario, point, second, connect_server.url, forks)
        _assert_converged(harness, tables[second + 1], point)


@pytest.mark.slow
def test_sigkill_with_a_classic_jvm_then_rerun_equals_uninterrupted(spark, scenario, tmp_path):
    """The same kill in a process that runs its own local JVM (no Connect server)."""
    _, tables, points = scenario
    point, index = next((p, i) for p, i in points if p.startswith("periods.freeze.committed"))
    harness = _kill_and_rerun(spark, tmp_path / "classic", scenario, point, index, None)
    _assert_converged(harness, tables[index + 1], point)


def test_sigkill_with_the_inbox_on_object_storage_then_rerun_equals_uninterrupted(spark, scenario, connect_server,
                                                                                  forks, seaweed, tmp_path,
                                                                                  monkeypatch):
    """The first ingest's files as objects of an ``s3://`` inbox (issue 38): killed at its first, a middle and its
    last write step, in a Connect client whose executors reach the store only through the task (they never saw
    the AWS variables), the rerun gives the uninterrupted run's tables."""
    _, tables, points = scenario
    first = [p for p, i in points if i == 0]  # the first ingest's, counted from its start
    chosen = [first[0], first[len(first) // 2], first[-1]]
    env = seaweed.environ({})
    seaweed.export(monkeypatch)
    for number, point in enumerate(chosen):
        inbox = seaweed.url(f"crash-inbox-{number}-{os.getpid()}")
        staging = Harness(tmp_path / f"files{number}", spark)
        _deliver(staging, 0)
        _upload(staging.root / "inbox", inbox)
        root = tmp_path / f"s3-{number}"
        harness = Harness(root, spark, keep_hours=1, local_networks=LOCAL, accounts_file=_accounts(root),
                          inbox=inbox)
        command = ["ingest", "--warehouse", str(root / "warehouse"), "--inbox", inbox, "--set", "keep_hours=1",
                   "--set", "shuffle_partitions=2", "--set", f"local_networks={LOCAL}",
                   "--set", f"accounts_file={root / 'accounts.toml'}",
                   "--set", f"now={harness.settings.now.isoformat()}",
                   "--set", f"fault_at={point}", "--spark-master", connect_server.url]
        code, output = forks.run(command, env={"TZ": "UTC", **env})
        assert code == -signal.SIGKILL, f"{point}: exit {code}: {output[-2000:]}"
        harness.ingest()
        _assert_converged(harness, tables[1], f"{point} (inbox on S3)")


#: With the warehouse on the store, every S3_SHARE-th distinct write step is killed each run (see the docstring).
S3_SHARE = 12


def s3_sample(killed: list, environ=os.environ) -> tuple[list, str]:
    """The write steps killed on the store this run, and how they were chosen (printed with the result)."""
    if environ.get("TRAFFIC_CRASH_S3") == "all":
        return killed, "all of them (TRAFFIC_CRASH_S3=all)"
    offset = int(environ.get("TRAFFIC_CRASH_S3_OFFSET", random.randrange(S3_SHARE))) % S3_SHARE
    return killed[offset::S3_SHARE], f"every {S3_SHARE}th from offset {offset} (TRAFFIC_CRASH_S3_OFFSET={offset})"


def test_the_sample_on_the_store_covers_every_step_in_twelve_runs():
    killed = [(f"s{n}.ingest.committed#1", 0) for n in range(49)]
    runs = [s3_sample(killed, {"TRAFFIC_CRASH_S3_OFFSET": str(offset)})[0] for offset in range(S3_SHARE)]
    assert sorted(p for run in runs for p in run) == sorted(killed) and all(4 <= len(run) <= 5 for run in runs)
    assert s3_sample(killed, {"TRAFFIC_CRASH_S3": "all"})[0] == killed


@pytest.mark.slow
def test_sigkill_with_the_warehouse_on_object_storage_then_rerun_equals_uninterrupted(spark, scenario, connect_server,
                                                                                     forks, seaweed, tmp_path,
                                                                                     monkeypatch):
    """The warehouse of each state put on a real S3 store; killed there at a share of the write steps (the
    sample says which; see the docstring of this module), rerun there: the uninterrupted run's tables."""
    _, tables, points = scenario
    chosen, how = s3_sample(_distinct_points(points))
    print(f"\nwarehouse on S3: {len(chosen)} write steps killed, {how}")
    env = seaweed.environ({})
    seaweed.export(monkeypatch)
    for number, (point, index) in enumerate(chosen):
        store = {"url": seaweed.url(f"crash-{os.getpid()}-{number}"), "env": env}
        harness = _kill_and_rerun(spark, tmp_path / f"s3-{number}", scenario, point, index, connect_server.url,
                                  forks, store=store)
        _assert_converged(harness, tables[index + 1], f"{point} (warehouse on S3, {how})")
