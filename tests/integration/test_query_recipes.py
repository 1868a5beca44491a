"""``docs/query.md``'s recipes, run as written against a warehouse the real pipeline built.

The fenced blocks of the page whose info string is exactly ``python`` are executed in order in one
namespace (``TRAFFIC_WAREHOUSE`` pointing at the warehouse below, ``spark`` the shared session);
``python delta-jars`` blocks only where Delta Lake's jars are (``TRAFFIC_SPARK_JARS_DIR``), and
``python session`` blocks never (the tests share one SparkSession). So the page and its tests cannot
drift. Every answer is compared, exactly, with ``traffic show``'s text output parsed back into
values (itself checked against the tables read through the Delta layer).

The warehouse: the demo's own sample traffic (``traffic.app.demo.generate``, with its late records,
bad lines and re-delivered file) for 2026-10-31 20:00 → 2026-11-01 05:00 UTC in three batches, a
close after each, through the in-process harness — plus a fourth source that reports only in the
first delivery, so the hours after it are published with a warning. The day 2026-10-31 and the
month of October are rolled up, open hours were replaced by final ones, the day's hourly files were
merged and raw detail older than two hours expired: the tables' folders hold files the Delta log has
removed. (``traffic demo`` itself also runs a UDP collector and takes about two minutes; the page
names only periods this shorter run has too.)
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter, defaultdict
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.support.harness import Harness, tick_line
from traffic.app import demo
from traffic.core.settings import load_settings
from traffic.reporting.report import show
from traffic.storage.engine import choose_engine
from traffic.storage.warehouse import Warehouse

UTC = timezone.utc
DOC = Path(__file__).resolve().parents[2] / "docs" / "query.md"
JARS = load_settings(environ={}).spark_jars_dir
#: Delivery edges (event time): one batch and one close per interval.
EDGES = [datetime(2026, 10, 31, 20, tzinfo=UTC), datetime(2026, 10, 31, 23, tzinfo=UTC),
         datetime(2026, 11, 1, 2, tzinfo=UTC), datetime(2026, 11, 1, 5, tzinfo=UTC)]
#: The demo's IPv4 hosts split between two accounts (its IPv6 hosts stay ``unassigned``).
ACCOUNTS = """
[[version]]
name = "demo"
effective_from = 2026-10-01

[version.accounts]
acme = ["192.0.2.0/28"]
globex = ["192.0.2.16/28"]
"""
#: What the page's recipes name (its settings block): checked against the page below.
DAY, NEXT_DAY, MONTH, NEXT_MONTH = "2026-10-31", "2026-11-01", "2026-10-01", "2026-11-01"
PUBLISHED = ("passed", "warning", "accepted")
VIEWS = ("hourly", "daily", "monthly", "periods", "panes")
BLOCK = re.compile(r"^```(python[^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
TAGS = {"python": "run", "python delta-jars": "jars", "python session": "never",
        "python s3": "s3"}  # run by tests/integration/test_object_storage.py on a warehouse on SeaweedFS


def build_demo_warehouse(root: Path, spark) -> Harness:
    """The demo's sample traffic through ingest and close, batch by batch (see the module docstring)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "accounts.toml").write_text(ACCOUNTS)
    harness = Harness(root, spark, keep_hours=2, local_networks=",".join(demo.DEMO_NETWORKS),
                      accounts_file=root / "accounts.toml")
    for number, (start, end) in enumerate(zip(EDGES, EDGES[1:]), start=1):
        demo.generate(harness.settings.inbox, start, end)
        if number == 1:  # a source heard only in the first delivery: the later hours miss it (a warning)
            ticks = [start + timedelta(minutes=m) for m in range(0, 180, 5)] + [end - timedelta(microseconds=1)]
            harness.deliver("spare", "\n".join(tick_line(t) for t in ticks) + "\n")
        if number == 2:  # late records for 21:00 (closed by then), bad lines, a re-delivered file
            demo.add_trouble(harness.settings.inbox, EDGES[0] + timedelta(hours=1))
        harness.ingest()
        harness.close()
    return harness


