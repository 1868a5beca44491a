"""Drive real flow tools from Debian (softflowd, pmacct, nfdump, tshark) for independent checks of flow ingest.

Exporters turn a packet capture into export datagrams (NetFlow v5/v9, IPFIX, sFlow v5), a
collector (``nfcapd``/``sfcapd`` from nfdump) decodes them, and tshark gives the reference IP
totals of the original capture. Everything runs on 127.0.0.1 with ports the kernel hands out,
every process is stopped in a ``finally`` and every wait has a timeout; nothing is ever sent to
another address. The datagrams are what ``traffic collect`` would store (``Datagram``), and
``write_collector_file`` writes them as its files. Flags, quirks and what each tool counts
(they differ: IP length, wire length, sFlow frame length): docs/flow-tools.md.

Debian packages: ``nfdump``, ``nfdump-sflow`` (``sfcapd``), ``softflowd``, ``pmacct``, ``tshark``.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Iterator, NamedTuple

from traffic.io.datagrams import PCAP_HEADER, datagram_record

__all__ = [
    "Datagram",
    "LOOPBACK",
    "UdpReceiver",
    "export_capture",
    "write_collector_file",
    "nfdump_totals",
    "nfdump_flows",
    "tshark_totals",
    "tshark_packets",
    "totals_of",
    "frame_count",
    "Packet",
    "tshark_flow_fields",
    "merge_captures",
    "collect",
    "SFLOW_FLUSH_PAIR",
    "ToolError",
    "require",
]

#: The only address anything here listens on or sends to.
LOOPBACK = "127.0.0.1"
#: Totals: (src_ip, dst_ip) -> (bytes, packets).
Totals = dict[tuple[str, str], tuple[int, int]]

_PACKAGES = {
    "softflowd": "softflowd",
    "pmacctd": "pmacct",
    "nfcapd": "nfdump",
    "nfdump": "nfdump",
    "sfcapd": "nfdump-sflow",
    "tshark": "tshark",
    "editcap": "wireshark-common",
    "mergecap": "wireshark-common",
}


class Datagram(NamedTuple):
    """One received export datagram, as the collector stores it (DESIGN §7a)."""

    received_us: int
    exporter_ip: str
    exporter_port: int
    payload: bytes


class ToolError(RuntimeError):
    """A flow tool failed; the message carries its command line and output."""


def require(tool: str) -> str:
    """The path of ``tool``, or an error naming the Debian package that provides it."""
    path = shutil.which(tool) or next((p for p in (f"/usr/sbin/{tool}", f"/usr/bin/{tool}") if os.access(p, os.X_OK)), None)
    if path is None:
        package = _PACKAGES.get(tool, tool)
        raise ToolError(f"{tool} is not installed: sudo DEBIAN_FRONTEND=noninteractive apt-get install -y {package}")
    return path


# -- receiving -----------------------------------------------------------------------------------

class UdpReceiver:
    """A UDP socket on 127.0.0.1 (a free port) that records every datagram in a background thread."""

    def __init__(self, host: str = LOOPBACK):
        if host != LOOPBACK:
            raise ValueError(f"the flow-tool harness only listens on {LOOPBACK}, not {host}")
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self._sock.bind((host, 0))
        self._sock.settimeout(0.05)
        self.address: tuple[str, int] = self._sock.getsockname()
        self.datagrams: list[Datagram] = []
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="udp-receiver", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self.address[1]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                payload, (ip, port) = self._sock.recvfrom(65_535)
            except socket.timeout:
                continue
            except OSError:
                return
            self._last = time.monotonic()
            self.datagrams.append(Datagram(time.time_ns() // 1000, ip, port, payload))

    def drain(self, quiet: float = 0.3, timeout: float = 10.0) -> list[Datagram]:
        """Wait until nothing has arrived for ``quiet`` seconds (at most ``timeout``), then stop."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and time.monotonic() - self._last < quiet:
            time.sleep(0.02)
        self.close()
        return list(self.datagrams)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close()

    def __enter__(self) -> "UdpReceiver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def free_udp_port() -> int:
    """A UDP port on 127.0.0.1 nothing is bound to at the moment (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def _udp_socket_state(port: int, pid: int | None = None) -> tuple[int, int] | None:
    """(receive queue bytes, drops) of the IPv4 UDP socket bound to 127.0.0.1:``port``, from /proc; with
    ``pid``, only a socket that process holds (another process may have taken the port a probe found free)."""
    wanted = f"0100007F:{port:04X}"
    with open("/proc/net/udp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[1] == wanted and (pid is None or f"socket:[{fields[9]}]" in _sockets_of(pid)):
                rx_queue = int(fields[4].split(":")[1], 16)
                return rx_queue, int(fields[12])
    return None


def _sockets_of(pid: int) -> set[str]:
    """The ``socket:[inode]`` links of a process's open files (empty once it is gone)."""
    links = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return links
    for name in names:
        try:
            links.add(os.readlink(f"/proc/{pid}/fd/{name}"))
        except OSError:
            pass
    return links


