"""Screenshots from the browser tests: always kept under ``test-output/``; copied into ``docs/img/``
for the README only when asked (``make screenshots``), so a test run never edits the checkout."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "test-output"
DOC_IMAGES = ROOT / "docs" / "img"


def publish_for_docs(shot: Path) -> None:
    """Copy ``shot`` to ``docs/img/`` when ``UPDATE_DOC_IMAGES=1``."""
    if os.environ.get("UPDATE_DOC_IMAGES") == "1":
        DOC_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOC_IMAGES / shot.name)
