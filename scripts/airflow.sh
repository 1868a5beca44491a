#!/usr/bin/env bash
# `make airflow`: the embedded Airflow for this project — the API server + UI, scheduler, DAG processor
# and triggerer with the LocalExecutor, bound to 127.0.0.1, their metadata in a PostgreSQL server of
# their own (Unix socket only, in airflow-home/postgres), state in ./airflow-home, DAGs from ./dags,
# all started, watched and stopped by traffic/orchestration/embedded.py: a component that exits is
# said on the console and restarted (more than 3 times in 10 min: everything stops). Ctrl-C stops all.
#
# Everything can be overridden from the environment: AIRFLOW_HOME, AIRFLOW__API__PORT (8080),
# AIRFLOW__CORE__PARALLELISM (4), AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME (0.1),
# TRAFFIC_WAREHOUSE (./warehouse), TRAFFIC_INBOX (./inbox),
# any other TRAFFIC_* setting (passed through to every Spark job), TRAFFIC_SPARK_CONNECT (auto: a warm
# Spark Connect server for the warehouse, started here and stopped with Airflow; "": none), and
# TRAFFIC_AIRFLOW_UNPAUSE (DAGs to unpause once they are parsed; default: all three),
# TRAFFIC_AIRFLOW_PGDATA (the PostgreSQL folder; default $AIRFLOW_HOME/postgres), TRAFFIC_AIRFLOW_DB
# (postgres; sqlite only when asked for: a backfill created while the scheduler works can crash it) and
# AIRFLOW__DATABASE__SQL_ALCHEMY_CONN (an existing database, used as it is: no local server then).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

export AIRFLOW_HOME=${AIRFLOW_HOME:-$root/airflow-home}
mkdir -p "$AIRFLOW_HOME"
AIRFLOW_HOME=$(cd "$AIRFLOW_HOME" && pwd)
# The supervisor starts the components as `airflow …`, and tasks run `spark-submit`: both this venv's.
export PATH="$root/.venv/bin:$PATH"

port=${AIRFLOW__API__PORT:-8080}
url="http://127.0.0.1:$port"
export AIRFLOW__API__HOST=127.0.0.1 AIRFLOW__API__PORT=$port AIRFLOW__API__WORKERS=${AIRFLOW__API__WORKERS:-1}
export AIRFLOW__API__BASE_URL=${AIRFLOW__API__BASE_URL:-$url}
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL=${AIRFLOW__CORE__EXECUTION_API_SERVER_URL:-$url/execution/}
export AIRFLOW__CORE__DAGS_FOLDER=${AIRFLOW__CORE__DAGS_FOLDER:-$root/dags}
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__EXECUTOR=LocalExecutor
export AIRFLOW__CORE__PARALLELISM=${AIRFLOW__CORE__PARALLELISM:-4}
# The scheduler loops again after 0.1 s when it found nothing to do (Airflow's default: 1 s): each task and
# each run of a backfill starts up to that much later. Measured here: a 48-hour backfill over final hours
# 2.5–3.1 s an hour instead of 4.4 s; an idle Airflow uses 14% of a core instead of 4% (docs/benchmarks.md).
export AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME=${AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME:-0.1}
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=True
export AIRFLOW__CORE__AUTH_MANAGER=airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=admin:admin
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:-$AIRFLOW_HOME/passwords.json}
export AIRFLOW_CONN_SPARK_DEFAULT=${AIRFLOW_CONN_SPARK_DEFAULT:-'{"conn_type": "spark", "host": "local[2]"}'}
export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$root/.venv/bin/python}
export TZ=UTC GX_ANALYTICS_ENABLED=false

# Tasks run with another working directory: the warehouse and inbox are made absolute here.
TRAFFIC_WAREHOUSE=$(realpath -m "${TRAFFIC_WAREHOUSE:-$root/warehouse}")
TRAFFIC_INBOX=$(realpath -m "${TRAFFIC_INBOX:-$root/inbox}")
export TRAFFIC_WAREHOUSE TRAFFIC_INBOX
mkdir -p "$TRAFFIC_INBOX"

# One fixed admin password, made once, in the passwords file the simple auth manager reads;
# and a JWT signing key of a proper length, also made once (Airflow's generated one is short).
# Both are the owner's alone (0600), also when an earlier run or Airflow itself left them readable.
passwords=$AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE
if [ ! -s "$passwords" ]; then
  (umask 077 && .venv/bin/python -c 'import json, secrets; print(json.dumps({"admin": secrets.token_urlsafe(12)}))' >"$passwords")
fi
password=$(.venv/bin/python -c 'import json, sys; print(json.load(open(sys.argv[1]))["admin"])' "$passwords")
if [ ! -s "$AIRFLOW_HOME/jwt_secret" ]; then
  (umask 077 && .venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(64))' >"$AIRFLOW_HOME/jwt_secret")
fi
chmod 600 "$passwords" "$AIRFLOW_HOME/jwt_secret"
AIRFLOW__API_AUTH__JWT_SECRET=$(cat "$AIRFLOW_HOME/jwt_secret")
export AIRFLOW__API_AUTH__JWT_SECRET

# Airflow's metadata: a PostgreSQL server of its own (installed from Debian's packages if missing,
# initialised once in TRAFFIC_AIRFLOW_PGDATA, Unix socket only, a generated password kept owner-only),
# started and stopped with Airflow by the supervisor; SQLite only when asked for; a database the user
# names (AIRFLOW__DATABASE__SQL_ALCHEMY_CONN) as it is.
pgdata=()
if [ -n "${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN:-}" ]; then
  metadata="the database AIRFLOW__DATABASE__SQL_ALCHEMY_CONN names (no local server started)"
