#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: checks Java, builds .venv from requirements.lock,
# installs this project into it. Fast when nothing changed (a stamp records the inputs).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "error: python3 (3.11) is required: apt-get install -y python3.11 python3.11-venv" >&2; exit 2
fi
case "$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" in
  3.11) ;;
  *) echo "error: Python 3.11 is required (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2; exit 2 ;;
esac
if ! command -v java >/dev/null 2>&1; then
  echo "error: Java 17 is required by Spark: apt-get install -y openjdk-17-jre-headless" >&2; exit 2
fi

stamp=.venv/.traffic-setup
want=$(cat requirements.lock pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x .venv/bin/traffic ]; then
  exit 0
fi
echo "setting up .venv (first time takes about 2 minutes: pyspark is built once and cached)"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip wheel setuptools
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
echo "$want" > "$stamp"
echo "setup done"
