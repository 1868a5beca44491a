"""This machine's listening TCP sockets and a process's sockets, read from /proc: what the tests of
`make airflow` (and its PostgreSQL) use to prove that nothing listens beyond loopback."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path


def tcp_listening() -> dict[int, tuple[str, int]]:
    """Listening TCP sockets of this machine: inode -> (address, port), IPv4 and IPv6."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], int(fields[9])
            if state != "0A":  # LISTEN
                continue
            hex_address, hex_port = local.split(":")
            raw = bytes.fromhex(hex_address)
            # /proc prints the address as 32-bit words in host (little-endian) order
            packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            address = ipaddress.ip_address(packed)
            address = getattr(address, "ipv4_mapped", None) or address  # ::ffff:127.0.0.1 is 127.0.0.1
            found[inode] = (str(address), int(hex_port, 16))
    return found


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def free_port() -> int:
    """A 127.0.0.1 port nothing holds right now (another process may bind it before the caller does)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
