"""How fast flow telemetry decodes: NetFlow v5 and IPFIX collector files, read and decoded in one process.

Run: ``.venv/bin/python bench/flows_decode.py [--records 2000000]``. Builds one collector file per
protocol (NetFlow v5: 30 records a datagram; IPFIX: one fixed-length template of 11 fields, 28 records
a datagram; sources from ``--hosts`` addresses, 65,536 by default, destinations from 4,096), then times ``udp_datagrams`` (finding the datagrams in the pcap) and ``decode`` (records
to flow rows) and prints records per second for each and for both together.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import flow_encoder as fe  # noqa: E402
from traffic.io.capture import udp_datagrams  # noqa: E402
from traffic.io.flows import FlowState, decode  # noqa: E402

T = 1_800_000_000_000_000
IPFIX_TEMPLATE = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (6, 1), (1, 8), (2, 8), (152, 8), (153, 8), (10, 4)]


#: How many distinct source addresses the flows come from (``--hosts``); destinations: 4,096.
HOSTS = [65_536]


def _flows(count: int, offset: int) -> list[fe.Flow]:
    flows = []
    for i in range(count):
        host, peer = (offset + i) % HOSTS[0], (offset + i) * 7 % 4096
        flows.append(fe.Flow(f"10.{host >> 16 & 255}.{host >> 8 & 255}.{host & 255}",
                             f"198.{18 + (peer >> 8 & 1)}.{peer >> 1 & 127}.{peer & 255}", 1024 + i, 443, 6,
                             1500 + i, 2 + i % 7, T - 60_000_000 + i, T - i))
    return flows


def netflow5_file(records: int) -> bytes:
    """A collector file of ``records`` NetFlow v5 records, 30 a datagram, from 8 exporters."""
    datagrams, sent = [], 0
    while sent < records:
        count = min(30, records - sent)
        payload = fe.netflow5(_flows(count, sent), export_us=T, uptime_ms=86_400_000, sequence=sent,
                              sampling_interval=100)
        datagrams.append((T + sent, f"192.0.2.{sent // 30 % 8 + 1}", 5000, payload))
        sent += count
    return fe.collector_file(datagrams)


def ipfix_file(records: int) -> bytes:
    """A collector file of ``records`` IPFIX records (one template, sent with every 20th message)."""
    datagrams, sent, message = [], 0, 0
    template = fe.template_set({256: IPFIX_TEMPLATE})
    while sent < records:
        count = min(28, records - sent)
        data = fe.data_set(256, [fe.record(IPFIX_TEMPLATE, fe.flow_values(f)) for f in _flows(count, sent)])
        sets = [template, data] if message % 20 == 0 else [data]
        datagrams.append((T + sent, "192.0.2.1", 5000, fe.ipfix(sets, export_s=T // 1_000_000, sequence=sent)))
        sent += count
        message += 1
    return fe.collector_file(datagrams)


def measure(name: str, data: bytes, records: int) -> None:
    began = time.perf_counter()
    datagrams, rejects = udp_datagrams(data, input_file=name, source="bench")
    found = time.perf_counter()
    decoded = decode(datagrams, FlowState(), source="bench", input_file=name)
    done = time.perf_counter()
    assert rejects.num_rows == 0 and decoded.rejects.num_rows == 0 and decoded.flows.num_rows == records, name
    print(f"{name:9} {records:>10,} records in {len(datagrams):>7,} datagrams ({len(data) / 1e6:6.1f} MB): "
          f"udp_datagrams {found - began:5.2f} s, decode {done - found:5.2f} s → "
          f"{records / (done - began) / 1e6:5.2f} M records/s ({records / (done - found) / 1e6:5.2f} M/s decode alone)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--hosts", type=int, default=HOSTS[0],
                        help="distinct source addresses (each distinct address is made text once)")
    args = parser.parse_args(argv)
    HOSTS[0] = args.hosts
    for name, build in (("netflow5", netflow5_file), ("ipfix", ipfix_file)):
        data = build(args.records)
        measure(name, data, args.records)


if __name__ == "__main__":
    main()
