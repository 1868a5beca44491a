"""Bad flow telemetry never crashes the decoder: every malformed datagram is a reject (or waits, or is
skipped and counted), never an exception, and good datagrams beside bad ones still decode exactly.

Hypothesis plus exhaustive truncations over NetFlow v5, NetFlow v9, IPFIX and sFlow v5 datagrams from
``tests.support.flow_encoder``, and hand-made lies: set lengths below 4, templates with no fields or
65,535 of them, record counts and sample counts that are not there.
"""

from __future__ import annotations

import os
import random
import re

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import flow_encoder as fe
from tests.support import flowcaps
from tests.support.requirements import folder_fixture
from traffic.core.records import canonical_ip
from traffic.io.capture import Datagrams, udp_datagrams
from traffic.io.flows import FlowState, decode

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T = 1_800_000_000_000_000
EXPORT_S = T // 1_000_000
GOOD_EXPORTER, BAD_EXPORTER = "192.0.2.1", "192.0.2.66"

A = fe.Flow("10.0.0.1", "192.0.2.9", 1234, 443, 6, 1500, 3, T - 5_000_000, T - 1_000_000)
C = fe.Flow("2001:db8::1", "2001:db8::2", 53, 53, 17, 120, 1, T - 2_000_000, T - 2_000_000)
V4 = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 4), (2, 4), (152, 8), (153, 8)]
V9 = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 4), (2, 4), (22, 4), (21, 4)]
VARIABLE = [(27, 16), (28, 16), (82, fe.VARIABLE), (100, 4, 9), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8),
            (156, 8), (157, 8)]


def _samples() -> list[bytes]:
    """One good datagram of each kind, every feature the decoder walks."""
    v9_flows = [fe.record(V9, fe.flow_values(A, export_us=T, uptime_ms=500_000))] * 2
    return [
        fe.netflow5([A, A], export_us=T, uptime_ms=500_000, sequence=1, sampling_interval=10),
        fe.netflow9([fe.template_set({256: V9}, ipfix=False),
                     fe.options_template_set(257, [(1, 4)], [(34, 4)], ipfix=False),
                     fe.data_set(257, [fe.record([(1, 4), (34, 4)], {34: 8})]),
                     fe.data_set(256, v9_flows)], export_s=EXPORT_S, uptime_ms=500_000, source_id=1),
        fe.ipfix([fe.template_set({256: V4, 258: VARIABLE}),
                  fe.options_template_set(257, [(149, 4)], [(305, 4), (306, 4)]),
                  fe.data_set(257, [fe.record([(149, 4), (305, 4), (306, 4)], {305: 1, 306: 9})]),
                  fe.data_set(256, [fe.record(V4, fe.flow_values(A))] * 2),
                  fe.data_set(258, [fe.record(VARIABLE, {**fe.flow_values(C), 82: b"x" * n}) for n in (3, 300)])],
                 export_s=EXPORT_S, domain=4),
        fe.sflow([fe.flow_sample([fe.raw_header(fe.sampled_frame(A, vlans=[(0x8100, 7)])), fe.extended_switch()],
                                 sampling_rate=100),
                  fe.counter_sample(),
                  fe.flow_sample([fe.raw_header(fe.sampled_frame(C))], sampling_rate=100, expanded=True)]),
    ]


SAMPLES = _samples()


def _decode(bad: list[bytes], state: FlowState | None = None):
    """Decode the bad datagrams (from one exporter) among the good samples (from another)."""
    items = [(T, GOOD_EXPORTER, 5000, 2055, SAMPLES[0])]
    items += [(T + 1 + i, BAD_EXPORTER, 5000, 2055, payload) for i, payload in enumerate(bad)]
    items += [(T + 1000 + i, GOOD_EXPORTER, 5000, 2055, payload) for i, payload in enumerate(SAMPLES[1:])]
    return decode(Datagrams.from_payloads(items), state or FlowState(), source="s", input_file="f")


EXPECTED = _decode([]).flows.to_pylist()


