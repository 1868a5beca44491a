"""`traffic top`: sliding-window totals ending at the watermark equal a brute-force sum over raw detail.

Random streams (CSV with directions, two sources, 30 hours) are ingested in several batches and
closed part-way, so the window covers frozen hours, open hours and the open hour holding W. For
each window the result is compared, key by key and to the byte, with a sum over every raw
packet in ``[W - last, W)``; raw detail is read only for the window's edge hours. Per account,
the mapping changes inside the data: each packet counts for the account in force at its time.
"""

from __future__ import annotations

import random
import shutil
from collections import defaultdict
from datetime import date, datetime, timedelta, timezone

import pytest

from tests.support.harness import Harness
from traffic.core.accounts import load_accounts
from traffic.app.cli import main
from traffic.core.periods import hour_floor
from traffic.storage.table import Table
from traffic.storage.warehouse import Warehouse
from traffic.reporting.top import KEYS, TopError, top_talkers

UTC = timezone.utc
T0 = datetime(2026, 11, 3, 4, tzinfo=UTC)
HEADER = "ts,local_ip,remote_ip,local_port,remote_port,protocol,bytes,direction"
CHANGE = T0 + timedelta(hours=25, minutes=35)  # a new mapping version, inside every window but 15m
ACCOUNTS = f"""
[[version]]
name = "first"
effective_from = 2026-01-01
[version.accounts]
"alpha" = ["10.0.0.0/30"]
"beta" = ["10.0.0.4/31"]

[[version]]
name = "alpha-grows"
effective_from = {CHANGE:%Y-%m-%dT%H:%M:%SZ}
[version.accounts]
"alpha" = ["10.0.0.0/29"]
"""


def _stream(rng: random.Random, start: datetime, end: datetime, n: int) -> list[tuple]:
    span = (end - start) // timedelta(microseconds=1)
    packets = []
    for _ in range(n):
        ts = start + timedelta(microseconds=rng.randrange(span))
        packets.append((ts, f"10.0.0.{rng.randint(1, 6)}", f"198.51.100.{rng.randint(1, 20)}",
                        rng.randint(1024, 65535), 443, 6, rng.choice([40, 64, 576, 1500, rng.randint(40, 1500)]),
                        rng.choice(["in", "out", "in", "internal", ""])))
    return sorted(packets)


def _csv(packets: list[tuple], tick: datetime) -> str:
    lines = [HEADER] + [f"{p[0].isoformat()},{','.join(map(str, p[1:]))}" for p in packets]
    return "\n".join(lines + [f"{tick.isoformat()},,,,,,,"]) + "\n"


def _brute_force(harness: Harness, start: datetime, end: datetime, column: str) -> dict:
    totals = defaultdict(lambda: [0, 0, 0, 0])
    mapping = load_accounts(harness.settings.accounts_file)
    for p in harness.table("packets"):
        if start <= p["ts"] < end:
            key = mapping.version_at(p["ts"]).lookup(p["local_ip"]) if column == "account" else p[column]
            t = totals[key]
            t[0] += p["bytes"]
            t[1] += 1
            t[2] += p["bytes"] if p["direction"] == "in" else 0
            t[3] += p["bytes"] if p["direction"] == "out" else 0
    return {k: tuple(v) for k, v in totals.items()}


def _totals(result) -> dict:
    """A top-talkers result as {key: (bytes, packets, bytes_in, bytes_out)}, as ``_brute_force`` gives it."""
    return {r["key"]: (r["bytes"], r["packets"], r["bytes_in"], r["bytes_out"]) for r in result.rows}


@pytest.fixture(scope="module")
def warehouse(spark, tmp_path_factory):
    """30 hours of two sources' traffic, in three deliveries, the first two hours' worth closed."""
    rng = random.Random(11)
    root = tmp_path_factory.mktemp("top")
    (root / "accounts.toml").write_text(ACCOUNTS)
    harness = Harness(root, spark, keep_hours=200, accounts_file=root / "accounts.toml")
    for part in range(3):
        begin = T0 + timedelta(hours=10 * part)
        end = begin + timedelta(hours=10, minutes=rng.randint(0, 50), seconds=rng.randint(0, 59))
        for source in ("r1", "r2"):
            harness.deliver(source, _csv(_stream(rng, begin, end, 700), end), name=f"p{part}.csv")
        harness.ingest()
        if part == 0:
            harness.close()
    return harness


WINDOWS = [timedelta(minutes=15), timedelta(hours=1), timedelta(hours=5, minutes=17), timedelta(hours=24),
           timedelta(days=7)]


