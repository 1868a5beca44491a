"""Text from outside (file and source names, reasons, accounts) made safe to show on a terminal.

A name or a reason can hold any character, and an escape sequence printed raw is a command to the
terminal (move the cursor, rewrite a line, set the title). Shown text keeps every printable
character and writes every other one as its escape: ``\\x1b``, ``\\r``, ``\\u202e``; a byte that
was not UTF-8 in a file name (decoded by Python as a lone surrogate) as ``\\xNN``.
"""

from __future__ import annotations

from typing import Any


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's stand-in for an undecodable byte
        return f"\\x{code - 0xDC00:02x}"
    return char.encode("unicode_escape").decode("ascii")


def printable(value: Any) -> str:
    """``value`` as one line a terminal shows as text: every non-printable character escaped."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)


def printable_lines(text: str) -> str:
    """Several lines (a table): each made ``printable``, the line breaks between them kept."""
    return "\n".join(printable(line) for line in str(text).split("\n"))


def human_bytes(value: int | None) -> str:
    """A byte count in SI units (``1.50 kB``), as every page and command shows it."""
    size = float(value or 0)
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(size) < 1000 or unit == "PB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.2f} {unit}"
        size /= 1000
    return str(value)
