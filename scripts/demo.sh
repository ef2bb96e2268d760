#!/usr/bin/env bash
# `make demo`: the whole release loop on embedded defaults (SQLite tracking, local artifacts under .mlops/).
# scripts/demo.py holds the story; this sets the environment a newcomer's shell would not have.
set -euo pipefail
cd "$(dirname "$0")/.."
export MLFLOW_TRACKING_URI="${MLFLOW_TRACKING_URI:-sqlite:///$PWD/.mlops/mlflow.db}"
export PATH="$PWD/.venv/bin:$PATH" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p .mlops
exec python scripts/demo.py "$@"
