"""Expectation suites as data: ``expectations/<suite>.json``, read at run time, and what their results name.

A value written ``{"$records": NAME}`` in a suite is ``traffic.core.records.NAME``: the directions,
address form and byte bounds the readers apply, defined once. Also here: how a period is labelled
(``period_label``), a period start from whatever GX hands back (``as_period``), one expectation's
outcome for one period (``Outcome``, a ``dq_results`` row) and text made free of markup for GX's pages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

from traffic.core import records

UTC = timezone.utc
SUITE_DIR = Path(__file__).resolve().parents[2] / "expectations"
SUITES = ("packets", "late_packets", "rejects", "hourly", "daily", "monthly", "periods", "panes", "bills", "alerts")


@lru_cache(maxsize=None)
def suite_document(name: str) -> dict:
    """The JSON document of one suite, its ``{"$records": NAME}`` values resolved."""
    path = SUITE_DIR / f"{name}.json"
    if not path.exists():
        raise KeyError(f"no expectation suite {name!r} in {SUITE_DIR}")
    return _resolve_records(json.loads(path.read_text()), name)


def _resolve_records(value, suite: str):
    """``{"$records": NAME}`` → ``traffic.core.records.NAME`` (a tuple as a list), anywhere in a suite document.

    The suites check what the readers produce with the readers' own constants, so the two cannot drift.
    """
    if isinstance(value, dict):
        if set(value) == {"$records"}:
            try:
                found = getattr(records, value["$records"])
            except AttributeError:
                raise KeyError(f"suite {suite!r} names {value['$records']!r}, which traffic.core.records does not "
                               "define") from None
            return list(found) if isinstance(found, tuple) else found
        return {key: _resolve_records(item, suite) for key, item in value.items()}
    if isinstance(value, list):
        return [_resolve_records(item, suite) for item in value]
    return value


#: Characters a browser reads as markup, the backslash that writes them, and control characters → ``\xNN``.
_MARKUP = str.maketrans({c: f"\\x{ord(c):02x}" for c in [*"<>&\"'\\", *map(chr, range(32)), "\x7f"]})


def markup_free(value):
    """``value`` with every text in it (through dicts, lists and tuples) free of markup: ``<`` → ``\\x3c``.

    Readable on any page however it is rendered (raw, or escaped again), and never markup.
    """
    if isinstance(value, str):
        return value.translate(_MARKUP)
    if isinstance(value, dict):
        return {markup_free(key): markup_free(item) for key, item in value.items()}
    if isinstance(value, list):
        return [markup_free(item) for item in value]
    if isinstance(value, tuple):
        return tuple(markup_free(item) for item in value)
    return value


def period_label(grain: str, start: datetime) -> str:
    """``2026-11-01T10:00Z``, ``2026-11-01`` or ``2026-11`` (a billing period: its UTC start to the minute)."""
    return {"hour": f"{start:%Y-%m-%dT%H:00Z}", "day": f"{start:%Y-%m-%d}", "month": f"{start:%Y-%m}",
            "bill": f"{start:%Y-%m-%dT%H:%MZ}", "alert": f"{start:%Y-%m-%dT%H:%MZ}"}[grain]


def as_period(value: Any) -> datetime:
    """A period start as aware UTC, from what Spark, pandas or GX hand back (datetime, date, Timestamp, text)."""
    if hasattr(value, "to_pydatetime"):
        value = value.to_pydatetime()
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, datetime):
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    raise TypeError(f"not a period start: {value!r}")


@dataclass(frozen=True)
class Outcome:
    """One expectation evaluated for one period (a ``dq_results`` row)."""

    table: str
    grain: str
    period_start: datetime
    suite: str
    expectation: str
    success: bool
    observed: str
    critical: bool
    run_id: str

    def row(self) -> dict:
        return {"table": self.table, "grain": self.grain, "period_start": self.period_start, "suite": self.suite,
                "expectation": self.expectation, "success": self.success, "observed": self.observed,
                "run_id": self.run_id, "critical": self.critical}
