"""The command line is declared once: the parser, ``traffic --help`` and the dispatch all come from ``COMMANDS``."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys

from traffic.app import cli

#: The commands ``traffic`` has, in the order ``traffic --help`` lists them.
EXPECTED = ["ingest", "close", "run", "status", "show", "replay", "top", "report", "metrics", "accept", "bill",
            "export", "alerts", "spark", "demo", "collect"]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_the_parser_has_every_command_of_the_table_in_its_order():
    assert list(cli.COMMANDS) == EXPECTED, list(cli.COMMANDS)
    assert list(_subparsers(cli.build_parser())) == EXPECTED


def test_each_command_takes_the_common_options_and_exactly_its_declared_arguments():
    parsers = _subparsers(cli.build_parser())
    for command in cli.COMMANDS.values():
        declared = {"-h", "--help"} | {flag for flags, _ in (*cli.COMMON, *command.arguments) for flag in flags}
        found = {flag for action in parsers[command.name]._actions for flag in (action.option_strings or [action.dest])}
        assert found == declared, (command.name, sorted(found ^ declared))


def test_traffic_help_lists_every_command_with_its_help():
    result = subprocess.run([sys.executable, "-m", "traffic.app.cli", "--help"], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert result.returncode == 0, result.stderr
    listed = {line.split(None, 1)[0]: line.split(None, 1)[1] for line in result.stdout.splitlines()
              if line.startswith("    ") and len(line.split(None, 1)) == 2}
    assert list(listed) == EXPECTED, result.stdout
    for command in cli.COMMANDS.values():
        assert listed[command.name] == command.help, (command.name, listed[command.name])


def test_main_runs_the_function_of_the_table_and_returns_its_exit_code(monkeypatch, tmp_path):
    seen = []

    def fake_status(args, settings, spark):
        seen.append((args.command, args.json, settings.warehouse))
        return 7

    monkeypatch.setitem(cli.COMMANDS, "status", dataclasses.replace(cli.COMMANDS["status"], run=fake_status))
    assert cli.main(["status", "--json", "--warehouse", str(tmp_path / "w")]) == 7
    assert seen == [("status", True, tmp_path / "w")]
