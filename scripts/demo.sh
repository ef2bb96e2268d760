#!/usr/bin/env bash
# The main job end to end on embedded defaults (SQLite tracking, local artifacts under .mlops/).
# Every stage hands off through MLflow run ids, tags and registry aliases; nothing scrapes printed output.
set -euo pipefail
cd "$(dirname "$0")/.."
export MLFLOW_TRACKING_URI="${MLFLOW_TRACKING_URI:-sqlite:///$PWD/.mlops/mlflow.db}"
mkdir -p .mlops

step() { printf '\n=== %s\n' "$*"; }

mlops tracking init --experiment demo
# Stage runs record who ran them (`mlops.actor`): the demo's trainer identity (configs/registry/identities.yaml).
export MLOPS_USER=ada MLOPS_PASSWORD=ada-demo-pass

step "1. base models (converted once; later runs are no-ops)"
mlops base-model import smollm2
mlops base-model import tiny
mlops base-model list

step "2. smoke: greedy chat generation on SmolLM2 through mlflow run"
mlflow run mlproject -e smoke --env-manager local --experiment-name demo -P base_model=smollm2

step "3. data snapshot: sample data -> cleaned, deduplicated, gated, tokenized snapshot (rebuild = no-op)"
mlops data sample --out data/generated
mlflow run mlproject -e data --env-manager local --experiment-name demo -P config=configs/data/sample.yaml
mlops data build --config configs/data/sample.yaml
mlops data show latest
mlops data verify latest

step "4. training: smoke check, then LoRA on SmolLM2 over the newest snapshot (DeepSpeed on CPU, a few minutes)"
# The smoke run fails unless the loss falls at the configured speed. Rerunning the training is a no-op (it
# returns the finished run), and after a kill the same command resumes from the newest verified checkpoint.
mlflow run mlproject -e train --env-manager local --experiment-name demo \
  -P config=configs/train/sft-smollm2-lora.yaml -P smoke=true
mlflow run mlproject -e train --env-manager local --experiment-name demo \
  -P config=configs/train/sft-smollm2-lora.yaml -P overrides="train.snapshot=latest"

step "5. release: register the trained model (ada), eval through the served endpoint, gate, approve (grace), promote"
bash scripts/demo_eval.sh

step "6. sweep: an Optuna study on the tiny model, every trial a nested lineage-tagged training run (median pruning)"
# A rerun resumes the same study and adds trials; `mlops sweep best --study tiny` names the winner and its run.
mlflow run mlproject -e sweep --env-manager local --experiment-name demo \
  -P config=configs/sweep/tiny.yaml -P n_trials=4 -P overrides="train.snapshot=latest"
mlops sweep best --study tiny

step "done"
cat <<TXT
Everything is in the embedded store. Look at it with:
  .venv/bin/mlflow ui --backend-store-uri $MLFLOW_TRACKING_URI
TXT
