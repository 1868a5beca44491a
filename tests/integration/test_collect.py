"""``traffic collect``: every datagram lands, byte for byte, in a complete pcap file of its source's folder.

Everything here listens on 127.0.0.1 (or ::1) on free ports; exporters are sockets bound to other
loopback addresses (127.0.0.2, 127.0.0.3), so an exporter is told apart by its address as a router
would be. Files are read back with ``struct`` here and, independently, with tshark.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from traffic.app.collect import DEFAULT_LISTEN, Collector, CollectOptions, build_options, recover
from traffic.io.datagrams import PCAP_HEADER, datagram_record
from traffic.io.inbox import scan

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


# -- helpers ----------------------------------------------------------------------------------------
def free_udp_port(host: str = "127.0.0.1") -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def free_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def exporter(address: str) -> socket.socket:
    """A sending socket with its own loopback address, as a router exporting telemetry."""
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, 0))
    return sock


def read_pcap(path: Path) -> list[tuple]:
    """(ts_us, src, sport, dst, dport, payload) of every record; asserts the file ends on a record."""
    data = path.read_bytes()
    assert data[:24] == PCAP_HEADER, f"{path} does not start with the collector's pcap header"
    records, offset = [], 24
    while offset < len(data):
        seconds, micros, captured, original = struct.unpack_from("<IIII", data, offset)
        assert captured == original and offset + 16 + captured <= len(data), f"{path}: torn record at {offset}"
        frame = data[offset + 16: offset + 16 + captured]
        if frame[0] >> 4 == 4:
            src, dst, udp = ipaddress.ip_address(frame[12:16]), ipaddress.ip_address(frame[16:20]), frame[20:]
        else:
            src, dst, udp = ipaddress.ip_address(frame[8:24]), ipaddress.ip_address(frame[24:40]), frame[40:]
        sport, dport, length = struct.unpack_from("!HHH", udp)
        assert length == len(udp)
        records.append((seconds * 1_000_000 + micros, str(src), sport, str(dst), dport, udp[8:]))
        offset += 16 + captured
    return records


def files_of(inbox: Path) -> dict[str, list[Path]]:
    """Complete collector files by source folder (sorted by name)."""
    found: dict[str, list[Path]] = {}
    for path in sorted(inbox.glob("*/*.flows.pcap")):
        if not path.name.startswith("."):
            found.setdefault(path.parent.name, []).append(path)
    return found


def wait_for(predicate, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def collecting(inbox: Path, exporters=None, **options):
    """A collector serving in a thread of this process; stopped and closed (files completed) on exit."""
    options.setdefault("log_every", 0)
    lines: list[str] = []
    collector = Collector(inbox, exporters or {}, build_options(**options), log=lines.append).start()
    thread = threading.Thread(target=collector.serve, daemon=True)
    thread.start()
    try:
        yield collector
    finally:
        collector.stop()
        thread.join(timeout=30)
        assert not thread.is_alive(), "the collector did not stop"
        collector.close()
        collector.lines = lines


def received(collector: Collector, count: int):
    wait_for(lambda: collector.totals()[0] >= count, what=f"{count} datagrams received")


def traffic(*args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "traffic.app.cli", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


# -- the files --------------------------------------------------------------------------------------
def test_two_exporters_land_in_two_folders_with_exactly_the_bytes_sent(tmp_path):
    port = free_udp_port()
    sizes = [0, 1, 2, 299, 300, 1472, 9000, 65_507]
    sent = {"127.0.0.2": [], "127.0.0.3": []}
    before = time.time_ns() // 1000
    with collecting(tmp_path / "inbox", listen=[f"127.0.0.1:{port}"]) as collector:
        senders = {address: exporter(address) for address in sent}
        for i in range(40):
            for address, sock in senders.items():
                payload = os.urandom(sizes[i % len(sizes)])
                sock.sendto(payload, ("127.0.0.1", port))
                sent[address].append((sock.getsockname()[1], payload))
        received(collector, 80)
        after = time.time_ns() // 1000
    folders = files_of(tmp_path / "inbox")
    assert sorted(folders) == ["127.0.0.2", "127.0.0.3"], folders
    for address, datagrams in sent.items():
        assert len(folders[address]) == 1, folders[address]
        records = read_pcap(folders[address][0])
        got = [(src, sport, dst, dport, payload) for _, src, sport, dst, dport, payload in records]
        want = [(address, sport, "127.0.0.1", port, payload) for sport, payload in datagrams]
        assert got == want
        assert all(before <= ts <= after for ts, *_ in records), (before, [r[0] for r in records], after)
    status = collector.status()
    assert status["datagrams"] == 80 and status["kernel_drops"] == 0 and status["files_written"] == 2
    assert status["exporters"]["127.0.0.2"]["bytes"] == sum(len(p) for _, p in sent["127.0.0.2"])
    assert not list((tmp_path / "inbox").rglob(".*")), "a hidden file was left"


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")
def test_tshark_reads_the_same_datagrams_with_good_checksums(tmp_path):
    port = free_udp_port()
    payloads = [os.urandom(n) for n in (1, 64, 300, 1400)] * 5
    with collecting(tmp_path / "inbox", listen=[f"127.0.0.1:{port}"]) as collector:
        sock = exporter("127.0.0.2")
        for payload in payloads:
            sock.sendto(payload, ("127.0.0.1", port))
        received(collector, len(payloads))
    (path,) = files_of(tmp_path / "inbox")["127.0.0.2"]
    out = subprocess.run(["tshark", "-r", str(path), "-o", "udp.check_checksum:TRUE", "-o", "ip.check_checksum:TRUE",
                          "-T", "fields", "-e", "frame.time_epoch", "-e", "ip.src", "-e", "udp.dstport",
                          "-e", "ip.checksum.status", "-e", "udp.checksum.status", "-e", "udp.payload"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    rows = [line.split("\t") for line in out.splitlines()]
    ours = read_pcap(path)
    assert [(r[1], int(r[2]), r[3], r[4], bytes.fromhex(r[5])) for r in rows] == \
        [("127.0.0.2", port, "1", "1", p) for p in payloads]  # status 1: tshark verified the checksum
    assert [round(float(r[0]) * 1e6) for r in rows] == [ts for ts, *_ in ours]


def test_ipv6_exporters_get_a_folder_without_colons(tmp_path):
    try:
        port = free_udp_port("::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with collecting(tmp_path / "inbox", listen=[f"[::1]:{port}"]) as collector:
        sock = exporter("::1")
        sock.sendto(b"sflow", ("::1", port))
        received(collector, 1)
    folders = files_of(tmp_path / "inbox")
    assert list(folders) == ["0--1"]
    assert [(src, dst, payload) for _, src, _, dst, _, payload in read_pcap(folders["0--1"][0])] == \
        [("::1", "::1", b"sflow")]


def test_rotation_shows_the_inbox_complete_files_only(tmp_path):
    inbox, port = tmp_path / "inbox", free_udp_port()
    sent, seen_by_scan = 0, set()
    with collecting(inbox, listen=[f"127.0.0.1:{port}"], rotate=1, flush=0.05) as collector:
        sock = exporter("127.0.0.2")
        started = time.monotonic()
        while time.monotonic() - started < 3.2:
            for _ in range(20):
                sock.sendto(struct.pack("!I", sent), ("127.0.0.1", port))
                sent += 1
            for found in scan(inbox):  # what an ingest would take right now: each file whole and final
                assert not Path(found.path).name.startswith(".")
                records = read_pcap(Path(found.path))
                assert Path(found.path).stat().st_size == found.size
                seen_by_scan.add((found.name, len(records)))
            time.sleep(0.01)
        received(collector, sent)
    paths = files_of(inbox)["127.0.0.2"]
    assert len(paths) >= 3, paths
    sequence = [struct.unpack("!I", r[5])[0] for path in paths for r in read_pcap(path)]
    assert sequence == list(range(sent)), "datagrams lost, repeated or out of order across files"
    firsts = [read_pcap(path)[0][0] for path in paths]
    assert firsts == sorted(firsts), "file names do not sort by time"
    final = {f"127.0.0.2/{p.name}": len(read_pcap(p)) for p in paths}
    assert all(final[name] == count for name, count in seen_by_scan), "a file changed after the inbox saw it"


def test_the_exporters_setting_names_the_folder(tmp_path):
    port = free_udp_port()
    with collecting(tmp_path / "inbox", {"127.0.0.2": "edge-1"}, listen=[f"127.0.0.1:{port}"]) as collector:
        exporter("127.0.0.2").sendto(b"named", ("127.0.0.1", port))
        exporter("127.0.0.3").sendto(b"unnamed", ("127.0.0.1", port))
        received(collector, 2)
    folders = files_of(tmp_path / "inbox")
    assert sorted(folders) == ["127.0.0.3", "edge-1"]
    assert [r[1:2] + r[5:] for r in read_pcap(folders["edge-1"][0])] == [("127.0.0.2", b"named")]


def test_defaults_listen_on_loopback_only():
    assert DEFAULT_LISTEN == ("127.0.0.1:2055", "127.0.0.1:4739", "127.0.0.1:6343")
    assert all(endpoint.loopback for endpoint in CollectOptions().listen)


# -- start-up after a kill --------------------------------------------------------------------------
def test_recover_keeps_whole_records_cuts_a_torn_one_and_leaves_a_locked_file(tmp_path):
    folder = tmp_path / "inbox" / "edge-1"
    folder.mkdir(parents=True)
    records = [datagram_record(1_700_000_000_000_000 + i, "192.0.2.1", 9000, "127.0.0.1", 2055, bytes([i]) * 50)
               for i in range(3)]
    torn = folder / ".20231114T221320.000000Z-4242.flows.pcap"
    torn.write_bytes(PCAP_HEADER + b"".join(records) + records[0][:30])
    empty = folder / ".20231114T221321.000000Z-4242.flows.pcap"
    empty.write_bytes(PCAP_HEADER[:10])
    locked = folder / ".20231114T221322.000000Z-4243.flows.pcap"
    locked.write_bytes(PCAP_HEADER + records[0])
    other = folder / ".notes.pcap"
    other.write_bytes(b"not ours")
    with open(locked, "rb") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # a collector still writing it
        lines = recover(tmp_path / "inbox")
    completed = folder / "20231114T221320.000000Z-4242.flows.pcap"
    assert completed.read_bytes() == PCAP_HEADER + b"".join(records)
    assert not torn.exists() and not empty.exists() and locked.exists() and other.exists()
    assert any("3 datagrams, a torn last record of 30 bytes cut" in line for line in lines), lines
    assert sorted(p.name for p in folder.iterdir()) == sorted([completed.name, locked.name, other.name])


# -- the command ------------------------------------------------------------------------------------
def test_command_counts_in_status_and_metrics_and_exits_0_on_sigterm(tmp_path):
    inbox, status, port, metrics = tmp_path / "inbox", tmp_path / "status.json", free_udp_port(), free_tcp_port()
    process = traffic("collect", "--inbox", str(inbox), "--listen", f"127.0.0.1:{port}", "--status", str(status),
                      "--status-every", "0.2", "--metrics", f"127.0.0.1:{metrics}", "--log-every", "0.5")
    try:
        wait_for(status.exists, what="the status file")
        a, b = exporter("127.0.0.2"), exporter("127.0.0.3")
        for i in range(30):
            a.sendto(b"a" * 100, ("127.0.0.1", port))
        for i in range(12):
            b.sendto(b"b" * 10, ("127.0.0.1", port))
        doc = wait_for(lambda: (d := json.loads(status.read_text()))["datagrams"] == 42 and d, what="42 in status")
        assert doc["exporters"]["127.0.0.2"] | {"last_seen": None} == {
            "source": "127.0.0.2", "datagrams": 30, "bytes": 3000, "oversized": 0, "last_seen": None}
        assert doc["exporters"]["127.0.0.3"]["bytes"] == 120 and doc["kernel_drops"] == 0
        assert doc["listen"][0]["address"] == f"127.0.0.1:{port}" and doc["listen"][0]["rcvbuf"] > 0
        assert doc["open_files"] and all("/." in name for name in doc["open_files"])
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read().decode()
        assert 'traffic_collect_datagrams_total{exporter="127.0.0.2",source="127.0.0.2"} 30.0' in text
        assert 'traffic_collect_bytes_total{exporter="127.0.0.3",source="127.0.0.3"} 120.0' in text
        assert f'traffic_collect_kernel_drops_total{{listen="127.0.0.1:{port}"}} 0.0' in text
        assert "traffic_collect_files_written_total 0.0" in text
        time.sleep(0.6)  # one status line on stderr
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "Traceback" not in err and "datagrams" in err, err
    folders = files_of(inbox)
    assert {k: len(read_pcap(v[0])) for k, v in folders.items()} == {"127.0.0.2": 30, "127.0.0.3": 12}
    assert not list(inbox.rglob(".*")), "SIGTERM left a file under its hidden name"
    final = json.loads(status.read_text())
    assert final["files_written"] == 2 and final["open_files"] == [] and final["datagrams"] == 42


@pytest.mark.parametrize("case", ["busy port", "bad address", "bad port", "inbox under a file"])
def test_command_refuses_with_one_line(case, tmp_path):
    busy = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    busy.bind(("127.0.0.1", 0))
    (tmp_path / "file").write_text("x")
    listen, inbox, expect = {
        "busy port": (f"127.0.0.1:{busy.getsockname()[1]}", tmp_path / "inbox", "the port is in use"),
        "bad address": ("router.example:2055", tmp_path / "inbox", "is not an IP address"),
        "bad port": ("127.0.0.1:70000", tmp_path / "inbox", "is not in 1–65535"),
        "inbox under a file": (f"127.0.0.1:{free_udp_port()}", tmp_path / "file" / "inbox", "cannot be written"),
    }[case]
    try:
        process = traffic("collect", "--inbox", str(inbox), "--listen", listen)
        out, err = process.communicate(timeout=60)
    finally:
        busy.close()
    lines = [line for line in err.splitlines() if line.strip()]
    assert process.returncode == 2, err
    assert len(lines) == 1 and lines[0].startswith("traffic collect: error:") and expect in lines[0], err
