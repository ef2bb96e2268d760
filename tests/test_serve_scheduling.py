"""The engine's batches: a failing member never fails its neighbours, big requests do not starve small ones,
and work nobody waits for stops."""

from __future__ import annotations

import threading

import pytest

from serving.engine import GenParams
from serving.engines.hf.engine import Engine


@pytest.fixture(scope="module")
def engine(tiny_model):
    eng = Engine(tiny_model["path"], max_batch_tokens=512, slice_steps=4)
    yield eng
    eng.close()


def _hold(engine) -> threading.Event:
    """Occupy the worker until the returned event is set, so the next jobs queue up and batch together."""
    started, gate = threading.Event(), threading.Event()

    def hold(_delta) -> None:
        started.set()
        gate.wait(10)

    engine.generate([1, 2, 3], GenParams(max_tokens=1), on_text=hold)
    assert started.wait(30)
    return gate


class _Exploding(GenParams):
    """Sampling parameters that make this one row's sampling raise inside a shared batch."""

    @property
    def temperature(self):  # noqa: D401 - a property standing in for the field
        raise RuntimeError("this row's sampler broke")

    @temperature.setter
    def temperature(self, _value) -> None:
        pass


def test_a_row_whose_sampling_fails_ends_alone_and_its_batch_neighbours_finish_unchanged(engine):
    prompts = [[1, 504, 2330], [4093, 28, 905, 11], [7, 8, 9]]
    alone = [engine.generate(p, GenParams(max_tokens=6)).future.result(timeout=60) for p in prompts]
    gate = _hold(engine)
    good = [engine.generate(p, GenParams(max_tokens=6)) for p in prompts]
    bad = engine.generate([5, 6, 7], _Exploding(max_tokens=6))
    gate.set()
    with pytest.raises(RuntimeError, match="sampler broke"):
        bad.future.result(timeout=60)
    for want, job in zip(alone, good, strict=True):
        got = job.future.result(timeout=60)
        assert got.tokens == want.tokens and got.text == want.text


def test_a_forward_pass_that_fails_is_retried_per_member_and_fails_only_the_culprit(engine):
    gate = _hold(engine)
    good_scores = [engine.score([[1, 2, 3 + i]]) for i in range(3)]
    bad_score = engine.score([[1, 10**9]])  # an id past the vocabulary: the batched forward raises
    good_gens = [engine.generate([5, 6 + i], GenParams(max_tokens=3)) for i in range(2)]
    bad_gen = engine.generate([10**9, 3], GenParams(max_tokens=3))
    gate.set()
    with pytest.raises(IndexError):
        bad_score.result(timeout=60)
    with pytest.raises(IndexError):
        bad_gen.future.result(timeout=60)
    assert all(f.result(timeout=60)[0].token_logprobs[0] is None for f in good_scores)
    assert all(len(j.future.result(timeout=60).tokens) == 3 or j.future.result().finish_reason == "stop"
               for j in good_gens)


def test_a_short_generation_overtakes_a_long_one_that_started_first(engine):
    finished: list[str] = []
    long = engine.generate([1, 2, 3], GenParams(max_tokens=120))
    long.future.add_done_callback(lambda _f: finished.append("long"))
    first = threading.Event()
    probe = engine.generate([4, 5], GenParams(max_tokens=1), on_text=lambda _d: first.set())
    probe.future.result(timeout=60)
    short = engine.generate([6, 7], GenParams(max_tokens=3))
    short.future.add_done_callback(lambda _f: finished.append("short"))
    short.future.result(timeout=60)
    long.future.result(timeout=120)
    assert finished == ["short", "long"]


def test_a_request_with_many_long_prompts_does_not_hold_the_scoring_queue(engine):
    finished: list[str] = []
    gate = _hold(engine)
    big = engine.score([[3 + (i % 50)] * 200 for i in range(12)])  # 2400 tokens: five budgets of 512
    big.add_done_callback(lambda _f: finished.append("big"))
    small = engine.score([[1, 2, 3]])
    small.add_done_callback(lambda _f: finished.append("small"))
    gate.set()
    assert len(big.result(timeout=120)) == 12 and small.result(timeout=60)
    assert finished == ["small", "big"]


def test_scoring_members_get_exactly_the_top_logprobs_they_asked_for(engine):
    gate = _hold(engine)
    one, five = engine.score([[1, 2, 3, 4]], top_k=1), engine.score([[1, 2, 3, 5]], top_k=5)
    gate.set()
    assert all(len(t) == 1 for t in one.result(timeout=60)[0].top_logprobs[1:])
    assert all(len(t) == 5 for t in five.result(timeout=60)[0].top_logprobs[1:])


def test_cancelled_scoring_drops_its_remaining_prompts(engine):
    gate = _hold(engine)
    before = len(engine.batches)
    doomed = engine.score([[7] * 200 for _ in range(10)])
    assert doomed.cancel()
    gate.set()
    assert engine.score([[1, 2]]).result(timeout=60)
    assert sum(engine.batches[before:]) == 1  # only the probe was scored


def test_the_choices_of_one_question_are_scored_in_one_round_even_under_contention(engine):
    context = list(range(100, 160))
    question = [context + [7, 8 + i] for i in range(4)]  # 4 x 62 tokens: past a 512/3 share, within the budget
    gate = _hold(engine)
    before = len(engine.batches)
    others = [engine.score([[1, 2, 3 + i]]) for i in range(2)]
    mine = engine.score(question)
    gate.set()
    assert len(mine.result(timeout=60)) == 4 and all(f.result(timeout=60) for f in others)
    assert engine.batches[before:] == [6]
