"""Prometheus metrics: ``<warehouse>/_reports/metrics.prom`` after every job that does something; ``traffic metrics``.

Every figure is recomputed from the warehouse when the file is written — the clocks, the ledger,
the ``batches`` totals, the open hours, the last day of ``source_panes``, the current billing
period's final panes — so it is right whoever wrote the tables and whenever. The one thing no
table records, how long the last close took, is kept in ``_traffic/metrics-state.json``.

Each read is bounded by what a micro-batch needs, not by the history: a few ledger columns (a
row per closed period), a few ``batches`` columns (a row per batch), hourly rows from the freeze
frontier on, 24 hours of source panes, and the billing period's final panes, of which each
rolled-up day is summed once and kept in ``_traffic/metrics-cache`` (keyed by its ledger row), so
only the hours since the last rolled-up day are read again. ``docs/metrics.md``
lists every metric; labels are sources, accounts, directions, grains, statuses and close steps,
never an address (a series per address would grow with the traffic, not with the configuration).

The file follows node_exporter's textfile-collector convention: written to a temporary name in
the same folder, then renamed (``prometheus_client.write_to_textfile``), so a scrape never reads
half a file. Writing it never fails a job (``written_after``): a failure is a warning line.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Iterable

import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, generate_latest, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from traffic.accounting.bills import billing_cycle, read_final_panes
from traffic.core.periods import DAY, HOUR, closed_hours, hour_ceil, hour_floor, month_start, next_month, period_end
from traffic.quality.gx_context import reports_dir
from traffic.reporting.html_bills import DerivedCache
from traffic.storage.report_copy import publish_quietly
from traffic.reporting.report import telemetry_health
from traffic.storage import state as st
from traffic.storage.table import StorageError
from traffic.storage.warehouse import Warehouse
from traffic.storage.journal import host_folder, pending_batch, state_folder
from traffic.storage.place import Place

UTC = timezone.utc
#: The file node_exporter's textfile collector reads (it takes ``*.prom`` files of a folder).
METRICS_FILE = "metrics.prom"
#: Close durations, the one figure no table records (under the warehouse's ``_traffic`` state folder).
STATE_FILE = "metrics-state.json"
#: Per-day account sums of past days (``_account_bytes``), under the state folder; deleting it costs one slower write.
CACHE_FOLDER = "metrics-cache"
#: Part of every cache entry's fingerprint: change it when what an entry holds changes form.
CACHE_FORMAT = 1
#: Lost export datagrams are summed over this much event time up to the newest source clock.
LOST_WINDOW = timedelta(hours=24)
#: The estimated-bytes share is taken over this many of the last closed hours (as ``traffic status``).
ESTIMATE_HOURS = 24
GRAINS = ("hour", "day", "month")
DQ_STATUSES = ("passed", "warning", "failed", "accepted")
#: The ledger columns the metrics read (not the notes, acceptances, restatements).
LEDGER_COLUMNS = ["grain", "period_start", "dq_status", "bytes", "lost", "estimated_bytes"]
#: ``batches`` columns summed into counters: (column, metric name, help).
BATCH_COUNTERS = (
    ("records_read", "traffic_records_read", "Input records read by ingest and replay batches (ticks and rejects "
                                             "included, records outside a replay's range not)"),
    ("packets_on_time", "traffic_on_time_packets", "Packets accepted on time (sum of record weights)"),
    ("bytes_on_time", "traffic_on_time_bytes", "Bytes of the packets accepted on time"),
    ("packets_late", "traffic_late_packets", "Packets that arrived for a closed hour (late_packets; sum of weights)"),
    ("bytes_late", "traffic_late_bytes", "Bytes of the late packets"),
    ("records_rejected", "traffic_rejected_records", "Input records rejected (the rejects table holds them with "
                                                     "their reasons)"),
    ("ticks", "traffic_ticks", "Clock ticks read (records that only move a source's clock)"),
    ("duplicate_files", "traffic_duplicate_files", "Files delivered again and not counted again"),
)
BATCH_COLUMNS = ["batch_id", "started_at", "committed_at"] + [column for column, _, _ in BATCH_COUNTERS]


def metrics_path(warehouse: Warehouse) -> Path:
    """``<warehouse>/_reports/metrics.prom``."""
    return reports_dir(warehouse) / METRICS_FILE


def _state_path(warehouse: Warehouse) -> Place:
    return state_folder(warehouse.root) / STATE_FILE


def _seconds(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


def _gauge(name: str, text: str, value=None, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, text, labels=list(labels) or None)
    if value is not None:
        family.add_metric([], value)
    return family


# -- what the metrics are computed from --------------------------------------------------------

def _ledger(warehouse: Warehouse) -> pa.Table:
    return warehouse.table("periods").read_arrow(columns=LEDGER_COLUMNS)


def _batches(warehouse: Warehouse) -> pa.Table:
    return warehouse.table("batches").read_arrow(columns=BATCH_COLUMNS)


def _open_hours(warehouse: Warehouse, since: datetime | None) -> int:
    """Hours with open ``hourly`` rows, read from ``since`` (the freeze frontier: every hour before it is final)."""
    if since is None:
        return 0
    table = warehouse.table("hourly").read_arrow(key_min=since, columns=["hour"], filter=pc.field("status") == "open")
    return len(pc.unique(table.column("hour"))) if table.num_rows else 0


def _lost_by_source(warehouse: Warehouse, newest: datetime | None) -> dict[str, int]:
    """Export sequence units lost per source in the ``LOST_WINDOW`` up to the newest source clock."""
    if newest is None:
        return {}
    start = hour_floor(newest) + HOUR - LOST_WINDOW
    panes = warehouse.table("source_panes").read_arrow(key_min=start, columns=["source", "pane_start", "lost"])
    panes = panes.filter(pc.greater_equal(panes.column("pane_start"), pa.scalar(start, panes.schema.field(
        "pane_start").type)))
    if not panes.num_rows:
        return {}
    sums = pa.table({"source": panes.column("source"), "lost": pc.fill_null(panes.column("lost"), 0)}) \
        .group_by("source", use_threads=False).aggregate([("lost", "sum")])
    return dict(zip(sums.column("source").to_pylist(), sums.column("lost_sum").to_pylist()))


def _account_bytes(warehouse: Warehouse, watermark: datetime | None) -> tuple[str | None, list[tuple]]:
    """(period label, [(account, direction, bytes)]) of the billing period holding the watermark, from final panes.

    Each day of the period that is rolled up is summed once and kept in the metrics cache, keyed by its
    ledger row (a day rolled up again, by a restatement, is summed again); only the final hours after
    the last rolled-up day are read each time, so the cost stays that of a day, not of the month so far.
    """
    cache = DerivedCache(host_folder(warehouse.root) / CACHE_FOLDER)
    if watermark is None:
        _forget(cache)
        return None, []
    period = billing_cycle(warehouse.settings).period_containing(watermark)
    start, end = period.start_utc, period.end_utc
    days = st.read_ledger(warehouse, "day", key_min=month_start(start), key_max=next_month(month_start(end)))
    parts, rest = [], start
    for row in sorted(days, key=lambda r: r["period_start"]):
        day = row["period_start"]
        if day + DAY <= start or day >= end:
            continue
        lo, hi = max(day, start), min(day + DAY, end)
        if lo > rest:  # before the first rolled-up day (days roll up in order): read as it is
            parts.append(_pane_sums(warehouse, rest, lo))
        name = f"account-bytes-{period.label}-{day:%Y-%m-%d}.arrow"
        parts.append(_cached(cache, name, [CACHE_FORMAT, period.label, row],
                             lambda lo=lo, hi=hi: _pane_sums(warehouse, lo, hi)))
        rest = hi
    if rest < end:
        parts.append(_pane_sums(warehouse, rest, end))
    _forget(cache)
    sums = pa.concat_tables(parts).group_by(["account", "direction"], use_threads=False).aggregate([("bytes", "sum")])
    rows = zip(*(sums.column(c).to_pylist() for c in ("account", "direction", "bytes_sum")))
    return period.label, sorted((account, direction or "unknown", total) for account, direction, total in rows)


def _cached(cache: DerivedCache, name: str, inputs, make) -> pa.Table:
    """``cache.table``, or ``make()`` alone where the cache cannot be written (a reader without write access)."""
    try:
        return cache.table(name, inputs, make)
    except OSError:
        return make()


def _forget(cache: DerivedCache) -> None:
    """Drop the entries this run did not use (past periods), where the cache can be written."""
    try:
        cache.forget_unused()
    except OSError:
        pass


def _pane_sums(warehouse: Warehouse, start: datetime, end: datetime) -> pa.Table:
    """Bytes of the final panes in ``[start, end)`` per (account, direction)."""
    panes = read_final_panes(warehouse, hour_floor(start), hour_ceil(end))
    stamp = panes.schema.field("pane_start").type
    when = panes.column("pane_start")
    panes = panes.filter(pc.and_(pc.greater_equal(when, pa.scalar(start, stamp)), pc.less(when, pa.scalar(end, stamp))))
    return panes.select(["account", "direction", "bytes"]).group_by(["account", "direction"], use_threads=False) \
        .aggregate([("bytes", "sum")]).rename_columns(["account", "direction", "bytes"])


def read_state(warehouse: Warehouse) -> dict:
    """The recorded close durations (empty when none was recorded, or the file is unreadable)."""
    try:
        doc = json.loads(_state_path(warehouse).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def record_close(warehouse: Warehouse, steps: str, seconds: float, failed_checks: int,
                 finished: datetime | None = None) -> None:
    """Keep how long the last close of these ``steps`` took (the file is replaced atomically; under the lock)."""
    doc = read_state(warehouse)
    closes = doc.setdefault("close", {})
    closes[steps] = {"seconds": seconds, "failed_checks": failed_checks,
                     "finished_at": (finished or datetime.now(UTC)).isoformat()}
    warehouse.state_dir()
    _state_path(warehouse).write_atomic(json.dumps(doc, indent=1, sort_keys=True))


def steps_label(only: Iterable[str] | None) -> str:
    """The ``steps`` label of a close: ``all``, or the steps it was limited to, sorted and comma-separated."""
    return ",".join(sorted(set(only))) if only else "all"


# -- the metrics ---------------------------------------------------------------------------------

def collect(warehouse: Warehouse, now: datetime | None = None) -> list:
    """Every metric of the warehouse, as ``prometheus_client`` metric families (Arrow reads only, no Spark)."""
    began = time.perf_counter()
    clock = st.read_clock_state(warehouse)
    batches = _batches(warehouse)
    out = _clock_families(warehouse.settings, clock, batches)
    out += _ledger_families(warehouse, clock)
    out += _batch_families(warehouse, batches)
    out += _close_families(warehouse)
    out += _flow_families(warehouse, clock)
    out += _account_families(warehouse, clock.watermark)
    moment = now or datetime.now(UTC)
    out += [_gauge("traffic_metrics_generated_timestamp_seconds", "Wall-clock time these metrics were computed "
                   "(unix seconds): how stale they are", moment.timestamp()),
            _gauge("traffic_metrics_generation_seconds", "Seconds it took to compute these metrics",
                   time.perf_counter() - began)]
    return out


def _clock_families(settings, clock, batches: pa.Table) -> list:
    """The watermark, and per source: its clock, how far W trails it, how far it is behind, silent, live, last seen."""
    watermark, newest = clock.watermark, clock.newest()
    out = [_gauge("traffic_watermark_timestamp_seconds", "The watermark W (event time, unix seconds); absent "
                  "before any data", _seconds(watermark)),
           _gauge("traffic_source_timeout_seconds", "The source_timeout setting: a source silent this long (event "
                  "time) stops holding the watermark back", settings.source_timeout.total_seconds())]
    wanted = pa.array(sorted(set(clock.last_batch.values()) - {None}), pa.int64())
    committed = {r["batch_id"]: _seconds(r["committed_at"]) for r in st.rows(
        batches.select(["batch_id", "committed_at"]).filter(pc.is_in(batches.column("batch_id"), value_set=wanted)))}
    sources = sorted(clock.clocks)
    live = clock.live_sources(settings.source_timeout) if sources else set()
    per_source = {
        "traffic_source_clock_timestamp_seconds": ("The source's clock: the largest event time it sent (unix "
                                                   "seconds)", lambda s: _seconds(clock.clocks[s])),
        "traffic_watermark_lag_seconds": ("How far the watermark trails the source's clock (its clock minus W; "
                                          "at least the allowed lateness for a live source, negative once a "
                                          "stalled source is passed)",
                                          lambda s: None if watermark is None else
                                          (clock.clocks[s] - watermark).total_seconds()),
        "traffic_source_behind_seconds": ("How far the source's clock is behind the newest clock of any source",
                                          lambda s: (newest - clock.clocks[s]).total_seconds()),
        "traffic_source_silent_seconds": ("Event time the other sources moved on since this source last "
                                          "delivered a record (newest clock minus its last-seen mark); it is "
                                          "stalled beyond source_timeout",
                                          lambda s: (newest - clock.last_seen_at(s)).total_seconds()),
        "traffic_source_live": ("1 while the source holds the watermark (live), 0 once it is stalled",
                                lambda s: 1.0 if s in live else 0.0),
        "traffic_source_last_batch_timestamp_seconds": ("Wall-clock time the last batch holding a record of this "
                                                        "source was committed (unix seconds)",
                                                        lambda s: committed.get(clock.last_batch.get(s))),
    }
    for name, (text, value) in per_source.items():
        family = _gauge(name, text, labels=["source"])
        for source in sources:
            v = value(source)
            if v is not None:
                family.add_metric([source], v)
        out.append(family)
    return out


def _ledger_families(warehouse: Warehouse, clock) -> list:
    """Closed periods by grain and status, hours frozen / open / awaiting a freeze, the estimated-bytes share."""
    ledger = _ledger(warehouse)
    counts = ledger.group_by(["grain", "dq_status"], use_threads=False).aggregate([("period_start", "count")])
    by_status = {(g, s or "none"): n for g, s, n in zip(*(counts.column(c).to_pylist()
                                                           for c in ("grain", "dq_status", "period_start_count")))}
    family = _gauge("traffic_periods", "Closed periods in the ledger by grain (hour, day, month) and data-quality "
                    "status (passed, warning = published but flagged, failed = not published, accepted)",
                    labels=["grain", "dq_status"])
    for grain in GRAINS:
        for status in DQ_STATUSES + tuple(sorted({s for g, s in by_status if g == grain} - set(DQ_STATUSES))):
            family.add_metric([grain, status], by_status.get((grain, status), 0))
    hours = ledger.filter(pc.equal(ledger.column("grain"), "hour"))
    frozen = hours.num_rows
    frontier = period_end(pc.max(hours.column("period_start")).as_py().astimezone(UTC), "hour") if frozen else None
    recent = hours.sort_by([("period_start", "descending")]).slice(0, ESTIMATE_HOURS)
    health = telemetry_health(st.rows(recent), ESTIMATE_HOURS)
    return [family,
            _gauge("traffic_hours_frozen", "Hours frozen (every hour row of the ledger, whatever its status)", frozen),
            _gauge("traffic_freeze_frontier_timestamp_seconds", "End of the last frozen hour (unix seconds); "
                   "absent before the first freeze", _seconds(frontier)),
            _gauge("traffic_hours_open", "Hours with open hourly rows (this hour so far, and closed hours not "
                   "frozen yet)", _open_hours(warehouse, frontier or clock.first_hour)),
            _gauge("traffic_hours_awaiting_freeze", "Hours the watermark has closed that are not frozen yet (the "
                   "next close freezes them)", len(closed_hours(clock.first_hour, frontier, clock.watermark))),
            _gauge("traffic_estimated_bytes_ratio", f"Share of the bytes of the last {ESTIMATE_HOURS} closed "
                   "hours that are estimates from sampled flow records (0 to 1)",
                   health["estimated_share"] if health else 0.0)]


def _batch_families(warehouse: Warehouse, batches: pa.Table) -> list:
    """Totals of the ``batches`` table, the last batch, and whether one is pending."""
    out = []
    for column, name, text in BATCH_COUNTERS:
        counter = CounterMetricFamily(name, text)
        counter.add_metric([], pc.sum(batches.column(column)).as_py() or 0)
        out.append(counter)
    counter = CounterMetricFamily("traffic_batches", "Ingest and replay batches committed")
    counter.add_metric([], batches.num_rows)
    out.append(counter)
    last = None
    if batches.num_rows:
        newest = pc.index(batches.column("batch_id"), pc.max(batches.column("batch_id"))).as_py()
        last = st.rows(batches.slice(newest, 1))[0]
    return out + [
        _gauge("traffic_last_batch_id", "Id of the last committed batch", last and last["batch_id"]),
        _gauge("traffic_last_batch_timestamp_seconds", "Wall-clock time the last batch was committed (unix seconds)",
               last and _seconds(last["committed_at"])),
        _gauge("traffic_last_batch_duration_seconds", "Wall-clock seconds the last batch took, from its plan to its "
               "commit (a resumed batch counts from its first attempt)",
               last and (last["committed_at"] - last["started_at"]).total_seconds()),
        _gauge("traffic_pending_batch", "1 while an interrupted batch waits (the next ingest, close or replay "
               "finishes it), else 0", 1.0 if pending_batch(warehouse.root) else 0.0)]


def _close_families(warehouse: Warehouse) -> list:
    """The last close of each set of steps: how long it took, when it ended, how many failures it reported."""
    families = [_gauge("traffic_last_close_duration_seconds", "Wall-clock seconds the last close took (per set "
                       "of steps: all, or those of --only), under the warehouse lock", labels=["steps"]),
                _gauge("traffic_last_close_timestamp_seconds", "Wall-clock time the last close ended (unix seconds)",
                       labels=["steps"]),
                _gauge("traffic_last_close_failed_checks", "Failures the last close reported: periods (or billing "
                       "periods) whose critical checks failed; it exited 3 when above 0", labels=["steps"])]
    for steps, record in sorted(read_state(warehouse).get("close", {}).items()):
        try:
            values = (float(record["seconds"]), datetime.fromisoformat(record["finished_at"]).timestamp(),
                      float(record["failed_checks"]))
        except (KeyError, TypeError, ValueError):
            continue  # a damaged record: left out, not guessed
        for family, value in zip(families, values):
            family.add_metric([steps], value)
    return families


def _flow_families(warehouse: Warehouse, clock) -> list:
    """Lost export datagrams per source (every source listed, 0 without losses), and the data waiting for its
    template per flow source: sets and bytes (0 without), and the receive time of the oldest set (only while
    some wait)."""
    family = _gauge("traffic_flow_export_lost", f"Export sequence units lost (flow telemetry: NetFlow v5/IPFIX "
                    f"records, NetFlow v9/sFlow datagrams) in the {LOST_WINDOW.total_seconds() / 3600:g} hours up to "
                    "the newest source clock", labels=["source"])
    lost = _lost_by_source(warehouse, clock.newest())
    for source in sorted(set(clock.clocks) | set(lost)):
        family.add_metric([source], lost.get(source, 0))
    sets = _gauge("traffic_flow_waiting_sets", "NetFlow v9/IPFIX data sets waiting for their template (rejected "
                  "once the watermark passes their receive time by template_wait)", labels=["source"])
    size = _gauge("traffic_flow_waiting_bytes", "Bytes of the data sets waiting for their template",
                  labels=["source"])
    oldest = _gauge("traffic_flow_waiting_oldest_timestamp_seconds", "Collector receive time (wall clock, unix "
                    "seconds) of the oldest data set waiting for its template; absent while none waits",
                    labels=["source"])
    for source, waiting in sorted(st.waiting_by_source(warehouse, every_source=True).items()):
        sets.add_metric([source], waiting["sets"])
        size.add_metric([source], waiting["bytes"])
        if waiting["oldest"] is not None:
            oldest.add_metric([source], waiting["oldest"].timestamp())
    return [family, sets, size, oldest]


def _account_families(warehouse: Warehouse, watermark: datetime | None) -> list:
    """Bytes per account and direction in the current billing period (never per address)."""
    label, totals = _account_bytes(warehouse, watermark)
    family = _gauge("traffic_account_bytes", "Bytes per account and direction (in, out, internal, transit, unknown) "
                    "in the billing period holding the watermark, from final panes (frozen hours only)",
                    labels=["period", "account", "direction"])
    for account, direction, total in totals:
        family.add_metric([label, account, direction], total)
    return [family]


class _Families:
    """A collector that yields metric families already computed (so the text is generated once)."""

    def __init__(self, families: list):
        self.families = families

    def collect(self):
        return iter(self.families)


def _registry(families: list) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return registry


def exposition(families: list) -> str:
    """The families in Prometheus' text format (what ``metrics.prom`` holds)."""
    return generate_latest(_registry(families)).decode()


