"""Capture benchmark: a generated N-packet pcap through our reader and ingest, beside tshark, in one run.

    .venv/bin/python bench/captures.py --packets 2000000 [--out docs/benchmarks-captures.md]

Times (1) ``traffic.io.capture.parse_capture`` alone, (2) the in-session Spark ingest of the
file into ``packets``, (3) ``tshark -q -z conv,ip`` on the same file (the peer the
performance issue names) and (4) tshark's per-packet fields, and checks that per
(local, remote) pair packet and byte totals are identical to tshark's per-packet fields.
"""

from __future__ import annotations

import argparse
import collections
import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LOCAL_NET = "10.0.0.0/8"
T0 = int(datetime(2026, 11, 1, tzinfo=timezone.utc).timestamp())


def generate_pcap(path: Path, packets: int, seed: int = 1) -> None:
    """Ethernet/IPv4/TCP headers only (snaplen 54), with IP lengths 40–1500 and ~3 hours of timestamps."""
    rng = np.random.default_rng(seed)
    record = np.dtype([("sec", "<u4"), ("usec", "<u4"), ("incl", "<u4"), ("orig", "<u4"),
                       ("eth", "S14"), ("ip", "u1", 20), ("tcp", "u1", 20)])
    rows = np.zeros(packets, dtype=record)
    micros = np.sort(rng.integers(0, 3 * 3600 * 1_000_000, packets))
    rows["sec"] = T0 + micros // 1_000_000
    rows["usec"] = micros % 1_000_000
    ip_len = rng.integers(40, 1501, packets).astype(np.uint16)
    rows["incl"] = 54
    rows["orig"] = ip_len.astype(np.uint32) + 14
    rows["eth"] = b"\x02\x00\x00\x00\x00\x01\x02\x00\x00\x00\x00\x02\x08\x00"
    local = (10 << 24) + rng.integers(1, 201, packets)  # 200 local hosts
    remote = (198 << 24) + (51 << 16) + (100 << 8) + rng.integers(1, 51, packets)  # 50 peers: ≤ 10,000 pairs
    outgoing = rng.random(packets) < 0.4
    src = np.where(outgoing, local, remote).astype(">u4")
    dst = np.where(outgoing, remote, local).astype(">u4")
    ip = rows["ip"]
    ip[:, 0] = 0x45
    ip[:, 2:4] = ip_len.astype(">u2").view(np.uint8).reshape(-1, 2)
    ip[:, 8] = 64
    ip[:, 9] = 6
    ip[:, 12:16] = src.view(np.uint8).reshape(-1, 4)
    ip[:, 16:20] = dst.view(np.uint8).reshape(-1, 4)
    tcp = rows["tcp"]
    tcp[:, 0:2] = rng.integers(1024, 65535, packets).astype(">u2").view(np.uint8).reshape(-1, 2)
    tcp[:, 2:4] = np.full(packets, 443, ">u2").view(np.uint8).reshape(-1, 2)
    tcp[:, 12] = 0x50
    header = np.array([0xA1B2C3D4, 0x00040002, 0, 0, 54, 1], dtype="<u4").tobytes()
    with open(path, "wb") as handle:
        handle.write(header)
        handle.write(rows.tobytes())


def orient(src: str, dst: str, size: int, totals: dict) -> None:
    network = ipaddress.ip_network(LOCAL_NET)
    if ipaddress.ip_address(src) in network:
        key = (src, dst)
    else:
        key = (dst, src)
    entry = totals.setdefault(key, [0, 0])
    entry[0] += 1
    entry[1] += size


def pair_totals(settings) -> dict:
    """Per (local, remote) [packets, bytes] of the warehouse's ``packets`` table, as tshark's are counted."""
    from traffic.storage.warehouse import Warehouse

    packets = Warehouse.reader(settings).table("packets").read_arrow(columns=["local_ip", "remote_ip", "bytes"])
    totals: dict = {}
    for local, remote, size in zip(*(packets.column(c).to_pylist() for c in ("local_ip", "remote_ip", "bytes"))):
        entry = totals.setdefault((local, remote), [0, 0])
        entry[0] += 1
        entry[1] += size
    return totals


def tshark_fields(path: Path) -> tuple[float, dict]:
    clock = time.perf_counter()
    out = subprocess.run(["tshark", "-n", "-r", str(path), "-T", "fields", "-E", "separator=\t",
                          "-E", "occurrence=f", "-e", "ip.src", "-e", "ip.dst", "-e", "ip.len"],
                         capture_output=True, text=True, check=True).stdout
    seconds = time.perf_counter() - clock
    totals: dict = {}
    for line in out.splitlines():
        src, dst, size = line.split("\t")
        orient(src, dst, int(size), totals)
    return seconds, totals


