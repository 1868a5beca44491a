"""Judging text records column-wise: packet, tick or reject, and the first reason a record fails.

Shared by every text reader (router feed, CSV with a header, JSON lines): one set of checks with
Arrow compute kernels, only distinct non-canonical addresses touching Python, and the reject rows
whose reason says why (DESIGN §7).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from traffic.core.records import (
    CANONICAL_IPV4_REGEX,
    DIRECTIONS,
    MAX_BYTES_V4,
    MAX_BYTES_V6,
    MAX_QUOTED_CHARS,
    MAX_RECORD_CHARS,
    MAX_SOURCE_CHARS,
    CONTROL_CHARS_REGEX,
    PARSED_SCHEMA,
    canonical_ip,
    clip_record,
)

PACKET_FIELDS = ("ts", "local_ip", "remote_ip", "local_port", "remote_port", "protocol", "bytes", "direction")
_MAX_TS_US = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z
#: A text line longer than this is rejected whole (a packet record needs a few hundred bytes).
MAX_LINE_BYTES = 64 * 1024
#: A text record may name only a stored direction (or none: unknown); ``transit`` is no longer one.
_DIRECTIONS = pa.array(DIRECTIONS, pa.string())


def too_long(size: int) -> str:
    """Why a line of ``size`` bytes is rejected whole."""
    return f"line of {size:,} bytes is longer than a record may be ({MAX_LINE_BYTES:,})"


def split_long_lines(lines: list[bytes]) -> tuple[list[bytes], list[str], list[str]]:
    """Lines short enough to be records, then the others as rejects (an excerpt, and why)."""
    keep, rejected, reasons = [], [], []
    for line in lines:
        if len(line) <= MAX_LINE_BYTES:
            keep.append(line)
            continue
        rejected.append(line[:MAX_RECORD_CHARS].decode("utf-8", "replace"))
        reasons.append(too_long(len(line)))
    return keep, rejected, reasons


def reject_rows(records: list[str], reason: str | list[str], source: str, input_file: str) -> pa.Table:
    """Reject rows of one input file: each record's text (clipped) and why it was refused."""
    n = len(records)
    if not n:
        return PARSED_SCHEMA.empty_table()
    reasons = reason if isinstance(reason, list) else [reason] * n
    table = pa.table(
        {
            "kind": pa.array(["reject"] * n, pa.string()),
            "source": pa.array([source] * n, pa.string()),
            "reason": pa.array(reasons, pa.string()),
            "record": pa.array([clip_record(r) for r in records], pa.string()),
            "input_file": pa.array([input_file] * n, pa.string()),
        }
    )
    return conform(table)


def conform(table: pa.Table) -> pa.Table:
    """``table`` in ``PARSED_SCHEMA``: its columns cast, the missing ones null."""
    arrays = [
        table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
        for f in PARSED_SCHEMA
    ]
    return pa.Table.from_arrays(arrays, schema=PARSED_SCHEMA)


