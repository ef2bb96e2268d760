"""Data snapshots: the only thing training reads.

Pipeline (`mlops data build --config <yaml>`, or `mlflow run mlproject -e data -P config=...`):

    records.py   JSONL / Parquet / CSV in chat, instruction or text shape -> Record (content id, source, line,
                 domain), or an Issue with a reason code (RecordError class) and a redacted excerpt
                 (policy data.on_bad_record: fail | skip)
    clean.py     per record in worker processes: pii.py scrub (pii_structured / pii_context detectors)
                 -> filters.py (registered quality filters, language id) -> decontam.py (eval items held per
                 message, the rule the eval report shares); then dedup.py exact and MinHash LSH near dedup,
                 confirmed by similarity, in record order, also against earlier snapshots; then, when on,
                 perplexity.py scores what dedup kept and sets aside the outliers (bounds from the whole snapshot)
    mixing.py    target shares per capability domain (+ history snapshot at a ratio, incremental mode)
    checks.py    per record after tokenize.py (chat template, assistant-only loss masks): template, token bounds
                 (drop or truncate), loss tokens; then gate.py validates the batch with a registered, versioned
                 Great Expectations suite of batch-level expectations
    quarantine.py  every rejected row or record with its reason and a redacted, bounded excerpt
    format.py    sharded memory-mapped arrays + index; manifest written last, folder published atomically
    manifest.py  counters, achieved mix, batch results, hashes; logged to MLflow (artifact + dataset input)
    build.py     orchestration (clean failure: SIGTERM, stale staging, min_records); parallel.py runs the
                 worker pool; inputs.py hashes the inputs so an identical rebuild does no work

Reading a snapshot: `mlops.data.snapshot.resolve_snapshot(id)` and `mlops.data.format.SnapshotReader`.
Writing one directly from token ids (tests, other stages): `mlops.data.format.write_snapshot`.
Running the real pipeline on a few records: `mlops.data.testing.quick_build`.
"""