@pytest.mark.parametrize("by", sorted(KEYS))
@pytest.mark.parametrize("last", WINDOWS, ids=lambda d: f"{d.total_seconds():.0f}s")
def test_window_totals_equal_a_brute_force_sum_over_raw_detail(warehouse, last, by):
    wh = warehouse.warehouse()
    result = top_talkers(wh, last, by, limit=None)
    watermark = warehouse.watermark
    assert result.end == watermark and result.start == watermark - last and result.note is None
    expected = _brute_force(warehouse, watermark - last, watermark, KEYS[by])
    got = _totals(result)
    assert got == expected and expected
    if by == "account" and last >= timedelta(hours=24):
        assert {"alpha", "beta", "unassigned"} <= set(got)  # both versions of the mapping in one window
    # Raw detail only for the partial hours at the window's edges, never for a whole hour.
    edges = {hour_floor(watermark - last), hour_floor(watermark)}
    assert set(result.raw_hours) <= edges and len(result.raw_hours) <= 2
    assert all(h + timedelta(hours=1) <= watermark and h >= watermark - last for h in result.whole_hours)


def test_ranking_is_by_bytes_and_limited(warehouse):
    everything = top_talkers(warehouse.warehouse(), timedelta(hours=24), "peer", limit=None)
    top3 = top_talkers(warehouse.warehouse(), timedelta(hours=24), "peer", limit=3)
    assert top3.rows == everything.rows[:3] and top3.keys == everything.keys
    assert [r["bytes"] for r in everything.rows] == sorted((r["bytes"] for r in everything.rows), reverse=True)


def test_an_expired_edge_hour_moves_the_start_to_the_next_whole_hour_and_says_so(warehouse):
    settings = warehouse.settings.replace(keep_hours=3)
    wh = Warehouse(settings, engine="rs")
    last = timedelta(hours=6, minutes=20)
    result = top_talkers(wh, last, "host", limit=None)
    watermark = warehouse.watermark
    assert result.start == hour_floor(watermark - last) + timedelta(hours=1)
    assert "not kept" in result.note and "keep_hours=3" in result.note
    got = _totals(result)
    assert got == _brute_force(warehouse, result.start, watermark, "local_ip")


def test_cli_prints_the_table_and_rejects_bad_windows(warehouse, capsys):
    args = ["--warehouse", str(warehouse.settings.warehouse), "--inbox", str(warehouse.settings.inbox)]
    assert main(["top", "--last", "1h", "--by", "peer", "--limit", "2", *args]) == 0
    out = capsys.readouterr().out
    best = top_talkers(warehouse.warehouse(), timedelta(hours=1), "peer", limit=2).rows
    assert f"{best[0]['key']:<40} {best[0]['bytes']:>16,}" in out and "(the watermark)" in out
    assert main(["top", "--last", "soon", *args]) == 2
    assert "is not a duration" in capsys.readouterr().err
    with pytest.raises(TopError):
        top_talkers(warehouse.warehouse(), timedelta(0), "host")


def test_windows_over_a_merged_day_read_it_once_and_give_the_same_totals(warehouse, spark, tmp_path, monkeypatch):
    """Once a frozen day of ``hourly`` and ``panes`` is one merged file, a window reads it once (a read per UTC
    day, not per hour: that was 24 reads of the whole day's file) and its totals are unchanged."""
    shutil.copytree(warehouse.root, tmp_path / "w")
    merged = Harness(tmp_path / "w", spark, keep_hours=200, accounts_file=tmp_path / "w" / "accounts.toml")
    merged.close()  # freezes up to the watermark: 2026-11-03 is wholly frozen, and merged
    assert any("k=2026-11-03/" in f.path for f in merged.warehouse().table("hourly").files())
    reads = defaultdict(int)
    read_arrow = Table.read_arrow

    def counted(self, *args, **kwargs):
        reads[self.name] += 1
        return read_arrow(self, *args, **kwargs)

    monkeypatch.setattr(Table, "read_arrow", counted)
    watermark = merged.watermark
    for by in ("host", "account"):
        for last in (timedelta(hours=24), timedelta(days=7)):
            reads.clear()
            result = top_talkers(merged.warehouse(), last, by, limit=None)
            got = _totals(result)
            assert got == _brute_force(merged, watermark - last, watermark, KEYS[by])
            days = {h.date() for h in result.whole_hours}
            assert reads["panes" if by == "account" else "hourly"] == len(days) < len(result.whole_hours)
            assert date(2026, 11, 3) in days
