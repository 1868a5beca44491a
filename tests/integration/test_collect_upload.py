"""``traffic collect --upload s3://…`` (issue 38) against a real S3 server (SeaweedFS on 127.0.0.1): every completed
file reaches the store as one object with exactly its bytes and leaves the spool; a store that is down keeps the
files until it answers; a collector killed between the put and the removal sends nothing twice; a name taken by
other bytes is never overwritten; a store it cannot use is refused in one line."""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path

import obstore
import pytest

from tests.integration.test_collect import (collecting, exporter, files_of, free_udp_port, port_of, read_pcap, received,
                                            start_command, traffic, wait_for)
from traffic.app.collect import CollectError, build_options
from traffic.app.collect.options import parse_upload
from traffic.app.collect.upload import Uploader
from traffic.core.location import ObjectLocation
from traffic.io.datagrams import PCAP_HEADER

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def store_url(seaweed, monkeypatch) -> str:
    seaweed.export(monkeypatch)
    return seaweed.url(f"edge-{uuid.uuid4().hex[:8]}")


def objects(url: str) -> dict[str, bytes]:
    """Every object under the location: key below it → bytes."""
    store = ObjectLocation.parse(url).store()
    keys = [meta["path"] for batch in obstore.list(store) for meta in batch]
    return {key: bytes(obstore.get(store, key).bytes()) for key in sorted(keys)}


def datagrams_of(data: bytes, tmp_path: Path) -> list[bytes]:
    path = tmp_path / f"{uuid.uuid4().hex}.pcap"
    path.write_bytes(data)
    return [record[-1] for record in read_pcap(path)]


def test_each_completed_file_goes_up_whole_and_leaves_the_spool(tmp_path, store_url):
    spool = tmp_path / "spool"
    with collecting(spool, upload=store_url) as collector:
        port = port_of(collector)
        a, b = exporter("127.0.0.2"), exporter("127.0.0.3")
        for i in range(25):
            a.sendto(b"a%03d" % i, ("127.0.0.1", port))
        for i in range(7):
            b.sendto(b"b%03d" % i, ("127.0.0.1", port))
        received(collector, 32)
        collector.complete()  # a rotation: the files are complete, and sent by the uploader's thread
        wait_for(lambda: not files_of(spool), what="the spool emptied by the uploader")
        a.sendto(b"after", ("127.0.0.1", port))  # a second file of one source, sent when the collector stops
        received(collector, 33)
    stored = objects(store_url)
    assert sorted({key.split("/")[0] for key in stored}) == ["127.0.0.2", "127.0.0.3"], sorted(stored)
    assert all(key.endswith(".flows.pcap") and data.startswith(PCAP_HEADER) for key, data in stored.items())
    by_source = {source: [d for key, data in stored.items() if key.startswith(source + "/")
                          for d in datagrams_of(data, tmp_path)] for source in ("127.0.0.2", "127.0.0.3")}
    assert sorted(by_source["127.0.0.2"]) == sorted([b"a%03d" % i for i in range(25)] + [b"after"])
    assert by_source["127.0.0.3"] == [b"b%03d" % i for i in range(7)]
    assert not files_of(spool) and not list(spool.rglob(".*.flows.pcap"))
    status = collector.status()["upload"]
    assert (status["sent"], status["pending"], status["last_error"]) == (3, 0, "")
    assert status["sent_bytes"] == sum(map(len, stored.values()))


def _completed_file(spool: Path, source: str, name: str, payloads: list[bytes]) -> Path:
    """A complete collector file as ``complete_sink`` leaves it (records from 127.0.0.9:9 to 127.0.0.1:2055)."""
    from traffic.io.datagrams import datagram_record

    folder = spool / source
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(PCAP_HEADER + b"".join(datagram_record(1_700_000_000_000_000 + n, "127.0.0.9", 9, "127.0.0.1",
                                                                2055, payload) for n, payload in enumerate(payloads)))
    return path


