"""Check that the package's imports point down: no import loops, no upward imports, few layers.

    python scripts/check_imports.py            # prints the layers; exit 1 with one line per problem

Rules (README, "How it is built"):
* the subpackages of ``traffic`` are ranked (``RANKS``); a module may import from its own
  subpackage or a lower-ranked one, never from a higher-ranked one;
* no import loops between modules;
* an import of a ``traffic`` module written inside a function must say why on its line
  (``# deferred: …``), e.g. to keep Great Expectations, Spark or Airflow out of a light path;
* executor code (``EXECUTOR_ENTRIES`` and what they import) never imports a driver-side
  module (``EXECUTOR_SAFE`` lists what it may use);
* at most ``MAX_LAYERS`` layers of modules.

The test suite runs it (``tests/unit/test_import_layers.py``).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "traffic"
#: Lower numbers sit lower; equal numbers may import each other's modules (without loops).
RANKS = {"core": 0, "io": 1, "storage": 1, "runtime": 1, "accounting": 2, "quality": 2, "reporting": 3,
         "app": 4, "orchestration": 4}
#: 9 until the Delta layer was split (issue 35): its door (``storage.warehouse``) now sits over the engines,
#: the tables' shared reads and the keys, three layers where one ``delta.py`` was. Annotation-only imports of
#: ``Warehouse`` (``storage.state`` and every module above it) still count; issue 37 is to bring it down.
MAX_LAYERS = 12
#: Code that runs on Spark executors, and what it may import (never a driver-side step, report or app).
EXECUTOR_ENTRIES = ("traffic.accounting.batch_tasks", "traffic.accounting.freeze_tasks")
EXECUTOR_SAFE = ("traffic.core", "traffic.io", "traffic.storage", "traffic.accounting.parts",
                 "traffic.accounting.batch_tasks", "traffic.accounting.freeze_tasks", "traffic.accounting.panes",
                 "traffic.accounting.transforms")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _target(node: ast.ImportFrom | ast.Import, name: str, known: dict[str, Path]) -> list[str]:
    """The package modules an import statement in module ``name`` reads."""
    out = []
    if isinstance(node, ast.Import):
        candidates = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            here = name.split(".")
            if not known[name].name == "__init__.py":
                here = here[:-1]
            here = here[: len(here) - (node.level - 1)]
            base = ".".join([*here, base] if base else here)
        candidates = [f"{base}.{alias.name}" for alias in node.names] + [base]
    for candidate in candidates:
        while candidate and candidate not in known:
            candidate = candidate.rpartition(".")[0]
        if candidate.startswith(PACKAGE + ".") and candidate not in out:
            out.append(candidate)
    # ``from traffic.x import y`` where y is a module: keep the most specific one only.
    return [m for m in out if not any(o != m and o.startswith(m + ".") for o in out)] or out


def graph(root: Path = ROOT) -> tuple[dict[str, set[str]], list[str]]:
    """Module → modules it imports (anywhere in it); and the problems with imports inside functions."""
    known = modules(root)
    edges: dict[str, set[str]] = {name: set() for name in known}
    problems = []
    for name, path in known.items():
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        inside = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inside.update(id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            targets = [t for t in _target(node, name, known) if t != name]
            edges[name].update(targets)
            if targets and id(node) in inside and "# deferred:" not in lines[node.lineno - 1] and \
                    "# deferred:" not in lines[node.end_lineno - 1]:
                problems.append(f"{path.relative_to(root)}:{node.lineno}: imports {', '.join(targets)} inside a "
                                "function without saying why (# deferred: …)")
    return edges, problems


def _subpackage(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 else None


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def layers(edges: dict[str, set[str]]) -> dict[str, int]:
    """Each module's layer: 1 + the highest layer it imports (0 for a module importing none)."""
    memo: dict[str, int] = {}

    def depth(v, trail=()):
        if v in memo:
            return memo[v]
        if v in trail:
            return 0
        memo[v] = 1 + max((depth(w, (*trail, v)) for w in edges[v]), default=-1)
        return memo[v]

    return {v: depth(v) for v in edges}


def problems(root: Path = ROOT) -> list[str]:
    """Every rule broken, one line each (empty when the imports point down)."""
    edges, found = graph(root)
    for group in cycles(edges):
        found.append("import loop: " + " -> ".join(group))
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            a, b = _subpackage(source), _subpackage(target)
            if a in RANKS and b in RANKS and RANKS[b] > RANKS[a]:
                found.append(f"upward import: {source} ({a}) imports {target} ({b})")
            if a in RANKS and b is None and target != PACKAGE:
                found.append(f"{source} imports {target}, which belongs to no subpackage")
    reach, todo = set(), list(EXECUTOR_ENTRIES)
    while todo:
        v = todo.pop()
        if v in reach or v not in edges:
            continue
        reach.add(v)
        todo.extend(edges[v])
    for v in sorted(reach):
        if v != PACKAGE and not any(v == s or v.startswith(s + ".") for s in EXECUTOR_SAFE):
            found.append(f"executor code reaches driver-side module {v}")
    depth = layers(edges)
    if max(depth.values(), default=0) + 1 > MAX_LAYERS:
        found.append(f"{max(depth.values()) + 1} layers of imports (at most {MAX_LAYERS})")
    return found


def main(argv: list[str] | None = None) -> int:
    edges, _ = graph()
    depth = layers(edges)
    for level in range(max(depth.values(), default=0) + 1):
        print(f"layer {level + 1}: " + ", ".join(sorted(m for m, d in depth.items() if d == level)))
    found = problems()
    for line in found:
        print(f"error: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
