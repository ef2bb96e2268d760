"""The whole pipeline side by side with datatrove's (issue 43 item 4), for benchmarks/bench_data_peer.py.

Both sides do the same work on the same corpus (`pipeline.jsonl`, {"id", "text"}): read JSONL; quality and
repetition filters; PII formatting of emails and IP addresses; MinHash dedup; tokenization, written to disk.

Corpus: the peer corpus's texts (mlops.data.labelled_dedup, seed 7, ~10% planted near duplicates) with, in one group
of ten, a contact line in the customer's turn (an email address and a public IPv4 address, the same for every
member of the group, so duplicates stay duplicates), and one record in 33 of junk that both filter sets should
reject (a spam line repeated, a base64 blob, "ha ha ha ..."), each its own group.

  datatrove pipeline   datatrove 0.10.1 on its LocalPipelineExecutor, one worker, as FineWeb chains it:
                       1. JsonlReader -> GopherQualityFilter -> GopherRepetitionFilter -> PIIFormatter (emails and
                          IPs) -> JsonlWriter (the filtered corpus) -> MinhashDedupSignature
                       2. MinhashDedupBuckets (one task per band)   3. MinhashDedupCluster
                       4. JsonlReader (the filtered corpus) -> MinhashDedupFilter -> DocumentTokenizer (the tiny
                          model's tokenizer.json, EOS <|im_end|> after each document, unshuffled)
                       Rejected documents go to exclusion writers (filters and dedup), as ours go to its quarantine.
                       All filter thresholds at datatrove's defaults. Its English word tokenizer is spaCy, which the
                       `bench` extra does not install: a regex split stands in (a token runs from a word character
                       to a word character, so emails and IPs stay whole; other marks are tokens of their own), which
                       is cheaper than spaCy, so this side is if anything flattered. MinHash parameters as the
                       dedup-only contender (14 bands x 9 rows, 3-word shingles, 64-bit xxhash).
  ours pipeline        `build_snapshot` itself on the same file (plain-text records: every token trained on, EOS
                       appended, as datatrove's tokenizer does), 2 workers, with what has a switch switched off:
                       decontamination (data.decontam.eval_sets=[]), semantic dedup and the perplexity filter (off
                       by default). `data.pii.types: [email, ip_address]` (our detectors validate what they find:
                       a public/private check on IPs is datatrove's, ours refuses versions and labelled
                       references). Filters, by what they measure (`data.filters.steps`):
                         GopherQualityFilter     words per doc -> `length` (characters); mean word length, share
                                                 of non-alphabetic words, '#' and '...' per word, bullet and
                                                 ellipsis lines -> `symbol_ratio` (odd symbols and punctuation
                                                 runs), `encoded_blob` (base64/hex runs, binary text), `markup`;
                                                 the stop-word check has no cheap equivalent (our `language`
                                                 filter, fastText, is left out, as datatrove's LanguageFilter is)
                         GopherRepetitionFilter  duplicate lines/paragraphs, top 2-4-gram and duplicate 5-10-gram
                                                 character shares -> `repeated_ngrams` (share of repeated word
                                                 3-grams) and `char_repetition` ('aaaa', 'hahaha')
                       The GE batch gate and the acceptance report have no switch: the build runs them, and the
                       child times them where they run (wrappers around mlops.data.checks.validate_batch and
                       batch_frame in the workers, the acceptance length counts mlops.data.clean.measure in the
                       workers, mlops.data.acceptance.build_report in the driver, the Great Expectations import),
                       so "same steps" is the build's CPU minus those, and they are reported as our extra steps.
                       Ours also drops exact duplicates before MinHash (a hash per record) and splits off a
                       validation set: part of the same steps.
  ours extras          our steps with no datatrove counterpart, each timed alone with the build's own functions in
                       one fresh process: decontamination (mlops.data.decontam.EvalIndex over the eval suites,
                       evaluation/suites/**/*.jsonl, `find` per record, as the workers call it), semantic dedup
                       (mlops.data.semdedup.semantic_dedup_texts, all-MiniLM-L6-v2) and the perplexity filter
                       (mlops.data.perplexity.Scorer with the tiny model, the config's batch and token limits), the
                       two model steps on the first --extras-sample records (~20 ms a record each on one thread)
                       with their model load given apart.

CPU is the child's process time plus its reaped children's, per record read. Dedup precision and recall against
the planted truth as in bench_data_peer (records a side's filters rejected leave its truth).
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / ".mlops" / "test-cache" / "models" / "tiny"
OUR_STEPS = ["length", "symbol_ratio", "encoded_blob", "markup", "char_repetition", "repeated_ngrams"]
JUNK_EVERY, PII_EVERY = 33, 10
WORDS = ("account router invoice refund modem signal plan bill charge cable screen update battery delivery parcel "
         "voucher upgrade contract payment password outage engineer install setting network speed").split()


# ------------------------------------------------------------------ corpus


def _junk(k: int, rng: random.Random) -> str:
    prose = " ".join(rng.choice(WORDS) for _ in range(40))
    kind = k % 3
    if kind == 0:  # a spam line, repeated
        line = f"Best offer {rng.choice(WORDS)} {rng.randrange(10**6)} click the link now and win"
        return "\n".join([line] * 8)
    if kind == 1:  # an attachment pasted as base64
        return f"Attachment {k}: {prose}\n" + base64.b64encode(rng.randbytes(300)).decode()
    return f"Ticket {k} {prose}\n" + " ".join(["ha"] * 120)  # laughter spam


def _contact(group: int) -> str:
    return (f" You can reach me at customer.{group}@mailbox-{group % 97}.com, my IP address is "
            f"81.{group % 200 + 1}.{(group // 200) % 250}.{group % 7 + 10} if it helps.")


def generate(folder: Path, n: int) -> tuple[list[int], set[int]]:
    """pipeline.jsonl and (the planted group of every line, the junk lines)."""
    from mlops.data.labelled_dedup import dedup_cases

    rng = random.Random(43)
    groups, junk = [], set()
    with (folder / "pipeline" / "pipeline.jsonl").open("w", encoding="utf-8") as out:
        for case in dedup_cases(n, seed=7):
            if len(groups) % JUNK_EVERY == JUNK_EVERY - 1:
                junk.add(len(groups))
                text, group = _junk(len(junk), rng), -len(junk)
                out.write(json.dumps({"id": f"p-{len(groups)}", "text": text}, ensure_ascii=False) + "\n")
                groups.append(group)
            text = case.text
            if case.group % PII_EVERY == 3:
                first, sep, rest = text.partition("\n")
                text = first + _contact(case.group) + sep + rest
            out.write(json.dumps({"id": f"p-{len(groups)}", "text": text}, ensure_ascii=False) + "\n")
            groups.append(case.group)
    return groups, junk


def _line(doc_id: str) -> int:
    return int(doc_id.removeprefix("p-"))


def _ids(folder: Path) -> list[int]:
    return [_line(json.loads(line)["id"]) for f in sorted(folder.glob("*.jsonl")) for line in f.open()]


# ------------------------------------------------------------------ datatrove


def datatrove_parts():
    """(Signature, Split): MinhashDedupSignature hashing UTF-8 bytes (xxhash 4 refuses the str datatrove 0.10.1
    passes; xxhash 3 encoded it the same way itself), and a whitespace WordTokenizer for simplified text."""
    from datatrove.pipeline.dedup.minhash import MinhashDedupSignature
    from datatrove.utils.word_tokenizers import WordTokenizer

    class Signature(MinhashDedupSignature):
        def __init__(self, *args, **kwargs) -> None:
            import xxhash

            super().__init__(*args, **kwargs)
            self._hash_func = lambda gram: xxhash.xxh64_intdigest(gram.encode())

    class Split(WordTokenizer):
        pattern = None

        def word_tokenize(self, text: str) -> list[str]:
            return self.pattern.findall(text) if self.pattern else text.split()

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [(0, len(text))]

    return Signature, Split


def run_datatrove_pipeline(folder: Path, work: Path, b: int, r: int, shingle: int) -> dict:
    import numpy as np
    from datatrove.executor.local import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
    )
    from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter
    from datatrove.pipeline.formatters import PIIFormatter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig

    Signature, Split = datatrove_parts()
    # spaCy's role, cheaper: a token runs from a word character to a word character (emails, IPs, "Wi-Fi" whole),
    # any other mark is a token of its own (punctuation split off as spaCy's prefix and suffix rules do)
    words = type("Words", (Split,), {"pattern": re.compile(r"\w(?:\S*\w)?|[^\w\s]")})("en")
    cfg = MinhashConfig(n_grams=shingle, num_buckets=b, hashes_per_bucket=r, seed=1,
                        hash_config=HashConfig(precision=64, hash_fc="xxhash"))

    def out(name: str) -> JsonlWriter:
        return JsonlWriter(str(work / name), compression=None)

    def stage(name: str, pipeline: list, tasks: int = 1, depends=None):
        return LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=1,
                                     logging_dir=str(work / "logs" / name), depends=depends)

    first = stage("1", [
        JsonlReader(str(folder / "pipeline")),
        GopherQualityFilter(language=words, exclusion_writer=out("rejected-quality")),
        GopherRepetitionFilter(language=words, exclusion_writer=out("rejected-repetition")),
        PIIFormatter(remove_emails=True, remove_ips=True),
        out("filtered"),
        Signature(str(work / "sigs"), cfg, language=Split("en")),
    ])
    buckets = stage("2", [MinhashDedupBuckets(str(work / "sigs"), str(work / "buckets"), config=cfg)], b, first)
    clusters = stage("3", [MinhashDedupCluster(str(work / "buckets"), str(work / "remove"), config=cfg)], 1, buckets)
    stage("4", [
        JsonlReader(str(work / "filtered")),
        MinhashDedupFilter(str(work / "remove"), exclusion_writer=out("duplicates")),
        DocumentTokenizer(str(work / "tokens"), tokenizer_name_or_path=str(TINY / "tokenizer.json"),
                          eos_token="<|im_end|>", shuffle_documents=False),
    ], 1, clusters).run()
    t0 = time.process_time()  # reading the outcome back is the benchmark's work, not the pipeline's
    tokens = sum(np.fromfile(f, dtype="<u2").size for f in (work / "tokens").glob("*.ds"))
    kept_text = "".join(f.read_text() for f in (work / "filtered").glob("*.jsonl"))
    return {"dropped": _ids(work / "duplicates"), "left_out": _ids(work / "rejected-quality") +
            _ids(work / "rejected-repetition"), "tokens": int(tokens),
            "pii_left": len(re.findall(r"customer\.\d+@mailbox-|\b81\.\d+\.\d+\.1[0-6]\b", kept_text)),
            "bookkeeping_s": time.process_time() - t0}


# ------------------------------------------------------------------ ours


class Timed:
    """Wraps module functions so every process (the forked workers too) appends the CPU seconds of each call to
    one file: `name seconds` lines, summed by `totals`."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def wrap(self, module, name: str, label: str) -> None:
        fn, path = getattr(module, name), self.path

        def timed(*args, **kwargs):
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                os.write(fd, f"{label} {time.process_time() - t0:.6f}\n".encode())
                os.close(fd)

        setattr(module, name, timed)

    def add(self, label: str, seconds: float) -> None:
        with open(self.path, "a") as fh:
            fh.write(f"{label} {seconds:.6f}\n")

    def totals(self) -> dict[str, float]:
        sums: dict[str, float] = {}
        for line in Path(self.path).read_text().splitlines():
            label, seconds = line.split()
            sums[label] = sums.get(label, 0.0) + float(seconds)
        return sums


