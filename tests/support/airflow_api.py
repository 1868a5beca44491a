"""Airflow's REST API v2 as the tests and the bench drive it (embedded Airflow or the compose stack),
and the router feed they deliver: a small urllib client with a simple-auth-manager JWT, backfills
created through the API, the end of failed tasks' logs, and a feed whose totals per hour are known."""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path


class ApiError(AssertionError):
    """A REST API answer other than 2xx (the message has the status and the body)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class AirflowApi:
    """A tiny REST API v2 client (urllib) with a simple-auth-manager JWT.

    ``patience`` (seconds): how long a GET is retried while the server answers 5xx or not at all — what
    its database or itself restarting looks like from outside (the compose stack's restart test).
    """

    def __init__(self, url: str, password: str, patience: float = 0):
        self.url, self.password, self._token, self.patience = url, password, None, patience

    def token(self) -> str:
        if self._token is None:
            body = self._send("POST", "/auth/token", {"username": "admin", "password": self.password}, auth=False)
            self._token = body["access_token"]
        return self._token

    def _send(self, method: str, path: str, body=None, auth: bool = True):
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        request = urllib.request.Request(self.url + path, method=method, headers=headers,
                                         data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read()
        except urllib.error.HTTPError as error:
            raise ApiError(f"{method} {path} → {error.code}: {error.read().decode()[:2000]}", error.code) from None
        return json.loads(text) if text else None

    def get(self, path: str):
        deadline = time.monotonic() + self.patience
        while True:
            try:
                return self._send("GET", path)
            except (ApiError, OSError) as error:
                if (isinstance(error, ApiError) and error.status < 500) or time.monotonic() > deadline:
                    raise
            time.sleep(2)

    def post(self, path: str, body):
        return self._send("POST", path, body)

    def patch(self, path: str, body):
        return self._send("PATCH", path, body)

    def delete(self, path: str):
        return self._send("DELETE", path)

    def unpause(self, dag_id: str) -> None:
        self.patch(f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def runs(self, dag_id: str, **query) -> list[dict]:
        params = "&".join(f"{k}={v}" for k, v in {"limit": 100, **query}.items())
        return self.get(f"/api/v2/dags/{dag_id}/dagRuns?{params}")["dag_runs"]

    @staticmethod
    def run_path(dag_id: str, run_id: str) -> str:
        """The REST path of one DAG run (run ids hold ``:`` and ``+``: quoted)."""
        return f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id)}"

    def run(self, dag_id: str, run_id: str) -> dict:
        return self.get(self.run_path(dag_id, run_id))

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        tis = self.get(f"{self.run_path(dag_id, run_id)}/taskInstances")
        return {t["task_id"]: t["state"] for t in tis["task_instances"]}

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value"):
        """A task's XCom, deserialized (None when the task pushed none)."""
        try:
            value = self.get(f"{self.run_path(dag_id, run_id)}/taskInstances/{task_id}"
                             f"/xcomEntries/{key}?deserialize=true")["value"]
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return json.loads(value) if isinstance(value, str) else value

    def wait_run(self, dag_id: str, run_id: str, timeout: float, home: Path | None = None) -> dict:
        """Poll until the run is finished; on timeout say where every task is."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.run(dag_id, run_id)
            if run["state"] in ("success", "failed"):
                return run
            time.sleep(2)
        raise AssertionError(f"{dag_id} {run_id} not finished after {timeout}s: {self.task_states(dag_id, run_id)}"
                             + (failed_task_logs(home, dag_id, run_id) if home else ""))


def log_events(lines: list[str]) -> list[str]:
    """The messages of an Airflow task log's lines (JSON events; a line that is not one, as it is)."""
    events = []
    for line in lines:
        try:
            events.append(str(json.loads(line).get("event", line)))
        except (ValueError, AttributeError):
            events.append(line)
    return events


def failed_task_logs(home: Path, dag_id: str, run_id: str, lines: int = 40) -> str:
    """The end of every failed or running task's log of a run (what a failing test should print)."""
    out = []
    for log in sorted((home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}").glob("task_id=*/attempt=*.log")):
        text = log.read_text(errors="replace").splitlines()
        if any('"level":"error"' in line or "ERROR" in line for line in text):
            out.append(f"\n--- {log.relative_to(home)}\n" + "\n".join(log_events(text[-lines:])))
    return "".join(out)


def write_router_feed(path: Path, start: datetime, end: datetime, seed: int) -> dict[datetime, list[int]]:
    """Router-feed CSV: a few packets a minute over ``[start, end)``, a clock tick at ``end``.

    Returns (bytes, packets) per hour. Written under a temporary name, then renamed, as a sender does.
    """
    rng = random.Random(seed)
    lines, per_hour = [], {}
    moment = start
    while moment < end:
        for _ in range(rng.randint(1, 3)):
            ts = moment + timedelta(microseconds=rng.randrange(60_000_000))
            size = rng.choice([64, 576, 1500])
            lines.append(f"new,OP_INSERT,{int(ts.timestamp()) * 1_000_000 + ts.microsecond},"
                         f"192.0.2.{rng.randint(10, 14)},198.51.100.{rng.randint(1, 9)},"
                         f"{rng.randint(1024, 65535)},443,{size}")
            totals = per_hour.setdefault(moment.replace(minute=0), [0, 0])
            totals[0] += size
            totals[1] += 1
        moment += timedelta(minutes=1)
    lines.append(f"new,OP_INSERT,{int(end.timestamp()) * 1_000_000}")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    partial.write_text("\n".join(lines) + "\n")
    partial.rename(path)
    return per_hour


def create_backfill(api: AirflowApi, dag_id: str, first: datetime, last: datetime, reprocess: str = "none",
                    max_active_runs: int = 1) -> dict:
    """POST /api/v2/backfills for the logical dates ``first``…``last``, ``max_active_runs`` runs at a time
    (``reprocess``: Airflow's reprocess behavior, ``none`` for missing runs only, ``completed`` to run them
    all again).

    On SQLite, Airflow refuses to create a backfill while another writer holds the database
    ("Database is locked", 503) and removes the partial one: wait a moment and ask again.
    """
    body = {"dag_id": dag_id, "from_date": first.isoformat(), "to_date": last.isoformat(),
            "max_active_runs": max_active_runs, "reprocess_behavior": reprocess}
    deadline = time.monotonic() + 90
    while True:
        try:
            return api.post("/api/v2/backfills", body)
        except ApiError as error:
            if error.status == 409:  # an earlier attempt got through after all
                active = [b for b in api.get(f"/api/v2/backfills?dag_id={dag_id}")["backfills"] if not b["completed_at"]]
                if active:
                    return active[0]
            if error.status not in (409, 503) or time.monotonic() > deadline:
                raise
        time.sleep(2)


def backfill_completed(api: AirflowApi, backfill: dict) -> tuple[dict, bool]:
    """The backfill as it is now, and whether it has completed.

    On SQLite, Airflow 3.3 has answered 404 for a backfill it had just created (a 503-retried create
    whose first attempt was rolled back): then the DAG's newest backfill is the one that runs.
    """
    try:
        now = api.get(f"/api/v2/backfills/{backfill['id']}")
    except ApiError as error:
        if error.status != 404:
            raise
        made = [b for b in api.get(f"/api/v2/backfills?dag_id={backfill['dag_id']}")["backfills"]
                if b["id"] >= backfill["id"]]
        if not made:
            raise AssertionError(f"backfill {backfill['id']} of {backfill['dag_id']} is gone, and no later one "
                                 "exists") from error
        now = max(made, key=lambda b: b["id"])
    return now, now["completed_at"] is not None
