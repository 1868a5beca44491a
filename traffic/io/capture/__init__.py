"""Read pcap and pcapng captures into parsed packet rows, header fields gathered in bulk.

``parse_capture`` turns the bytes of one capture file into a table of
``traffic.core.records.PARSED_SCHEMA``: one ``packet`` row per IP packet and one ``reject`` row
per frame that cannot be accounted, so nothing is dropped silently. A capture never yields
clock ticks. It never raises on bad input: a truncated or corrupt file gives its good
packets plus ONE reject that names the byte offset and the reason; a file that is not a
capture at all is one reject.

How it is fast: one Python loop walks the record (pcap) or block (pcapng) headers to find
where each frame starts, because each header says where the next one is; everything else
(link-layer headers, IP headers, ports, orientation, text forms of addresses) is read with
numpy gathers over all frames at once, and addresses are turned into text once per distinct
address, not once per packet.

Formats: classic libpcap in both byte orders, microsecond (``a1b2c3d4``) and nanosecond
(``a1b23c4d``) variants, with the FCS length carried in the link-type field; pcapng with
several sections (each with its own byte order), several interfaces (each with its own
link type, ``if_tsresol`` as a power of 10 or of 2, ``if_tsoffset`` and ``if_fcslen``),
enhanced packet blocks and the obsolete packet block. Simple packet blocks carry no
timestamp, so each is rejected (accounting needs the time of every packet). Other block
types (name resolution, statistics, secrets, custom) are skipped: they carry no packets.

Link types: Ethernet (1) with any stack of 802.1Q (0x8100), 802.1ad QinQ (0x88a8) and old
QinQ (0x9100, 0x9200) tags, MPLS label stacks (0x8847, 0x8848: the payload is IP when its
first nibble is 4 or 6), PPPoE sessions (0x8864) carrying IPv4/IPv6, and Arista's
timestamp header (0xd28b, the versions tcpdump and Wireshark decode); Linux cooked
capture v1 (113) and v2 (276); raw IP (101, and 12/14, libpcap's DLT_RAW aliases; 228
IPv4 only; 229 IPv6 only); BSD null/loopback (0, a 4-byte address family in the writer's
host byte order) and OpenBSD loop (108, big-endian): family 2 is IPv4; 10, 24, 28 and 30
are IPv6 (Linux, NetBSD/OpenBSD, FreeBSD, macOS). Any other link type is rejected per
frame ("unsupported link type N").

What is counted, and the decisions on odd packets:

* ``bytes`` is the length of the IP packet as sent, from the IP header (IPv4 total length;
  IPv6 payload length + 40), not the captured length: a capture cut by its snapshot length
  still counts the whole packet.
* IPv6 jumbogram (payload length 0 and a Jumbo Payload option in the hop-by-hop header):
  the jumbo length + 40.
* IPv4 total length 0 (TSO/GSO/BIG TCP packets captured on the sending host before the NIC
  splits them), and IPv6 payload length 0 without a Jumbo Payload option (Linux BIG TCP
  no longer inserts the option) unless the next header is 59 (no next header, a genuine
  40-byte packet): the header does not know the length, so the length is taken from the
  packet record's *original* (wire) length minus the link-layer header and any FCS, never
  less than the IP header itself. Such an IPv4 packet may exceed 65,535 bytes (BIG TCP):
  it is counted as it is, up to ``records.MAX_BYTES_V4_GSO`` (524,280, Linux's GSO_MAX_SIZE);
  a longer one is rejected (what the packets suite accepts is all a capture can produce). A
  non-zero length field is trusted even when the frame is shorter or longer (Ethernet
  padding, truncation).
* Non-IP frames (ARP, AoE, TIPC, LLDP, 802.3/LLC, MPLS carrying Ethernet, an Arista
  header of an unknown version, …) are not IP traffic: each is rejected with a reason
  such as "not an IP packet (ethertype 0x88a2)".
* Tunnels (IP-in-IP, 6in4, GRE, VXLAN, ...) count the outer IP header only: that is what
  crossed the link. ESP and other protocols without ports have null ports.
* Ports for TCP (6), UDP (17) and SCTP (132) only; ICMP, ICMPv6 and anything else keep
  their protocol number with null ports. IPv6 extension headers (hop-by-hop 0, routing 43,
  fragment 44, destination options 60, AH 51) are walked to find the upper protocol.
  Non-first fragments (IPv4 fragment offset > 0, IPv6 fragment header offset > 0) carry no
  transport header: null ports, still counted with their own IP length. If the capture
  is cut inside the extension headers the protocol and ports are null; if it is cut
  inside the transport header the ports are null. A frame whose IP addresses were not
  captured is rejected (it cannot be attributed).
* Orientation from ``local_networks``: the local side is ``local_ip``; ``direction`` is
  ``out`` when the local side sent the packet, else ``in``. Both sides local: ``internal``
  with ``local_ip`` = the sender. Neither side local: a reject "neither address is in
  local_networks (src → dst)", or with ``keep_transit`` a packet with direction
  null (unknown: ``transit`` is no stored direction, DESIGN §6) and ``local_ip`` = the
  sender. With an empty ``local_networks`` every packet is neither-local (the caller warns
  about that).
* An IPv4-mapped IPv6 address (``::ffff:a.b.c.d``) is the IPv4 host it maps, as for text
  inputs (``records.canonical_ip``): it is stored as IPv4, matched against IPv4 networks
  and bounded by the IPv4 packet size (65,535). An IPv6 packet between a mapped and a plain
  IPv6 address is rejected (the two ends would be of different families).
* ``ts`` is UTC with microsecond precision: nanosecond (and finer) timestamps are rounded
  down. A timestamp outside 1970-01-01 .. 9999-12-31 is rejected.
* Reject rows carry ``kind``, ``source``, ``input_file``, ``reason`` and ``record``: the
  frame number (as Wireshark counts it), the byte offset of the frame in the file and a
  hex excerpt of its first 64 bytes; every other column is null.
* Rows come one per frame, in file order; a problem with the file itself (truncated,
  corrupt, not a capture) adds one last row whose ``record`` starts "byte offset N:".
  A pcap record longer than max(snapshot length, 262144) bytes is taken for corruption,
  as libpcap does; in pcapng, a block whose lengths disagree is.

Flow telemetry (DESIGN §7a): ``udp_datagrams`` walks the same frames of a collector file (or of
any capture of export traffic) and gives the UDP payloads with their receive time, exporter address
and ports, for ``traffic.io.flows``; ``ip_headers`` reads sFlow's sampled packet headers by the
rules above. Frames that are not UDP are skipped and counted there, not rejected.

docs/captures.md explains these choices for operators, with the real captures they were
checked on.

The package, by role (names with an underscore are the package's own, shared between its modules):
``frames`` (the frames of a file and their reason codes: what the others share), ``framing``
(pcap/pcapng files → frames), ``headers`` (link-layer and IP headers, ports, addresses), ``reasons``
(reject texts and rows), ``packets`` (``parse_capture``: frames → packet rows, oriented by
``traffic.io.orientation``) and ``udp`` (``udp_datagrams``, ``ip_headers``).
"""

from traffic.io.capture.packets import is_capture, parse_capture
from traffic.io.capture.udp import Datagrams, IpHeaders, ip_headers, udp_datagrams

__all__ = ["Datagrams", "IpHeaders", "ip_headers", "is_capture", "parse_capture", "udp_datagrams"]
