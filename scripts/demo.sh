#!/usr/bin/env bash
# `make demo`: the whole release loop on embedded defaults (SQLite tracking, local artifacts under .mlops/).
# scripts/demo.py holds the story; this sets the environment a newcomer's shell would not have.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
if [ "${1:-}" = "--quick" ]; then
  # The quick look keeps a project home of its own: its tiny-model versions never mix with the full demo's.
  home="$repo/.mlops/quick"
  mkdir -p "$home/configs/registry"
  for d in mlproject evaluation scripts; do ln -sfn "$repo/$d" "$home/$d"; done
  for c in "$repo"/configs/*; do [ "$(basename "$c")" = registry ] || ln -sfn "$c" "$home/configs/$(basename "$c")"; done
  cp "$repo/scripts/demo_tiny_release.yaml" "$home/configs/registry/release.yaml"
  export MLOPS_HOME="$home" MLFLOW_TRACKING_URI="sqlite:///$home/.mlops/mlflow.db"
  cd "$home"
fi
export MLFLOW_TRACKING_URI="${MLFLOW_TRACKING_URI:-sqlite:///$PWD/.mlops/mlflow.db}"
export PATH="$repo/.venv/bin:$PATH" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p .mlops
if [ "${1:-}" = "--dpo" ]; then shift; exec python scripts/demo_dpo.py "$@"; fi
exec python scripts/demo.py "$@"
