"""The real flow-export corpus through ingest, against tshark's decoding of the same files (issue 34).

Every source of ``../shared/flowcaps/`` (``tests/support/flowcaps.py`` says how the files are grouped
and the payloads wrapped) goes into its own inbox folder, configured as a telemetry source, and the
whole corpus is ingested in one batch into one warehouse. Per source and per (src, dst) pair, our
bytes and packets must equal tshark's flow records times the sampling rates the files themselves
carry. Every address is local, so each row's (local, remote) is the record's (src, dst): a biflow's or
an NSEL record's reverse direction is its own pair. Flow times span 2009–2025: history and future
bounds are wide, and so is the longest flow allowed.

A source that differs for a reason we chose is in ``KNOWN_DIFFERENCES`` (and docs/flows.md, "Against
tshark on the real corpus"); the test checks that each entry still differs, so a stale entry fails.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from tests.support import flowcaps as fc
from tests.support.harness import Harness
from tests.support.requirements import folder_fixture, tool_fixture

pytestmark = [
    pytest.mark.slow,
    # A missing corpus or tshark fails every test here, with the reason (tests/support/requirements.py).
    pytest.mark.usefixtures("flowcaps_corpus", "tshark_tool"),
]
flowcaps_corpus = folder_fixture(fc.CORPUS, "flowcaps_corpus")
tshark_tool = tool_fixture("tshark", "tshark_tool")

# (Without the corpus, one test stands for its sources: it fails on the fixture, where an empty list would skip.)
SOURCES = fc.sources() if fc.CORPUS.is_dir() else []

#: source -> why ours differs from tshark's reading, on purpose (docs/flows.md has the same table).
KNOWN_DIFFERENCES: dict[str, str] = {
    "netflow5_test_invalid01": "deliberately malformed (record count 55582): we reject the datagram, tshark decodes garbage",
    "netflow5_test_invalid02": "deliberately malformed (record count 163): we reject the datagram, tshark decodes garbage",
    "netflow9_test_nprobe_dpi": "flow times in 1970 (the exporter's uptime clock): rejected as too old, tshark counts them",
    "ipfix": "two IPFIX messages in one datagram: we reject the datagram (message length is not the datagram's), "
             "tshark reads both",
    "pmacct_112-IPFIXv10-CISCO-options-map-reassignment": "template 347 arrives from port 61853 to ::2:20, its data "
             "from port 65156 to ::2:2 (a new transport session): tshark scopes templates by session and decodes "
             "none, we scope them by exporter address and count 1197 bytes / 19 packets, as pmacct's own expected "
             "output does (test_pmacct_112_counts_as_pmacct_expects)",
}


def folder_name(source: fc.Source) -> str:
    """The inbox folder (= source name) of a corpus source."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", source.name)


def _settings(names: list[str]) -> dict:
    settings = {
        "telemetry_sources": ",".join(names),
        "local_networks": "0.0.0.0/0,::/0",  # every flow is internal: (local, remote) = (src, dst)
        "max_history": "7000d",  # the corpus spans 2009-2025
        "max_future_skew": "3650d",
        "allowed_lateness": "7000d",
    }
    try:  # (a setting being added with issue 34: the corpus has flows of any length)
        from traffic.core.settings import Settings
        if "max_flow_duration" in Settings.__dataclass_fields__:
            settings["max_flow_duration"] = "3650d"
    except ImportError:  # pragma: no cover
        pass
    return settings


@pytest.fixture(scope="module")
def corpus(spark, tmp_path_factory):
    """Every source ingested in one batch: (our totals per source, the batch result, the harness)."""
    root = tmp_path_factory.mktemp("flowcaps")
    names = [folder_name(s) for s in SOURCES]
    harness = Harness(root / "lake", spark, **_settings(names))
    for source, name in zip(SOURCES, names):
        folder = harness.settings.inbox / name
        folder.mkdir(parents=True, exist_ok=True)
        for number, pcap in enumerate(source.pcaps(root / "wrapped" / name)):
            (folder / f"{number:02d}-{pcap.name}").write_bytes(pcap.read_bytes())
    result = harness.ingest()
    ours: dict[str, dict] = {name: {} for name in names}
    for row in harness.table("packets") + harness.table("late_packets"):
        pair = (row["local_ip"], row["remote_ip"])
        totals = ours.setdefault(row["source"], {})
        b, p = totals.get(pair, (0, 0))
        totals[pair] = (b + row["bytes"], p + (row["packets"] or 0))
    rejects: dict[str, list] = {}
    for row in harness.table("rejects"):
        rejects.setdefault(row["source"], []).append(row["reason"])
    return {"ours": ours, "rejects": rejects, "result": result, "root": root}


@pytest.mark.parametrize("source", SOURCES or [None], ids=[s.name for s in SOURCES] or ["no-corpus"])
def test_each_source_counts_as_tshark_reads_it(source, corpus):
    name = folder_name(source)
    reading = fc.tshark_totals(source, corpus["root"] / "tshark")
    ours = corpus["ours"].get(name, {})
    diff = fc.differences(ours, reading.totals)
    if name in KNOWN_DIFFERENCES:
        assert diff, f"{name} now agrees with tshark: remove it from KNOWN_DIFFERENCES and docs/flows.md"
        return
    assert not diff, (f"{name}: (pair, ours, tshark×rate) that differ: {diff[:8]}; rates seen {reading.rates}; "
                      f"our rejects {sorted(set(corpus['rejects'].get(name, [])))[:5]}")


def test_known_differences_name_real_sources():
    assert set(KNOWN_DIFFERENCES) <= {folder_name(s) for s in SOURCES}


def test_the_reference_reads_every_v9_flowset(tmp_path):
    """softflowd's first datagram says count 1 and holds five flowsets, the options data setting rate 100 among
    them: tshark reads them all in the reference's copy, and the corpus file is not touched."""
    source = next(s for s in SOURCES if s.name == "graylog_netflow9")
    before = hashlib.sha256(source.files[0].read_bytes()).hexdigest()
    reading = fc.tshark_totals(source, tmp_path)
    assert reading.rates == {100: 21}, reading.rates  # 18 records with count as sent, at rate 1
    assert hashlib.sha256(source.files[0].read_bytes()).hexdigest() == before


def test_pmacct_112_counts_as_pmacct_expects(corpus):
    """The known difference above is ours against tshark; pmacct's expected output for the same capture is the
    other reader, and it agrees with us pair by pair."""
    name = "pmacct_112-IPFIXv10-CISCO-options-map-reassignment"
    expected: dict = {}
    with open(fc.CORPUS / "pmacct_expected" / f"{name[len('pmacct_'):]}.output-flow-00.json") as rows:
        for line in rows:
            row = json.loads(line)
            b, p = expected.get((row["ip_src"], row["ip_dst"]), (0, 0))
            expected[(row["ip_src"], row["ip_dst"])] = (b + row["bytes"], p + row["packets"])
    assert corpus["ours"][name] == expected == {("169.254.0.1", "169.254.0.0"): (1197, 19)}
