"""``spark_master = auto`` trusts only a server record this user wrote (no JVM here: the record's rules).

A record names a pid, a port and the server's token; the client connects there with that token,
so a record someone else could write or read would hand a job (and its data) to their process, or
give away the token. Each case below is a live, listening process that a trusting reader would
use; the record must be refused (with one warning line) or, when its process is not a Spark
Connect server of this user, removed as stale.
"""

from __future__ import annotations

import json
import logging
import os
import socket

import pytest

from traffic.runtime.connect import (TOKEN_ENV, address, read_record, record_path, recorded_server, with_token,
                             without_token, write_record)
from traffic.core.settings import load_settings
from traffic.runtime.spark import LOCAL_MASTER, resolve_master


@pytest.fixture()
def listener():
    """A live process (this one) listening on a 127.0.0.1 port: what a forged record points at."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _record(port: int) -> dict:
    return {"pid": os.getpid(), "port": port, "url": address(port), "token": "t" * 64}


def _write_plain(state, record: dict, mode: int) -> None:
    path = record_path(state)
    path.write_text(json.dumps(record))
    os.chmod(path, mode)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o660, 0o606, 0o666])
def test_a_record_others_can_read_or_change_is_ignored_with_a_warning(tmp_path, listener, mode, caplog):
    _write_plain(tmp_path, _record(listener), mode)
    settings = load_settings(environ={}, overrides={"warehouse": tmp_path.parent})
    with caplog.at_level(logging.WARNING, logger="traffic.runtime.connect"):
        assert recorded_server(tmp_path) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"{mode:04o}" in warnings[0] and str(record_path(tmp_path)) in warnings[0], warnings
    assert record_path(tmp_path).exists(), "an untrusted record is left for its owner to look at"
    assert resolve_master(settings.replace(warehouse=tmp_path.parent)) == LOCAL_MASTER


def test_a_linked_record_is_ignored(tmp_path, listener):
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(_record(listener)))
    os.chmod(target, 0o600)
    record_path(tmp_path).symlink_to(target)
    assert recorded_server(tmp_path) is None
    with pytest.raises(ValueError, match="symbolic link"):
        read_record(record_path(tmp_path))


def test_a_record_of_another_user_is_ignored(tmp_path, listener, monkeypatch):
    _write_plain(tmp_path, _record(listener), 0o600)
    if os.geteuid() == 0:
        os.chown(record_path(tmp_path), 12345, -1)  # root gives the record away
        owner = "uid 12345"
    else:  # only root can give a file away: here the reader is another user instead
        owner = f"uid {os.geteuid()}"
        monkeypatch.setattr(os, "geteuid", lambda real=os.geteuid(): real + 1)
    with pytest.raises(ValueError, match=owner):
        read_record(record_path(tmp_path))
    assert recorded_server(tmp_path) is None


def test_a_record_without_a_token_is_ignored(tmp_path, listener):
    record = _record(listener)
    del record["token"]
    _write_plain(tmp_path, record, 0o600)
    assert recorded_server(tmp_path) is None


def test_a_private_record_whose_process_is_not_our_server_is_stale(tmp_path, listener):
    """This process is alive and listens on the port, but it is no Spark Connect server: the pid was reused."""
    write_record(tmp_path, _record(listener))
    assert recorded_server(tmp_path) is None
    assert not record_path(tmp_path).exists()


def test_records_are_written_owner_only_from_the_first_byte(tmp_path):
    os.umask(0o000)  # even with a permissive umask
    try:
        write_record(tmp_path, _record(1))
    finally:
        os.umask(0o022)
    info = os.stat(record_path(tmp_path))
    assert info.st_mode & 0o777 == 0o600 and info.st_uid == os.geteuid()
    assert read_record(record_path(tmp_path))["token"] == "t" * 64
    assert not list(tmp_path.glob("*.tmp"))


def test_the_token_never_reaches_a_printed_url():
    url = with_token(address(15002), "secret123")
    assert url == "sc://localhost:15002/;token=secret123"
    assert without_token(url) == "sc://localhost:15002"
    assert without_token("sc://localhost:15002/;user_id=a;token=x") == "sc://localhost:15002/;user_id=a"
    assert without_token("sc://127.0.0.1:15002") == "sc://127.0.0.1:15002"
    assert TOKEN_ENV == "SPARK_CONNECT_AUTHENTICATE_TOKEN"
