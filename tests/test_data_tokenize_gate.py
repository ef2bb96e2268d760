"""Offline tokenization (assistant-only loss masks) and the Great Expectations batch gate."""

from __future__ import annotations

import pandas as pd
import pytest

from mlops.data.checks import RecordPolicy, check_record
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


AWKWARD_TEXTS = ["Unplug the router.", "  leading and  double  spaces\n\nand blank lines\t", "Café déjà vu — “quotes”",
                 "携帯は080-1234-5678です", "emoji 🙂👍🏽 and zero\u200bwidth", "<|im_end|> typed by a user", ""]


def test_the_direct_tokenizer_path_gives_the_same_ids_offsets_and_counts_as_transformers(tok):
    """The build calls the Rust tokenizer directly (speed); it must agree with the transformers wrapper that
    training and serving use, special-token look-alikes and Unicode included."""
    assert tok.backend is not None  # the tiny model has a fast tokenizer: the direct path is the one measured
    for text in AWKWARD_TEXTS:
        wrapped = tok.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = tok.ids_and_offsets(text)
        assert list(ids) == wrapped["input_ids"] and [tuple(o) for o in offsets] == [tuple(o) for o in
                                                                                 wrapped["offset_mapping"]]
    assert tok.count(AWKWARD_TEXTS) == [len(i) for i in tok.tok(AWKWARD_TEXTS, add_special_tokens=False)["input_ids"]]
    record = chat(("user", AWKWARD_TEXTS[3]), ("assistant", AWKWARD_TEXTS[4]), ("user", AWKWARD_TEXTS[5]),
                  ("assistant", AWKWARD_TEXTS[2]))
    ids, mask = tok.encode(record)
    full = tok.tok.apply_chat_template(record.messages, tokenize=False)
    assert ids.tolist() == tok.tok(full, add_special_tokens=False)["input_ids"]
    assert masked_spans(tok, ids, mask) == [AWKWARD_TEXTS[4] + "<|im_end|>\n", AWKWARD_TEXTS[2] + "<|im_end|>\n"]


def test_tokenizer_info_hashes_vocab_and_template(tiny_model):
    info = tokenizer_info(tiny_model["path"], "tiny", tiny_model["id"])
    assert len(info["vocab_hash"]) == 64 and len(info["chat_template_hash"]) == 64
    assert info["pad_id"] is not None and info["vocab_size"] > 1000
    assert info == tokenizer_info(tiny_model["path"], "tiny", tiny_model["id"])


PARAMS = GateParams(max_dup_ratio=0.0, min_loss_share=0.1, tolerance=0.05, max_truncated_share=0.25,
                    domains=["general", "safety"])
TARGETS = {"general": 0.5, "safety": 0.5}


def frame(n: int = 8, **changes) -> pd.DataFrame:
    domains = ["general", "safety"] * (n // 2)
    rows = {
        "record_id": [f"r-{i}" for i in range(n)], "source": ["s.jsonl"] * n, "line": list(range(1, n + 1)),
        "domain": domains, "kind": ["chat"] * n, "text_chars": [25] * n, "text_hash": [f"{i:016x}" for i in range(n)],
        "n_tokens": [20] * n, "loss_tokens": [8] * n, "loss_share": [0.4] * n, "truncated": [0] * n,
        "domain_share_dev": share_deviation(domains, TARGETS),
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
        ({"record_id": (1, "r-0")}, "expect_column_values_to_be_unique", "record_id"),
        ({"text_hash": (1, f"{0:016x}")}, "expect_column_proportion_of_unique_values_to_be_between", "text_hash"),
        ({"domain": (0, "format")}, "expect_column_values_to_be_in_set", "domain"),
        ({"kind": (0, "poem")}, "expect_column_values_to_be_in_set", "kind"),
        ({"source": (0, None)}, "expect_column_values_to_not_be_null", "source"),
        ({"truncated": (slice(0, 3), 1)}, "expect_column_mean_to_be_between", "truncated"),
    ],
)
def test_each_expectation_catches_its_fault(gate, changes, expectation, column):
    result = gate.validate(frame(**changes))
    assert not result.success
    assert {(f["expectation"], f.get("column")) for f in result.failed} >= {(expectation, column)}
    assert result.report["success"] is False and result.report["results"]  # the full GE report is kept


def test_one_records_bounds_are_not_the_suites_business(gate):
    """Token bounds and loss tokens are per-record checks now: the suite judges the batch, not one row."""
    odd = frame(n_tokens=(3, 9000), loss_tokens=(2, 0), text_chars=(0, 999999))
    assert gate.validate(odd).success
    assert "text" not in COLUMNS  # a GE report never quotes a record


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
    assert spec.key == "snapshot_batch@v2"
    with pytest.raises(Exception, match="did you mean 'snapshot_batch'"):
        SUITES.get("snapshot_bach")


# --------------------------------------------------------------------------- per-record checks


@pytest.fixture(scope="module")
def loaded(tiny_model):
    from mlops.data import tokenize

    tokenize.init_worker(tiny_model["path"])
    return tokenize.tokenizer()


def policy(**kw) -> RecordPolicy:
    return RecordPolicy(**{"seq_len": 64, "min_tokens": 4, "overlong": "drop", "excerpt_chars": 80, **kw})


def test_overlong_record_is_dropped_or_truncated_alone(loaded):
    long = chat(("user", "Why? " * 5), ("assistant", "Because the router restarts at night. " * 30))
    dropped = check_record(0, long, policy())
    assert dropped.reason == "too_many_tokens" and dropped.detail["n_tokens"] > 64 and dropped.ids is None
    assert len(dropped.excerpt[1]["content"]) < 120 and dropped.excerpt[1]["chars"] > 1000
    cut = check_record(0, long, policy(overlong="truncate"))
    assert cut.reason == "" and cut.truncated and len(cut.ids) == 64 and cut.mask.any()
    answer_after_cut = chat(("user", "Tell me everything. " * 40), ("assistant", "No."))
    assert check_record(0, answer_after_cut, policy(overlong="truncate")).reason == "no_loss_tokens_after_truncation"


def test_template_failure_rejects_the_record_not_the_build(loaded, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("Conversation roles must alternate user/assistant/user/assistant/...")

    monkeypatch.setattr(loaded.tok, "apply_chat_template", broken)
    checked = check_record(3, chat(("user", "Hi"), ("assistant", "Hello there, how can I help?")), policy())
    assert (checked.position, checked.reason) == (3, "template_error") and "ValueError" in checked.detail["error"]


def test_too_few_tokens(loaded):
    assert check_record(0, chat(("user", "Hi"), ("assistant", "Yes.")), policy(min_tokens=60)).reason == "too_few_tokens"


def test_a_text_only_build_tokenizes_with_tokenizer_json_and_never_loads_transformers(tiny_model, tmp_path):
    """transformers costs seconds to import and load; only chat templates need it (datatrove's peer loads
    tokenizer.json alone, benchmarks/bench_data_peer.py). The ids are those of tokenizer.json, whose hash the
    snapshot's tokenizer hash covers."""
    import json
    import os
    import subprocess
    import sys

    code = ("import sys, json; from pathlib import Path; from mlops.data.testing import quick_build; "
            f"r = quick_build([{{'text': f'plain text {{i}} on returns'}} for i in range(40)], "
            f"base_model={str(tiny_model['path'])!r}, workdir=Path({str(tmp_path)!r})); "
            "print(json.dumps([r.snapshot_id, 'transformers' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MLOPS_HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stderr[-3000:]
    snapshot, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert snapshot.startswith("snap-") and loaded is False