def judge_fields(fields: dict[str, pa.Array], raw, *, source: str, input_file: str,
          prior_reason: pa.Array | None = None, record_source: pa.Array | None = None,
          require_ports: bool = False, blank_is_tick: bool = True) -> pa.Table:
    """Validate text columns into packets, ticks and rejects (first failing check names the reason).

    ``raw`` is the record text per row, or a function of row indices that builds it: it is only
    needed for rejected rows, as are the reasons, so a clean file never builds either.
    """
    n = len(fields["ts"])
    if n == 0:
        return PARSED_SCHEMA.empty_table()
    null_str = pa.scalar(None, pa.string())
    col = {k: (v.combine_chunks() if isinstance(v, pa.ChunkedArray) else v) for k, v in fields.items()}
    col = {k: pc.fill_null(v, "") for k, v in col.items()}
    blank = {k: pc.equal(pc.binary_length(v), 0) for k, v in col.items()}
    is_tick = pc.and_kleene(pc.invert(blank["ts"]), _all([blank[k] for k in PACKET_FIELDS if k != "ts"]))
    if not blank_is_tick:  # router-feed: only a 3-field line is a tick; empty packet fields are an error
        is_tick = pa.repeat(pa.scalar(False), n)

    ts_ok = _digits(col["ts"], 19)
    ts_num = _to_int(col["ts"], ts_ok)
    ts_ok = pc.and_kleene(ts_ok, pc.less_equal(ts_num, _MAX_TS_US))

    local, local_ok, local_v6, local_why = canonical_ips(col["local_ip"])
    remote, remote_ok, remote_v6, remote_why = canonical_ips(col["remote_ip"])
    v6 = pc.fill_null(local_v6, False)
    ports = {}
    port_ok = {}
    for name in ("local_port", "remote_port"):
        ok = _digits(col[name], 5)
        num = _to_int(col[name], ok)
        ok = pc.and_kleene(ok, pc.less_equal(num, 65535))
        if not require_ports:
            ok = pc.or_kleene(ok, blank[name])
        ports[name] = pc.if_else(ok, num, None).cast(pa.int32())
        port_ok[name] = ok
    proto_ok = _digits(col["protocol"], 3)
    proto = _to_int(col["protocol"], proto_ok)
    proto_ok = pc.or_kleene(pc.and_kleene(proto_ok, pc.less_equal(proto, 255)), blank["protocol"])
    size_ok = _digits(col["bytes"], 10)
    size = _to_int(col["bytes"], size_ok)
    limit = pc.if_else(v6, MAX_BYTES_V6, MAX_BYTES_V4)
    size_in_range = pc.less_equal(size, limit)
    negative = pc.starts_with(col["bytes"], "-")
    if pc.any(negative).as_py():
        negative = pc.and_kleene(negative, pc.ascii_is_decimal(pc.utf8_slice_codeunits(col["bytes"], 1)))
    direction = col["direction"]
    dir_ok = pc.or_kleene(blank["direction"], pc.is_in(direction, _DIRECTIONS))

    def quoted(before: str, name: str, after: str):
        return lambda pick: pc.binary_join_element_wise(before, shown(pick(col[name])), after, "")

    # A record's own source (JSON/CSV ``source``) must be a usable name; ticks carry one too.
    source_ok = pa.repeat(pa.scalar(True), n)
    if record_source is not None:
        named = pc.fill_null(record_source, "")
        source_ok = pc.invert(pc.or_kleene(pc.greater(pc.utf8_length(named), MAX_SOURCE_CHARS),
                                           pc.match_substring_regex(named, CONTROL_CHARS_REGEX)))

    # (passes?, reason where it does not) in order; a reason is built only for the rows that fail.
    checks = [
        (ts_ok, quoted("time '", "ts", "' is not microseconds since 1970 (or ISO-8601)")),
        (source_ok, lambda pick: f"source name is longer than {MAX_SOURCE_CHARS} characters or has control characters"),
        (local_ok, lambda pick: pc.binary_join_element_wise(
            "local_ip '", shown(pick(col["local_ip"])), "' ", pick(local_why), "")),
        (remote_ok, lambda pick: pc.binary_join_element_wise(
            "remote_ip '", shown(pick(col["remote_ip"])), "' ", pick(remote_why), "")),
        (pc.equal(local_v6, remote_v6), lambda pick: "local_ip and remote_ip are of different families (IPv4 and IPv6)"),
        (port_ok["local_port"], quoted("local_port '", "local_port", "' is not a port 0-65535")),
        (port_ok["remote_port"], quoted("remote_port '", "remote_port", "' is not a port 0-65535")),
        (proto_ok, quoted("protocol '", "protocol", "' is not a protocol number 0-255")),
        (pc.invert(negative), quoted("byte count ", "bytes", " is negative")),
        (size_ok, quoted("byte count '", "bytes", "' is not a whole number")),
        (size_in_range, lambda pick: pc.binary_join_element_wise(
            "byte count ", pick(col["bytes"]), pc.if_else(pick(v6), " is more than an IPv6 packet can carry (4294967335)",
                                                          " is more than an IPv4 packet can carry (65535)"), "")),
        (dir_ok, quoted("direction '", "direction", f"' is not {'/'.join(DIRECTIONS)} (or empty: unknown)")),
    ]
    # Ticks only need a good time and source; packets need everything.
    reason = _first_reason(checks, is_tick, n, prior_reason)
    rejected = _flat(pc.is_valid(reason))
    any_rejected = pc.any(rejected).as_py()

    kind = pc.if_else(rejected, "reject", pc.if_else(is_tick, "tick", "packet"))
    packet = pc.equal(kind, "packet")
    accepted = pc.invert(rejected)
    src = pa.repeat(pa.scalar(source, pa.string()), n)
    if record_source is not None:
        src = pc.if_else(pc.greater(pc.utf8_length(record_source), 0), record_source, src)
    micros = pc.if_else(accepted, ts_num, None) if any_rejected else ts_num
    record = pa.nulls(n, pa.string())
    if any_rejected:
        rows = pc.indices_nonzero(rejected)
        text = raw(rows) if callable(raw) else pc.take(raw, rows)
        record = pc.replace_with_mask(record, rejected, _flat(pc.utf8_slice_codeunits(text, 0, 512)))
    table = pa.table(
        {
            "kind": kind,
            "ts": micros.cast(pa.timestamp("us", tz="UTC")),
            "source": src,
            "local_ip": pc.if_else(packet, local, null_str),
            "remote_ip": pc.if_else(packet, remote, null_str),
            "local_port": pc.if_else(packet, ports["local_port"], None),
            "remote_port": pc.if_else(packet, ports["remote_port"], None),
            "protocol": pc.if_else(pc.and_kleene(packet, pc.invert(blank["protocol"])), proto, None).cast(pa.int32()),
            "bytes": pc.if_else(packet, size, None),
            "direction": pc.if_else(pc.and_kleene(packet, pc.invert(blank["direction"])), direction, null_str),
            "reason": reason,
            "record": record,
            "input_file": pa.repeat(pa.scalar(input_file, pa.string()), n),
        }
    )
    return conform(table)


