"""Preference-pair snapshots (data.record_type: preference): the same build as chat records, written as the trainer
reads them (rows 2i chosen, 2i+1 rejected, the prompt masked), with pairs checked, deduplicated and gated as pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlops.data.batches import GateError
from mlops.data.format import PAIR_ROLES, RECORD_TYPE_PREFERENCE, SPLITS, SnapshotReader, record_type
from mlops.data.labelled_dedup import conversations
from mlops.data.records import MixedRecordTypes, RecordError, normalise, to_record
from mlops.data.testing import chat, quick_build

REPO = Path(__file__).resolve().parent.parent
EMAIL, PHONE, IBAN = "jane.doe@example.com", "+44 20 7946 0958", "GB82 WEST 1234 5698 7654 32"


def pairs(n: int, seed: int = 1, domain: str = "general") -> list[dict]:
    """Distinct support questions with their answer as chosen and another conversation's answer as rejected."""
    asked, other = conversations(n, seed), conversations(n, seed + 100)
    return [{"prompt": a["messages"][0]["content"], "chosen": a["messages"][1]["content"],
             "rejected": b["messages"][1]["content"], "domain": domain, "provenance": {"case": f"good-{i}"}}
            for i, (a, b) in enumerate(zip(asked, other, strict=True))]


def long_answer(seed: int, words: int) -> str:
    text = " ".join(c["messages"][1]["content"] for c in conversations(40, seed))
    return " ".join(text.split()[:words])


def special_pairs() -> list[dict]:
    base = pairs(6, seed=50)
    dup_prompt = {**base[0], "rejected": "Please restart the router and wait a day before you write to us again.",
                  "provenance": {"case": "same-prompt-and-chosen"}}
    other_chosen = {**base[1], "chosen": "Sorry for the trouble with that order; a technician can visit on Thursday "
                    "morning, and I have noted the steps you already tried.", "provenance": {"case": "same-rejected"}}
    return [
        {**base[0], "provenance": {"case": "original-0"}}, {**base[1], "provenance": {"case": "original-1"}},
        dup_prompt, other_chosen,
        {**base[2], "rejected": base[2]["chosen"] + "  ", "provenance": {"case": "identical"}},
        {**base[3], "chosen": "", "provenance": {"case": "empty-chosen"}},
        {**base[4], "rejected": " \n", "provenance": {"case": "empty-rejected"}},
        {**base[5], "rejected": long_answer(9, 420), "provenance": {"case": "too-many-tokens"}},
        {**pairs(1, seed=60)[0], "rejected": "x" + long_answer(11, 900), "provenance": {"case": "too-long"}},
        {"messages": [{"role": "system", "content": "You are the support agent of a broadband provider."},
                      {"role": "user", "content": f"Hello, my email is {EMAIL} and my router shows a red light."},
                      {"role": "assistant", "content": "Sorry to hear that. Does the red light blink or stay on?"},
                      {"role": "user", "content": "It stays on since this morning, what should I do now?"}],
         "chosen": f"A steady red light means the line is down. We will call you on {PHONE} within the hour to "
                   "book a technician for you.",
         "rejected": f"Please pay the repair fee of forty pounds to {IBAN} and we will have a look at it next week.",
         "domain": "general", "source": "hand-written", "provenance": {"case": "pii", "request_id": "req-7"}},
    ]


@pytest.fixture(scope="module")
def built(tiny_model, tmp_path_factory):
    """One preference build (workers=1) of good pairs and one of every special case, overlong=truncate on."""
    folder = tmp_path_factory.mktemp("pairs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLOPS_HOME", str(folder / "home"))
        records = pairs(30) + special_pairs()
        result = quick_build(records, base_model=tiny_model["path"], workdir=folder, name="pairs.jsonl",
                             record_type="preference", overlong="truncate", batch_size=16, shard_size=8,
                             output_dir=str(folder / "snapshots"))
    return {"result": result, "records": records, "folder": folder}


def rows_of(path: Path, split: str) -> list[tuple[dict, object]]:
    reader = SnapshotReader(path, split)
    return [(reader.meta(i), reader.get(i)) for i in range(len(reader))]


