#!/usr/bin/env bash
# Create .venv with Python 3.11 and install clusterft (+ test extras) into it, once.
# Reinstalls only when pyproject.toml changes. Source it: `source scripts/bootstrap.sh`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.clusterft-installed
want=$(sha1sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "bootstrap: installing clusterft into .venv (first time: ~4 min)" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[test]'
  echo "$want" > "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"
export DVC_NO_ANALYTICS=1 PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_HOME="$PWD/.prefect" PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
