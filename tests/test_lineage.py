"""The lineage vocabulary and strict (release) mode."""

from __future__ import annotations

import pytest

from mlops.errors import StrictModeError
from mlops.lineage import IMAGE_TAG_ENV, Lineage, Tag, collect_lineage, enforce_release, image_tag


def lineage(**overrides) -> Lineage:
    values = dict(config_hash="c" * 64, image_tag="img:1", image_tag_mutable=False, git_commit="a" * 40,
                  git_dirty=False, code_version="0.1.0+pipeline1", seed=1)
    values.update(overrides)
    return Lineage(**values)


def test_pinned_image_tag_comes_from_environment_and_is_immutable(monkeypatch):
    monkeypatch.setenv(IMAGE_TAG_ENV, "ghcr.io/acme/mlops:1.2.3")
    assert image_tag() == ("ghcr.io/acme/mlops:1.2.3", False)


def test_unpinned_image_tag_is_derived_from_environment_and_mutable(monkeypatch):
    monkeypatch.delenv(IMAGE_TAG_ENV, raising=False)
    tag, mutable = image_tag()
    assert tag.startswith("local-") and len(tag) == len("local-") + 12 and mutable
    assert image_tag() == (tag, True)  # stable within one environment


def test_release_refuses_mutable_image_tag_and_says_why():
    with pytest.raises(StrictModeError, match="mutable.*Dockerfile"):
        enforce_release(lineage(image_tag_mutable=True), release=True)


def test_release_refuses_dirty_tree():
    with pytest.raises(StrictModeError, match="uncommitted changes"):
        enforce_release(lineage(git_dirty=True), release=True)


def test_experiments_may_run_from_a_dirty_tree_with_a_mutable_image():
    enforce_release(lineage(git_dirty=True, image_tag_mutable=True), release=False)


def test_release_accepts_pinned_image_and_clean_tree():
    enforce_release(lineage(), release=True)


def test_tags_use_only_the_vocabulary():
    tags = lineage(snapshot_id="snap-1", base_model_id="bm-1", base_model="tiny").as_tags()
    vocabulary = {str(t) for t in Tag}
    assert set(tags) <= vocabulary
    assert tags[Tag.SNAPSHOT_ID] == "snap-1" and tags[Tag.GIT_DIRTY] == "false"


def test_collected_lineage_has_commit_and_code_version():
    collected = collect_lineage("h" * 64, 7, base_model="tiny")
    assert len(collected.git_commit) == 40 or collected.git_commit == "unknown"
    assert "+pipeline" in collected.code_version and collected.seed == 7
