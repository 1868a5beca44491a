"""``traffic demo``'s run: every delivery generated, its router telemetry sent to a collector, then
ingested and closed; at the end what a person wants to see (totals, ledger, late records, bills, alerts)."""

from __future__ import annotations

import random
import shutil
from datetime import timedelta
from pathlib import Path

from traffic.app.demo.deliveries import DEMO_ACCOUNTS, DEMO_COMMIT_BPS, DEMO_NETWORKS, DEMO_QUOTA_BYTES, END, \
    LOCAL_HOSTS, REMOTE_V4, START, add_trouble, generate
from traffic.app.demo.exports import SFLOW_RATE
from traffic.core.periods import hours_between, period_end
from traffic.core.settings import Settings


def run_demo(settings: Settings, spark, base: Path, ingest, close, progress=print) -> int:
    """Generate, run every delivery through ``ingest`` and ``close`` (the CLI's runs), then print the results."""
    from traffic.app.console import print_batch, print_close  # deferred: with the report, only when the demo runs
    from traffic.reporting.report import show, status  # deferred: see above

    from traffic.app.demo.telemetry import Router  # deferred: the collector, only when the demo runs

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
