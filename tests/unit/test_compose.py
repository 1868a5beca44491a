"""The compose stack, validated offline (no Docker engine here): structure, health, order, names, image."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from traffic.core.settings import _PARSERS

ROOT = Path(__file__).resolve().parents[2]
LONG_RUNNING = {"postgres", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
                "spark-master", "spark-worker", "spark-connect", "collector", "seaweedfs"}


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_every_service_the_issue_names_is_there(compose):
    assert set(compose["services"]) == LONG_RUNNING | {"airflow-init"}


def test_every_service_has_an_image_or_build_and_a_health_check(compose):
    for name, service in compose["services"].items():
        assert service.get("image") or service.get("build"), name
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"


def test_start_order_uses_conditions(compose):
    services = compose["services"]
    for name, service in services.items():
        for dependency, rule in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert rule["condition"] in {"service_healthy", "service_completed_successfully"}, (name, dependency)
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        depends = services[name]["depends_on"]
        assert depends["postgres"]["condition"] == "service_healthy"
        assert depends["airflow-init"]["condition"] == "service_completed_successfully"
    assert services["spark-worker"]["depends_on"]["spark-master"]["condition"] == "service_healthy"


def test_only_the_ui_and_the_collector_are_published_and_on_loopback_by_default(compose):
    published = {name: s["ports"] for name, s in compose["services"].items() if s.get("ports")}
    assert sorted(published) == ["airflow-apiserver", "collector"]
    for port in published["airflow-apiserver"]:
        assert str(port).startswith("127.0.0.1:"), port
    # The collector's UDP ports: on loopback unless the operator names the address routers reach.
    assert published["collector"] == [f"${{COLLECTOR_BIND:-127.0.0.1}}:{p}:{p}/udp" for p in (2055, 4739, 6343)]


def test_the_spark_master_takes_no_unauthenticated_rest_submissions(compose):
    master = compose["services"]["spark-master"]["environment"]
    assert "-Dspark.master.rest.enabled=false" in master["SPARK_MASTER_OPTS"]
    assert master["TRAFFIC_SPARK_MASTER"] == "spark://spark-master:7077"  # the shared settings are still there


def test_environment_names_are_settings_the_code_reads(compose):
    for name, service in compose["services"].items():
        for key in (service.get("environment") or {}):
            if key.startswith("TRAFFIC_"):
                assert key[len("TRAFFIC_"):].lower() in _PARSERS, f"{name}: {key} is not a setting"
    spark_conn = compose["services"]["airflow-scheduler"]["environment"]["AIRFLOW_CONN_SPARK_DEFAULT"]
    assert '"conn_type": "spark"' in spark_conn and "spark://spark-master" in spark_conn and "local" not in spark_conn


def test_airflow_options_set_by_the_stack_and_make_airflow_are_options_airflow_knows(compose):
    """Airflow ignores an ``AIRFLOW__SECTION__OPTION`` it does not know: a misspelt tuning would do nothing."""
    from airflow.configuration import retrieve_configuration_description

    known = {(section, option) for section, described in retrieve_configuration_description(include_providers=True).items()
             for option in described["options"]}
    names = {key for service in compose["services"].values() for key in (service.get("environment") or {})
             if key.startswith("AIRFLOW__")}
    names |= set(re.findall(r"\b(AIRFLOW__[A-Z_]+)(?:=|:-)", (ROOT / "scripts" / "airflow.sh").read_text()))
    assert "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME" in names and len(names) > 10, names
    unknown = sorted(name for name in names if tuple(part.lower() for part in name.split("__")[1:3]) not in known)
    assert unknown == [], f"not Airflow options: {unknown}"


def test_nothing_but_the_object_store_is_shared(compose):
    """The warehouse and the inbox are on the stack's store for every service that runs the pipeline; no volume is
    mounted by two of Airflow (its services share their home), the Spark services, the collector and the store."""
    services = compose["services"]
    for name, service in services.items():
        env = service.get("environment") or {}
        if "TRAFFIC_WAREHOUSE" in env:
            assert env["TRAFFIC_WAREHOUSE"] == "s3://${S3_BUCKET:-lake}/warehouse", name
            assert env["TRAFFIC_INBOX"] == "s3://${S3_BUCKET:-lake}/inbox", name
            assert env["AWS_ENDPOINT_URL"] == "${S3_ENDPOINT:-http://seaweedfs:8333}", name
    assert {name for name, s in services.items() if "TRAFFIC_WAREHOUSE" in (s.get("environment") or {})} >= {
        "airflow-scheduler", "airflow-init", "spark-master", "spark-worker", "spark-connect", "collector"}
    mounted_by: dict[str, set] = {}
    for name, service in services.items():
        for volume in service.get("volumes", []):
            owner = "airflow" if name.startswith("airflow-") else name
            mounted_by.setdefault(volume.split(":")[0], set()).add(owner)
    assert {source: owners for source, owners in mounted_by.items() if len(owners) > 1} == {}
    # the collector writes into its own spool and sends each completed file to the store's inbox
    command = services["collector"]["command"]
    assert command[command.index("--inbox") + 1].startswith("/data/") and "/data" in services["collector"]["volumes"][0]
    assert command[command.index("--upload") + 1] == services["collector"]["environment"]["TRAFFIC_INBOX"]
    declared = set(compose["volumes"])
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):  # a file of this repository, e.g. the entrypoint check in postgres
                assert (ROOT / source).is_file() and volume.endswith(":ro"), (name, volume)
            else:
                assert source in declared, (name, volume)


def test_secrets_come_from_the_env_file(compose):
    text = (ROOT / "docker-compose.yml").read_text()
    example = dict(line.split("=", 1) for line in (ROOT / ".env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    for variable in set(re.findall(r"\$\{([A-Z0-9_]+)", text)) - {"SPARK_WORKER_CORES", "SPARK_WORKER_MEMORY",
                                                                            "SPARK_CONNECT_CORES", "SPARK_CONNECT_MEMORY"}:
        assert variable in example, f"{variable} is used by docker-compose.yml but missing from .env.example"
    for secret in ("POSTGRES_PASSWORD", "AIRFLOW_ADMIN_PASSWORD", "AIRFLOW_FERNET_KEY", "AIRFLOW_JWT_SECRET",
                   "SPARK_CONNECT_TOKEN", "S3_ACCESS_KEY", "S3_SECRET_KEY"):
        assert example[secret] == "change-me", f"{secret} must not hold a real value in .env.example"
        assert f"${{{secret}:?" in text, f"{secret} must be required, not defaulted"
    assert ".env" in (ROOT / ".gitignore").read_text().split()


def _sent_to_the_build(path: str, ignore: list[str]) -> bool:
    """Whether `docker build` sends ``path`` of the context given this .dockerignore: the last pattern matching
    the path or a folder above it decides, ``!`` lets it through, ``**/`` matches at any depth."""
    from fnmatch import fnmatchcase

    def matches(candidate: str, pattern: str) -> bool:
        if pattern.startswith("**/"):
            parts = candidate.split("/")
            return any(fnmatchcase("/".join(parts[n:]), pattern[3:]) for n in range(len(parts)))
        return fnmatchcase(candidate, pattern)

    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    sent = True
    for line in ignore:
        line = line.strip()
        if line and not line.startswith("#"):
            pattern = line.removeprefix("!").strip("/")
            if any(matches(candidate, pattern) for candidate in candidates):
                sent = line.startswith("!")
    return sent


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "docker/seaweedfs.Dockerfile"])
def test_everything_the_dockerfile_copies_is_in_the_build_context(dockerfile):
    """A file .dockerignore leaves out fails the build at its COPY (the stack never starts); caught here."""
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    copied = [source for line in (ROOT / dockerfile).read_text().splitlines()
              if line.startswith("COPY ") and "--from" not in line for source in line.split()[1:-1]]
    assert {"scripts/delta-jars.lock", "traffic"} <= set(copied) or "requirements.lock" in copied, copied
    for source in copied:
        assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which the repository lacks"
        assert _sent_to_the_build(source, ignore), f"the Dockerfile copies {source}, which .dockerignore leaves out"
    for left_out in (".venv/bin/python", "traffic/__pycache__/x.pyc", "warehouse/packets", "jars/delta/x.jar"):
        assert not _sent_to_the_build(left_out, ignore), left_out


def test_dockerfile_installs_what_pyproject_declares():
    dockerfile = (ROOT / "Dockerfile").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lock = {name.lower().replace("_", "-"): version for name, version in
            (line.split("==") for line in (ROOT / "requirements.lock").read_text().splitlines() if "==" in line)}
    assert "pip install -r requirements.lock" in dockerfile and "pip install --no-deps" in dockerfile
    assert "optional-dependencies" not in project or "compose" not in project["optional-dependencies"], \
        "the image installs the lock only: a dependency it needs belongs in the lock"
    pins = dict(d.split("==") for d in project["dependencies"] if "==" in d)
    for package, version in pins.items():
        assert lock.get(package) == version, f"{package}: pyproject pins {version}, lock has {lock.get(package)}"
    assert "python:3.11" in dockerfile and project["requires-python"].startswith(">=3.11")
    assert "openjdk-17" in dockerfile
    for folder in ("traffic", "schemas", "expectations", "jobs", "dags"):
        assert f"COPY {folder} " in dockerfile, f"the image lacks {folder}/"


# -- deployment defaults: placeholders refused, secrets owner-only ------------------------------

def _env_file(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def _interpolate(value, env: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}``, ``${VAR:?message}`` (what `docker compose` does to a value)."""
    def one(match):
        name, op, rest = match.group(1), match.group(2), match.group(3)
        if env.get(name):
            return env[name]
        if op == ":?":
            raise AssertionError(f"compose would refuse: {rest}")
        return rest if op == ":-" else ""
    return re.sub(r"\$\{([A-Z0-9_]+)(?:(:[-?])([^}]*))?\}", one, str(value)).replace("$$", "$")


