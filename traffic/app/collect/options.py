"""What ``traffic collect`` is told: listen addresses, periods, sizes, who may export, checked before anything is bound.

Periods are bare seconds or durations (``2s``, ``15m``), read by the settings' ``parse_duration``;
``--allow`` blocks are read by the ``allowed_exporters`` setting's own parser (DESIGN §7a).
"""

from __future__ import annotations

import ipaddress
import math
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

# The setting's own parsers, so ``--allow`` reads blocks and ``--rotate`` durations exactly as the settings do.
from traffic.core.location import LocationError, ObjectLocation
from traffic.core.settings import SettingsError, _parse_exporter_blocks, parse_duration

#: Where flow telemetry usually arrives: NetFlow (2055), IPFIX (4739), sFlow (6343); loopback only.
DEFAULT_LISTEN = ("127.0.0.1:2055", "127.0.0.1:4739", "127.0.0.1:6343")
MIB = 1 << 20
#: Senders outside ``allowed_exporters`` counted one by one; the datagrams of any further sender are
#: counted together as ``others``, so a flood of spoofed addresses costs a fixed amount of memory.
REFUSED_SENDERS = 256
#: The longest ``--rotate``, ``--flush``, ``--status-every`` and ``--log-every``: the loop waits at most this
#: long at a time, and the kernel's wait takes at most about 24 days.
_LONGEST_PERIOD = 86_400.0


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
    upload: str | None = None  # ``s3://bucket/prefix``: each completed file sent there, then removed (``upload``)


def build_options(listen: list[str] | None = None, rotate: float | str = 60.0, flush: float | str = 1.0,
                  flush_datagrams: int = 10_000, rcvbuf: str = "32M", status: str | None = None,
                  status_every: float | str = 5.0, log_every: float | str = 60.0, metrics: str | None = None,
                  allow=(), allow_any: bool = False, upload: str | None = None) -> CollectOptions:
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
    if upload:
        upload = parse_upload(upload).url
    options = CollectOptions(endpoints, rotate, flush, int(flush_datagrams), parse_size("--rcvbuf", rcvbuf),
                             Path(status).absolute() if status else None, status_every, log_every,
                             parse_listen(metrics) if metrics else None, parse_allowed("--allow", allow),
                             bool(allow_any), REFUSED_SENDERS, upload or None)
    check_who_may_export(options)
    return options


def parse_upload(url: str, environ: Mapping[str, str] | None = None) -> ObjectLocation:
    """The ``--upload`` location, or a one-line ``CollectError`` naming what is wrong with it."""
    try:
        return ObjectLocation.parse(url, environ)
    except LocationError as error:
        raise CollectError(f"--upload {url}: {error}") from None


def _arg(*flags: str, **spec) -> tuple[tuple[str, ...], dict]:
    return flags, spec


#: ``traffic collect``'s own options, as ``ArgumentParser.add_argument`` takes them (``traffic.app.cli`` adds them).
COLLECT_ARGUMENTS = (
    _arg("--listen", action="append", metavar="HOST:PORT",
         help="address and UDP port to listen on, [v6]:port for IPv6 (repeatable; default 127.0.0.1:2055, "
              "127.0.0.1:4739 and 127.0.0.1:6343: loopback only)"),
    _arg("--allow", action="append", metavar="BLOCKS",
         help="address blocks whose datagrams are taken, e.g. 192.0.2.0/24,2001:db8::1 (repeatable; replaces "
              "the allowed_exporters setting); others are dropped and counted"),
    _arg("--allow-any", action="store_true",
         help="take datagrams from any sender, also on an address other machines reach"),
    _arg("--rotate", default="60", help="period per file and source: seconds or 90s, 15m, 1h (default 60)"),
    _arg("--flush", default="1", help="seconds (0.05) or a duration (2s, 1m) between hand-overs to the OS: what "
         "a SIGKILL may lose (default 1)"),
    _arg("--flush-datagrams", type=int, default=10_000,
         help="hand over to the OS after this many datagrams too (default 10000)"),
    _arg("--rcvbuf", default="32M", help="socket receive buffer to ask for, per address (default 32M)"),
    _arg("--status", help="JSON status file, rewritten atomically every --status-every seconds"),
    _arg("--status-every", default="5", help="seconds or a duration between status files (default 5)"),
    _arg("--log-every", default="60",
         help="seconds or a duration between status lines on stderr (default 60; 0: none)"),
    _arg("--metrics", metavar="HOST:PORT", help="serve Prometheus metrics here (e.g. 127.0.0.1:9155)"),
    _arg("--upload", metavar="s3://BUCKET/PREFIX", help="send each completed file there as one object, then "
         "remove it from the inbox (AWS_* variables reach the store; docs/collect.md)"),
)