#: How many of ``judge``'s checks, from the first, a tick must pass (its time and its source).
_TICK_CHECKS = 2


def _first_reason(checks, is_tick, n, prior_reason=None) -> pa.Array:
    """The reason of the first failing check (in order), null when all pass; ticks need only the first two.

    Reasons are built only for the failing rows (taken out, judged, put back in place).
    """
    passes = []
    for index, (ok, _) in enumerate(checks):
        ok = pc.fill_null(ok, False)
        if index >= _TICK_CHECKS:
            ok = pc.or_kleene(ok, is_tick)
        passes.append(ok)
    failing = pc.invert(_all(passes))
    if prior_reason is not None:
        failing = pc.or_kleene(failing, pc.is_valid(prior_reason))
    failing = _flat(failing)
    if not pc.any(failing).as_py():
        return pa.nulls(n, pa.string())
    rows = pc.indices_nonzero(failing)
    m = len(rows)

    def pick(array):
        return pc.take(array, rows)

    reason = pa.nulls(m, pa.string())
    for ok, text in reversed(list(zip(passes, (text for _, text in checks)))):
        value = text(pick)
        if isinstance(value, str):
            value = pa.repeat(pa.scalar(value, pa.string()), m)
        reason = pc.if_else(pick(ok), reason, value)
    if prior_reason is not None:
        reason = pc.coalesce(pick(prior_reason), reason)
    return pc.replace_with_mask(pa.nulls(n, pa.string()), failing, _flat(reason))


def shown(values: pa.Array) -> pa.Array:
    """Values as a reason quotes them: at most ``MAX_QUOTED_CHARS`` characters each."""
    long = pc.greater(pc.utf8_length(values), MAX_QUOTED_CHARS)
    if not pc.any(long).as_py():
        return values
    return pc.if_else(long, pc.binary_join_element_wise(
        pc.utf8_slice_codeunits(values, 0, MAX_QUOTED_CHARS - 1), "…", ""), values)


def _flat(array):
    """One contiguous array (``replace_with_mask`` takes no chunked masks)."""
    return array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array


def _all(masks):
    result = masks[0]
    for mask in masks[1:]:
        result = pc.and_kleene(result, mask)
    return result


def _digits(text: pa.Array, most: int) -> pa.Array:
    """``^[0-9]{1,most}$`` without a regex: ASCII decimal digits only (never other scripts' digits)."""
    return pc.and_kleene(pc.ascii_is_decimal(text), pc.less_equal(pc.binary_length(text), most))


def _to_int(text: pa.Array, ok: pa.Array) -> pa.Array:
    """``int64`` of the digits where ``ok`` (others null), without failing on the rest."""
    safe = pc.if_else(ok, text, pa.scalar(None, pa.string()))
    long_enough = pc.less_equal(pc.binary_length(safe), 18)
    safe = pc.if_else(long_enough, safe, pa.scalar(None, pa.string()))
    return pc.cast(safe, pa.int64())


def canonical_ips(text: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
    """(stored text, valid?, is IPv6?, why not) per address, by ``records.canonical_ip``.

    Canonical dotted quads pass through; every other distinct text goes through the rule once (a
    feed has thousands of distinct addresses, not millions): zone ids are refused and IPv4-mapped
    IPv6 becomes IPv4, so a row's family, byte bound and account are those of the address it stores.
    """
    n = len(text)
    # The regex runs once per distinct address.
    encoded = pc.dictionary_encode(text)
    fast = pc.fill_null(pc.take(pc.match_substring_regex(encoded.dictionary, CANONICAL_IPV4_REGEX),
                                encoded.indices), False)
    if pc.all(fast).as_py():
        return text, pa.repeat(pa.scalar(True), n), pa.repeat(pa.scalar(False), n), pa.nulls(n, pa.string())
    slow_values = pc.unique(pc.filter(text, pc.invert(fast))).to_pylist()
    canon, v6, why = [], [], []
    for value in slow_values:
        try:
            stored = canonical_ip(value)
        except ValueError as error:
            canon.append(None)
            v6.append(None)
            why.append(str(error))
            continue
        canon.append(stored)
        v6.append(":" in stored)
        why.append(None)
    lookup = pa.array(slow_values, pa.string())
    index = pc.index_in(text, value_set=lookup)
    canonical = pc.if_else(fast, text, pc.take(pa.array(canon, pa.string()), index))
    is_v6 = pc.if_else(fast, False, pc.take(pa.array(v6, pa.bool_()), index))
    reason = pc.if_else(fast, pa.scalar(None, pa.string()), pc.take(pa.array(why, pa.string()), index))
    return canonical, pc.is_valid(canonical), is_v6, reason
