#!/usr/bin/env bash
# Demo step "evaluate the model it trained": register the newest finished training run that logged a model as a
# version of $MODEL_NAME (alias `candidate`), evaluate it in deployment form through `mlflow run -e eval`, and
# gate it against `@production` (the first release has no champion, so the configured floors apply).
# Stages hand off through MLflow tags and registry aliases: the run is found by its tags, not by printed output.
set -euo pipefail
cd "$(dirname "$0")/.."
export MLFLOW_TRACKING_URI="${MLFLOW_TRACKING_URI:-sqlite:///$PWD/.mlops/mlflow.db}"
MODEL_NAME="${MODEL_NAME:-support-bot}"
EVAL_LIMIT="${EVAL_LIMIT:-20}"   # items per task; empty for every item
PY="${PYTHON:-.venv/bin/python}"

"$PY" - "$MODEL_NAME" <<'PY'
import sys

from mlops.lineage import Tag
from mlops.run_store import latest_run
from registry.versions import register_model_version

run = latest_run({Tag.STAGE: "train"}, having=(Tag.PROFILE_HASH,))
if run is None:
    sys.exit("no finished training run with a final model; run the training step first")
version = register_model_version(run, sys.argv[1], alias="candidate")
print(f"registered run {run} as models:/{sys.argv[1]}/{version} (@candidate)")
PY

overrides="eval.limit=${EVAL_LIMIT:-null}"
mlflow run mlproject -e eval --env-manager local --experiment-name demo \
  -P model="models:/${MODEL_NAME}@candidate" -P suites=general,business -P overrides="$overrides" \
  -P config=configs/eval/default.yaml
# The gate counts only evals of the same suites and limit as its own config declares: pass the same overrides.
mlflow run mlproject -e gate --env-manager local --experiment-name demo \
  -P challenger="models:/${MODEL_NAME}@candidate" -P champion="models:/${MODEL_NAME}@production" \
  -P overrides="$overrides" -P config=configs/eval/default.yaml
