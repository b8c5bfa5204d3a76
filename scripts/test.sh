#!/usr/bin/env bash
# Install, then run the default test suite (slow tests excluded; `-m slow` runs them).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
python -m pytest "$@"
