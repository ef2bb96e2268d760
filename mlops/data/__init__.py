"""Data snapshots: the only thing training reads.

Pipeline (`mlops data build --config <yaml>`, or `mlflow run mlproject -e data -P config=...`):

    records.py   JSONL / Parquet / CSV in chat, instruction or text shape -> Record (content id, source, line,
                 domain), or an Issue naming file, line and field (policy data.on_bad_record: fail | skip)
    clean.py     per record in worker processes: pii.py scrub -> filters.py (registered quality filters)
                 -> decontam.py (eval items held per message, the rule the eval report shares); then dedup.py exact and MinHash LSH near dedup
                 in record order, also against earlier snapshots
    mixing.py    target shares per capability domain (+ history snapshot at a ratio, incremental mode)
    tokenize.py  base model tokenizer and chat template, assistant-only loss masks (worker processes)
    gate.py      every batch validated with a registered, versioned Great Expectations suite;
                 a failing batch is quarantined whole with its GE report, or stops the build
    format.py    sharded memory-mapped arrays + index; manifest written last, folder published atomically
    manifest.py  counters, achieved mix, batch results, hashes; logged to MLflow (artifact + dataset input)
    build.py     orchestration; inputs.py hashes the inputs so an identical rebuild does no work

Reading a snapshot: `mlops.data.snapshot.resolve_snapshot(id)` and `mlops.data.format.SnapshotReader`.
Writing one directly from token ids (tests, other stages): `mlops.data.format.write_snapshot`.
Running the real pipeline on a few records: `mlops.data.testing.quick_build`.
"""