def tshark_conv(path: Path) -> tuple[float, dict]:
    clock = time.perf_counter()
    out = subprocess.run(["tshark", "-n", "-q", "-z", "conv,ip", "-r", str(path)],
                         capture_output=True, text=True, check=True).stdout
    seconds = time.perf_counter() - clock
    frames = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) > 8 and parts[1] == "<->":
            a, b = parts[0], parts[2]
            key = (a, b) if ipaddress.ip_address(a) in ipaddress.ip_network(LOCAL_NET) else (b, a)
            total_frames = int(parts[9].replace(",", ""))  # a <-> b, then frames/size/unit ×3
            frames[key] = frames.get(key, 0) + total_frames
    return seconds, frames


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packets", type=int, default=2_000_000)
    parser.add_argument("--out", help="markdown file to write the results to")
    args = parser.parse_args(argv)
    if not shutil.which("tshark"):
        print("tshark is required (apt-get install -y tshark)", file=sys.stderr)
        return 2
    os.environ["TZ"] = "UTC"
    from traffic.io.capture import parse_capture
    from traffic.app.runs import ingest
    from traffic.core.settings import load_settings
    from traffic.runtime.spark import build_spark

    work = Path(tempfile.mkdtemp(prefix="traffic-bench-cap-"))
    try:
        capture = work / "inbox" / "tap" / "bench.pcap"
        capture.parent.mkdir(parents=True)
        clock = time.perf_counter()
        generate_pcap(capture, args.packets)
        generated = time.perf_counter() - clock
        data = capture.read_bytes()
        clock = time.perf_counter()
        parsed = parse_capture(data, source="tap", input_file="bench.pcap", local_networks=[LOCAL_NET])
        parse_seconds = time.perf_counter() - clock
        settings = load_settings(environ={}, overrides={"warehouse": work / "warehouse", "inbox": work / "inbox",
                                                        "local_networks": LOCAL_NET, "now": "2026-11-02T00:00:00Z"})
        clock = time.perf_counter()
        spark = build_spark(settings.replace(spark_jit="full"), "traffic-bench-captures")
        session_seconds = time.perf_counter() - clock
        clock = time.perf_counter()
        result = ingest(settings, lambda: spark, lambda *_: None)
        ingest_seconds = time.perf_counter() - clock
        ours = pair_totals(settings)
        spark.stop()
        conv_seconds, conv_frames = tshark_conv(capture)
        fields_seconds, theirs = tshark_fields(capture)
        same_fields = ours == theirs
        same_frames = {k: v[0] for k, v in ours.items()} == conv_frames
        rows = [
            ("generate pcap (not counted)", f"{generated:.1f} s", ""),
            ("parse_capture alone (one core)", f"{parse_seconds:.2f} s", f"{args.packets / parse_seconds:,.0f} pkt/s"),
            ("Spark session start", f"{session_seconds:.1f} s", ""),
            ("ingest into packets (in-session)", f"{ingest_seconds:.1f} s", f"{args.packets / ingest_seconds:,.0f} pkt/s"),
            ("tshark -q -z conv,ip", f"{conv_seconds:.1f} s", f"{args.packets / conv_seconds:,.0f} pkt/s"),
            ("tshark -T fields ip.src/ip.dst/ip.len", f"{fields_seconds:.1f} s",
             f"{args.packets / fields_seconds:,.0f} pkt/s"),
        ]
        lines = [f"### Captures: {args.packets:,}-packet pcap ({capture.stat().st_size / 1e6:.0f} MB, "
                 f"snaplen 54), {datetime.now(timezone.utc):%Y-%m-%d}, {os.cpu_count()} cores", "",
                 "| step | time | rate |", "|---|---|---|"]
        lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
        lines += ["", f"* ingest vs `tshark -q -z conv,ip`: **{conv_seconds / ingest_seconds:.1f}×** "
                      f"(target ≥ 20×); parse alone vs conv,ip: **{conv_seconds / parse_seconds:.1f}×**",
                  f"* per-pair packets and bytes identical to tshark's per-packet fields: **{same_fields}**; "
                  f"per-pair frames identical to conv,ip: **{same_frames}** ({len(ours):,} pairs, "
                  f"{result.packets_on_time:,} packets ingested, {result.records_rejected} rejected)"]
        text = "\n".join(lines) + "\n"
        print(text)
        if args.out:
            Path(args.out).write_text(text)
        return 0 if same_fields and same_frames else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
