"""The sensitive-term blocklist filter: whole-word, Unicode-aware matching, CJK substrings, clear errors before any
record is processed, counts and quarantine in the build, and unchanged snapshot ids for configs without one."""

from __future__ import annotations

import json

import pytest

from mlops.config import canonical, config_hash
from mlops.data import blocklist as bl
from mlops.data.config import FilterConfig
from mlops.data.filters import run_filters
from mlops.data.labelled_dedup import conversations
from mlops.data.records import Record
from mlops.data.testing import chat, quick_build, quick_config
from mlops.errors import ConfigError


def compiled(*lines: str, case_sensitive: bool = False):
    pattern, _ = bl.compile_lines(list(lines), "list.txt", case_sensitive)
    return lambda text: pattern.search(bl.unicodedata.normalize("NFKC", text)) is not None


def test_terms_match_whole_words_only_never_inside_other_words():
    hit = compiled("ass", "secret project")
    assert hit("what an ass.") and hit("ASS!") and hit("the Secret   Project is late")
    assert not hit("a first-class passé classic") and not hit("assassin") and not hit("secret projection")


def test_word_boundaries_are_unicode_aware_and_text_is_nfkc_normalised():
    hit = compiled("naïve", "über")
    assert hit("so naïve, really") and hit("ÜBER alles") and not hit("naïveté") and not hit("überall")
    assert compiled("abc")("ＡＢＣ corp")  # fullwidth letters are the same letters


def test_cjk_terms_match_as_substrings():
    hit = compiled("敏感词", "バカ")
    assert hit("这是一个敏感词汇的例子") and hit("あいつはバカだ")


def test_regex_entries_and_case_sensitivity():
    assert compiled(r"re:pass(?:word|wd)\s*[:=]")("my PASSWD: hunter2")
    strict = compiled("Apple", case_sensitive=True)
    assert strict("Apple shares") and not strict("an apple a day")


def test_the_filter_returns_reason_blocklist_and_runs_first_when_not_listed(tmp_path):
    path = tmp_path / "terms.txt"
    path.write_text("# sensitive\nproject nightjar\n", encoding="utf-8")
    cfg = FilterConfig(blocklist=str(path))
    record = Record("r1", "s", 1, "general", "chat", chat("Tell me about Project Nightjar", "x")["messages"])
    assert run_filters(record, cfg) == (False, "blocklist")  # ahead of short_answer, which would also reject it
    clean = Record("r2", "s", 2, "general", "chat",
                   chat("Tell me about nightjars", "They are birds that hunt at dusk.")["messages"])
    assert run_filters(clean, cfg) == (True, "")


@pytest.mark.parametrize("content, problem", [
    (None, "does not exist"),
    ("# only a comment\n\n", "holds no term"),
    ("re:(unclosed\n", "bad regex"),
    ("re:a*\n", "matches the empty string"),
    (b"\xff\xfe\x00bad", "is not UTF-8"),
])
def test_a_bad_list_file_is_refused_naming_the_field_value_and_fix(tmp_path, content, problem):
    path = tmp_path / "terms.txt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        bl.load("terms.txt", path)
    message = str(err.value)
    assert "data.filters.blocklist" in message and "'terms.txt'" in message and problem in message
    assert "Fix:" in message


def test_no_blocklist_keeps_the_config_hash(tiny_model, tmp_path):
    plain = quick_config([tmp_path / "a.jsonl"], tiny_model["path"])
    explicit = quick_config([tmp_path / "a.jsonl"], tiny_model["path"], filters={"blocklist": None},
                            accept={"max_rejected_share": 0.5, "on_fail": "flag", "require_review": True})
    listed = quick_config([tmp_path / "a.jsonl"], tiny_model["path"], filters={"blocklist": "terms.txt"})
    assert config_hash(plain.data) == config_hash(explicit.data) != config_hash(listed.data)
    assert "blocklist" not in canonical(plain.data)["filters"] and "accept" not in canonical(plain.data)


def test_a_build_rejects_blocked_records_counts_and_quarantines_them(tiny_model, tmp_path, mlops_home):
    rows = conversations(24, seed=3)
    rows[5] = chat("Who runs Project Nightjar at the depot?", "The logistics team runs it from the north depot.")
    rows[9] = chat("Is this a classic ticket?", "Yes, the classical ticket is valid on the morning train.")
    terms = tmp_path / "terms.txt"
    terms.write_text("project nightjar\nclass\n", encoding="utf-8")
    result = quick_build(rows, base_model=tiny_model["path"], workdir=tmp_path,
                         filters={"blocklist": str(terms)}, accept={"on_fail": "flag"})
    m = result.manifest
    assert m["counters"]["filter.blocklist"] == 1  # "classic" and "classical" hold no listed word
    assert m["blocklist"]["entries"] == 2 and m["blocklist"]["rejected"] == 1
    lines = [json.loads(x) for x in (result.path / "quarantine" / "records.jsonl").read_text().splitlines()]
    assert [x["reason"] for x in lines if x["reason"] == "blocklist"] == ["blocklist"]


def test_a_missing_list_fails_the_build_before_any_record(tiny_model, tmp_path, mlops_home, monkeypatch):
    import mlops.data.clean as clean

    monkeypatch.setattr(clean, "clean_chunk", lambda *a: pytest.fail("a record was processed"))
    with pytest.raises(ConfigError, match="data.filters.blocklist 'nope.txt' does not exist"):
        quick_build(conversations(4, seed=1), base_model=tiny_model["path"], workdir=tmp_path,
                    filters={"blocklist": "nope.txt"})


@pytest.mark.slow
def test_a_private_ray_build_with_a_blocklist_is_the_local_build(tiny_model, tmp_path, mlops_home):
    """Ray workers get the compiled list, not its path; the snapshot and its acceptance report are the local ones."""
    rows = conversations(300, seed=3)
    rows[7] = chat("Who runs Project Nightjar at the depot?", "The logistics team runs it from the north depot.")
    rows[200] = chat("这是敏感词汇吗？", "这个问题里有一个敏感词，需要被过滤掉才可以。")
    (tmp_path / "terms.txt").write_text("project nightjar\n敏感词\n", encoding="utf-8")
    built = {ex: quick_build(rows, base_model=tiny_model["path"], workdir=tmp_path, executor=ex, workers=2,
                             filters={"blocklist": str(tmp_path / "terms.txt"), "languages": []},
                             output_dir=str(tmp_path / ex)) for ex in ("local", "ray")}
    local, ray = built["local"], built["ray"]
    assert local.snapshot_id == ray.snapshot_id and local.manifest["counters"]["filter.blocklist"] == 2
    assert local.manifest["acceptance"] == ray.manifest["acceptance"]