def _check(out):
    """Every row keeps the contract, and the good exporter's flows are exactly those decoded alone."""
    flows = out.flows.to_pylist()
    for row in flows:
        assert canonical_ip(row["src_ip"]) == row["src_ip"] and canonical_ip(row["dst_ip"]) == row["dst_ip"], row
        assert (":" in row["src_ip"]) == (":" in row["dst_ip"]), row
        for port in (row["src_port"], row["dst_port"]):
            assert port is None or 0 <= port <= 65535, row
        assert row["protocol"] is None or 0 <= row["protocol"] <= 255, row
        assert row["bytes"] >= 0 and row["packets"] >= 0 and row["sampling_rate"] >= 0, row
        assert row["start_ts"] <= row["end_ts"], row
        assert row["format"] in ("sflow5", "netflow5", "netflow9", "ipfix")
    for row in out.rejects.to_pylist():
        assert row["kind"] == "reject" and row["reason"] and len(row["reason"]) <= 512, row
        assert row["record"].startswith("datagram ") and len(row["record"]) <= 512, row
    assert [r for r in flows if r["exporter"] == GOOD_EXPORTER] == EXPECTED
    assert all(count > 0 for count in out.skipped.values())
    return out


def test_the_samples_decode():
    assert len(EXPECTED) == 2 + 2 + 4 + 2
    assert len(_FILE_ENDS) == len(SAMPLES) and [len(rows) for rows in _FILE_FLOWS] == [2, 2, 4, 2]
    assert _decode([]).rejects.num_rows == 0


#: The flow records in each data set of the samples, by set id (the tests know what they built).
_FLOWS_IN_SET = {1: {256: 2}, 2: {256: 2, 258: 2}}


def _units(which: int, sample: bytes) -> tuple[list[tuple[int, int]], list[int]]:
    """Where each whole part of a sample ends and how many flows it holds; and where a shorter datagram may
    cleanly end (after the header or a whole set: NetFlow v9 only, whose record count is not checked).
    NetFlow v5 (its record count) and IPFIX (its message length) have no parts: any cut loses all of them.
    sFlow counts whole samples before a cut (its sample count then rejects the rest)."""
    units: list[tuple[int, int]] = []
    if which == 1:
        return _sets(sample, 20, _FLOWS_IN_SET[1])
    if which == 3:  # sFlow v5 with an IPv4 agent: 28-byte header, then (format, length, body) samples
        at = 28
        while at + 8 <= len(sample):
            kind, length = int.from_bytes(sample[at:at + 4], "big"), int.from_bytes(sample[at + 4:at + 8], "big")
            at += 8 + length
            units.append((at, int(kind in (1, 3))))
    return units, []


def _judge_cut(sample: bytes, alone: list[dict], cut: int, units, clean, out, context) -> None:
    """A cut datagram, decoded alone: the flows of its whole parts, exactly; and a reject with its reason unless
    it ends where a datagram may end (zero padding of less than a set header after it is padding)."""
    whole = sum(flows for end, flows in units if end <= cut)
    assert out.flows.to_pylist() == alone[:whole], (context, out.flows.num_rows, whole)
    reasons = out.rejects.column("reason").to_pylist()
    assert all(reasons), context
    ends_cleanly = any(end <= cut < end + 4 and not any(sample[end:cut]) for end in clean)
    assert bool(reasons) != ends_cleanly, (context, reasons, ends_cleanly)
    assert not len(out.waiting), context


def _alone(payload: bytes):
    return decode(Datagrams.from_payloads([(T, BAD_EXPORTER, 5000, 2055, payload)]), FlowState(), source="s",
                  input_file="f")


def test_every_truncation_of_every_sample_is_a_reject_or_a_shorter_datagram():
    """Every cut of every sample is judged: the flows of its whole parts and nothing else, and a reject
    saying why unless what is left is a datagram that may end there; among good datagrams, too."""
    for which, sample in enumerate(SAMPLES):
        cuts = [sample[:k] for k in range(len(sample))]
        _check(_decode(cuts))
        units, clean = _units(which, sample)
        alone = _alone(sample).flows.to_pylist()
        for k, cut in enumerate(cuts):
            _judge_cut(sample, alone, k, units, clean, _alone(cut), f"sample {which} cut to {k} bytes")