def _entrypoint_script(compose, name: str) -> Path:
    """The repository file a service's container runs as its entrypoint (through the image or a mount)."""
    service = compose["services"][name]
    if "entrypoint" in service:
        container_path = next(part for part in service["entrypoint"] if part.endswith(".sh"))
        mounts = dict(reversed(v.split(":")[:2]) for v in service.get("volumes", []))
        return ROOT / mounts[container_path]
    dockerfile = (ROOT / ((service.get("build") or {}).get("dockerfile") or "Dockerfile")).read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.M).group(1))
    if entrypoint[:2] == ["/usr/bin/tini", "--"]:
        entrypoint = entrypoint[2:]
    else:  # no tini in the image: compose's own init runs first
        assert service.get("init") is True, (name, entrypoint)
    assert entrypoint[0].endswith(".sh"), entrypoint
    copied = re.search(rf"^COPY (.*) {re.escape(str(Path(entrypoint[0]).parent))}/$", dockerfile, re.M).group(1)
    script = next(p for p in copied.split() if Path(p).name == Path(entrypoint[0]).name)
    return ROOT / script


def _start(compose, name: str, dot_env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the service's entrypoint, with the environment compose would give it, in front of ``echo started``."""
    service = compose["services"][name]
    env = {key: _interpolate(value, dot_env) for key, value in (service.get("environment") or {}).items()}
    return subprocess.run(["sh", str(_entrypoint_script(compose, name)), "echo", "started"], capture_output=True,
                          text=True, timeout=30, env={"PATH": os.environ["PATH"], **env})


def _depends(compose, name: str) -> set[str]:
    direct = set(compose["services"][name].get("depends_on") or {})
    return direct.union(*(_depends(compose, d) for d in direct)) if direct else set()


def test_the_stack_refuses_to_start_with_the_placeholders_of_env_example(compose):
    dot_env = _env_file((ROOT / ".env.example").read_text())
    refused = {}
    for name in compose["services"]:
        started = _start(compose, name, dot_env)
        if started.returncode != 0:
            assert started.returncode == 78 and "started" not in started.stdout, (name, started)
            assert "change-me" in started.stderr and "refusing to start" in started.stderr, started.stderr
            refused[name] = started.stderr
    assert {"postgres", "airflow-init"} <= set(refused), refused
    assert "POSTGRES_PASSWORD" in refused["postgres"]
    for secret in ("AIRFLOW_ADMIN_PASSWORD", "AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API_AUTH__JWT_SECRET",
                   "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"):
        assert secret in refused["airflow-init"], refused["airflow-init"]
    for name in set(compose["services"]) - set(refused):  # no secret of its own: it waits for one that refused
        assert _depends(compose, name) & set(refused), f"{name} would start with placeholder secrets around it"


def test_the_stack_starts_once_every_placeholder_is_replaced(compose):
    dot_env = _env_file((ROOT / ".env.example").read_text())
    for key, value in dot_env.items():
        if value == "change-me":
            dot_env[key] = secrets.token_urlsafe(24)
    for name in compose["services"]:
        started = _start(compose, name, dot_env)
        assert (started.returncode, started.stdout.strip(), started.stderr) == (0, "started", ""), (name, started)


def test_the_init_writes_the_password_file_owner_only(compose, tmp_path):
    script = compose["services"]["airflow-init"]["command"][2]
    line = next(line for line in script.splitlines() if "passwords" in line.lower() or "PASSWORDS_FILE" in line)
    argv = shlex.split(line)
    assert argv[:2] == ["python", "-c"], line
    target = tmp_path / "passwords.json"
    target.write_text("{}")
    target.chmod(0o644)  # left by an earlier version: rewritten and made private
    env = {"PATH": os.environ["PATH"], "AIRFLOW_ADMIN_USER": "admin", "AIRFLOW_ADMIN_PASSWORD": "pw-1",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(target)}
    for _ in range(2):
        done = subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, text=True, timeout=30,
                              preexec_fn=lambda: os.umask(0o022))
        assert done.returncode == 0, done.stderr
        assert target.stat().st_mode & 0o777 == 0o600 and json.loads(target.read_text()) == {"admin": "pw-1"}
        target.unlink()  # and once more, created fresh under a permissive umask
    airflow_env = compose["services"]["airflow-scheduler"]["environment"]
    assert compose["services"]["airflow-init"]["environment"]["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] \
        == airflow_env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]


def test_the_driver_listens_where_the_stacks_executors_reach_it(compose):
    """In the stack the driver (a task's spark-submit, in the scheduler's container) must be reachable from
    the workers' containers; everywhere else it listens on 127.0.0.1 only."""
    from traffic.runtime.spark import driver_on_loopback

    assert not driver_on_loopback(compose["services"]["airflow-scheduler"]["environment"]["TRAFFIC_SPARK_MASTER"])
    for master in ("local[2]", "local[*]", "auto", "spark://127.0.0.1:7077", "spark://localhost:7077"):
        assert driver_on_loopback(master), master


def test_base_images_come_from_build_arguments_with_the_official_defaults(compose):
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.11-slim-bookworm\nFROM ${BASE_IMAGE}" in dockerfile
    build = compose["services"]["airflow-init"]["build"]
    assert build["network"] == "host" and build["args"]["BASE_IMAGE"] == "${TRAFFIC_BASE_IMAGE:-python:3.11-slim-bookworm}"
    assert compose["services"]["postgres"]["image"] == "${POSTGRES_IMAGE:-postgres:16}"
    # the offline bases are what local-images.sh builds, under the names .env.example's comment gives
    script = (ROOT / "scripts" / "local-images.sh").read_text()
    for name in ("traffic-python:3.11-bookworm", "traffic-postgres:15-bookworm"):
        assert name in script
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignored[1] == "*" and "!.venv" not in ignored, "the build context must leave the virtualenv out"


# -- the Airflow services' health check --------------------------------------------------------------
def _alive_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("airflow_alive", ROOT / "docker" / "airflow-alive.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_health_check_starts_airflows_cli(compose):
    """`airflow jobs check` imports all of Airflow (2-3 s of CPU): run every 30 s by three services, it kept a
    third of a core busy on an idle stack. The Airflow services ask the database through airflow-alive.py."""
    for name, service in compose["services"].items():
        test = service["healthcheck"]["test"]
        assert "airflow" not in test[1:2], f"{name}: {test}"
        if name in ("airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
            assert test[1:3] == ["python", "/usr/local/bin/airflow-alive.py"], f"{name}: {test}"
    image = (ROOT / "Dockerfile").read_text()
    assert "COPY docker/airflow-alive.py /usr/local/bin/" in image
    assert "!docker/airflow-alive.py" in (ROOT / ".dockerignore").read_text().splitlines()


def test_the_health_check_names_this_host_as_airflows_jobs_do():
    from airflow.utils.net import getfqdn

    assert _alive_script().hostname() == getfqdn()


def test_the_health_check_fails_in_one_line_when_the_database_does_not_answer(monkeypatch, capsys):
    from tests.support.sockets import free_port

    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
                       f"postgresql+psycopg2://airflow:secret@127.0.0.1:{free_port()}/airflow")
    assert _alive_script().main(["airflow-alive.py", "SchedulerJob"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("SchedulerJob on ") and "did not answer" in out and out.count("\n") == 1, out
    assert "secret" not in out
    assert _alive_script().main(["airflow-alive.py"]) == 2
