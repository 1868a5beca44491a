"""A file name and a record with terminal escape sequences, ingested for real (Spark), then shown:
`traffic show rejects` prints them escaped, never raw (the raw bytes would clear the screen and
retitle the terminal of whoever looks at the rejects)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.environ import without_traffic_settings

TRAFFIC = str(Path(sys.executable).with_name("traffic"))


def _traffic(*args):
    return subprocess.run([TRAFFIC, *args], capture_output=True, text=True, timeout=300, env=without_traffic_settings())


def test_show_rejects_escapes_a_hostile_file_name_and_record(tmp_path):
    (tmp_path / "inbox" / "r1").mkdir(parents=True)
    (tmp_path / "inbox" / "r1" / "bad\x1b[2J.csv").write_bytes(b"new,OP_INSERT,zz\x1b]0;owned\x07,1,2\n")
    where = ["--warehouse", str(tmp_path / "w"), "--inbox", str(tmp_path / "inbox")]
    ingested = _traffic("ingest", *where)
    assert ingested.returncode == 0 and "1 rejected" in ingested.stdout, ingested.stdout + ingested.stderr
    shown = _traffic("show", "rejects", *where)
    assert shown.returncode == 0, shown.stderr
    assert not any(c in shown.stdout for c in "\x1b\x07\r"), repr(shown.stdout)
    assert "r1/bad\\x1b[2J.csv" in shown.stdout and "zz\\x1b]0;owned\\x07,1,2" in shown.stdout, shown.stdout