def test_ipfix_cut_anywhere_with_a_message_length_that_agrees():
    """The message length patched to the cut, so the set and template walk itself meets the end: every cut
    counts the flows of the whole sets before it and rejects the rest, unless it ends after a whole set."""
    sample = SAMPLES[2]
    cuts = {k: sample[:2] + k.to_bytes(2, "big") + sample[4:k] for k in range(16, len(sample))}
    out = _check(_decode(list(cuts.values())))
    reasons = out.rejects.column("reason").to_pylist()
    assert any("claims" in r for r in reasons) and any("runs past the end" in r or "claims" in r for r in reasons)
    units, clean = _sets(sample, 16, _FLOWS_IN_SET[2])
    alone = _alone(sample).flows.to_pylist()
    for k, cut in cuts.items():
        _judge_cut(cut, alone, k, units, clean, _alone(cut), f"IPFIX cut to {k} bytes, length patched")


def _sets(sample: bytes, at: int, flows_in_set: dict) -> tuple[list[tuple[int, int]], list[int]]:
    """A v9/IPFIX sample's sets after its ``at``-byte header: where each ends and its flows; a datagram whose
    count or length does not judge its end may end after the header or any whole set."""
    units, clean = [], [at]
    while at + 4 <= len(sample):
        set_id, length = int.from_bytes(sample[at:at + 2], "big"), int.from_bytes(sample[at + 2:at + 4], "big")
        at += length
        units.append((at, flows_in_set.get(set_id, 0)))
        clean.append(at)
    return units, clean


@FUZZ
@given(st.sampled_from(range(len(SAMPLES))), st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)),
                                                       min_size=1, max_size=8))
def test_corrupted_bytes(which, changes):
    data = bytearray(SAMPLES[which])
    for at, value in changes:
        data[at % len(data)] = value
    _check(_decode([bytes(data)]))


@FUZZ
@given(st.sampled_from([b"\x00\x05", b"\x00\x09", b"\x00\x0a", b"\x00\x00\x00\x05", b""]), st.binary(max_size=300))
def test_random_bodies_after_each_version(version, body):
    _check(_decode([version + body]))


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 70000), st.integers(0, 70000)), max_size=6), st.binary(max_size=64),
       st.booleans())
def test_lying_set_headers(sets, filler, ipfix):
    """Set ids and lengths that are anything at all, before and after a good template and data set."""
    body = b"".join(set_id.to_bytes(4, "big")[2:] + length.to_bytes(4, "big")[2:] + filler for set_id, length in sets)
    good = [fe.template_set({256: V4}), fe.data_set(256, [fe.record(V4, fe.flow_values(A))])]
    if ipfix:
        payload = fe.ipfix(good, export_s=EXPORT_S)
        payload = fe.ipfix([payload[16:] + body], export_s=EXPORT_S)
    else:
        payload = fe.netflow9([fe.template_set({256: V9}, ipfix=False), body], export_s=EXPORT_S, uptime_ms=9)
    _check(_decode([payload]))


@FUZZ
@given(st.integers(0, 65535), st.lists(st.tuples(st.integers(0, 65535), st.integers(0, 65535)), max_size=5),
       st.integers(0, 65535), st.binary(max_size=80))
def test_lying_templates(template_id, fields, count, data):
    """Templates with any field count, ids and lengths (0, 65,535, enterprise bits), then data for them."""
    specifiers = b"".join(ie.to_bytes(2, "big") + length.to_bytes(2, "big") for ie, length in fields)
    template = template_id.to_bytes(2, "big") + count.to_bytes(2, "big") + specifiers
    for set_ids, wrap in (((2, 3), lambda sets: fe.ipfix(sets, export_s=EXPORT_S)),
                          ((0, 1), lambda sets: fe.netflow9(sets, export_s=EXPORT_S, uptime_ms=1))):
        for set_id in set_ids:
            sets = [fe.raw_set(set_id, template), fe.raw_set(max(template_id, 256), data)]
            _check(_decode([wrap(sets)]))