def decoder(tiny_model):
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(Path(tiny_model["path"]) / "tokenizer.json"))

    def decode(ids) -> str:
        return tk.decode([int(i) for i in ids], skip_special_tokens=False)

    return decode


def quarantined(path: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in (path / "quarantine" / "records.jsonl").read_text().splitlines()]
    return {row.get("provenance", {}).get("case"): row for row in rows}


# --------------------------------------------------------------------------- the contract with the trainer


def test_a_pair_build_writes_chosen_then_rejected_rows_of_one_split_with_the_prompt_masked(built, tiny_model):
    result = built["result"]
    manifest = result.manifest
    assert manifest["record_type"] == RECORD_TYPE_PREFERENCE and record_type(manifest) == "preference"
    decode = decoder(tiny_model)
    by_case = {r["provenance"]["case"]: r for r in built["records"]}
    pairs_seen = 0
    for split in SPLITS:
        rows = rows_of(result.path, split)
        assert len(rows) % 2 == 0
        index = json.loads((result.path / split / "index.json").read_text())
        assert all(shard["count"] % 2 == 0 for shard in index["shards"])  # no shard ends inside a pair
        for (meta_c, chosen), (meta_r, rejected) in zip(rows[::2], rows[1::2], strict=True):
            pair = meta_c["pair"]
            assert (meta_c["id"], meta_r["id"]) == (f"{pair}/chosen", f"{pair}/rejected") and meta_r["pair"] == pair
            assert (meta_c["role"], meta_r["role"]) == PAIR_ROLES and meta_c["provenance"] == meta_r["provenance"]
            start_c, start_r = int(chosen.loss_mask.argmax()), int(rejected.loss_mask.argmax())
            assert start_c == start_r > 0  # the same rendered prompt, masked, then the answer
            assert (chosen.input_ids[:start_c] == rejected.input_ids[:start_r]).all()
            case = by_case[meta_c["provenance"]["case"]]
            if "prompt" in case:
                trained_c = decode(chosen.input_ids[chosen.loss_mask.astype(bool)])
                trained_r = decode(rejected.input_ids[rejected.loss_mask.astype(bool)])
                assert case["chosen"].strip() in trained_c and case["prompt"] not in trained_c
                assert case["rejected"].strip() in trained_r and case["prompt"] in decode(chosen.input_ids[:start_c])
            pairs_seen += 1
    assert manifest["pairs"]["total"] == pairs_seen == manifest["counts"]["per_split"]["train"]["pairs"] + \
        manifest["counts"]["per_split"]["validation"]["pairs"]
    assert manifest["pairs"]["per_source"] == {str(built["folder"] / "pairs.jsonl"): pairs_seen}
    assert manifest["counts"]["samples"]["train"] == 2 * manifest["pairs"]["per_split"]["train"]
    assert manifest["gate"]["suite"] == "preference_batch@v1" and manifest["gate"]["passed"] >= 2


def test_a_multi_turn_prompt_trains_only_on_the_answer_not_on_earlier_assistant_turns(built, tiny_model):
    decode = decoder(tiny_model)
    for split in SPLITS:
        for meta, sample in rows_of(built["result"].path, split):
            if meta["provenance"].get("case") == "pii":
                trained = decode(sample.input_ids[sample.loss_mask.astype(bool)])
                assert "Does the red light blink" not in trained
                assert "Does the red light blink" in decode(sample.input_ids[sample.attention_mask.astype(bool)])
                return
    pytest.fail("the multi-turn pair is missing")


def test_pii_is_scrubbed_in_the_prompt_the_chosen_and_the_rejected_answer(built, tiny_model):
    decode = decoder(tiny_model)
    texts = {meta["role"]: decode(sample.input_ids[sample.attention_mask.astype(bool)])
             for split in SPLITS for meta, sample in rows_of(built["result"].path, split)
             if meta["provenance"].get("case") == "pii"}
    assert set(texts) == {"chosen", "rejected"}
    for text in texts.values():
        assert EMAIL not in text and "[EMAIL]" in text  # the prompt, in both rows
    assert PHONE not in texts["chosen"] and "[PHONE]" in texts["chosen"]
    assert "GB82" not in texts["rejected"] and "[IBAN]" in texts["rejected"]
    assert built["result"].manifest["counters"]["pii.iban"] >= 1


