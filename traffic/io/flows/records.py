"""What a flow decode gives, and why a record is a reject: the tables' schemas, the formats, the reasons.

Shared by every module of ``traffic.io.flows``; it imports nothing of the package, so they all can.
"""

from __future__ import annotations

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")

FLOW_SCHEMA = pa.schema([
    ("receive_ts", TS), ("exporter", pa.string()), ("format", pa.string()), ("domain", pa.int64()),
    ("start_ts", TS), ("end_ts", TS),
    ("src_ip", pa.string()), ("dst_ip", pa.string()),
    ("src_port", pa.int32()), ("dst_port", pa.int32()), ("protocol", pa.int32()),
    ("bytes", pa.int64()), ("packets", pa.int64()),
    ("sampling_rate", pa.int64()),
])

SEQUENCE_SCHEMA = pa.schema([
    ("receive_ts", TS), ("exporter", pa.string()), ("format", pa.string()), ("domain", pa.int64()),
    ("sequence", pa.int64()), ("units", pa.int64()), ("export_ts", TS),
    # The exporter's uptime in ms (NetFlow v5/v9 sysUptime, sFlow's uptime; null for IPFIX, which has
    # none): an uptime that went back says the exporter restarted (``telemetry.judge_sequence``).
    ("uptime_ms", pa.int64()),
])

SFLOW5, NETFLOW5, NETFLOW9, IPFIX = "sflow5", "netflow5", "netflow9", "ipfix"
FORMATS = (SFLOW5, NETFLOW5, NETFLOW9, IPFIX)
FORMAT_CODE = {name: code for code, name in enumerate(FORMATS)}

#: Largest timestamp Spark and Delta can hold: 9999-12-31T23:59:59.999999Z, in µs.
MAX_TS_US = 253_402_300_799_999_999
INT64_MAX = (1 << 63) - 1

#: Why a record is a reject (``problem`` codes in the bulk columns).
P_TEMPLATE, P_NO_ADDRESS, P_NO_COUNT, P_COUNT_RANGE, P_TIME_RANGE, P_BACKWARDS, P_MIXED = 1, 2, 3, 4, 5, 6, 7
P_NO_PACKETS, P_PER_PACKET, P_SIBLING, P_SFLOW_FIELDS = 8, 9, 10, 11
PROBLEMS = {
    P_SFLOW_FIELDS: "sFlow sampled IP record with a protocol above 255 or a port above 65535",
    P_NO_ADDRESS: "record has no source and destination address (fields 8/12 or 27/28)",
    P_NO_COUNT: "record has no byte count (fields 1 or 85, NSEL 231/232, RFC 5103 reverse 1 or 85)",
    P_COUNT_RANGE: "byte or packet count above 2**63 - 1",
    P_NO_PACKETS: "record says {bytes} bytes in 0 packets",
    P_PER_PACKET: ("record says {bytes} bytes in {packets} packets: more per packet than an IP packet can carry "
                   "({limit})"),
    P_TIME_RANGE: "flow time outside 1970-01-01 .. 9999-12-31",
    P_MIXED: ("record between an IPv4-mapped address and a plain IPv6 one: stored as IPv4 and IPv6, the two "
              "ends would be of different families"),
}

#: Why a record's own sampling fields cannot be used (``problem`` codes, beside those above).
P_RATE_RANGE, P_RATE_UNUSABLE = 20, 21
PROBLEMS.update({
    P_RATE_RANGE: "sampling rate above 2**31 - 1",
    P_RATE_UNUSABLE: ("sampling fields give no usable rate (a packet interval of 0, a population below its sample "
                      "size, a probability outside 0 < p <= 1)"),
})
