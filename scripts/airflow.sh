#!/usr/bin/env bash
# `make airflow`: the embedded Airflow for this project — `airflow standalone` (scheduler, DAG
# processor, API server + UI, triggerer) on SQLite with the LocalExecutor, bound to 127.0.0.1,
# state in ./airflow-home, DAGs from ./dags. Ctrl-C stops every component.
#
# Everything can be overridden from the environment: AIRFLOW_HOME, AIRFLOW__API__PORT (8080),
# AIRFLOW__CORE__PARALLELISM (4), TRAFFIC_WAREHOUSE (./warehouse), TRAFFIC_INBOX (./inbox),
# any other TRAFFIC_* setting (passed through to every Spark job), and
# TRAFFIC_AIRFLOW_UNPAUSE (DAGs to unpause once they are parsed; default: all three).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

export AIRFLOW_HOME=${AIRFLOW_HOME:-$root/airflow-home}
mkdir -p "$AIRFLOW_HOME"
AIRFLOW_HOME=$(cd "$AIRFLOW_HOME" && pwd)
# airflow standalone starts its components as `airflow …` and spark-submit must be this venv's.
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
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=True
export AIRFLOW__CORE__AUTH_MANAGER=airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=admin:admin
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:-$AIRFLOW_HOME/passwords.json}
export AIRFLOW_CONN_SPARK_DEFAULT=${AIRFLOW_CONN_SPARK_DEFAULT:-'{"conn_type": "spark", "host": "local[2]"}'}
export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$root/.venv/bin/python}
export TZ=UTC GX_ANALYTICS_ENABLED=false

# Tasks run with another working directory: the warehouse and inbox are made absolute here.
export TRAFFIC_WAREHOUSE=$(realpath -m "${TRAFFIC_WAREHOUSE:-$root/warehouse}")
export TRAFFIC_INBOX=$(realpath -m "${TRAFFIC_INBOX:-$root/inbox}")
mkdir -p "$TRAFFIC_INBOX"

# One fixed admin password, made once (kept in the passwords file the simple auth manager reads).
passwords=$AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE
if [ ! -s "$passwords" ]; then
  (umask 077 && .venv/bin/python -c 'import json, secrets; print(json.dumps({"admin": secrets.token_urlsafe(12)}))' >"$passwords")
fi
password=$(.venv/bin/python -c 'import json, sys; print(json.load(open(sys.argv[1]))["admin"])' "$passwords")

banner() {
  echo "------------------------------------------------------------------------------"
  echo " Airflow UI   $url"
  echo " log in as    admin / $password   (from $passwords)"
  echo " warehouse    $TRAFFIC_WAREHOUSE"
  echo " inbox        $TRAFFIC_INBOX   (drop files in inbox/<source>/)"
  echo " stop         Ctrl-C"
  echo "------------------------------------------------------------------------------"
}
banner

# The point of starting it is to watch the pipeline run, so the scheduled DAGs are unpaused once
# the DAG processor has registered them (traffic_replay too: it is manual, unpausing it only lets
# a triggered run start). A helper in the background does it and then prints the banner again;
# it stops on its own when Airflow does (background jobs of a script ignore Ctrl-C).
main_pid=$$
unpause=${TRAFFIC_AIRFLOW_UNPAUSE-traffic_ingest traffic_hourly traffic_replay}
(
  for _ in $(seq 120); do
    sleep 5
    kill -0 "$main_pid" 2>/dev/null || exit 0
    left=""
    for dag_id in $unpause; do
      airflow dags unpause "$dag_id" >/dev/null 2>&1 || left="$left $dag_id"
    done
    unpause=$left
    if [ -z "$unpause" ] && "$root/.venv/bin/python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$url/api/v2/monitor/health" 2>/dev/null; then
      echo "[airflow.sh] DAGs unpaused: ${TRAFFIC_AIRFLOW_UNPAUSE-traffic_ingest traffic_hourly traffic_replay}"
      banner
      exit 0
    fi
  done
) &

# exec: airflow standalone replaces this shell in the foreground, so Ctrl-C (SIGINT) reaches it
# directly and it stops its components cleanly (a backgrounded one would ignore SIGINT).
exec airflow standalone
