"""The engine behind the server: one worker owns the model; waiting scoring requests run as one batch."""

from __future__ import annotations

import threading

import pytest

from serving.engine import GenParams
from serving.engines.hf.engine import Engine


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
    with pytest.raises(IndexError):  # the embedding lookup of an id past the vocabulary
        bad.result(timeout=30)
    assert engine.score([[1, 2, 3]]).result(timeout=30)[0].token_logprobs[0] is None


def test_cancelled_generation_stops_early(engine):
    job = engine.generate([1, 2, 3], GenParams(max_tokens=200), on_text=lambda _t: job.cancelled.set())
    out = job.future.result(timeout=30)
    assert out.finish_reason == "cancelled" and len(out.tokens) < 200


def test_a_generation_cancelled_before_its_first_step_ends_without_an_empty_batch(tiny_model, caplog):
    eng, hold = Engine(tiny_model["path"]), threading.Event()
    hold.set()
    eng.yield_to = hold.is_set  # the worker waits before its slice, as a shadow engine does behind users
    try:
        job = eng.generate([1, 2, 3], GenParams(max_tokens=5))
        job.cancelled.set()  # the client left before decoding began
        hold.clear()
        assert job.future.result(timeout=30).finish_reason == "cancelled"
        assert eng.generate([1, 2, 3], GenParams(max_tokens=2)).future.result(timeout=30).tokens
    finally:
        eng.close()
    assert "batch of 0 rows failed" not in caplog.text


def _busy(engine) -> threading.Event:
    """Occupy the worker with a generation whose first text delta blocks until the returned event is set."""
    started, gate = threading.Event(), threading.Event()

    def hold(_text: str) -> None:
        started.set()
        gate.wait(10)

    engine.generate([1, 2, 3], GenParams(max_tokens=2, stop=[]), on_text=hold)
    assert started.wait(30), "the worker never started the blocking job"
    return gate


def test_waiting_generations_decode_as_one_batch_with_the_same_greedy_output(engine):
    texts = ["Hello there", "Where is my parcel? It was due on Monday and", "Refund", "a b c d e f g"]
    prompts = [engine.tokenizer(t).input_ids for t in texts]
    alone = [engine.generate(p, GenParams(max_tokens=12)).future.result(timeout=60) for p in prompts]
    gate = _busy(engine)
    before = len(engine.gen_batches)
    jobs = [engine.generate(p, GenParams(max_tokens=12)) for p in prompts]
    gate.set()
    together = [job.future.result(timeout=60) for job in jobs]
    assert engine.gen_batches[before:] == [len(prompts)]
    for a, b in zip(alone, together, strict=True):
        assert a.tokens == b.tokens and a.text == b.text and a.finish_reason == b.finish_reason
        assert b.token_logprobs == pytest.approx(a.token_logprobs, abs=1e-4)


def test_batched_rows_keep_their_own_stops_and_lengths(engine):
    gate = _busy(engine)
    short = engine.generate([1, 2, 3, 4], GenParams(max_tokens=3))
    long = engine.generate([5, 6], GenParams(max_tokens=10))
    gate.set()
    assert len(short.future.result(timeout=60).tokens) <= 3
    assert short.future.result().finish_reason in ("length", "stop")
    out = long.future.result(timeout=60)
    assert len(out.tokens) == 10 or out.finish_reason == "stop"


def test_prompts_sharing_a_context_score_as_if_alone(engine):
    context = engine.tokenizer("Question: Which planet is known as the Red Planet?\nAnswer:").input_ids
    choices = [" Mars", " Jupiter", " Venus", " Saturn is the answer"]
    prompts = [context + engine.tokenizer(c).input_ids for c in choices] + [context + engine.tokenizer(" Mars").input_ids]
    together = engine.score(prompts, top_k=3).result(timeout=60)
    for prompt, got in zip(prompts, together, strict=True):
        want = engine.score([prompt], top_k=3).result(timeout=60)[0]
        assert got.tokens == want.tokens
        assert got.token_logprobs[1:] == pytest.approx(want.token_logprobs[1:], abs=1e-5)
        for a, b in zip(got.top_logprobs[1:], want.top_logprobs[1:], strict=True):
            assert list(a) == list(b) and list(a.values()) == pytest.approx(list(b.values()), abs=1e-5)


def test_streaming_holds_back_only_text_that_could_still_become_a_stop_string():
    from serving.engines.hf.decoding import held_back

    stops = ["<|im_end|>", "\n\n"]
    assert held_back("Your parcel ships today", stops) == 0  # nothing waits for a stop that cannot start here
    assert held_back("Your parcel ships <|im", stops) == 4
    assert held_back("Line one\n", stops) == 1
    assert held_back("", stops) == 0 and held_back("abc", []) == 0
