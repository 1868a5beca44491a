"""``traffic demo``: realistic sample traffic through the whole pipeline, then what a person wants to see.

The sample spans 2026-10-31 20:00 → 2026-11-02 02:00 UTC (a day change and a month change)
from four sources: ``edge-a`` (router-feed CSV), ``edge-b`` (JSON lines with directions),
``quiet`` (clock ticks only) and ``router`` (flow telemetry: IPFIX flows and sFlow samples sent
over UDP to a ``traffic collect`` on 127.0.0.1, ``traffic.app.demo_telemetry``). Deliveries
arrive every few hours of event time; one of them carries late records for a closed hour, bad
lines and a re-delivered file.
"""

from __future__ import annotations

import json
import random
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

from traffic.core.periods import hours_between, period_end
from traffic.core.settings import Settings

UTC = timezone.utc
START = datetime(2026, 10, 31, 20, tzinfo=UTC)
END = datetime(2026, 11, 2, 2, tzinfo=UTC)
DEMO_NETWORKS = ("192.0.2.0/24", "2001:db8:100::/48")
LOCAL_HOSTS = [f"192.0.2.{i}" for i in range(10, 30)] + ["2001:db8:100::10", "2001:db8:100::11"]
REMOTE_V4 = [f"198.51.100.{i}" for i in range(1, 40)] + [f"203.0.113.{i}" for i in range(1, 20)]
REMOTE_V6 = ["2001:db8:beef::1", "2001:db8:beef::2", "2001:db8:cafe::53"]
#: The demo's accounts (unless the settings name an accounts file): the heavy users are acme's, with a
#: monthly quota November's first hours cross (the commit shows in the bills; the sample is too short to
#: push a month's 95th percentile over it).
DEMO_ACCOUNTS = """\
# The demo's accounts: which local addresses belong to whom, and their limits (README, Billing).
[[version]]
name = "demo"
effective_from = 2026-10-01

[version.accounts]
acme = ["192.0.2.8/29"]
globex = ["192.0.2.16/28", "2001:db8:100::/48"]

[version.limits.acme]
quota_bytes = %(quota)d
commit_bps = %(commit)d
"""
DEMO_QUOTA_BYTES = 40_000_000
DEMO_COMMIT_BPS = 100_000


def _micros(ts: datetime) -> int:
    return int(ts.timestamp()) * 1_000_000 + ts.microsecond


def _packet(rng: random.Random, ts: datetime) -> tuple[str, str, int, int, int]:
    local = rng.choice(LOCAL_HOSTS[:4]) if rng.random() < 0.5 else rng.choice(LOCAL_HOSTS)  # a few heavy users
    remote = rng.choice(REMOTE_V6) if ":" in local else rng.choice(REMOTE_V4)
    size = rng.choice([64, 64, 120, 576, 1500, 1500, 1500]) if ":" not in local else rng.choice([80, 1280, 1500])
    return local, remote, rng.randint(1024, 65535), rng.choice([53, 80, 443, 443, 8443]), size


