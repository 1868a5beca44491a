#!/usr/bin/env bash
# Create (if missing) the separate virtualenv .venv-bench/ for bench/peers.py and install the
# pinned peer engines into it. Safe to run again: an existing venv is reused, pip only tops up.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv-bench"

if [ ! -x "$venv/bin/python" ]; then
    python3.11 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$repo/bench/requirements-peers.txt"
"$venv/bin/python" -c "import duckdb, polars, pyarrow; print('duckdb', duckdb.__version__, '| polars', polars.__version__, '| pyarrow', pyarrow.__version__)"
