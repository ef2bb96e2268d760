"""Strings anyone with MLflow access (or a comment box) controls are shown as text on every page: no link, no
image, no HTML, no emphasis; the Ledger page shows no password hash or key material; the session holds the
unlocked signer and ends when the ledger's key for that user changes."""

from __future__ import annotations

import pytest

from app.testing import app_test, log_in, open_page
from registry.testing import PASSWORDS

PAYLOAD = "**bold** [link](http://evil.example) <img src=x onerror=alert(1)>"


@pytest.fixture(autouse=True)
def _fresh_anchor():
    """Each test gets a fresh copy of the same seeded ledger: the head a test before verified (kept in this
    process) must not make the copy look cut off."""
    from registry import trust

    trust._MEMORY.clear()
    yield
    trust._MEMORY.clear()


def rendered(at) -> str:
    """Every Markdown-bearing element of the page, rendered as CommonMark with raw HTML allowed (what a browser
    would get if Streamlit passed the source through)."""
    from markdown_it import MarkdownIt

    renderer = MarkdownIt("commonmark", {"html": True})
    sources = [str(e.value) for kind in ("markdown", "caption", "success", "error", "warning", "info", "title",
                                         "header", "subheader") for e in getattr(at, kind)]
    return "\n".join(renderer.render(s) for s in sources)


def assert_literal(html: str) -> None:
    assert "<a " not in html and "<img" not in html and "<strong>bold" not in html, html
    assert "**bold** [link](http://evil.example) &lt;img src=x onerror=alert(1)&gt;" in html, html


def logged_in(name: str):
    at = log_in(app_test(), name, PASSWORDS[name])
    assert not at.exception and at.title[0].value == "Models"
    return at


def test_a_hostile_tag_run_name_and_reason_render_as_text_on_the_version_page(app_store):
    from mlops.lineage import Tag
    from mlops.model_refs import describe
    from mlops.tracking import client
    from registry.release import override
    from registry.testing import signed_in

    run_id = describe("models:/bot/2").run_id
    client().set_tag(run_id, "mlflow.runName", PAYLOAD)
    client().set_model_version_tag("bot", "2", Tag.IMAGE_TAG, PAYLOAD)
    override(signed_in("admin"), "bot", "2", "eval", PAYLOAD)
    at = open_page(logged_in("vic"), "version", model="bot", version="2")
    assert not at.exception, [e.value for e in at.exception]
    html = rendered(at)
    assert_literal(html)
    assert html.count("&lt;img src=x") >= 3  # the run name, the image tag and the override reason
    assert "http://evil.example" not in [link.url for link in at.get("page_link")]


def test_a_hostile_comment_renders_as_text_on_the_approvals_page(app_store):
    from registry.release import decide, request
    from registry.testing import signed_in

    decide(signed_in("bob"), "bot", "4", "ok", approve=False)
    request(signed_in("tina"), "bot", "4", "production", PAYLOAD)
    at = open_page(logged_in("vic"), "approvals")
    assert not at.exception
    assert_literal(rendered(at))


def test_the_escape_keeps_plain_text_and_code_spans_literal():
    from markdown_it import MarkdownIt

    from app.ui import code, md

    renderer = MarkdownIt("commonmark", {"html": True})
    assert renderer.render(md("bot v2: 3.5% better (refunds)")).strip() == "<p>bot v2: 3.5% better (refunds)</p>"
    assert renderer.render(md(PAYLOAD)).count("<") == 2  # <p> and </p>: everything else is text
    assert renderer.render(code("a`b <img src=x>")).strip() == "<p><code>a`b &lt;img src=x&gt;</code></p>"


def test_the_ledger_page_shows_no_password_hash_or_key_material(app_store):
    from app.ui import REDACTED, redacted

    old_user_entry = {"action": "user_add", "evidence": {"user": "eve", "role": "viewer", "public_key": "ab12",
                      "password_hash": "$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA",
                      "key_file": {"kdf": {"name": "argon2id"}, "sealed": "00ff"},
                      "note": "-----BEGIN PRIVATE KEY-----"}}
    shown = redacted(old_user_entry)["evidence"]
    assert shown["public_key"] == "ab12" and shown["user"] == "eve"
    assert shown["password_hash"] == shown["note"] == shown["key_file"]["sealed"] == REDACTED
    at = open_page(logged_in("vic"), "ledger")
    assert not at.exception
    page = "\n".join([str(c.value) for c in at.code] + [d.value.to_csv() for d in at.dataframe]
                     + [str(m.value) for m in at.markdown])
    for secret in ("$argon2", "PRIVATE KEY", "sealed", "password_hash", PASSWORDS["vic"]):
        assert secret not in page, secret


def test_the_session_holds_the_signer_and_ends_when_the_users_key_changes(app_store):
    from app.auth import SESSION_KEY

    at = logged_in("bob")
    info = at.session_state[SESSION_KEY]
    assert info["signer"].name == "bob" and info["signer"].public_key
    assert info["signer"].public_key not in "\n".join(str(m.value) for m in at.markdown)
    # The ledger now names another key for bob (rotated or revoked): the session ends at the next interaction.
    info["signer"] = type(info["signer"])("bob", "00" * 32, b"\0" * 32)
    at.run()
    assert at.title[0].value == "Release approvals"
    assert any("rotated or revoked" in str(i.value) for i in at.info)
