#!/usr/bin/env bash
# Demo step "release the model it trained": register the newest finished training run that logged a model as a
# version of $MODEL_NAME (as the trainer identity), evaluate it in deployment form through `mlflow run -e eval`,
# gate it against `@production` (the first release has no champion, so the configured floors apply), then request,
# approve as a second identity (four-eyes) and promote it. Stages hand off through MLflow tags and the registry:
# the run is found by its tags and the version read from `--json` output, never scraped from log text.
set -euo pipefail
cd "$(dirname "$0")/.."
export MLFLOW_TRACKING_URI="${MLFLOW_TRACKING_URI:-sqlite:///$PWD/.mlops/mlflow.db}"
MODEL_NAME="${MODEL_NAME:-support-bot}"
EVAL_LIMIT="${EVAL_LIMIT:-20}"   # items per task; empty for every item
PY="${PYTHON:-.venv/bin/python}"
json() { "$PY" -c "import json, sys; print(json.load(sys.stdin)['$1'])"; }
# Demo identities (configs/registry/identities.yaml): ada trains and registers, grace approves and promotes.
as_trainer() { MLOPS_USER=ada MLOPS_PASSWORD=ada-demo-pass "$@"; }
as_approver() { MLOPS_USER=grace MLOPS_PASSWORD=grace-demo-pass "$@"; }

run_id=$(mlops tracking latest-run --tag mlops.stage=train --having mlops.model_content_id --json | json run_id)
version=$(as_trainer mlops registry register --run "$run_id" --name "$MODEL_NAME" --json | json version)
echo "training run $run_id is models:/${MODEL_NAME}/${version}"

overrides="eval.limit=${EVAL_LIMIT:-null}"
as_trainer mlflow run mlproject -e eval --env-manager local --experiment-name demo \
  -P model="models:/${MODEL_NAME}/${version}" -P suites=general,business -P overrides="$overrides" \
  -P config=configs/eval/default.yaml
# The gate counts only evals of the same suites and limit as its own config declares: pass the same overrides.
# A failing gate exits 1; the demo goes on to show that the registry then refuses the release.
as_trainer mlflow run mlproject -e gate --env-manager local --experiment-name demo \
  -P challenger="models:/${MODEL_NAME}/${version}" -P champion="models:/${MODEL_NAME}@production" \
  -P overrides="$overrides" -P config=configs/eval/default.yaml || echo "gate: FAILED (see the report above)"

current=$(mlops registry status "$MODEL_NAME" --json | "$PY" -c "import json,sys; print(json.load(sys.stdin)['aliases'].get('production', ''))")
if [ "$current" = "$version" ]; then
  echo "models:/${MODEL_NAME}/${version} is already in production (a rerun changes nothing)"
else
  as_trainer mlops registry request "$MODEL_NAME" "$version" --to production \
    --comment "demo candidate from training run $run_id" || true
  if as_approver mlops registry approve "$MODEL_NAME" "$version" --comment "gates passed; reviewed in the demo"; then
    as_approver mlops registry promote "$MODEL_NAME" "$version" --to production
  else
    echo "the registry refused the approval: the message above names the failing gate and the fix"
  fi
fi
mlops registry status "$MODEL_NAME"
mlops registry verify "$MODEL_NAME"