def generate(inbox: Path, start: datetime, end: datetime, seed: int = 7) -> None:
    """One delivery: traffic of ``[start, end)`` from every source, as files in ``inbox/<source>/``."""
    rng = random.Random(f"{seed}-{start.isoformat()}")
    tag = f"{start:%Y%m%dT%H}"
    lines_a, lines_b, ticks = [], [], []
    t = start
    while t < end:
        busy = 1.0 + 2.0 * (8 <= t.hour < 20)
        for _ in range(int(rng.expovariate(1 / (12 * busy))) + 1):
            ts = t + timedelta(microseconds=rng.randrange(60_000_000))
            local, remote, lport, rport, size = _packet(rng, ts)
            lines_a.append(f"new,OP_INSERT,{_micros(ts)},{local},{remote},{lport},{rport},{size}")
        for _ in range(rng.randint(2, 10)):
            ts = t + timedelta(microseconds=rng.randrange(60_000_000))
            local, remote, lport, rport, size = _packet(rng, ts)
            lines_b.append(json.dumps({"ts": ts.isoformat(), "local_ip": local, "remote_ip": remote,
                                       "local_port": lport, "remote_port": rport, "protocol": 6,
                                       "bytes": size, "direction": rng.choice(["in", "in", "out"])}))
        if t.minute % 5 == 0:
            ticks.append(f"new,OP_INSERT,{_micros(t)}")
        t += timedelta(minutes=1)
    # Every source reports up to the end of the delivery, so the watermark reaches it.
    for lines in (lines_a, ticks):
        lines.append(f"new,OP_INSERT,{_micros(end - timedelta(microseconds=1))}")
    lines_b.append(json.dumps({"ts": (end - timedelta(microseconds=1)).isoformat()}))
    for source, name, lines in (("edge-a", f"feed-{tag}.csv", lines_a), ("edge-b", f"flows-{tag}.jsonl", lines_b),
                                ("quiet", f"ticks-{tag}.csv", ticks)):
        folder = inbox / source
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("\n".join(lines) + "\n")


def add_trouble(inbox: Path, closed_hour: datetime) -> None:
    """Late records for a closed hour, lines a router should never send, and a re-delivered file."""
    folder = inbox / "edge-a"
    late = [f"new,OP_INSERT,{_micros(closed_hour + timedelta(minutes=m))},192.0.2.10,198.51.100.7,40000,443,1500"
            for m in (3, 17, 42)]
    bad = ["new,OP_INSERT,not-a-time,192.0.2.10,198.51.100.7,1,2,3",
           "new,OP_INSERT,1793500000000000,192.0.2.999,198.51.100.7,1,2,3",
           "new,OP_DELETE,1793500000000000,192.0.2.10,198.51.100.7,1,2,3",
           "new,OP_INSERT,1793500000000000,192.0.2.10,198.51.100.7,1,2,-40"]
    (folder / "late-and-bad.csv").write_text("\n".join(late + bad) + "\n")
    first = sorted(folder.glob("feed-*.csv"))[0]
    shutil.copy(first, folder / ("resent-" + first.name))