def test_identical_empty_and_overlong_pairs_are_set_aside_alone_with_their_reasons(built):
    result = built["result"]
    counters = result.manifest["counters"]
    for reason in ("identical_pair", "empty_chosen", "empty_rejected", "too_long"):
        assert counters[f"filter.{reason}"] == 1, reason
    assert counters["record.too_many_tokens"] == 1 and counters.get("record.truncated", 0) == 0
    lines = quarantined(result.path)
    assert lines["identical"]["reason"] == "identical_pair" and lines["identical"]["kind"] == "pair"
    assert (lines["empty-chosen"]["reason"], lines["empty-rejected"]["reason"]) == ("empty_chosen", "empty_rejected")
    overlong = lines["too-many-tokens"]  # never truncated: one side over seq_len sets the whole pair aside
    assert overlong["reason"] == "too_many_tokens" and overlong["rejected_tokens"] > overlong["seq_len"] == 256
    assert overlong["chosen_tokens"] <= 256
    assert lines["too-long"]["stage"] == "filter" and lines["too-long"]["reason"] == "too_long"
    assert [m["role"] for m in overlong["excerpt"]][-2:] == ["chosen", "rejected"]


def test_pairs_are_deduplicated_on_prompt_and_chosen_not_on_what_they_reject(built):
    result = built["result"]
    lines = quarantined(result.path)
    dup = lines["same-prompt-and-chosen"]
    assert dup["stage"] == "dedup" and dup["reason"] == "exact"
    kept = {meta["provenance"]["case"] for split in SPLITS for meta, _ in rows_of(result.path, split)}
    assert dup["duplicate_of"] == next(m["pair"] for split in SPLITS for m, _ in rows_of(result.path, split)
                                       if m["provenance"]["case"] == "original-0")
    assert {"same-rejected", "original-1"} <= kept  # same prompt and rejected, other chosen: a pair of its own


def test_the_gate_refuses_a_batch_whose_pairs_say_the_same_words(tiny_model, tmp_path, mlops_home):
    echo = [{**p, "rejected": p["chosen"].upper().replace(".", "!")} for p in pairs(12, seed=3)]
    with pytest.raises(GateError, match=r"preference_batch@v1: .*expect_column_mean_to_be_between on 'identical'") \
            as err:
        quick_build(echo, base_model=tiny_model["path"], workdir=tmp_path, record_type="preference")
    kept = Path(str(err.value).split("The GE report and the batch are in ")[1].split(". Fix:")[0])
    refused = [json.loads(line) for line in (kept / "records.jsonl").read_text().splitlines()]
    assert len(refused) == 12 and all(r["identical"] == 1 and r["kind"] == "pair" for r in refused)


def test_the_preference_suite_checks_length_ratio_and_domain_shares():
    import pandas as pd

    from mlops.data.gate import PAIR_COLUMNS, SUITES, GateParams, validate_batch

    assert SUITES.get("preference_batch").key == "preference_batch@v1"
    frame = pd.DataFrame({
        "record_id": ["r-1", "r-2", "r-3", "r-4"], "source": ["s"] * 4, "line": [1, 2, 3, 4],
        "domain": ["general"] * 4, "kind": ["pair"] * 4, "text_chars": [300] * 4,
        "text_hash": ["a", "b", "c", "d"], "n_tokens": [80] * 4, "loss_tokens": [40] * 4, "loss_share": [0.5] * 4,
        "truncated": [0] * 4, "domain_share_dev": [0.0] * 4, "chosen_chars": [100] * 4, "rejected_chars": [100] * 4,
        "length_ratio": [1.0] * 4, "identical": [0] * 4,
    })[PAIR_COLUMNS]
    params = GateParams(max_dup_ratio=0.01, min_loss_share=0.05, tolerance=0.05, max_identical_share=0.05,
                        min_length_ratio=0.2, max_length_ratio=5.0, domains=["general"])
    assert validate_batch("preference_batch", params, frame).success
    verbose = frame.assign(length_ratio=[8.0, 9.0, 7.5, 1.0])  # chosen answers many times longer
    failed = validate_batch("preference_batch", params, verbose).failed
    assert [(f["expectation"], f["column"]) for f in failed] == [("expect_column_median_to_be_between",
                                                                  "length_ratio")]
    elsewhere = frame.assign(domain=["general", "billing", "billing", "billing"])
    failed = validate_batch("preference_batch", params, elsewhere).failed
    assert ("expect_column_values_to_be_in_set", "domain") in [(f["expectation"], f["column"]) for f in failed]


