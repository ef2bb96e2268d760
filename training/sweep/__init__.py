"""Optuna sweeps over the training stage: search spaces, pruners, shared storage, nested lineage-tagged runs.

Layout: `config` (the `sweep:` section), `spaces` and `pruners` (named parts), `storage` (Optuna storage URLs
and heartbeats), `plan` (everything validated before any trial), `trial` (one trial = one nested training
run), `runner` (the study loop shared by `sweep run` and `sweep worker`), `results` (best, table, plots).
Nothing heavy is imported here.
"""
