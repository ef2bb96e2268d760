"""Offline tokenization (assistant-only loss masks) and the Great Expectations batch gate."""

from __future__ import annotations

import pandas as pd
import pytest

from mlops.data.gate import COLUMNS, SUITES, Gate, GateParams, share_deviation
from mlops.data.records import Record
from mlops.data.tokenize import ChatTokenizer, tokenizer_info


@pytest.fixture(scope="module")
def tok(tiny_model) -> ChatTokenizer:
    return ChatTokenizer(tiny_model["path"])


def chat(*turns: tuple[str, str]) -> Record:
    return Record("r-x", "s.jsonl", 1, "general", "chat", [{"role": r, "content": c} for r, c in turns])


def masked_spans(tok: ChatTokenizer, ids, mask) -> list[str]:
    spans, current = [], []
    for token, m in zip(ids.tolist(), mask.tolist(), strict=True):
        if m:
            current.append(token)
        elif current:
            spans.append(tok.tok.decode(current))
            current = []
    if current:
        spans.append(tok.tok.decode(current))
    return spans


def test_loss_mask_covers_exactly_the_assistant_turns(tok):
    record = chat(("system", "Be brief."), ("user", "Where is my parcel?"), ("assistant", "It ships today."),
                  ("user", "And the refund?"), ("assistant", "Within 5 days."))
    ids, mask = tok.encode(record)
    assert ids.dtype.name == "int32" and mask.dtype.name == "uint8" and len(ids) == len(mask)
    assert masked_spans(tok, ids, mask) == ["It ships today.<|im_end|>\n", "Within 5 days.<|im_end|>\n"]
    full = tok.tok.apply_chat_template(record.messages, tokenize=False)
    assert tok.tok.decode(ids.tolist()) == full  # the whole rendered chat, nothing dropped


def test_default_system_prompt_is_not_trained_on(tok):
    ids, mask = tok.encode(chat(("user", "Hi"), ("assistant", "Hello!")))
    assert masked_spans(tok, ids, mask) == ["Hello!<|im_end|>\n"]
    assert "SmolLM" in tok.tok.decode(ids.tolist())  # the template's default system turn is there, unmasked


def test_text_records_train_on_every_token_and_end_with_eos(tok):
    record = Record("r-t", "kb.jsonl", 1, "general", "text", [{"role": "text", "content": "Unplug the router."}])
    ids, mask = tok.encode(record)
    assert mask.all() and ids[-1] == tok.tok.eos_token_id


def test_tokenizer_info_hashes_vocab_and_template(tiny_model):
    info = tokenizer_info(tiny_model["path"], "tiny", tiny_model["id"])
    assert len(info["vocab_hash"]) == 64 and len(info["chat_template_hash"]) == 64
    assert info["pad_id"] is not None and info["vocab_size"] > 1000
    assert info == tokenizer_info(tiny_model["path"], "tiny", tiny_model["id"])


PARAMS = GateParams(min_chars=5, max_chars=200, min_tokens=3, max_tokens=64, max_dup_ratio=0.0,
                    min_loss_share=0.1, tolerance=0.05, domains=["general", "safety"])
TARGETS = {"general": 0.5, "safety": 0.5}


def frame(n: int = 8, **changes) -> pd.DataFrame:
    domains = ["general", "safety"] * (n // 2)
    rows = {
        "record_id": [f"r-{i}" for i in range(n)], "source": ["s.jsonl"] * n, "line": list(range(1, n + 1)),
        "domain": domains, "kind": ["chat"] * n, "text": [f"question {i} and its answer" for i in range(n)],
        "text_chars": [25] * n, "text_hash": [f"{i:016x}" for i in range(n)], "n_tokens": [20] * n,
        "loss_tokens": [8] * n, "loss_share": [0.4] * n, "domain_share_dev": share_deviation(domains, TARGETS),
    }
    df = pd.DataFrame(rows)
    for column, (row, value) in changes.items():
        df.loc[row, column] = value
    return df


@pytest.fixture(scope="module")
def gate() -> Gate:
    return Gate("snapshot_batch", PARAMS)


def test_good_batch_passes(gate):
    result = gate.validate(frame())
    assert result.success and result.failed == [] and result.evaluated == gate.expectations
    assert list(frame().columns) == COLUMNS


@pytest.mark.parametrize(
    ("changes", "expectation", "column"),
    [
        ({"n_tokens": (3, 900)}, "expect_column_values_to_be_between", "n_tokens"),
        ({"loss_tokens": (0, 0)}, "expect_column_values_to_be_between", "loss_tokens"),
        ({"record_id": (1, "r-0")}, "expect_column_values_to_be_unique", "record_id"),
        ({"text": (2, "mail me at bob@example.com")}, "expect_column_values_to_not_match_regex_list", "text"),
        ({"text": (2, "my ssn is 123-45-6789")}, "expect_column_values_to_not_match_regex_list", "text"),
        ({"text_hash": (1, f"{0:016x}")}, "expect_column_proportion_of_unique_values_to_be_between", "text_hash"),
        ({"text_chars": (0, 999)}, "expect_column_values_to_be_between", "text_chars"),
        ({"domain": (0, "format")}, "expect_column_values_to_be_in_set", "domain"),
        ({"kind": (0, "poem")}, "expect_column_values_to_be_in_set", "kind"),
        ({"source": (0, None)}, "expect_column_values_to_not_be_null", "source"),
    ],
)
def test_each_expectation_catches_its_fault(gate, changes, expectation, column):
    result = gate.validate(frame(**changes))
    assert not result.success
    assert {(f["expectation"], f.get("column")) for f in result.failed} >= {(expectation, column)}
    assert result.report["success"] is False and result.report["results"]  # the full GE report is kept


def test_domain_shares_outside_tolerance_fail(gate):
    domains = ["general"] * 7 + ["safety"]
    skewed = frame().assign(domain=domains, domain_share_dev=share_deviation(domains, TARGETS))
    failed = gate.validate(skewed).failed
    assert [f["column"] for f in failed] == ["domain_share_dev"]
    assert share_deviation(["a", "b", "a"], {"a": 0.5, "b": 0.5}) == [0.0, 0.0, 0.0]  # rounding allowance


def test_low_assistant_share_and_schema_drift_fail(gate):
    assert [f["expectation"] for f in gate.validate(frame().assign(loss_share=0.01)).failed] == [
        "expect_column_mean_to_be_between"]
    drift = gate.validate(frame().drop(columns=["line"]))
    assert "expect_table_columns_to_match_set" in {f["expectation"] for f in drift.failed}


def test_suites_are_registered_and_versioned():
    spec = SUITES.get("snapshot_batch")
    assert spec.key == "snapshot_batch@v1"
    with pytest.raises(Exception, match="did you mean 'snapshot_batch'"):
        SUITES.get("snapshot_bach")
