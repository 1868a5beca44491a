#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: checks Java, builds .venv from requirements.lock, installs this
# project into it, fetches Delta Lake's jars (scripts/delta-jars.lock) into jars/delta, and says in one line
# which Delta engine runs and why. Fast when nothing changed: a stamp records the venv's inputs, and jars
# already there are only checked against their pinned sums.
#
#   bash scripts/setup.sh         # all of it (make setup)
#   bash scripts/setup.sh jars    # Delta's jars and the engine line only
#
# Delta's jars come from Maven Central through mvn (its settings.xml decides the repositories). Where
# Maven is out of reach or mvn is missing, one line says so and set-up succeeds: the Delta layer then
# runs its rs engine (delta-rs), which needs no jar. TRAFFIC_DELTA_JARS=off fetches nothing (offline use).
# A jar whose SHA-256 is not the pinned one is deleted and fails set-up: that is never a network problem.
set -euo pipefail
cd "$(dirname "$0")/.."

venv() {
  local py=${PYTHON:-python3}
  if ! command -v "$py" >/dev/null 2>&1; then
    echo "error: python3 (3.11) is required: apt-get install -y python3.11 python3.11-venv" >&2; exit 2
  fi
  case "$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" in
    3.11) ;;
    *) echo "error: Python 3.11 is required (found $("$py" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2; exit 2 ;;
  esac
  if ! command -v java >/dev/null 2>&1; then
    echo "error: Java 17 is required by Spark: apt-get install -y openjdk-17-jre-headless" >&2; exit 2
  fi
  local stamp=.venv/.traffic-setup want
  want=$(cat requirements.lock pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x .venv/bin/traffic ]; then
    return 0
  fi
  echo "setting up .venv (first time takes about 2 minutes: pyspark is built once and cached)"
  [ -x .venv/bin/python ] || "$py" -m venv .venv
  # Build tools pinned like everything else (setuptools >= 77 reads the SPDX licence string).
  .venv/bin/python -m pip install --quiet --disable-pip-version-check pip==26.3 wheel==0.48.0 setuptools==84.2.1
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
  echo "setup done"
}

# Which engine the Delta layer runs, and why: the settings decide (TRAFFIC_ENGINE, TRAFFIC_SPARK_JARS_DIR,
# a config file), as in every job.
engine_line() {
  if [ ! -x .venv/bin/python ]; then
    echo "not known yet (no .venv: run bash scripts/setup.sh)"; return
  fi
  .venv/bin/python - <<'EOF'
from traffic.core.settings import SettingsError, load_settings
from traffic.storage.engine import engine_reason

try:
    print(engine_reason(load_settings()))
except SettingsError as error:
    print(f"not known: the settings do not load ({error})")
EOF
}

delta_jars() {
  local via=mvn status=0 failure
  case "${TRAFFIC_DELTA_JARS:-on}" in
    off) via=none ;;
    on) ;;
    *) echo "error: TRAFFIC_DELTA_JARS is '$TRAFFIC_DELTA_JARS': on (fetch Delta's jars, the default) or off" >&2; exit 2 ;;
  esac
  # Its stdout (a line when jars were fetched) passes through (fd 3); its one-line stderr is why it gave up.
  exec 3>&1
  failure=$(sh scripts/fetch-delta-jars.sh --via "$via" jars/delta 2>&1 1>&3) || status=$?
  exec 3>&-
  case "$status" in
    0) echo "Delta layer: $(engine_line)" ;;
    3) echo "$failure: the Delta layer runs $(engine_line)" ;;
    *) echo "$failure" >&2; exit "$status" ;;
  esac
}

case "${1:-all}" in
  all) venv; delta_jars ;;
  jars) delta_jars ;;
  *) echo "usage: bash scripts/setup.sh [jars]" >&2; exit 2 ;;
esac
