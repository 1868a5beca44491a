"""Delta Lake's jars (issue 35): fetched as scripts/delta-jars.lock pins them, kept only with their pinned
SHA-256, found by the default ``spark_jars_dir``; an unreachable Maven costs set-up one line, not a failure."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
FETCH = ROOT / "scripts" / "fetch-delta-jars.sh"
LOCK = ROOT / "scripts" / "delta-jars.lock"


def pins(lock: Path = LOCK) -> dict[str, str]:
    """coordinate → sha256, as the lock lists them."""
    lines = [line.split() for line in lock.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return {coordinate: sha for coordinate, sha in lines}


def pinned_version(pinned: dict[str, str], artifact: str) -> str:
    """The version the lock pins of ``group:artifact``."""
    [version] = [c.rsplit(":", 1)[1] for c in pinned if c.rsplit(":", 1)[0] == artifact]
    return version


def jar_name(coordinate: str) -> str:
    _, artifact, version = coordinate.split(":")
    return f"{artifact}-{version}.jar"


def fake_maven(tmp_path: Path, contents: dict[str, bytes] | None = None) -> tuple[Path, Path, dict[str, bytes]]:
    """A Maven repository on disk (for curl, as file://) with two jars, a lock pinning their sums, and their bytes."""
    coordinates = ["org.example.delta:delta-storage:9.9.9", "org.example.delta:delta-spark_4.2_2.13:9.9.9"]
    repo, jars = tmp_path / "maven", {}
    for coordinate in coordinates:
        group, artifact, version = coordinate.split(":")
        jar = repo / group.replace(".", "/") / artifact / version / jar_name(coordinate)
        jar.parent.mkdir(parents=True)
        jars[jar_name(coordinate)] = (contents or {}).get(jar_name(coordinate), os.urandom(2000))
        jar.write_bytes(jars[jar_name(coordinate)])
    lock = tmp_path / "delta-jars.lock"
    lock.write_text("# test pins\n" + "".join(f"{c}  {hashlib.sha256(jars[jar_name(c)]).hexdigest()}\n"
                                               for c in coordinates))
    return repo, lock, jars


def fetch(folder: Path, via: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(FETCH), "--via", via, str(folder)], capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ["PATH"], **env})


def stub_mvn(tmp_path: Path, jars: dict[str, bytes]) -> Path:
    """Stands in for mvn: `dependency:copy-dependencies -DoutputDirectory=D` of the pom.xml in its working folder
    writes these bytes as D/a-v.jar for each dependency the pom lists, and logs each call to calls.log."""
    store = tmp_path / "stub-jars"
    store.mkdir()
    for name, data in jars.items():
        (store / name).write_bytes(data)
    mvn = tmp_path / "mvn"
    mvn.write_text("#!/bin/sh\n"
                   "for arg in \"$@\"; do case \"$arg\" in -DoutputDirectory=*) out=${arg#-DoutputDirectory=} ;; esac; done\n"
                   f"echo \"$*\" >>\"{tmp_path}/calls.log\"\n"
                   "sed -n 's|.*<artifactId>\\([^<]*\\)</artifactId><version>\\([^<]*\\)</version>.*|\\1-\\2.jar|p' pom.xml |\n"
                   f"  while read -r file; do cp \"{store}/$file\" \"$out/$file\"; done\n")
    mvn.chmod(0o755)
    return mvn


