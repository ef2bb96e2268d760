"""The perplexity filter (`data.filters.perplexity`): a causal LM scores every record the dedup kept, and records
outside the configured percentiles of the snapshot's own score distribution, or outside absolute bounds, are
quarantined with their score (`filter.perplexity_low`, `filter.perplexity_high`).

It runs in three steps, like the MinHash dedup: the workers score ranges of SCORE_ROWS rows of each partition
(stage P, `mlops.data.partclean.score_rows`), write the scores beside the partition and return exact histograms;
the driver adds them and takes the bounds (`bounds`, the global step); stage C judges each row against them
(`judge`). The scoring model is the build's base model, or `model` (a catalog name, an HF folder, `models:/...`),
loaded once per worker process (Ray workers need it at the same path); torch and transformers are imported on
first use, never at import time. On a GPU (`device: auto` and torch sees one) the workers score there.

A score is the same on every executor and worker count: the ranges are fixed by row counts, a range's rows are
batched in an order that depends on their token ids alone (by length, then row), padding is on the right under
the attention mask (causal: a row's logits do not see its padding), CPU scoring runs on one thread (a BLAS splits
its sums differently across thread counts), and each score is rounded to 4 significant digits before anything
compares or counts it. Percentiles use the nearest-rank rule on the exact histogram of the rounded scores, so
every executor gets the same bounds.

Perplexity here is exp(mean negative log-likelihood) of a record's text (its messages' contents, as the other
filters read it) over its first `max_tokens` tokens; a record of one token has none and is kept unscored.
"""

from __future__ import annotations

import ctypes
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

SIGNIFICANT = 4
SCORE_ROWS = 512  # rows of a partition per scoring task
SUMMARY_PERCENTILES = (1, 5, 25, 50, 75, 95, 99)
MAX_NLL = 700.0  # exp() of more overflows a float


def rounded(value: float) -> float:
    """`value` to SIGNIFICANT significant digits: float noise below that never moves a decision."""
    return float(f"{value:.{SIGNIFICANT}g}")


def percentile(hist: Counter, p: float) -> float | None:
    """Nearest rank on the exact histogram: the smallest score at least p% of the records do not exceed."""
    total = sum(hist.values())
    if not total:
        return None
    rank = max(1, math.ceil(p / 100 * total))
    seen = 0
    for score in sorted(hist):
        seen += hist[score]
        if seen >= rank:
            return score
    return max(hist)


def bounds(hist: Counter, cfg: Any) -> dict:
    """The global step: {"low", "low_by", "high", "high_by"} from the whole snapshot's histogram and
    `cfg` (data.filters.perplexity); a bound is None where neither a percentile nor an absolute bound sets it.
    Where both do, the tighter one holds and `*_by` names it."""
    low: list[tuple[float, str]] = []
    high: list[tuple[float, str]] = []
    if cfg.min_percentile > 0 and hist:
        low.append((percentile(hist, cfg.min_percentile), f"p{cfg.min_percentile:g}"))
    if cfg.min_perplexity is not None:
        low.append((cfg.min_perplexity, "min_perplexity"))
    if cfg.max_percentile < 100 and hist:
        high.append((percentile(hist, cfg.max_percentile), f"p{cfg.max_percentile:g}"))
    if cfg.max_perplexity is not None:
        high.append((cfg.max_perplexity, "max_perplexity"))
    lo = max(low, default=(None, None))
    hi = min(high, default=(None, None))
    return {"low": lo[0], "low_by": lo[1], "high": hi[0], "high_by": hi[1]}


def judge(score: float, limits: dict) -> tuple[str, dict] | None:
    """(reason, quarantine detail) for a score outside `limits` (from `bounds`); None to keep it (NaN: unscored)."""
    if math.isnan(score):
        return None
    if limits["high"] is not None and score > limits["high"]:
        return "perplexity_high", {"perplexity": score, "limit": limits["high"], "limit_by": limits["high_by"]}
    if limits["low"] is not None and score < limits["low"]:
        return "perplexity_low", {"perplexity": score, "limit": limits["low"], "limit_by": limits["low_by"]}
    return None


def summary(hist: Counter) -> dict:
    n = sum(hist.values())
    if not n:
        return {"records": 0}
    out: dict[str, Any] = {"records": n, "min": min(hist)}
    out.update({f"p{p}": percentile(hist, p) for p in SUMMARY_PERCENTILES})
    out["max"] = max(hist)
    out["mean"] = rounded(sum(k * v for k, v in hist.items()) / n)
    return out


def report(hist: Counter, limits: dict, model: dict, cfg: Any) -> dict:
    """The acceptance report's section: the distribution before and after the filter, and what it set aside."""
    kept = Counter({s: n for s, n in hist.items() if judge(s, limits) is None})
    low = sum(n for s, n in hist.items() if limits["low"] is not None and s < limits["low"])
    return {"model": model["name"], "model_id": model["id"], "max_tokens": cfg.max_tokens, **limits,
            "rejected": {"perplexity_low": low, "perplexity_high": sum(hist.values()) - sum(kept.values()) - low},
            "before": summary(hist), "after": summary(kept)}


