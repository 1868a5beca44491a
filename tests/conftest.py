"""Shared fixtures: one SparkSession for the whole test session (never one per test)."""

from __future__ import annotations

import logging
import os
import time

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TZ", "UTC")
#: py4j's finalizers say "Closing down clientserver connection" (INFO) as a worker exits, after pytest has closed
#: the stream the root handler writes to: a "--- Logging error ---" trace at the end of every run. Its warnings show.
logging.getLogger("py4j").setLevel(logging.WARNING)

#: The Delta engine of the suite's warehouses wherever a test names none (``engine = auto`` otherwise picks
#: delta-spark where ``make setup`` fetched its jars). ``make test`` runs the suite on ``rs``, and the spark
#: engine's own suites name it: the Delta contract on both engines (``test_delta_contract``), every table
#: written by both (``test_engines``), the pipeline on delta-spark, the delta-spark query recipe; ``tests/e2e``
#: starts Airflow without the suite's settings, so it runs the default engine, as the compose stack does. The whole
#: suite on delta-spark (``TRAFFIC_TEST_ENGINE=auto``) takes several times CI's budget today: README, not done.
SUITE_ENGINE = os.environ.get("TRAFFIC_TEST_ENGINE", "rs")
os.environ.setdefault("TRAFFIC_ENGINE", SUITE_ENGINE)  # the processes tests start: the CLI, Airflow's tasks


def pytest_configure(config):
    """Settings built in this process without an engine get the suite's (``TRAFFIC_ENGINE`` does it for others)."""
    from traffic.core import settings

    built = settings.build_settings

    def with_suite_engine(values):
        return built({"engine": SUITE_ENGINE, **values})

    settings.build_settings = with_suite_engine


@pytest.fixture(scope="session")
def spark():
    """``local[2]``, few shuffle partitions, UI off — built by the project's own builder, with Delta's jars
    where set-up fetched them (so both engines' tests share it)."""
    from traffic.core.settings import load_settings
    from traffic.runtime.spark import build_spark

    session = build_spark(load_settings(environ={}, overrides={"shuffle_partitions": 2, "engine": "auto"}),
                          "traffic-tests")
    yield session
    session.stop()



@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    """A real S3-compatible server (SeaweedFS's ``weed mini``) on 127.0.0.1 for the session: its bucket ``lake``;
    each test takes a prefix of its own (``seaweed.url(...)``) and the AWS variables from ``seaweed.environ()``."""
    from tests.support.seaweed import start

    server = start(tmp_path_factory.mktemp("seaweed"))
    yield server
    server.stop()

# -- scheduling on two workers -----------------------------------------------------------------
#: The longest files, longest first (measured alone on 2 cores: e2e ~6 min, crash ~5.5 min,
#: month ~3.5 min, then 1-2 min each). ``scripts/test.sh`` runs pytest with ``--dist loadfile
#: --no-loadscope-reorder``: each file stays on one worker (its fixtures are built once) and files
#: are handed out in this order, so the long ones run side by side while the many short files
#: fill the gaps, instead of one of them starting last and running alone.
HEAVY_FIRST = (
    "tests/compose/",
    "tests/e2e/",
    "tests/integration/test_crash_points.py",
    "tests/integration/test_object_storage.py",
    "tests/integration/test_standalone_cluster.py",
    "tests/reliability/test_month_of_commits.py",
    "tests/integration/test_model_equivalence.py",
    "tests/reliability/test_concurrency.py",
    "tests/integration/test_worked_example.py",
    "tests/reliability/test_resource_bounds.py",
)


def _rank(nodeid: str) -> int:
    return next((rank for rank, prefix in enumerate(HEAVY_FIRST) if nodeid.startswith(prefix)), len(HEAVY_FIRST))


def pytest_collection_modifyitems(config, items):
    """Heaviest files first (a stable sort: each file's tests stay together and in order)."""
    items.sort(key=lambda item: _rank(item.nodeid))


class FileClock:
    """One line as each test file ends: minutes since the session began, the file, its tests' seconds, its worker.
    `make test` prints dots otherwise, and a run stopped from outside (CI's time limit) then says nothing of
    where the time went; with these lines its output tells which file ran last and how long each took."""

    def __init__(self, terminal):
        self.terminal, self.began = terminal, time.monotonic()
        self.left: dict[str, int] = {}  # file -> tests not yet torn down
        self.seconds: dict[str, float] = {}

    def expect(self, nodeids) -> None:
        if self.left:  # every xdist worker reports the same collection
            return
        for nodeid in nodeids:
            name = nodeid.split("::")[0]
            self.left[name] = self.left.get(name, 0) + 1

    def report(self, report) -> None:
        name = report.nodeid.split("::")[0]
        self.seconds[name] = self.seconds.get(name, 0.0) + report.duration
        if report.when != "teardown" or name not in self.left:
            return
        self.left[name] -= 1
        if self.left[name] == 0:
            minutes = (time.monotonic() - self.began) / 60
            worker = getattr(report, "node", None)
            where = f" on {worker.gateway.id}" if worker is not None else ""
            if self.terminal._tw.width_of_current_line:  # after the dots of the tests so far
                self.terminal.write("\n")
            self.terminal.write_line(f"[{minutes:5.1f} min] {name} done: {self.seconds[name]:.0f} s{where}")


#: The run's clock, in the process that prints (not in an xdist worker, and not with -v, which names every test).
CLOCK: list[FileClock] = []


def pytest_sessionstart(session):
    terminal = session.config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None and not hasattr(session.config, "workerinput") and session.config.option.verbose <= 0:
        CLOCK.append(FileClock(terminal))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    for clock in CLOCK:
        clock.expect(ids)


def pytest_collection_finish(session):
    for clock in CLOCK:
        clock.expect(item.nodeid for item in session.items)


def pytest_runtest_logreport(report):
    for clock in CLOCK:
        clock.report(report)


def pytest_terminal_summary(terminalreporter):
    """The figures tests record (``record_property("figure", …)``: the compose stack's times) at the end of
    the run, where `make test` shows them even when each test's own output is captured (and on xdist)."""
    lines = [value for reports in terminalreporter.stats.values() for report in reports
             for key, value in getattr(report, "user_properties", ()) if key == "figure"]
    skipped_stack = compose_skips(terminalreporter.stats.get("skipped", []))
    if lines or skipped_stack:
        terminalreporter.section("figures")
        for line in dict.fromkeys(lines):
            terminalreporter.write_line(line)
        if skipped_stack:  # (every skip is also listed by -ra; this one drops a whole layer, so it is said loudly)
            terminalreporter.write_line(skipped_stack, red=True, bold=True)


def compose_skips(skipped: list) -> str | None:
    """A line saying the compose stack's tests did not run, and why, when they were skipped (e.g. not root)."""
    reasons = [report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
               for report in skipped if report.nodeid.startswith("tests/compose/")]
    if not reasons:
        return None
    why = dict.fromkeys(r.removeprefix("Skipped: ") for r in reasons)
    return f"compose stack NOT tested: {len(reasons)} tests skipped ({'; '.join(why)})"
