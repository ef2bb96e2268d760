"""The engine behind the server: one worker owns the model; waiting scoring requests run as one batch."""

from __future__ import annotations

import threading

import pytest

from evaluation.generation import Engine, GenParams


@pytest.fixture(scope="module")
def engine(tiny_model):
    eng = Engine(tiny_model["path"])
    yield eng
    eng.close()


def test_waiting_scoring_jobs_are_batched_into_one_forward_pass(engine):
    prompts = [[1, 2, 3 + i, 4, 5][: 3 + i % 3] for i in range(8)]
    alone = [engine.score([p]).result(timeout=30)[0] for p in prompts]
    gate = threading.Event()
    # A generation whose first text delta blocks keeps the worker busy while the scoring jobs queue up.
    blocker = engine.generate([1, 2, 3], GenParams(max_tokens=3), on_text=lambda _t: gate.wait(10))
    before = len(engine.batches)
    futures = [engine.score([p]) for p in prompts]
    gate.set()
    blocker.future.result(timeout=30)
    results = [f.result(timeout=30)[0] for f in futures]
    assert engine.batches[before:] == [len(prompts)]
    for got, want in zip(results, alone, strict=True):
        assert got.tokens == want.tokens
        assert got.token_logprobs[1:] == pytest.approx(want.token_logprobs[1:], abs=1e-5)


def test_a_failing_job_fails_only_its_own_request(engine):
    bad = engine.score([[10**9]])  # out of the vocabulary: the forward pass raises
    with pytest.raises(Exception):
        bad.result(timeout=30)
    assert engine.score([[1, 2, 3]]).result(timeout=30)[0].token_logprobs[0] is None


def test_cancelled_generation_stops_early(engine):
    job = engine.generate([1, 2, 3], GenParams(max_tokens=200), on_text=lambda _t: job.cancelled.set())
    out = job.future.result(timeout=30)
    assert out.finish_reason == "cancelled" and len(out.tokens) < 200