def describe(section: dict | None) -> list[str]:
    if not section:
        return []

    def fig(s: dict) -> str:
        if not s.get("records"):
            return "none"
        return f"n={s['records']} " + "/".join(str(s[k]) for k in ("min", "p5", "p50", "p95", "max"))

    rej = section["rejected"]
    return [f"  perplexity ({section['model']}, first {section['max_tokens']} tokens) min/p5/p50/p95/max: "
            f"{fig(section['before'])} -> {fig(section['after'])}; bounds {section['low']} ({section['low_by']}) "
            f"to {section['high']} ({section['high_by']}); set aside low {rej['perplexity_low']}, "
            f"high {rej['perplexity_high']}"]


# --------------------------------------------------------------------------- scoring (on the workers)


def scores_file(folder: Path, start: int) -> Path:
    """Scores of a partition's rows from `start` on: rounded perplexity, NaN when not scored (dropped, too short)."""
    return folder / f"ppl-{start:09d}.npy"


def read_scores(folder: Path) -> np.ndarray:
    """Every row's score of a partition, in row order."""
    parts = [np.load(path) for path in sorted(folder.glob("ppl-*.npy"))]
    return np.concatenate(parts) if parts else np.zeros(0)


@contextmanager
def one_thread(torch: Any) -> Iterator[None]:
    """torch on one CPU thread, then as it was. A BLAS splits its sums differently across thread counts, so
    scores need a fixed count; and a worker forked from a process whose OpenMP pool is up (the build's, when it
    ran torch itself) hangs in its first parallel region unless it stays on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# glibc's mallopt parameters and their defaults
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, GLIBC_DEFAULT = -1, -3, 128 * 1024


def _mallopt(value: int) -> None:
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_THRESHOLD, value)
        libc.mallopt(M_TRIM_THRESHOLD, value)
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


@contextmanager
def heap_kept() -> Iterator[None]:
    """Large blocks from the heap, kept between batches, then glibc's defaults again. Each batch's logits are
    tens of MB (tokens x vocabulary); glibc maps and unmaps a fresh block for each, and faulting its pages in
    cost ~40% of the scoring time (measured: tiny model, 1 thread, 300 records: 6.7 s -> 4.6 s, sys 2.9 -> 0.1 s)."""
    _mallopt(1 << 30)
    try:
        yield
    finally:
        _mallopt(GLIBC_DEFAULT)


class Scorer:
    """A causal LM and its tokenizer from a local folder, scoring texts in float32."""

    def __init__(self, path: str, device: str = "auto") -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from mlops.model_safety import require_no_code

        require_no_code(path)
        self.torch = torch
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
        with one_thread(torch):
            self.model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, trust_remote_code=False,
                                                              dtype=torch.float32).to(self.device).eval()
        pad = self.tokenizer.pad_token_id
        self.pad = pad if pad is not None else 0

    def score(self, texts: list[str], batch_size: int, max_tokens: int) -> list[float]:
        """Rounded perplexity per text (NaN for a text of fewer than two tokens)."""
        torch = self.torch
        ids = self.tokenizer(texts, truncation=True, max_length=max_tokens)["input_ids"] if texts else []
        out = [math.nan] * len(texts)
        order = sorted((i for i in range(len(ids)) if len(ids[i]) >= 2), key=lambda i: (len(ids[i]), i))
        with one_thread(torch), heap_kept(), torch.inference_mode():
            for start in range(0, len(order), batch_size):
                chosen = order[start : start + batch_size]
                for i, score in zip(chosen, self._batch([ids[i] for i in chosen]), strict=True):
                    out[i] = score
        return out

    def _batch(self, rows: list[list[int]]) -> Iterable[float]:
        torch = self.torch
        width = max(len(r) for r in rows)
        x = torch.full((len(rows), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):
            x[r, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[r, : len(row)] = 1
        x, mask = x.to(self.device), mask.to(self.device)
        logits = self.model(input_ids=x, attention_mask=mask).logits
        for r, row in enumerate(rows):  # one row's log-softmax at a time: the batch's logits are the big tensor
            n = len(row)
            nll = torch.nn.functional.cross_entropy(logits[r, : n - 1].float(), x[r, 1:n]).item()
            yield rounded(math.exp(min(nll, MAX_NLL)))


_SCORERS: dict[tuple[str, str], Scorer] = {}


def scorer(path: str, device: str) -> Scorer:
    """One loaded model per worker process (a worker scores many partitions)."""
    key = (path, device)
    if key not in _SCORERS:
        _SCORERS.clear()
        _SCORERS[key] = Scorer(path, device)
    return _SCORERS[key]


def release() -> None:
    """Drop the loaded model: the inline pool (data.workers=1) scores in the build's own process."""
    _SCORERS.clear()