def test_jars_are_kept_only_with_their_pinned_checksums(tmp_path):
    repo, lock, jars = fake_maven(tmp_path)
    good = fetch(tmp_path / "good", "curl", DELTA_JARS_LOCK=str(lock), MAVEN=f"file://{repo}")
    assert good.returncode == 0, good.stderr
    assert {p.name: p.read_bytes() for p in (tmp_path / "good").iterdir()} == jars
    assert "fetched and verified" in good.stdout

    # One jar on the repository is not what the lock pins: refused, and the folder keeps no jar at all
    # (delta-spark alone would pick the spark engine with half its classpath).
    storage = next(repo.rglob("delta-storage-9.9.9.jar"))
    storage.write_bytes(b"tampered")
    expected, actual = pins(lock)["org.example.delta:delta-storage:9.9.9"], hashlib.sha256(b"tampered").hexdigest()
    tampered = fetch(tmp_path / "tampered", "curl", DELTA_JARS_LOCK=str(lock), MAVEN=f"file://{repo}")
    assert tampered.returncode == 1, tampered
    assert tampered.stderr.strip().splitlines() == [
        f"fetch-delta-jars: delta-storage-9.9.9.jar (org.example.delta:delta-storage:9.9.9 via curl) has SHA-256 "
        f"{actual}, not the pinned {expected} ({lock}): refused"]
    assert list((tmp_path / "tampered").iterdir()) == [], "no jar and no partial download may stay"

    # The same through mvn (set-up's way): a jar mvn hands over with another checksum is refused too.
    mvn = stub_mvn(tmp_path, {**jars, "delta-storage-9.9.9.jar": b"tampered"})
    by_mvn = fetch(tmp_path / "by-mvn", "mvn", DELTA_JARS_LOCK=str(lock), MVN=str(mvn))
    assert by_mvn.returncode == 1 and f"has SHA-256 {actual}, not the pinned {expected}" in by_mvn.stderr, by_mvn
    assert list((tmp_path / "by-mvn").iterdir()) == []
    # Good bytes through mvn: every pin in one mvn run (not one per jar), each verified.
    (tmp_path / "calls.log").unlink()
    shutil.rmtree(tmp_path / "stub-jars")
    good_mvn = fetch(tmp_path / "good-mvn", "mvn", DELTA_JARS_LOCK=str(lock), MVN=str(stub_mvn(tmp_path, jars)))
    assert good_mvn.returncode == 0, good_mvn
    assert {p.name: p.read_bytes() for p in (tmp_path / "good-mvn").iterdir()} == jars
    assert len((tmp_path / "calls.log").read_text().splitlines()) == 1


def test_verified_jars_are_not_fetched_again_and_other_versions_go(tmp_path):
    repo, lock, jars = fake_maven(tmp_path)
    folder = tmp_path / "jars"
    assert fetch(folder, "curl", DELTA_JARS_LOCK=str(lock), MAVEN=f"file://{repo}").returncode == 0
    (folder / "delta-spark_4.2_2.13-9.9.8.jar").write_bytes(b"an older pin")
    # Nothing to fetch: neither mvn (missing here) nor the network is asked, and the older version is removed.
    again = fetch(folder, "mvn", DELTA_JARS_LOCK=str(lock), MVN=str(tmp_path / "no-such-mvn"))
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == jars
    # A jar changed in place is fetched anew, not trusted.
    (folder / "delta-storage-9.9.9.jar").write_bytes(b"changed on disk")
    refetched = fetch(folder, "curl", DELTA_JARS_LOCK=str(lock), MAVEN=f"file://{repo}")
    assert refetched.returncode == 0 and "delta-storage-9.9.9.jar" in refetched.stdout, refetched
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == jars
    # A new pin that cannot be fetched: the old pin's jars go too (they would run beside the new package).
    bumped = tmp_path / "bumped.lock"
    bumped.write_text(lock.read_text().replace("9.9.9", "9.9.10"))
    offline = fetch(folder, "mvn", DELTA_JARS_LOCK=str(bumped), MVN=str(tmp_path / "no-such-mvn"))
    assert offline.returncode == 3 and offline.stderr.strip().splitlines() == [
        f"Delta's jars could not be fetched from Maven Central ({tmp_path / 'no-such-mvn'} not found)"], offline
    assert list(folder.iterdir()) == []


def checkout(tmp_path: Path) -> Path:
    """A checkout holding set-up's scripts and this one's .venv, so `setup.sh jars` runs apart from the real jars/."""
    repo = tmp_path / "checkout"
    (repo / "scripts").mkdir(parents=True)
    for name in ("setup.sh", "fetch-delta-jars.sh", "delta-jars.lock"):
        shutil.copy(ROOT / "scripts" / name, repo / "scripts" / name)
    (repo / ".venv").symlink_to(ROOT / ".venv")
    return repo


def setup_jars(repo: Path, **env: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": str(repo.parent), "TRAFFIC_SPARK_JARS_DIR": str(repo / "jars" / "delta"),
           **env}
    return subprocess.run(["bash", str(repo / "scripts" / "setup.sh"), "jars"], capture_output=True, text=True,
                          timeout=180, env=env)


