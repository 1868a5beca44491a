"""What a person meets at the terminal: a reader that goes away, a warehouse they may not write,
and names with control characters. Real ``traffic`` processes, no Spark (an empty inbox's ingest
creates the warehouse without a JVM on the suite's engine)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.environ import without_traffic_settings
from traffic.core.text import printable, printable_lines

TRAFFIC = str(Path(sys.executable).with_name("traffic"))


def _run(*args, stdout=subprocess.PIPE, prefix=()):
    return subprocess.run([*prefix, TRAFFIC, *args], stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120,
                          env=without_traffic_settings())


@pytest.fixture()
def warehouse(tmp_path):
    where = ["--warehouse", str(tmp_path / "w"), "--inbox", str(tmp_path / "inbox")]
    (tmp_path / "inbox").mkdir()
    created = _run("ingest", *where)
    assert created.returncode == 0 and "nothing new" in created.stdout, created.stderr
    return where


def test_a_reader_that_goes_away_ends_the_command_quietly_with_141(warehouse):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte (what `| head` does, made certain)
    try:
        result = _run("status", *warehouse, stdout=write_end)
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (141, ""), result.stderr


def test_status_piped_to_head_prints_its_first_line_and_no_error(warehouse):
    shell = f"set -o pipefail; {TRAFFIC} status {' '.join(warehouse)} | head -1"
    result = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120,
                            env=without_traffic_settings())
    assert result.stdout.startswith("warehouse ") and result.stdout.count("\n") == 1, result.stdout
    assert result.stderr == "" and result.returncode in (0, 141), (result.returncode, result.stderr)


def _without_file_permission_override():
    """As root, permissions do not apply (CAP_DAC_OVERRIDE): the command runs without that capability."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to run a command as root without CAP_DAC_OVERRIDE"
    drop = "-dac_override,-dac_read_search"
    return (setpriv, f"--inh-caps={drop}", f"--bounding-set={drop}", "--")


@pytest.mark.parametrize("command", [["ingest"], ["close"], ["report"]])
def test_a_read_only_warehouse_is_a_one_line_user_error(warehouse, tmp_path, command):
    root = tmp_path / "w"
    paths = [root, *root.rglob("*")]
    for path in paths:
        path.chmod(path.stat().st_mode & ~0o222)
    try:
        result = _run(*command, *warehouse, prefix=_without_file_permission_override())
    finally:
        for path in paths:
            path.chmod(path.stat().st_mode | 0o200)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"traffic {command[0]}: error: {root}"), lines
    assert "Permission denied" in lines[0] and "Traceback" not in result.stderr


def test_control_characters_in_a_printed_name_are_escaped(tmp_path):
    hostile = tmp_path / "w\x1b]0;owned\x07\x1b[2J\r"
    result = _run("status", "--warehouse", str(hostile))
    assert result.returncode == 2
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr and "\r" not in result.stderr
    assert "w\\x1b]0;owned\\x07\\x1b[2J\\r" in result.stderr, result.stderr


@pytest.mark.parametrize("raw, shown", [
    ("edge-a", "edge-a"),
    ("caf\u00e9 \u6771\u4eac", "caf\u00e9 \u6771\u4eac"),  # printable text stays as it is
    ("a\x1b[31mred", "a\\x1b[31mred"),
    ("tab\there\nnewline\rcr", "tab\\there\\nnewline\\rcr"),
    ("bell\x07 del\x7f c1\x9b", "bell\\x07 del\\x7f c1\\x9b"),
    ("rtl\u202eexe.csv", "rtl\\u202eexe.csv"),
    ("line\u2028sep", "line\\u2028sep"),
    (os.fsdecode(b"bad\xffbyte"), "bad\\xffbyte"),
])
def test_printable_escapes_exactly_the_characters_a_terminal_would_act_on(raw, shown):
    assert printable(raw) == shown
    assert printable(shown) == shown  # escaping is stable: shown text is printable as it is


def test_printable_lines_keeps_a_table_s_line_breaks():
    assert printable_lines("a  b\n\x1b[2J  c\n") == "a  b\n\\x1b[2J  c\n"
