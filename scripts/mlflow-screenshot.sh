#!/usr/bin/env bash
# README's MLflow screenshot: serve the project's MLflow store on 127.0.0.1, open the
# weighted-loss curves of the last full-data and cluster training runs against time since
# each run started, in a headless Chromium (Debian package `chromium`); save
# docs/mlflow-compare.png.
#   bash scripts/mlflow-screenshot.sh [STORE_URI]      (after `bash scripts/pipeline.sh`)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
STORE="${1:-sqlite:///mlflow.db}"
PORT=5055
mlflow ui --backend-store-uri "$STORE" --host 127.0.0.1 --port "$PORT" --workers 1 > /tmp/mlflow-ui.log 2>&1 &
UI=$!
trap 'kill $UI 2>/dev/null || true' EXIT
for _ in $(seq 90); do curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break; sleep 1; done
URL=$(python - "$STORE" <<'PY'
import json, sys
from mlflow import MlflowClient
c = MlflowClient(tracking_uri=sys.argv[1])
exp = c.get_experiment_by_name("clusterft")
runs = c.search_runs([exp.experiment_id], "tags.`clusterft.stage` = 'train'", order_by=["start_time DESC"])
pick = {}
for r in runs:
    pick.setdefault(r.data.tags.get("clusterft.method"), r.info.run_id)
ids = [pick[m] for m in ("full", "cluster")]
q = lambda x: json.dumps(x, separators=(",", ":"))  # noqa: E731
print(f"#/metric?runs={q(ids)}&metric={q('weighted_loss')}&experiments={q([exp.experiment_id])}"
      f"&plot_metric_keys={q(['weighted_loss'])}&plot_layout={{}}&x_axis=relative&y_axis_scale=log"
      "&line_smoothness=1&show_point=false&deselected_curves=[]&last_linear_y_axis_range=[]&workflowType=machine_learning")
PY
)
chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=2000,1000 \
  --virtual-time-budget=25000 --screenshot=docs/mlflow-compare.png "http://127.0.0.1:$PORT/$URL"
echo "docs/mlflow-compare.png: http://127.0.0.1:$PORT/$URL"