def test_a_store_that_is_down_keeps_the_files_until_it_answers(tmp_path, seaweed, monkeypatch):
    """The store goes away after the start's check: the file stays in the spool, the status says why, and
    the pass after it answers again sends it (here the same store again, reached through the right port)."""
    seaweed.export(monkeypatch)
    url = seaweed.url(f"edge-{uuid.uuid4().hex[:8]}")
    lines: list[str] = []
    uploader = Uploader(tmp_path / "spool", parse_upload(url), lines.append)
    uploader.check()
    path = _completed_file(tmp_path / "spool", "r1", "20261129T120000.000000Z-1.flows.pcap", [b"x" * 100])
    good = uploader._store
    uploader._store = ObjectLocation.parse(url, {**seaweed.environ(), "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}) \
        .store(timeout=2)
    assert uploader.send_pending() is False
    assert path.exists() and uploader.status()["pending"] == 1 and uploader.status()["last_error"]
    assert len([line for line in lines if "cannot send r1/" in line]) == 1
    assert "traffic-test-secret" not in "".join(lines) + json.dumps(uploader.status())
    uploader._store = good
    assert uploader.send_pending() is True
    assert not path.exists() and list(objects(url)) == ["r1/20261129T120000.000000Z-1.flows.pcap"]
    assert lines[-1].endswith("takes files again")


def test_a_file_sent_before_a_crash_is_not_sent_twice_and_other_bytes_are_never_overwritten(tmp_path, store_url):
    store = ObjectLocation.parse(store_url).store()
    spool = tmp_path / "spool"
    same = _completed_file(spool, "r1", "20261129T120000.000000Z-1.flows.pcap", [b"one", b"two"])
    # The previous collector put this file, then was killed before removing it from the spool.
    obstore.put(store, "r1/" + same.name, same.read_bytes())
    # Another file under a name the store already holds with other bytes.
    clash = _completed_file(spool, "r1", "20261129T130000.000000Z-1.flows.pcap", [b"three"])
    obstore.put(store, "r1/" + clash.name, b"another collector's bytes")
    lines: list[str] = []
    uploader = Uploader(spool, parse_upload(store_url), lines.append)
    uploader.check()
    assert uploader.send_pending() is True
    assert objects(store_url) == {
        "r1/20261129T120000.000000Z-1.flows.pcap": PCAP_HEADER + same_bytes(spool, tmp_path, [b"one", b"two"]),
        "r1/20261129T130000.000000Z-1.flows.pcap": b"another collector's bytes",
        "r1/20261129T130000.000000Z-1-u1.flows.pcap": PCAP_HEADER + same_bytes(spool, tmp_path, [b"three"]),
    }
    assert uploader.sent == 1 and not files_of(spool)
    assert any("sent as 20261129T130000.000000Z-1-u1.flows.pcap" in line for line in lines), lines


def same_bytes(spool: Path, tmp_path: Path, payloads: list[bytes]) -> bytes:
    """The records ``_completed_file`` writes for these payloads (without the header)."""
    path = _completed_file(tmp_path / "again", "x", "f.flows.pcap", payloads)
    return path.read_bytes()[len(PCAP_HEADER):]


def test_bad_upload_locations_are_refused_in_one_line(tmp_path, seaweed, monkeypatch):
    with pytest.raises(CollectError, match=r"^--upload s3://lake:secret@x/y: .*AWS_"):
        build_options(listen=["127.0.0.1:9"], upload="s3://lake:secret@x/y")
    with pytest.raises(CollectError, match=r"^--upload gs://x: "):
        build_options(listen=["127.0.0.1:9"], upload="gs://x")
    seaweed.export(monkeypatch)
    process = traffic("collect", "--inbox", str(tmp_path / "spool"), "--listen", f"127.0.0.1:{free_udp_port()}",
                      "--upload", "s3://no-such-bucket/edge", env={**os.environ})
    out, err = process.communicate(timeout=60)
    lines = [line for line in err.splitlines() if line.strip()]
    assert process.returncode == 2, err
    assert len(lines) == 1 and "bucket 'no-such-bucket' does not exist" in lines[0], err
    assert "traffic-test-secret" not in err


def test_the_command_uploads_and_a_sigkilled_one_loses_nothing_on_restart(tmp_path, seaweed, store_url):
    """``traffic collect --upload`` as a process: killed with a file on disk, restarted, every datagram is in the
    store exactly once and the spool is empty after a clean stop."""
    url = store_url
    spool, status = tmp_path / "spool", tmp_path / "status.json"
    env = {**seaweed.environ(), "TZ": "UTC"}
    args = ("--inbox", str(spool), "--listen", "127.0.0.1:{udp}", "--status", str(status), "--status-every", "0.2",
            "--flush", "0.05", "--rotate", "3600", "--upload", url)
    process, port, _ = start_command(status, *args, env=env)
    sender = exporter("127.0.0.2")
    for i in range(40):
        sender.sendto(b"k%03d" % i, ("127.0.0.1", port))
    wait_for(lambda: json.loads(status.read_text())["datagrams"] == 40, what="40 datagrams in status")
    wait_for(lambda: list(spool.rglob(".*.flows.pcap")) and
             os.path.getsize(next(spool.rglob(".*.flows.pcap"))) > 24 + 40 * 10, what="the datagrams flushed")
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    assert objects(url) == {}, "nothing is complete yet: nothing went up"
    status.unlink()
    process, port, _ = start_command(status, *args, env=env)  # recovers the file, then sends it
    wait_for(lambda: objects(url) and not files_of(spool), what="the recovered file sent")
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "sending each completed file to s3://" in err and "traffic-test-secret" not in err
    sent = [d for data in objects(url).values() for d in datagrams_of(data, tmp_path)]
    assert sorted(sent) == [b"k%03d" % i for i in range(40)]
    assert not files_of(spool) and not list(spool.rglob(".*.flows.pcap"))
