#!/usr/bin/env bash
# Quick start: install, then run the whole pipeline (dvc repro) and print the comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
dvc repro "$@"
cat artifacts/report/compare.md
