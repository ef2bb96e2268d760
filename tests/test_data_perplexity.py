"""The perplexity filter (data.filters.perplexity): scores on the workers that do not depend on batching, bounds
from the whole snapshot's nearest-rank percentiles or absolute limits, outliers quarantined with their score, the
distribution before and after in the acceptance report; off by default without touching config hashes."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from collections import Counter

import pytest

from mlops.config import canonical, config_hash
from mlops.data.config import PerplexityConfig
from mlops.data.labelled_dedup import conversations
from mlops.data.perplexity import bounds, judge, percentile, rounded
from mlops.data.testing import chat, quick_build, quick_config
from mlops.errors import ConfigError

# Only the steps that keep a planted outlier in reach of the perplexity filter (repeated_ngrams, char_repetition
# and language id would catch some of it first).
STEPS = {"steps": ["empty_assistant", "length"]}


def clean_rows(n: int = 40) -> list[dict]:
    return conversations(n, seed=4)


def repeated(word: str, n: int = 40) -> dict:
    """A record of one token repeated: even a random-init model with tied embeddings finds the next token
    likelier when it repeats the current one, so this scores far below any real text (measured with the tiny
    model: about 24k-32k, while real conversations score 47k-51k, near its vocabulary size)."""
    return chat(f"Question about my {word} please", " ".join([word] * n))


# ----------------------------------------------------------------- the global step, on histograms


def test_bounds_are_nearest_rank_percentiles_of_the_whole_histogram_or_the_tighter_absolute_limit():
    hist = Counter({10.0: 1, 20.0: 18, 30.0: 1})
    assert percentile(hist, 5) == 10.0 and percentile(hist, 95) == 20.0 and percentile(hist, 100) == 30.0
    cfg = PerplexityConfig(enabled=True, min_percentile=5, max_percentile=95)
    assert bounds(hist, cfg) == {"low": 10.0, "low_by": "p5", "high": 20.0, "high_by": "p95"}
    tighter = PerplexityConfig(enabled=True, min_percentile=5, max_percentile=95, min_perplexity=15, max_perplexity=25)
    assert bounds(hist, tighter) == {"low": 15, "low_by": "min_perplexity", "high": 20.0, "high_by": "p95"}
    none = PerplexityConfig(enabled=True, min_percentile=0, max_percentile=100)
    assert bounds(hist, none) == {"low": None, "low_by": None, "high": None, "high_by": None}


def test_judge_names_the_side_the_score_and_the_limit_and_keeps_unscored_rows():
    limits = {"low": 15.0, "low_by": "min_perplexity", "high": 20.0, "high_by": "p95"}
    assert judge(30.0, limits) == ("perplexity_high", {"perplexity": 30.0, "limit": 20.0, "limit_by": "p95"})
    assert judge(10.0, limits) == ("perplexity_low", {"perplexity": 10.0, "limit": 15.0, "limit_by": "min_perplexity"})
    assert judge(20.0, limits) is None and judge(15.0, limits) is None and judge(float("nan"), limits) is None


def test_scores_are_rounded_to_four_significant_digits():
    assert rounded(48123.456) == 48120.0 and rounded(1.234567) == 1.235 and rounded(0.000123456) == 0.0001235


# ----------------------------------------------------------------- config


def test_off_by_default_and_existing_config_hashes_stay(tmp_path):
    plain = quick_config([tmp_path / "a.jsonl"], tmp_path)
    spelled = quick_config([tmp_path / "a.jsonl"], tmp_path, filters={"perplexity": {"enabled": False}})
    assert plain.data.filters.perplexity.enabled is False
    assert "perplexity" not in canonical(plain.data.filters)
    assert config_hash(spelled) == config_hash(plain)
    on = quick_config([tmp_path / "a.jsonl"], tmp_path, filters={"perplexity": {"enabled": True}})
    assert config_hash(on) != config_hash(plain)
    on_gpu = quick_config([tmp_path / "a.jsonl"], tmp_path, filters={"perplexity": {"enabled": True, "device": "cuda"}})
    assert config_hash(on_gpu) == config_hash(on)  # where it runs never changes what it keeps


@pytest.mark.parametrize(("settings", "named"), [
    ({"min_percentile": 99, "max_percentile": 1}, "min_percentile (99) must be below max_percentile (1)"),
    ({"max_perplexity": 10, "min_perplexity": 100}, "min_perplexity (100) must be below max_perplexity (10)"),
    ({"max_percentile": 101}, "data.filters.perplexity.max_percentile"),
    ({"treshold": 3}, "data.filters.perplexity.treshold"),
])
def test_bad_settings_are_refused_naming_the_field_and_the_fix(tmp_path, settings, named):
    with pytest.raises(ConfigError) as err:
        quick_config([tmp_path / "a.jsonl"], tmp_path, filters={"perplexity": settings})
    assert named in str(err.value) and "Fix" in str(err.value)


def test_an_unknown_scoring_model_is_refused_naming_the_field(tiny_model, tmp_path, mlops_home):
    with pytest.raises(ConfigError, match="data.filters.perplexity.model 'no-such-model'"):
        quick_build(clean_rows(4), base_model=tiny_model["path"], workdir=tmp_path,
                    filters={"perplexity": {"enabled": True, "model": "no-such-model"}})


# ----------------------------------------------------------------- scoring


def test_importing_the_filter_loads_neither_torch_nor_transformers():
    code = ("import sys, mlops.data.perplexity, mlops.data.partclean, mlops.data.sharded, mlops.data.acceptance; "
            "print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_score_does_not_depend_on_the_batch_it_was_scored_in(tiny_model):
    from mlops.data.perplexity import Scorer

    scorer = Scorer(tiny_model["path"], "cpu")
    texts = [" ".join(m["content"] for m in row["messages"]) for row in clean_rows(12)]
    together = scorer.score(texts, batch_size=8, max_tokens=256)
    shuffled = list(range(len(texts)))
    random.Random(1).shuffle(shuffled)
    alone = [scorer.score([texts[i]], batch_size=1, max_tokens=256)[0] for i in shuffled]
    assert dict(zip(shuffled, alone, strict=True)) == dict(enumerate(together))
    assert all(s == rounded(s) for s in together)
    assert all(math.isnan(s) for s in scorer.score(["a", ""], batch_size=2, max_tokens=256))  # too short to score


# ----------------------------------------------------------------- in a build


@pytest.fixture
def build(tiny_model, tmp_path, mlops_home):
    def run(rows, **data):
        return quick_build(rows, base_model=tiny_model["path"], workdir=tmp_path, **data)

    return run


def perplexity_lines(result) -> list[dict]:
    lines = (result.path / "quarantine" / "records.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["reason"].startswith("perplexity_")]


def test_a_repeated_token_outlier_is_quarantined_with_its_score(build):
    rows = clean_rows(30) + [repeated("refund")]
    result = build(rows, filters={**STEPS, "perplexity": {"enabled": True, "min_percentile": 0,
                                                          "max_percentile": 100, "min_perplexity": 40000}})
    (line,) = perplexity_lines(result)
    assert line["stage"] == "filter" and line["reason"] == "perplexity_low"
    assert line["line"] == 31 and line["perplexity"] < 40000
    assert (line["limit"], line["limit_by"]) == (40000, "min_perplexity")
    assert result.manifest["counters"]["filter.perplexity_low"] == 1
    assert "filter.perplexity_high" not in result.manifest["counters"]
    report = result.manifest["acceptance"]["perplexity"]
    assert report["before"]["records"] == 31 and report["after"]["records"] == 30
    assert report["before"]["min"] == line["perplexity"] and report["after"]["min"] >= 40000
    assert report["rejected"] == {"perplexity_low": 1, "perplexity_high": 0}
    assert report["model"] == "tiny" and report["max_tokens"] == 256
    assert result.manifest["acceptance"]["rejected"]["reasons"]["filter.perplexity_low"]["judged"] is True


def test_percentiles_cut_both_tails_of_the_snapshots_own_distribution(build):
    result = build(clean_rows(40), filters={**STEPS, "perplexity": {"enabled": True, "min_percentile": 5,
                                                                      "max_percentile": 95}})
    report = result.manifest["acceptance"]["perplexity"]
    before, after = report["before"], report["after"]
    assert (report["low"], report["low_by"]) == (before["p5"], "p5")
    assert (report["high"], report["high_by"]) == (before["p95"], "p95")
    lines = perplexity_lines(result)
    low = [r for r in lines if r["reason"] == "perplexity_low"]
    high = [r for r in lines if r["reason"] == "perplexity_high"]
    assert low and high  # both tails cut: at least the lowest and the highest scores went
    assert all(r["perplexity"] < report["low"] for r in low) and all(r["perplexity"] > report["high"] for r in high)
    assert report["rejected"] == {"perplexity_low": len(low), "perplexity_high": len(high)}
    assert len(low) + len(high) <= 4  # at most 5% of 40 on each side (nearest rank)
    assert before["records"] == 40 and after["records"] == 40 - len(lines)
    assert before["min"] == min(r["perplexity"] for r in low) and before["max"] == max(r["perplexity"] for r in high)
    assert report["low"] <= after["min"] and after["max"] <= report["high"]
    assert sum(result.manifest["counts"]["per_split"][s]["records"] for s in ("train", "validation")) == 40 - len(lines)


@pytest.mark.timeout(180)  # a forked worker stuck in OpenMP would hang here for good
def test_duplicates_are_not_scored_and_the_snapshot_is_the_same_with_more_workers(build, tiny_model, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setattr("mlops.data.perplexity.SCORE_ROWS", 8)  # several scoring tasks per partition
    rows = clean_rows(30) + [repeated("refund"), repeated("invoice")] + clean_rows(5)  # 5 exact duplicates
    settings = {**STEPS, "perplexity": {"enabled": True, "min_percentile": 0, "max_percentile": 90,
                                        "min_perplexity": 40000, "batch_size": 4}}
    one = build(rows, filters=settings)
    assert one.manifest["acceptance"]["perplexity"]["before"]["records"] == 32  # the 5 duplicates went first
    assert one.manifest["counters"]["filter.perplexity_low"] == 2 and one.manifest["counters"]["filter.perplexity_high"]
    if sys.platform != "linux":
        pytest.skip("the local pool forks")
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    (torch.ones(512, 512) @ torch.ones(512, 512)).sum()  # this process's OpenMP pool is up when the pool forks
    torch.set_num_threads(threads)
    two = quick_build(rows, base_model=tiny_model["path"], workdir=tmp_path, workers=2, filters=settings,
                      output_dir=str(tmp_path / "built-by-two-workers"))
    assert two.path.parent != one.path.parent and not two.noop
    assert two.snapshot_id == one.snapshot_id
    assert two.manifest["acceptance"]["perplexity"] == one.manifest["acceptance"]["perplexity"]
    assert perplexity_lines(two) == perplexity_lines(one)
