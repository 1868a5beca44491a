"""Screenshots from the browser tests: always kept under ``test-output/``; copied into ``docs/img/``
for the README only when asked (``make screenshots``), so a test run never edits the checkout."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "test-output"
DOC_IMAGES = ROOT / "docs" / "img"


def publish_for_docs(shot: Path) -> None:
    """Copy ``shot`` to ``docs/img/`` when ``UPDATE_DOC_IMAGES=1``."""
    if os.environ.get("UPDATE_DOC_IMAGES") == "1":
        DOC_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOC_IMAGES / shot.name)


CHROMIUM = Path("/usr/bin/chromium")


def chromium_screenshot(page: Path, name: str, width: int, height: int) -> bytes:
    """Draw ``page`` with Debian's headless Chromium into ``test-output/<name>``; its PNG bytes.

    Fails (never skips) without Chromium: ``make test`` installs it. The shot is offered to
    ``publish_for_docs`` once drawn.
    """
    import subprocess

    import pytest

    if not CHROMIUM.exists():
        pytest.fail("headless Chromium is not installed: apt-get install -y chromium (make test installs it)")
    OUTPUT.mkdir(exist_ok=True)
    shot, profile = OUTPUT / name, OUTPUT / f"chromium-profile-{Path(name).stem}"
    shot.unlink(missing_ok=True)
    completed = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         f"--user-data-dir={profile}", f"--window-size={width},{height}", f"--screenshot={shot}", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    shutil.rmtree(profile, ignore_errors=True)
    assert shot.exists(), completed.stderr[-2000:]
    publish_for_docs(shot)
    return shot.read_bytes()
