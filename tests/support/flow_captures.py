"""The shared real captures as the flow-tool checks use them: which captures each exporter reads,
what it counts of each frame, and the captures merged into one file per exporter with tshark's
reading of every frame (``tests/integration/test_flow_tools.py`` explains the choices)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.support import flow_tools as ft

SHARED_CAPTURES = Path(__file__).resolve().parents[3] / "shared" / "captures"

#: Ethernet captures per exporter, each with the count its bytes follow (module docstring).
SOFTFLOWD_ETHERNET = {
    "802.1ad_QinQ.pcap": "ip",
    "AoE_Linux.pcap": "ip",  # no IP at all: no flows on either side
    "OSPFv2_Capture_FINAL.pcapng": "wire",
    "afs.pcap": "ip",
    "bigtcp-ipv4.pcap": "ip",  # IPv4 length 0: softflowd and tshark both use the frame
    "dnssec.pcap": "ip",
    "edns-opts.pcap": "ip",
    "gso-ipv4.pcap": "ip",
    "gso-ipv6.pcap": "ip",
    "huge-tipc-messages.pcap": "ip",
    "ipv6_jumbogram_1.pcap": "ip",
    "mptcp-v0.pcap": "ip",
    "nfs-seg-fault-1.pcapng": "ip",
    "ntp-control.pcap": "ip",
    "of13_ericsson.pcapng": "ip",
    "pim-packet-assortment.pcap": "ip",
    "ssh.pcap": "ip",
}
#: Other link types, each exported on its own (raw IP, Linux SLL).
SOFTFLOWD_OTHER = ["LINKTYPE_RAW_ipv4.pcap", "LINKTYPE_RAW_ipv6.pcap", "mptcp-v1.pcap"]
NFPROBE_ETHERNET = {
    "AoE_Linux.pcap": "ip",
    "OSPFv2_Capture_FINAL.pcapng": "ip",  # pmacct counts the IP length: the trailer is not counted
    "afs.pcap": "ip",
    "dnssec.pcap": "ip",
    "edns-opts.pcap": "ip",
    "gso-ipv4.pcap": "ip",
    "gso-ipv6.pcap": "ip",
    "huge-tipc-messages.pcap": "ip",
    "mptcp-v0.pcap": "ip",
    "nfs-seg-fault-1.pcapng": "ip",
    "ntp-control.pcap": "ip",
    "of13_ericsson.pcapng": "ip",
    "ssh.pcap": "ip",
}
SFPROBE_ETHERNET = {
    "802.1ad_QinQ.pcap": "sflow",
    "AoE_Linux.pcap": "sflow",
    "OSPFv2_Capture_FINAL.pcapng": "sflow",
    "afs.pcap": "sflow",
    "dnssec.pcap": "sflow-nomac",
    "edns-opts.pcap": "sflow",
    "gso-ipv4.pcap": "sflow",
    "gso-ipv6.pcap": "sflow",
    "huge-tipc-messages.pcap": "sflow",
    "mptcp-v0.pcap": "sflow",
    "nfs-seg-fault-1.pcapng": "sflow",
    "ntp-control.pcap": "sflow-nomac",
    "of13_ericsson.pcapng": "sflow-nomac",
    "ssh.pcap": "sflow",
}
#: Bytes counted per frame, as an offset from its wire length, per rule ("ip" counts the IP length).
FRAME_OFFSET = {"wire": -14, "sflow": 4, "sflow-nomac": -14 + 4}


class Merged:
    """Captures concatenated into one file, with tshark's frames of each (one tshark run for all)."""

    def __init__(self, captures: dict[str, str], path: Path):
        self.captures = captures
        self.path = ft.merge_captures([SHARED_CAPTURES / name for name in captures], path, concatenate=True)
        frames = ft.tshark_packets(self.path)
        self.packets: dict[str, list] = {}
        for name in captures:
            count = ft.frame_count(SHARED_CAPTURES / name)
            self.packets[name], frames = frames[:count], frames[count:]
        assert frames == [], f"{path.name}: {len(frames)} frames more than its captures hold"

    def ip_totals(self) -> dict[tuple[str, str], tuple[int, int]]:
        """Σ over the captures of their per-pair IP-length totals, whatever the exporter counts."""
        octets: Counter = Counter()
        packets: Counter = Counter()
        for name in self.captures:
            for key, (b, p) in ft.totals_of(self.packets[name]).items():
                octets[key] += b
                packets[key] += p
        return {key: (octets[key], packets[key]) for key in octets}

    def expected(self, *, ipv4_only: bool = False) -> dict[tuple[str, str], tuple[int, int]]:
        """Σ over the captures of their per-pair totals, each counted by its rule."""
        octets: Counter = Counter()
        packets: Counter = Counter()
        for name, rule in self.captures.items():
            if rule == "ip":
                totals = ft.totals_of(self.packets[name])
            else:
                totals = ft.totals_of(self.packets[name], length="frame", offset=FRAME_OFFSET[rule])
            for key, (b, p) in totals.items():
                octets[key] += b
                packets[key] += p
        return {key: (octets[key], packets[key]) for key in octets if not (ipv4_only and ":" in key[0])}


def differences(got: dict, expected: dict) -> list:
    return [(key, got.get(key), expected.get(key)) for key in sorted(set(got) | set(expected))
            if got.get(key) != expected.get(key)]


def merger(folder: Path):
    """``get(name, captures)``: the captures merged into ``folder/<name>.pcap``, built once, on first use."""
    built: dict[str, Merged] = {}

    def get(name: str, captures: dict[str, str]) -> Merged:
        if name not in built:
            built[name] = Merged(captures, folder / f"{name}.pcap")
        return built[name]

    return get
