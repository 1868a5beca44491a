"""Sampling as exporters send it, and bounds on what a record may make the decoder do (DESIGN §7a).

Real captures from ``../shared/flowcaps`` (read, never copied) and datagrams written by
``tests.support.flow_encoder``. The rates asserted for the captures are those tshark shows for the same
files (``tshark -o cflow.max_template_fields:0 -V``): the options data's sampling interval 100
(``akvorado_nf_data+templates``), samplers 1 → 2000 and 2 → 4000 named by FLOW_SAMPLER_ID in each data
record (``akvorado_nf_multiplesamplingrates-*``), selector 1 = random 1 out of 256
(``pmacct_104``, whose expected output in ``pmacct_expected/104-*`` has packets × 256).
"""

from __future__ import annotations

import math
import random
import struct
from pathlib import Path

import numpy as np
import pytest

from tests.support import flow_encoder as fe
from tests.support.requirements import folder_fixture
from traffic.io.capture import Datagrams, udp_datagrams
from traffic.io.flows import FlowState, decode
from traffic.io.flows.sampling import rate_by_precedence as _rate_by_precedence, rate_said as _rate_said

FLOWCAPS = Path(__file__).resolve().parents[3] / "shared" / "flowcaps"
T = 1_800_000_000_000_000
EXPORT_S = T // 1_000_000
EXPORTER = "192.0.2.250"
A = fe.Flow("10.0.0.1", "192.0.2.1", 1234, 443, 6, 1500, 3, T - 5_000_000, T - 1_000_000)
B = fe.Flow("10.0.0.2", "198.51.100.7", 5353, 53, 17, 80, 1, T - 2_000_000, T - 2_000_000)
V4 = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8)]

# A missing corpus fails the tests that need it, with the reason (tests/support/requirements.py).
flowcaps_corpus = folder_fixture(FLOWCAPS, "flowcaps_corpus")
needs_corpus = pytest.mark.usefixtures("flowcaps_corpus")


def _capture(*names: str, state: FlowState | None = None):
    """Decode the captures one after the other (one decode call each), the state carried between them."""
    state = state or FlowState()
    out = []
    for name in names:
        datagrams, rejects = udp_datagrams((FLOWCAPS / name).read_bytes(), input_file=name, source="s")
        assert rejects.num_rows == 0
        decoded = decode(datagrams, state, source="s", input_file=name)
        state = FlowState.from_json(decoded.state.to_json())  # as the warehouse keeps it between batches
        out.append(decoded)
    return out


def _decode(*payloads, state=None, exporter=EXPORTER):
    datagrams = Datagrams.from_payloads([(T, exporter, 5000, 2055, p) for p in payloads])
    return decode(datagrams, state or FlowState(), source="edge", input_file="f.pcap")


def _reasons(decoded) -> list[str]:
    return decoded.rejects.column("reason").to_pylist()


def _ipfix(sets, domain=3):
    return fe.ipfix(sets, export_s=EXPORT_S, domain=domain)


def _v9(sets, source_id=7):
    return fe.netflow9(sets, export_s=EXPORT_S, uptime_ms=900_000, source_id=source_id)


def _ipfix_data(*flows, fields=V4, extra=None):
    return fe.data_set(256, [fe.record(fields, {**fe.flow_values(f), **(extra or {})}) for f in flows])


# --- the rule itself ----------------------------------------------------------------------------


def _said(fields: dict) -> tuple[int, bool]:
    """What one record's own sampling fields say: (rate, unusable)."""
    value = {ie: np.array([v], np.uint64) for ie, v in fields.items()}
    rate, bad = _rate_said(value, 1)
    return int(rate[0]), bool(bad[0])


def _p(probability: float) -> int:
    return struct.unpack(">Q", struct.pack(">d", probability))[0]