def test_hand_made_lies_say_why():
    cases = {
        "less than its own 4-byte header": fe.ipfix([b"\x01\x00\x00\x02"], export_s=EXPORT_S),
        "has no fields": fe.netflow9([fe.template_set({300: []}, ipfix=False)], export_s=EXPORT_S, uptime_ms=1),
        "declares 65535 fields": fe.ipfix([b"\x00\x02\x00\x0c\x01\x00\xff\xff\x00\x01\x00\x04"], export_s=EXPORT_S),
        "record count 31": fe.netflow5([A] * 31, export_us=T, uptime_ms=1),
        "says 1000 samples, it ends after 3": fe.sflow([])[:-4] + (1000).to_bytes(4, "big") + SAMPLES[3][28:],
        "is not the datagram's length": SAMPLES[2][:-1],
        "version field": b"\x00\x0b" + SAMPLES[2][2:],
    }
    out = _check(_decode(list(cases.values())))
    reasons = out.rejects.column("reason").to_pylist()
    for expected in cases:
        assert any(expected in reason for reason in reasons), (expected, reasons)


def test_padding_after_records_and_templates_is_no_reject():
    padded = fe.ipfix([fe.template_set({256: V4}) + bytes(0), fe.data_set(256, [fe.record(V4, fe.flow_values(A))],
                                                                           pad_to=16)], export_s=EXPORT_S)
    v9 = fe.netflow9([fe.template_set({256: V9}, ipfix=False), fe.data_set(256, [fe.record(V9, fe.flow_values(
        A, export_us=T, uptime_ms=5))], pad_to=8)], export_s=EXPORT_S, uptime_ms=5)
    out = _check(_decode([padded, v9]))
    assert out.rejects.num_rows == 0
    assert len([r for r in out.flows.to_pylist() if r["exporter"] == BAD_EXPORTER]) == 2


COLLECTOR_FILE = fe.collector_file([(T, GOOD_EXPORTER, 5000, payload) for payload in SAMPLES])
#: Where each sample's record ends in the collector file, and the flows of that sample's file alone.
_FILE_ENDS = [int(d.offset[i]) + int(d.length[i])
              for d in [udp_datagrams(COLLECTOR_FILE, input_file="f", source="s")[0]] for i in range(len(d))]
_FILE_FLOWS = [decode(udp_datagrams(fe.collector_file([(T, GOOD_EXPORTER, 5000, payload)]), input_file="f",
                                    source="s")[0], FlowState(), source="s", input_file="f").flows.to_pylist()
               for payload in SAMPLES]


def _file_outcome(capture: bytes):
    datagrams, file_rejects = udp_datagrams(capture, input_file="f", source="s")
    out = decode(datagrams, FlowState(), source="s", input_file="f")
    for row in file_rejects.to_pylist() + out.rejects.to_pylist():
        assert row["reason"] and len(row["reason"]) <= 512, row
    return out.flows.to_pylist(), file_rejects.num_rows + out.rejects.num_rows


@FUZZ
@given(st.binary(max_size=400), st.integers(0, 300))
def test_collector_files_cut_or_followed_by_garbage(garbage, cut):
    """Conservation: a collector file cut anywhere counts every flow of each datagram it still holds whole (and
    rejects the cut one with its reason); garbage after a whole file costs none of its flows; garbage alone
    counts nothing."""
    size = len(COLLECTOR_FILE) - cut
    flows, rejected = _file_outcome(COLLECTOR_FILE[:size])
    whole = [row for end, rows in zip(_FILE_ENDS, _FILE_FLOWS) if end <= size for row in rows]
    assert flows == whole, (cut, len(flows), len(whole))
    assert rejected or size in (*_FILE_ENDS, len(COLLECTOR_FILE)), f"cut {cut} bytes from the end: no reject"
    flows, _ = _file_outcome(COLLECTOR_FILE + garbage)
    assert flows == [row for rows in _FILE_FLOWS for row in rows]
    flows, rejected = _file_outcome(garbage)
    assert flows == [] and (rejected or not garbage)


# -- the real corpus's datagrams, mutated (issue 34: not only our encoder's) --------------------------

#: Seeded from the run (``FLOW_FUZZ_SEED`` to replay one); the seed is in every failure message.
SEED = int(os.environ.get("FLOW_FUZZ_SEED", random.SystemRandom().randrange(1 << 32)))
CORPUS_SOURCES = flowcaps.sources() if flowcaps.CORPUS.is_dir() else []
#: A missing corpus fails the tests that read it, with the reason (tests/support/requirements.py).
flowcaps_corpus = folder_fixture(flowcaps.CORPUS, "flowcaps_corpus")


