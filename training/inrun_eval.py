"""Eval suites on the current weights during a run (`train.eval`): lm-eval in-process, a few items per task.

Rank 0 runs lm-eval's HF model over the live module (under ZeRO-3 every rank runs the same eval in lockstep,
since each forward gathers the partitioned weights from all of them); rank 0's scores are broadcast so every
rank takes the same selection and early-stopping decision. The eval must not change the run: dropout is off, no gradient is kept, and the
Python, NumPy and torch random states are put back as they were, so a run with in-run eval trains exactly as
one without it, and a resumed run replays the same scores.

Metrics, per evaluation step: `train_eval.<task>` (the task's primary metric), `train_eval.<task>.ci_low` and
`.ci_high` (its 95% interval from lm-eval's standard error), and `train_eval.<suite>` (the mean over its tasks).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time

log = logging.getLogger(__name__)
PREFIX = "train_eval."


def due(step: int, every: int, max_steps: int) -> bool:
    return step % every == 0 or step == max_steps


def check_suites(section, select_metric: str | None) -> list:
    """The configured suites (unknown names fail with the available ones) and a selection metric they make."""
    from mlops.errors import ConfigError, NotFoundError

    suites = []
    if section.suites:
        from evaluation.suites import get_suites

        try:
            suites = get_suites(list(section.suites))
        except NotFoundError as err:
            raise ConfigError(f"train.eval.suites={list(section.suites)}: {err}. Fix: name suites that exist (the "
                              "folders under evaluation/suites).") from None
    if select_metric and select_metric.startswith(PREFIX):
        names = {s.name for s in suites} | {t.name for s in suites for t in s.tasks}
        wanted = select_metric[len(PREFIX):]
        if wanted not in names:
            raise ConfigError(
                f"train.select.metric={select_metric} is not measured by this run: train.eval.suites="
                f"{list(section.suites)} scores {', '.join(sorted(names)) or 'nothing'}. Fix: add the suite to "
                f"train.eval.suites, or pick one of: " + ", ".join(PREFIX + n for n in sorted(names) or ["business"]))
    return suites


@contextlib.contextmanager
def _untouched_random_state():
    from training.checkpoint import rng_state, set_rng_state  # the same state a checkpoint saves

    saved = rng_state()
    try:
        yield
    finally:
        set_rng_state(saved)


def evaluate(run, suites: list, section, seed: int) -> dict[str, float]:
    """Every rank calls it at the same step; every rank returns rank 0's scores (and `train_eval_s`)."""
    import torch
    import torch.distributed as dist

    started = time.perf_counter()
    scores: dict[str, float] = {}
    # Under ZeRO-3 every forward gathers each layer's shards from all ranks, so every rank runs the same eval in
    # lockstep (same items, same batches, same greedy tokens); below ZeRO-3 rank 0 holds whole weights and runs
    # it alone while the others wait at the broadcast.
    everyone = run.t.zero_stage == 3
    run.engine.eval()
    try:
        with _untouched_random_state(), torch.no_grad():
            if run.rank0 or everyone:
                scores = _score(run.engine.module, run.prep.base["path"], suites, section, seed,
                                max_length=run.reader.seq_len)
    finally:
        run.engine.train()
    box = [scores]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    return {**box[0], "train_eval_s": time.perf_counter() - started}


def _score(model, tokenizer_path: str, suites: list, section, seed: int, *, max_length: int) -> dict[str, float]:
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager, get_task_dict
    from transformers import AutoTokenizer

    from evaluation.results import task_scores
    from evaluation.suites import task_config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, trust_remote_code=False)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=section.batch_size, max_length=max(max_length, 256))
    manager = TaskManager(include_defaults=False)
    tasks = get_task_dict([task_config(s, t) for s in suites for t in s.tasks], manager)
    previous = logging.getLogger("lm_eval").level
    logging.getLogger("lm_eval").setLevel(logging.WARNING)  # its per-task chatter would bury the training log
    try:
        result = simple_evaluate(model=lm, tasks=list(tasks.values()), limit=section.limit, apply_chat_template=True,
                                 bootstrap_iters=0, random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                                 fewshot_random_seed=seed, task_manager=manager, log_samples=False,
                                 verbosity="WARNING")
    finally:
        logging.getLogger("lm_eval").setLevel(previous)
    out: dict[str, float] = {}
    if result is None:  # lm-eval reports on LOCAL_RANK 0 only: another rank ran in lockstep (ZeRO-3) for the forwards
        return out
    scored = task_scores(result, suites)
    for score in scored:
        half = 1.96 * score.stderr if math.isfinite(score.stderr) else 0.0
        out[f"{PREFIX}{score.name}"] = score.value
        out[f"{PREFIX}{score.name}.ci_low"] = score.value - half
        out[f"{PREFIX}{score.name}.ci_high"] = score.value + half
    for suite in suites:
        members = [s.value for s in scored if s.suite == suite.name]
        out[f"{PREFIX}{suite.name}"] = sum(members) / max(1, len(members))
    return out


def eval_tokens(suites: list, limit: int | None) -> float:
    """Tokens one in-run eval pushes through the model, for the plan: each multiple-choice item scores every
    choice over about 96 tokens; each generation item reads about 96 tokens and writes up to max_gen_toks."""
    tokens = 0.0
    for suite in suites:
        for task in suite.tasks:
            items = task.items()
            n = len(items) if limit is None else min(limit, len(items))
            if task.kind == "multiple_choice":
                tokens += n * max((len(i.get("choices", [])) for i in items), default=4) * 96
            else:
                tokens += n * (96 + task.max_gen_toks)
    return tokens


def evaluations(max_steps: int, every: int) -> int:
    """How many in-run evals a run of max_steps makes (every N steps, and at the last)."""
    return max_steps // every + (1 if max_steps % every else 0)


def planned_seconds(suites: list, section, max_steps: int, train_tokens_per_s: float) -> float:
    """The in-run evals' share of the wall time: a forward costs about a third of a training step's token
    (forward and backward), so the eval reads about three times the training's tokens per second."""
    if not suites or train_tokens_per_s <= 0:
        return 0.0
    return evaluations(max_steps, section.every) * eval_tokens(suites, section.limit) / (3 * train_tokens_per_s)