@pytest.mark.parametrize("fields,expected", [
    ({}, (0, False)),
    ({34: 100}, (100, False)),
    ({34: 100, 35: 2}, (100, False)),
    ({35: 2}, (0, False)),  # an algorithm without an interval says nothing
    ({34: 0}, (0, False)),  # "0": not sampled as far as the exporter says; nothing to use
    ({50: 2000, 49: 2}, (2000, False)),
    ({34: 100, 50: 2000}, (100, False)),
    ({305: 1, 306: 999}, (1000, False)),
    ({305: 3, 306: 1}, (1, False)),  # 3 of every 4: rounded
    ({305: 1}, (0, False)),  # an interval without its space says nothing
    ({304: 3, 305: 1, 309: 1, 310: 256}, (256, False)),  # pmacct 104: random 1 out of 256
    ({309: 1, 310: 256}, (256, False)),
    ({304: 1, 305: 1, 306: 99, 309: 1, 310: 256}, (100, False)),  # the algorithm names its fields
    ({311: _p(0.001)}, (1000, False)),
    ({311: _p(1.0)}, (1, False)),
    ({305: 1, 306: 9, 34: 4}, (10, False)),  # the PSAMP fields before the older ones
    # unusable: a rate is given but means nothing, or more than 2**31 - 1
    ({34: 2**31}, (0, True)),
    ({50: 2**64 - 1}, (0, True)),
    ({309: 256, 310: 1}, (0, True)),  # population below size
    ({309: 0, 310: 256}, (0, True)),
    ({305: 0, 306: 10}, (0, True)),
    ({305: 1, 306: 2**63}, (0, True)),
    ({311: _p(0.0)}, (0, True)),
    ({311: _p(-0.5)}, (0, True)),
    ({311: _p(1.5)}, (0, True)),
    ({311: _p(math.nan)}, (0, True)),
    ({311: _p(1e-12)}, (0, True)),  # 1 in 10**12
])
def test_what_a_records_own_sampling_fields_say(fields, expected):
    assert _said(fields) == expected


def test_float32_probability_is_read_too():
    rate, bad = _rate_said({311: np.array([struct.unpack(">I", struct.pack(">f", 0.01))[0]], np.uint64)}, 1,
                           lengths={311: 4})
    assert (int(rate[0]), bool(bad[0])) == (100, False)


@pytest.mark.parametrize("own,sampler,last,expected", [
    (64, 2000, 10, 64),  # the record's own fields first
    (0, 2000, 10, 2000),  # then its sampler's rate
    (0, 0, 10, 10),  # then the exporter's last options-data rate for the domain
    (0, 0, 0, 0),  # nothing said: 0 (ingest applies the source's setting, or 1)
])
def test_rate_by_precedence(own, sampler, last, expected):
    got = _rate_by_precedence(*(np.array([v], np.int64) for v in (own, sampler, last)))
    assert got.tolist() == [expected]


# --- the captures ---------------------------------------------------------------------------------


@needs_corpus
def test_v9_options_scope_of_type_system_and_length_0_gives_the_rate():
    [out] = _capture("akvorado_nf_data+templates.pcap")
    assert out.flows.num_rows == 21 and out.rejects.num_rows == 0
    assert set(out.flows.column("sampling_rate").to_pylist()) == {100}


def test_v9_options_scope_types_are_not_elements():
    # scope type 1 (System) of length 0, as akvorado's capture has it; and an Interface scope (2) of 4
    for scope in ([(1, 0)], [(2, 4)]):
        fields = [(35, 1), (34, 4)]
        options = fe.options_template_set(300, scope, fields, ipfix=False)
        v9 = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 4), (2, 4), (22, 4), (21, 4)]
        data = fe.data_set(256, [fe.record(v9, fe.flow_values(A, export_us=T, uptime_ms=900_000))])
        out = _decode(_v9([fe.template_set({256: v9}, ipfix=False), options,
                           fe.data_set(300, [fe.record(scope + fields, {34: 100, 35: 2})]), data]))
        assert out.rejects.num_rows == 0, _reasons(out)
        assert out.flows.column("sampling_rate").to_pylist() == [100]


@needs_corpus
def test_v9_sampler_ids_get_their_samplers_rate():
    *_, out = _capture(*(f"akvorado_nf_multiplesamplingrates-{part}.pcap"
                         for part in ("template", "options-template", "options-data", "data")))
    rates = {(r["src_ip"], r["dst_ip"]): r["sampling_rate"] for r in out.flows.to_pylist()}
    assert len(rates) == 12 and out.rejects.num_rows == 0
    # tshark: the first record names sampler 2, the eleven others sampler 1
    assert rates == {key: 4000 if key == ("ffff::68", "ffff::1a") else 2000 for key in rates}
    state = out.state.to_json()
    assert {(s["sampler"], s["rate"]) for s in state["samplers"]} == {(1, 2000), (2, 4000)}


