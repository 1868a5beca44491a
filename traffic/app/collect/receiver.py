"""The collector as a library: bind UDP sockets, receive datagrams with their kernel receive times,
write each allowed exporter's to its source's file (``traffic.app.collect.files``), count the rest.

``Collector.serve`` is the receive loop of ``traffic collect`` (``traffic.app.collect.service``);
a program that drives a collector itself (the demo) calls ``drain`` and ``complete`` instead.
"""

from __future__ import annotations

import errno
import json
import os
import selectors
import socket
import struct
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Mapping

from traffic.app.collect.counts import Exporter, Metrics, Refused
from traffic.app.collect.files import Sink, complete_sink, flush_sink, open_sink, recover
from traffic.app.collect.options import MIB, CollectError, CollectOptions, Endpoint, check_who_may_export, \
    ipv4_blocks, parse_upload, sender_allowed, source_folder
from traffic.core.records import canonical_ip
from traffic.io.datagrams import MAX_DATAGRAM, datagram_record

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
        self.upload = None  # an ``Uploader`` with ``--upload``: the inbox is then a spool it empties
        if options.upload:
            from traffic.app.collect.upload import Uploader  # deferred: only with --upload

            self.upload = Uploader(self.inbox, parse_upload(options.upload), self.log)
        self.listeners: list[_Listener] = []
        self.exporters: dict[str, Exporter] = {}  # allowed senders only
        self.sinks: dict[str, Sink] = {}
        #: Senders whose datagrams were dropped (not in ``allowed_exporters``), at most ``refused_senders``
        #: of them; the rest are counted in ``refused_others``.
        self.refused: dict[str, Refused] = {}
        self.refused_others = Refused("others")
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
            if self.upload is not None:
                self.upload.check()  # a store it cannot use: one line, before any port is bound
            for line in recover(self.inbox):
                self.log(f"collect: {line}")
            if self.upload is not None:
                self.upload.start()  # what a stopped collector left goes first
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
        registry.register(Metrics(self))
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

    def _admit(self, host: str) -> Exporter | None:
        """The exporter of a sender seen for the first time (or refused before: None again).

        Only allowed senders get an ``Exporter``: what a spoofed sender can make the collector keep is
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
            entry = self.refused[host] = Refused(canonical_ip(host.split("%", 1)[0]))
            if len(self.refused) == 1:
                self.log(f"collect: dropping datagrams from {entry.address}: not in allowed_exporters (every "
                         "refused sender is counted in the status file and the status line)")
        entry.count(size, ts_us)

    def refused_totals(self) -> tuple[int, int]:
        """(datagrams dropped because their sender is not allowed, senders counted by name)."""
        return (sum(e.datagrams for e in list(self.refused.values())) + self.refused_others.datagrams,
                len(self.refused))

    def _exporter(self, host: str) -> Exporter:
        address = canonical_ip(host.split("%", 1)[0])
        exporter = Exporter(address, self.names.get(address) or source_folder(address))
        self.exporters[host] = exporter
        return exporter

    # -- files --------------------------------------------------------------------------------------
    def _open(self, exporter: Exporter, ts_us: int) -> Sink:
        """The open file of the exporter's source, started now if there is none this period."""
        sink = self.sinks.get(exporter.source)
        if sink is None:
            sink = self.sinks[exporter.source] = open_sink(self.inbox, exporter.source, ts_us)
        exporter.sink = sink
        return sink

    def _flush(self) -> None:
        """Hand every pending record to the operating system (what a SIGKILL may lose ends here)."""
        for sink in self.sinks.values():
            flush_sink(sink)
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

    def _complete(self, sink: Sink) -> None:
        complete_sink(sink)
        self.files_written += 1
        if self.upload is not None:
            self.upload.wake()

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
            **({"upload": self.upload.status()} if self.upload is not None else {}),
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
        """Complete every open file (and send them, with ``--upload``), write the last status, release the sockets."""
        self._rotate()
        if self.upload is not None:
            self.upload.finish()
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


def _bind_problem(error: OSError) -> str:
    """Why an address cannot be bound, as an operator reads it."""
    return {
        errno.EADDRINUSE: "the port is in use by another program (stop it, or choose another port with --listen)",
        errno.EADDRNOTAVAIL: "the address is not one of this machine's",
        errno.EACCES: "ports below 1024 need root or CAP_NET_BIND_SERVICE",
        errno.EAFNOSUPPORT: "this machine has no IPv6",
    }.get(error.errno, error.strerror or str(error))
