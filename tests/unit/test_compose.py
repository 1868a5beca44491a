"""The compose stack, validated offline (no Docker engine here): structure, health, order, names, image."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from traffic.settings import _PARSERS

ROOT = Path(__file__).resolve().parents[2]
LONG_RUNNING = {"postgres", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
                "spark-master", "spark-worker"}


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


def test_only_the_ui_is_published_and_only_on_loopback(compose):
    published = {name: s["ports"] for name, s in compose["services"].items() if s.get("ports")}
    assert list(published) == ["airflow-apiserver"]
    for port in published["airflow-apiserver"]:
        assert str(port).startswith("127.0.0.1:"), port


def test_environment_names_are_settings_the_code_reads(compose):
    for name, service in compose["services"].items():
        for key in (service.get("environment") or {}):
            if key.startswith("TRAFFIC_"):
                assert key[len("TRAFFIC_"):].lower() in _PARSERS, f"{name}: {key} is not a setting"
    spark_conn = compose["services"]["airflow-scheduler"]["environment"]["AIRFLOW_CONN_SPARK_DEFAULT"]
    assert '"conn_type": "spark"' in spark_conn and "spark://spark-master" in spark_conn and "local" not in spark_conn


def test_volumes_match_the_paths_the_code_is_told(compose):
    for name in ("airflow-scheduler", "spark-worker"):
        service = compose["services"][name]
        env = service["environment"]
        mounts = [v.split(":")[1] for v in service["volumes"]]
        for key in ("TRAFFIC_WAREHOUSE", "TRAFFIC_INBOX"):
            assert any(env[key].startswith(m) for m in mounts), f"{name}: {key}={env[key]} is not on a volume"
    declared = set(compose["volumes"])
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            assert volume.split(":")[0] in declared, (name, volume)


def test_secrets_come_from_the_env_file(compose):
    text = (ROOT / "docker-compose.yml").read_text()
    example = dict(line.split("=", 1) for line in (ROOT / ".env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    for variable in set(re.findall(r"\$\{([A-Z_]+)", text)) - {"SPARK_WORKER_CORES", "SPARK_WORKER_MEMORY"}:
        assert variable in example, f"{variable} is used by docker-compose.yml but missing from .env.example"
    for secret in ("POSTGRES_PASSWORD", "AIRFLOW_ADMIN_PASSWORD", "AIRFLOW_FERNET_KEY", "AIRFLOW_JWT_SECRET"):
        assert example[secret] == "change-me", f"{secret} must not hold a real value in .env.example"
        assert f"${{{secret}:?" in text, f"{secret} must be required, not defaulted"
    assert ".env" in (ROOT / ".gitignore").read_text().split()


def test_dockerfile_installs_what_pyproject_declares():
    dockerfile = (ROOT / "Dockerfile").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lock = {name.lower().replace("_", "-"): version for name, version in
            (line.split("==") for line in (ROOT / "requirements.lock").read_text().splitlines() if "==" in line)}
    assert "pip install -r requirements.lock" in dockerfile and "pip install --no-deps" in dockerfile
    for extra in project["optional-dependencies"]["compose"]:
        assert f'"{extra}"' in dockerfile, f"the image does not install the compose extra {extra}"
    pins = dict(d.split("==") for d in project["dependencies"] if "==" in d)
    for package, version in pins.items():
        assert lock.get(package) == version, f"{package}: pyproject pins {version}, lock has {lock.get(package)}"
    delta = re.search(r"ARG DELTA_VERSION=(\S+)", dockerfile).group(1)
    assert delta == pins["delta-spark"], "the baked Delta jars must match delta-spark"
    assert "python:3.11" in dockerfile and project["requires-python"].startswith(">=3.11")
    assert "openjdk-17" in dockerfile
    for folder in ("traffic", "schemas", "expectations", "jobs", "dags"):
        assert f"COPY {folder} " in dockerfile, f"the image lacks {folder}/"
