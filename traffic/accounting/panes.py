"""Panes: 5-minute totals per (source, account, direction) — the granularity rates and percentiles need.

A pane row is ``(pane_start, source, account, direction)`` with its bytes and packets. The
account is ``local_ip``'s under the mapping version in force at ``pane_start``
(``traffic.core.accounts``); the version's id is kept in ``mapping_version``. Panes live like the
hourly rows: ``open`` while their hour is open (each ingest batch adds its on-time packets to
the panes of the hours it touched), ``final`` once the hour is frozen (the freeze recomputes
them from the same raw detail it recomputes the hourly rows from, with the mapping in force
then). Late packets never change panes.

The functions here are pure transforms (Spark DataFrames; ``account_parts`` and
``sum_pane_rows`` are the Arrow twins the ingest and freeze tasks use); the mapping travels to
the executors as the text of the accounts file, parsed there once per task.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from traffic.accounting.parts import ACCOUNT_PARTS, floor_to, group_sums, weights
from traffic.core.accounts import AccountMap, load_accounts, parse_accounts
from traffic.core.periods import HOUR_US, PANE_US, micros
from traffic.core.accounts import AccountsError
from traffic.core.settings import SettingsError
from traffic.core.accounts import NO_ACCOUNTS
from traffic.accounting.transforms import pane_start, weight

KEY = ("pane_start", "source", "account", "direction", "mapping_version")


@dataclass(frozen=True)
class Mapping:
    """The accounts file as text (what executors parse), or no file (everything ``unassigned``)."""

    text: str | None = None
    name: str = "<no accounts file>"

    @classmethod
    def of(cls, accounts_file: Path | None) -> "Mapping":
        """The file as it is now, validated here so a file broken since the job started fails on the driver."""

        if accounts_file is None:
            return cls()
        try:
            mapping = cls(Path(accounts_file).read_text(encoding="utf-8"), str(accounts_file))
            mapping.load()
        except (OSError, AccountsError) as error:
            raise SettingsError(f"accounts_file: {error}") from None
        return mapping

    def load(self) -> AccountMap:
        return AccountMap() if self.text is None else parse_accounts(self.text, self.name)


def account_map(settings) -> AccountMap:
    """The mapping the settings name (validated when the settings were built)."""
    return load_accounts(settings.accounts_file)


def _attribute(mapping: Mapping):
    """The function Spark runs per task: add ``account`` and ``mapping_version`` to per-address rows."""

    def attribute(batches):
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc


        accounts = mapping.load()
        versions = (NO_ACCOUNTS, *accounts.versions)
        starts_us = np.array([micros(v.effective_from) for v in accounts.versions], dtype=np.int64)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            pane_us = pc.cast(batch.column("pane_start"), pa.int64()).to_numpy(zero_copy_only=False)
            # 0 = before the first version (no accounts); i = versions[i] in force at the pane's start.
            which = np.searchsorted(starts_us, pane_us, side="right")
            owner = np.empty(batch.num_rows, dtype=object)
            version_id = np.empty(batch.num_rows, dtype=object)
            local = batch.column("local_ip")
            for index in np.unique(which):
                rows = np.flatnonzero(which == index)
                version = versions[int(index)]
                owner[rows] = version.lookup_many(local.take(pa.array(rows))).to_numpy(zero_copy_only=False)
                version_id[rows] = version.id
            yield batch.append_column("account", pa.array(owner, pa.string())) \
                       .append_column("mapping_version", pa.array(version_id, pa.string()))

    return attribute



def pane_totals(packets: DataFrame, mapping: Mapping, status: str) -> DataFrame:
    """Per (pane, source, account, direction) totals of ``packets``, with ``status``.

    The sums are overflow-checked (DESIGN §7a) by Spark itself: the session runs with
    ``spark.sql.ansi.enabled`` on (Spark 4's default, which ``runtime.spark`` keeps), where a sum of
    longs past 2**63 − 1 fails the job with ARITHMETIC_OVERFLOW instead of wrapping
    (``tests/integration/test_flow_bounds.py`` shows both)."""

    per_address = packets.groupBy(pane_start().alias("pane_start"), "source", "local_ip", "direction").agg(
        F.sum("bytes").cast("long").alias("bytes"), F.sum(weight()).cast("long").alias("packets"))
    attributed = per_address.mapInArrow(
        _attribute(mapping),
        "pane_start timestamp, source string, local_ip string, direction string, bytes long, packets long, "
        "account string, mapping_version string")
    return _finish(attributed.groupBy(*KEY).agg(F.sum("bytes").alias("bytes"), F.sum("packets").alias("packets")),
                   status)


def account_parts(packets, mapping: Mapping):
    """Raw packets → per (pane, source, account, direction, mapping version) sums.

    Each packet's account is its ``local_ip``'s under the version in force at its pane's start,
    the same per-address rule Spark applies above (attribution is per address and pane, so parts
    attributed apart and summed equal the hour attributed at once). Every address is looked up
    once per task (``AccountMap.lookup_many`` encodes them), and the one grouping is by a handful
    of accounts, not by address: the ingest and freeze tasks call this where the packets are.
    """
    import pyarrow as pa

    return account_parts_of_addresses(pa.table({
        "pane_start": floor_to(packets.column("ts"), PANE_US), "source": packets.column("source"),
        "local_ip": packets.column("local_ip"), "direction": packets.column("direction"),
        "bytes": packets.column("bytes"), "packets": weights(packets)}), mapping)


def account_parts_of_addresses(per_address, mapping: Mapping):
    """Rows of (pane_start, source, local_ip, direction, bytes, packets) — packets, or the per-address pane
    parts ingest tasks left before they attributed panes themselves — → per-account sums."""
    import pyarrow as pa

    table = per_address.combine_chunks()
    attributed = pa.Table.from_batches(list(_attribute(mapping)(iter(table.to_batches()))),
                                       schema=table.schema.append(pa.field("account", pa.string()))
                                       .append(pa.field("mapping_version", pa.string())))
    return group_sums(attributed, list(KEY), {"bytes": ("bytes", "sum"), "packets": ("packets", "sum")},
                      ACCOUNT_PARTS)


def sum_pane_rows(rows, status: str):
    """Attributed pane parts (or rows) summed per pane key, as ``panes`` rows with ``status``."""
    import pyarrow as pa


    grouped = group_sums(rows, list(KEY), {"bytes": ("bytes", "sum"), "packets": ("packets", "sum")})
    return grouped.append_column("hour", floor_to(grouped.column("pane_start"), HOUR_US)) \
                  .append_column("status", pa.repeat(pa.scalar(status), grouped.num_rows))


def _finish(panes: DataFrame, status: str) -> DataFrame:
    return (panes.withColumn("hour", F.date_trunc("hour", "pane_start"))
            .withColumn("bytes", F.col("bytes").cast("long"))
            .withColumn("packets", F.col("packets").cast("long"))
            .withColumn("status", F.lit(status)))
