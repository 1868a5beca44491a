"""The replay form (``traffic_replay``'s ``check_request`` and its argument macro) reads only archives
under ``replay_roots``, and any reason or source reaches ``traffic replay`` as that exact value.

Whoever may trigger a DAG is not thereby allowed to read the worker's files: a folder outside the
roots, a link out of them, a ``..`` walk out of them and a relative path are refused before any
JVM starts, with the reason and the allowed roots in the message the person sees.
"""

from __future__ import annotations

import pytest

from traffic.app.cli import build_parser
from traffic.orchestration.replay_form import replay_arguments
from traffic.core.settings import SettingsError, load_settings

FORM = {"from": "2026-11-19T22:00:00Z", "to": "2026-11-20T02:00:00Z", "source": None, "restate": False,
        "reason": None}


@pytest.fixture()
def roots(tmp_path, monkeypatch):
    """Two roots on the worker; ``secret`` is a folder beside them that the form must never reach."""
    first, second, secret = tmp_path / "archive", tmp_path / "exports", tmp_path / "secret"
    for folder in (first / "2026-11", second, secret):
        folder.mkdir(parents=True)
    monkeypatch.setenv("TRAFFIC_REPLAY_ROOTS", f"{first},{second}")
    return first.resolve(), second.resolve(), secret.resolve()


def test_folders_under_a_root_are_accepted_as_their_resolved_path(roots):
    first, second, _ = roots
    assert f"--input={first / '2026-11'}" in replay_arguments({**FORM, "input": str(first / "2026-11")})
    assert f"--input={second}" in replay_arguments({**FORM, "input": str(second)})
    (first / "latest").symlink_to(first / "2026-11")  # a link that stays inside is fine: the target is passed
    assert f"--input={first / '2026-11'}" in replay_arguments({**FORM, "input": str(first / "latest")})


@pytest.mark.parametrize("where", ["outside", "root", "link out", "dot-dot", "relative", "missing"])
def test_anything_else_is_refused_with_the_reason(roots, where):
    first, second, secret = roots
    if where == "link out":
        (first / "escape").symlink_to(secret)
    folder = {"outside": str(secret), "root": "/", "link out": str(first / "escape"),
              "dot-dot": f"{first}/../secret", "relative": "archive/2026-11", "missing": str(first / "nope")}[where]
    with pytest.raises(SettingsError) as refused:
        replay_arguments({**FORM, "input": folder})
    message = str(refused.value)
    expected = {"relative": "not an absolute folder", "missing": "not a folder"}.get(where, "not under a replay root")
    assert expected in message and repr(folder) in message, message
    if where != "missing":
        assert str(first) in message and str(second) in message, "the person is told where archives may be"


def test_by_default_the_roots_are_the_inbox_and_the_archive_beside_it(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAFFIC_REPLAY_ROOTS", raising=False)
    monkeypatch.setenv("TRAFFIC_INBOX", str(tmp_path / "inbox"))
    (tmp_path / "archive" / "edge").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    assert load_settings().replay_folders() == (tmp_path / "inbox", tmp_path / "archive")
    assert f"--input={(tmp_path / 'archive' / 'edge').resolve()}" in replay_arguments(
        {**FORM, "input": str(tmp_path / "archive" / "edge")})
    with pytest.raises(SettingsError, match="not under a replay root"):
        replay_arguments({**FORM, "input": str(tmp_path / "other")})


def test_relative_roots_are_a_settings_error():
    with pytest.raises(SettingsError, match="replay_roots: archive is not an absolute folder"):
        load_settings(environ={"TRAFFIC_REPLAY_ROOTS": "archive"})


@pytest.mark.parametrize("reason", ["-fix", "--restate", "-h", "--from=1999-01-01", "- clock fix"])
def test_a_reason_or_source_starting_with_a_dash_stays_a_value(roots, reason):
    first, _, _ = roots
    args = replay_arguments({**FORM, "input": str(first), "source": "-edge", "restate": True, "reason": reason})
    parsed = build_parser().parse_args(["replay", *args])  # what jobs/replay.py hands to `traffic replay`
    assert (parsed.reason, parsed.source, parsed.restate, parsed.input) == (reason, "-edge", True, str(first))
    assert parsed.__dict__["from"] == "2026-11-19T22:00:00+00:00"
