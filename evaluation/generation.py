"""The scoring and generation core behind the server: one worker thread owns the model.

Requests from any thread are queued as jobs; only the worker touches the model. It alternates between a
scoring round and a generation slice while both kinds wait, and schedules fairly within each kind:

- a scoring round takes prompts from every waiting request in turn, each at most its share of the token
  budget (`max_batch_tokens`), so a request with a hundred long prompts does not hold the queue;
- a generation slice decodes at most `max_gen_batch` rows (and about `max_batch_tokens` tokens of context)
  for `slice_steps` steps when others wait; then waiting rows join or take turns (evaluation.decoding).

A failing batch never fails its neighbours: the worker retries the members alone and fails only the one
that fails alone. Cancelled jobs (the client went away) are dropped between steps.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
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
    finish_reason: str  # "stop", "length" or "cancelled"


class EngineClosed(RuntimeError):
    """A job was submitted to an engine that was closed (its worker will never run it)."""


@dataclass(eq=False)
class _Job:
    kind: str  # "score" or "generate"
    future: Future
    prompts: list[list[int]] | None = None
    top_k: int = 1
    ids: list[int] | None = None
    params: GenParams | None = None
    on_text: Callable | None = None
    owner: object = None  # jobs of one request share one turn
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    next_prompt: int = 0  # scoring progress (worker only)
    results: dict = field(default_factory=dict)

    def dropped(self) -> bool:
        return self.cancelled.is_set() or self.future.cancelled()


def _settle(future: Future, result=None, error: BaseException | None = None) -> None:
    if future.done():  # cancelled by the client meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class Engine:
    """A causal LM loaded once, served by a single worker thread."""

    def __init__(self, model_dir: Path | str, *, max_batch_tokens: int = 4096, max_gen_batch: int = 8,
                 slice_steps: int = 16, threads: int | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)
        self.model_dir = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self.model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32).eval()
        self.max_batch_tokens, self.max_gen_batch, self.slice_steps = max_batch_tokens, max_gen_batch, slice_steps
        self.eos_ids = _eos_ids(self.tokenizer, self.model)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._labels: dict[int, str] = {}
        self._pieces: dict[int, str] = {}
        self.batches: list[int] = []  # prompts per scoring round (tests, metrics)
        self.gen_batches: list[int] = []  # rows per generation batch
        self.observer: Callable[[str, int, int], None] | None = None  # (kind, rows, tokens) per batch
        self.last_progress = time.monotonic()
        self._inbox: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._scoring: deque[_Job] = deque()
        self._waiting: deque = deque()  # decoding.Row not in the running batch
        self._batch = None  # decoding.Batch running now
        self._closing = False  # the worker saw the close request
        self._closed = False  # close() was called: no new jobs
        self._turn = "score"
        self._worker = threading.Thread(target=self._run, name="engine-worker", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------------ public API (any thread)

    def score(self, prompts: list[list[int]], top_k: int = 1, owner: object = None) -> Future:
        """Future of list[Scored], one per prompt, in order; cancelling it drops the work not yet done."""
        job = _Job("score", Future(), prompts=prompts, top_k=max(1, top_k), owner=owner)
        self._submit(job)
        return job.future

    def generate(self, ids: list[int], params: GenParams, on_text: Callable | None = None,
                 owner: object = None) -> _Job:
        """Queue a generation; the job's future yields `Generated`; `on_text` gets `decoding.Delta`s."""
        job = _Job("generate", Future(), ids=ids, params=params, on_text=on_text, owner=owner)
        self._submit(job)
        return job

    def _submit(self, job: _Job) -> None:
        if self._closed or not self._worker.is_alive():  # nobody would ever answer it
            job.future.set_exception(EngineClosed(f"the engine for {self.model_dir} is closed"))
            return
        self._inbox.put(job)

    def close(self, timeout: float = 10.0) -> None:
        self._closed = True
        self._inbox.put(None)
        self._worker.join(timeout=timeout)

    def alive(self) -> bool:
        return self._worker.is_alive() and not self._closed

    def queue_depth(self) -> int:
        """Requests waiting for the worker (approximate: read without the worker's lock)."""
        return self._inbox.qsize() + len(self._scoring) + len(self._waiting)

    def stalled(self, seconds: float) -> bool:
        """True when work waits and the worker has made no progress for `seconds`."""
        busy = self.queue_depth() > 0 or self._batch is not None
        return busy and time.monotonic() - self.last_progress > seconds

    def token_piece(self, token_id: int) -> str:
        """A token decoded on its own (cached): part of a character decodes as U+FFFD."""
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self.tokenizer.decode([token_id])
        return piece

    def token_bytes(self, token_id: int) -> list[int]:
        from evaluation.detokenize import token_bytes

        raw = token_bytes(self.tokenizer, token_id)
        return list(raw) if raw is not None else list(self.token_piece(token_id).encode("utf-8"))

    def token_text(self, token_id: int) -> str:
        """A token on its own, for `top_logprobs` keys (partial characters spelled as bytes)."""
        label = self._labels.get(token_id)
        if label is None:
            from evaluation.detokenize import token_label

            label = self._labels[token_id] = token_label(self.tokenizer, token_id)
        return label

    # ------------------------------------------------------------------ worker

    def _run(self) -> None:
        import torch

        torch.set_grad_enabled(False)
        while True:
            if not self._intake(block=not self._has_work()):
                return
            self.last_progress = time.monotonic()
            generating = self._batch is not None or bool(self._waiting)
            if self._scoring and (self._turn == "score" or not generating):
                self._turn = "generate"
                self._score_round()
            elif generating:
                self._turn = "score"
                self._generate_slice()

    def _has_work(self) -> bool:
        return bool(self._scoring or self._waiting or self._batch is not None)

    def _intake(self, block: bool) -> bool:
        """Move new jobs into the worker's queues; False once closed and idle."""
        from evaluation.decoding import Row

        while True:
            try:
                job = self._inbox.get(block=block and not self._closing, timeout=None)
            except queue.Empty:
                break
            block = False
            if job is None:
                self._closing = True
            elif job.kind == "score":
                self._scoring.append(job)
            else:
                self._waiting.append(Row.start(job, self.tokenizer))
        return not (self._closing and not self._has_work())

    def _others_waiting(self) -> bool:
        return bool(self._waiting or self._scoring or not self._inbox.empty())

    # ------------------------------------------------------------------ scoring

    def _score_round(self) -> None:
        for job in [j for j in self._scoring if j.dropped()]:
            self._scoring.remove(job)
            job.future.cancel()
        if not self._scoring:
            return
        picked = self._pick_prompts()
        groups: dict[_Job, list[int]] = {}
        for job, index in picked:
            groups.setdefault(job, []).append(index)
        prompts = [job.prompts[i] for job, i in picked]
        try:
            results = self._score_prompts(prompts, max(job.top_k for job in groups))
        except Exception as err:  # noqa: BLE001 - find the request that fails alone
            results = None
            if len(groups) == 1:
                self._fail_scoring(next(iter(groups)), err)
            else:
                log.warning("a scoring batch of %d requests failed (%s: %s); retrying each alone",
                            len(groups), type(err).__name__, err)
                for job, indices in groups.items():
                    try:
                        alone = self._score_prompts([job.prompts[i] for i in indices], job.top_k)
                    except Exception as own:  # noqa: BLE001 - this request's own failure
                        self._fail_scoring(job, own)
                        continue
                    self._store(job, indices, alone)
        if results is not None:
            start = 0
            for job, indices in groups.items():
                self._store(job, indices, results[start : start + len(indices)])
                start += len(indices)
        self.batches.append(len(prompts))
        if self.observer:
            self.observer("score", len(prompts), sum(len(p) for p in prompts))

    def _pick_prompts(self) -> list[tuple[_Job, int]]:
        """Prompts for one round: every waiting request in turn, each up to its share of the budget."""
        share = max(1, self.max_batch_tokens // len(self._scoring))
        picked: list[tuple[_Job, int]] = []
        used = 0
        served: list[_Job] = []
        for job in list(self._scoring):
            taken = 0
            while job.next_prompt < len(job.prompts):
                size = len(job.prompts[job.next_prompt])
                if picked and (used + size > self.max_batch_tokens or (taken and taken + size > share)):
                    break
                picked.append((job, job.next_prompt))
                job.next_prompt += 1
                used += size
                taken += size
            if taken:
                served.append(job)
            if used >= self.max_batch_tokens:
                break
        for job in served:  # served requests go to the back: the next round starts with the others
            self._scoring.remove(job)
            if job.next_prompt < len(job.prompts):
                self._scoring.append(job)
        return picked

    def _store(self, job: _Job, indices: list[int], scored: list[Scored]) -> None:
        for i, result in zip(indices, scored, strict=True):
            job.results[i] = _trim(result, job.top_k)
        if len(job.results) == len(job.prompts):
            job.first_token_at = time.perf_counter()
            _settle(job.future, [job.results[i] for i in range(len(job.prompts))])

    def _fail_scoring(self, job: _Job, err: BaseException) -> None:
        job.next_prompt = len(job.prompts)
        if job in self._scoring:
            self._scoring.remove(job)
        _settle(job.future, error=err)

    def _score_prompts(self, prompts: list[list[int]], top_k: int) -> list[Scored]:
        from evaluation.scoring import forward_score

        # Longest first keeps padding small; chunks respect the token budget (logits are [rows, len, vocab]).
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        scored: dict[int, Scored] = {}
        chunk: list[int] = []
        for i in order:
            longest = len(prompts[chunk[0]]) if chunk else len(prompts[i])
            if chunk and longest * (len(chunk) + 1) > self.max_batch_tokens:
                scored.update(zip(chunk, forward_score(self, [prompts[j] for j in chunk], top_k), strict=True))
                chunk = []
            chunk.append(i)
        if chunk:
            scored.update(zip(chunk, forward_score(self, [prompts[j] for j in chunk], top_k), strict=True))
        return [scored[i] for i in range(len(prompts))]

    # ------------------------------------------------------------------ generation

    def _generate_slice(self) -> None:
        from evaluation.decoding import Batch

        running = [r for r in self._batch.rows if not r.finish] if self._batch is not None else []
        if self._waiting or self._batch is None:
            chosen = self._plan(running)
            if self._batch is None or chosen != running:
                try:
                    self._batch = Batch(self.model, chosen, self.pad_id)
                except Exception as err:  # noqa: BLE001 - retried below, row by row
                    self._batch = None
                    self._retry_alone(chosen, err)
                    return
                self.gen_batches.append(len(chosen))
                if self.observer:
                    self.observer("generate", len(chosen), self._batch.tokens)
        batch, steps = self._batch, 0
        try:
            while not batch.done():
                for row in batch.step(self.eos_ids):
                    self._finish(row)
                self.last_progress = time.monotonic()
                steps += 1
                if steps >= self.slice_steps and self._others_waiting():
                    break
        except Exception as err:  # noqa: BLE001 - a forward pass failed: find the row that fails alone
            self._batch = None
            self._retry_alone([r for r in batch.rows if not r.finish], err)
            return
        if batch.done():
            self._batch = None

    def _plan(self, running: list) -> list:
        """Rows of the next slice: waiting rows first (they have waited), then the running ones; at most
        `max_gen_batch` rows, about `max_batch_tokens` of context, and an equal share per request."""
        candidates = [r for r in [*self._waiting, *running] if not self._drop(r)]
        owners = {id(r.job.owner) if r.job.owner is not None else id(r) for r in candidates}
        share = max(1, self.max_gen_batch // max(1, len(owners)))
        chosen, rest, per_owner, tokens = [], [], {}, 0
        for row in candidates:
            owner = id(row.job.owner) if row.job.owner is not None else id(row)
            size = len(row.job.ids) + len(row.tokens)
            fits = not chosen or (len(chosen) < self.max_gen_batch and tokens + size <= self.max_batch_tokens)
            if fits and per_owner.get(owner, 0) < share:
                chosen.append(row)
                per_owner[owner] = per_owner.get(owner, 0) + 1
                tokens += size
            else:
                rest.append(row)
        self._waiting = deque(rest)
        return chosen

    def _drop(self, row) -> bool:
        if row.is_cancelled():
            row.finish = "cancelled"
            self._finish(row)
            return True
        return False

    def _retry_alone(self, rows: list, err: BaseException) -> None:
        from evaluation.decoding import Batch

        if len(rows) == 1:
            rows[0].fail(err)
            self._finish(rows[0])
            return
        log.warning("a generation batch of %d rows failed (%s: %s); retrying each alone",
                    len(rows), type(err).__name__, err)
        for row in rows:
            try:
                batch = Batch(self.model, [row], self.pad_id)
                for _ in range(self.slice_steps):
                    if batch.done():
                        break
                    batch.step(self.eos_ids)
            except Exception as own:  # noqa: BLE001 - this row's own failure
                row.fail(own)
            if row.finish:
                self._finish(row)
            else:
                self._waiting.append(row)

    def _finish(self, row) -> None:
        job = row.job
        if job.first_token_at is None:
            job.first_token_at = time.perf_counter()
        if row.error is None and not job.future.cancelled():
            try:
                _settle(job.future, row.result())
                return
            except Exception as err:  # noqa: BLE001 - e.g. a streaming callback whose client is gone
                row.error = err
        if row.error is not None:
            _settle(job.future, error=row.error)


def _trim(scored: Scored, top_k: int) -> Scored:
    """A batch computes the largest top-k any member asked for; each request gets exactly its own k."""
    if all(t is None or len(t) <= top_k for t in scored.top_logprobs):
        return scored
    tops = [None if t is None else dict(list(t.items())[:top_k]) for t in scored.top_logprobs]
    return Scored(scored.tokens, scored.token_logprobs, tops)


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
