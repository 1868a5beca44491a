"""Imports point down (issue 21): no loops, no upward imports, reasons for deferred imports, few layers."""

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
    edges, _ = checker.graph()
    assert max(checker.layers(edges).values()) + 1 <= checker.MAX_LAYERS


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