def _corpus_datagrams(source: flowcaps.Source, folder) -> list[tuple]:
    """(receive_ts, exporter, src_port, dst_port, payload) of every datagram of a source, in order."""
    items = []
    for pcap in source.pcaps(folder / source.name):
        data = pcap.read_bytes()
        datagrams, _ = udp_datagrams(data, input_file=pcap.name, source="s")
        for i in range(len(datagrams)):
            at = int(datagrams.offset[i])
            items.append((int(datagrams.receive_ts[i]), datagrams.exporter[i], int(datagrams.src_port[i]),
                          int(datagrams.dst_port[i]), data[at:at + int(datagrams.length[i])]))
    return items


def _mutations(payload: bytes, rng: random.Random) -> list[tuple[str, bytes]]:
    """Bit flips, truncations, length-field edits and a duplication of one real datagram."""
    n = len(payload)
    out = []
    for _ in range(3):
        flipped = bytearray(payload)
        at = rng.randrange(n)
        flipped[at] ^= 1 << rng.randrange(8)
        out.append((f"bit flip at {at}", bytes(flipped)))
    cut = rng.randrange(n)
    out.append((f"truncated to {cut}", payload[:cut]))
    for at in (2, 16, 20, 22, 18) if n > 24 else ():  # header counts/lengths, first set id/length
        edited = bytearray(payload)
        edited[at:at + 2] = rng.randrange(65536).to_bytes(2, "big")
        out.append((f"16-bit field at {at} edited", bytes(edited)))
    out.append(("doubled", payload + payload))
    return out


def _accounted(out, numbers: set[int]) -> set[int]:
    """The datagram numbers the decoder said something about: a header read (``sequences``) or a reject."""
    said = {int(r["record"].split()[1]) for r in out.rejects.to_pylist() if r["record"].startswith("datagram ")}
    seq = out.sequences
    if seq.num_rows and "number" in seq.column_names:
        said |= {int(v) for v in seq.column("number").to_pylist() if v is not None}
    return said & numbers


@pytest.mark.usefixtures("flowcaps_corpus")
def test_real_datagrams_mutated_never_raise_and_never_touch_the_next_batch(tmp_path):
    """Every corpus datagram mutated: no exception; every mutated datagram is either read or rejected with its
    reason; and the source's intact datagrams, sent on in a later call with the state the mutated one left,
    are never blocked by it: none is rejected whole, and once the exporter has sent its datagrams again (so its
    templates and options again, as exporters do), they give exactly the flows they give without the mutation.

    (A well-formed but corrupted template is the exporter's word until it sends the template again: data that
    comes before its template in the stream, as in ``akvorado_nf_data+templates``, is read with the template
    known then. What the state must never do is outlive the exporter's next word.)"""
    rng = random.Random(SEED)
    tried = 0
    for source in CORPUS_SOURCES:
        intact = _corpus_datagrams(source, tmp_path)
        if not intact:
            continue
        resent = [(ts + _RESENT_US, *rest) for ts, *rest in intact]
        since = min(ts for ts, *_ in resent)
        expected = _flows_of_the_resent(decode(Datagrams.from_payloads(intact + resent), FlowState(), source="s",
                                               input_file="f"), since)
        for index in sorted(rng.sample(range(len(intact)), min(3, len(intact)))):
            ts, exporter, sport, dport, payload = intact[index]
            for what, mutated in _mutations(payload, rng):
                tried += 1
                context = f"seed {SEED}: {source.name} datagram {index} {what}"
                try:
                    out = decode(Datagrams.from_payloads([(ts, exporter, sport, dport, mutated)]), FlowState(),
                                 source="s", input_file="f")
                except Exception as error:  # noqa: BLE001 — the failure is the exception itself
                    raise AssertionError(f"{context}: raised {error!r}") from error
                for row in out.rejects.to_pylist():
                    assert row["reason"], context
                assert out.flows.num_rows or out.rejects.num_rows or out.sequences.num_rows or out.skipped \
                    or len(out.waiting), f"{context}: the datagram vanished (no flow, reject, header or skip)"
                later = decode(Datagrams.from_payloads(intact + resent), out.state, source="s", input_file="f")
                whole = [r["reason"] for r in later.rejects.to_pylist() if "could not decode datagram" in r["reason"]]
                assert not whole, f"{context}: the next batch is blocked: {whole}"
                assert _flows_of_the_resent(later, since) == expected, \
                    f"{context}: the next batch still decodes differently after the exporter sent everything again"
    assert tried > 100


