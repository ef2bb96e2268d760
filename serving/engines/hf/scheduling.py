"""The engine worker's two queues and how it takes turns within each (see serving.engines.hf.engine).

`ScoringQueue`: each round takes prompts from every waiting request in turn, each up to its share of the
token budget. `GenerationQueue`: each slice decodes the rows chosen by `_plan` (waiting rows first, an equal
share per request, bounded rows and context tokens) and stops after `slice_steps` when others wait.
Both retry a failing batch member by member, so only the request that fails alone fails.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from serving.engine_types import settle
from serving.engines.hf.decoding import Batch
from serving.engines.hf.scoring import forward_score

log = logging.getLogger("mlops.serve")


class ScoringQueue:
    def __init__(self, engine) -> None:
        self.engine = engine
        self.jobs: deque = deque()

    def run_round(self) -> None:
        for job in [j for j in self.jobs if j.dropped()]:
            self.jobs.remove(job)
            job.future.cancel()
        if not self.jobs:
            return
        picked = self._pick_prompts()
        groups: dict = {}
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
        self.engine.batches.append(len(prompts))
        keep_recent(self.engine.batches)
        if self.engine.observer:
            self.engine.observer("score", len(prompts), sum(len(p) for p in prompts))

    def _pick_prompts(self) -> list[tuple]:
        """Prompts for one round: every waiting request in turn, each up to its share of the budget.

        Prompts that continue a shared prefix (the choices of one question) stay together past the share,
        within the round's budget: scored in one pass they reuse the prefix's pass over the vocabulary.
        """
        budget = self.engine.max_batch_tokens
        share = max(1, budget // len(self.jobs))
        picked: list[tuple] = []
        used = 0
        served: list = []
        for job in list(self.jobs):
            taken = 0
            while job.next_prompt < len(job.prompts):
                size = len(job.prompts[job.next_prompt])
                sibling = taken and _same_question(job.prompts[job.next_prompt - 1], job.prompts[job.next_prompt])
                if picked and (used + size > budget or (taken and taken + size > share and not sibling)):
                    break
                picked.append((job, job.next_prompt))
                job.next_prompt += 1
                used += size
                taken += size
            if taken:
                served.append(job)
            if used >= self.engine.max_batch_tokens:
                break
        for job in served:  # served requests go to the back: the next round starts with the others
            self.jobs.remove(job)
            if job.next_prompt < len(job.prompts):
                self.jobs.append(job)
        return picked

    def _store(self, job, indices: list[int], scored: list) -> None:
        for i, result in zip(indices, scored, strict=True):
            job.results[i] = _trim(result, job.top_k)
        if len(job.results) == len(job.prompts):
            job.first_token_at = time.perf_counter()
            settle(job.future, [job.results[i] for i in range(len(job.prompts))])

    def _fail_scoring(self, job, err: BaseException) -> None:
        job.next_prompt = len(job.prompts)
        if job in self.jobs:
            self.jobs.remove(job)
        settle(job.future, error=err)

    def _score_prompts(self, prompts: list[list[int]], top_k: int) -> list:
        # Longest first keeps padding small; chunks respect the token budget (logits are [rows, len, vocab]).
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        scored: dict = {}
        chunk: list[int] = []
        for i in order:
            longest = len(prompts[chunk[0]]) if chunk else len(prompts[i])
            if chunk and longest * (len(chunk) + 1) > self.engine.max_batch_tokens:
                scored.update(zip(chunk, forward_score(self.engine, [prompts[j] for j in chunk], top_k), strict=True))
                chunk = []
            chunk.append(i)
        if chunk:
            scored.update(zip(chunk, forward_score(self.engine, [prompts[j] for j in chunk], top_k), strict=True))
        return [scored[i] for i in range(len(prompts))]


class GenerationQueue:
    def __init__(self, engine) -> None:
        self.engine = engine
        self.waiting: deque = deque()  # decoding.Row not in the running batch
        self.batch: Batch | None = None

    def pending(self) -> bool:
        return self.batch is not None or bool(self.waiting)

    def run_slice(self) -> None:
        running = [r for r in self.batch.rows if not r.finish] if self.batch is not None else []
        if self.waiting or self.batch is None:
            chosen = self._plan(running)
            if not chosen:  # every row was cancelled (clients left): nothing to decode
                self.batch = None
                return
            if self.batch is None or chosen != running:
                try:
                    self.batch = Batch(self.engine.model, chosen, self.engine.pad_id)
                except Exception as err:  # noqa: BLE001 - retried below, row by row
                    self.batch = None
                    self._retry_alone(chosen, err)
                    return
                self.engine.gen_batches.append(len(chosen))
                keep_recent(self.engine.gen_batches)
                if self.engine.observer:
                    self.engine.observer("generate", len(chosen), self.batch.tokens)
        batch, steps = self.batch, 0
        try:
            while not batch.done():
                for row in batch.step(self.engine.eos_ids):
                    self._finish(row)
                self.engine.last_progress = time.monotonic()
                steps += 1
                if self._turn_over(batch, steps):
                    break
                if self.engine.should_yield():  # a lower-priority engine steps aside after every step
                    break
        except Exception as err:  # noqa: BLE001 - a forward pass failed: find the row that fails alone
            self.batch = None
            self._retry_alone([r for r in batch.rows if not r.finish], err)
            return
        if batch.done():
            self.batch = None

    def _turn_over(self, batch: Batch, steps: int) -> bool:
        """Others wait and this batch should let them in: after a slice; sooner (a quarter slice) while the
        batch has room for newcomers, which bounds their time to first token; at once when a quarter of its
        rows have finished (left, stopped), so their places do not ride along empty."""
        if not self.engine.others_waiting():
            return False
        finished = sum(1 for row in batch.rows if row.finish)
        room = len(batch.rows) - finished < self.engine.max_gen_batch and bool(self.waiting)
        limit = max(1, self.engine.slice_steps // 4) if room else self.engine.slice_steps
        return steps >= limit or 4 * finished >= len(batch.rows)

    def _plan(self, running: list) -> list:
        """Rows of the next slice: waiting rows first (they have waited), then the running ones; at most
        `max_gen_batch` rows, about `max_batch_tokens` of context, and an equal share per request."""
        candidates = [r for r in [*self.waiting, *running] if not self._drop(r)]
        owners = {id(r.job.owner) if r.job.owner is not None else id(r) for r in candidates}
        share = max(1, self.engine.max_gen_batch // max(1, len(owners)))
        chosen, rest, per_owner, tokens = [], [], {}, 0
        for row in candidates:
            owner = id(row.job.owner) if row.job.owner is not None else id(row)
            size = len(row.job.ids) + len(row.tokens)
            fits = not chosen or (len(chosen) < self.engine.max_gen_batch and tokens + size <= self.engine.max_batch_tokens)
            if fits and per_owner.get(owner, 0) < share:
                chosen.append(row)
                per_owner[owner] = per_owner.get(owner, 0) + 1
                tokens += size
            else:
                rest.append(row)
        self.waiting = deque(rest)
        return chosen

    def _drop(self, row) -> bool:
        if row.is_cancelled():
            row.finish = "cancelled"
            self._finish(row)
            return True
        return False

    def _retry_alone(self, rows: list, err: BaseException) -> None:
        if len(rows) == 1:
            rows[0].fail(err)
            self._finish(rows[0])
            return
        log.warning("a generation batch of %d rows failed (%s: %s); retrying each alone",
                    len(rows), type(err).__name__, err)
        for row in rows:
            try:
                batch = Batch(self.engine.model, [row], self.engine.pad_id)
                for _ in range(self.engine.slice_steps):
                    if batch.done():
                        break
                    batch.step(self.engine.eos_ids)
            except Exception as own:  # noqa: BLE001 - this row's own failure
                row.fail(own)
            if row.finish:
                self._finish(row)
            else:
                self.waiting.append(row)

    def _finish(self, row) -> None:
        job = row.job
        if job.first_token_at is None:
            job.first_token_at = time.perf_counter()
        if row.error is None and not job.future.cancelled():
            try:
                settle(job.future, row.result())
                return
            except Exception as err:  # noqa: BLE001 - e.g. a streaming callback whose client is gone
                row.error = err
        if row.error is not None:
            settle(job.future, error=row.error)


def keep_recent(values: list, limit: int = 4096) -> None:
    """Batch-size histories are for tests and recent metrics: a server that runs for weeks must not grow them."""
    if len(values) > 2 * limit:
        del values[:-limit]


def _same_question(previous: list[int], prompt: list[int]) -> bool:
    """The two prompts share at least half of the shorter one as a prefix."""
    half = min(len(previous), len(prompt)) // 2
    return half > 0 and previous[:half] == prompt[:half]


def _trim(scored, top_k: int):
    """A batch computes the largest top-k any member asked for; each request gets exactly its own k."""
    if all(t is None or len(t) <= top_k for t in scored.top_logprobs):
        return scored
    tops = [None if t is None else dict(list(t.items())[:top_k]) for t in scored.top_logprobs]
    from serving.engine_types import Scored

    return Scored(scored.tokens, scored.token_logprobs, tops)