def existing(settings) -> Warehouse:
    """The settings' warehouse for reading; a clear error when there is none."""
    warehouse = Warehouse.reader(settings)
    if not warehouse.exists():
        raise StorageError(f"no warehouse at {settings.warehouse} yet (run `traffic ingest` or `traffic demo`)")
    return warehouse


def write_metrics(warehouse: Warehouse, families: list | None = None) -> Path:
    """Write ``metrics.prom`` atomically (a temporary file in the same folder, then a rename)."""
    families = collect(warehouse) if families is None else families
    path = metrics_path(warehouse)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), _registry(families))
    return path


class JobMetrics:
    """What a job tells the metrics: how long its close took, and how many checks failed in it."""

    def __init__(self, warehouse: Warehouse):
        self.warehouse = warehouse
        self.started = time.perf_counter()
        self.close: tuple[str, float, int] | None = None
        self.idle = False

    def nothing_done(self) -> None:
        """The job found nothing to do: no figure can have changed, so an existing file is left as it is
        (a nothing-to-do tick stays cheap; ``traffic_metrics_generated_timestamp_seconds`` then says when a
        job last changed something)."""
        self.idle = True

    def closed(self, only: Iterable[str] | None, failed_checks: int, since: float | None = None) -> None:
        """The job's close has ended (``since``: when it began, ``time.perf_counter``; default: the job's start)."""
        self.close = (steps_label(only), time.perf_counter() - (self.started if since is None else since),
                      failed_checks)


