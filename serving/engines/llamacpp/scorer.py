"""Prompt-token logprobs from llama.cpp's own logits, through the bindings (llama-server returns none).

One `Llama` with `logits_all` keeps a row of logits per evaluated position. A prompt that shares a prefix
with the last one evaluates only its new suffix: the rows of the prefix are still there (row i is the
distribution of token i+1 given tokens 0..i, whatever follows), so a multiple-choice item scored choice by
choice re-reads its context once and every choice still gets every prompt logprob.

The per-token work is vectorised: one log-softmax over the prompt's rows (numpy), the picked tokens by
fancy indexing, top-k by argpartition.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from serving.engine_types import Scored


class PromptScorer:
    """Not thread-safe: one owner thread (the engine's scoring worker) calls `score`."""

    def __init__(self, gguf: Path, *, n_ctx: int, threads: int, n_batch: int = 512) -> None:
        from llama_cpp import Llama

        self.n_ctx = n_ctx
        self.llm = Llama(model_path=str(gguf), n_ctx=n_ctx, n_batch=min(n_batch, n_ctx), n_threads=threads,
                         n_threads_batch=threads, logits_all=True, verbose=bool(os.environ.get("MLOPS_LLAMA_VERBOSE")))
        self.vocab_size = self.llm.n_vocab()
        self.reused = 0  # prompt tokens not evaluated again thanks to a shared prefix (tests, metrics)

    def score(self, ids: list[int], top_k: int) -> Scored:
        """A logprob per prompt token (the first is None), then the greedy next token and its logprob."""
        n = len(ids)
        if not 0 < n <= self.n_ctx:
            raise ValueError(f"a prompt of {n} tokens does not fit the scoring context of {self.n_ctx} tokens")
        self._evaluate(ids)
        rows = self.llm.scores[:n]
        logz = _logsumexp(rows)
        picked = rows[np.arange(n - 1), ids[1:]] - logz[:-1]
        greedy = int(rows[-1].argmax())
        token_logprobs: list[float | None] = [None, *picked.tolist(), float(rows[-1, greedy] - logz[-1])]
        top = _top_k(rows, logz, top_k)
        return Scored([*ids, greedy], token_logprobs, [None, *top])

    def _evaluate(self, ids: list[int]) -> None:
        llm = self.llm
        have = llm.n_tokens
        common = 0
        if have:
            cached = llm.input_ids[: min(have, len(ids))]
            diff = np.flatnonzero(cached != np.asarray(ids[: len(cached)], dtype=cached.dtype))
            common = int(diff[0]) if diff.size else len(cached)
        self.reused += common
        llm.n_tokens = common  # eval() drops the KV cache from here on and refills rows common..n-1
        if common < len(ids):
            llm.eval(ids[common:])

    def close(self) -> None:
        self.llm.close()


def _logsumexp(rows: np.ndarray) -> np.ndarray:
    peak = rows.max(axis=1)
    return peak + np.log(np.exp(rows - peak[:, None]).sum(axis=1))


def _top_k(rows: np.ndarray, logz: np.ndarray, k: int) -> list[dict[int, float]]:
    """For each row, its k most likely tokens with their logprobs, most likely first."""
    k = max(1, min(k, rows.shape[1]))
    idx = np.argpartition(rows, -k, axis=1)[:, -k:]
    vals = np.take_along_axis(rows, idx, axis=1) - logz[:, None]
    order = np.argsort(-vals, axis=1)
    idx, vals = np.take_along_axis(idx, order, axis=1), np.take_along_axis(vals, order, axis=1)
    return [dict(zip(i.tolist(), v.tolist(), strict=True)) for i, v in zip(idx, vals, strict=True)]
