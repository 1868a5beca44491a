"""Cross-check the capture reader against tshark (Wireshark's dissectors), an independent reader.

For each capture, tshark's outermost IP header of every frame is oriented with the same
``local_networks`` and summed per (local_ip, remote_ip); the reader's packets must give the
same bytes and packet counts, and the frames tshark finds no IP header in must be exactly
the frames the reader rejects.

Where the two disagree on purpose, the expected value is adjusted or the frame excluded,
each for a stated reason (see also docs/captures.md):

* IPv6 jumbogram (payload length 0, Jumbo Payload option): tshark's ``ipv6.plen`` is 0; the
  reader counts the jumbo length + 40, so the expectation uses tshark's ``ipv6.opt.jumbo``
  + 40 (an agreement, not an exclusion).
* IPv6 payload length 0 *without* a Jumbo Payload option and a next header other than 59
  (Linux BIG TCP captured before segmentation): tshark reports 0 (40 bytes); the reader
  counts the wire frame minus the link header. These frames are excluded.
* IPv4 total length 0 (TSO/GSO/BIG TCP): tshark itself falls back to the frame's length,
  as the reader does, so these frames are compared as they are.
* Non-IP frames (ARP, AoE, TIPC, unknown Arista header versions, ...): tshark has no IP
  fields for them and the reader rejects them; the test asserts the two sets of frames
  are the same.

tshark is required: install it with ``apt-get install tshark`` (Debian package).
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.support import capture_factory as cf
from traffic.io.capture import parse_capture

pytestmark = pytest.mark.slow

SHARED_CAPTURES = Path(__file__).resolve().parents[3] / "shared" / "captures"

#: Local networks for the shared captures: their private, loopback and documentation
#: ranges, so most traffic is oriented and the rest is transit (kept, to compare it too).
LOCAL = [
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "127.0.0.0/8",
    "131.151.32.0/24",
    "::1/128",
    "2001:db8::/32",
    "2200::/16",
]

FIELDS = [
    "frame.number",
    "frame.protocols",
    "ip.src",
    "ip.dst",
    "ip.len",
    "ipv6.src",
    "ipv6.dst",
    "ipv6.plen",
    "ipv6.nxt",
    "ipv6.opt.jumbo",
]


def tshark() -> str:
    path = shutil.which("tshark")
    if path is None:
        pytest.fail(
            "tshark is not installed: the capture reader is cross-checked against it. "
            "Install it with: sudo DEBIAN_FRONTEND=noninteractive apt-get install -y tshark"
        )
    return path


def tshark_frames(path: Path) -> dict[int, tuple[str, str, int] | None]:
    """Frame number → (src, dst, IP length) of its outermost IP header, or None (no IP)."""
    command = [tshark(), "-n", "-r", str(path), "-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"]
    for name in FIELDS:
        command += ["-e", name]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120).stdout
    frames: dict[int, tuple[str, str, int] | None] = {}
    for line in out.splitlines():
        values = dict(zip(FIELDS, line.split("\t")))
        number = int(values["frame.number"])
        layers = values["frame.protocols"].split(":")
        v4 = layers.index("ip") if "ip" in layers else len(layers)
        v6 = layers.index("ipv6") if "ipv6" in layers else len(layers)
        if v4 == v6:  # neither
            frames[number] = None
        elif v4 < v6:
            frames[number] = (values["ip.src"], values["ip.dst"], int(values["ip.len"]))
        else:
            plen = int(values["ipv6.plen"])
            if plen == 0 and values["ipv6.opt.jumbo"]:
                size = int(values["ipv6.opt.jumbo"]) + 40
            elif plen == 0 and values["ipv6.nxt"] != "59":
                size = -1  # BIG TCP without the option: excluded, see the module docstring
            else:
                size = plen + 40
            frames[number] = (values["ipv6.src"], values["ipv6.dst"], size)
    return frames


def orient(src: str, dst: str, networks) -> tuple[str, str]:
    """(local, remote) as the contract says, computed independently of the reader."""
    a, b = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    a_local = any(a.version == n.version and a in n for n in networks)
    b_local = any(b.version == n.version and b in n for n in networks)
    if b_local and not a_local:
        return str(b), str(a)
    return str(a), str(b)


def compare_with_tshark(path: Path, local: list[str]) -> None:
    networks = [ipaddress.ip_network(n) for n in local]
    expected_frames = tshark_frames(path)
    excluded = {n for n, f in expected_frames.items() if f is not None and f[2] < 0}
    rows = parse_capture(
        path.read_bytes(), source="s", input_file=path.name, local_networks=local, keep_transit=True
    ).to_pylist()
    # one row per frame, in file order, then possibly one row about the file itself
    assert len(rows) >= len(expected_frames), (len(rows), len(expected_frames))
    file_problems = rows[len(expected_frames) :]
    assert file_problems == [], f"{path.name}: the file itself was rejected: {file_problems}"

    expected, got = Counter(), Counter()
    expected_packets, got_packets = Counter(), Counter()
    expected_non_ip, got_rejected, mismatches = set(), set(), []
    for number, frame in expected_frames.items():
        row = rows[number - 1]
        if number in excluded:
            continue
        if frame is None:
            expected_non_ip.add(number)
        else:
            key = orient(frame[0], frame[1], networks)
            expected[key] += frame[2]
            expected_packets[key] += 1
        if row["kind"] == "reject":
            got_rejected.add(number)
        else:
            key = (row["local_ip"], row["remote_ip"])
            got[key] += row["bytes"]
            got_packets[key] += 1
            if frame is not None and (orient(frame[0], frame[1], networks), frame[2]) != (key, row["bytes"]):
                mismatches.append((number, frame, key, row["bytes"]))
    detail = f"{path.name}: first differing frames (number, tshark, reader key, reader bytes): {mismatches[:5]}"
    assert got_rejected == expected_non_ip, (
        f"{path.name}: frames rejected by the reader {sorted(got_rejected - expected_non_ip)[:10]} "
        f"have IP per tshark; frames without IP per tshark but accepted {sorted(expected_non_ip - got_rejected)[:10]}; "
        f"reasons: {[rows[n - 1]['reason'] for n in sorted(got_rejected - expected_non_ip)[:3]]}"
    )
    assert got == expected, detail
    assert got_packets == expected_packets, detail


def shared_captures() -> list[Path]:
    if not SHARED_CAPTURES.is_dir():
        return []
    return sorted(p for p in SHARED_CAPTURES.iterdir() if p.suffix in (".pcap", ".pcapng"))


@pytest.mark.skipif(
    not SHARED_CAPTURES.is_dir(),
    reason=f"{SHARED_CAPTURES} does not exist (a fresh clone); the generated captures below cover the same ground",
)
@pytest.mark.parametrize("path", shared_captures(), ids=lambda p: p.name)
def test_shared_captures_agree_with_tshark(path):
    compare_with_tshark(path, LOCAL)


# --- generated captures -------------------------------------------------------------------

T0 = 1_700_000_000 * 1_000_000_000


def mixed_traffic() -> list[bytes]:
    """IP packets of every shape the reader must handle, across local, remote and transit pairs."""
    remote, remote6 = "93.184.216.34", "2606:4700::1111"
    return [
        cf.ipv4("10.0.0.1", remote, 6, cf.tcp(40000, 443, bytes(100))),
        cf.ipv4(remote, "10.0.0.1", 6, cf.tcp(443, 40000, bytes(1400))),
        cf.ipv4("10.0.0.2", "10.0.0.1", 17, cf.udp(5353, 53, bytes(30))),
        cf.ipv4("8.8.8.8", "1.1.1.1", 17, cf.udp(53, 53, bytes(60))),
        cf.ipv4("10.0.0.3", remote, 1, cf.icmp()),
        cf.ipv4(remote, "10.0.0.7", 17, cf.udp(53, 5000, bytes(1472))[:1480], more_fragments=True),
        cf.ipv4(remote, "10.0.0.7", 17, bytes(500), fragment_offset=1480),
        cf.ipv4("10.0.0.1", "192.0.2.1", 4, cf.ipv4("172.16.0.1", "172.16.0.2", 6, cf.tcp(1, 2, bytes(10)))),
        cf.ipv4("10.0.0.1", "192.0.2.9", 132, cf.sctp(3868, 3868, bytes(16))),
        cf.ipv6("2001:db8::1", remote6, 17, cf.udp(50000, 53, bytes(20))),
        cf.ipv6(remote6, "2001:db8::1", 6, cf.tcp(443, 50000, bytes(1200))),
        cf.ipv6("2001:db8::1", remote6, 6, cf.tcp(1, 443), extensions=[cf.hop_by_hop(), cf.routing(2), cf.destination_options(bytes(10))]),
        cf.ipv6("2001:db8::1", remote6, 17, cf.udp(500, 4500, bytes(12)), extensions=[cf.authentication()]),
        cf.ipv6("2001:db8::1", remote6, 17, cf.udp(53, 53, bytes(100)), extensions=[cf.fragment(0, more=True)]),
        cf.ipv6("2001:db8::1", remote6, 17, bytes(64), extensions=[cf.fragment(1232)]),
        cf.ipv6("2001:db8::2", "2001:db8::1", 58, cf.icmp()),
        cf.ipv6("fe80::1", "ff02::1", 58, cf.icmp()),
    ]


def stamped(frames: list[bytes]) -> list[cf.Packet]:
    return [cf.Packet(f, T0 + i * 1_000_123) for i, f in enumerate(frames)]


def ethertype_framed(p: bytes) -> bytes:
    return cf.ethernet(p, cf.ethertype_of(p))


def generated_captures() -> dict[str, bytes]:
    traffic = mixed_traffic()
    family = lambda p, v6: 2 if p[0] >> 4 == 4 else v6  # noqa: E731
    payload_len_zero = cf.ipv6("2001:db8::1", "2606:4700::1111", 6, cf.tcp(1, 2, bytes(100_000)), payload_length=0)
    jumbo_payload = cf.tcp(1, 2, bytes(70_000))
    jumbogram = cf.ipv6(
        "2001:db8::1", "2606:4700::1111", 6, jumbo_payload,
        extensions=[cf.hop_by_hop(cf.jumbo_option(8 + len(jumbo_payload)))], payload_length=0,
    )
    big_tcp_v4 = cf.ipv4("10.0.0.1", "10.0.0.2", 6, cf.tcp(1, 2, bytes(80_000)), total_length=0)
    odd = [
        cf.ethernet(cf.ARP, 0x0806),
        cf.ethernet(cf.ARP, 0x0806, vlans=[(0x88A8, 10), (0x8100, 20)]),
        cf.ethernet(b"\x10\x00" + bytes(40), 0x88A2),
        cf.ethernet(jumbogram, 0x86DD),
        cf.ethernet(payload_len_zero, 0x86DD),
        cf.ethernet(big_tcp_v4),
    ]
    return {
        "ethernet_us_le.pcap": cf.pcap(stamped([ethertype_framed(p) for p in traffic])),
        "ethernet_ns_be.pcap": cf.pcap(stamped([ethertype_framed(p) for p in traffic]), nanos=True, big_endian=True),
        "vlan_qinq.pcap": cf.pcap(stamped(
            [cf.ethernet(p, cf.ethertype_of(p), vlans=[(0x8100, 7)]) for p in traffic]
            + [cf.ethernet(p, cf.ethertype_of(p), vlans=[(0x88A8, 1), (0x8100, 2)]) for p in traffic]
            + [cf.ethernet(p, cf.ethertype_of(p), vlans=[(0x9100, 1), (0x8100, 2)]) for p in traffic]
        )),
        "mpls_pppoe.pcap": cf.pcap(stamped(
            [cf.ethernet(cf.mpls(p, [16, 17]), 0x8847) for p in traffic]
            + [cf.ethernet(cf.pppoe(p, 0x0021 if p[0] >> 4 == 4 else 0x0057), 0x8864) for p in traffic]
        )),
        "snaplen_64.pcap": cf.pcap(stamped([ethertype_framed(p) for p in traffic]), snaplen=64),
        "oddities.pcap": cf.pcap(stamped(odd), snaplen=256),
        "sll.pcap": cf.pcap(stamped([cf.linux_sll(p, cf.ethertype_of(p)) for p in traffic]), 113),
        "sll2.pcap": cf.pcap(stamped([cf.linux_sll2(p, cf.ethertype_of(p)) for p in traffic]), 276),
        "raw101.pcap": cf.pcap(stamped(traffic), 101),
        "raw14.pcap": cf.pcap(stamped(traffic), 14),
        "ipv4_228.pcap": cf.pcap(stamped([p for p in traffic if p[0] >> 4 == 4]), 228),
        "ipv6_229.pcap": cf.pcap(stamped([p for p in traffic if p[0] >> 4 == 6]), 229),
        "null_le.pcap": cf.pcap(stamped([cf.null_loopback(p, family(p, 30), "<") for p in traffic]), 0),
        "null_be.pcap": cf.pcap(stamped([cf.null_loopback(p, family(p, 28), ">") for p in traffic]), 0),
        "loop108.pcap": cf.pcap(stamped([cf.openbsd_loop(p, family(p, 24)) for p in traffic]), 108),
        "interfaces.pcapng": cf.pcapng(
            cf.Section(
                [cf.Interface(1), cf.Interface(101, tsresol=9), cf.Interface(113, tsresol=0x80 | 20)],
                [cf.Enhanced(i % 3, cf.Packet(
                    [ethertype_framed(p), p, cf.linux_sll(p, cf.ethertype_of(p))][i % 3], T0 + i * 1_000_123))
                 for i, p in enumerate(traffic)],
            ),
            cf.Section(
                [cf.Interface(229, tsresol=3), cf.Interface(1)],
                [cf.Enhanced(0, cf.Packet(p, T0)) for p in traffic if p[0] >> 4 == 6]
                + [cf.Enhanced(1, cf.Packet(f, T0)) for f in odd],
                big_endian=True,
            ),
        ),
    }


GENERATED = generated_captures()


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_generated_captures_agree_with_tshark(name, tmp_path):
    path = tmp_path / name
    path.write_bytes(GENERATED[name])
    compare_with_tshark(path, ["10.0.0.0/8", "2001:db8::/32"])


def test_the_excluded_frames_are_only_the_documented_ones(tmp_path):
    """The one exclusion (IPv6 payload length 0 without a Jumbo option) really happens, once."""
    path = tmp_path / "oddities.pcap"
    path.write_bytes(GENERATED["oddities.pcap"])
    frames = tshark_frames(path)
    assert [n for n, f in frames.items() if f is not None and f[2] < 0] == [5]
    row = parse_capture(path.read_bytes(), source="s", input_file=path.name, local_networks=["2001:db8::/32"]).to_pylist()[4]
    assert row["bytes"] == 14 + 40 + 20 + 100_000 - 14  # the wire frame minus its Ethernet header