def test_a_review_draw_shows_a_pair_whole(built):
    from mlops.data.review import draw

    folder = built["folder"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLOPS_HOME", str(folder / "home"))
        _, items = draw(built["result"].path, 6, seed=1, out=folder / "review.jsonl")
    assert len(items) == 6 and all(i["sample_id"].endswith("/chosen") for i in items)
    for item in items:
        assert item["rejected_trained_on"] and item["rejected_trained_on"] != item["trained_on"]


# --------------------------------------------------------------------------- one snapshot on any executor


def test_sharded_workers_give_the_same_preference_snapshot_as_one_worker(built, tiny_model, tmp_path, monkeypatch):
    from mlops.data import partitions

    monkeypatch.setenv("MLOPS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(partitions, "PARTITION_BYTES", 4096)  # the source cut into several partitions
    source = built["folder"] / "pairs.jsonl"
    from mlops.data.format import file_sha256

    assert len(partitions.plan_partitions([{"name": "p", "path": source, "format": "jsonl",
                                            "sha256": file_sha256(source)}])) >= 3
    # the same source file (its path is in every row's meta), another snapshot root
    sharded = quick_build(built["records"], base_model=tiny_model["path"], workdir=built["folder"], name="pairs.jsonl",
                          record_type="preference", overlong="truncate", batch_size=16, shard_size=8, workers=2,
                          output_dir=str(tmp_path / "snapshots"))
    assert sharded.snapshot_id == built["result"].snapshot_id
    assert sharded.manifest["counters"] == built["result"].manifest["counters"]


@pytest.mark.slow
def test_ray_gives_the_same_preference_snapshot_as_local(built, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("MLOPS_HOME", str(tmp_path / "home"))
    on_ray = quick_build(built["records"], base_model=tiny_model["path"], workdir=built["folder"], name="pairs.jsonl",
                         record_type="preference", overlong="truncate", batch_size=16, shard_size=8, workers=2,
                         executor="ray", output_dir=str(tmp_path / "snapshots"))
    assert on_ray.snapshot_id == built["result"].snapshot_id
    assert on_ray.manifest["counters"] == built["result"].manifest["counters"]


def test_a_rebuild_of_the_same_pairs_is_a_noop(built, tiny_model):
    folder = built["folder"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLOPS_HOME", str(folder / "home"))
        again = quick_build(built["records"], base_model=tiny_model["path"], workdir=folder, name="pairs.jsonl",
                            record_type="preference", overlong="truncate", batch_size=16, shard_size=8,
                            output_dir=str(folder / "snapshots"))
    assert again.noop and again.snapshot_id == built["result"].snapshot_id


# --------------------------------------------------------------------------- bad input and config


def test_a_chat_record_in_a_preference_build_stops_it_naming_the_file_the_value_and_the_fix(tiny_model, tmp_path,
                                                                                          mlops_home):
    rows = pairs(4) + [chat("Where is my parcel? It was due on Friday.", "It left the depot this morning.")]
    with pytest.raises(MixedRecordTypes, match=r"records.jsonl, line 5: a chat record in a preference build "
                                               r"\(data.record_type=preference\).*Fix: move chat records"):
        quick_build(rows, base_model=tiny_model["path"], workdir=tmp_path, record_type="preference",
                    on_bad_record="skip")
    with pytest.raises(MixedRecordTypes, match=r"line 2: a preference pair \(chosen/rejected\) in a chat build "
                                               r"\(data.record_type=chat\). Fix: set data.record_type: preference"):
        quick_build(rows[-1:] + pairs(1), base_model=tiny_model["path"], workdir=tmp_path, name="chat.jsonl")


@pytest.mark.parametrize(("row", "code", "field"), [
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
      "chosen": "a", "rejected": "b"}, "role_order", "messages[1].role"),
    ({"prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}], "chosen": "a", "rejected": "b"},
     "unknown_shape", ""),
    ({"prompt": "Hi", "chosen": ["a"], "rejected": "b"}, "wrong_type", "chosen"),
    ({"prompt": "Hi", "chosen": "a"}, "missing_field", "rejected"),
    ({"prompt": "Hi", "chosen": "a", "rejected": "b", "provenance": "req-1"}, "wrong_type", "provenance"),
])
def test_rows_that_are_no_pair_are_bad_input_with_a_reason(row, code, field):
    with pytest.raises(RecordError) as err:
        to_record(row, "pairs.jsonl", 1, "general")
    assert (type(err.value).code, err.value.field) == (code, field)


def test_a_pair_row_becomes_prompt_turns_then_chosen_and_rejected_with_its_provenance():
    record = to_record({"prompt": "Where is my parcel?", "chosen": "It arrives today.", "rejected": "No idea.",
                        "source": "harvest", "provenance": {"request_id": "req-1"}}, "p.jsonl", 3, "support")
    assert record.kind == "pair" and [m["role"] for m in record.messages] == ["user", "chosen", "rejected"]
    assert record.provenance == {"request_id": "req-1", "source": "harvest"} and record.domain == "support"
    assert normalise({"messages": [{"role": "user", "content": "Hi"}]})[0] == "chat"  # chats read as before
    from mlops.data.pairs import check_pair

    assert check_pair(record) == (True, "")
    assert check_pair(to_record({"prompt": " ", "chosen": "a", "rejected": "b"}, "p", 1, "g")) == (False,
                                                                                                 "empty_prompt")


def test_preference_config_refuses_what_would_split_pairs_and_keeps_every_chat_config_hash(tiny_model):
    from mlops.config import canonical, load_config, validate_config
    from mlops.errors import ConfigError

    def cfg(**data):
        return validate_config({"base_model": str(tiny_model["path"]),
                                "data": {"sources": [{"path": "p.jsonl"}], **data}})

    for data, message in (({"pack": True}, "data.pack: false"), ({"shard_size": 17}, "data.shard_size: 18"),
                          ({"mix": {"history": {"snapshot": "snap-1"}}}, "data.dedup.against_snapshots")):
        with pytest.raises((ConfigError, ValueError), match=message.replace(".", r"\.")):
            cfg(record_type="preference", **data)
    with pytest.raises((ConfigError, ValueError), match="data.pairs is set but data.record_type is chat"):
        cfg(pairs={"max_identical_share": 0.5})
    with pytest.raises((ConfigError, ValueError), match="max_identical_sharee"):
        cfg(record_type="preference", pairs={"max_identical_sharee": 0.5})
    sample = load_config(REPO / "configs" / "data" / "sample.yaml", [])
    assert not {"record_type", "pairs"} & set(canonical(sample.data))  # every existing config keeps its hash
    assert canonical(cfg(record_type="preference").data)["record_type"] == "preference"


def test_the_sample_pairs_config_builds_a_preference_snapshot(tiny_model, tmp_path, mlops_home):
    from mlops.config import load_config
    from mlops.data.build import build_snapshot
    from mlops.tracking import MemoryTracker

    config = REPO / "configs" / "data" / "pairs-sample.yaml"
    cfg = load_config(config, [f"base_model={tiny_model['path']}", f"data.output_dir={tmp_path / 'snapshots'}",
                               f"data.sources=[{{path: {REPO / 'configs/data/pairs-sample.jsonl'}, domain: domain}}]",
                               "data.decontam.eval_sets=[]"])
    result = build_snapshot(cfg, MemoryTracker())
    assert result.manifest["record_type"] == "preference"
    assert result.manifest["counters"]["filter.identical_pair"] == 1
    assert result.manifest["pairs"]["total"] == 13
