"""The scoring and generation core behind the server: one worker thread owns the model.

Requests from any thread are queued as jobs; the worker runs them in order, so the model is never touched
concurrently. Scoring jobs (echo + logprobs, what lm-eval's loglikelihood sends) that are waiting together
are run as one right-padded batch; generation jobs waiting together decode as one left-padded batch with a
KV cache (evaluation.decoding), streaming text through each job's callback.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("mlops.serve")


@dataclass
class Scored:
    """Echo result for one prompt: a logprob per prompt token (first is None) plus one greedy next token."""

    tokens: list[int]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[int, float] | None]


@dataclass
class GenParams:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = None


@dataclass
class Generated:
    text: str
    tokens: list[int]
    token_logprobs: list[float]
    top_logprobs: list[dict[int, float]]
    finish_reason: str  # "stop" or "length"


@dataclass
class _Job:
    kind: str  # "score" or "generate"
    future: Future
    prompts: list[list[int]] | None = None
    top_k: int = 1
    ids: list[int] | None = None
    params: GenParams | None = None
    on_text: Callable[[str], None] | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)


class Engine:
    """A causal LM loaded once, served by a single worker thread."""

    def __init__(self, model_dir: Path | str, *, max_batch_tokens: int = 4096, max_gen_batch: int = 8,
                 threads: int | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)

        self.model_dir = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self.model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32).eval()
        self.max_batch_tokens = max_batch_tokens
        self.max_gen_batch = max_gen_batch
        self.eos_ids = _eos_ids(self.tokenizer, self.model)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._texts: dict[int, str] = {}  # token id -> text, for logprobs blocks
        self.batches: list[int] = []  # sizes of scoring batches run (for tests and metrics)
        self.gen_batches: list[int] = []  # sizes of generation batches run
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._worker = threading.Thread(target=self._run, name="engine-worker", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------------ public API (any thread)

    def score(self, prompts: list[list[int]], top_k: int = 1) -> Future:
        """Future of list[Scored], one per prompt, in order."""
        job = _Job("score", Future(), prompts=prompts, top_k=max(1, top_k))
        self._jobs.put(job)
        return job.future

    def generate(self, ids: list[int], params: GenParams, on_text: Callable[[str], None] | None = None) -> _Job:
        """Queue a generation; the returned job's future yields `Generated`, `on_text` gets text deltas."""
        job = _Job("generate", Future(), ids=ids, params=params, on_text=on_text)
        self._jobs.put(job)
        return job

    def close(self) -> None:
        self._jobs.put(None)
        self._worker.join(timeout=10)

    def token_text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.tokenizer.decode([token_id])
        return text

    # ------------------------------------------------------------------ worker

    def _run(self) -> None:
        import torch

        torch.set_grad_enabled(False)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            batch = [job]
            if job.kind == "score":
                batch += self._drain_scores(sum(len(p) for p in job.prompts))
            else:
                batch += self._drain_generations()
            try:
                if job.kind == "score":
                    self._score_batch(batch)
                else:
                    self._generate_batch(batch)
            except Exception as err:  # noqa: BLE001 - the error belongs to the request, not the worker
                log.exception("engine job failed")
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(err)

    def _drain_generations(self) -> list[_Job]:
        """Other generation jobs already waiting, up to `max_gen_batch` in all."""
        taken: list[_Job] = []
        while len(taken) + 1 < self.max_gen_batch:
            try:
                nxt = self._jobs.queue[0]
            except IndexError:
                break
            if nxt is None or nxt.kind != "generate":
                break
            taken.append(self._jobs.get())
        return taken

    def _drain_scores(self, tokens: int) -> list[_Job]:
        """Other scoring jobs already waiting, up to the token budget; a generation job stops the drain."""
        taken: list[_Job] = []
        while True:
            try:
                nxt = self._jobs.queue[0]
            except IndexError:
                return taken
            if nxt is None or nxt.kind != "score":
                return taken
            size = sum(len(p) for p in nxt.prompts)
            if tokens + size > self.max_batch_tokens:
                return taken
            taken.append(self._jobs.get())
            tokens += size

    def _score_batch(self, jobs: list[_Job]) -> None:
        prompts = [p for job in jobs for p in job.prompts]
        top_k = max(job.top_k for job in jobs)
        # Sort by length so padding stays small; chunk by the token budget (logits are [batch, len, vocab]).
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        scored: dict[int, Scored] = {}
        chunk: list[int] = []
        for i in order:
            longest = len(prompts[chunk[0]]) if chunk else len(prompts[i])
            if chunk and longest * (len(chunk) + 1) > self.max_batch_tokens:
                scored.update(zip(chunk, self._forward_score([prompts[j] for j in chunk], top_k), strict=True))
                chunk = []
            chunk.append(i)
        if chunk:
            scored.update(zip(chunk, self._forward_score([prompts[j] for j in chunk], top_k), strict=True))
        self.batches.append(len(prompts))
        results = [scored[i] for i in range(len(prompts))]
        start = 0
        for job in jobs:
            n = len(job.prompts)
            job.future.set_result(results[start : start + n])
            start += n

    def _forward_score(self, prompts: list[list[int]], top_k: int) -> list[Scored]:
        import torch

        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
            mask[row, : len(prompt)] = 1
        logits = self.model(input_ids=ids, attention_mask=mask).logits
        out: list[Scored] = []
        lses: list[list[float]] = []
        for row, prompt in enumerate(prompts):
            n = len(prompt)
            # Logits at position t depend only on tokens[:t+1]: where this prompt shares a prefix with an
            # earlier one (the choices of one multiple-choice question do), reuse that row's normaliser and top
            # tokens instead of another pass over the vocabulary.
            src, shared = _longest_shared_prefix(prompts[:row], prompt)
            rows = logits[row, shared:n].float()  # position t predicts token t+1
            lse_new = rows.logsumexp(dim=-1)
            if top_k > 1:
                top_vals, top_ids = rows.topk(top_k, dim=-1)
            else:
                top_vals, top_ids = rows.max(dim=-1, keepdim=True)
            top_vals = top_vals - lse_new.unsqueeze(1)
            tops = [dict(zip(i, v, strict=True)) for i, v in zip(top_ids.tolist(), top_vals.tolist(), strict=True)]
            lse = lses[src][:shared] + lse_new.tolist() if shared else lse_new.tolist()
            tops = out[src].top_logprobs[1 : shared + 1] + tops if shared else tops
            # token t+1's logprob: reused below the shared prefix, gathered from this row's logits from there on
            first = max(shared - 1, 0)
            target = torch.tensor(prompt[first + 1 :], dtype=torch.long)
            gathered = logits[row, first : n - 1].float().gather(1, target.unsqueeze(1)).squeeze(1)
            fresh = (gathered - torch.tensor(lse[first : n - 1])).tolist()
            token_lps = (out[src].token_logprobs[1 : first + 1] if first else []) + fresh
            next_id = next(iter(tops[-1]))
            lses.append(lse)
            out.append(Scored(tokens=[*prompt, next_id], token_logprobs=[None, *token_lps, tops[-1][next_id]],
                              top_logprobs=[None, *tops]))
        return out

    def _generate_batch(self, jobs: list[_Job]) -> None:
        from evaluation.decoding import generate_batch

        self.gen_batches.append(len(jobs))
        for job, result in zip(jobs, generate_batch(self.model, self.tokenizer, self.eos_ids, self.pad_id, jobs),
                               strict=True):
            job.future.set_result(result)


def default_threads() -> int:
    """Compute threads for a server: every core but one, left to its clients (lm-eval, load generators).

    On a busy machine, an OpenMP team wider than the cores it actually gets stalls at every barrier, which
    costs far more than the parallelism gains (measured: 2 threads 5-15x slower than 1 on a loaded 2-core box).
    """
    import os

    env = os.environ.get("MLOPS_SERVE_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, (os.cpu_count() or 2) - 1)


def _longest_shared_prefix(earlier: list[list[int]], prompt: list[int]) -> tuple[int, int]:
    """(index of the earlier prompt sharing the longest prefix with `prompt`, that length); (0, 0) if none."""
    best, length = 0, 0
    for i, other in enumerate(earlier):
        k = 0
        limit = min(len(other), len(prompt))
        while k < limit and other[k] == prompt[k]:
            k += 1
        if k > length:
            best, length = i, k
    return best, length


def _eos_ids(tokenizer, model) -> set[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(i) for i in configured)
    return ids
