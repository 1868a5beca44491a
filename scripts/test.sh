#!/usr/bin/env bash
# Runs the whole test suite (slow tests included). Installs the system tools the tests use
# (tshark; nfdump, nfdump-sflow, softflowd, pmacct for the flow-tool checks; chromium for the
# Airflow UI test; a Docker engine, docker-compose and debootstrap for the compose stack's test)
# with apt-get when missing and this user may;
# pytest's own arguments pass through.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
need=()
command -v tshark >/dev/null 2>&1 || need+=(tshark)
# the flow tools of tests/support/flow_tools.py (softflowd and pmacctd live in /usr/sbin)
command -v nfcapd >/dev/null 2>&1 || need+=(nfdump)
command -v sfcapd >/dev/null 2>&1 || need+=(nfdump-sflow)
command -v softflowd >/dev/null 2>&1 || [ -x /usr/sbin/softflowd ] || need+=(softflowd)
command -v pmacctd >/dev/null 2>&1 || [ -x /usr/sbin/pmacctd ] || need+=(pmacct)
[ -x /usr/bin/chromium ] || need+=(chromium chromium-driver)
# tests/compose: an engine (dockerd) unless one already answers, compose v2 or Debian's v1, debootstrap
{ command -v dockerd >/dev/null 2>&1 || docker info >/dev/null 2>&1; } || need+=(docker.io)
{ docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1; } || need+=(docker-compose)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${need[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "warning: ${need[*]} missing and cannot be installed here (need root and apt-get); tests that use it will fail" >&2
  fi
fi
export GX_ANALYTICS_ENABLED=false
export TZ=UTC
# TRAFFIC_TEST_WORKERS workers (one Spark session each; default 2: on 2 cores a third did not help, the
# cores being busy all along). A file's tests stay on one worker so its fixtures are built once; files go out
# heaviest first, in the order tests/conftest.py sorts them.
exec .venv/bin/python -m pytest -n "${TRAFFIC_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder --durations=40 "$@"
