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
* at most ``MAX_LAYERS`` layers of rooms, counted over the imports a module needs to run. A room is a
  module of a subpackage, or a folder that holds one room split by role into files (``traffic/io/flows/``,
  ``traffic/accounting/close/``): a split adds files, not layers; inside a room imports still may not loop.
  An import
  whose names appear only in annotations (the module has ``from __future__ import annotations``, so they
  are never evaluated) still has to point down, but adds no layer — a step that takes a ``Warehouse``
  argument does not sit above the warehouse's door;
* no module in ``traffic`` longer than ``MAX_LINES`` unless ``LONG_FILES`` names it, with the reason;
* a rule that has a home is defined only there (``HOMES``): e.g. the 5-minute pane is
  ``traffic.core.periods.PANE``, and no other module spells it as its own constant.

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
#: Layers of modules, counted over the imports each needs at run time (annotation-only ones do not count).
MAX_LAYERS = 9
#: No module longer than this (lines) unless listed in ``LONG_FILES`` with the reason.
MAX_LINES = 600
LONG_FILES: dict[str, str] = {}
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


def _annotation_only(tree: ast.Module) -> set[int]:
    """The import statements of a module whose every name is used in annotations only (``id`` of each),
    when the module postpones annotations (``from __future__ import annotations``): they are never run."""
    postponed = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and
                    any(a.name == "annotations" for a in n.names) for n in tree.body)
    if not postponed:
        return set()
    in_annotations: set[int] = set()
    for node in ast.walk(tree):
        annotations = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            annotations = [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs,
                                                  args.vararg, args.kwarg) if a is not None] + [node.returns]
        elif isinstance(node, ast.AnnAssign):
            annotations = [node.annotation]
        for annotation in annotations:
            if annotation is not None:
                in_annotations.update(id(n) for n in ast.walk(annotation))
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in in_annotations}
    used |= {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
             and id(n) not in in_annotations}
    annotated = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) in in_annotations}
    only = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (isinstance(node, ast.ImportFrom) and
                                                                   node.module == "__future__"):
            bound = [(a.asname or a.name).split(".")[0] for a in node.names]
            # Used in annotations and nowhere else; a name used nowhere is a re-export (a package's
            # ``__init__``), which runs.
            if bound and not any(name in used for name in bound) and any(name in annotated for name in bound):
                only.add(id(node))
    return only


def graph(root: Path = ROOT, runtime: bool = False) -> tuple[dict[str, set[str]], list[str]]:
    """Module → modules it imports (anywhere in it); and the problems with imports inside functions.
    ``runtime``: only the imports the module needs to run (not those used in annotations only)."""
    known = modules(root)
    edges: dict[str, set[str]] = {name: set() for name in known}
    problems = []
    for name, path in known.items():
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        skipped = _annotation_only(tree) if runtime else set()
        if not runtime and len(lines) > MAX_LINES and name not in LONG_FILES:
            problems.append(f"{path.relative_to(root)}: {len(lines)} lines (at most {MAX_LINES} unless LONG_FILES "
                            "names it, with the reason)")
        inside = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inside.update(id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in skipped:
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


def room(name: str) -> str:
    """The room a module belongs to: ``traffic.<subpackage>.<module or folder>``."""
    return ".".join(name.split(".")[:3])


def rooms(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph seen room to room (imports inside a room left out)."""
    out: dict[str, set[str]] = {}
    for source, targets in edges.items():
        out.setdefault(room(source), set()).update(room(t) for t in targets if room(t) != room(source))
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
    depth = layers(rooms(graph(root, runtime=True)[0]))
    if max(depth.values(), default=0) + 1 > MAX_LAYERS:
        found.append(f"{max(depth.values()) + 1} layers of imports (at most {MAX_LAYERS})")
    found.extend(homeless_rules(root))
    return found


def _pane_literal(node: ast.AST) -> bool:
    """A module-level constant named for the pane and spelled as a number or ``timedelta(...)`` of numbers."""
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
        return False
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    if not any(isinstance(t, ast.Name) and "PANE" in t.id.upper() for t in targets):
        return False
    return all(isinstance(n, (ast.Constant, ast.Call, ast.keyword, ast.BinOp, ast.operator, ast.UnaryOp,
                              ast.unaryop, ast.Load)) or (isinstance(n, ast.Name) and n.id == "timedelta")
               for n in ast.walk(node.value))


def _defines(*names: str):
    def found(node: ast.AST) -> bool:
        return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names
    return found


#: Rules with one home: (what the rule is, its home module, the modules it governs, what a copy looks like).
HOMES = [
    ("the 5-minute pane", "traffic.core.periods", "traffic", _pane_literal),
    ("a time in UTC", "traffic.core.periods", "traffic", _defines("_utc", "utc", "as_utc", "_as_utc", "to_utc")),
    ("the watermark's rule", "traffic.orchestration.conditions", "traffic", _defines("watermark_passed")),
    ("byte gathering and hex excerpts", "traffic.io.bytes", "traffic.io",
     _defines("_gather", "gather", "_hex", "hex_excerpt", "_hex_excerpts", "hex_excerpts")),
]


def homeless_rules(root: Path = ROOT) -> list[str]:
    """One line for each copy of a rule outside its home."""
    found = []
    for name, path in modules(root).items():
        tree = None
        for rule, home, scope, copy in HOMES:
            if name == home or not (name == scope or name.startswith(scope + ".")):
                continue
            tree = tree or ast.parse(path.read_text())
            for node in ast.walk(tree):
                if copy(node) and (not isinstance(node, (ast.Assign, ast.AnnAssign)) or node in tree.body):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: defines {rule} again (its home is {home})")
    return found


def main(argv: list[str] | None = None) -> int:
    edges = rooms(graph(runtime=True)[0])
    depth = layers(edges)
    for level in range(max(depth.values(), default=0) + 1):
        print(f"layer {level + 1}: " + ", ".join(sorted(m for m, d in depth.items() if d == level)))
    found = problems()
    for line in found:
        print(f"error: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
