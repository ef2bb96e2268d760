"""Parity: deployment form adds no scoring skew. Served loglikelihoods equal in-process `hf` ones
(|delta| < 1e-4) and greedy generations are identical, for the same tasks, template and system prompt."""

from __future__ import annotations

import pytest

SYSTEM = "You are the Northwind support assistant."
TASKS = ["general_knowledge", "biz_billing_mc", "general_arithmetic", "biz_refunds_returns_gen"]
GEN_TASKS = ["general_arithmetic", "biz_refunds_returns_gen"]
LIMIT = 6


@pytest.fixture(scope="module")
def served(tiny_model):
    from mlops.profile import load_profile
    from serving.server import create_app
    from serving.testing import serve_in_thread

    app = create_app(tiny_model["path"], load_profile(tiny_model["path"]).model_copy(update={"system_prompt": SYSTEM}), model_name="tiny")
    with serve_in_thread(app) as url:
        yield url


def _configs(tasks):
    from evaluation.suites import get_suites, task_config

    return [task_config(s, t) for s in get_suites("general,business") for t in s.tasks if t.name in tasks]


def _run(model: str, model_args: dict, tasks=TASKS, chat: bool = True, **extra) -> dict:
    # Stop only at end of text: the random tiny model's first tokens are often blank lines, which the suites'
    # "\n\n" stop would cut to an empty string and so compare nothing.
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    return simple_evaluate(
        model=model, model_args=model_args, tasks=_configs(tasks), task_manager=TaskManager(include_defaults=False),
        limit=LIMIT, log_samples=True, bootstrap_iters=0, apply_chat_template=chat,
        system_instruction=SYSTEM if chat else None,
        gen_kwargs={"until": ["<|endoftext|>"], "max_gen_toks": 24}, **extra,
    )


def _pair(path: str, url: str, **kwargs) -> tuple[dict, dict]:
    local = _run("hf", {"pretrained": path, "dtype": "float32"}, device="cpu", batch_size=1, **kwargs)
    remote = _run("local-completions", {
        "model": "tiny", "base_url": f"{url}/v1/completions", "tokenizer": path,
        "tokenizer_backend": "huggingface", "tokenized_requests": True, "max_length": 2048, "batch_size": 4,
        "num_concurrent": 2,
    }, **kwargs)
    return local, remote


@pytest.fixture(scope="module")
def both(tiny_model, served):
    """Chat template and system prompt rendered as in production."""
    return _pair(tiny_model["path"], served)


@pytest.fixture(scope="module")
def raw(tiny_model, served):
    """Plain prompts: the random tiny model answers a chat turn with blank lines only, plain text varies."""
    return _pair(tiny_model["path"], served, tasks=GEN_TASKS, chat=False)


def _by_doc(result: dict, task: str) -> dict[int, dict]:
    return {s["doc_id"]: s for s in result["samples"][task]}


@pytest.mark.parametrize("task", ["general_knowledge", "biz_billing_mc"])
def test_served_loglikelihoods_equal_in_process_hf(both, task):
    local, remote = both
    mine, theirs = _by_doc(local, task), _by_doc(remote, task)
    assert mine.keys() == theirs.keys() and len(mine) == LIMIT
    worst = 0.0
    for doc_id, sample in mine.items():
        ours = [r[0] for r in sample["resps"]]
        served = [r[0] for r in theirs[doc_id]["resps"]]
        assert len(ours) == len(served) == 4
        for (ll_a, greedy_a), (ll_b, greedy_b) in zip(ours, served, strict=True):
            worst = max(worst, abs(ll_a - ll_b))
            assert greedy_a == greedy_b
    assert worst < 1e-4, f"max |delta loglikelihood| {worst}"
    assert local["results"][task]["acc,none"] == remote["results"][task]["acc,none"]


def _same_generations(local: dict, remote: dict, task: str) -> list[str]:
    mine, theirs = _by_doc(local, task), _by_doc(remote, task)
    assert mine.keys() == theirs.keys() and len(mine) == LIMIT
    for doc_id, sample in mine.items():
        assert sample["filtered_resps"] == theirs[doc_id]["filtered_resps"], doc_id
    return [s["filtered_resps"][0] for s in mine.values()]


@pytest.mark.parametrize("task", GEN_TASKS)
def test_served_greedy_generations_equal_in_process_hf(both, raw, task):
    _same_generations(*both, task)
    texts = _same_generations(*raw, task)
    assert sum(len(t.strip()) for t in texts) > 10, f"the tiny model generated nothing to compare: {texts}"