@needs_corpus
def test_ipfix_psamp_random_n_out_of_N_selector():
    [out] = _capture("pmacct_104-IPFIXv10-IPv6-CISCO-sampling_option.pcap")
    assert out.flows.num_rows == 3 and out.rejects.num_rows == 0
    assert out.flows.column("sampling_rate").to_pylist() == [256] * 3


def test_ipfix_selector_ids_and_sampler_ids_each_get_their_rate():
    options = fe.options_template_set(400, [(302, 4)], [(304, 2), (309, 4), (310, 4)])
    rates = fe.data_set(400, [fe.record([(302, 4), (304, 2), (309, 4), (310, 4)], {302: s, 304: 3, 309: 1, 310: r})
                              for s, r in ((1, 64), (2, 512))])
    fields = [*V4, (302, 4)]
    data = fe.data_set(256, [fe.record(fields, {**fe.flow_values(f), 302: s}) for f, s in ((A, 2), (B, 1), (A, 9))])
    out = _decode(_ipfix([fe.template_set({256: fields}), options, rates, data]))
    # selector 9 is not known: the domain's last options-data rate (512, the last record) applies
    assert out.flows.column("sampling_rate").to_pylist() == [512, 64, 512]
    v9 = fe.options_template_set(300, [(1, 4)], [(48, 1), (49, 1), (50, 4)], ipfix=False)
    v9_rates = fe.data_set(300, [fe.record([(1, 4), (48, 1), (49, 1), (50, 4)], {48: s, 49: 2, 50: r})
                                 for s, r in ((1, 100), (2, 10))])
    fields = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 4), (2, 4), (48, 1)]
    data = fe.data_set(256, [fe.record(fields, {**fe.flow_values(A), 48: s}) for s in (1, 2)])
    out = _decode(_v9([fe.template_set({256: fields}, ipfix=False), v9, v9_rates, data]), state=out.state)
    assert out.flows.column("sampling_rate").to_pylist() == [100, 10]
    assert FlowState.from_json(out.state.to_json()) == out.state


def test_huawei_sampling_interval_in_every_record():
    fields = [*V4, (34, 4), (35, 1)]
    out = _decode(_ipfix([fe.template_set({256: fields}), _ipfix_data(A, B, fields=fields, extra={34: 1000, 35: 2})]))
    assert out.flows.column("sampling_rate").to_pylist() == [1000, 1000]


# --- bounds ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [2**31, 2**63, 2**64 - 1])
def test_a_poisoned_options_rate_is_one_reject_and_is_not_kept(rate):
    options = fe.options_template_set(400, [(149, 4)], [(34, 8), (160, 8)])
    poison = fe.data_set(400, [fe.record([(149, 4), (34, 8), (160, 8)], {149: 3, 34: rate, 160: 2**64 - 1})])
    first = _decode(_ipfix([fe.template_set({256: V4}), options, poison, _ipfix_data(A)]))
    [reason] = _reasons(first)
    assert "options data" in reason and "2**31 - 1" in reason, reason
    assert first.flows.column("sampling_rate").to_pylist() == [0]
    assert first.state.sampling == {} and first.state.system_init == {}
    state = FlowState.from_json(first.state.to_json())
    good = fe.data_set(400, [fe.record([(149, 4), (34, 8), (160, 8)], {149: 3, 34: 100})])
    second = _decode(_ipfix([good, _ipfix_data(A, B)]), state=state)
    assert second.rejects.num_rows == 0 and second.flows.column("sampling_rate").to_pylist() == [100, 100]


def test_a_poisoned_stored_state_is_dropped_when_read():
    stored = FlowState(templates=_decode(_ipfix([fe.template_set({256: V4})])).state.templates).to_json()
    stored["sampling"] = [{"exporter": EXPORTER, "format": "ipfix", "domain": 3, "rate": 2**63},
                          {"exporter": EXPORTER, "format": "ipfix", "domain": 4, "rate": 50}]
    stored["system_init"] = [{"exporter": EXPORTER, "format": "ipfix", "domain": 3, "ms": 2**64}]
    stored["samplers"] = [{"exporter": EXPORTER, "format": "ipfix", "domain": 3, "sampler": 1, "rate": -5}]
    state = FlowState.from_json(stored)
    assert state.sampling == {(EXPORTER, "ipfix", 4): 50} and state.system_init == {} and state.samplers == {}
    out = _decode(_ipfix([_ipfix_data(A)]), state=state)
    assert out.rejects.num_rows == 0 and out.flows.column("bytes").to_pylist() == [1500]


