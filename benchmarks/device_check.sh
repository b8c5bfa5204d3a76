#!/usr/bin/env bash
# The prepared GPU check of issue 13 (at most ~8 minutes on one GPU; never part of the tests).
# Prints: per-sample LoRA gradient features batched vs the batch-size-1 loop on SmolLM2-135M
# (goal >= 10x), training tokens/s fp32 vs bf16, and, when the real profile's model and data
# are present (bash scripts/real-profile.sh builds them), full vs cluster time-to-accuracy for
# one epoch of the real-model profile. Without the pretrained weights the speed figures use
# SmolLM2-135M's architecture with random weights (speed does not depend on the weights).
#   bash benchmarks/device_check.sh     # env: PYTHON (python3), MODEL (artifacts-smollm2/model), CHECK_ARGS
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
MODEL=${MODEL:-artifacts-smollm2/model}
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"
timeout 180 "$PY" benchmarks/device_check.py features --model "$MODEL" ${CHECK_ARGS:-}
timeout 180 "$PY" benchmarks/device_check.py throughput --model "$MODEL" ${CHECK_ARGS:-}
if [[ -f "$MODEL/config.json" && -d artifacts-smollm2/data ]]; then
  timeout 300 "$PY" -m clusterft.cli experiment --params profiles/smollm2.yaml \
    --set "experiment.methods=[full, cluster]" --set "experiment.budgets=[0.3]" \
    --set "experiment.seeds=[0]" --set experiment.zero_shot=false --set train.epochs=1 \
    --set train.nproc=1 --set features.nproc=1 --set train.precision=bf16 --set paths.artifacts=/tmp/device-check
  cat /tmp/device-check/experiments/report.md
else
  echo "time-to-accuracy: skipped ($MODEL or artifacts-smollm2/data missing: run scripts/real-profile.sh first)"
fi
