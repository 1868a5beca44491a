"""What a flow decode keeps between batches, and what one call gives.

``FlowState``: the templates and sampling facts earlier datagrams taught, per exporter and domain;
``Waiting``: data sets whose template has not arrived; ``Decoded``: one ``decode`` call's result.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pyarrow as pa

from traffic.io.flows.fields import Template
from traffic.io.flows.nsel import nsel_entries
from traffic.io.flows.records import MAX_TS_US
from traffic.io.flows.sampling import usable_rate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FlowState:
    """What earlier datagrams taught: templates and sampling facts, per exporter and domain.

    ``templates`` is keyed (exporter, format, domain, template id); ``sampling`` (the last rate options
    data said) and ``system_init`` (IPFIX systemInitTimeMilliseconds from options data) by (exporter,
    format, domain); ``samplers`` (each sampler's or selector's rate) by (exporter, format, domain, id).
    Only values later code can use are kept. Treat it as a value: ``decode`` returns a new one.
    """

    templates: dict = field(default_factory=dict)
    sampling: dict = field(default_factory=dict)
    system_init: dict = field(default_factory=dict)
    samplers: dict = field(default_factory=dict)  # (exporter, format, domain, sampler/selector id) → rate
    #: NSEL: bytes and packets flow updates reported, per (exporter, format, domain, connection id): [initiator
    #: bytes, packets, responder bytes, packets, last update's time µs], oldest first (``nsel.NselCounting``)
    nsel: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """A JSON-able form (``from_json`` reads it back)."""
        return {
            "templates": [
                {"exporter": e, "format": f, "domain": d, "id": t, "options": tpl.options, "scope": tpl.scope,
                 "fields": [list(x) for x in tpl.fields]}
                for (e, f, d, t), tpl in sorted(self.templates.items())
            ],
            "sampling": [{"exporter": e, "format": f, "domain": d, "rate": r}
                         for (e, f, d), r in sorted(self.sampling.items())],
            "system_init": [{"exporter": e, "format": f, "domain": d, "ms": v}
                            for (e, f, d), v in sorted(self.system_init.items())],
            "samplers": [{"exporter": e, "format": f, "domain": d, "sampler": i, "rate": r}
                         for (e, f, d, i), r in sorted(self.samplers.items())],
            "nsel": [{"exporter": e, "format": f, "domain": d, "conn": c, "reported": v}
                     for (e, f, d, c), v in self.nsel.items()],
        }

    @staticmethod
    def from_json(data: dict) -> FlowState:
        """The state ``to_json`` wrote, without the values later code could not use (``_usable_state``)."""
        return FlowState(
            templates={
                (t["exporter"], t["format"], int(t["domain"]), int(t["id"])): Template(
                    tuple(tuple(int(v) for v in x) for x in t["fields"]), bool(t["options"]), int(t["scope"]))
                for t in data.get("templates", [])
            },
            sampling=_usable_state(data, "sampling", "rate", usable_rate),
            system_init=_usable_state(data, "system_init", "ms", lambda ms: 0 <= ms <= MAX_TS_US // 1000),
            samplers=_usable_state(data, "samplers", "rate", usable_rate, "sampler"),
            nsel=nsel_entries(data.get("nsel", [])),
        )


def _usable_state(data: dict, name: str, what: str, usable, *more: str) -> dict:
    """One of the state's (exporter, format, domain[, more]) → value maps, read back without the values later
    code could not use: states stored before rates were bounded may hold a rate of 2**63 or a system init
    time past 9999. Such a value is dropped (and logged) as if the exporter had never said it, so the
    source decodes again; its next options data says it anew."""
    kept = {}
    for item in data.get(name, []):
        try:
            key = (str(item["exporter"]), str(item["format"]), int(item["domain"]), *(int(item[m]) for m in more))
            value = int(item[what])
        except (KeyError, TypeError, ValueError):
            log.warning("flow state: %s entry %r dropped (cannot be read)", name, item)
            continue
        if usable(value) and all(0 <= k < 1 << 64 for k in key[3:]):
            kept[key] = value
        else:
            log.warning("flow state: %s %s of %s dropped (cannot be used)", name, value, key)
    return kept


@dataclass(frozen=True)
class WaitingSet:
    """A data set whose template had not arrived, with what decoding it later needs."""

    receive_ts: int  # µs
    exporter: str
    format: str
    domain: int
    template_id: int
    body: bytes  # the set's records (after its 4-byte header)
    export_ts: int  # µs, the message header's export time
    uptime_ms: int  # NetFlow v9 sysUptime; -1 for IPFIX
    number: int  # the datagram's frame number in its file
    offset: int  # the set's byte offset in its datagram
    input_file: str = ""


@dataclass(frozen=True)
class Waiting:
    """Data sets waiting for their templates, oldest first."""

    sets: tuple[WaitingSet, ...] = ()

    def __len__(self) -> int:
        return len(self.sets)

    def to_json(self) -> list:
        return [{**{k: getattr(s, k) for k in WaitingSet.__dataclass_fields__ if k != "body"},
                 "body": s.body.hex()} for s in self.sets]

    @staticmethod
    def from_json(data: list) -> Waiting:
        return Waiting(tuple(WaitingSet(**{**item, "body": bytes.fromhex(item["body"])}) for item in data))


@dataclass(frozen=True)
class Decoded:
    """What one ``decode`` (or ``decode_waiting``) call gives; see the module docstring."""

    flows: pa.Table
    sequences: pa.Table
    rejects: pa.Table
    skipped: dict[str, int]
    waiting: Waiting
    state: FlowState
