"""What a test needs from the machine, checked where it is used: missing is a failure with its reason.

``make test`` (``scripts/test.sh``) installs the tools the tests run (tshark, the flow tools) and
the project is checked out beside ``../shared`` (the captures and the flow-export corpus). A test
that skipped when either is missing would turn a run that checked nothing green; so a missing tool
or folder fails the test that needs it, with one line saying what is missing and where it comes
from. Tests that need neither keep running beside them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def need_folder(path: Path) -> Path:
    """``path``, which must be a folder (a ``../shared`` one: it sits beside the checkout, never in it)."""
    if not Path(path).is_dir():
        pytest.fail(f"{path} does not exist: the tests need ../shared beside the checkout", pytrace=False)
    return Path(path)


def need_tool(name: str) -> str:
    """The path of the program ``name``, which must be installed (``scripts/test.sh`` installs it)."""
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: scripts/test.sh (make test) installs it with apt-get", pytrace=False)
    return found


def folder_fixture(path: Path, name: str):
    """A fixture called ``name`` that fails each test using it when ``path`` is missing (``need_folder``).

    Assign it to a module global of the same name; ``pytest.mark.usefixtures(name)`` then stands where a
    ``skipif`` on the folder stood. (Session-scoped: it is checked before any module fixture that reads the folder.)
    """
    return pytest.fixture(name=name, scope="session")(lambda: need_folder(path))


def tool_fixture(tool: str, name: str):
    """A fixture called ``name`` that fails each test using it when ``tool`` is not installed (``need_tool``)."""
    return pytest.fixture(name=name, scope="session")(lambda: need_tool(tool))