def _all_threads_asleep(pid: int) -> bool:
    """Whether every thread of ``pid`` is blocked (state S), none running or runnable: with its socket
    queue empty, a collector in this state has finished with the last datagram it read."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
        states = []
        for tid in tids:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                states.append(stat.read().rsplit(")", 1)[1].split()[0])
    except OSError:
        return False
    return bool(states) and all(state == "S" for state in states)


@contextlib.contextmanager
def _running(command: list[str], log: Path, *, cwd: Path) -> Iterator[subprocess.Popen]:
    """Run ``command`` with its output in ``log``; on the way out SIGTERM it, then SIGKILL after 10 s."""
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   cwd=cwd, start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)


def _fail(what: str, command: list[str], log: Path) -> ToolError:
    text = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    return ToolError(f"{what}: {' '.join(command)}\n--- output ---\n{text}")


# -- exporting -----------------------------------------------------------------------------------

def _softflowd_command(pcap: Path, version: int, port: int, workdir: Path, capture_times: bool) -> list[str]:
    command = [
        require("softflowd"),
        "-d",                          # foreground: exits at the end of the capture
        "-r", str(pcap),
        "-n", f"{LOOPBACK}:{port}",
        "-v", str(version),
        "-T", "full",                  # one flow per 5-tuple (the default, said so)
        "-m", "65536",                 # room for every flow: none forced out early
        "-P", "udp",
        # No control socket. -r already turns it off, but a -c given after -r turns it back on, and
        # then softflowd 1.1.0 reads an uninitialised poll result and can block in accept() forever.
        "-c", "none",
        "-p", str(workdir / "softflowd.pid"),  # it unlinks this path at exit: never the system's
    ]
    if version in (9, 10):
        command.append("-6")           # IPv6 flows too (v5 cannot carry them)
    if capture_times:
        command.append("-a")           # uptime 0 = the first packet, not softflowd's start
    return command


def _pmacct_config(pcap: Path, version: int | str, port: int, workdir: Path, sampling_rate: int) -> str:
    lines = [
        "daemonize: false",
        f"pcap_savefile: {pcap}",
        f"pidfile: {workdir / 'pmacctd.pid'}",
    ]
    if version == "sflow":
        lines += [
            "plugins: sfprobe",
            f"sfprobe_receiver: {LOOPBACK}:{port}",
            f"sfprobe_agentip: {LOOPBACK}",
            f"sampling_rate: {sampling_rate}",
        ]
    else:
        lines += [
            "plugins: nfprobe",
            f"nfprobe_receiver: {LOOPBACK}:{port}",
            f"nfprobe_version: {version}",
            "nfprobe_maxflows: 65536",
        ]
        if sampling_rate != 1:
            lines.append(f"sampling_rate: {sampling_rate}")
    return "\n".join(lines) + "\n"


#: The address pair of the packets appended to a capture before pmacctd's sfprobe reads it (below).
SFLOW_FLUSH_PAIR = ("198.51.100.1", "198.51.100.2")
_FLUSH_PER_RATE = 64


def _flush_frame(linktype: int) -> bytes:
    """A 46-byte IPv4/UDP packet SFLOW_FLUSH_PAIR[0] -> [1] (port 9, discard), framed for ``linktype``."""
    src, dst = (bytes(int(x) for x in a.split(".")) for a in SFLOW_FLUSH_PAIR)
    udp = struct.pack("!HHHH", 9, 9, 26, 0) + bytes(18)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, src, dst)
    checksum = _checksum(ip)
    ip = ip[:10] + struct.pack("!H", checksum) + ip[12:] + udp
    if linktype == 1:  # Ethernet
        return bytes.fromhex("020000000002" "020000000001" "0800") + ip
    if linktype in (101, 12, 14):  # raw IP
        return ip
    if linktype == 113:  # Linux cooked (SLL)
        return struct.pack("!HHH8sH", 0, 1, 6, bytes.fromhex("0200000000010000"), 0x0800) + ip
    raise ToolError(f"cannot append flush packets to a capture of link type {linktype}")


def _checksum(data: bytes) -> int:
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _with_flush_packets(pcap: Path, work: Path, count: int) -> Path:
    """A classic-pcap copy of ``pcap`` with ``count`` flush packets appended at its last timestamp.

    pmacctd's sfprobe plugin sends a datagram when it is full or on a one-second tick that it
    only checks between packets; when pmacctd reaches the end of a capture file the samples of
    the last partial datagram are never sent. The flush packets fill and push out that datagram.
    """
    classic = work / f"{pcap.stem}.classic.pcap"
    done = subprocess.run([require("editcap"), "-F", "pcap", str(pcap), str(classic)],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise ToolError(f"editcap could not convert {pcap} to pcap: {done.stderr[-1000:]}")
    data = classic.read_bytes()
    endian = {b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">",
              b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">"}[data[:4]]
    linktype = struct.unpack(endian + "I", data[20:24])[0] & 0x0FFFFFFF
    seconds = fraction = 0
    offset = 24
    while offset + 16 <= len(data):
        seconds, fraction, caplen, _ = struct.unpack(endian + "IIII", data[offset:offset + 16])
        offset += 16 + caplen
    frame = _flush_frame(linktype)
    record = struct.pack(endian + "IIII", seconds, fraction, len(frame), len(frame)) + frame
    padded = work / f"{pcap.stem}.flushed.pcap"
    padded.write_bytes(data + record * count)
    return padded


def export_capture(pcap_path: Path | str, tool: str, version: int | str, workdir: Path | str, *,
                   sampling_rate: int = 1, capture_times: bool = True, flush: bool = True,
                   extra: tuple[str, ...] = (), timeout: float = 60.0) -> list[Datagram]:
    """The export datagrams ``tool`` sends for the packets of ``pcap_path``, received on 127.0.0.1.

    ``tool`` is ``"softflowd"`` (``version`` 5, 9 or 10 = IPFIX) or ``"pmacct"`` (``pmacctd``
    with the ``nfprobe`` plugin for 5, 9, 10, or the ``sfprobe`` plugin for ``version="sflow"``;
    pmacct samples 1 in ``sampling_rate`` packets at random). Each tool reads the whole capture
    and exports every flow it still holds when it reaches the end; ``workdir`` keeps its
    configuration and output (``<tool>-<version>.log``).

    * ``capture_times``: softflowd ``-a``, flow times on the capture's clock (without it they
      are weeks away; pmacct v9/IPFIX always use the capture's clock, v5 never does).
    * ``flush`` (sFlow only): append flush packets of the pair ``SFLOW_FLUSH_PAIR`` so the
      last samples are sent (see ``_with_flush_packets``); the datagrams then hold samples
      of that pair too, which a caller drops from its totals.
    * ``extra``: more softflowd arguments, or more pmacctd configuration lines.
    """
    pcap, work = Path(pcap_path).resolve(), Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    if tool == "softflowd":
        if version not in (5, 9, 10):
            raise ValueError(f"softflowd exports NetFlow v5, v9 or IPFIX (10), not {version!r}")
        if sampling_rate != 1:
            raise ValueError("softflowd's own sampling (-s) is not driven by this harness")
    elif tool == "pmacct":
        if version not in (5, 9, 10, "sflow"):
            raise ValueError(f"pmacctd exports NetFlow v5, v9, IPFIX (10) or 'sflow', not {version!r}")
    else:
        raise ValueError(f"unknown exporter {tool!r} (softflowd or pmacct)")
    log = work / f"{tool}-{version}.log"
    if version == "sflow" and flush:
        pcap = _with_flush_packets(pcap, work, _FLUSH_PER_RATE * sampling_rate)
    with UdpReceiver() as receiver:
        if tool == "softflowd":
            command = _softflowd_command(pcap, version, receiver.port, work, capture_times) + list(extra)
        else:
            config = work / f"pmacctd-{version}.conf"
            config.write_text(_pmacct_config(pcap, version, receiver.port, work, sampling_rate)
                              + "".join(f"{line}\n" for line in extra))
            command = [require("pmacctd"), "-f", str(config)]
        with _running(command, log, cwd=work) as process:
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise _fail(f"{tool} did not finish within {timeout} s", command, log) from None
        if code != 0 and not (tool == "pmacct" and _plugin_finished_first(log)):
            raise _fail(f"{tool} exited with {code}", command, log)
        return receiver.drain()


def _plugin_finished_first(log: Path) -> bool:
    """pmacctd's exit 1 from a race at the end of a file: the plugin exported and left before the core.

    The plugin logs its orderly "Shutting down on user request", then the core finds it gone
    ("connection lost", "no more plugins active") and exits 1; nothing was lost.
    """
    text = log.read_text(errors="replace")
    return ("Shutting down on user request" in text and "no more plugins active" in text
            and "ERROR" not in text)


def merge_captures(paths: list[Path], out: Path | str, *, concatenate: bool = False) -> Path:
    """One classic pcap of ``paths`` (``mergecap``), in time order or, with ``concatenate``, file after file.

    The files must share a link type.
    """
    command = [require("mergecap"), "-F", "pcap", *(["-a"] if concatenate else []), "-w", str(out), *map(str, paths)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise ToolError(f"mergecap failed: {' '.join(command)}\n{done.stderr[-2000:]}")
    return Path(out)


# -- the collector's file --------------------------------------------------------------------------

def write_collector_file(datagrams: list[Datagram], path: Path | str,
                         listen: tuple[str, int] = (LOOPBACK, 2055)) -> Path:
    """Write ``datagrams`` as a collector file (traffic.io.datagrams' pcap), as if received on ``listen``."""
    path = Path(path)
    with open(path, "wb") as out:
        out.write(PCAP_HEADER)
        for d in datagrams:
            out.write(datagram_record(d.received_us, d.exporter_ip, d.exporter_port, listen[0], listen[1], d.payload))
    return path


# -- collecting with nfdump ----------------------------------------------------------------------

def _replay(datagrams: list[Datagram], port: int, *, pace_every: int = 16, pause: float = 0.002) -> None:
    """Send each payload to 127.0.0.1:``port`` from one socket per original exporter port, in order, paced."""
    senders: dict[tuple[str, int], socket.socket] = {}
    try:
        for n, d in enumerate(datagrams, 1):
            sender = senders.get((d.exporter_ip, d.exporter_port))
            if sender is None:
                sender = senders[(d.exporter_ip, d.exporter_port)] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sender.bind((LOOPBACK, 0))
            sender.sendto(d.payload, (LOOPBACK, port))
            if n % pace_every == 0:
                time.sleep(pause)
    finally:
        for sender in senders.values():
            sender.close()


@contextlib.contextmanager
def loopback_delivered(timeout: float = 30.0) -> Iterator[None]:
    """Every datagram this thread sends to a loopback address inside the block is in its socket's queue
    (or counted as dropped there) when the block ends: the thread runs on one CPU meanwhile, and
    ``_flush_loopback`` waits for the kernel to deliver. Raises TimeoutError after ``timeout``."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})  # this thread only (Linux)
    try:
        yield
        _flush_loopback(timeout)
    finally:
        os.sched_setaffinity(0, cpus)


def _replay_delivered(datagrams: list[Datagram], port: int, timeout: float) -> None:
    """``_replay``, then wait until the kernel has delivered all of it."""
    with loopback_delivered(timeout):
        _replay(datagrams, port)


def _wait_bound(port: int, process: subprocess.Popen, timeout: float) -> None:
    """Until ``process`` itself holds 127.0.0.1:``port`` (a socket of another process on it is a collision)."""
    deadline = time.monotonic() + timeout
    while _udp_socket_state(port, process.pid) is None:
        if process.poll() is not None or time.monotonic() > deadline:
            raise TimeoutError(f"collector did not bind {LOOPBACK}:{port}")
        time.sleep(0.02)


def _flush_loopback(timeout: float) -> None:
    """Return once every datagram this thread sent before has been delivered to its socket (or dropped there).

    Loopback delivery may be deferred to the kernel's softirq thread on a busy machine, so an empty
    receive queue right after ``sendto`` does not mean the collector has everything. Delivery is in
    order per CPU: pinned to one CPU, a probe sent to a socket of ours and read back comes after all
    of them."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind((LOOPBACK, 0))
        probe.settimeout(timeout)
        probe.sendto(b"probe", probe.getsockname())
        try:
            probe.recv(16)
        except socket.timeout:
            raise TimeoutError(f"a loopback datagram was not delivered within {timeout} s") from None


def _wait_drained(port: int, process: subprocess.Popen, timeout: float) -> int:
    """Wait until the collector has read and handled everything queued on its socket; its drop count.

    Fails (TimeoutError) if that does not happen within ``timeout``: stopping the collector with
    datagrams still queued would lose them, and the comparison after would blame the decoder."""
    deadline = time.monotonic() + timeout
    settled = 0
    while settled < 2:  # twice in a row: empty queue and every thread blocked, waiting for more
        state = _udp_socket_state(port, process.pid)
        if state is None:
            raise TimeoutError(f"the collector's socket on {LOOPBACK}:{port} is gone (exit status {process.poll()})")
        settled = settled + 1 if state[0] == 0 and _all_threads_asleep(process.pid) else 0
        if time.monotonic() > deadline:
            raise TimeoutError(f"the collector on {LOOPBACK}:{port} still had {state[0]} bytes queued "
                               f"or was busy after {timeout} s")
        time.sleep(0.02)
    return state[1]


def collect(datagrams: list[Datagram], kind: str, flowdir: Path | str, *, timeout: float = 30.0) -> Path:
    """Replay ``datagrams`` to ``nfcapd`` (kind ``"netflow"``) or ``sfcapd`` (``"sflow"``); its flow files' folder.

    The collector listens on 127.0.0.1 (a free port), writes to ``flowdir`` and is stopped with
    SIGTERM once its socket is drained, which makes it close its current file.
    """
    daemon = {"netflow": "nfcapd", "sflow": "sfcapd"}.get(kind)
    if daemon is None:
        raise ValueError(f"kind is 'netflow' (NetFlow v5/v9/IPFIX) or 'sflow', not {kind!r}")
    flows = Path(flowdir)
    flows.mkdir(parents=True, exist_ok=True)
    log = flows.parent / f"{flows.name}.{daemon}.log"
    for attempt in range(3):  # the free port can be taken between probing it and the bind
        port = free_udp_port()
        command = [require(daemon), "-b", LOOPBACK, "-p", str(port), "-w", str(flows),
                   "-t", "3600", "-B", str(4 << 20), "-P", str(flows.parent / f"{flows.name}.{daemon}.pid")]
        with _running(command, log, cwd=flows.parent) as process:
            try:
                _wait_bound(port, process, timeout=10)
            except TimeoutError:
                if process.poll() is not None and attempt < 2:
                    continue
                raise _fail(f"{daemon} did not start", command, log) from None
            _replay_delivered(datagrams, port, timeout)
            try:
                drops = _wait_drained(port, process, timeout)
            except TimeoutError as error:
                raise _fail(str(error), command, log) from None
            if drops:
                raise _fail(f"{daemon} dropped {drops} datagrams", command, log)
            process.send_signal(signal.SIGTERM)
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise _fail(f"{daemon} did not stop within {timeout} s", command, log) from None
            if code != 0:
                raise _fail(f"{daemon} exited with {code}", command, log)
        return flows
    raise AssertionError("unreachable")


def _nfdump(flows: Path, *args: str, timeout: float = 60.0) -> str:
    # -q: no header or summary; -N: plain numbers (never "1.2 M"); -6: IPv6 addresses in full
    command = [require("nfdump"), "-R", str(flows), "-q", "-N", "-6", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise ToolError(f"nfdump exited with {done.returncode}: {' '.join(command)}\n{done.stderr[-2000:]}")
    return done.stdout


def nfdump_flows(flows: Path | str, fields: tuple[str, ...] = ("ts", "te", "sa", "da", "sp", "dp", "pr", "byt", "pkt"),
                 *, aggregate: str | None = None) -> list[dict[str, str]]:
    """nfdump's records in ``flows`` (a folder of nfcapd/sfcapd files) as dicts of the named ``%`` fields."""
    fmt = "fmt:" + ",".join(f"%{f}" for f in fields)
    args = ["-o", fmt] + (["-a", "-A", aggregate] if aggregate else [])
    rows = []
    for line in _nfdump(Path(flows), *args).splitlines():
        if not line.strip() or line.strip() == "No matching flows":
            continue
        record = next(csv.reader(io.StringIO(line)))
        if len(record) != len(fields):
            raise ToolError(f"nfdump printed {line!r}, not the {len(fields)} fields {fields}")
        rows.append({name: value.strip() for name, value in zip(fields, record)})
    return rows


def nfdump_totals(datagrams: list[Datagram], kind: str, workdir: Path | str | None = None) -> Totals:
    """(src_ip, dst_ip) -> (bytes, packets) as nfdump sees ``datagrams`` (kind ``"netflow"`` or ``"sflow"``).

    Counts are what nfcapd/sfcapd store: multiplied by the sampling rate the exporter announces
    (docs/flow-tools.md). ``workdir`` keeps the flow files for inspection; by default a temporary
    folder is used and removed.
    """
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="nfdump-") as tmp:
            return nfdump_totals(datagrams, kind, tmp)
    flows = collect(datagrams, kind, Path(workdir) / f"{kind}-flows")
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for row in nfdump_flows(flows, ("sa", "da", "byt", "pkt"), aggregate="srcip,dstip"):
        entry = totals[(row["sa"], row["da"])]
        entry[0] += int(row["byt"])
        entry[1] += int(row["pkt"])
    return {key: (b, p) for key, (b, p) in totals.items()}


# -- tshark --------------------------------------------------------------------------------------

def _tshark(path: Path, *args: str, timeout: float = 120.0) -> str:
    command = [require("tshark"), "-n", "-r", str(path), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise ToolError(f"tshark exited with {done.returncode}: {' '.join(command)}\n{done.stderr[-2000:]}")
    return done.stdout


class Packet(NamedTuple):
    """One frame's outermost IP header as tshark reads it: its pair and two byte counts."""

    src: str
    dst: str
    ip_bytes: int
    frame_bytes: int


def tshark_packets(pcap_path: Path | str) -> list[Packet | None]:
    """Every frame of a capture in order: its outermost IP header (Packet), or None when it has none.

    ``ip_bytes`` is the IP length: ``ip.len`` for IPv4 (tshark takes the frame's length when it
    is 0, as for GSO/BIG TCP), ``ipv6.plen`` + 40 for IPv6 (the jumbo length + 40 for a
    jumbogram); ``frame_bytes`` is the frame's length on the wire (``frame.len``, link header
    and any trailer included).
    """
    fields = ["frame.protocols", "frame.len", "ip.src", "ip.dst", "ip.len", "ipv6.src", "ipv6.dst", "ipv6.plen",
              "ipv6.opt.jumbo"]
    args = ["-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"]
    for name in fields:
        args += ["-e", name]
    packets: list[Packet | None] = []
    for line in _tshark(Path(pcap_path), *args).splitlines():
        values = dict(zip(fields, line.split("\t")))
        layers = values["frame.protocols"].split(":")
        v4 = layers.index("ip") if "ip" in layers else len(layers)
        v6 = layers.index("ipv6") if "ipv6" in layers else len(layers)
        if v4 == v6:
            packets.append(None)
        elif v4 < v6:
            packets.append(Packet(values["ip.src"], values["ip.dst"], int(values["ip.len"]), int(values["frame.len"])))
        else:
            plen = int(values["ipv6.plen"])
            jumbo = values.get("ipv6.opt.jumbo", "")
            size = (int(jumbo) if plen == 0 and jumbo else plen) + 40
            packets.append(Packet(values["ipv6.src"], values["ipv6.dst"], size, int(values["frame.len"])))
    return packets


def totals_of(packets: list[Packet | None], *, length: str = "ip", offset: int = 0) -> Totals:
    """(src_ip, dst_ip) -> (bytes, packets) of ``packets``; bytes are ``length`` ("ip"/"frame") + ``offset``."""
    if length not in ("ip", "frame"):
        raise ValueError(f"length is 'ip' or 'frame', not {length!r}")
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for packet in packets:
        if packet is None:
            continue
        entry = totals[(packet.src, packet.dst)]
        entry[0] += (packet.ip_bytes if length == "ip" else packet.frame_bytes) + offset
        entry[1] += 1
    return {key: (b, p) for key, (b, p) in totals.items()}


def tshark_totals(pcap_path: Path | str, *, length: str = "ip") -> Totals:
    """(src_ip, dst_ip) -> (bytes, packets) of a capture's outermost IP headers, as tshark dissects them.

    ``length="ip"``: bytes are the IP length; ``"frame"``: the wire length (see tshark_packets).
    Frames without an IP header are left out.
    """
    return totals_of(tshark_packets(pcap_path), length=length)


def frame_count(pcap_path: Path | str) -> int:
    """How many frames a pcap or pcapng file holds (read here, without a tool)."""
    data = Path(pcap_path).read_bytes()
    if data[:4] == b"\x0a\x0d\x0d\x0a":  # pcapng: count packet blocks (enhanced, simple, obsolete)
        count, offset, endian = 0, 0, "<"
        while offset + 12 <= len(data):
            if data[offset:offset + 4] == b"\x0a\x0d\x0d\x0a":
                endian = "<" if data[offset + 8:offset + 12] == b"\x4d\x3c\x2b\x1a" else ">"
            kind, size = struct.unpack(endian + "II", data[offset:offset + 8])
            count += kind in (2, 3, 6)
            offset += size
        return count
    endian = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    count, offset = 0, 24
    while offset + 16 <= len(data):
        count += 1
        offset += 16 + struct.unpack(endian + "I", data[offset + 8:offset + 12])[0]
    return count


def tshark_flow_fields(collector_file: Path | str, fields: list[str], *, decode_as: dict[int, str] | None = None
                       ) -> list[list[str]]:
    """tshark's values of ``fields`` for each frame of a collector file, e.g. ``cflow.octets``.

    ``decode_as`` maps a UDP port to a dissector (``{2055: "cflow"}``, ``{6343: "sflow"}``) for
    ports tshark does not guess. Multiple occurrences of a field in a frame are comma separated.
    """
    args = ["-T", "fields", "-E", "separator=/t", "-E", "aggregator=,"]
    for port, dissector in (decode_as or {}).items():
        args += ["-d", f"udp.port=={port},{dissector}"]
    for name in fields:
        args += ["-e", name]
    return [line.split("\t") for line in _tshark(Path(collector_file), *args).splitlines()]
