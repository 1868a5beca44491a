"""Settings precedence and validation; text readers judge every record (no Spark)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from traffic.io.readers import CSV_HEADER, JSON_LINES, ROUTER_FEED, detect_format, parse_bytes
from traffic.core.settings import SettingsError, load_settings


def test_precedence_file_then_environment_then_cli(tmp_path):
    config = tmp_path / "traffic.toml"
    config.write_text('[traffic]\nkeep_hours = 5\nallowed_lateness = "10m"\nsource_timeout = 60\n')
    settings = load_settings(config, environ={"TRAFFIC_KEEP_HOURS": "7", "TRAFFIC_SOURCE_TIMEOUT": "2h"},
                             overrides={"keep_hours": 9})
    assert settings.keep_hours == 9
    assert settings.allowed_lateness == timedelta(minutes=10)
    assert settings.source_timeout == timedelta(hours=2)


def test_defaults_match_the_contract():
    settings = load_settings(environ={})
    assert (settings.keep_hours, settings.allowed_lateness, settings.source_timeout) == (24, timedelta(0),
                                                                                         timedelta(hours=1))
    assert settings.max_future_skew == timedelta(days=1) and settings.max_history == timedelta(days=400)
    assert settings.late_retention == timedelta(days=90)
    assert settings.warehouse.name == "warehouse" and settings.inbox.name == "inbox"


@pytest.mark.parametrize("name,value,message", [
    ("TRAFFIC_KEEP_HOURS", "many", "not a whole number"),
    ("TRAFFIC_ALLOWED_LATENESS", "soon", "not a duration"),
    ("TRAFFIC_LOCAL_NETWORKS", "10.0.0.0/33", "not a CIDR"),
    ("TRAFFIC_ENGINE", "duckdb", "not one of"),
])
def test_bad_values_say_which_and_how(name, value, message):
    with pytest.raises(SettingsError, match=message):
        load_settings(environ={name: value})


def _kinds(table):
    return [(r["kind"], r["reason"]) for r in table.to_pylist()]


def test_router_feed_judges_each_line():
    data = (b"new,OP_INSERT,1790000000000000,10.0.0.1,8.8.8.8,1234,53,100\n"
            b"new,OP_INSERT,1790000000000002\n"
            b"new,OP_INSERT,1790000000000003,,,,,\n"
            b"new,OP_DELETE,1790000000000003,10.0.0.1,8.8.8.8,1234,53,100\n"
            b"new,OP_INSERT,1790000000000004,10.0.0.1,2001:db8::1,1,2,3\n"
            b"new,OP_INSERT,1790000000000005,10.0.0.1,8.8.8.8,1,2,70000\n"
            b"\xff\xfe\n")
    table = parse_bytes(data, ROUTER_FEED, source="s", input_file="f")
    kinds = sorted(_kinds(table), key=lambda k: (k[0], k[1] or ""))
    assert kinds == [
        ("packet", None),
        ("reject", "byte count 70000 is more than an IPv4 packet can carry (65535)"),
        ("reject", "local_ip '' is not an IPv4 or IPv6 address"),
        ("reject", "local_ip and remote_ip are of different families (IPv4 and IPv6)"),
        ("reject", "not UTF-8 text"),
        ("reject", "unknown operation 'new,OP_DELETE' (only new,OP_INSERT is accepted)"),
        ("tick", None),
    ]


def test_json_and_csv_with_header_take_iso_times_and_record_sources():
    table = parse_bytes(b'{"ts":"2026-11-01T10:00:00","local_ip":"2001:DB8::1","remote_ip":"2001:db8::2",'
                        b'"bytes":80,"direction":"in","source":"r9"}\n{"ts":1790000000000000}\n{oops\n',
                        JSON_LINES, source="s", input_file="f")
    rows = table.to_pylist()
    assert (rows[0]["kind"], rows[0]["local_ip"], rows[0]["source"], rows[0]["direction"]) == \
        ("packet", "2001:db8::1", "r9", "in")
    assert rows[0]["ts"].isoformat() == "2026-11-01T10:00:00+00:00"
    assert rows[1]["kind"] == "tick" and rows[2]["kind"] == "reject"
    table = parse_bytes(b"ts,local_ip,remote_ip,bytes\n2026-11-01T10:00:00Z,10.0.0.1,1.1.1.1,5\n",
                        CSV_HEADER, source="s", input_file="f")
    assert _kinds(table) == [("packet", None)]


def test_format_detection():
    assert detect_format("a.csv", b"new,OP_INSERT,1") == ROUTER_FEED
    assert detect_format("a.txt", b"ts,local_ip") == CSV_HEADER
    assert detect_format("a.log", b'{"ts": 1}') == JSON_LINES
    assert detect_format("a.bin", bytes.fromhex("d4c3b2a1")) == "capture"


def test_a_garbage_first_line_does_not_turn_a_router_feed_into_a_rejected_header_file():
    """Found by the model-equivalence property test: the file was rejected whole."""
    head = b"garbage\nnew,OP_INSERT,1793564280016491\n"
    assert detect_format("part-7.csv", head) == ROUTER_FEED
    assert detect_format("x.csv", b'"ts","local_ip","remote_ip","bytes"\n') == CSV_HEADER


@pytest.mark.parametrize("data", [b"", b"plain", "h\u00e9llo \U0001d11e".encode(), b"a\x00b", b"\xff\xfe",
                                  b"ok\n\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80",
                                  b"\xf0\x9d\x84", b"\x80"])
def test_the_utf8_check_agrees_with_python_on_every_edge(data):
    """Arrow checks a chunk's UTF-8 without decoding it; it must reject exactly what Python rejects
    (surrogates, overlong forms, code points past U+10FFFF, cut sequences, stray continuation bytes)."""
    from traffic.io.readers import is_utf8

    try:
        data.decode("utf-8")
        valid = True
    except UnicodeDecodeError:
        valid = False
    assert is_utf8(data) is valid
