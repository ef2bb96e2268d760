"""The sample corpus: deterministic, grounded in the store policy the business suite asks about, with every
planted problem present and no eval item in what is meant to be clean."""

from __future__ import annotations

import json
import re

import pytest

from evaluation.suites import SUITES_DIR
from mlops.data.config import DecontamConfig
from mlops.data.decontam import EvalIndex, resolve_eval_sets
from mlops.data.sample import CLOSINGS, EVAL_ITEMS, SAFE_OFFERS, Gen, generate, policy, sample_rows
from mlops.files import file_sha256

SUITE_FILES, _ = resolve_eval_sets([str(SUITES_DIR / "**" / "*.jsonl")], SUITES_DIR)


def test_same_seed_same_files_and_every_injection_is_present(tmp_path):
    evals = tmp_path / "suite.jsonl"
    evals.write_text(json.dumps({"id": "e1", "prompt": "How many days does a customer have to return an item?"}) + "\n")
    first = generate(tmp_path / "a", seed=3, eval_files=[evals])
    second = generate(tmp_path / "b", seed=3, eval_files=[evals])
    assert first == second
    for name in first:
        assert file_sha256(tmp_path / "a" / name) == file_sha256(tmp_path / "b" / name)
    other = generate(tmp_path / "c", seed=4)
    assert file_sha256(tmp_path / "c" / "support_chats.jsonl") != file_sha256(tmp_path / "a" / "support_chats.jsonl")
    assert sum(other.values()) > 3000
    raw = (tmp_path / "a" / "support_chats.jsonl").read_bytes()
    text = raw.decode("utf-8", errors="replace")
    assert all(q in text for _, q in EVAL_ITEMS) and "How many days does a customer have to return" in text
    assert "how many days does a customer have to return an item - asking for a friend" in text  # reworded leak
    assert "@example.com" in text and "4111 1111 1111 1111" in text
    assert b"\xe9" in raw and '"role": "bot"' in text  # a non-UTF-8 byte and an unknown role
    leaks = [json.loads(line) for line in (tmp_path / "a" / "eval_leaks.jsonl").read_text().splitlines()]
    assert [item["id"] for item in leaks] == [item_id for item_id, _ in EVAL_ITEMS]


def said(templates: list[str]) -> re.Pattern:
    """A pattern matching any of the policy's templates with its slots filled."""
    parts = [re.escape(t).replace(r"\{", "{").replace(r"\}", "}") for t in templates]
    return re.compile("|".join(re.sub(r"\{[a-z_]+\}", ".+?", p) for p in parts))


@pytest.mark.parametrize("round_", [1, 2])
def test_agents_answer_from_the_policy_and_round_two_teaches_more_of_it(round_):
    facts = [f for f in policy()["facts"] if f["round"] <= round_]
    pattern = said([t for f in facts for t in f["say"] + f["brief"]])
    endings = [re.escape(c) for c in CLOSINGS + SAFE_OFFERS if c]
    closing = re.compile(r"( (" + "|".join(endings) + "))*$")
    rows = sample_rows(round_=round_).clean["support_chats.jsonl"]
    turns = [m["content"] for row in rows for m in row["messages"] if m["role"] == "assistant"]
    policy_turns = [t for row in rows if row["domain"] != "general" for t in
                    (m["content"] for m in row["messages"] if m["role"] == "assistant")]
    assert policy_turns and all(pattern.fullmatch(closing.sub("", t)) for t in policy_turns)
    multi = sum(len(row["messages"]) > 2 for row in rows if row["domain"] != "general")
    assert multi > 0.4 * sum(row["domain"] != "general" for row in rows)  # follow-up questions are common
    for fact in facts:  # every fact is taught in several wordings, not one canned answer
        own = said(fact["say"] + fact["brief"])
        assert len({closing.sub("", t) for t in policy_turns if own.fullmatch(closing.sub("", t))}) >= 3, fact["id"]
    assert len(set(turns)) > 0.3 * len(turns)
    later = {f["id"] for f in policy()["facts"] if f["round"] > round_}
    g = Gen(1, round_)
    assert not later & {f["id"] for f in g.facts} and len(g.facts) == len(facts)


def test_round_two_covers_facts_round_one_leaves_out_in_every_dimension():
    facts = policy()["facts"]
    for dim in {f["dim"] for f in facts}:
        rounds = {f["round"] for f in facts if f["dim"] == dim}
        assert rounds == {1, 2}, dim


def test_decontamination_finds_nothing_in_the_clean_rows_and_catches_every_planted_leak(tmp_path):
    index = EvalIndex(DecontamConfig())
    generate(tmp_path, eval_files=SUITE_FILES)
    for path in [*SUITE_FILES, tmp_path / "eval_leaks.jsonl"]:
        index.add_file(path, path.name)
    for round_ in (1, 2):
        rows = sample_rows(eval_files=SUITE_FILES, round_=round_)
        for name, records in rows.clean.items():
            for record in records:
                texts = [m["content"] for m in record["messages"]] if "messages" in record else \
                    [record.get("text", ""), record.get("instruction", ""), record.get("input", ""), record.get("output", "")]
                assert index.find(texts) is None, (name, texts)
        assert len(rows.leaks) == len(EVAL_ITEMS) + 8  # 4 real items verbatim, 4 reworded
        for leak in rows.leaks:
            assert index.find(m["content"] for m in leak["messages"]) is not None, leak


def test_unknown_round_is_refused():
    with pytest.raises(ValueError, match="round_"):
        Gen(1, 3)