@pytest.mark.parametrize("extra,reason", [
    ({34: 2**31}, "above 2**31 - 1"),
    ({309: 256, 310: 1}, "sampling fields"),
])
def test_a_record_with_an_unusable_rate_is_one_reject(extra, reason):
    fields = [*V4, (34, 8), (309, 4), (310, 4)]
    records = [fe.record(fields, {**fe.flow_values(f), **e}) for f, e in ((A, {34: 10}), (B, extra), (A, {34: 10}))]
    out = _decode(_ipfix([fe.template_set({256: fields}), fe.data_set(256, records)]))
    [got] = _reasons(out)
    assert reason in got, got
    assert out.flows.column("sampling_rate").to_pylist() == [10, 10]


def test_an_sflow_sample_with_a_rate_of_2_31_is_one_reject():
    good = fe.flow_sample([fe.raw_header(fe.sampled_frame(A))], sampling_rate=2**31 - 1)
    bad = fe.flow_sample([fe.raw_header(fe.sampled_frame(B))], sampling_rate=2**31, expanded=True)
    out = _decode(fe.sflow([bad, good]), fe.sflow([good]))
    [reason] = _reasons(out)
    assert "2**31 - 1" in reason, reason
    assert out.flows.column("sampling_rate").to_pylist() == [2**31 - 1] * 2


# --- fuzzing: byte flips in real datagrams -----------------------------------------------------------


def _corpus_payloads() -> list[tuple[str, bytes]]:
    """Every datagram of the corpus: payloads first (templates before data: sorted names put tpl later, so
    each vendor's files are given in one decode call), then the datagrams of the pcaps."""
    out = [(p.name, p.read_bytes()) for p in sorted((FLOWCAPS / "payloads").glob("*.dat"))]
    for capture in sorted(FLOWCAPS.glob("*.pcap")):
        datagrams, _ = udp_datagrams(capture.read_bytes(), input_file=capture.name, source="s")
        out += [(capture.name, datagrams.payload(i)) for i in range(len(datagrams))]
    return out


def _mutate(rng: random.Random, payload: bytes) -> bytes:
    data = bytearray(payload)
    for _ in range(rng.choice((1, 1, 2, 4, 8))):
        k = rng.randrange(len(data))
        kind = rng.random()
        if kind < 0.5:
            data[k] ^= 1 << rng.randrange(8)
        elif kind < 0.8:
            data[k] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
        else:  # a whole 32-bit word to an extreme: rates, counts, lengths, times
            word = rng.choice((0, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 1))
            data[k : k + 4] = word.to_bytes(4, "big")[: len(data) - k]
    if rng.random() < 0.1:
        data = data[: rng.randrange(1, len(data) + 1)]
    return bytes(data)


@needs_corpus
def test_byte_flips_in_real_datagrams_never_make_the_decoder_raise():
    corpus = _corpus_payloads()
    assert len(corpus) > 100
    everything = [payload for _, payload in corpus]
    # the templates of the whole corpus, so mutated data sets are read against them
    state = _decode(*everything).state
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for round_ in range(2000 // 20):
        picked = [rng.choice(corpus) for _ in range(20)]
        mutated = [_mutate(rng, payload) for _, payload in picked]
        try:
            out = _decode(*mutated, state=state)
        except Exception as exc:  # pragma: no cover - the failure report
            raise AssertionError(f"seed {seed}, round {round_}: decode raised {exc!r} on "
                                 f"{[name for name, _ in picked]}") from exc
        crashed = [r for r in _reasons(out) if "could not decode datagram (" in r]
        assert not crashed, f"seed {seed}, round {round_}: {crashed[:3]} ({[name for name, _ in picked]})"
        rates = out.flows.column("sampling_rate").to_numpy()
        assert ((rates >= 0) & (rates < 2**31)).all(), f"seed {seed}, round {round_}"
        # whatever state the mutations left, the next batch of the same sources decodes without a crash
        after = _decode(*rng.sample(everything, 20), state=FlowState.from_json(out.state.to_json()))
        assert not [r for r in _reasons(after) if "could not decode datagram (" in r], f"seed {seed}, round {round_}"
