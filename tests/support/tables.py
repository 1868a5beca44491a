"""Two warehouses compared table by table, row by row: what the cluster and compose tests assert."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from traffic.core.settings import load_settings
from traffic.storage.warehouse import Warehouse
from traffic.storage.schemas import TABLES
from traffic.storage.state import rows

#: Columns that hold the processing machine's clock, not anything computed from the input.
WALL_CLOCK = {"batches": {"started_at", "committed_at"}}


def tables(warehouse: Path, names=TABLES, leave_out: dict[str, set[str]] | None = None,
           where: dict[str, Callable[[dict], bool]] | None = None) -> dict[str, list[str]]:
    """Each of ``names``, each row (wall-clock columns and ``leave_out``'s left out; only those ``where``
    keeps, if it names the table) as a canonical string, sorted."""
    store = Warehouse(load_settings(environ={}, overrides={"warehouse": warehouse}), engine="rs")
    left_out = {name: WALL_CLOCK.get(name, set()) | (leave_out or {}).get(name, set()) for name in names}
    result = {}
    for name in names:
        keep = (where or {}).get(name, lambda row: True)
        kept = [{k: v for k, v in row.items() if k not in left_out[name]}
                for row in rows(store.table(name).read_arrow()) if keep(row)]
        result[name] = sorted(repr(sorted(row.items())) for row in kept)
    return result


def differences(got: dict[str, list[str]], expected: dict[str, list[str]], sides=("cluster", "local[2]")) -> str:
    """What differs, a few rows of each side per table (the message of a failed comparison)."""
    lines = []
    for name in expected:
        extra = sorted(set(got[name]) - set(expected[name]))
        missing = sorted(set(expected[name]) - set(got[name]))
        if got[name] != expected[name]:
            lines.append(f"{name}: {len(got[name])} rows on the {sides[0]}, {len(expected[name])} on {sides[1]}")
            lines += [f"  {sides[0]} only: {r}" for r in extra[:3]] + [f"  {sides[1]} only: {r}" for r in missing[:3]]
    return "\n".join(lines)
