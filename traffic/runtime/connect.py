"""A long-running local Spark Connect server: pay the JVM start once, then each job is a light client.

A fresh SparkSession costs 7–20 s on a small machine and runs its first batch cold; a client of a
warm Spark Connect server starts in about a second. ``traffic spark start`` starts one for a
warehouse and records it in ``<warehouse>/_traffic/spark-connect.json``; with the default
``spark_master = auto`` every job on that warehouse then uses it, and ``traffic spark stop`` ends
it. Files the server writes land on the same filesystem as the client, so the rs engine's commit
path (delta-rs, client side) works unchanged, and a client killed mid-batch leaves the same
journal as a killed local job (the next run finishes it). Where Delta Lake's jars are (the
settings' ``spark_jars_dir``), the server starts with them and Delta's extension and catalog, so
the spark engine (delta-spark) writes through it.

The server binds to 127.0.0.1, where any local user can reach it, and a client runs code as the
server's user: so it answers only clients that present its token (Spark Connect's pre-shared
``spark.connect.authenticate.token``). The token is fresh for each server, handed to it in its
environment (never on its command line, which every user can read) and kept in the record, which
is its owner's alone (0600 from its first byte). ``auto`` trusts a record only when it is a
regular file of this user that nobody else can read or change and its process is this user's
Spark Connect server on the recorded port. An explicit ``spark_master`` takes the token in the
URL, ``sc://localhost:<port>/;token=<token>``, or in ``SPARK_CONNECT_AUTHENTICATE_TOKEN``
(pyspark sends a token over a plain channel only to the host name ``localhost``).
"""

from __future__ import annotations

import collections
import errno
import json
import logging
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from traffic.core.settings import DEFAULT_SPARK_JARS_DIR, delta_classpath
from traffic.runtime import jvm

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: Where the server reads its token (and where a pyspark client looks for one when its URL has none).
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"

logger = logging.getLogger(__name__)

#: Session settings a Spark Connect client sets on its server-side session (the server owns the rest).
CONNECT_SESSION_CONF = {
    "spark.sql.session.timeZone": "UTC",
    # Sums raise on 64-bit overflow instead of wrapping (Spark 4's default, said so that no server default can undo it).
    "spark.sql.ansi.enabled": "true",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "200000",
}

#: Delta Lake in a session (the spark engine): its SQL extension and catalog, and a table's state rebuilt
#: in one task. Delta rebuilds it from the log in ``snapshotPartitions`` tasks, 50 unless set, and an
#: idempotent append (``txnAppId``), a ``replaceWhere`` or a delete rebuilds it at every commit: on two
#: cores a small append took 2.9 s with 50 tasks and 0.9 s with one (3.2–3.6 s and 1.0 s on a table of
#: 2,000 files). One task replays this project's logs (thousands of files) in well under a second;
#: raise it only for tables of millions of files.
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "1",
}


def delta_server_conf(jars_dir: Path | None) -> dict[str, str]:
    """What a Spark process started here needs for Delta: the jars of ``jars_dir`` on its classpath
    (``spark.jars``, read when its JVM starts) and ``DELTA_CONF``; nothing when the folder holds no delta-spark."""
    jars = delta_classpath(jars_dir)
    return {"spark.jars": ",".join(str(p) for p in jars), **DELTA_CONF} if jars else {}


def address(port: int) -> str:
    """The server's address without its token: what is printed and recorded as ``url``."""
    return f"sc://localhost:{port}"


def with_token(url: str, token: str) -> str:
    """The URL a client opens: pyspark sends the token over a plain local channel only to ``localhost``."""
    return f"{url}/;token={token}"


def without_token(url: str) -> str:
    """``url`` fit to print or log: its ``token`` parameter removed."""
    base, *params = url.split(";")
    kept = [p for p in params if not p.strip().lower().startswith("token=")]
    if not kept and params:
        return base.rstrip("/")
    return ";".join([base, *kept])


