"""The shape every input reader produces: one Arrow row per input record, already judged.

Readers (text formats, captures) turn raw bytes into rows of ``PARSED_SCHEMA``. A row is a
``packet``, a ``tick`` (a time and a source only) or a ``reject`` (with a ``reason`` a
person can read and the raw ``record`` or a hex excerpt). Time rules (lateness, sanity
bounds) are applied later, by the pipeline, not by readers.

It is also the one definition of a valid packet row (DESIGN §6): the directions, the canonical
address form and the byte bounds below are what every reader produces and what the suites
(``expectations/*.json``, which name them as ``{"$records": NAME}``) check, so the two cannot
drift apart; ``packet_problem`` applies them to one row.
"""

from __future__ import annotations

import ipaddress
import re

import pyarrow as pa

PACKET = "packet"
TICK = "tick"
REJECT = "reject"

#: Largest IP packet each family can carry: IPv4 total length is 16 bits; an IPv6
#: jumbogram carries up to 2**32 - 1 payload bytes after its 40-byte header.
MAX_BYTES_V4 = 65_535
MAX_BYTES_V6 = 4_294_967_295 + 40
#: Largest IPv4 row a capture may hold: a GSO/BIG TCP super-packet seen on the sending host before
#: the NIC splits it (Linux caps it at GSO_MAX_SIZE = 8 × 65,535). Text inputs keep ``MAX_BYTES_V4``.
MAX_BYTES_V4_GSO = 8 * 65_535

#: Stored directions; null is unknown (the router feed, and a capture's neither-local packets kept
#: with ``keep_transit``). Nothing else may reach ``packets``: its suite fails the hour on any other.
DIRECTIONS = ("in", "out", "internal")

_V4 = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(?:\.(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}"
_HEXTET = r"(?:0|[1-9a-f][0-9a-f]{0,3})"
_V6 = (rf"(?:{_HEXTET}:){{7}}{_HEXTET}"
       rf"|(?:(?:{_HEXTET}:){{0,6}}{_HEXTET})?::(?:(?:{_HEXTET}:){{0,6}}{_HEXTET})?")
#: A canonical IPv4 address: dotted quad without leading zeros.
CANONICAL_IPV4_REGEX = f"^{_V4}$"
#: The stored address form the suites check: dotted quad, or compressed lower-case IPv6 (RFC 5952)
#: without a zone id. (IPv4-mapped IPv6 never matches it in dotted form and is stored as IPv4.)
CANONICAL_IP_REGEX = f"^(?:{_V4}|{_V6})$"
_CANONICAL_IP = re.compile(CANONICAL_IP_REGEX)

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
        # How many packets the row stands for and the sampling rate already applied to it (DESIGN
        # §7a); null is 1, what every reader of packet headers leaves.
        pa.field("packets", pa.int64()),
        pa.field("sampling_rate", pa.int32()),
    ]
)


def empty_parsed() -> pa.Table:
    """An empty table of ``PARSED_SCHEMA``."""
    return PARSED_SCHEMA.empty_table()


def clip_record(text: str) -> str:
    """Keep a rejected record short enough to store and read."""
    return text if len(text) <= MAX_RECORD_CHARS else text[: MAX_RECORD_CHARS - 1] + "…"


#: Longest reason stored with a reject, and longest piece of a record a reason quotes.
MAX_REASON_CHARS = 512
MAX_QUOTED_CHARS = 64
#: Longest source name (an inbox folder, or a record's ``source`` column).
MAX_SOURCE_CHARS = 128
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: The same, for Arrow's regex engine (RE2).
CONTROL_CHARS_REGEX = r"[\x00-\x1f\x7f-\x9f]"


def clip_value(text: str) -> str:
    """A value as a reason quotes it: at most ``MAX_QUOTED_CHARS`` characters."""
    return text if len(text) <= MAX_QUOTED_CHARS else text[: MAX_QUOTED_CHARS - 1] + "…"


def source_problem(name: str) -> str | None:
    """Why ``name`` cannot be a source (too long, or with control characters), or None."""
    if len(name) > MAX_SOURCE_CHARS:
        return f"name is longer than a source name may be ({len(name):,} > {MAX_SOURCE_CHARS} characters)"
    if _CONTROL.search(name):
        return "name has control characters, which a source name may not have"
    return None


def canonical_ip(text: str) -> str:
    """The stored form of an address; a ``ValueError`` says why a text is none (for a reject reason).

    A zone id (``fe80::1%eth0``) names an interface of one host, not an address, and Python's
    ``ipaddress`` accepts any text after ``%``: it is refused. An IPv4-mapped IPv6 address
    (``::ffff:10.0.0.5``) is the IPv4 host it maps, so it is stored, bounded and billed as IPv4.
    """
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise ValueError("is not an IPv4 or IPv6 address") from None
    if address.version == 6:
        if address.scope_id is not None:
            raise ValueError("has a zone id (the part after %): an address is accounted without one")
        if address.ipv4_mapped is not None:
            address = address.ipv4_mapped
    canonical = str(address)
    if not _CANONICAL_IP.match(canonical):  # a Python whose text form the suites would refuse
        raise ValueError(f"has no canonical text form (Python prints {canonical!r})")
    return canonical


def packet_problem(row: dict) -> str | None:
    """Why a ``packets`` row breaks the contract (the suites' critical checks, DESIGN §6), or None.

    Pipeline columns (``hour``, ``batch_id``) are not a reader's: they are checked by the suites only.
    """
    for name in ("ts", "source", "local_ip", "remote_ip", "bytes"):
        if row.get(name) is None:
            return f"{name} is missing"
    for name in ("local_ip", "remote_ip"):
        value = row[name]
        try:
            stored = canonical_ip(value)
        except ValueError as error:
            return f"{name} {value!r} {error}"
        if stored != value:
            return f"{name} {value!r} is not in canonical form ({stored!r})"
    v6 = ":" in row["local_ip"]
    if v6 != (":" in row["remote_ip"]):
        return "local_ip and remote_ip are of different families"
    for name, top in (("local_port", 65_535), ("remote_port", 65_535), ("protocol", 255)):
        if row.get(name) is not None and not 0 <= row[name] <= top:
            return f"{name} {row[name]} is not in 0-{top}"
    limit = MAX_BYTES_V6 if v6 else MAX_BYTES_V4_GSO
    if not 0 <= row["bytes"] <= limit:
        return f"bytes {row['bytes']} is not in 0-{limit}"
    if row.get("direction") is not None and row["direction"] not in DIRECTIONS:
        return f"direction {row['direction']!r} is not one of {', '.join(DIRECTIONS)} or unknown (null)"
    return None
