"""What the collector counts: each exporter's datagrams and bytes, each refused sender's, and their
Prometheus view (read at scrape time, so nothing is counted twice per datagram)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from traffic.app.collect.files import Sink


@dataclass
class Exporter:
    """One exporter address: its source and its counts."""

    address: str
    source: str
    datagrams: int = 0
    bytes: int = 0
    oversized: int = 0
    last_seen_us: int = 0
    sink: Sink | None = None


@dataclass
class Refused:
    """A sender outside ``allowed_exporters`` (or all further ones, ``others``): what it sent, not stored."""

    address: str
    datagrams: int = 0
    bytes: int = 0
    last_seen_us: int = 0

    def count(self, size: int, ts_us: int) -> None:
        self.datagrams += 1
        self.bytes += size
        self.last_seen_us = ts_us

    def as_status(self) -> dict:
        seen = datetime.fromtimestamp(self.last_seen_us / 1e6, timezone.utc).isoformat() if self.datagrams else None
        return {"datagrams": self.datagrams, "bytes": self.bytes, "last_seen": seen}


class Metrics:
    """The collector's counts for Prometheus, read at scrape time (nothing is counted twice per datagram)."""

    def __init__(self, collector):  # a ``Collector`` (it imports this module: no annotation, no loop)
        self.collector = collector

    def collect(self):
        from prometheus_client.core import CounterMetricFamily  # deferred: only with --metrics

        datagrams = CounterMetricFamily("traffic_collect_datagrams", "Datagrams received", labels=["exporter", "source"])
        size = CounterMetricFamily("traffic_collect_bytes", "UDP payload bytes received", labels=["exporter", "source"])
        drops = CounterMetricFamily("traffic_collect_kernel_drops", "Datagrams the kernel dropped (socket buffer full)",
                                    labels=["listen"])
        files = CounterMetricFamily("traffic_collect_files_written", "Completed files written to the inbox")
        refused = CounterMetricFamily("traffic_collect_refused_datagrams",
                                      "Datagrams dropped: their sender is not in allowed_exporters "
                                      "(sender=\"others\": senders beyond the counted ones)", labels=["sender"])
        for exporter in list(self.collector.exporters.values()):
            datagrams.add_metric([exporter.address, exporter.source], exporter.datagrams)
            size.add_metric([exporter.address, exporter.source], exporter.bytes)
        for listener in self.collector.listeners:
            drops.add_metric([str(listener.endpoint)], listener.drops or 0)
        files.add_metric([], self.collector.files_written)
        for entry in [*list(self.collector.refused.values()), self.collector.refused_others]:
            if entry.datagrams:
                refused.add_metric([entry.address], entry.datagrams)
        yield from (datagrams, size, drops, files, refused)