@dataclass
class ConnectServer:
    """A running server process, its token, and the URL clients use."""

    process: subprocess.Popen
    port: int
    log: Path
    token: str

    @property
    def url(self) -> str:
        """What a client passes as ``spark_master`` (it carries the token: never print it)."""
        return with_token(address(self.port), self.token)

    def stop(self, timeout: float = 30) -> None:
        """Stop the server and its Python workers (the whole process group)."""
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _create_private(path: Path, exclusive: bool = False) -> int:
    """Open ``path`` for writing as a file only its owner can read (0600 from creation on); a link is refused.

    An existing file is reused only when it is this user's (its mode is then set to 0600 too).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | (os.O_EXCL if exclusive else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise PermissionError(errno.EPERM, "it belongs to another user; remove it", str(path))
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def start_server(port: int | None = None, master: str = "local[2]", log: Path | None = None,
                 driver_memory: str = "2g", shuffle_partitions: int = 4, timeout: float = 120,
                 token: str | None = None, jars_dir: Path | None = DEFAULT_SPARK_JARS_DIR) -> ConnectServer:
    """Start a server on 127.0.0.1 that answers only clients with its token (a fresh one unless given),
    and wait until it accepts connections. With Delta Lake's jars in ``jars_dir`` (the settings'
    ``spark_jars_dir``), its sessions write and read Delta tables through delta-spark."""
    port = port or free_port()
    token = token or secrets.token_hex(32)
    log = log or Path(f"/tmp/traffic-spark-connect-{port}.log")
    spark_submit = Path(sys.executable).with_name("spark-submit")
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.driver.memory": driver_memory,
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.driver.extraJavaOptions": jvm.driver_java_options(False),  # warm: the full JIT pays off
        **CONNECT_SESSION_CONF,
        **delta_server_conf(jars_dir),
    }
    command = [str(spark_submit), "--class", SERVER_CLASS, "--master", master]
    for name, value in conf.items():
        command += ["--conf", f"{name}={value}"]
    command.append("spark-internal")
    # The token goes in the environment: /proc/<pid>/environ is the owner's alone, the command line is not.
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "TZ": "UTC", TOKEN_ENV: token}
    with os.fdopen(_create_private(log), "w") as handle:  # queries and paths show up in the log
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = ConnectServer(process, port, log, token)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"Spark Connect server exited with {process.returncode}; see {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"Spark Connect server did not listen on 127.0.0.1:{port} within {timeout:.0f} s; see {log}")


# -- a server on a private network (the compose stack's spark-connect service) ---------------------

def _url_params(url: str) -> dict[str, str]:
    return {k.strip().lower(): v.strip() for k, _, v in (p.partition("=") for p in url.split(";")[1:]) if k.strip()}


def _host_port(url: str) -> tuple[str, str]:
    """``sc://host:port/;params`` → (host, port as written, "" when none)."""
    where = url[len("sc://"):].split("/")[0].split(";")[0]
    host, colon, port = where.rpartition(":")
    return (host, port) if colon else (where, "")


def plain_with_token(url: str, environ=None) -> bool:
    """Does ``url`` ask for its token over a plain channel to a host other than ``localhost``?

    Spark Connect's server speaks no TLS, and pyspark sends a token over a plain channel only to the host
    name ``localhost`` (anywhere else it opens TLS, which such a server refuses). A URL that says
    ``use_ssl=false`` explicitly names a host on a network its operator trusts — the compose stack's
    own bridge network, where Postgres's password travels too — and gets the token as a plain
    ``authorization: Bearer`` header, which is what the server checks.
    """
    environ = os.environ if environ is None else environ
    params = _url_params(url)
    host, _ = _host_port(url)
    token = params.get("token") or environ.get(TOKEN_ENV)
    return params.get("use_ssl", "").lower() == "false" and bool(token) and host != "localhost"


def plain_channel_builder(url: str):
    """A pyspark channel builder for ``url`` that sends its token as a header over a plain gRPC channel."""
    import grpc  # deferred: only a client of such a server needs it
    from pyspark.sql.connect.client import DefaultChannelBuilder  # deferred: with the session

    class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                                "wait_for_ready", "compression")),
                       grpc.ClientCallDetails):
        pass

    class BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
        def __init__(self, token: str):
            self.header = ("authorization", f"Bearer {token}")

        def _with_token(self, details):
            return _CallDetails(details.method, details.timeout, [*(details.metadata or ()), self.header],
                                details.credentials, details.wait_for_ready, details.compression)

        def intercept_unary_unary(self, continuation, details, request):
            return continuation(self._with_token(details), request)

        def intercept_unary_stream(self, continuation, details, request):
            return continuation(self._with_token(details), request)

    class PlainTokenChannel(DefaultChannelBuilder):
        def toChannel(self):
            return grpc.intercept_channel(self._insecure_channel(self.endpoint), BearerToken(self.token))

    return PlainTokenChannel(url)


