"""The shape every input reader produces: one Arrow row per input record, already judged.

Readers (text formats, captures) turn raw bytes into rows of ``PARSED_SCHEMA``. A row is a
``packet``, a ``tick`` (a time and a source only) or a ``reject`` (with a ``reason`` a
person can read and the raw ``record`` or a hex excerpt). Time rules (lateness, sanity
bounds) are applied later, by the pipeline, not by readers.
"""

from __future__ import annotations

import pyarrow as pa

PACKET = "packet"
TICK = "tick"
REJECT = "reject"

#: Largest IP packet each family can carry: IPv4 total length is 16 bits; an IPv6
#: jumbogram carries up to 2**32 - 1 payload bytes after its 40-byte header.
MAX_BYTES_V4 = 65_535
MAX_BYTES_V6 = 4_294_967_295 + 40

#: Longest raw text kept for a rejected record (the rest is cut with an ellipsis).
MAX_RECORD_CHARS = 512

PARSED_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
        pa.field("source", pa.string()),
        pa.field("local_ip", pa.string()),
        pa.field("remote_ip", pa.string()),
        pa.field("local_port", pa.int32()),
        pa.field("remote_port", pa.int32()),
        pa.field("protocol", pa.int32()),
        pa.field("bytes", pa.int64()),
        pa.field("direction", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("record", pa.string()),
        pa.field("input_file", pa.string()),
    ]
)


def empty_parsed() -> pa.Table:
    """An empty table of ``PARSED_SCHEMA``."""
    return PARSED_SCHEMA.empty_table()


def clip_record(text: str) -> str:
    """Keep a rejected record short enough to store and read."""
    return text if len(text) <= MAX_RECORD_CHARS else text[: MAX_RECORD_CHARS - 1] + "…"