def test_unreachable_maven_costs_setup_one_line_and_the_rs_engine_runs(tmp_path):
    assert shutil.which("mvn"), "mvn is part of the project's machines (issue 35): apt-get install -y maven"
    repo = checkout(tmp_path)
    # mvn with an empty local repository and every repository mirrored to a port nothing listens on.
    home = tmp_path / "home"
    (home / ".m2").mkdir(parents=True)
    (home / ".m2" / "settings.xml").write_text(
        "<settings><mirrors><mirror><id>unreachable</id><mirrorOf>*</mirrorOf><url>http://127.0.0.1:9/</url>"
        "</mirror></mirrors></settings>\n")
    done = setup_jars(repo, MAVEN_OPTS=f"-Duser.home={home}")
    assert done.returncode == 0, done
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert re.fullmatch(r"Delta's jars could not be fetched from Maven Central \(mvn: .+\): the Delta layer runs "
                        r"rs \(delta-rs: no Delta jars in .*/checkout/jars/delta\)", lines[0]), lines[0]
    assert not list((repo / "jars" / "delta").glob("*.jar"))

    # No mvn at all: the same one line, with that reason.
    missing = setup_jars(repo, MVN=str(tmp_path / "no-such-mvn"))
    assert missing.returncode == 0, missing
    assert (missing.stdout + missing.stderr).strip().splitlines() == [
        f"Delta's jars could not be fetched from Maven Central ({tmp_path / 'no-such-mvn'} not found): "
        f"the Delta layer runs rs (delta-rs: no Delta jars in {repo / 'jars' / 'delta'})"]

    # Offline on purpose: nothing fetched, nothing asked.
    offline = setup_jars(repo, TRAFFIC_DELTA_JARS="off", MVN=str(tmp_path / "no-such-mvn"))
    assert offline.returncode == 0, offline
    assert (offline.stdout + offline.stderr).strip().startswith(
        "Delta's jars were not fetched (TRAFFIC_DELTA_JARS=off)"), offline


def test_setup_refuses_a_jar_maven_hands_over_with_another_checksum(tmp_path):
    repo = checkout(tmp_path)
    pinned = pins()
    mvn = stub_mvn(tmp_path, {jar_name(c): b"not delta" for c in pinned})
    done = setup_jars(repo, MVN=str(mvn))
    assert done.returncode == 1, done
    first = next(iter(pinned))
    assert f"{jar_name(first)} ({first} via mvn) has SHA-256 {hashlib.sha256(b'not delta').hexdigest()}, " \
           f"not the pinned {pinned[first]}" in done.stderr, done.stderr
    assert not list((repo / "jars" / "delta").glob("*.jar"))