def answers(url: str, timeout: float = 2.0) -> bool:
    """Does something listen at the host and port of ``url`` (``sc://host:port``)?"""
    host, port = _host_port(url)
    try:
        with socket.create_connection((host, int(port or 15002)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


RECORD = "spark-connect.json"


def record_path(state_dir: Path) -> Path:
    return Path(state_dir) / RECORD


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class UntrustedRecord(ValueError):
    """A server record this tool did not write (or that others could have changed): never used."""


def read_record(path: Path) -> dict:
    """The record at ``path`` if it can only be this user's own: a regular file (not a link) owned by
    this user that nobody else can read or write, holding a pid, a port and a token; else ``UntrustedRecord``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UntrustedRecord("it is a symbolic link") from None
        raise
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedRecord("it is not a regular file")
        if info.st_uid != os.geteuid():
            raise UntrustedRecord(f"it belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()})")
        if info.st_mode & 0o077:
            raise UntrustedRecord(f"its mode {stat.S_IMODE(info.st_mode):04o} lets other users read or change it "
                                  "(this tool writes it 0600)")
        try:
            record = json.loads(handle.read(65536))
        except ValueError:
            raise UntrustedRecord("it is not a server record (JSON)") from None
    if not (isinstance(record, dict) and isinstance(record.get("pid"), int) and isinstance(record.get("port"), int)
            and isinstance(record.get("token"), str) and record["token"]):
        raise UntrustedRecord("it lacks the pid, port and token this tool records")
    return record


def _runs_our_server(pid: int, port: int) -> bool:
    """Is ``pid`` this user's Spark Connect server on ``port`` (not a process that reused a dead server's pid)?

    Where ``/proc`` is missing, a live pid is taken as the server.
    """
    proc = Path(f"/proc/{pid}")
    if not Path("/proc/self").exists():
        return _alive(pid)
    try:
        if proc.stat().st_uid != os.geteuid():
            return False
        command = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return SERVER_CLASS in command and f"spark.connect.grpc.binding.port={port}" in command


def recorded_server(state_dir: Path) -> dict | None:
    """The warehouse's recorded server if the record is trusted (``read_record``) and its server runs;
    a stale record is removed, an untrusted one is left alone with a one-line warning."""
    path = record_path(state_dir)
    try:
        record = read_record(path)
    except FileNotFoundError:
        return None
    except (OSError, UntrustedRecord) as error:
        reason = (error.strerror or error) if isinstance(error, OSError) else error
        logger.warning("ignoring the Spark Connect record %s: %s; remove it (and stop its server) by hand",
                       path, reason)
        return None
    if _runs_our_server(record["pid"], record["port"]) and _listening(record["port"]):
        return record
    path.unlink(missing_ok=True)
    return None


def client_url(record: dict) -> str:
    """The URL a client of a recorded server opens (with the token: never print it)."""
    return with_token(address(record["port"]), record["token"])


def start_recorded(state_dir: Path, port: int | None = None, driver_memory: str = "2g",
                   shuffle_partitions: int = 4, master: str = "local[2]",
                   jars_dir: Path | None = DEFAULT_SPARK_JARS_DIR) -> tuple[dict, bool]:
    """Start the warehouse's server unless one is running (with Delta where ``jars_dir`` holds its jars);
    returns (record, started)."""
    running = recorded_server(state_dir)
    if running:
        return running, False
    log = Path(state_dir) / "spark-connect.log"
    server = start_server(port, master, log=log, driver_memory=driver_memory, shuffle_partitions=shuffle_partitions,
                          jars_dir=jars_dir)
    record = {"pid": server.process.pid, "port": server.port, "url": address(server.port), "token": server.token,
              "log": str(log), "master": master,
              "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        write_record(state_dir, record)
    except BaseException:
        server.stop()
        raise
    return record, True


def write_record(state_dir: Path, record: dict) -> None:
    """Write the record atomically, readable by its owner only from its first byte on (0600)."""
    tmp = record_path(state_dir).with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    with os.fdopen(_create_private(tmp, exclusive=True), "w") as handle:
        handle.write(json.dumps(record, indent=1))
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(record_path(state_dir))


def stop_recorded(state_dir: Path, timeout: float = 30) -> dict | None:
    """Stop the warehouse's server (its whole process group) and remove the record; None if none ran."""
    record = recorded_server(state_dir)
    if record is None:
        return None
    pid = record["pid"]
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _alive(pid):
            try:  # our own child (started by this process) must be reaped to disappear
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.2)
        if not _alive(pid):
            break
    record_path(state_dir).unlink(missing_ok=True)
    return record


def main(argv: list[str] | None = None) -> int:
    """``python -m traffic.runtime.connect [--port 15002]``: run a local server in the foreground until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m traffic.runtime.connect", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=15002)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--jars-dir", type=Path, default=DEFAULT_SPARK_JARS_DIR,
                        help="Delta Lake's jars (default: the checkout's jars/delta, filled by make setup)")
    args = parser.parse_args(argv)
    print(f"starting Spark Connect on 127.0.0.1:{args.port} …", flush=True)
    server = start_server(args.port, args.master, driver_memory=args.driver_memory, jars_dir=args.jars_dir)
    token_file = server.log.with_suffix(".token")
    token_file.unlink(missing_ok=True)
    with os.fdopen(_create_private(token_file, exclusive=True), "w") as handle:
        handle.write(server.token)
    print(f"ready: export TRAFFIC_SPARK_MASTER={address(server.port)} {TOKEN_ENV}=$(cat {token_file})   "
          f"(log: {server.log}; Ctrl-C stops it)", flush=True)
    try:
        server.process.wait()
    except KeyboardInterrupt:
        print("stopping Spark Connect …", flush=True)
    finally:
        server.stop()
        token_file.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
