"""The collector's files: one pcap file per source and rotation period, written under a hidden name,
completed by an fsync and a rename; ``recover`` completes what a killed collector left.

A file is ``flock``-ed while it is written, so ``recover`` (and a second collector on the same
inbox) leaves it alone; a completed file is named ``<UTC time of its first datagram>-<pid>.flows.pcap``.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from traffic.app.collect.options import CollectError
from traffic.io.datagrams import MAX_DATAGRAM, PCAP_HEADER

#: A record header of the pcap files: seconds, microseconds, captured length, original length.
_RECORD = struct.Struct("<IIII")
#: Longest record the collector writes: an IPv6 header, a UDP header and the largest datagram.
_MAX_FRAME = 40 + 8 + MAX_DATAGRAM
#: Names of the collector's files, complete (group 1) and while written (a leading dot).
#: Ingest decodes a ``.flows.pcap`` file's datagrams as flow telemetry (DESIGN §7a), whatever its source.
SUFFIX = ".flows.pcap"
_FILE_NAME = re.compile(r"^\.?(\d{8}T\d{6}\.\d{6}Z-\d+(?:-\d+)?(?:-r\d+)?\.flows\.pcap)$")


@dataclass
class Sink:
    """A pcap file of one source being written under its hidden name."""

    source: str
    folder: Path
    name: str
    fd: int
    pending: list = field(default_factory=list)  # records not yet handed to the operating system

    @property
    def temporary(self) -> Path:
        return self.folder / f".{self.name}"


def open_sink(inbox: Path, source: str, ts_us: int) -> Sink:
    """A new hidden file in ``inbox/<source>/``, named after its first datagram's time ``ts_us``, locked."""
    folder = inbox / source
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
    return Sink(source, folder, name, fd, [PCAP_HEADER])


def flush_sink(sink: Sink) -> None:
    """Hand the sink's pending records to the operating system (what a SIGKILL may lose ends here)."""
    if sink.pending:
        write_all(sink.fd, b"".join(sink.pending))
        sink.pending.clear()


def complete_sink(sink: Sink) -> None:
    """Make the file durable under its final name and close it."""
    os.fsync(sink.fd)
    os.rename(sink.temporary, sink.folder / sink.name)
    fsync_folder(sink.folder)
    os.close(sink.fd)


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
                fsync_folder(folder)
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


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may take part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