def run_demo(settings: Settings, spark, base: Path, ingest, close, progress=print) -> int:
    """Generate, run every delivery through ``ingest`` and ``close`` (the CLI's runs), then print the results."""
    from traffic.app.console import print_batch, print_close  # deferred: with the report, only when the demo runs
    from traffic.reporting.report import show, status  # deferred: see above

    from traffic.app.demo_telemetry import SFLOW_RATE, Router  # deferred: the collector, only when the demo runs

    base = base.absolute()
    if base.exists():
        shutil.rmtree(base)
    inbox = settings.inbox
    inbox.mkdir(parents=True)
    # The sample's own networks (flows and samples are oriented by them), unless the settings name some.
    settings = settings.replace(local_networks=settings.local_networks or DEMO_NETWORKS)
    if settings.accounts_file is None:
        accounts = base / "accounts.toml"
        accounts.write_text(DEMO_ACCOUNTS % {"quota": DEMO_QUOTA_BYTES, "commit": DEMO_COMMIT_BPS})
        settings = settings.replace(accounts_file=accounts)
    print(f"demo: sample traffic {START:%Y-%m-%d %H:%M} → {END:%Y-%m-%d %H:%M} UTC from edge-a, edge-b, quiet "
          f"and router (IPFIX and sFlow 1 in {SFLOW_RATE} over UDP to traffic collect on 127.0.0.1)")
    print(f"demo: inbox {inbox}\ndemo: warehouse {settings.warehouse}\n")
    router = Router(inbox, LOCAL_HOSTS, REMOTE_V4)
    edges = hours_between(START, period_end(END, "hour"))[::5]  # a delivery every 5 hours
    if edges[-1] != END:
        edges.append(END)
    failed = False
    for number, (a, b) in enumerate(zip(edges, edges[1:]), start=1):
        generate(inbox, a, b)
        router.deliver(a, b, random.Random(f"router-{a.isoformat()}"))
        if number == 3:
            add_trouble(inbox, START + timedelta(hours=1))
        print(f"delivery {number}: {a:%m-%d %H:%M} → {b:%m-%d %H:%M}")
        print_batch(ingest(settings, spark, progress))
        result = close(settings, spark, None, progress)
        print_close(result)
        failed = failed or bool(result.failed)
    router.close()
    info = status(settings)
    print(f"\nwatermark {info['watermark']:%Y-%m-%d %H:%M}; last closed day {info['last_closed']['day']}, "
          f"month {info['last_closed']['month']}; open hours: {', '.join(info['open_hours']) or 'none'}")
    if info.get("telemetry"):
        flows = info["telemetry"]
        print(f"flow telemetry: {flows['estimated_share']:.1%} of the last {flows['hours']} closed hours' bytes are "
              f"estimates from sFlow samples; {flows['lost']:,} export datagrams lost")
    for title, what, top in (("Monthly totals (top pairs)", "monthly", 5), ("Daily totals (top pairs)", "daily", 8),
                             ("Sources (5-minute panes with data or ticks, packets, bytes, ticks, lost)", "sources", 8),
                             ("Ledger: closed days and months", "periods", 50), ("Late records", "late", 5),
                             ("Rejected records", "rejects", 10)):
        text = show(settings, what, None, None, top)
        if what == "periods":
            text = "\n".join(line for line in text.splitlines() if not line.startswith("hour "))
        print(f"\n{title}\n{text}")
    for title, text in _billing(settings):
        print(f"\n{title}\n{text}")
    print(f"\nMore: traffic show hourly --warehouse {settings.warehouse} --top 20   |   "
          f"traffic status --warehouse {settings.warehouse}   |   "
          f"traffic bill --period {START:%Y-%m} --warehouse {settings.warehouse} --set accounts_file={settings.accounts_file}")
    return 3 if failed else 0


def _billing(settings: Settings) -> list[tuple[str, str]]:
    """(title, text table) of the first month's stored bills (with the overage over the commit) and of the alerts."""
    import pyarrow as pa  # deferred: only when the demo runs

    from traffic.accounting.alerts import read_alerts  # deferred: only when the demo runs
    from traffic.accounting.bills import billing_cycle, stored_bills  # deferred: see above
    from traffic.reporting.report import format_table  # deferred: see above
    from traffic.storage.warehouse import Warehouse  # deferred: see above

    warehouse = Warehouse.reader(settings)
    period = billing_cycle(settings).period_for(f"{START:%Y-%m}")
    bills = stored_bills(warehouse, period)
    rate = lambda value: None if value is None else round(value)  # noqa: E731 - whole bits per second on screen
    bill_table = pa.table({
        "account": [b["account"] for b in bills],
        "bytes_total": [b["bytes_total"] for b in bills],
        "billable_bps": [rate(b["billable_bps"]) for b in bills],
        "commit_bps": [rate(b["commit_bps"]) for b in bills],
        "overage_bps": [rate(b["overage_bps"]) for b in bills],
    }, schema=pa.schema([("account", pa.string()), ("bytes_total", pa.int64()), ("billable_bps", pa.int64()),
                         ("commit_bps", pa.int64()), ("overage_bps", pa.int64())]))
    alerts = read_alerts(warehouse)
    columns = ["period", "kind", "account", "hour", "observed", "threshold", "unit"]
    alert_table = pa.Table.from_pylist([{c: a[c] for c in columns} for a in alerts]) if alerts else \
        pa.table({c: pa.array([], pa.string()) for c in columns})
    return [(f"Bills of {period.label} ({period.start_utc:%Y-%m-%d} → {period.end_utc:%Y-%m-%d}, stored when it closed; "
             "rates at the 95th percentile of the period's 5-minute panes, 0 bit/s here: the sample fills fewer "
             "than 5 % of them)", format_table(bill_table)),
            ("Alerts (quota and commit crossings, once each)", format_table(alert_table))]
