"""The fields (information elements) the flow decoder reads, and where a v9/IPFIX template puts them.

``Template`` is a template as the exporter sent it; its ``layout`` (worked out once per template) says
at which offset and length its records hold each field read, or why they cannot be read.
``record_fields`` finds them in one record of a template with variable-length fields.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

#: Element ids the decoder reads, with the lengths each may have.
_COUNTERS = (1, 2, 85, 86)
#: Sampling fields (``rate_said``), and the ids of the sampler or selector a record names, 302 first.
_SAMPLING = (34, 35, 49, 50, 304, 305, 306, 309, 310, 311)
SAMPLER_IDS = (302, 48)
#: What options records are read for: rates, the ids they are for, the exporter's system init time.
_OPTION_FIELDS = frozenset((*_SAMPLING, *SAMPLER_IDS, 160))
#: RFC 5103 reverse elements (PEN 29305) are read under their id plus this (IPFIX ids are below 2**15).
_REVERSE, _REVERSE_PEN = 1 << 16, 29305
#: Counters per direction, in order of preference: (bytes, packets) of the forward (initiator)
#: direction and of the reverse (responder) one. NSEL: 231/232 initiator/responder octets,
#: 298/299 packets; RFC 5103: the reverse elements.
FORWARD = ((1, 85, 231), (2, 86, 298))
BACKWARD = ((_REVERSE | 1, _REVERSE | 85, 232), (_REVERSE | 2, _REVERSE | 86, 299))
#: NSEL: NF_F_CONN_ID (148, flowId) and NF_F_FW_EVENT (233; 40005 on ASAs before 8.4, NetFlow v9 only).
CONN_ID, EVENTS = 148, (233, 40005)
CREATE, TEARDOWN, UPDATE = 1, 2, 5
#: natEvent (230): a NAT session's creation or deletion, logged by routers doing NAT (no traffic counted in it).
NAT_EVENT = 230
#: observationTimeMilliseconds: a record's end when it has no end field (NSEL events carry it).
OBSERVED = 323
_WANTED = {
    **{ie: range(1, 9) for ie in _COUNTERS + tuple(_REVERSE | c for c in _COUNTERS) + (231, 232, 298, 299)},
    CONN_ID: range(1, 9), 233: (1,), 40005: (1,), NAT_EVENT: (1,), OBSERVED: (8,),
    4: (1,), 7: (1, 2), 11: (1, 2), 8: (4,), 12: (4,), 27: (16,), 28: (16,),
    21: (4,), 22: (4,), 150: (4,), 151: (4,), 152: (8,), 153: (8,), 154: (8,), 155: (8,),
    156: (8,), 157: (8,), 158: (4,), 159: (4,), 160: (8,),
    **{ie: range(1, 9) for ie in (*_SAMPLING, *SAMPLER_IDS) if ie != 311}, 311: (4, 8),
}
_NAMES = {1: "bytes", 2: "packets", 85: "octetTotalCount", 86: "packetTotalCount", 4: "protocol",
          _REVERSE | 1: "reverse bytes", _REVERSE | 2: "reverse packets", _REVERSE | 85: "reverseOctetTotalCount",
          _REVERSE | 86: "reversePacketTotalCount", 231: "initiator octets", 232: "responder octets",
          298: "initiator packets", 299: "responder packets", 148: "connection id", 233: "firewall event",
          40005: "firewall event", NAT_EVENT: "NAT event", OBSERVED: "observationTimeMilliseconds",
          7: "source port", 11: "destination port", 8: "IPv4 source", 12: "IPv4 destination",
          27: "IPv6 source", 28: "IPv6 destination", 21: "end uptime", 22: "start uptime",
          150: "flowStartSeconds", 151: "flowEndSeconds", 152: "flowStartMilliseconds",
          153: "flowEndMilliseconds", 154: "flowStartMicroseconds", 155: "flowEndMicroseconds",
          156: "flowStartNanoseconds", 157: "flowEndNanoseconds", 158: "flowStartDeltaMicroseconds",
          159: "flowEndDeltaMicroseconds", 160: "systemInitTimeMilliseconds", 34: "sampling interval",
          50: "sampler random interval", 305: "samplingPacketInterval", 306: "samplingPacketSpace",
          35: "sampling algorithm", 48: "sampler id", 49: "sampler mode", 302: "selectorId",
          304: "selectorAlgorithm", 309: "samplingSize", 310: "samplingPopulation", 311: "samplingProbability"}
VARIABLE = 65535


@dataclass(frozen=True)
class Template:
    """A template as the exporter sent it: (element id, length, enterprise number) per field."""

    fields: tuple[tuple[int, int, int], ...]
    options: bool = False  # an options template: its data records describe the exporter, not flows
    scope: int = 0  # scope fields (options templates)

    @functools.cached_property
    def layout(self) -> _Layout:
        """Where its records hold the fields the decoder reads (worked out once per template)."""
        return _layout(self)

    @functools.cached_property
    def read_as(self) -> tuple[int, ...]:
        """Per field, the key the decoder reads it under, or -1 for a field it does not read.

        Scope fields are not data: a NetFlow v9 scope is a scope *type* (RFC 3954 §6.1: 1 System,
        2 Interface, ...; length 0 allowed), not an element, and of an IPFIX scope only the sampler or
        selector id is read (the id an options record gives a rate to). Options records are read for
        their sampling fields and system init time only.
        """
        wanted = _OPTION_FIELDS if self.options else _WANTED
        keys = []
        for k, (ie, _, pen) in enumerate(self.fields):
            key = _read_as(ie, pen)
            if k < self.scope and key not in SAMPLER_IDS:
                key = -1
            keys.append(key if key in wanted else -1)
        return tuple(keys)


@dataclass(frozen=True)
class _Layout:
    """Where a template puts the fields the decoder reads."""

    offsets: dict  # element id → byte offset in the record, for fields before any variable-length one
    lengths: dict  # element id → length
    record_length: int  # fixed-length templates; 0 when some field has a variable length
    min_length: int  # the shortest record the template allows
    problem: str | None  # why its records cannot be read, if so


def _layout(template: Template) -> _Layout:
    offsets, lengths, at, variable, shortest = {}, {}, 0, False, 0
    problem = None
    for (_, length, _), ie in zip(template.fields, template.read_as):
        if ie >= 0 and ie not in lengths:
            if length not in _WANTED[ie]:
                what = "a variable length" if length == VARIABLE else f"length {length}"
                problem = problem or f"field {ie} ({_NAMES[ie]}) has {what}, which it cannot have"
            lengths[ie] = length
            if not variable:
                offsets[ie] = at
        if length == VARIABLE:
            variable = True
            shortest += 1
        else:
            at += length
            shortest += length
    return _Layout(offsets, lengths, 0 if variable else at, shortest, problem)


def _read_as(ie: int, pen: int) -> int:
    """The key a field is read under: its id; RFC 5103 reverse elements apart; other enterprises' never."""
    if pen == 0:
        return ie
    return _REVERSE | ie if pen == _REVERSE_PEN else -1


def record_fields(data: bytes, template: Template, record: int) -> dict:
    """Offsets of the wanted fields of one record (variable-length templates)."""
    found, at = {}, record
    for (_, length, _), ie in zip(template.fields, template.read_as):
        if length == VARIABLE:
            length = data[at]
            at += 1
            if length == 255:
                length = int.from_bytes(data[at : at + 2], "big")
                at += 2
        if ie >= 0 and ie not in found:
            found[ie] = at
        at += length
    return found
