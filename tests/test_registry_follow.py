"""Serving follows the ledger's alias: switch on promotion and rollback, refuse a hand-moved alias."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class FakeServing:
    version: str


class FakeSlot:
    def __init__(self) -> None:
        self.current = None
        self.loaded = []

    def load_and_swap(self, model_dir, profile, version):
        assert (Path(model_dir) / "config.json").exists() and profile.chat_template_hash
        self.loaded.append(version)
        self.current = FakeServing(version)


@pytest.fixture
def two_versions(mlops_home, tiny_model, tmp_path):
    from mlops.tracking import init_experiment
    from registry.release import register
    from registry.testing import make_identities, training_run

    init_experiment("registry-test")
    who = make_identities()
    versions = [register(who["tina"], training_run(Path(tiny_model["path"]), tmp=tmp_path, variant=i), "bot")
                for i in (1, 2)]
    return who, versions


def test_follower_switches_on_promotion_and_back_on_rollback(two_versions):
    from registry.audit import model_state
    from registry.follow import Follower
    from registry.release import rollback
    from registry.testing import release_version

    who, (v1, v2) = two_versions
    follower = Follower("bot", "production", FakeSlot())
    assert follower.poll_once() is None  # nothing in production yet
    release_version(who, "bot", v1)
    assert follower.poll_once().version == v1
    assert follower.poll_once() is None  # no change, no reload
    release_version(who, "bot", v2, champion=(v1, model_state("bot").versions[v1].content_id))
    switch = follower.poll_once()
    assert (switch.version, switch.previous) == (v2, v1)
    rollback(who["bob"], "bot", "regression")
    assert follower.poll_once().version == v1
    assert follower.slot.loaded == [v1, v2, v1]


def test_follower_refuses_an_alias_moved_behind_the_registrys_back(two_versions, caplog):
    from mlops.tracking import client
    from registry.follow import Follower
    from registry.testing import release_version

    who, (v1, v2) = two_versions
    release_version(who, "bot", v1)
    follower = Follower("bot", "production", FakeSlot())
    follower.poll_once()
    from registry.transition import flush_display

    flush_display()  # the acts' own copies land first
    client().set_registered_model_alias("bot", "production", v2)  # the MLflow UI's pencil icon
    assert follower.poll_once() is None and follower.serving_version() == v1
    assert "moved outside the registry" in follower.refusals[-1]
    assert "REFUSED ALIAS MOVE" in caplog.text