# -- the page -------------------------------------------------------------------------------------
def doc_blocks(text: str) -> list[tuple[str, int, str]]:
    """(info string, first line number, code) of every fenced Python block of the page, in order."""
    return [(m.group(1).strip(), text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in BLOCK.finditer(text)]


def run_blocks(text: str, warehouse: Path, namespace: dict, kind: str = "run", stop_after: str | None = None) -> dict:
    """Execute the page's blocks of ``kind`` in ``namespace`` (stopping after the one defining
    ``stop_after``), with ``TRAFFIC_WAREHOUSE`` set as a reader of the page sets it."""
    before = os.environ.get("TRAFFIC_WAREHOUSE")
    os.environ["TRAFFIC_WAREHOUSE"] = str(warehouse)
    try:
        for info, line, code in doc_blocks(text):
            if TAGS[info] != kind:
                continue
            # Padded so a traceback names the page's own line numbers.
            exec(compile("\n" * (line - 1) + code, str(DOC), "exec"), namespace)  # noqa: S102 - the page's recipes
            if stop_after and stop_after in namespace:
                break
    finally:
        if before is None:
            os.environ.pop("TRAFFIC_WAREHOUSE", None)
        else:
            os.environ["TRAFFIC_WAREHOUSE"] = before
    return namespace


# -- traffic show, parsed back --------------------------------------------------------------------
def _value(cell: str):
    if cell == "":
        return None
    if re.fullmatch(r"-?\d{1,3}(,\d{3})*", cell):
        return int(cell.replace(",", ""))
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", cell):
        return date.fromisoformat(cell)
    for layout in ("%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S.%f"):
        try:
            return datetime.strptime(cell, layout).replace(tzinfo=UTC)
        except ValueError:
            pass
    return cell


def parse_show(text: str) -> list[dict]:
    """``traffic show``'s aligned text table as rows of values (columns cut where the dashes are)."""
    lines = text.splitlines()
    spans = [m.span() for m in re.finditer(r"-+", lines[1])]
    names = [lines[0][a:b].strip() for a, b in spans]
    return [{name: _value(line[a:b].strip()) for name, (a, b) in zip(names, spans)}
            for line in lines[2:] if line != "(no rows)"]


def plain(value):
    """A recipe's value as the comparison wants it: Python ints, UTC-aware datetimes, None for nulls."""
    if hasattr(value, "to_pydatetime"):  # pandas.Timestamp
        value = value.to_pydatetime()
    if isinstance(value, datetime):
        # Spark hands naive datetimes in the process's zone, which the shared session sets to UTC.
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        value = value.item()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def rows(answer) -> list[tuple]:
    """Rows of a DuckDB/Spark result, a Polars or a pandas DataFrame, as tuples of plain values."""
    if hasattr(answer, "itertuples"):
        answer = answer.itertuples(index=False)
    elif hasattr(answer, "iter_rows"):
        answer = answer.iter_rows()
    return [tuple(plain(v) for v in row) for row in answer]


def _null_first(value):
    return (value is not None, value if value is not None else "")


@pytest.fixture(scope="module")
def built(spark, tmp_path_factory):
    return build_demo_warehouse(tmp_path_factory.mktemp("query-recipes"), spark)


def expected_answers(warehouse: Path) -> dict:
    """Each recipe's answer, from ``traffic show`` (every row: ``--top`` far above the table sizes)."""
    settings = load_settings(environ={}, overrides={"warehouse": warehouse})

    def shown(what, start=None, end=None):
        return parse_show(show(settings, what, start, end, 1_000_000))

    ledger = shown("periods")
    published = {(r["grain"], r["period_start"].date()) for r in ledger if r["dq_status"] in PUBLISHED}
    daily = [r for r in shown("daily", DAY, NEXT_DAY) if ("day", r["day"]) in published]
    by_pair = sorted(daily, key=lambda r: (-r["bytes"], r["local_ip"], r["remote_ip"]))
    talkers = defaultdict(lambda: [0, 0])
    for r in daily:
        talkers[r["local_ip"]][0] += r["bytes"]
        talkers[r["local_ip"]][1] += r["packets"]
    per_address = defaultdict(lambda: [0, 0, 0, 0])
    for r in (r for r in shown("monthly", MONTH, NEXT_MONTH) if ("month", r["month"]) in published):
        for i, column in enumerate(("bytes", "packets", "bytes_in", "bytes_out")):
            per_address[r["local_ip"]][i] += r[column]
    hours = [r for r in ledger if r["grain"] == "hour"]
    day_status = {r["period_start"].date(): r["dq_status"] for r in ledger if r["grain"] == "day"}
    quality = defaultdict(Counter)
    for r in hours:
        quality[r["period_start"].date()][r["dq_status"]] += 1
    published_hours = {r["period_start"] for r in hours if r["dq_status"] in PUBLISHED}
    hourly = shown("hourly")
    final_rows = [r for r in hourly if r["status"] == "final" and r["hour"] in published_hours]
    per_hour = defaultdict(lambda: [0, 0, 0])
    for r in final_rows:
        per_hour[r["hour"]][0] += 1
        per_hour[r["hour"]][1] += r["bytes"]
        per_hour[r["hour"]][2] += r["packets"]
    accounts = [r for r in shown("account-monthly") if ("month", r["month"]) in published]
    return {
        "shown": {"daily": daily, "ledger": ledger, "hourly": hourly, "accounts": accounts},
        "top_pairs": [(r["local_ip"], r["remote_ip"], r["bytes"], r["packets"], r["bytes_in"], r["bytes_out"])
                      for r in by_pair[:10]],
        "top_talkers": sorted(((ip, b, p) for ip, (b, p) in talkers.items()), key=lambda t: (-t[1], t[0]))[:10],
        "month_per_address": sorted(((ip, *sums) for ip, sums in per_address.items()), key=lambda t: (-t[1], t[0])),
        "quality_per_day": [(day, sum(c.values()), sum(c[s] for s in PUBLISHED), c["warning"], c["failed"],
                             day_status.get(day)) for day, c in sorted(quality.items())],
        "account_month": sorted(((r["month"], r["account"], r["direction"], r["bytes"], r["packets"]) for r in accounts),
                                key=lambda t: (t[0], t[1], _null_first(t[2]))),
        "published_hours": [(hour, *sums) for hour, sums in sorted(per_hour.items())],
        "final_hourly": Counter((r["hour"], r["local_ip"], r["remote_ip"], r["bytes"], r["packets"], r["bytes_in"],
                                 r["bytes_out"], r["status"]) for r in final_rows),
        "quality_counts": Counter((r["period_start"].date(), r["dq_status"]) for r in hours),
    }


@pytest.fixture(scope="module")
def expected(built) -> dict:
    return expected_answers(built.settings.warehouse)


@pytest.fixture(scope="module")
def recipes(built, spark) -> dict:
    """The namespace after every runnable block of the page (the Spark views dropped afterwards)."""
    namespace = run_blocks(DOC.read_text(), built.settings.warehouse, {"spark": spark})
    yield namespace
    for name in VIEWS:
        spark.catalog.dropTempView(name)


def check_sql_answers(answers: dict, expected: dict) -> None:
    """Every query of the page's ``QUERIES`` against its expected answer, exactly and in order."""
    for name in ("top_pairs", "top_talkers", "month_per_address", "quality_per_day", "account_month",
                 "published_hours"):
        got = rows(answers[name])
        assert got == expected[name], f"{name}: got {got}, expected (traffic show) {expected[name]}"


# -- the tests ------------------------------------------------------------------------------------
def test_page_blocks_are_all_known_and_the_settings_match():
    text = DOC.read_text()
    blocks = doc_blocks(text)
    assert {info for info, _, _ in blocks} <= set(TAGS), [info for info, _, _ in blocks]
    assert sum(TAGS[info] == "run" for info, _, _ in blocks) >= 6
    assert sum(TAGS[info] == "jars" for info, _, _ in blocks) == 1
    assert f'DAY = "{DAY}"' in text and f'MONTH = "{MONTH}"' in text
    assert "INSTALL delta" in text and "does not work on an offline machine" in text


def test_the_warehouse_holds_what_the_page_talks_about(built, expected):
    """The test warehouse has removed files on disk, expired detail, a rolled-up day and month, and
    both published verdicts; and ``traffic show`` parsed back equals the tables read through the layer."""
    from deltalake import DeltaTable

    root = built.settings.warehouse
    for name in ("hourly", "packets"):
        logged = {Path(u.removeprefix("file://")).resolve() for u in DeltaTable(str(root / name)).file_uris()}
        on_disk = {p.resolve() for p in (root / name).rglob("*.parquet") if "_delta_log" not in p.parts}
        assert logged < on_disk, f"{name}: {len(on_disk - logged)} removed files on disk expected"
    ledger = expected["shown"]["ledger"]
    assert {(r["grain"], r["period_start"]) for r in ledger if r["grain"] != "hour"} == {
        ("day", datetime(2026, 10, 31, tzinfo=UTC)), ("month", datetime(2026, 10, 1, tzinfo=UTC))}
    assert all(r["dq_status"] in PUBLISHED for r in ledger if r["grain"] != "hour")
    assert {r["dq_status"] for r in ledger if r["grain"] == "hour"} == {"passed", "warning"}
    assert sum(r["late_bytes"] for r in ledger if r["grain"] == "hour") > 0
    warehouse = Warehouse(built.settings, engine="rs")
    packets_hours = set(warehouse.table("packets").read_arrow(columns=["hour"]).column("hour").to_pylist())
    assert min(packets_hours) > EDGES[0], "raw detail of the first hours should have expired"
    # The reference itself: show's text, parsed, is exactly the stored rows.
    columns = ["hour", "local_ip", "remote_ip", "bytes", "packets", "bytes_in", "bytes_out", "status"]
    stored = Counter(tuple(plain(v) for v in r.values())
                     for r in warehouse.table("hourly").read_arrow(columns=columns).to_pylist())
    assert Counter(tuple(r[c] for c in columns) for r in expected["shown"]["hourly"]) == stored
    daily = warehouse.table("daily").read_arrow().to_pylist()
    assert sorted((r["local_ip"], r["remote_ip"], r["bytes"], r["packets"]) for r in daily
                  if r["day"] == date.fromisoformat(DAY)) == sorted(
        (r["local_ip"], r["remote_ip"], r["bytes"], r["packets"]) for r in expected["shown"]["daily"])
    assert len(expected["top_pairs"]) == 10 and len(expected["account_month"]) >= 6


def test_plain_parquet_read_of_a_table_folder_is_wrong(recipes, expected):
    """The page's warning, backed: the folder read counts removed files; the log read is show's total."""
    shown_total = sum(r["bytes"] for r in expected["shown"]["hourly"])
    assert recipes["logged_bytes"] == shown_total
    assert recipes["plain_bytes"] > recipes["logged_bytes"], (recipes["plain_bytes"], recipes["logged_bytes"])


def test_duckdb_recipes_equal_traffic_show(recipes, expected):
    con = recipes["con"]
    assert con.execute("SELECT current_setting('TimeZone')").fetchone()[0] == "UTC"
    check_sql_answers(recipes["duckdb_answers"], expected)


def test_polars_recipes_equal_traffic_show(recipes, expected):
    assert rows(recipes["top_talkers_pl"]) == expected["top_talkers"]
    assert rows(recipes["account_month_pl"]) == expected["account_month"]


def test_pandas_recipes_equal_traffic_show(recipes, expected):
    assert rows(recipes["month_per_address_pd"]) == expected["month_per_address"]
    crosstab = recipes["quality_per_day_pd"]
    counts = Counter({(plain(day), status): int(crosstab.loc[day, status])
                      for day in crosstab.index for status in crosstab.columns if crosstab.loc[day, status]})
    assert counts == expected["quality_counts"]
    final = recipes["final_hourly_pd"][["hour", "local_ip", "remote_ip", "bytes", "packets", "bytes_in",
                                        "bytes_out", "status"]]
    assert Counter(rows(final)) == expected["final_hourly"]


def test_spark_sql_over_the_logs_files_equals_traffic_show(recipes, expected):
    """Spark without Delta's jars: the views over ``DeltaTable.file_uris()`` with the schemas' types."""
    check_sql_answers(recipes["spark_answers"], expected)


def test_spark_sql_through_delta_spark_equals_traffic_show(built, recipes, expected, spark):
    with_jars = load_settings(environ={}, overrides={"engine": "auto", "spark_jars_dir": JARS}) if JARS else None
    if with_jars is None or choose_engine(with_jars) != "spark":
        pytest.fail(f"delta-spark recipe: Delta Lake's jars are not in {JARS}: run `make setup` where Maven "
                    "Central is reachable")
    try:
        namespace = run_blocks(DOC.read_text(), built.settings.warehouse, dict(recipes), kind="jars")
    except Exception as error:  # noqa: BLE001 - say which session could not read Delta, then fail
        if "delta" in str(error).lower() and "data source" in str(error).lower():
            pytest.fail(f"the shared SparkSession has no Delta data source although {JARS} holds the jars "
                        f"(tests/conftest.py builds it from the environment without them?): {error}")
        raise
    check_sql_answers(namespace["delta_spark_answers"], expected)


@pytest.mark.parametrize("change", [
    ("ORDER BY bytes DESC, local_ip, remote_ip", "ORDER BY bytes ASC, local_ip, remote_ip"),
    ("count(*) FILTER (WHERE h.dq_status = 'warning')", "count(*) FILTER (WHERE h.dq_status = 'passed')"),
    ("sum(p.bytes) AS bytes, sum(p.packets) AS packets", "sum(p.bytes) AS bytes, count(*) AS packets"),
])
def test_a_changed_recipe_is_caught(built, expected, change):
    """The comparison can fail: the page with one query altered no longer matches ``traffic show``."""
    text = DOC.read_text()
    assert change[0] in text
    namespace = run_blocks(text.replace(change[0], change[1], 1), built.settings.warehouse, {},
                           stop_after="duckdb_answers")
    with pytest.raises(AssertionError):
        check_sql_answers(namespace["duckdb_answers"], expected)
