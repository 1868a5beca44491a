"""``traffic collect``: receive flow telemetry over UDP and store every datagram, undecoded, in the inbox.

    traffic collect [--listen HOST:PORT ...] [--allow BLOCKS | --allow-any] [--inbox DIR] [--rotate 60s]
                    [--status FILE] [--metrics 127.0.0.1:9155]

DESIGN §7a. Each datagram is written with its receive time (the kernel's, ``SO_TIMESTAMP``) and its
exporter's address and port as one record of a classic pcap (``traffic.io.datagrams``) in
``inbox/<source>/``, where the source is the ``exporters`` setting's name for the address, else
the address itself (``source_folder``). A file is written under a hidden name (``.<name>``, which
the inbox never takes) while it is open, and fsynced and renamed to ``<UTC time of its first
datagram>-<pid>.flows.pcap`` when its rotation period ends or the collector stops: one file per source
per period, and only for sources that sent something.

Who may export (§7a): UDP senders can be spoofed, so only datagrams from the ``allowed_exporters``
blocks are written; any other sender's are dropped and counted, one by one for the first
``REFUSED_SENDERS`` senders and together as ``others`` after that, so spoofed addresses cost a fixed
amount of memory and make no file or source. A listen another machine can reach needs that list or
an explicit ``--allow-any``, checked before anything is bound; a loopback-only listen (the default,
the demo, the tests) takes every sender, since only this machine can reach it.

Periods (``--rotate``, ``--flush``, ``--status-every``, ``--log-every``) are bare seconds or durations
(``2s``, ``15m``), read by the settings' ``parse_duration`` like every other duration.

What a crash loses: received datagrams are handed to the operating system every ``flush`` seconds
and every ``flush_datagrams`` datagrams, so a SIGKILL loses at most those received since the last
flush (and whatever still sat in the socket buffer). The next start completes a hidden file a
killed collector left (``recover``): its whole records are kept, a torn last record is cut, and it
is renamed, so nothing flushed is lost. A hidden file is only taken when no process holds its lock
(each open file is ``flock``-ed), so two collectors may share an inbox.

Operator documentation: ``docs/collect.md``.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import json
import math
import mmap
import os
import re
import selectors
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Mapping

from traffic.core.records import canonical_ip
# The setting's own parsers, so ``--allow`` reads blocks and ``--rotate`` durations exactly as the settings do.
from traffic.core.settings import SettingsError, _parse_exporter_blocks, parse_duration
from traffic.io.datagrams import MAX_DATAGRAM, PCAP_HEADER, datagram_record

#: Where flow telemetry usually arrives: NetFlow (2055), IPFIX (4739), sFlow (6343); loopback only.
DEFAULT_LISTEN = ("127.0.0.1:2055", "127.0.0.1:4739", "127.0.0.1:6343")
MIB = 1 << 20
#: Senders outside ``allowed_exporters`` counted one by one; the datagrams of any further sender are
#: counted together as ``others``, so a flood of spoofed addresses costs a fixed amount of memory.
REFUSED_SENDERS = 256
#: The longest ``--rotate``, ``--flush``, ``--status-every`` and ``--log-every``: the loop waits at most this
#: long at a time, and the kernel's wait takes at most about 24 days.
_LONGEST_PERIOD = 86_400.0

# Linux socket options the ``socket`` module does not name (asm-generic/socket.h, linux/in.h).
_SO_TIMESTAMP = getattr(socket, "SO_TIMESTAMP", 29)
_SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
_IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)
_IPV6_RECVPKTINFO = getattr(socket, "IPV6_RECVPKTINFO", 49)
_IPV6_PKTINFO = getattr(socket, "IPV6_PKTINFO", 50)
_MSG_TRUNC = int(socket.MSG_TRUNC)  # a plain int: flag enums cost microseconds per datagram
_TIMEVAL = struct.Struct("@ll")
_ANCILLARY = socket.CMSG_SPACE(_TIMEVAL.size) + socket.CMSG_SPACE(20)
#: Datagrams taken from one socket before the others and the timers get their turn.
_BATCH = 256
#: A record header of the pcap files: seconds, microseconds, captured length, original length.
_RECORD = struct.Struct("<IIII")
#: Longest record the collector writes: an IPv6 header, a UDP header and the largest datagram.
_MAX_FRAME = 40 + 8 + MAX_DATAGRAM
#: Names of the collector's files, complete (group 1) and while written (a leading dot).
#: Ingest decodes a ``.flows.pcap`` file's datagrams as flow telemetry (DESIGN §7a), whatever its source.
SUFFIX = ".flows.pcap"
_FILE_NAME = re.compile(r"^\.?(\d{8}T\d{6}\.\d{6}Z-\d+(?:-\d+)?(?:-r\d+)?\.flows\.pcap)$")


class CollectError(RuntimeError):
    """The collector cannot start or go on; the message is one line saying why and what to do."""


@dataclass(frozen=True)
class Endpoint:
    """An address and UDP port to listen on."""

    host: str
    port: int

    @property
    def family(self) -> int:
        return socket.AF_INET6 if ":" in self.host else socket.AF_INET

    @property
    def wildcard(self) -> bool:
        return ipaddress.ip_address(self.host).is_unspecified

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.host).is_loopback

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str) -> Endpoint:
    """``host:port`` or ``[v6 host]:port`` with an IP literal (no names: what is bound is what is said)."""
    text = text.strip()
    match = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:\[\]]+):(\d+)", text)
    if not match:
        raise CollectError(f"--listen {text!r}: expected address:port, e.g. 127.0.0.1:2055 or [::1]:2055")
    host, port = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise CollectError(f"--listen {text!r}: {host!r} is not an IP address") from None
    if address.version == 6 and address.scope_id is not None:
        raise CollectError(f"--listen {text!r}: a zone id (%…) is not supported; listen on a global or ::1 address")
    if not 1 <= int(port) <= 65535:
        raise CollectError(f"--listen {text!r}: port {port} is not in 1–65535")
    return Endpoint(str(address), int(port))


def parse_size(name: str, text: str) -> int:
    """Bytes from ``33554432``, ``512K``, ``32M`` or ``1G``."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)i?[bB]?\s*", str(text))
    if not match:
        raise CollectError(f"{name} {text!r}: expected a size in bytes (e.g. 32M, 512K, 33554432)")
    return int(match.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[match.group(2).lower()]


def parse_seconds(name: str, value, least: float, zero: bool = False) -> float:
    """Seconds from bare seconds (``2``, ``0.05``) or a duration (``90s``, ``15m``, ``2h``): the settings'
    ``parse_duration``, so every duration of the project is written alike; a number is taken as it is
    so fractions of a second stay possible. ``zero``: 0 is allowed too (it means "never")."""
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        number = None
    if number is not None and not math.isfinite(number):
        raise CollectError(f"{name} {text!r}: not a duration (use seconds, or 90s, 15m, 2h)")
    try:
        seconds = parse_duration(name, number if number is not None and number >= 0 else text).total_seconds()
    except SettingsError as error:
        raise CollectError(str(error)) from None
    except OverflowError:
        seconds = math.inf
    if zero and seconds == 0:
        return 0.0
    if not least <= seconds <= _LONGEST_PERIOD:
        raise CollectError(f"{name} {text}: must be from {least:g} s to {_LONGEST_PERIOD / 3600:g} h")
    return seconds


def parse_allowed(name: str, blocks) -> tuple:
    """Address blocks (``ipaddress`` networks) from the setting's text or list, checked as the setting checks it."""
    try:
        return tuple(ipaddress.ip_network(block) for block in _parse_exporter_blocks(name, list(blocks or ())))
    except SettingsError as error:
        raise CollectError(str(error)) from None


def sender_allowed(address: str, blocks) -> bool:
    """Whether a sender's canonical address lies in one of the blocks. An IPv4 sender also matches an
    IPv4-mapped IPv6 block (``::ffff:10.0.0.0/104``), whichever family its socket had."""
    ip = ipaddress.ip_address(address)
    forms = (ip, ipaddress.IPv6Address(f"::ffff:{ip}")) if ip.version == 4 else (ip,)
    return any(form in block for block in blocks for form in forms if form.version == block.version)


def ipv4_blocks(blocks) -> tuple[tuple[int, int], ...]:
    """(network, mask) integers of the blocks an IPv4 sender may match: the IPv4 blocks, an IPv4-mapped
    block as IPv4, and an IPv6 block holding all of ``::ffff:0:0/96`` as 0.0.0.0/0 (``sender_allowed``'s rule,
    precomputed so a flood of refused IPv4 senders costs integer tests, not ``ipaddress`` objects)."""
    mapped = ipaddress.ip_network("::ffff:0:0/96")
    found = []
    for block in blocks:
        if block.version == 6 and block.prefixlen >= 96 and block.subnet_of(mapped):
            block = ipaddress.ip_network(f"{block.network_address.ipv4_mapped}/{block.prefixlen - 96}")
        elif block.version == 6 and block.prefixlen < 96 and mapped.subnet_of(block):
            block = ipaddress.ip_network("0.0.0.0/0")
        if block.version == 4:
            found.append((int(block.network_address), int(block.netmask)))
    return tuple(found)


def check_who_may_export(options: "CollectOptions") -> None:
    """A listen other machines can reach needs ``allowed_exporters`` or an explicit ``--allow-any``
    (DESIGN §7a): UDP senders can be spoofed, and every sender would otherwise become a source.
    Loopback-only listens need neither: only this machine reaches them."""
    if options.allow and options.allow_any:
        raise CollectError("--allow-any and allowed_exporters (--allow) say opposite things: give one of them")
    exposed = [endpoint for endpoint in options.listen if not endpoint.loopback]
    if exposed and not options.allow and not options.allow_any:
        raise CollectError(f"--listen {exposed[0]} is reachable from other machines: say which exporters may send "
                           "(--allow 192.0.2.0/24, the allowed_exporters setting or TRAFFIC_ALLOWED_EXPORTERS), "
                           "or take any sender with --allow-any")


def source_folder(address: str) -> str:
    """The inbox folder of an exporter with no name in ``exporters``: its canonical address, with the
    colons of an IPv6 address written as ``-`` (``2001:db8::1`` → ``2001-db8--1``), since a colon in a
    folder name breaks Windows shares, ``scp`` and ``docker -v`` paths; a leading ``::`` is written
    ``0::`` first (``::1`` → ``0--1``), so no folder starts with ``-`` and reads as an option."""
    return ("0" + address if address.startswith("::") else address).replace(":", "-")


@dataclass
class CollectOptions:
    """How ``traffic collect`` runs (the command line's options; defaults are the documented ones)."""

    listen: tuple[Endpoint, ...] = tuple(parse_listen(text) for text in DEFAULT_LISTEN)
    rotate: float = 60.0
    flush: float = 1.0
    flush_datagrams: int = 10_000
    rcvbuf: int = 32 * MIB
    status: Path | None = None
    status_every: float = 5.0
    log_every: float = 60.0
    metrics: Endpoint | None = None
    allow: tuple = ()  # ``ipaddress`` networks: the only senders taken (empty: every sender, loopback only)
    allow_any: bool = False  # every sender, also on a listen other machines reach (``--allow-any``)
    refused_senders: int = REFUSED_SENDERS


def build_options(listen: list[str] | None = None, rotate: float | str = 60.0, flush: float | str = 1.0,
                  flush_datagrams: int = 10_000, rcvbuf: str = "32M", status: str | None = None,
                  status_every: float | str = 5.0, log_every: float | str = 60.0, metrics: str | None = None,
                  allow=(), allow_any: bool = False) -> CollectOptions:
    """Checked options from the command line's values (a ``CollectError`` names the one to fix).

    Periods are bare seconds or durations (``2s``, ``15m``); ``allow`` is address blocks (the
    ``allowed_exporters`` setting, or ``--allow``)."""
    endpoints = tuple(parse_listen(text) for text in (listen or DEFAULT_LISTEN))
    repeated = sorted({str(e) for e in endpoints if endpoints.count(e) > 1})
    if repeated:
        raise CollectError(f"--listen {repeated[0]} is given twice")
    rotate, flush = parse_seconds("--rotate", rotate, 1.0), parse_seconds("--flush", flush, 0.01)
    status_every = parse_seconds("--status-every", status_every, 0.1)
    log_every = parse_seconds("--log-every", log_every, 0.1, zero=True)
    if flush_datagrams < 1:
        raise CollectError(f"--flush-datagrams {flush_datagrams}: must be at least 1")
    options = CollectOptions(endpoints, rotate, flush, int(flush_datagrams), parse_size("--rcvbuf", rcvbuf),
                             Path(status).absolute() if status else None, status_every, log_every,
                             parse_listen(metrics) if metrics else None, parse_allowed("--allow", allow),
                             bool(allow_any))
    check_who_may_export(options)
    return options


@dataclass
class _Sink:
    """A pcap file of one source being written under its hidden name."""

    source: str
    folder: Path
    name: str
    fd: int
    pending: list = field(default_factory=list)  # records not yet handed to the operating system

    @property
    def temporary(self) -> Path:
        return self.folder / f".{self.name}"


@dataclass
class _Exporter:
    """One exporter address: its source and its counts."""

    address: str
    source: str
    datagrams: int = 0
    bytes: int = 0
    oversized: int = 0
    last_seen_us: int = 0
    sink: _Sink | None = None


@dataclass
class _Refused:
    """A sender outside ``allowed_exporters`` (or all further ones, ``others``): what it sent, not stored."""

    address: str
    datagrams: int = 0
    bytes: int = 0
    last_seen_us: int = 0

    def count(self, size: int, ts_us: int) -> None:
        self.datagrams += 1
        self.bytes += size
        self.last_seen_us = ts_us

    def as_status(self) -> dict:
        seen = datetime.fromtimestamp(self.last_seen_us / 1e6, timezone.utc).isoformat() if self.datagrams else None
        return {"datagrams": self.datagrams, "bytes": self.bytes, "last_seen": seen}


@dataclass
class _Listener:
    """A bound socket, the receive buffer the kernel granted it and its drop count."""

    endpoint: Endpoint
    sock: socket.socket
    rcvbuf: int
    inode: int
    drops: int | None = None


class Collector:
    """The collector: bind with ``start``, receive with ``serve`` (until ``stop``), finish with ``close``.

    Runs in-process (tests run ``serve`` in a thread; ``stop`` may be called from any thread or a
    signal handler) or through ``run`` (the command).
    """

    def __init__(self, inbox: Path, exporters: Mapping[str, str], options: CollectOptions,
                 log: Callable[[str], None] | None = None):
        self.inbox = Path(inbox)
        self.names = dict(exporters)
        self.options = options
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.listeners: list[_Listener] = []
        self.exporters: dict[str, _Exporter] = {}  # allowed senders only
        self.sinks: dict[str, _Sink] = {}
        #: Senders whose datagrams were dropped (not in ``allowed_exporters``), at most ``refused_senders``
        #: of them; the rest are counted in ``refused_others``.
        self.refused: dict[str, _Refused] = {}
        self.refused_others = _Refused("others")
        self._take_any = options.allow_any or not options.allow
        self._ipv4_blocks = ipv4_blocks(options.allow)
        self.files_written = 0
        self.started_at = time.time()
        self._pending = 0
        self._buffer = bytearray(MAX_DATAGRAM + 1024)
        self._view = memoryview(self._buffer)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._metrics_server = None
        self._period = self._period_of(time.time())
        #: Added to every receive time. Zero for a real collector; ``traffic demo`` drives a collector
        #: in-process (``drain``/``complete``) and shifts it so its live datagrams land in its sample's past.
        self.clock_offset_us = 0

    # -- start --------------------------------------------------------------------------------------
    def start(self) -> "Collector":
        """Check the inbox, complete what a killed collector left, bind every address, serve metrics."""
        try:
            check_who_may_export(self.options)  # before anything is bound: a refused start opens no port
            self._check_inbox()
            for line in recover(self.inbox):
                self.log(f"collect: {line}")
            for endpoint in self.options.listen:
                self.listeners.append(self._bind(endpoint))
            if self.options.metrics is not None:
                self._serve_metrics(self.options.metrics)
            try:
                self._write_status()
            except OSError as error:
                raise CollectError(f"status file {self.options.status} cannot be written: "
                                   f"{error.strerror or error}") from None
        except BaseException:
            self._close_sockets()
            raise
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        for listener in self.listeners:
            self._selector.register(listener.sock, selectors.EVENT_READ, listener)
            note = "" if listener.endpoint.loopback else " (reachable from other machines)"
            short = "" if listener.rcvbuf >= self.options.rcvbuf else (
                f"; asked {self.options.rcvbuf / MIB:g} MiB: raise net.core.rmem_max or run with CAP_NET_ADMIN")
            self.log(f"collect: listening on {listener.endpoint}{note}, receive buffer {listener.rcvbuf / MIB:g} MiB"
                     f"{short}")
        self.log(f"collect: {self._who_may_export()}")
        self._read_drops()
        return self

    def _who_may_export(self) -> str:
        if self.options.allow:
            return (f"taking datagrams only from {', '.join(map(str, self.options.allow))} (allowed_exporters); "
                    "others are dropped and counted in the status")
        if self.options.allow_any:
            return "taking datagrams from any sender (--allow-any)"
        return "taking datagrams from any sender: listening on loopback only, so only this machine can send"

    def _check_inbox(self) -> None:
        probe = self.inbox / f".collect-probe-{os.getpid()}"
        try:
            self.inbox.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as error:
            raise CollectError(f"inbox {self.inbox} cannot be written: {error.strerror or error} "
                               "(create it, fix its permissions, or choose another with --inbox)") from None

    def _bind(self, endpoint: Endpoint) -> _Listener:
        sock = socket.socket(endpoint.family, socket.SOCK_DGRAM)
        try:
            if endpoint.family == socket.AF_INET6:
                # One address means one family: [::] does not take IPv4 too (0.0.0.0 may be bound beside it).
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((endpoint.host, endpoint.port))
        except OSError as error:
            sock.close()
            raise CollectError(f"cannot listen on {endpoint}: {_bind_problem(error)}") from None
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMP, 1)
        if endpoint.wildcard:  # the address each datagram was sent to, for its record
            if endpoint.family == socket.AF_INET:
                sock.setsockopt(socket.IPPROTO_IP, _IP_PKTINFO, 1)
            else:
                sock.setsockopt(socket.IPPROTO_IPV6, _IPV6_RECVPKTINFO, 1)
        granted = set_receive_buffer(sock, self.options.rcvbuf)
        return _Listener(endpoint, sock, granted, os.fstat(sock.fileno()).st_ino)

    def _serve_metrics(self, endpoint: Endpoint) -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server  # deferred: only with --metrics
        except ImportError:
            raise CollectError("--metrics needs the prometheus-client package (scripts/setup.sh installs it)") from None

        registry = CollectorRegistry(auto_describe=True)
        registry.register(_Metrics(self))
        try:
            server, _ = start_http_server(endpoint.port, endpoint.host, registry=registry)
        except OSError as error:
            raise CollectError(f"cannot serve metrics on {endpoint}: {_bind_problem(error)}") from None
        self._metrics_server = server
        self.log(f"collect: metrics at http://{endpoint}/metrics")

    # -- the loop -----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask ``serve`` to return (safe from another thread or a signal handler)."""
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:  # already closed, or the pipe is full: the flag is enough
            pass

    def serve(self) -> None:
        """Receive until ``stop``: write, flush, rotate, and report on time."""
        options = self.options
        now = time.monotonic()
        next_flush, next_status, next_log = now + options.flush, now + options.status_every, now + options.log_every
        last_log, last_counts = now, self.totals()
        while not self._stopping:
            deadline = min(next_flush, next_status, next_log if options.log_every > 0 else next_status,
                           now + self._until_rotation())
            for key, _ in self._selector.select(max(0.0, deadline - now)):
                if key.data is None:
                    try:
                        self._wake_r.recv(4096)
                    except BlockingIOError:
                        pass
                else:
                    self._drain(key.data)
            now = time.monotonic()
            if self._period_of(time.time()) != self._period:
                self._rotate()
            if now >= next_flush or self._pending >= options.flush_datagrams:
                self._flush()
                next_flush = now + options.flush
            if now >= next_status:
                self._read_drops()
                self._write_status()
                next_status = now + options.status_every
            if options.log_every > 0 and now >= next_log:
                counts = self.totals()
                self.log("collect: " + self._summary(counts, last_counts, now - last_log))
                last_log, last_counts, next_log = now, counts, now + options.log_every

    def drain(self) -> int:
        """Take every datagram waiting on every socket now, without blocking (for a collector driven
        in-process instead of by ``serve``); returns the datagrams received so far."""
        for listener in self.listeners:
            while self._drain(listener) == _BATCH:  # a full batch: more may wait (dropped ones count too)
                pass
        return self.totals()[0]

    def complete(self) -> None:
        """Flush and complete every open file now (as at the end of a rotation period)."""
        self._rotate()

    def _drain(self, listener: _Listener) -> int:
        """Take up to ``_BATCH`` datagrams waiting on one socket; how many were taken."""
        recv, buffers, view = listener.sock.recvmsg_into, [self._buffer], self._view
        exporters, port = self.exporters, listener.endpoint.port
        destination = None if listener.endpoint.wildcard else listener.endpoint.host
        for taken in range(_BATCH):
            try:
                size, ancillary, flags, sender = recv(buffers, _ANCILLARY)
            except (BlockingIOError, InterruptedError):
                return taken
            ts_us, target = 0, destination
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMP:
                    seconds, micros = _TIMEVAL.unpack(data[:_TIMEVAL.size])
                    ts_us = seconds * 1_000_000 + micros
                elif level == socket.IPPROTO_IP and kind == _IP_PKTINFO:
                    target = socket.inet_ntop(socket.AF_INET, data[8:12])
                elif level == socket.IPPROTO_IPV6 and kind == _IPV6_PKTINFO:
                    target = socket.inet_ntop(socket.AF_INET6, data[:16])
            ts_us = (ts_us or time.time_ns() // 1000) + self.clock_offset_us
            exporter = exporters.get(sender[0]) or self._admit(sender[0])
            if exporter is None:  # not an allowed exporter: counted, never written
                self._refuse(sender[0], size, ts_us)
                continue
            exporter.last_seen_us = ts_us
            if size > MAX_DATAGRAM or flags & _MSG_TRUNC:
                exporter.oversized += 1  # only IPv6 can carry one; pcap records of it could not be read back
                continue
            exporter.datagrams += 1
            exporter.bytes += size
            sink = exporter.sink or self._open(exporter, ts_us)
            sink.pending.append(datagram_record(ts_us, exporter.address, sender[1], target or listener.endpoint.host,
                                                port, bytes(view[:size])))
            self._pending += 1
        if self._pending >= self.options.flush_datagrams:
            self._flush()
        return _BATCH

    def _admit(self, host: str) -> _Exporter | None:
        """The exporter of a sender seen for the first time (or refused before: None again).

        Only allowed senders get an ``_Exporter``: what a spoofed sender can make the collector keep is
        its line in the bounded ``refused`` table."""
        if host in self.refused:
            return None
        if self._take_any:
            return self._exporter(host)
        if ":" not in host:  # IPv4, as the kernel writes it: integer masks, a spoofing flood's usual shape
            number = int.from_bytes(socket.inet_aton(host), "big")
            allowed = any(number & mask == network for network, mask in self._ipv4_blocks)
        else:
            allowed = sender_allowed(canonical_ip(host.split("%", 1)[0]), self.options.allow)
        return self._exporter(host) if allowed else None

    def _refuse(self, host: str, size: int, ts_us: int) -> None:
        """Count a dropped datagram for its sender, or in ``others`` once the table is full."""
        entry = self.refused.get(host)
        if entry is None:
            if len(self.refused) >= self.options.refused_senders:
                self.refused_others.count(size, ts_us)
                return
            entry = self.refused[host] = _Refused(canonical_ip(host.split("%", 1)[0]))
            if len(self.refused) == 1:
                self.log(f"collect: dropping datagrams from {entry.address}: not in allowed_exporters (every "
                         "refused sender is counted in the status file and the status line)")
        entry.count(size, ts_us)

    def refused_totals(self) -> tuple[int, int]:
        """(datagrams dropped because their sender is not allowed, senders counted by name)."""
        return (sum(e.datagrams for e in list(self.refused.values())) + self.refused_others.datagrams,
                len(self.refused))

    def _exporter(self, host: str) -> _Exporter:
        address = canonical_ip(host.split("%", 1)[0])
        exporter = _Exporter(address, self.names.get(address) or source_folder(address))
        self.exporters[host] = exporter
        return exporter

    # -- files --------------------------------------------------------------------------------------
    def _open(self, exporter: _Exporter, ts_us: int) -> _Sink:
        """The open file of the exporter's source, started now if there is none this period."""
        sink = self.sinks.get(exporter.source)
        if sink is None:
            folder = self.inbox / exporter.source
            folder.mkdir(exist_ok=True)
            stamp = datetime.fromtimestamp(ts_us // 1_000_000, timezone.utc).strftime("%Y%m%dT%H%M%S")
            base = f"{stamp}.{ts_us % 1_000_000:06d}Z-{os.getpid()}"
            for attempt in range(1000):  # a clock stepped back could meet a name already used
                name = f"{base}-{attempt}{SUFFIX}" if attempt else f"{base}{SUFFIX}"
                if (folder / name).exists():
                    continue
                try:
                    fd = os.open(folder / f".{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    continue
                break
            else:
                raise CollectError(f"no free file name in {folder} for {base}{SUFFIX}")
            fcntl.flock(fd, fcntl.LOCK_EX)  # held while written: ``recover`` leaves a locked file alone
            sink = self.sinks[exporter.source] = _Sink(exporter.source, folder, name, fd, [PCAP_HEADER])
        exporter.sink = sink
        return sink

    def _flush(self) -> None:
        """Hand every pending record to the operating system (what a SIGKILL may lose ends here)."""
        for sink in self.sinks.values():
            if sink.pending:
                _write_all(sink.fd, b"".join(sink.pending))
                sink.pending.clear()
        self._pending = 0

    def _rotate(self) -> None:
        """Complete every open file: the period it belongs to is over."""
        self._flush()
        for sink in list(self.sinks.values()):
            self._complete(sink)
        self.sinks.clear()
        for exporter in self.exporters.values():
            exporter.sink = None
        self._period = self._period_of(time.time())

    def _complete(self, sink: _Sink) -> None:
        os.fsync(sink.fd)
        os.rename(sink.temporary, sink.folder / sink.name)
        _fsync_folder(sink.folder)
        os.close(sink.fd)
        self.files_written += 1

    def _period_of(self, now: float) -> int:
        return int(now // self.options.rotate)

    def _until_rotation(self) -> float:
        return (self._period + 1) * self.options.rotate - time.time()

    # -- counts -------------------------------------------------------------------------------------
    def totals(self) -> tuple[int, int, int]:
        """(datagrams, payload bytes, kernel drops) so far."""
        exporters = list(self.exporters.values())
        return (sum(e.datagrams for e in exporters), sum(e.bytes for e in exporters),
                sum(listener.drops or 0 for listener in self.listeners))

    def _summary(self, counts, before, seconds: float) -> str:
        datagrams, size, drops = counts
        rate = (datagrams - before[0]) / seconds if seconds > 0 else 0.0
        return (f"{datagrams:,} datagrams ({size / MIB:,.1f} MiB) from {len({e.address for e in self.exporters.values()})} "
                f"exporter(s), {rate:,.0f}/s lately; kernel drops {drops:,}; {self.files_written:,} file(s) written"
                f"{self._refused_summary()}")

    def _refused_summary(self) -> str:
        refused, senders = self.refused_totals()
        if not refused:
            return ""
        others = f" and {self.refused_others.datagrams:,} from further senders" if self.refused_others.datagrams else ""
        return f"; dropped {refused:,} datagrams of {senders:,} sender(s) not in allowed_exporters{others}"

    def _read_drops(self) -> None:
        drops = kernel_drops([listener.inode for listener in self.listeners])
        for listener in self.listeners:
            listener.drops = drops.get(listener.inode, listener.drops)

    def status(self) -> dict:
        """The counts as the status file holds them (JSON-ready)."""
        per_source: dict[str, dict] = {}
        exporters = {}
        for exporter in list(self.exporters.values()):
            entry = exporters.setdefault(exporter.address, {"source": exporter.source, "datagrams": 0, "bytes": 0,
                                                            "oversized": 0, "last_seen": None})
            entry["datagrams"] += exporter.datagrams
            entry["bytes"] += exporter.bytes
            entry["oversized"] += exporter.oversized
            seen = datetime.fromtimestamp(exporter.last_seen_us / 1e6, timezone.utc).isoformat()
            entry["last_seen"] = max(entry["last_seen"] or seen, seen)
            source = per_source.setdefault(exporter.source, {"datagrams": 0, "bytes": 0})
            source["datagrams"] += exporter.datagrams
            source["bytes"] += exporter.bytes
        datagrams, size, drops = self.totals()
        return {
            "pid": os.getpid(),
            "started_at": datetime.fromtimestamp(self.started_at, timezone.utc).isoformat(),
            "updated_at": datetime.now(timezone.utc).isoformat(),
            "inbox": str(self.inbox),
            "listen": [{"address": str(listener.endpoint), "rcvbuf": listener.rcvbuf, "kernel_drops": listener.drops}
                       for listener in self.listeners],
            "datagrams": datagrams,
            "bytes": size,
            "kernel_drops": drops,
            "files_written": self.files_written,
            "open_files": sorted(f"{sink.source}/.{sink.name}" for sink in list(self.sinks.values())),
            "exporters": exporters,
            "sources": per_source,
            "allowed_exporters": [str(block) for block in self.options.allow] or (
                "any" if self.options.allow_any else "any (loopback only)"),
            "refused": {
                "datagrams": self.refused_totals()[0],
                "senders": {entry.address: entry.as_status() for entry in list(self.refused.values())},
                "senders_counted_max": self.options.refused_senders,
                "others": self.refused_others.as_status(),
            },
        }

    def _write_status(self) -> None:
        if self.options.status is None:
            return
        path = self.options.status
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(self.status(), indent=1) + "\n")
        os.replace(temporary, path)

    # -- end ----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Complete every open file, write the last status, release the sockets."""
        self._rotate()
        self._read_drops()
        self._write_status()
        self._close_sockets()

    def _close_sockets(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None
        for listener in self.listeners:
            try:
                self._selector.unregister(listener.sock)
            except (KeyError, ValueError):
                pass
            listener.sock.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()


class _Metrics:
    """The collector's counts for Prometheus, read at scrape time (nothing is counted twice per datagram)."""

    def __init__(self, collector: Collector):
        self.collector = collector

    def collect(self):
        from prometheus_client.core import CounterMetricFamily  # deferred: only with --metrics

        datagrams = CounterMetricFamily("traffic_collect_datagrams", "Datagrams received", labels=["exporter", "source"])
        size = CounterMetricFamily("traffic_collect_bytes", "UDP payload bytes received", labels=["exporter", "source"])
        drops = CounterMetricFamily("traffic_collect_kernel_drops", "Datagrams the kernel dropped (socket buffer full)",
                                    labels=["listen"])
        files = CounterMetricFamily("traffic_collect_files_written", "Completed files written to the inbox")
        refused = CounterMetricFamily("traffic_collect_refused_datagrams",
                                      "Datagrams dropped: their sender is not in allowed_exporters "
                                      "(sender=\"others\": senders beyond the counted ones)", labels=["sender"])
        for exporter in list(self.collector.exporters.values()):
            datagrams.add_metric([exporter.address, exporter.source], exporter.datagrams)
            size.add_metric([exporter.address, exporter.source], exporter.bytes)
        for listener in self.collector.listeners:
            drops.add_metric([str(listener.endpoint)], listener.drops or 0)
        files.add_metric([], self.collector.files_written)
        for entry in [*list(self.collector.refused.values()), self.collector.refused_others]:
            if entry.datagrams:
                refused.add_metric([entry.address], entry.datagrams)
        yield from (datagrams, size, drops, files, refused)


# -- helpers ----------------------------------------------------------------------------------------
def set_receive_buffer(sock: socket.socket, size: int) -> int:
    """Ask for a receive buffer of ``size`` bytes; the size the kernel granted.

    Linux caps ``SO_RCVBUF`` at ``net.core.rmem_max`` and reports twice what was set (it counts its
    bookkeeping); ``SO_RCVBUFFORCE`` (root or CAP_NET_ADMIN) passes the cap. The granted figure is
    what ``getsockopt`` reports.
    """
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, size)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, min(size, 0x7FFFFFFF))
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)


def kernel_drops(inodes: list[int]) -> dict[int, int]:
    """Datagrams the kernel dropped per socket inode (``/proc/net/udp`` and ``udp6``, Linux); empty elsewhere."""
    wanted, found = set(inodes), {}
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(table) as handle:
                next(handle, None)
                for line in handle:
                    fields = line.split()
                    if len(fields) >= 13 and fields[9].isdigit() and int(fields[9]) in wanted:
                        found[int(fields[9])] = int(fields[12])
        except OSError:
            continue
    return found


def recover(inbox: Path) -> list[str]:
    """Complete the hidden files a killed collector left in ``inbox/<source>/``; one line per file.

    Whole records are kept and a torn last record is cut; a file with no whole record is removed.
    A file still locked by a running collector, or whose start is not a collector file's header, is
    left alone.
    """
    lines = []
    for folder in sorted(p for p in inbox.iterdir() if p.is_dir() and not p.is_symlink()):
        for path in sorted(folder.glob(f".*{SUFFIX}")):
            match = _FILE_NAME.match(path.name)
            if not match or not path.is_file() or path.is_symlink():
                continue
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a running collector is writing it
                size = os.fstat(fd).st_size
                end, records = complete_length(fd, size)
                where = f"{folder.name}/{path.name}"
                if end is None:
                    lines.append(f"left {where} alone: it does not start like a collector file")
                    continue
                if records == 0:
                    os.unlink(path)
                    lines.append(f"removed {where} left by a stopped collector: it held no whole datagram")
                    continue
                if end < size:
                    os.ftruncate(fd, end)
                os.fsync(fd)
                final = folder / match.group(1)
                if final.exists():
                    final = folder / match.group(1).replace(SUFFIX, f"-r{os.getpid()}{SUFFIX}")
                os.rename(path, final)
                _fsync_folder(folder)
                cut = f", a torn last record of {size - end:,} bytes cut" if end < size else ""
                lines.append(f"completed {folder.name}/{final.name} left by a stopped collector "
                             f"({records:,} datagrams{cut})")
            finally:
                os.close(fd)
    return lines


def complete_length(fd: int, size: int) -> tuple[int | None, int]:
    """(bytes of the whole records, how many) of a collector file; (None, 0) when it is not one."""
    if size < len(PCAP_HEADER):
        return (0, 0) if PCAP_HEADER.startswith(os.pread(fd, size, 0)) else (None, 0)
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as data:
        if data[:len(PCAP_HEADER)] != PCAP_HEADER:
            return None, 0
        offset, records, unpack = len(PCAP_HEADER), 0, _RECORD.unpack_from
        while offset + _RECORD.size <= size:
            captured = unpack(data, offset)[2]
            if captured > _MAX_FRAME or offset + _RECORD.size + captured > size:
                break
            offset += _RECORD.size + captured
            records += 1
    return offset, records


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _bind_problem(error: OSError) -> str:
    """Why an address cannot be bound, as an operator reads it."""
    return {
        errno.EADDRINUSE: "the port is in use by another program (stop it, or choose another port with --listen)",
        errno.EADDRNOTAVAIL: "the address is not one of this machine's",
        errno.EACCES: "ports below 1024 need root or CAP_NET_BIND_SERVICE",
        errno.EAFNOSUPPORT: "this machine has no IPv6",
    }.get(error.errno, error.strerror or str(error))


def run(inbox: Path, exporters: Mapping[str, str], options: CollectOptions) -> int:
    """Run the collector in this process until SIGTERM or SIGINT; 0 once every file is complete."""
    collector = Collector(inbox, exporters, options)
    # Before ``start``: once the status file exists a supervisor may stop us, and that must be a clean stop.
    previous = {sig: signal.signal(sig, lambda *_: collector.stop()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        collector.start()
        collector.log(f"collect: writing to {inbox}/<source>/, a file per source every {options.rotate:g} s; "
                      "stop with SIGTERM or Ctrl-C")
        try:
            collector.serve()
        finally:
            collector.close()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    datagrams, size, drops = collector.totals()
    collector.log(f"collect: stopped: {datagrams:,} datagrams ({size / MIB:,.1f} MiB), kernel drops {drops:,}, "
                  f"{collector.files_written:,} file(s) written{collector._refused_summary()}")
    return 0
