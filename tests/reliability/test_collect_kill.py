"""A collector killed with SIGKILL loses nothing it had flushed: the next start completes its file.

The collector runs as its own process (``traffic collect``) on a free 127.0.0.1 port (another one
if that was taken before the collector bound it); datagrams carry sequence numbers, so "every
flushed datagram in a completed file exactly once" is checked number by number after the restart.
Where a test counts datagrams exactly, they are sent in windows the collector has counted before
the next (``send_counted``): a burst could overflow a receive buffer the kernel capped.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.flow_tools import free_udp_port
from traffic.io.capture import udp_datagrams
from traffic.io.datagrams import PCAP_HEADER

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]


def sequence_numbers(path: Path) -> list[int]:
    """The sequence number each whole record carries, read as ingest reads the file (a torn last
    record, not flushed whole, is left out)."""
    data = path.read_bytes()
    assert data[:24] == PCAP_HEADER
    datagrams, _ = udp_datagrams(data, input_file=path.name, source="test")
    return [struct.unpack_from("!I", datagrams.payload(i))[0] for i in range(len(datagrams))]


class Collector:
    """``traffic collect`` as a process on a free port (``port``), with its status file."""

    def __init__(self, inbox: Path, status: Path, *options: str):
        self.status = status
        for attempt in range(5):
            self.port = free_udp_port()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "traffic.app.cli", "collect", "--inbox", str(inbox), "--listen",
                 f"127.0.0.1:{self.port}", "--status", str(status), "--status-every", "0.1", "--flush", "0.1",
                 "--rotate", "3600", "--log-every", "0", *options],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if self._started():
                return
            _, err = self.process.communicate(timeout=30)
            if "in use by another program" not in err or attempt == 4:  # the port was taken since the probe
                raise AssertionError(f"the collector did not start: {err}")

    def _started(self) -> bool:
        """Whether the collector wrote its status (False: it exited; an error past 60 s)."""
        deadline = time.monotonic() + 60
        while not (self.status.exists() and json.loads(self.status.read_text())["pid"] == self.process.pid):
            if self.process.poll() is not None:
                return False
            assert time.monotonic() < deadline, "the collector did not start"
            time.sleep(0.02)
        return True

    def received(self) -> int:
        return json.loads(self.status.read_text())["datagrams"]

    def kernel_drops(self) -> int:
        return json.loads(self.status.read_text())["kernel_drops"]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.communicate(timeout=30)

    def terminate(self) -> str:
        self.process.send_signal(signal.SIGTERM)
        _, err = self.process.communicate(timeout=30)
        assert self.process.returncode == 0, err
        return err


def send(port: int, numbers, sender: str = "127.0.0.2") -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((sender, 0))
        for number in numbers:
            sock.sendto(struct.pack("!I", number) + b"x" * 200, ("127.0.0.1", port))


def send_counted(collector: Collector, numbers, window: int = 100) -> None:
    """Send ``numbers`` in windows of ``window``, each after the collector has counted the one before:
    a window of ~200-byte datagrams fits any receive buffer the kernel grants (its default is 208 KiB),
    so none is dropped however slowly the collector is scheduled. Fails on a kernel drop or a lost datagram."""
    numbers, start = list(numbers), collector.received()
    for offset in range(0, len(numbers), window):
        chunk = numbers[offset:offset + window]
        send(collector.port, chunk)
        expected = start + offset + len(chunk)
        wait_for(lambda: collector.received() >= expected or collector.kernel_drops() > 0,
                 what=f"{expected} datagrams counted by the collector")
        assert collector.kernel_drops() == 0 and collector.received() == expected, \
            (collector.kernel_drops(), collector.received(), expected)


def wait_for(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def kill_while_sending(collector: Collector, batch, until, what: str) -> None:
    """Call ``batch(first number)`` for 50 numbers at a time in the background until ``until()`` holds, then
    SIGKILL the collector mid-stream and stop sending."""
    stop = threading.Event()

    def stream():
        number = 0
        while not stop.is_set():
            batch(number)
            number += 50
            time.sleep(0.005)

    sender = threading.Thread(target=stream, daemon=True)
    sender.start()
    try:
        wait_for(until, what=what)
        collector.kill()
    finally:
        stop.set()
        sender.join(timeout=10)


def hidden(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.flows.pcap"))


def complete(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.flows.pcap") if not p.name.startswith("."))


def test_sigkill_after_a_flush_then_restart_keeps_every_datagram_once(tmp_path):
    inbox, status = tmp_path / "inbox", tmp_path / "status.json"
    folder = inbox / "127.0.0.2"
    first = Collector(inbox, status)
    send_counted(first, range(2000))
    wait_for(lambda: hidden(folder) and len(sequence_numbers(hidden(folder)[0])) == 2000, what="the flush")
    first.kill()
    (left,) = hidden(folder)
    assert complete(folder) == [], "a killed collector cannot have completed its file"
    with open(left, "ab") as handle:  # a write torn by the kill: half a record
        handle.write(left.read_bytes()[24:24 + 100])

    second = Collector(inbox, status)
    (recovered,) = complete(folder)
    assert recovered.name == left.name[1:]
    send_counted(second, range(2000, 3000))
    err = second.terminate()
    assert f"completed 127.0.0.2/{recovered.name} left by a stopped collector (2,000 datagrams, a torn last " \
           "record of 100 bytes cut)" in err, err
    numbers = [n for path in complete(folder) for n in sequence_numbers(path)]
    assert sorted(numbers) == list(range(3000)), "a datagram is missing or counted twice"
    assert hidden(folder) == [] and len(complete(folder)) == 2
    assert os.path.getsize(recovered) == 24 + 2000 * (16 + 20 + 8 + 204)


def test_sigkill_while_receiving_keeps_exactly_what_was_flushed(tmp_path):
    inbox, status = tmp_path / "inbox", tmp_path / "status.json"
    folder = inbox / "127.0.0.2"
    first = Collector(inbox, status)
    port = first.port

    def batch(number):
        send(port, range(number, number + 50))

    kill_while_sending(first, batch, lambda: first.received() >= 3000, "datagrams flowing")
    (left,) = hidden(folder)
    flushed = sequence_numbers(left)  # what reached the OS before the kill: all of it must survive
    assert len(flushed) >= 1000, len(flushed)

    second = Collector(inbox, status)
    second.terminate()
    (recovered,) = complete(folder)
    assert sequence_numbers(recovered) == flushed
    assert len(set(flushed)) == len(flushed)
    assert hidden(folder) == []


def test_sigkill_while_dropping_and_accepting_keeps_every_accepted_datagram(tmp_path):
    """Spoofed senders (127.0.0.3–12, not allowed) interleave with the one allowed exporter: the kill
    loses nothing accepted and flushed, and no refused datagram is in any file."""
    inbox, status = tmp_path / "inbox", tmp_path / "status.json"
    folder = inbox / "127.0.0.2"
    first = Collector(inbox, status, "--allow", "127.0.0.2/32")
    port = first.port

    def batch(number):
        send(port, range(number, number + 50))
        send(port, range(10**6 + number, 10**6 + number + 50), f"127.0.0.{3 + (number // 50) % 10}")

    def both_flowing():
        return first.received() >= 3000 and json.loads(status.read_text())["refused"]["datagrams"] >= 3000

    kill_while_sending(first, batch, both_flowing, "datagrams accepted and dropped")
    before = json.loads(status.read_text())
    assert set(before["refused"]["senders"]) == {f"127.0.0.{n}" for n in range(3, 13)}, before["refused"]
    assert list(before["exporters"]) == ["127.0.0.2"]
    (left,) = hidden(folder)
    flushed = sequence_numbers(left)
    assert len(flushed) >= 1000 and all(n < 10**6 for n in flushed), "a refused datagram was written"

    second = Collector(inbox, status, "--allow", "127.0.0.2/32")
    second.terminate()
    (recovered,) = complete(folder)
    assert sequence_numbers(recovered) == flushed
    assert len(set(flushed)) == len(flushed), "an accepted datagram is repeated"
    assert sorted(p.name for p in inbox.iterdir()) == ["127.0.0.2"], "a refused sender got a folder"
    assert hidden(folder) == []
