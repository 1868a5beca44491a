"""A long-running local Spark Connect server: pay the JVM start once, then each job is a light client.

A fresh SparkSession costs 7–20 s on a small machine and runs its first batch cold; a client of a
warm Spark Connect server starts in about a second. ``traffic spark start`` starts one for a
warehouse and records it in ``<warehouse>/_traffic/spark-connect.json``; with the default
``spark_master = auto`` every job on that warehouse then uses it, and ``traffic spark stop`` ends
it. An explicit ``spark_master`` of ``sc://127.0.0.1:<port>`` uses any server. The server binds to
127.0.0.1 only. Files it writes land on the same filesystem as the client, so the Delta layer's
commit path (delta-rs, client side) works unchanged, and a client killed mid-batch leaves the
same journal as a killed local job (the next run finishes it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from traffic import jvm
from traffic.spark import CONNECT_SESSION_CONF

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


@dataclass
class ConnectServer:
    """A running server process and the URL clients use."""

    process: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

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


def start_server(port: int | None = None, master: str = "local[2]", log: Path | None = None,
                 driver_memory: str = "2g", shuffle_partitions: int = 4, timeout: float = 120) -> ConnectServer:
    """Start a server on 127.0.0.1 and wait until it accepts connections."""
    port = port or free_port()
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
    }
    command = [str(spark_submit), "--class", SERVER_CLASS, "--master", master]
    for name, value in conf.items():
        command += ["--conf", f"{name}={value}"]
    command.append("spark-internal")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "TZ": "UTC"}
    handle = open(log, "w")
    process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = ConnectServer(process, port, log)
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


def recorded_server(state_dir: Path) -> dict | None:
    """The warehouse's recorded server if its process is alive and listening; a stale record is removed."""
    path = record_path(state_dir)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if _alive(record.get("pid", -1)) and _listening(record.get("port", 0)):
        return record
    path.unlink(missing_ok=True)
    return None


def start_recorded(state_dir: Path, port: int | None = None, driver_memory: str = "2g",
                   shuffle_partitions: int = 4, master: str = "local[2]") -> tuple[dict, bool]:
    """Start the warehouse's server unless one is running; returns (record, started)."""
    running = recorded_server(state_dir)
    if running:
        return running, False
    log = Path(state_dir) / "spark-connect.log"
    server = start_server(port, master, log=log, driver_memory=driver_memory, shuffle_partitions=shuffle_partitions)
    record = {"pid": server.process.pid, "port": server.port, "url": server.url, "log": str(log),
              "master": master, "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    tmp = record_path(state_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(record_path(state_dir))
    return record, True


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
    """``python -m traffic.connect [--port 15002]``: run a local server in the foreground until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m traffic.connect", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=15002)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="2g")
    args = parser.parse_args(argv)
    print(f"starting Spark Connect on 127.0.0.1:{args.port} …", flush=True)
    server = start_server(args.port, args.master, driver_memory=args.driver_memory)
    print(f"ready: export TRAFFIC_SPARK_MASTER={server.url}   (log: {server.log}; Ctrl-C stops it)", flush=True)
    try:
        server.process.wait()
    except KeyboardInterrupt:
        print("stopping Spark Connect …", flush=True)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
