"""The report's cache of derived things: a value is made again exactly when what it was made from changes."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa

from traffic.reporting.html_bills import DerivedCache


def test_a_value_is_kept_until_its_inputs_change(tmp_path):
    made = []

    def make(value):
        return lambda: made.append(value) or value

    cache = DerivedCache(tmp_path)
    row = {"period_start": datetime(2026, 10, 1, tzinfo=timezone.utc), "bytes": 5, "versions": ["v1"]}
    assert cache.text("chart.svg", row, make("<svg>1</svg>\nline 2")) == "<svg>1</svg>\nline 2"
    assert DerivedCache(tmp_path).text("chart.svg", dict(row), make("other")) == "<svg>1</svg>\nline 2"
    assert DerivedCache(tmp_path).text("chart.svg", {**row, "bytes": 6}, make("<svg>2</svg>")) == "<svg>2</svg>"
    assert made == ["<svg>1</svg>\nline 2", "<svg>2</svg>"]

    table = pa.table({"account": ["acme", None], "bytes": [1, 2]})
    assert DerivedCache(tmp_path).table("t.arrow", row, make(table)).equals(table)
    kept = DerivedCache(tmp_path).table("t.arrow", row, make(pa.table({"bytes": [9]})))
    assert kept.equals(table) and kept.schema.metadata is None
    assert len(made) == 3


def test_a_damaged_entry_is_made_again_and_unused_entries_are_removed(tmp_path):
    cache = DerivedCache(tmp_path)
    cache.table("t.arrow", 1, lambda: pa.table({"x": [1]}))
    cache.text("old.svg", 1, lambda: "old")
    (tmp_path / "t.arrow").write_bytes(b"not arrow")
    again = DerivedCache(tmp_path)
    assert again.table("t.arrow", 1, lambda: pa.table({"x": [2]})).column("x").to_pylist() == [2]
    again.forget_unused()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.arrow"]
