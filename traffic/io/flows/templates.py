"""NetFlow v9 and IPFIX messages: headers, sets, (options) templates and what options data teach.

Templates are kept per (exporter, format, domain, template id); options data records teach sampling
rates (the domain's last, and per sampler or selector id) and the exporter's system init time. Data
sets are handed to ``data_sets``.
"""

from __future__ import annotations

import struct

import numpy as np

from traffic.io.flows.fields import SAMPLER_IDS, VARIABLE, Template, record_fields
from traffic.io.flows.records import FORMAT_CODE, FORMATS, IPFIX, MAX_TS_US, NETFLOW9, PROBLEMS
from traffic.io.flows.sampling import MAX_SAMPLERS, rate_said


class Templates:
    """The decoder's v9/IPFIX message part (mixed into ``decoder._Decoder``: its per-datagram columns,
    ``reject``, ``header``, ``key``, ``data_set`` and the state it learns: ``templates``, ``sampling``,
    ``samplers``, ``system_init``)."""

    def netflow9_datagram(self, context: int, start: int, size: int) -> None:
        """A NetFlow v9 datagram: its header, then its flowsets."""
        if size < 20:
            self.reject(context, start, f"NetFlow v9 header cut off ({size} of 20 bytes)")
            return
        _, _, uptime, secs, sequence, source_id = struct.unpack_from(">HHIIII", self.data, start)
        self.header(context, NETFLOW9, source_id, sequence, secs * 1_000_000, uptime)
        self.units[context] = 1
        self._sets(context, start + 20, start + size)

    def ipfix_datagram(self, context: int, start: int, size: int) -> None:
        """An IPFIX message: its header (the length must be the datagram's), then its sets."""
        if size < 16:
            self.reject(context, start, f"IPFIX message header cut off ({size} of 16 bytes)")
            return
        _, length, export, sequence, domain = struct.unpack_from(">HHIII", self.data, start)
        if length != size:
            self.reject(context, start, f"IPFIX message length {length} is not the datagram's length {size}")
            return
        self.header(context, IPFIX, domain, sequence, export * 1_000_000)
        self.units[context] = 0
        self._sets(context, start + 16, start + size)

    def _sets(self, context: int, at: int, end: int) -> None:
        """Walk the sets (flowsets) of a v9 or IPFIX message."""
        ipfix = self.format[context] == FORMAT_CODE[IPFIX]
        template_id, options_id = (2, 3) if ipfix else (0, 1)
        while at < end:
            if end - at < 4:
                if any(self.data[at:end]):
                    self.reject(context, at, f"set header cut off ({end - at} of 4 bytes)")
                    self.units_unknown(context)
                return
            set_id, length = struct.unpack_from(">HH", self.data, at)
            if length < 4:
                self.reject(context, at, f"set {set_id} has length {length}, less than its own 4-byte header")
                self.units_unknown(context)
                return
            if at + length > end:
                self.reject(context, at, f"set {set_id} claims {length} bytes, only {end - at} remain in the datagram")
                self.units_unknown(context)
                return
            if set_id == template_id:
                self._templates(context, at + 4, at + length, ipfix, options=False)
            elif set_id == options_id:
                self._templates(context, at + 4, at + length, ipfix, options=True)
            elif set_id >= 256:
                self.data_set(context, set_id, at + 4, at + length)
            else:
                self.skipped[f"{FORMATS[self.format[context]]} set with reserved id {set_id}"] += 1
            at += length

    def units_unknown(self, context: int) -> None:
        """IPFIX counts data records in its sequence: a message not read whole has no known count."""
        if self.format[context] == FORMAT_CODE[IPFIX]:
            self.units[context] = None

    # -- templates --

    def _templates(self, context: int, at: int, end: int, ipfix: bool, options: bool) -> None:
        exporter, fmt, domain = self.key(context)
        kind = "options template" if options else "template"
        while end - at >= 4 and any(self.data[at:end]):
            record = at
            if options and not ipfix:
                if end - at < 6:
                    self.reject(context, record, f"options template header cut off ({end - at} of 6 bytes)")
                    return
                tid, scope_length, option_length = struct.unpack_from(">HHH", self.data, at)
                at += 6
                if scope_length % 4 or option_length % 4:
                    self.reject(context, record, f"options template {tid}: scope length {scope_length} and option "
                                                 f"length {option_length} must be multiples of 4")
                    return
                count, scope = (scope_length + option_length) // 4, scope_length // 4
            else:
                tid, count = struct.unpack_from(">HH", self.data, at)
                at += 4
                scope = 0
                if count == 0 and ipfix:
                    self._withdraw(exporter, fmt, domain, tid, options, ipfix)
                    continue
                if options:
                    if end - at < 2:
                        self.reject(context, record, f"options template {tid}: scope field count cut off")
                        return
                    (scope,) = struct.unpack_from(">H", self.data, at)
                    at += 2
            fields = []
            for k in range(count):
                if end - at < 4:
                    self.reject(context, record, f"{kind} {tid} declares {count} fields, its set ends after {k}")
                    return
                ie, length = struct.unpack_from(">HH", self.data, at)
                at += 4
                pen = 0
                if ipfix and ie & 0x8000:
                    if end - at < 4:
                        self.reject(context, record, f"{kind} {tid} declares {count} fields, its set ends after {k}")
                        return
                    (pen,) = struct.unpack_from(">I", self.data, at)
                    at += 4
                    ie &= 0x7FFF
                if length == VARIABLE and not ipfix:
                    self.reject(context, record, f"{kind} {tid}: field {ie} has length 65535 (variable-length "
                                                 "fields are IPFIX only)")
                    break
                fields.append((ie, length, pen))
            else:
                problem = None
                if tid < 256:
                    problem = f"{kind} id {tid} is reserved (data templates are numbered from 256)"
                elif count == 0:
                    problem = f"{kind} {tid} has no fields"
                elif options and not 0 < scope <= count:
                    problem = f"options template {tid} has {scope} scope fields of {count} (must be 1 to {count})"
                elif sum(1 if n == VARIABLE else n for _, n, _ in fields) == 0:
                    problem = f"{kind} {tid} describes records of 0 bytes"
                if problem:
                    self.reject(context, record, problem)
                else:
                    template = Template(tuple(fields), options, scope)
                    # one object per distinct template, so re-sent ones are read together, in one gather
                    self.templates[(exporter, fmt, domain, tid)] = self.interned.setdefault(template, template)
                continue
            return

    def _withdraw(self, exporter: str, fmt: str, domain: int, tid: int, options: bool, ipfix: bool) -> None:
        if tid in (2, 3):  # all (options) templates of the domain
            for key in [k for k, t in self.templates.items() if k[:3] == (exporter, fmt, domain)
                        and t.options == (tid == 3)]:
                del self.templates[key]
        else:
            self.templates.pop((exporter, fmt, domain, tid), None)

    def options_data(self, context: int, template: Template, start: int, end: int, records) -> None:
        """Options data: learn sampling rates (the domain's last one, and the rate of the sampler or selector
        id the record names) and the system init time; count the records.

        A record saying what later code could not use (a rate above 2**31 - 1, sampling fields that give no
        rate, a system init time past 9999) is a reject and teaches nothing: the state keeps only usable values.
        """
        layout = template.layout
        if records is None:
            records = range(start, start + (end - start) // layout.record_length * layout.record_length,
                            layout.record_length)
        key = self.key(context)
        for record in records:
            if layout.problem:
                self.reject(context, record, f"{key[1]} options data: {layout.problem}")
                continue
            offsets = {ie: record + off for ie, off in layout.offsets.items()} if layout.record_length \
                else record_fields(self.data, template, record)
            value = {ie: np.array([int.from_bytes(self.data[at : at + layout.lengths[ie]], "big")], np.uint64)
                     for ie, at in offsets.items()}
            rate, problem = rate_said(value, 1, layout.lengths)
            system_init = int(value[160][0]) if 160 in value else 0
            if problem[0]:
                self.reject(context, record, f"{key[1]} options data: {PROBLEMS[int(problem[0])]}")
                continue
            if system_init > MAX_TS_US // 1000:
                self.reject(context, record, f"{key[1]} options data: systemInitTimeMilliseconds {system_init} is "
                                             "after 9999-12-31")
                continue
            self.skipped[f"{key[1]} options data"] += 1
            if rate[0]:
                self.sampling[key] = int(rate[0])
                sampler = next((int(value[ie][0]) for ie in SAMPLER_IDS if ie in value), None)
                if sampler is not None:
                    self._learn_sampler(key, sampler, int(rate[0]))
            if system_init:
                self.system_init[key] = system_init

    def _learn_sampler(self, key: tuple, sampler: int, rate: int) -> None:
        """A sampler's (or selector's) rate, in a new map for the domain: sets queued earlier keep the old one.

        At most ``MAX_SAMPLERS`` per domain (the least recently said dropped first): an exporter naming
        ever new ids cannot grow the state without bound.
        """
        samplers = dict(self.samplers.get(key, {}))
        samplers.pop(sampler, None)
        samplers[sampler] = rate
        while len(samplers) > MAX_SAMPLERS:
            del samplers[next(iter(samplers))]
        self.samplers[key] = samplers
