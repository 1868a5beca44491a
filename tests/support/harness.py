"""Drive the real pipeline in-process (shared SparkSession) and read its tables like the model's."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from traffic.storage import state as st
from traffic.app.runs import close
from traffic.storage.warehouse import Warehouse
from traffic.app.runs import ingest
from traffic.core.location import ObjectLocation, is_object_url
from traffic.core.settings import load_settings

UTC = timezone.utc


def put_object(url: str, data: bytes) -> None:
    """``data`` stored whole as the object ``url`` (the store and credentials of the AWS variables)."""
    import obstore  # deferred: only tests of object storage need it

    from traffic.io.objects import split_url

    bucket, key = split_url(url)
    obstore.put(ObjectLocation.parse(f"s3://{bucket}").store(), key, data)

#: Columns compared with the reference model, per table (extra project columns are left out).
MODEL_COLUMNS = {
    "packets": ["ts", "source", "local_ip", "remote_ip", "local_port", "remote_port", "protocol", "bytes",
                "direction", "hour", "batch_id"],
    "late_packets": ["ts", "source", "local_ip", "remote_ip", "local_port", "remote_port", "protocol", "bytes",
                     "direction", "hour", "batch_id"],
    "rejects": ["batch_id", "source"],
    "hourly": ["hour", "day", "local_ip", "remote_ip", "bytes", "packets", "bytes_in", "bytes_out", "status"],
    "daily": ["day", "month", "local_ip", "remote_ip", "bytes", "packets", "bytes_in", "bytes_out"],
    "monthly": ["month", "local_ip", "remote_ip", "bytes", "packets", "bytes_in", "bytes_out"],
    "periods": ["grain", "period_start", "bytes", "packets", "late_bytes", "late_packets", "sources_reporting",
                "sources_expected", "panes_active", "closed_at_watermark", "dq_status", "restated"],
    "source_panes": ["source", "pane_start", "packets", "bytes", "ticks"],
    "clocks": ["source", "clock", "last_batch_id", "last_seen_at"],
    "batches": ["batch_id", "records_read", "packets_on_time", "packets_late", "records_rejected", "ticks",
                "bytes_on_time", "bytes_late", "duplicate_files", "watermark_before", "watermark_after"],
}


def _quiet(*_args, **_kwargs):
    return None


class Harness:
    """A warehouse and inbox under ``root``, run with the shared session."""

    def __init__(self, root: Path, spark, **overrides):
        self.root = Path(root)
        (self.root / "inbox").mkdir(parents=True, exist_ok=True)
        values = {"warehouse": self.root / "warehouse", "inbox": self.root / "inbox",
                  "now": "2026-12-01T00:00:00+00:00", "shuffle_partitions": 2}
        values.update(overrides)
        self.settings = load_settings(environ={}, overrides=values)
        self.spark = spark
        self.count = 0

    def deliver(self, source: str, text: str, name: str | None = None) -> Path | str:
        """One file into the inbox: a file in its folder, or an object (put whole) when it is on object storage."""
        self.count += 1
        if is_object_url(self.settings.inbox):
            url = f"{self.settings.inbox}/{source}/{name or f'part-{self.count:05d}.csv'}"
            put_object(url, text.encode())
            return url
        folder = self.root / "inbox" / source
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / (name or f"part-{self.count:05d}.csv")
        path.write_text(text)
        return path

    def ingest(self):
        return ingest(self.settings, lambda: self.spark, _quiet)

    def close(self, until: datetime | None = None):
        return close(self.settings, lambda: self.spark, until, _quiet)

    def warehouse(self) -> Warehouse:
        return Warehouse(self.settings, spark=self.spark)

    def table(self, name: str) -> list[dict]:
        return st.rows(self.warehouse().table(name).read_arrow())

    def tables(self, columns=MODEL_COLUMNS) -> dict[str, list[tuple]]:
        """Every table as a sorted list of tuples of the compared columns."""
        return {name: sorted((tuple(r[c] for c in cols) for r in self.table(name)), key=_sort_key)
                for name, cols in columns.items()}

    @property
    def watermark(self):
        return st.read_clock_state(self.warehouse()).watermark


def model_tables(model, columns=MODEL_COLUMNS) -> dict[str, list[tuple]]:
    tables = model.tables()
    return {name: sorted((tuple(r[c] for c in cols) for r in tables[name]), key=_sort_key)
            for name, cols in columns.items()}


def _sort_key(row):
    return tuple((v is None, str(type(v)), v if v is not None else 0) for v in row)


def micros(ts: datetime) -> int:
    return int((ts - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))


def feed_line(ts: datetime, local="10.0.0.1", remote="192.0.2.1", lport=1000, rport=443, size=100) -> str:
    return f"new,OP_INSERT,{micros(ts)},{local},{remote},{lport},{rport},{size}"


def tick_line(ts: datetime) -> str:
    return f"new,OP_INSERT,{micros(ts)}"
