"""How many datagrams a second ``traffic collect`` takes on loopback without losing one.

    .venv/bin/python bench/collect_rate.py [--rate 50000] [--seconds 10] [--size 300] [--rcvbuf 32M] [--json FILE]

Starts ``traffic collect`` in its own process on a free 127.0.0.1 port, sends ``--rate`` datagrams
a second of ``--size`` bytes for ``--seconds`` from another process (paced every millisecond; each
datagram carries its sequence number), stops the collector with SIGTERM and reports: datagrams
sent, received (the collector's count), written (records read back from its files, each sequence
number once), the kernel's drops and the collector's CPU time. Exit 1 when anything sent is not
in the files exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.flow_tools import free_udp_port  # noqa: E402
from traffic.io.capture import udp_datagrams  # noqa: E402

_SEQ = struct.Struct("!Q")


def send(port: int, rate: int, seconds: float, size: int) -> None:
    """Send ``rate`` datagrams a second for ``seconds``, paced each millisecond; print what was sent."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect(("127.0.0.1", port))
    filler = os.urandom(max(0, size - _SEQ.size))
    total, sent, pack, started = int(rate * seconds), 0, _SEQ.pack, time.perf_counter()
    while sent < total:
        due = min(total, int((time.perf_counter() - started) * rate) + 1)
        while sent < due:
            try:
                sock.send(pack(sent) + filler)
            except BlockingIOError:
                time.sleep(0.0001)
                continue
            sent += 1
        time.sleep(0.001)
    print(json.dumps({"sent": sent, "seconds": time.perf_counter() - started}), flush=True)


def read_records(path: Path) -> list[bytes]:
    """The UDP payloads of a collector file, read as ingest reads them."""
    datagrams, _ = udp_datagrams(path.read_bytes(), input_file=path.name, source="bench")
    return [datagrams.payload(i) for i in range(len(datagrams))]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(rate: int, seconds: float, size: int, rcvbuf: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="collect-rate-") as tmp:
        inbox, status, port = Path(tmp) / "inbox", Path(tmp) / "status.json", free_udp_port()
        collector = subprocess.Popen(
            [sys.executable, "-m", "traffic.app.cli", "collect", "--inbox", str(inbox), "--listen", f"127.0.0.1:{port}",
             "--status", str(status), "--status-every", "0.5", "--log-every", "0", "--rcvbuf", rcvbuf],
            cwd=ROOT, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not status.exists():
                if collector.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"collector did not start: {collector.stderr.read()}")
                time.sleep(0.05)
            granted = json.loads(status.read_text())["listen"][0]["rcvbuf"]
            sender = subprocess.run([sys.executable, __file__, "--send", str(port), "--rate", str(rate),
                                     "--seconds", str(seconds), "--size", str(size)],
                                    capture_output=True, text=True, check=True)
            sent = json.loads(sender.stdout)
            previous, settle = -1, time.monotonic() + 30
            while time.monotonic() < settle:  # until the collector's count stops moving
                time.sleep(1.0)
                received = json.loads(status.read_text())["datagrams"]
                if received == previous or received >= sent["sent"]:
                    break
                previous = received
            cpu = cpu_seconds(collector.pid)
        finally:
            collector.send_signal(signal.SIGTERM)
            code = collector.wait(timeout=60)
            log = collector.stderr.read()
        final = json.loads(status.read_text())
        files = sorted(inbox.rglob("*.pcap"))
        seqs = [_SEQ.unpack_from(p)[0] for f in files for p in read_records(f)]
        return {"rate_asked": rate, "seconds": seconds, "size": size, "rcvbuf_granted": granted,
                "sent": sent["sent"], "send_rate": round(sent["sent"] / sent["seconds"]),
                "received": final["datagrams"], "written": len(seqs), "distinct_written": len(set(seqs)),
                "kernel_drops": final["kernel_drops"], "files": len(files), "collector_cpu_s": round(cpu, 2),
                "exit_code": code, "hidden_left": len(list(inbox.rglob(".*.pcap"))), "stderr": log.strip()[-500:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=50_000, help="datagrams a second (default 50000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to send (default 10)")
    parser.add_argument("--size", type=int, default=300, help="bytes per datagram (default 300)")
    parser.add_argument("--rcvbuf", default="32M", help="the collector's --rcvbuf (default 32M)")
    parser.add_argument("--json", help="also write the result here")
    parser.add_argument("--send", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the sender process
    args = parser.parse_args(argv)
    if args.send:
        send(args.send, args.rate, args.seconds, args.size)
        return 0
    result = measure(args.rate, args.seconds, args.size, args.rcvbuf)
    print(f"sent {result['sent']:,} datagrams of {args.size} B at {result['send_rate']:,}/s; "
          f"collector received {result['received']:,}, wrote {result['written']:,} "
          f"({result['distinct_written']:,} distinct) in {result['files']} file(s); kernel drops "
          f"{result['kernel_drops']:,}; collector CPU {result['collector_cpu_s']} s; "
          f"receive buffer {result['rcvbuf_granted'] / 2**20:g} MiB; exit {result['exit_code']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    lossless = result["written"] == result["distinct_written"] == result["sent"] and result["exit_code"] == 0
    return 0 if lossless and not result["hidden_left"] else 1


if __name__ == "__main__":
    sys.exit(main())
