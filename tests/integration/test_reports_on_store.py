"""The reports of an ``s3://`` warehouse live on the store (issue 38), against SeaweedFS on 127.0.0.1.

Each job sends what it wrote (the HTML report, Data Docs, GX's results, ``metrics.prom``) to
``<warehouse>/_reports/`` on the store; a second host, with an empty folder of its own, fetches the first one's
runs before it builds Data Docs, so what it publishes covers both; what a host prunes goes from the store too;
``traffic report`` says where the report was sent."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import datetime, timezone
from pathlib import Path

import obstore
import pytest

from tests.integration.test_object_storage import DELIVERIES
from tests.support.harness import Harness
from traffic.core.location import ObjectLocation
from traffic.quality.data_docs import prune_reports
from traffic.storage.report_copy import MANIFEST, fetch_reports, publish_reports, reports_folder

REPO = Path(__file__).resolve().parents[2]


def _stored(url: str) -> dict[str, bytes]:
    """Every report under ``<url>/_reports/`` (not the change records): key below it → bytes."""
    store = ObjectLocation.parse(url).store()
    keys = [m["path"] for batch in obstore.list(store, prefix="_reports/") for m in batch
            if not m["path"].startswith("_reports/.changes/")]
    return {key[len("_reports/"):]: bytes(obstore.get(store, key).bytes()) for key in keys}


def _local(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)}


def _deliver_and_close(harness: Harness, lines: list[str]) -> None:
    harness.deliver("r1", "\n".join(lines) + "\n")
    harness.ingest()
    harness.close()


@pytest.fixture
def two_hosts(seaweed, spark, monkeypatch, tmp_path):
    """An s3:// warehouse, and a harness on it as seen from a host (its own TRAFFIC_HOST_DIR) named when asked."""
    seaweed.export(monkeypatch)
    url = seaweed.url(f"reports-{uuid.uuid4().hex[:8]}")

    def on(host: str) -> Harness:
        monkeypatch.setenv("TRAFFIC_HOST_DIR", str(tmp_path / host))
        return Harness(tmp_path / "run", spark, warehouse=url, engine="rs")

    return url, on


def test_each_host_publishes_its_reports_and_builds_on_the_others(two_hosts):
    url, on = two_hosts
    first = on("host-a")
    _deliver_and_close(first, DELIVERIES[0])
    folder_a = reports_folder(first.warehouse())
    stored = _stored(url)
    assert {"index.html", "metrics.prom", "data_docs/index.html"} <= set(stored)
    assert stored == _local(folder_a)  # everything the host wrote, byte for byte, and nothing else
    pages_a = {k for k in stored if k.startswith("data_docs/validations/")}
    assert pages_a

    second = on("host-b")  # another machine: an empty folder of its own
    _deliver_and_close(second, DELIVERIES[1])
    _deliver_and_close(second, DELIVERIES[2])  # closes the rest: its checks build Data Docs
    folder_b = reports_folder(second.warehouse())
    assert folder_b != folder_a and pages_a <= set(_local(folder_b))  # the first host's runs, fetched
    stored = _stored(url)
    assert stored == _local(folder_b) and len({k for k in stored if k.startswith("data_docs/validations/")}) > len(
        pages_a)
    assert publish_reports(second.warehouse()) == (0, 0)  # nothing changed since: nothing sent again

    # The first host catches up, then prunes every run: the store loses them too, and the second host's copy
    # loses them at its next fetch. (A host's folder follows TRAFFIC_HOST_DIR, which ``on`` sets.)
    first = on("host-a")
    assert fetch_reports(first.warehouse()) > 0 and _local(folder_a) == stored
    assert prune_reports(first.warehouse(), datetime(2100, 1, 1, tzinfo=timezone.utc)) > 0
    sent, deleted = publish_reports(first.warehouse())
    assert deleted > 0 and not any(k.startswith("data_docs/validations/") for k in _stored(url))
    second = on("host-b")
    fetch_reports(second.warehouse())
    assert not any(k.startswith("data_docs/validations/") for k in _local(folder_b))
    assert (folder_b / MANIFEST).exists()


def test_traffic_report_says_where_it_sent_the_report(two_hosts, tmp_path):
    url, on = two_hosts
    harness = on("host-a")
    _deliver_and_close(harness, DELIVERIES[0])
    env = {**os.environ, "TRAFFIC_HOST_DIR": str(tmp_path / "host-c"), "GX_ANALYTICS_ENABLED": "false", "TZ": "UTC"}
    done = subprocess.run([sys.executable, "-m", "traffic.app.cli", "report", "--warehouse", url, "--set",
                           f"now={harness.settings.now.isoformat()}"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"(sent to {url}/_reports/index.html)" in done.stdout
    host_c = tmp_path / "host-c"
    assert any(p.name == "index.html" and "data_docs" in p.parts for p in host_c.rglob("index.html"))  # fetched
    assert _stored(url)["index.html"] == next(p for p in host_c.rglob("index.html") if p.parent.name == "_reports"
                                              ).read_bytes()


def test_a_fetch_reads_only_the_changes_since_the_last_and_a_file_written_here_wins(two_hosts, monkeypatch):
    """After its first fetch a host lists only the change records after the last it applied (never all of
    ``_reports/``, which grows with history); a file changed here since is sent, not overwritten; a host whose
    last record was pruned compares with everything once."""
    import traffic.storage.report_copy as copy

    url, on = two_hosts
    first = on("host-a")
    _deliver_and_close(first, DELIVERIES[0])
    second = on("host-b")
    fetch_reports(second.warehouse())  # the first fetch: everything, once
    listings = []
    real_list = obstore.list

    def counted(store, prefix=None, **options):
        listings.append((prefix, options.get("offset")))
        return real_list(store, prefix, **options)

    monkeypatch.setattr(obstore, "list", counted)
    first = on("host-a")
    page = reports_folder(first.warehouse()) / "index.html"
    page.write_text("<p>from host a</p>")
    assert publish_reports(first.warehouse()) == (1, 0)
    second = on("host-b")
    assert fetch_reports(second.warehouse()) == 1
    assert all(prefix == copy.CHANGES and offset for prefix, offset in listings), listings
    mine = reports_folder(second.warehouse()) / "index.html"
    assert mine.read_text() == "<p>from host a</p>"

    first = on("host-a")
    page.write_text("<p>from host a, again</p>")
    publish_reports(first.warehouse())
    second = on("host-b")
    mine.write_text("<p>from host b</p>")  # changed here too, before this host looked again
    assert fetch_reports(second.warehouse()) == 0 and mine.read_text() == "<p>from host b</p>"
    publish_reports(second.warehouse())
    assert _stored(url)["index.html"] == b"<p>from host b</p>"
    first = on("host-a")
    fetch_reports(first.warehouse())
    assert page.read_text() == "<p>from host b</p>"

    # Records host b has not applied pruned (as after KEEP_CHANGES more): its next fetch compares with everything.
    store = ObjectLocation.parse(url).store()
    for text in ("<p>from host a, next</p>", "<p>from host a, last</p>"):
        page.write_text(text)
        publish_reports(first.warehouse())
    for batch in real_list(store, prefix=copy.CHANGES):
        obstore.delete(store, [m["path"] for m in batch][:-1])  # all but the newest
    listings.clear()
    second = on("host-b")
    fetch_reports(second.warehouse())
    assert (copy.PREFIX, None) in listings and mine.read_text() == "<p>from host a, last</p>"
