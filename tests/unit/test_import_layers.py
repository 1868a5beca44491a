"""Imports point down (issue 21): no loops, no upward imports, reasons for deferred imports, few layers;
no file past its size, no rule defined outside its home (issue 37)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _checker():
    spec = importlib.util.spec_from_file_location("check_imports", ROOT / "scripts" / "check_imports.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_imports"] = module
    spec.loader.exec_module(module)
    return module


def test_the_package_imports_point_down():
    checker = _checker()
    assert checker.problems() == []
    edges, _ = checker.graph(runtime=True)
    assert max(checker.layers(checker.rooms(edges)).values()) + 1 <= checker.MAX_LAYERS <= 9


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in {"traffic/__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_check_finds_a_loop_an_upward_import_and_an_unexplained_deferred_import(tmp_path):
    checker = _checker()
    root = _tree(tmp_path, {
        "traffic/core/__init__.py": "", "traffic/app/__init__.py": "", "traffic/accounting/__init__.py": "",
        "traffic/core/a.py": "from traffic.core import b\n",
        "traffic/core/b.py": "from traffic.core import a\n",
        "traffic/core/c.py": "from traffic.app import cli\n",
        "traffic/app/cli.py": "def main():\n    from traffic.core import b\n",
        "traffic/accounting/batch_tasks.py": "from traffic.app import cli\n",
    })
    found = checker.problems(root)
    assert any(line.startswith("import loop: traffic.core.a -> traffic.core.b") for line in found), found
    assert "upward import: traffic.core.c (core) imports traffic.app.cli (app)" in found
    assert any("traffic/app/cli.py:2: imports traffic.core.b inside a function" in line for line in found), found
    assert "executor code reaches driver-side module traffic.app.cli" in found


def test_an_import_used_only_in_annotations_adds_no_layer_but_must_still_point_down(tmp_path):
    checker = _checker()
    root = _tree(tmp_path, {
        "traffic/core/__init__.py": "", "traffic/app/__init__.py": "",
        "traffic/core/a.py": "X = 1\n",
        "traffic/core/b.py": "from traffic.core.a import X\nY = X\n",
        "traffic/core/c.py": "from __future__ import annotations\nfrom traffic.core.b import Y\n\n"
                             "def f(y: Y) -> Y:\n    return y\n",
        "traffic/core/d.py": "from traffic.core.b import Y\n\ndef f(y: Y) -> Y:\n    return y\n",
        "traffic/core/e.py": "from __future__ import annotations\nfrom traffic.app.cli import Z\n\ndef f(z: Z):\n    pass\n",
        "traffic/app/cli.py": "Z = 1\n",
    })
    depth = checker.layers(checker.graph(root, runtime=True)[0])
    assert depth["traffic.core.c"] == 0  # annotations only, postponed: never evaluated
    assert depth["traffic.core.d"] == depth["traffic.core.b"] + 1  # evaluated at definition: counts
    assert "upward import: traffic.core.e (core) imports traffic.app.cli (app)" in checker.problems(root)


def test_a_long_file_and_a_rule_outside_its_home_are_named(tmp_path):
    checker = _checker()
    root = _tree(tmp_path, {
        "traffic/core/__init__.py": "", "traffic/io/__init__.py": "",
        "traffic/core/periods.py": "from datetime import timedelta\nPANE = timedelta(minutes=5)\n",
        "traffic/core/long.py": "X = 1\n" * (checker.MAX_LINES + 1),
        "traffic/core/panes.py": "from datetime import timedelta\n_PANE = timedelta(minutes=5)\nPANE_US = 300_000_000\n",
        "traffic/core/derived.py": "from traffic.core.periods import PANE\nPANE_US = int(PANE.total_seconds()) * 10**6\n",
        "traffic/core/times.py": "def _utc(value):\n    return value\n",
        "traffic/io/parse.py": "def _gather(buf, pos, width):\n    return buf\n",
    })
    found = checker.problems(root)
    assert f"traffic/core/long.py: {checker.MAX_LINES + 1} lines (at most {checker.MAX_LINES} unless LONG_FILES " \
           "names it, with the reason)" in found
    assert "traffic/core/panes.py:2: defines the 5-minute pane again (its home is traffic.core.periods)" in found
    assert "traffic/core/panes.py:3: defines the 5-minute pane again (its home is traffic.core.periods)" in found
    assert not any("derived.py" in line for line in found), found  # derived from the home: fine
    assert "traffic/core/times.py:1: defines a time in UTC again (its home is traffic.core.periods)" in found
    assert "traffic/io/parse.py:1: defines byte gathering and hex excerpts again (its home is traffic.io.bytes)" in found


def test_a_room_split_into_files_counts_as_one_layer_and_its_files_may_not_loop(tmp_path):
    checker = _checker()
    root = _tree(tmp_path, {
        "traffic/io/__init__.py": "", "traffic/io/flows/__init__.py": "from traffic.io.flows.decoder import D\n",
        "traffic/io/flows/decoder.py": "from traffic.io.flows.sflow import S\nD = S\n",
        "traffic/io/flows/sflow.py": "S = 1\n",
        "traffic/io/telemetry.py": "from traffic.io.flows import D\n",
        "traffic/io/capture/__init__.py": "", "traffic/io/capture/a.py": "from traffic.io.capture.b import B\nA = 1\n",
        "traffic/io/capture/b.py": "from traffic.io.capture.a import A\nB = 1\n",
    })
    depth = checker.layers(checker.rooms(checker.graph(root, runtime=True)[0]))
    assert depth["traffic.io.flows"] == 0 and depth["traffic.io.telemetry"] == 1
    assert any(line.startswith("import loop: traffic.io.capture.a -> traffic.io.capture.b")
               for line in checker.problems(root))