@contextmanager
def written_after(warehouse: Warehouse, progress: Callable[[str], None] = print):
    """Write ``metrics.prom`` when the block ends, normally or with an error; a failure to write is a warning.

    Use it inside the warehouse lock, so the figures are those the job left and no other job writes
    the state file meanwhile.
    """
    job = JobMetrics(warehouse)
    try:
        yield job
    except Exception:
        _write_quietly(job, progress)
        raise
    _write_quietly(job, progress)


def _write_quietly(job: JobMetrics, progress: Callable[[str], None]) -> None:
    """Record the close and write the file; any failure is one warning line (the job's tables are what counts)."""
    if job.idle and metrics_path(job.warehouse).exists():
        return
    if job.close is not None:
        try:
            record_close(job.warehouse, *job.close)
        except Exception as error:  # noqa: BLE001 - metrics never fail a job
            progress(f"warning: close duration not recorded in {_state_path(job.warehouse)}: "
                     f"{type(error).__name__}: {error}")
    try:
        write_metrics(job.warehouse)
    except Exception as error:  # noqa: BLE001 - metrics never fail a job
        progress(f"warning: metrics not written to {metrics_path(job.warehouse)}: {type(error).__name__}: {error}")
    publish_quietly(job.warehouse, progress)  # a warehouse on object storage: its reports go to the store
