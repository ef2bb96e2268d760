"""The Data review page in Streamlit's AppTest: a signed-in reviewer draws a snapshot's sample, judges it and the
verdicts are stored by `mlops.data.review.store` (the CLI's function); a viewer cannot; text from the data is
shown as plain text; the version page says what it knows of its snapshot's review."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.testing import app_test, log_in, open_page
from registry.testing import PASSWORDS

EVIL = "<img src=x onerror=alert(1)> **loud** [click](http://evil.example)"


def texts(at, kind: str) -> list[str]:
    return [str(e.value) for e in getattr(at, kind)]


def read(at, kind: str) -> str:
    """The elements' text as a person reads it: Markdown escapes (`ui.md`) undone."""
    return "\n".join(re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", t) for t in texts(at, kind))


def signed_in(name: str):
    at = log_in(app_test(), name, PASSWORDS[name])
    assert not at.exception
    return at


@pytest.fixture
def snapshot(app_store, tiny_model):
    """A complete snapshot in the store's snapshot folder (written from token ids: no pipeline, under a second)."""
    from pathlib import Path

    from tokenizers import Tokenizer

    from mlops.data.format import write_snapshot

    tk = Tokenizer.from_file(str(Path(tiny_model["path"]) / "tokenizer.json"))
    rows = [("billing", "How do I read invoice 17? It shows a fee.", "The fee on invoice 17 is the late fee."),
            ("general", "Can I change my address?", "Yes, open Settings and edit the address."),
            ("general", "Where is my parcel?", "It left the depot this morning."),
            ("*odd*[x](y)", EVIL, "I cannot open links, sorry.")]
    samples = []
    for i, (domain, user, answer) in enumerate(rows * 2):
        prompt, reply = tk.encode(f"user: {user}\n").ids, tk.encode(f"assistant: {answer}").ids
        samples.append({"id": f"s{i}", "domain": domain, "input_ids": prompt + reply,
                        "loss_mask": [0] * len(prompt) + [1] * len(reply)})
    return write_snapshot({"train": samples}, seq_len=128,
                          extra={"base_model_ref": tiny_model["path"], "name": "app-review"})


def drawn(at, snapshot, n: int):
    at = open_page(at, "datareview", snapshot=snapshot.name)
    at.number_input(key="review_n").set_value(n)
    return at.button(key="review_draw").click().run()


def verdict_keys(at) -> list[str]:
    return sorted((r.key for r in at.radio), key=lambda k: int(k.rsplit("-", 1)[1]))


def test_a_reviewer_draws_judges_and_the_verdicts_are_stored_with_the_snapshot(snapshot):
    from mlops.data.review import review_status

    at = drawn(signed_in("alice"), snapshot, 4)
    assert not at.exception and "Drew 4 samples" in read(at, "success")
    keys = verdict_keys(at)
    assert len(keys) == 4
    for key in keys[:3]:
        at.radio(key=key).set_value("ok")
    at.radio(key=keys[3]).set_value("bad")
    at.text_input(key=keys[3].replace("-verdict-", "-reason-")).input("answer is vague")
    at = at.button(key="review_save").click().run()
    assert not at.exception
    assert "4/4 judged as alice (complete); 3 ok, 1 bad" in read(at, "success")
    status = review_status(snapshot)
    assert (status["judged"], status["ok"], status["bad"], status["complete"]) == (4, 3, 1, True)
    assert status["bad_reasons"] == {"answer is vague": 1} and status["reviewer"] == "alice"
    # The page shows the stored review, and the form comes back with the stored verdicts.
    assert "human review:** 4/4 judged (complete): 3 ok, 1 bad (25.0%); bad: answer is vague 1; by alice" in read(
        at, "markdown")
    assert [at.radio(key=k).value for k in verdict_keys(at)] == ["ok", "ok", "ok", "bad"]


def test_a_bad_verdict_without_a_reason_is_refused_and_nothing_is_stored(snapshot):
    from mlops.data.review import review_status

    at = drawn(signed_in("bob"), snapshot, 3)
    for key in verdict_keys(at):
        at.radio(key=key).set_value("bad")
    at = at.button(key="review_save").click().run()
    errors = texts(at, "error")
    assert errors and "bad" in errors[0] and "reason" in errors[0] and review_status(snapshot) is None


def test_a_viewer_sees_the_sample_but_may_not_draw_or_save(snapshot):
    from mlops.data.review import draw

    draw(snapshot, 4, 7)  # drawn with the CLI's function
    at = open_page(signed_in("vic"), "datareview", snapshot=snapshot.name)
    assert not at.exception
    assert at.button(key="review_draw").disabled and at.button(key="review_save").disabled
    assert "reads and changes nothing" in read(at, "caption")
    assert len(at.radio) == 4


def test_text_from_the_data_is_shown_as_plain_text_never_as_markdown(snapshot):
    at = drawn(signed_in("alice"), snapshot, 8)
    assert any(EVIL in t for t in texts(at, "code"))
    markdown = "\n".join(texts(at, "markdown"))
    assert "<img" not in markdown and "](http" not in markdown and "*odd*" not in markdown
    assert "\\*odd\\*\\[x\\]\\(y\\)" in markdown


def test_version_page_names_a_snapshot_this_store_does_not_hold(app_store):
    at = open_page(signed_in("vic"), "version", model="bot", version="4")
    assert not at.exception and not texts(at, "error")
    shown = read(at, "markdown")
    assert "**Human review:** unknown: snapshot snap-test is not in this project's snapshot store" in shown
    assert "**Acceptance** not measured" in shown


@pytest.mark.slow
def test_version_page_shows_the_acceptance_report_and_review_of_a_built_snapshot(app_store, tiny_model, tmp_path):
    """End to end: a real build (acceptance report in its manifest), its data run, a version trained on it, a
    review stored with the CLI's functions; the version page shows the figures and the verdicts."""
    import json

    from app.testing import EXPERIMENT
    from mlops.data.labelled_dedup import conversations
    from mlops.data.review import draw, store
    from mlops.data.testing import quick_build
    from mlops.lineage import Tag
    from mlops.tracking import MlflowTracker
    from registry.release import register
    from registry.testing import signed_in as identity
    from registry.testing import training_run

    built = quick_build(conversations(40, seed=3), base_model=tiny_model["path"], workdir=tmp_path)
    tracker = MlflowTracker.start(EXPERIMENT, attach_env_run=False,
                                  tags={Tag.STAGE: "data", Tag.SNAPSHOT_ID: built.snapshot_id})
    tracker.log_dict(built.manifest, "snapshot/manifest.json")
    tracker.close()
    path, items = draw(built.path, 3, seed=7, out=tmp_path / "sample.jsonl")
    path.write_text("".join(json.dumps({**item, "verdict": "bad" if i == 0 else "ok",
                                        "reason": "answer is vague" if i == 0 else ""}) + "\n"
                            for i, item in enumerate(items)))
    store(built.path, path, reviewer="ada")
    run_id = training_run(Path(tiny_model["path"]), tmp=tmp_path / "runs", variant=5, experiment=EXPERIMENT,
                          data_run_id=tracker.run_id)
    version = register(identity("tina"), run_id, "bot")

    at = open_page(signed_in("vic"), "version", model="bot", version=version)
    assert not at.exception and not texts(at, "error")
    shown = read(at, "markdown")
    accept = built.manifest["acceptance"]
    assert (f"**Acceptance {accept['verdict']['status']}**: rejected {accept['verdict']['rejected_share']:.1%} of "
            f"{accept['rejected']['rows_read']} rows read") in shown
    assert f"suggested max_seq_len {accept['sequence']['suggested_max_seq_len']}" in shown
    assert "**Human review:** 3/3 judged (complete): 2 ok, 1 bad (33.3%); bad: answer is vague 1; by ada" in shown
    assert any("tokenizer" in t and "tokens/word" in t for t in texts(at, "code"))
    reasons = [d.value for d in at.dataframe if "bad reason" in d.value.columns][0]
    assert reasons.to_dict("records") == [{"bad reason": "answer is vague", "samples": 1}]