else
  case "${TRAFFIC_AIRFLOW_DB:-postgres}" in
    postgres)
      TRAFFIC_AIRFLOW_PGDATA=$(realpath -m "${TRAFFIC_AIRFLOW_PGDATA:-$AIRFLOW_HOME/postgres}")
      export TRAFFIC_AIRFLOW_PGDATA
      socket=$(.venv/bin/python -m traffic.orchestration.embedded prepare --pgdata "$TRAFFIC_AIRFLOW_PGDATA")
      pgdata=(--pgdata "$TRAFFIC_AIRFLOW_PGDATA")
      metadata="PostgreSQL (socket $socket, no TCP)"
      ;;
    sqlite)
      export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="sqlite:///$AIRFLOW_HOME/airflow.db"
      metadata="SQLite ($AIRFLOW_HOME/airflow.db) — backfills can crash it"
      echo "warning: TRAFFIC_AIRFLOW_DB=sqlite: a backfill created while the scheduler works can crash the" \
        "scheduler on SQLite (ObjectDeletedError), and then nothing runs; the default is PostgreSQL" >&2
      ;;
    *)
      echo "error: TRAFFIC_AIRFLOW_DB must be postgres or sqlite, not '$TRAFFIC_AIRFLOW_DB'" >&2
      exit 2
      ;;
  esac
fi

# The warm Spark: the DAGs' Spark steps run as clients of the warehouse's Spark Connect server
# (`traffic spark start`, 127.0.0.1, its own token), so an hourly close starts no JVM; the supervisor
# stops it once Airflow's components have stopped (--on-stop), before PostgreSQL, and says so.
# TRAFFIC_SPARK_CONNECT="" keeps every Spark step a spark-submit.
export TRAFFIC_SPARK_CONNECT=${TRAFFIC_SPARK_CONNECT-auto}
warm="off (every Spark step a spark-submit)"
on_stop=()
if [ "$TRAFFIC_SPARK_CONNECT" = auto ]; then
  where=(--warehouse "$TRAFFIC_WAREHOUSE" --inbox "$TRAFFIC_INBOX")
  .venv/bin/traffic spark start "${where[@]}" >/dev/null
  warm=$(.venv/bin/traffic spark status "${where[@]}" | head -n 1)
  on_stop=(--on-stop "$(printf '%q ' "$root/.venv/bin/traffic" spark stop "${where[@]}")")
fi

echo "------------------------------------------------------------------------------"
echo " Airflow UI   $url   (ready in about a minute)"
echo " log in as    admin / $password   (password file: $passwords)"
echo " warehouse    $TRAFFIC_WAREHOUSE"
echo " inbox        $TRAFFIC_INBOX   (drop files in inbox/<source>/)"
echo " warm Spark   $warm"
echo " metadata     $metadata"
echo " stop         Ctrl-C"
echo "------------------------------------------------------------------------------"

# The point of starting it is to watch the pipeline run, so the scheduled DAGs are unpaused once
# the DAG processor has registered them (traffic_replay too: it is manual, unpausing it only lets
# a triggered run start). A helper in the background does it through the REST API, then says
# where to log in; it ends on its own when Airflow does (a script's background jobs ignore Ctrl-C).
unpause=${TRAFFIC_AIRFLOW_UNPAUSE-traffic_ingest traffic_hourly traffic_replay}
# shellcheck disable=SC2086
.venv/bin/python - "$url" "$passwords" "$$" $unpause <<'PY' &
import json, os, sys, time, urllib.error, urllib.request

url, passwords, main_pid, wanted = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]


def call(method, path, token=None, body=None):
    request = urllib.request.Request(url + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {token}"} if token else {})})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


password = json.load(open(passwords))["admin"]
left, deadline = list(wanted), time.monotonic() + 600
while time.monotonic() < deadline:
    time.sleep(3)
    try:
        os.kill(main_pid, 0)
    except OSError:
        sys.exit(0)  # Airflow has stopped
    try:
        token = call("POST", "/auth/token", body={"username": "admin", "password": password})["access_token"]
        for dag_id in list(left):
            try:
                if call("GET", f"/api/v2/dags/{dag_id}", token)["is_paused"]:
                    call("PATCH", f"/api/v2/dags/{dag_id}", token, {"is_paused": False})
                else:
                    left.remove(dag_id)  # seen unpaused on a later look, not only right after the PATCH
            except urllib.error.HTTPError as error:
                if error.code != 404:  # 404: not parsed yet
                    raise
    except (OSError, ValueError, KeyError):
        continue  # the API server is not up yet
    if not left:
        print(f"[airflow.sh] ready: {url}  log in as admin / {password}"
              + (f"  (unpaused: {', '.join(wanted)})" if wanted else ""), flush=True)
        sys.exit(0)
PY

# exec: the supervisor replaces this shell in the foreground (same pid: the helpers above watch it), so
# Ctrl-C (SIGINT) reaches it, and it stops the components (each in a process group of its own), then
# PostgreSQL. Started in the background (`make airflow &`, nohup, a CI step) a shell ignores SIGINT and
# cannot un-ignore it, and what it starts would inherit that: SIGINT is restored to its default first.
exec .venv/bin/python -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' \
  .venv/bin/python -m traffic.orchestration.embedded run "${pgdata[@]}" "${on_stop[@]}"
