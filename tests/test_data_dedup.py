"""Exact and near dedup, decontamination and mixing: what they catch and what they keep."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from mlops.data.config import DecontamConfig
from mlops.data.decontam import EvalIndex, resolve_eval_sets
from mlops.data.dedup import ExactIndex, Keys, NearIndex, exact_hash, load_prior, save_index, signature
from mlops.data.mixing import chosen_positions, history_take, mixed_order, mixed_prefix, plan_mix, split_take
from mlops.data.testing import BASE, DIFFERENT, SIMILAR
from mlops.errors import ConfigError


def test_exact_dedup_matches_normalised_text_only():
    index = ExactIndex()
    assert index.check_add(exact_hash("Hello, World!  How are you?"), "a") is None
    assert index.check_add(exact_hash("hello world how are you"), "b") == "a"  # case, punctuation, spacing
    assert index.check_add(exact_hash("hello world how are you today"), "c") is None


def test_near_dedup_catches_light_edits_and_keeps_different_texts():
    near = NearIndex(threshold=0.7, num_perm=128)
    assert near.check_add(signature(BASE, 128, 3), "base") is None
    key, sim = near.check_add(signature(SIMILAR, 128, 3), "similar")
    assert key == "base" and 0.7 <= sim < 1
    assert near.check_add(signature(DIFFERENT, 128, 3), "different") is None
    # The same topic in other words is not a duplicate.
    other = ("Since Monday's storm the orange light on my modem flashes; evenings are the worst, the connection "
             "fails at eight. Rebooting did not help.")
    assert near.check_add(signature(other, 128, 3), "other") is None


def test_earlier_snapshot_counts_as_seen(tmp_path):
    params = {"num_perm": 128, "shingle": 3, "threshold": 0.7, "scheme": "affine32"}
    save_index(tmp_path, [exact_hash(BASE)], [signature(BASE, 128, 3)], params)
    keys = Keys()
    exact, near = ExactIndex(keys), NearIndex(0.7, 128, keys)
    assert load_prior(tmp_path, "snap-old", params, exact, near) == 1
    assert exact.check_add(exact_hash(BASE.upper()), "new") == "snap-old#0"
    assert near.check_add(signature(SIMILAR, 128, 3), "new2")[0] == "snap-old#0"
    assert near.check_add(signature(DIFFERENT, 128, 3), "r-00000000000000ff") is None
    assert near.check_add(signature(DIFFERENT + " ok", 128, 3), "r-0000000000000100")[0] == "r-00000000000000ff"
    with pytest.raises(ConfigError, match="num_perm=128"):
        load_prior(tmp_path, "snap-old", {**params, "num_perm": 64}, ExactIndex(), NearIndex(0.7, 64))


def test_decontam_reports_the_eval_item(tmp_path):
    evals = tmp_path / "suites" / "support.jsonl"
    evals.parent.mkdir()
    items = [{"id": "q1", "prompt": "A customer says their router lights blink orange after a storm and the internet "
                                    "is down. What should they check first?", "choices": ["Cables", "Nothing"]},
             {"id": "q2", "prompt": "How many days do I have to return an item bought online?"}]
    evals.write_text("\n".join(json.dumps(i) for i in items) + "\n")
    files, unmatched = resolve_eval_sets(["suites/**/*.jsonl", "missing/*.jsonl"], tmp_path)
    assert files == [evals] and unmatched == ["missing/*.jsonl"]
    index = EvalIndex(DecontamConfig(ngram=13, min_words=8))
    assert index.add_file(evals, "suites/support.jsonl") == 2
    leak = "Hi! a customer says their router lights blink orange after a storm and the internet is down, help"
    ref, gram = index.find(leak)
    assert ref == {"eval_file": "suites/support.jsonl", "eval_line": 1, "eval_id": "q1"}
    assert len(gram.split()) == 13
    short_leak = "Quick one: how many days do I have to return an item bought online? Thanks"
    assert index.find(short_leak)[0]["eval_id"] == "q2"  # shorter than 13 words: matched whole
    assert index.find("My router blinks orange after the storm; what should I check?") is None
    assert index.find("Cables") is None  # short answer choices are not leaks


def test_mix_plan_meets_target_ratios_with_the_data_available():
    plan = plan_mix({"general": 500, "domain": 350, "safety": 40, "extra": 9}, {"general": 0.5, "domain": 0.4, "safety": 0.1})
    assert plan.take == {"domain": 160, "general": 200, "safety": 40}  # safety limits the total
    assert plan.dropped_domains == {"extra": 9}
    with pytest.raises(ConfigError, match="format"):
        plan_mix({"general": 10}, {"general": 0.9, "format": 0.1})
    natural = plan_mix({"a": 3, "b": 1}, {})
    assert natural.take == {"a": 3, "b": 1} and natural.targets == {"a": 0.75, "b": 0.25}


def test_selection_takes_exactly_and_the_mixed_order_keeps_shares_in_every_prefix():
    rng = np.random.default_rng(0)
    chosen = chosen_positions(100, 37, rng)
    assert len(chosen) == 37 and chosen.tolist() == sorted(set(chosen.tolist()))
    parts = split_take([50, 0, 30, 20], 37, np.random.default_rng(1))
    assert sum(parts) == 37 and parts[1] == 0 and all(0 <= n <= c for n, c in zip(parts, [50, 0, 30, 20], strict=True))
    assert split_take([5, 6], 11, rng) == [5, 6] and split_take([5, 6], 0, rng) == [0, 0]
    take = {"a": 60, "b": 30, "c": 10}
    order = mixed_order(0, 100, take)
    picks = [d for d, _ in order]
    assert Counter(picks) == take
    assert all([k for d2, k in order if d2 == d] == list(range(n)) for d, n in take.items())  # each in its order
    for end in range(10, 101, 10):
        counts = Counter(picks[:end])
        assert mixed_prefix(end, take) == {d: counts[d] for d in take}
        for d, n in take.items():
            assert abs(counts[d] - end * n / 100) <= 1
    assert mixed_order(20, 40, take) == order[20:40]  # any window, computed alone, is that window of the whole


def test_mixed_prefix_is_exact_for_huge_domains_and_ties_go_to_the_first_name():
    big = {"a": 10**9, "b": 3 * 10**8 + 7, "c": 12_345}
    assert sum(mixed_prefix(654_321_000, big).values()) == 654_321_000
    assert mixed_order(0, 2, {"x": 1, "y": 1}) == [("x", 0), ("y", 0)]  # equal keys: by domain name


def test_history_ratio():
    assert history_take(700, 0.3, 10_000) == 300  # 7:3
    assert history_take(700, 0.3, 120) == 120  # capped by what the snapshot holds


def test_disk_index_keeps_the_same_records_as_datasketch_in_memory(tmp_path):
    from mlops.data.diskindex import DiskExactIndex, DiskNearIndex, connect
    from mlops.data.sample import Gen

    g = Gen(11)
    texts = []
    for _ in range(150):
        row = g.support() if g.rng.random() < 0.5 else g.general()
        texts.append(" ".join(m["content"] for m in row["messages"]))
    texts += [t + " Thanks." for t in texts[:20]] + texts[20:30]  # near and exact copies
    db = connect(tmp_path / "idx.sqlite")
    disk_keys, mem_keys = Keys(), Keys()
    disk = (DiskExactIndex(db, disk_keys), DiskNearIndex(db, 0.7, 128, disk_keys))
    memory = (ExactIndex(mem_keys), NearIndex(0.7, 128, mem_keys))
    verdicts = []
    for i, text in enumerate(texts):
        key, h, sig = f"r-{i:016x}", exact_hash(text), signature(text, 128, 3)
        pair = []
        for exact, near in (disk, memory):
            dup = exact.check_add(h, key)
            pair.append(dup is not None or near.check_add(sig, key) is not None)
        verdicts.append(pair)
    assert all(d == m for d, m in verdicts)
    assert sum(d for d, _ in verdicts[150:]) == 30  # every injected copy caught
    assert disk[1].b * disk[1].r <= 128 and (disk[1].b, disk[1].r) == (memory[1].lsh.b, memory[1].lsh.r)


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_lsh_candidates_below_the_threshold_are_not_dropped(tmp_path, where):
    """Template-heavy distinct conversations collide in LSH bands; only confirmed similarity drops a record."""
    from mlops.data.diskindex import DiskNearIndex, connect
    from mlops.data.labelled_dedup import dedup_cases, evaluate

    cases = dedup_cases(2000, seed=3)
    index = NearIndex(0.7, 128) if where == "memory" else DiskNearIndex(connect(tmp_path / "i.sqlite"), 0.7, 128, Keys())
    result = evaluate(cases, index)
    assert index.candidates > result["drops"]  # LSH proposed pairs that confirmation turned down
    assert result["precision"] >= 0.99 and result["recall"] >= 0.95