def _config(folder: Path, work: Path, workers: int, threshold: float, num_perm: int, shingle: int) -> Path:
    config = work / "data.yaml"
    config.write_text(json.dumps({
        "base_model": str(TINY) if TINY.exists() else "tiny", "run": {"experiment": "bench", "seed": 1},
        "data": {"sources": [{"path": str(folder / "pipeline" / "pipeline.jsonl")}], "workers": workers,
                 "output_dir": str(work / "snap"), "pii": {"types": ["email", "ip_address"]},
                 "filters": {"steps": OUR_STEPS}, "decontam": {"eval_sets": []},
                 "dedup": {"threshold": threshold, "num_perm": num_perm, "shingle": shingle},
                 "accept": {"on_fail": "flag"}}}))
    return config


def run_ours_pipeline(folder: Path, work: Path, workers: int, threshold: float, num_perm: int, shingle: int) -> dict:
    from mlops.config import load_config
    from mlops.data import acceptance, checks, clean
    from mlops.data.build import build_snapshot
    from mlops.tracking import MemoryTracker

    timed = Timed(work / "timings.txt")
    t0 = time.process_time()
    import great_expectations  # noqa: F401 - the build imports it before forking; it is the gate's cost

    timed.add("gate", time.process_time() - t0)
    timed.wrap(checks, "validate_batch", "gate")
    timed.wrap(checks, "batch_frame", "gate")
    timed.wrap(clean, "measure", "acceptance")
    timed.wrap(acceptance, "build_report", "acceptance")
    os.environ["MLOPS_HOME"] = str(work)
    cfg = load_config(str(_config(folder, work, workers, threshold, num_perm, shingle)), [])
    result = build_snapshot(cfg, MemoryTracker(), force=True)
    t0 = time.process_time()  # reading the outcome back is the benchmark's work, not the pipeline's
    dropped, left_out = [], []
    for line in (result.path / "quarantine" / "records.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["stage"] == "dedup":
            dropped.append(row["line"] - 1)
        elif row["stage"] in ("filter", "decontam", "error"):
            left_out.append(row["line"] - 1)
    m = result.manifest
    counts = m.get("counts", {})
    return {"dropped": dropped, "left_out": left_out, "extras_cpu": timed.totals(), "snapshot_id": result.snapshot_id,
            "samples": sum(counts.get("samples", {}).values()),
            "pii": {k: v for k, v in m.get("counters", {}).items() if k.startswith("pii.")},
            "acceptance_status": (m.get("acceptance") or {}).get("verdict", {}).get("status"),
            "bookkeeping_s": time.process_time() - t0}


def run_ours_extras(folder: Path, work: Path, sample: int) -> dict:
    """Each extra step alone, with the build's functions: (load CPU s, per-record CPU s, records)."""
    import glob

    from mlops.data.config import DecontamConfig
    from mlops.data.decontam import EvalIndex

    with (folder / "pipeline" / "pipeline.jsonl").open(encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for line in fh]
    rows = {}

    def clock() -> float:
        return time.process_time()

    t0 = clock()
    index = EvalIndex(DecontamConfig())
    files = sorted(glob.glob(str(REPO / "evaluation" / "suites" / "**" / "*.jsonl"), recursive=True))
    items = sum(index.add_file(Path(f), Path(f).name) for f in files)
    t1 = clock()
    hits = sum(index.find(text.split("\n")) is not None for text in texts)
    rows["decontam"] = {"load_s": t1 - t0, "per_record_s": (clock() - t1) / len(texts), "records": len(texts),
                        "note": f"{items} eval items from {len(files)} files; {hits} hits"}

    subset = texts[:sample]
    t0 = clock()
    import torch

    torch.set_num_threads(1)  # as in a build's worker
    from mlops.data import semdedup
    from mlops.data.config import PerplexityConfig, SemanticDedupConfig
    from mlops.data.embed import embedder

    sem = SemanticDedupConfig(enabled=True)
    embedder(sem.model, sem.max_tokens)
    t1 = clock()
    decisions = semdedup.semantic_dedup_texts(subset, threshold=sem.threshold, batch_size=sem.batch_size,
                                              max_tokens=sem.max_tokens, iterations=sem.iterations)
    rows["semantic"] = {"load_s": t1 - t0, "per_record_s": (clock() - t1) / len(subset), "records": len(subset),
                        "note": f"{sum(not d.kept for d in decisions)} dropped; load includes torch's import"}

    from mlops.data.perplexity import scorer

    ppl = PerplexityConfig(enabled=True)
    t0 = clock()
    model = scorer(str(TINY), "cpu")
    t1 = clock()
    model.score(subset, ppl.batch_size, ppl.max_tokens)
    rows["perplexity"] = {"load_s": t1 - t0, "per_record_s": (clock() - t1) / len(subset), "records": len(subset),
                          "note": "tiny model (2 layers, 64 wide, smollm2 vocabulary)"}
    return {"extras": rows}


# ------------------------------------------------------------------ report


def filtered(r: dict, junk: set[int]) -> str:
    out = set(r.get("left_out", []))
    return f"{len(out & junk)}/{len(junk)} junk, {len(out - junk)} clean"


def report(runs: dict[str, dict], junk: set[int]) -> None:
    peer, ours, extras = runs.get("datatrove-pipeline"), runs.get("ours-pipeline"), runs.get("ours-extras")
    if not (peer and ours):
        return
    n = peer["records"]
    cpu = ours["extras_cpu"]
    gate, accept = cpu.get("gate", 0.0), cpu.get("acceptance", 0.0)
    same = ours["cpu_s"] - gate - accept
    print(f"\nthe whole pipeline, the same steps on {n} records (read JSONL; quality and repetition filters; PII "
          "emails and IPs; MinHash dedup; tokenize and write):")
    print(f"  {'contender':>40} {'CPU s':>7} {'CPU ms/rec':>10} {'wall s':>7} {'filtered':>22} {'drops':>6} "
          f"{'wrong':>5} {'precision':>9} {'recall':>7}")
    rows = [("datatrove pipeline (1 worker)", peer, peer["cpu_s"]),
            ("ours, same steps (build - gate - accept)", ours, same),
            ("ours, build as run (2 workers)", ours, ours["cpu_s"])]
    for label, r, seconds in rows:
        print(f"  {label:>40} {seconds:>7.1f} {1000 * seconds / n:>10.3f} {r['wall_s']:>7.1f} "
              f"{filtered(r, junk):>22} {r['drops']:>6} {r['wrong']:>5} {r['precision']:>9.4f} {r['recall']:>7.4f}")
    ratio = same / peer["cpu_s"]
    as_good = ours["precision"] >= peer["precision"] and ours["recall"] >= peer["recall"]
    print(f"CPU per record, ours (same steps) / datatrove: {ratio:.2f}x (goal <= 1.0x at the same or better dedup "
          f"precision and recall: {'met' if ratio <= 1.0 and as_good else 'MISSED'}); the build as run: "
          f"{ours['cpu_s'] / peer['cpu_s']:.2f}x")
    print(f"  tokens written: datatrove {peer.get('tokens')}; ours {ours['samples']} samples, snapshot "
          f"{ours['snapshot_id']}, acceptance {ours['acceptance_status']}; planted PII left in datatrove's output "
          f"{peer.get('pii_left')}; ours PII counts {ours.get('pii')}")
    print("our extra steps (no datatrove counterpart):")
    print(f"  {'step':>40} {'load s':>7} {'CPU ms/rec':>10} {'records':>8}  note")
    total = same
    for label, seconds, note in (("GE batch gate (in the build above)", gate, "with the Great Expectations import"),
                                 ("acceptance report (in the build)", accept, "length counts (workers) + report")):
        print(f"  {label:>40} {'':>7} {1000 * seconds / n:>10.3f} {n:>8}  {note}")
        total += seconds
    for name, label in (("decontam", "decontamination"), ("semantic", "semantic dedup (MiniLM)"),
                        ("perplexity", "perplexity filter (tiny)")):
        e = (extras or {}).get("extras", {}).get(name)
        if e is None:
            print(f"  {label:>40}  not measured")
            continue
        print(f"  {label:>40} {e['load_s']:>7.1f} {1000 * e['per_record_s']:>10.3f} {e['records']:>8}  {e['note']}")
        total += e["load_s"] + e["per_record_s"] * n
    print(f"ours with every extra step, extrapolated to {n} records: {total:.1f} CPU s, "
          f"{1000 * total / n:.3f} ms a record ({total / peer['cpu_s']:.2f}x datatrove's same-steps pipeline)")
