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
import re
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

from tests.support.flow_tools import loopback_delivered
from tests.support.requirements import need_tool
from traffic.app.collect import (DEFAULT_LISTEN, REFUSED_SENDERS, CollectError, Collector, CollectOptions, Endpoint,
                                 build_options, ipv4_blocks, recover, sender_allowed)
from traffic.core.settings import load_settings
from traffic.io.datagrams import PCAP_HEADER, datagram_record
from traffic.io.inbox import scan

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


# -- helpers ----------------------------------------------------------------------------------------
def free_udp_port(host: str = "127.0.0.1") -> int:
    """A port nothing holds right now. Another test worker may bind it before we do: whoever binds
    through it retries on "in use" (``start_on_a_free_port``, ``start_command``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


IN_USE = "in use by another program"  # the collector's reason when its bind fails with EADDRINUSE
ATTEMPTS = 5


def start_on_a_free_port(make, host: str = "127.0.0.1") -> Collector:
    """``make(listen)`` a Collector and start it on a free port of ``host``, again on another port when
    that one was taken between the probe and the bind. The port is ``port_of(collector)``."""
    for attempt in range(ATTEMPTS):
        collector = make([f"[{host}]:{free_udp_port(host)}" if ":" in host else f"{host}:{free_udp_port(host)}"])
        try:
            return collector.start()
        except CollectError as error:
            if IN_USE not in str(error) or attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def port_of(collector: Collector) -> int:
    return collector.listeners[0].endpoint.port


def start_command(status: Path, *args: str, **kwargs) -> tuple[subprocess.Popen, int, int]:
    """``traffic collect`` with ``args`` (``{udp}`` and ``{tcp}`` in them are free ports), started: its
    status file written. A port taken before the collector bound it makes it exit "in use": retried
    with other ports. Returns the process and the two ports."""
    for attempt in range(ATTEMPTS):
        udp, tcp = free_udp_port(), free_tcp_port()
        process = traffic("collect", *(arg.format(udp=udp, tcp=tcp) for arg in args), **kwargs)
        wait_for(lambda: status.exists() or process.poll() is not None, what="the status file")
        if process.poll() is None or status.exists():
            return process, udp, tcp
        _, err = process.communicate(timeout=30)
        if IN_USE not in (err or _stderr_text(kwargs)) or attempt == ATTEMPTS - 1:
            raise AssertionError(f"traffic collect did not start: {err or _stderr_text(kwargs)}")
    raise AssertionError("unreachable")


def _stderr_text(kwargs) -> str:
    stderr = kwargs.get("stderr")
    return Path(stderr.name).read_text() if hasattr(stderr, "name") else ""


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
    if "listen" in options:
        collector = Collector(inbox, exporters or {}, build_options(**options), log=lines.append).start()
    else:  # a free port on ``host`` (default 127.0.0.1): port_of(collector)
        host = options.pop("host", "127.0.0.1")
        collector = start_on_a_free_port(lambda listen: Collector(inbox, exporters or {},
                                                                  build_options(listen=listen, **options),
                                                                  log=lines.append), host)
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
    return subprocess.Popen([sys.executable, "-m", "traffic.app.cli", *args], cwd=ROOT,
                            **{"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **kwargs})


# -- the files --------------------------------------------------------------------------------------
def test_two_exporters_land_in_two_folders_with_exactly_the_bytes_sent(tmp_path):
    sizes = [0, 1, 2, 299, 300, 1472, 9000, 65_507]
    sent = {"127.0.0.2": [], "127.0.0.3": []}
    before = time.time_ns() // 1000
    with collecting(tmp_path / "inbox") as collector:
        port = port_of(collector)
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


def test_tshark_reads_the_same_datagrams_with_good_checksums(tmp_path):
    need_tool("tshark")  # the only check that our files open in tshark: missing tshark fails it, with the reason
    payloads = [os.urandom(n) for n in (1, 64, 300, 1400)] * 5
    with collecting(tmp_path / "inbox") as collector:
        port = port_of(collector)
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
        free_udp_port("::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with collecting(tmp_path / "inbox", host="::1") as collector:
        port = port_of(collector)
        sock = exporter("::1")
        sock.sendto(b"sflow", ("::1", port))
        received(collector, 1)
    folders = files_of(tmp_path / "inbox")
    assert list(folders) == ["0--1"]
    assert [(src, dst, payload) for _, src, _, dst, _, payload in read_pcap(folders["0--1"][0])] == \
        [("::1", "::1", b"sflow")]


def test_rotation_shows_the_inbox_complete_files_only(tmp_path):
    inbox = tmp_path / "inbox"
    sent, seen_by_scan = 0, set()
    with collecting(inbox, rotate=1, flush=0.05) as collector:
        port = port_of(collector)
        sock = exporter("127.0.0.2")
        deadline = time.monotonic() + 60
        # Until three files are complete (at least two rotations seen while sending), however slow the machine.
        while len(files_of(inbox).get("127.0.0.2", [])) < 3:
            assert time.monotonic() < deadline, f"fewer than 3 complete files after 60 s: {files_of(inbox)}"
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
    with collecting(tmp_path / "inbox", {"127.0.0.2": "edge-1"}) as collector:
        port = port_of(collector)
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
    inbox, status, log = tmp_path / "inbox", tmp_path / "status.json", tmp_path / "stderr.txt"
    with open(log, "w") as stderr:
        process, port, metrics = start_command(status, "--inbox", str(inbox), "--listen", "127.0.0.1:{udp}",
                                               "--status", str(status), "--status-every", "0.2",
                                               "--metrics", "127.0.0.1:{tcp}", "--log-every", "0.5",
                                               # files are cut on the clock: an hour, not a minute, so one
                                               # file per source is all but certain (and not assumed below)
                                               "--rotate", "3600", stderr=stderr)
    try:
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
        # A periodic status line on stderr with the counts (the one written at the stop is not it).
        wait_for(lambda: "collect: 42 datagrams" in log.read_text() and "lately" in log.read_text(),
                 what="a status line with 42 datagrams on stderr")
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    err = log.read_text()
    assert process.returncode == 0, err
    assert "Traceback" not in err and "datagrams" in err, err
    folders = files_of(inbox)
    assert {k: sum(len(read_pcap(path)) for path in v) for k, v in folders.items()} == {"127.0.0.2": 30,
                                                                                        "127.0.0.3": 12}
    assert not list(inbox.rglob(".*")), "SIGTERM left a file under its hidden name"
    final = json.loads(status.read_text())
    assert final["files_written"] == sum(map(len, folders.values())) and final["open_files"] == []
    assert final["datagrams"] == 42


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


# -- who may export (DESIGN §7a) --------------------------------------------------------------------
def claim(number: int) -> bytes:
    """A datagram as a spoofer would send it: a NetFlow v5 header and one record of 10**12 octets (what it
    claims does not matter here: the collector decodes nothing; only who sent it does)."""
    header = struct.pack("!HHIIIIBBH", 5, 1, 0, int(time.time()), 0, number, 0, 0, 0)
    record = struct.pack("!4s4s4sHHIIIIHHBBBBHHBBH", bytes([192, 0, 2, 7]), bytes([198, 51, 100, 1]), bytes(4),
                         0, 0, 1, 10**12 % 2**32, 0, 0, 1234, 80, 0, 0, 6, 0, 0, 0, 0, 0, 0)
    return header + record


def refused_of(status: dict) -> dict:
    return {address: entry["datagrams"] for address, entry in status["refused"]["senders"].items()}


def test_only_allowed_exporters_land_and_every_other_sender_is_counted(tmp_path):
    sent = []
    with collecting(tmp_path / "inbox", {"127.0.0.3": "named-is-not-allowed"}, allow=["127.0.0.2/32"]) as collector:
        port = port_of(collector)
        good, spoofed, other = exporter("127.0.0.2"), exporter("127.0.0.3"), exporter("127.0.0.4")
        for i in range(20):
            good.sendto(struct.pack("!I", i), ("127.0.0.1", port))
            sent.append(struct.pack("!I", i))
            spoofed.sendto(claim(i), ("127.0.0.1", port))
            if i % 4 == 0:
                other.sendto(claim(i), ("127.0.0.1", port))
        wait_for(lambda: collector.totals()[0] == 20 and collector.refused_totals()[0] == 25, what="every datagram")
        status = collector.status()
    assert sorted(files_of(tmp_path / "inbox")) == ["127.0.0.2"], "a sender outside allowed_exporters was written"
    assert [r[5] for r in read_pcap(files_of(tmp_path / "inbox")["127.0.0.2"][0])] == sent
    assert refused_of(status) == {"127.0.0.3": 20, "127.0.0.4": 5}
    assert status["refused"]["senders"]["127.0.0.3"]["bytes"] == 20 * len(claim(0))
    assert status["refused"]["datagrams"] == 25 and status["refused"]["others"]["datagrams"] == 0
    assert status["allowed_exporters"] == ["127.0.0.2/32"]
    assert list(status["exporters"]) == ["127.0.0.2"] and status["datagrams"] == 20
    assert any("dropping datagrams from 127.0.0.3: not in allowed_exporters" in line for line in collector.lines), \
        collector.lines


def test_three_hundred_spoofed_senders_cost_a_bounded_table(tmp_path):
    senders = [f"127.0.{1 + n // 250}.{1 + n % 250}" for n in range(300)]
    with collecting(tmp_path / "inbox", allow=["127.0.0.2/32"]) as collector:
        port = port_of(collector)
        good = exporter("127.0.0.2")
        for n, address in enumerate(senders):
            with exporter(address) as sock:
                sock.sendto(claim(n), ("127.0.0.1", port))
                sock.sendto(claim(n), ("127.0.0.1", port))
            if n % 30 == 0:
                good.sendto(struct.pack("!I", n), ("127.0.0.1", port))
                wait_for(lambda: collector.refused_totals()[0] == 2 * (n + 1), what="the spoofed datagrams so far")
        wait_for(lambda: collector.totals()[0] == 10 and collector.refused_totals()[0] == 600, what="every datagram")
        status = collector.status()
    assert REFUSED_SENDERS < len(senders)
    assert len(collector.refused) == REFUSED_SENDERS == status["refused"]["senders_counted_max"]
    assert refused_of(status) == {address: 2 for address in senders[:REFUSED_SENDERS]}
    assert status["refused"]["others"]["datagrams"] == 2 * (len(senders) - REFUSED_SENDERS)
    assert status["refused"]["datagrams"] == 600
    assert list(collector.exporters) == ["127.0.0.2"], "a spoofed sender became an exporter"
    assert sorted(files_of(tmp_path / "inbox")) == ["127.0.0.2"]
    assert len(read_pcap(files_of(tmp_path / "inbox")["127.0.0.2"][0])) == 10


def test_an_ipv4_mapped_block_takes_the_ipv4_sender(tmp_path):
    with collecting(tmp_path / "inbox", allow=["::ffff:127.0.0.2/128"]) as collector:
        port = port_of(collector)
        exporter("127.0.0.2").sendto(b"mapped", ("127.0.0.1", port))
        exporter("127.0.0.3").sendto(b"not", ("127.0.0.1", port))
        wait_for(lambda: collector.totals()[0] == 1 and collector.refused_totals()[0] == 1, what="both datagrams")
    assert sorted(files_of(tmp_path / "inbox")) == ["127.0.0.2"]
    # An IPv4-mapped sender (a dual-stack socket's view) and a block left in IPv6 form both match as IPv4.
    mapped_block = [ipaddress.ip_network("::ffff:10.0.0.0/104")]
    assert sender_allowed("10.1.2.3", mapped_block) and not sender_allowed("11.1.2.3", mapped_block)
    assert sender_allowed("10.1.2.3", [ipaddress.ip_network("10.0.0.0/8")])
    assert not sender_allowed("2001:db8::1", [ipaddress.ip_network("10.0.0.0/8")])
    env = load_settings(environ={"TRAFFIC_ALLOWED_EXPORTERS": "::ffff:10.0.0.0/104, 192.0.2.1,2001:db8::/32"})
    assert env.allowed_exporters == ("10.0.0.0/8", "192.0.2.1/32", "2001:db8::/32")


def test_the_integer_ipv4_test_agrees_with_the_address_rule():
    blocks = [ipaddress.ip_network(text) for text in ("10.0.0.0/8", "::ffff:192.0.2.0/120", "2001:db8::/32",
                                                      "198.51.100.7/32")]
    ranges = ipv4_blocks(blocks)
    for address in ("10.0.0.1", "10.255.255.255", "11.0.0.0", "192.0.2.9", "192.0.3.1", "198.51.100.7",
                    "198.51.100.8", "0.0.0.0", "255.255.255.255"):
        number = int(ipaddress.ip_address(address))
        assert any(number & mask == net for net, mask in ranges) == sender_allowed(address, blocks), address
    assert ipv4_blocks([ipaddress.ip_network("::/0")]) == ((0, 0),)  # every IPv6 address holds the mapped ones
    assert sender_allowed("203.0.113.1", [ipaddress.ip_network("::/0")])
    assert ipv4_blocks([ipaddress.ip_network("2001:db8::/32")]) == ()


def test_drain_takes_every_waiting_datagram_also_the_dropped_ones(tmp_path):
    """``drain`` (the demo's in-process collector) used to stop after one batch of 256 when none of it was
    written."""
    collector = start_on_a_free_port(lambda listen: Collector(tmp_path / "inbox", {}, build_options(
        listen=listen, log_every=0, allow=["127.0.0.2/32"]), log=lambda line: None))
    port = port_of(collector)
    try:
        # All in the socket's queue (or counted dropped there) when the block ends, however busy the machine.
        with exporter("127.0.0.3") as spoofed, exporter("127.0.0.2") as good, loopback_delivered():
            for i in range(600):
                spoofed.sendto(claim(i), ("127.0.0.1", port))
            good.sendto(b"last", ("127.0.0.1", port))
        assert collector.drain() == 1
        assert collector.refused_totals() == (600, 1)
    finally:
        collector.close()


def test_a_listen_other_machines_reach_needs_allowed_exporters_or_allow_any(tmp_path):
    # build_options binds nothing: these only decide
    assert build_options(listen=["0.0.0.0:2055"], allow=["192.0.2.0/24"]).allow == (ipaddress.ip_network("192.0.2.0/24"),)
    assert build_options(listen=["[::]:2055"], allow_any=True).allow_any
    assert build_options(listen=["127.0.0.1:2055", "[::1]:2055"]).allow == ()
    for kwargs, expect in (({"listen": ["0.0.0.0:2055"]}, "reachable from other machines"),
                           ({"listen": ["127.0.0.1:2055", "[::]:2055"]}, "--listen [::]:2055 is reachable"),
                           ({"listen": ["0.0.0.0:2055"], "allow": ["10.0.0.0/8"], "allow_any": True}, "give one"),
                           ({"allow": ["router"]}, "'router' is not a CIDR network")):
        with pytest.raises(CollectError, match=re.escape(expect)):
            build_options(**kwargs)
    # In-process too, and before anything is bound: the port is held on 127.0.0.1, so binding 0.0.0.0
    # would fail "in use"; the refusal must come first and leave no socket.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", 0))
        collector = Collector(tmp_path / "inbox", {}, CollectOptions(listen=(Endpoint("0.0.0.0", busy.getsockname()[1]),)),
                              log=lambda line: None)
        with pytest.raises(CollectError, match="reachable from other machines"):
            collector.start()
        assert collector.listeners == []


def test_command_refuses_a_listen_on_every_address_without_the_list_before_binding(tmp_path):
    # The port is held on 127.0.0.1, so binding 0.0.0.0 would fail with "in use": the refusal must come first.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", 0))
        process = traffic("collect", "--inbox", str(tmp_path / "inbox"), "--listen", f"0.0.0.0:{busy.getsockname()[1]}",
                          env={k: v for k, v in os.environ.items() if k != "TRAFFIC_ALLOWED_EXPORTERS"})
        out, err = process.communicate(timeout=60)
    lines = [line for line in err.splitlines() if line.strip()]
    assert process.returncode == 2, err
    assert len(lines) == 1 and lines[0].startswith("traffic collect: error: --listen 0.0.0.0:") \
        and "reachable from other machines" in lines[0] and "--allow-any" in lines[0], err
    assert not (tmp_path / "inbox").exists()


def test_command_with_allow_counts_refused_senders_in_status_log_and_metrics(tmp_path):
    inbox, status, log = tmp_path / "inbox", tmp_path / "status.json", tmp_path / "stderr.txt"
    with open(log, "w") as stderr:
        process, port, metrics = start_command(status, "--inbox", str(inbox), "--listen", "127.0.0.1:{udp}",
                                               "--status", str(status), "--allow", "127.0.0.2/32,192.0.2.0/24",
                                               "--rotate", "2s", "--status-every", "0.2", "--log-every", "1s",
                                               "--flush", "0.05", "--metrics", "127.0.0.1:{tcp}", stderr=stderr)
    try:
        good, spoofed = exporter("127.0.0.2"), exporter("127.0.0.3")
        for i in range(9):
            good.sendto(struct.pack("!I", i), ("127.0.0.1", port))
        for i in range(7):
            spoofed.sendto(claim(i), ("127.0.0.1", port))
        doc = wait_for(lambda: (d := json.loads(status.read_text()))["datagrams"] == 9 and d["refused"]["datagrams"] == 7
                       and d, what="the counts in the status")
        assert refused_of(doc) == {"127.0.0.3": 7} and doc["allowed_exporters"] == ["127.0.0.2/32", "192.0.2.0/24"]
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read().decode()
        assert 'traffic_collect_refused_datagrams_total{sender="127.0.0.3"} 7.0' in text, text
        wait_for(lambda: len(files_of(inbox).get("127.0.0.2", [])) >= 1, what="a 2 s rotation")
        # A periodic status line on stderr that counts the refused senders (the one at the stop is not it).
        wait_for(lambda: any("lately" in line and "dropped 7 datagrams of 1 sender(s)" in line
                             for line in log.read_text().splitlines()), what="a status line with the refused")
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    err = log.read_text()
    assert process.returncode == 0, err
    assert "taking datagrams only from 127.0.0.2/32, 192.0.2.0/24" in err, err
    assert "dropped 7 datagrams of 1 sender(s) not in allowed_exporters" in err, err
    assert "a file per source every 2 s" in err, err
    assert sorted(files_of(inbox)) == ["127.0.0.2"]
    assert sum(len(read_pcap(path)) for path in files_of(inbox)["127.0.0.2"]) == 9


# -- periods: bare seconds or durations, as every other duration of the project ----------------------
def test_periods_take_bare_seconds_and_durations():
    options = build_options(rotate="2s", flush="0.05", status_every="1m", log_every="0")
    assert (options.rotate, options.flush, options.status_every, options.log_every) == (2.0, 0.05, 60.0, 0.0)
    options = build_options(rotate="15m", flush=1, status_every=5.0, log_every="2h")
    assert (options.rotate, options.flush, options.status_every, options.log_every) == (900.0, 1.0, 5.0, 7200.0)
    assert build_options(rotate=" 90 ").rotate == 90.0


@pytest.mark.parametrize("name, value, expect", [
    ("rotate", "0.5", "--rotate 0.5: must be from 1 s to 24 h"),
    ("rotate", "2d", "--rotate 2d: must be from 1 s to 24 h"),
    ("rotate", "99999999999d", "--rotate"),  # too long: refused by parse_duration's own bound or ours
    ("rotate", "2x", "--rotate: '2x' is not a duration"),
    ("flush", "inf", "--flush 'inf': not a duration"),
    ("flush", "nan", "--flush 'nan': not a duration"),
    ("status_every", "-1", "--status-every: '-1' is not a duration"),
    ("flush", "0s", "--flush 0s: must be from 0.01 s"),
])
def test_periods_out_of_range_are_refused_with_their_name(name, value, expect):
    with pytest.raises(CollectError, match=re.escape(expect)):
        build_options(**{name: value})


def test_the_compose_collector_and_the_demo_router_pass_the_exposure_rule(tmp_path):
    """The stack's collector listens on 0.0.0.0 inside its network: its command with the default
    TRAFFIC_ALLOWED_EXPORTERS is accepted; the demo's collector (127.0.0.1) needs no list."""
    import yaml

    service = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["collector"]
    command, environment = service["command"], service["environment"]
    value = environment["TRAFFIC_ALLOWED_EXPORTERS"]
    default = re.fullmatch(r"\$\{TRAFFIC_ALLOWED_EXPORTERS:-([^}]*)\}", value)  # should it come from .env one day
    settings = load_settings(environ={"TRAFFIC_ALLOWED_EXPORTERS": default.group(1) if default else value})
    listen = [command[i + 1] for i, word in enumerate(command) if word == "--listen"]
    assert listen and not any(Endpoint(*text.rsplit(":", 1)).loopback for text in listen) and "--allow-any" not in command
    options = build_options(listen=listen, allow=settings.allowed_exporters)
    assert sender_allowed("172.18.0.1", options.allow), "the stack's network gateway is refused"

    from traffic.app.demo.telemetry import Router

    router = Router(tmp_path / "inbox", ["10.0.0.1"], ["198.51.100.1"])
    try:
        router.sender.sendto(b"demo", ("127.0.0.1", router.ports[0]))
        wait_for(lambda: router.collector.drain() == 1, what="the demo's datagram")
        assert router.collector.refused_totals() == (0, 0)
    finally:
        router.close()