#: How much later the exporter sends its datagrams again (receive time), in the recovery check above.
_RESENT_US = 86_400_000_000


def _flows_of_the_resent(out, since_us: int) -> list[dict]:
    """The flows of the second sending (received at ``since_us`` or later), in order."""
    flows = out.flows.filter(pc.greater_equal(pc.cast(out.flows.column("receive_ts"), pa.int64()), since_us))
    return flows.to_pylist()


def _ingest(harness, what: str) -> None:
    try:
        harness.ingest()
    except Exception as error:  # noqa: BLE001 — the failure is the exception itself; say how to replay it
        raise AssertionError(f"seed {SEED} (FLOW_FUZZ_SEED={SEED} replays it): ingest of {what} raised "
                             f"{str(error).splitlines()[-1][:600]!r}") from error


@pytest.mark.slow
@pytest.mark.usefixtures("flowcaps_corpus")
def test_mutated_corpus_datagrams_through_ingest_leave_the_next_batch_exact(spark, tmp_path):
    """Through the real ingest: each corpus source's batch 1 is a collector file of its datagrams mutated; batch 2
    its intact datagrams. Ingest never fails, every reject says why, and what batch 2's file counts for the
    source equals what the same file counts for a twin source that never saw the mutations."""
    from tests.integration.test_flowcaps_tshark import _settings
    from tests.support.harness import Harness

    rng = random.Random(SEED)
    names = {source.name: re.sub(r"[^A-Za-z0-9_.-]", "-", source.name) for source in CORPUS_SOURCES}
    harness = Harness(tmp_path / "lake", spark, **_settings([f"{side}-{n}" for n in names.values()
                                                             for side in ("fz", "ctl")]))
    intact_files = {}
    for source in CORPUS_SOURCES:
        intact = _corpus_datagrams(source, tmp_path / "wrapped")
        mutated = [(ts, exporter, sport, data) for index in sorted(rng.sample(range(len(intact)), min(3, len(intact))))
                   for ts, exporter, sport, _, payload in [intact[index]] for _, data in _mutations(payload, rng)]
        intact_files[source.name] = fe.collector_file([(ts, e, sport, payload) for ts, e, sport, _, payload in intact])
        (harness.settings.inbox / f"fz-{names[source.name]}").mkdir(parents=True)
        (harness.settings.inbox / f"fz-{names[source.name]}" / "1-mutated.flows.pcap").write_bytes(
            fe.collector_file(mutated))
    _ingest(harness, "batch 1 (mutated)")
    for source in CORPUS_SOURCES:
        for side in ("fz", "ctl"):
            folder = harness.settings.inbox / f"{side}-{names[source.name]}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "2-intact.flows.pcap").write_bytes(intact_files[source.name])
    _ingest(harness, "batch 2 (intact, after the mutated one)")
    totals: dict = {}
    for row in harness.table("packets") + harness.table("late_packets"):
        if row["input_file"].endswith("2-intact.flows.pcap"):
            pair = totals.setdefault(row["source"], {}).setdefault((row["local_ip"], row["remote_ip"]), [0, 0])
            pair[0] += row["bytes"]
            pair[1] += row["packets"] or 0
    assert all(row["reason"] for row in harness.table("rejects"))
    assert len([name for name in totals if name.startswith("ctl-")]) > len(names) // 2  # (the files did count)
    differ = {name: (totals.get(f"fz-{n}"), totals.get(f"ctl-{n}")) for name, n in names.items()
              if totals.get(f"fz-{n}") != totals.get(f"ctl-{n}")}
    assert not differ, f"seed {SEED}: batch 2 counts differently after mutated datagrams: {differ}"