def test_the_pins_match_delta_spark_the_image_and_the_stack():
    """One list of pins: the Python package's own coordinates, fetched by the image from the same file."""
    from pyspark.sql import SparkSession
    from delta import configure_spark_with_delta_pip

    from traffic.runtime.connect import DELTA_CONF

    pinned = pins()
    assert all(re.fullmatch(r"[0-9a-f]{64}", sha) for sha in pinned.values()), pinned
    # The coordinates configure_spark_with_delta_pip names for the installed delta-spark and pyspark (on a
    # builder of its own: SparkSession.builder is shared with every session this process starts).
    package = configure_spark_with_delta_pip(SparkSession.Builder())._options["spark.jars.packages"]
    version = package.rsplit(":", 1)[1]
    assert {c for c in pinned if c.startswith("io.delta:")} == {package, f"io.delta:delta-storage:{version}"}, pinned
    # The S3A connector is the one for the Hadoop client pyspark ships, never the SDK's 686 MB bundle.
    import pyspark

    client = [p.name for p in (Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")]
    assert [f"hadoop-client-api-{pinned_version(pinned, 'org.apache.hadoop:hadoop-aws')}.jar"] == client, client
    assert not any(c.startswith("software.amazon.awssdk:bundle:") for c in pinned)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"delta-spark=={version}" in project["dependencies"]
    assert f"delta_spark=={version}" in (ROOT / "requirements.lock").read_text().split()

    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^COPY scripts/fetch-delta-jars\.sh scripts/delta-jars\.lock \./scripts/$", dockerfile, re.M)
    assert re.search(r"^RUN .*sh scripts/fetch-delta-jars\.sh --via curl /opt/delta-jars$", dockerfile, re.M)
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for text in (dockerfile, (ROOT / "docker-compose.yml").read_text(), (ROOT / ".env.example").read_text()):
        assert not re.search(r"DELTA_(SPARK|STORAGE)_SHA256|DELTA_VERSION", text), "the pins live in the lock only"
    assert "args" not in compose["services"]["airflow-init"]["build"] or not any(
        "DELTA" in name for name in compose["services"]["airflow-init"]["build"]["args"])
    jars_dir = compose["x-traffic-env"]["TRAFFIC_SPARK_JARS_DIR"]
    assert jars_dir == "/opt/delta-jars"
    # The warm server of the stack runs with the image's jars and the same Delta settings as a local one.
    command = compose["services"]["spark-connect"]["command"]
    confs = dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf")
    assert confs["spark.jars"] == f"{jars_dir}/*.jar"
    assert {name: confs.get(name) for name in DELTA_CONF} == DELTA_CONF


def test_the_default_jars_folder_is_the_checkouts_and_settings_override_it(tmp_path):
    from traffic.core.settings import load_settings
    from traffic.runtime.connect import delta_classpath
    from traffic.runtime.spark import delta_conf
    from traffic.storage.engine import choose_engine

    assert load_settings(environ={}).spark_jars_dir == ROOT / "jars" / "delta"
    assert re.search(r'fetch-delta-jars\.sh --via "\$via" jars/delta', (ROOT / "scripts" / "setup.sh").read_text())
    assert "/jars/" in (ROOT / ".gitignore").read_text().split()
    platform = tmp_path / "platform-jars"
    assert load_settings(environ={"TRAFFIC_SPARK_JARS_DIR": str(platform)}).spark_jars_dir == platform
    assert load_settings(environ={"TRAFFIC_SPARK_JARS_DIR": ""}).spark_jars_dir is None

    # A folder that is not there, or holds no delta-spark: auto picks rs, without an error.
    for environ in ({"TRAFFIC_SPARK_JARS_DIR": str(platform), "TRAFFIC_ENGINE": "auto"},
                    {"TRAFFIC_SPARK_JARS_DIR": "", "TRAFFIC_ENGINE": "auto"}):
        settings = load_settings(environ=environ)
        assert (choose_engine(settings), delta_conf(settings), delta_classpath(settings.spark_jars_dir)) == ("rs", {}, [])
    platform.mkdir()
    (platform / "delta-storage-4.4.0.jar").write_bytes(b"")
    assert delta_classpath(platform) == []
    (platform / "delta-spark_4.2_2.13-4.4.0.jar").write_bytes(b"")
    settings = load_settings(environ={"TRAFFIC_SPARK_JARS_DIR": str(platform), "TRAFFIC_ENGINE": "auto"})
    assert choose_engine(settings) == "spark"
    assert delta_conf(settings) == {
        "spark.jars": f"{platform}/delta-spark_4.2_2.13-4.4.0.jar,{platform}/delta-storage-4.4.0.jar",
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.databricks.delta.snapshotPartitions": "1"}
    assert delta_conf(load_settings(environ={"TRAFFIC_SPARK_JARS_DIR": str(platform), "TRAFFIC_ENGINE": "rs"})) == {}


def test_the_warm_server_starts_with_delta_where_the_jars_are(tmp_path, monkeypatch):
    from traffic.runtime import connect

    started = []

    class Process:
        pid, returncode = 1, None

        def __init__(self, command, **_):
            started.append(command)

        def poll(self):
            return None

    class Listening:
        def __enter__(self):
            return self

        def __exit__(self, *_):
            return False

    monkeypatch.setattr(connect.subprocess, "Popen", Process)
    monkeypatch.setattr(connect.socket, "create_connection", lambda *a, **k: Listening())
    jars = tmp_path / "jars"
    jars.mkdir()
    for name in ("delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar"):
        (jars / name).write_bytes(b"")

    def confs(command):
        return dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf")

    connect.start_server(port=1, log=tmp_path / "with.log", jars_dir=jars)
    connect.start_server(port=1, log=tmp_path / "without.log", jars_dir=tmp_path / "nowhere")
    with_delta, without = confs(started[0]), confs(started[1])
    assert with_delta["spark.jars"] == f"{jars}/delta-spark_4.2_2.13-4.4.0.jar,{jars}/delta-storage-4.4.0.jar"
    assert {name: with_delta[name] for name in connect.DELTA_CONF} == connect.DELTA_CONF
    assert not {"spark.jars", *connect.DELTA_CONF} & set(without), without
    assert with_delta["spark.connect.grpc.binding.address"] == "127.0.0.1"
