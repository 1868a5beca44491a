"""A user mistake prints one clear line and exits 2 — never a traceback or a JVM stack trace."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _traffic(*args, env=None):
    return subprocess.run([sys.executable, "-m", "traffic.app.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("case", ["missing inbox", "bad setting", "no warehouse", "warehouse is a file"])
def test_user_mistakes_are_one_line_and_exit_2(case, tmp_path):
    afile = tmp_path / "file"
    afile.write_text("x")
    args, env, expect = {
        "missing inbox": (["ingest", "--warehouse", str(tmp_path / "w"), "--inbox", str(tmp_path / "nope")], None,
                          "inbox"),
        "bad setting": (["status", "--warehouse", str(tmp_path)], {"TRAFFIC_KEEP_HOURS": "many"}, "keep_hours"),
        "no warehouse": (["status", "--warehouse", str(tmp_path / "none")], None, "no warehouse"),
        "warehouse is a file": (["ingest", "--warehouse", str(afile), "--inbox", str(tmp_path)], None,
                                "cannot be used"),
    }[case]
    result = _traffic(*args, env=env)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and expect in lines[0], result.stderr
    assert "Traceback" not in result.stderr and "java" not in result.stderr.lower()


def test_every_subcommand_has_help():
    from traffic.app.cli import COMMANDS

    for command in COMMANDS:
        result = _traffic(command, "--help")
        assert result.returncode == 0 and "usage: traffic " + command in result.stdout


def test_an_unexpected_error_without_a_message_names_where_it_was_raised(capsys):
    """A library's bare ``assert`` has no message: the one line names the innermost frames instead, which
    is how a Connect session's missing mode flag was found in the compose stack's logs."""
    from argparse import Namespace

    from traffic.app.exits import EXIT_BUG, unexpected

    def inner():
        raise AssertionError  # what a bare assert raises outside pytest (which rewrites asserts)

    try:
        inner()
    except AssertionError as error:
        assert unexpected(Namespace(command="close", debug=False), error) == EXIT_BUG
    line = capsys.readouterr().err.strip()
    assert line.startswith("traffic close: failed: AssertionError: AssertionError at test_cli_errors.py:")
    assert " inner <- test_cli_errors.py:" in line and line.count("\n") == 0
