"""The scoring and generation core behind the server: one worker thread owns the model.

Requests from any thread are queued as jobs; only the worker touches the model. It alternates between a
scoring round and a generation slice while both kinds wait, and schedules fairly within each kind:

- a scoring round takes prompts from every waiting request in turn, each at most its share of the token
  budget (`max_batch_tokens`), so a request with a hundred long prompts does not hold the queue;
- a generation slice decodes at most `max_gen_batch` rows (and about `max_batch_tokens` tokens of context)
  for `slice_steps` steps when others wait; then waiting rows join or take turns (serving.engines.hf.decoding).

A failing batch never fails its neighbours: the worker retries the members alone and fails only the one
that fails alone. Cancelled jobs (the client went away) are dropped between steps.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from serving.engine_types import (
    EngineClosed,
    EngineSpec,
    GenerationHandle,
    GenParams,
    TokenizerInfo,
)

log = logging.getLogger("mlops.serve")


@dataclass(eq=False)
class _Job(GenerationHandle):
    kind: str = "generate"  # "score" or "generate"
    prompts: list[list[int]] | None = None
    top_k: int = 1
    ids: list[int] | None = None
    params: GenParams | None = None
    on_text: Callable | None = None
    owner: object = None  # jobs of one request share one turn
    next_prompt: int = 0  # scoring progress (worker only)
    results: dict = field(default_factory=dict)


class Engine:
    """A causal LM loaded once, served by a single worker thread (the `hf` engine: the float32 reference)."""

    name = "hf"
    max_context = None  # the profile's: the model takes any length it was trained for

    def __init__(self, model_dir: Path | str, *, max_batch_tokens: int = 4096, max_gen_batch: int = 8,
                 slice_steps: int = 16, threads: int | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from serving.engines.hf.scheduling import GenerationQueue, ScoringQueue

        if threads:
            torch.set_num_threads(threads)
        self.model_dir = self.model_path = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir), trust_remote_code=False)
        self.model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32,
                                                          trust_remote_code=False).eval()
        self.max_batch_tokens, self.max_gen_batch, self.slice_steps = max_batch_tokens, max_gen_batch, slice_steps
        self.eos_ids = _eos_ids(self.tokenizer, self.model)
        self.vocab_size = len(self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._labels: dict[int, str] = {}
        self._pieces: dict[int, str] = {}
        self.batches: list[int] = []  # prompts per scoring round (tests, metrics)
        self.gen_batches: list[int] = []  # rows per generation batch
        self.observer: Callable[[str, int, int], None] | None = None  # (kind, rows, tokens) per batch
        self.last_progress = time.monotonic()
        # Lower priority (a shadow model): while this says True the worker waits between decode steps, so it
        # takes the CPU only when the user-facing engine has nothing to do. `yielded_s` sums those waits.
        self.yield_to: Callable[[], bool] | None = None
        self.yielded_s = 0.0
        self._yielding_since: float | None = None
        self._inbox: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._scoring = ScoringQueue(self)
        self._generating = GenerationQueue(self)
        self._closing = False  # the worker saw the close request
        self._closed = False  # close() was called: no new jobs
        self._turn = "score"
        self._worker = threading.Thread(target=self._run, name="engine-worker", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------------ public API (any thread)

    def score(self, prompts: list[list[int]], top_k: int = 1, owner: object = None) -> Future:
        """Future of list[Scored], one per prompt, in order; cancelling it drops the work not yet done."""
        job = _Job(kind="score", prompts=prompts, top_k=max(1, top_k), owner=owner)
        self._submit(job)
        return job.future

    def generate(self, ids: list[int], params: GenParams, on_text: Callable | None = None,
                 owner: object = None) -> _Job:
        """Queue a generation; the job's future yields `Generated`; `on_text` gets `decoding.Delta`s."""
        job = _Job(kind="generate", ids=ids, params=params, on_text=on_text, owner=owner)
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
        return self._inbox.qsize() + len(self._scoring.jobs) + len(self._generating.waiting)

    def busy(self) -> bool:
        """Work waits or runs (approximate, read from any thread)."""
        return self.queue_depth() > 0 or self._generating.batch is not None

    def should_yield(self) -> bool:
        return self.yield_to is not None and not self._closed and self.yield_to()

    def yielded(self) -> float:
        """Seconds spent standing aside so far, the wait in progress included (read from any thread)."""
        since = self._yielding_since
        return self.yielded_s + (time.perf_counter() - since if since is not None else 0.0)

    def _wait_turn(self) -> None:
        if not self.should_yield():
            return
        began = self._yielding_since = time.perf_counter()
        while self.should_yield():
            time.sleep(0.002)
            self.last_progress = time.monotonic()  # waiting by design is not a stall
        self._yielding_since = None
        self.yielded_s += time.perf_counter() - began

    def stalled(self, seconds: float) -> bool:
        """True when work waits and the worker has made no progress for `seconds`."""
        busy = self.queue_depth() > 0 or self._generating.batch is not None
        return busy and time.monotonic() - self.last_progress > seconds

    def tokenize(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return self.tokenizer(text, add_special_tokens=add_special_tokens).input_ids

    def detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenize(text)

    def chat_template(self) -> str | None:
        from mlops.profile import template_of

        return template_of(self.model_dir)

    def tokenizer_info(self) -> TokenizerInfo:
        tok = self.tokenizer
        return TokenizerInfo(type(tok).__name__, tok.eos_token, tok.bos_token, tok.pad_token, len(tok))

    def token_piece(self, token_id: int) -> str:
        """A token decoded on its own (cached): part of a character decodes as U+FFFD."""
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self.tokenizer.decode([token_id])
        return piece

    def token_bytes(self, token_id: int) -> list[int]:
        from serving.engines.hf.detokenize import token_bytes

        raw = token_bytes(self.tokenizer, token_id)
        return list(raw) if raw is not None else list(self.token_piece(token_id).encode("utf-8"))

    def token_text(self, token_id: int) -> str:
        """A token on its own, for `top_logprobs` keys (partial characters spelled as bytes)."""
        label = self._labels.get(token_id)
        if label is None:
            from serving.engines.hf.detokenize import token_label

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
            self._wait_turn()
            generating = self._generating.pending()
            try:
                if self._scoring.jobs and (self._turn == "score" or not generating):
                    self._turn = "generate"
                    self._scoring.run_round()
                elif generating:
                    self._turn = "score"
                    self._generating.run_slice()
            except Exception:  # noqa: BLE001 - a scheduler bug must not kill the only thread that runs the model
                log.exception("engine worker: unexpected error; the worker goes on")

    def _has_work(self) -> bool:
        return bool(self._scoring.jobs) or self._generating.pending()

    def _intake(self, block: bool) -> bool:
        """Move new jobs into the worker's queues; False once closed and idle."""
        from serving.engine_types import settle
        from serving.engines.hf.decoding import Row

        while True:
            try:
                job = self._inbox.get(block=block and not self._closing, timeout=None)
            except queue.Empty:
                break
            block = False
            if job is None:
                self._closing = True
            elif job.kind == "score":
                self._scoring.jobs.append(job)
            else:
                try:
                    self._generating.waiting.append(Row.start(job, self.tokenizer))
                except Exception as err:  # noqa: BLE001 - e.g. a seed torch cannot take: this job's own failure
                    settle(job.future, error=err)
        return not (self._closing and not self._has_work())

    def others_waiting(self) -> bool:
        """Work other than the running batch waits (the worker's own view; called from its thread)."""
        return bool(self._generating.waiting or self._scoring.jobs or not self._inbox.empty())


def build(model_path: Path, spec: EngineSpec) -> Engine:
    """The `hf` engine from the registry's spec (an HF model folder)."""
    return Engine(model_path, threads=spec.threads, max_batch_tokens=spec.max_batch_tokens,
                  max_gen_batch=spec.max_batch_rows, slice_steps=spec.slice_steps)


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
