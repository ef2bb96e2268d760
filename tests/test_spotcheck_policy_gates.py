"""The release policy turns gates on: the shadow gate's threshold on the stored shadow report, and policy file
errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mlops.errors import ConfigError
from registry.transition import RefusedError


def policy(tmp: Path, **registry) -> Path:
    path = tmp / "release.yaml"
    path.write_text(yaml.safe_dump({"registry": registry}))
    return path


@pytest.fixture
def reg(mlops_home, tiny_model, tmp_path, monkeypatch):
    """v1 in production; v2 approved for production with eval evidence; the policy requires 5 shadowed requests.
    Shadow reports are stored by alice, signed in: an identity the policy names for shadow evidence."""
    from registry.release import decide
    from registry.testing import as_user, challenger_requested

    for key, value in as_user("alice").items():
        monkeypatch.setenv(key, value)

    who = challenger_requested(Path(tiny_model["path"]), tmp=tmp_path, comment="shadowed for a day")
    decide(who["alice"], "bot", "2", "fine by me", approve=True)  # approval before the policy changed
    from registry.identities import set_policy

    set_policy(who["admin"], policy(tmp_path, shadow={"required": True, "min_requests": 5, "max_error_rate": 0.2}))
    return who


def shadow_rows(n: int, *, errors: int = 0, start: int = 0) -> None:
    """Users answered by v1, each shadowed by v2 (the first `errors` shadows failed); then `mlops shadow report`."""
    from evaluation.shadow import log_shadow_report, shadow_evidence
    from mlops.requestlog import LoggedRequest, write_requests

    asked = [{"role": "user", "content": "Where is my order?"}]
    write_requests([LoggedRequest(f"u-{start + i}", "bot", "1", "/v1/chat/completions", asked, "On its way",
                                  role="user") for i in range(n)])
    write_requests([LoggedRequest(f"s-{start + i}", "bot", "2", "/v1/chat/completions", asked,
                                  "" if i < errors else "On its way",
                                  role="shadow", parent_id=f"u-{start + i}", status=500 if i < errors else 200,
                                  error="engine failed" if i < errors else None) for i in range(n)])
    log_shadow_report(shadow_evidence("bot", "2"))


def shadow_result():
    from registry.audit import model_state
    from registry.gates import evaluate_gates

    return next(r for r in evaluate_gates(model_state("bot"), "2") if r.gate == "shadow")


def test_shadow_gate_needs_the_configured_number_of_shadowed_requests_and_few_errors(reg):
    from registry.release import promote

    shadow_rows(3)
    result = shadow_result()
    assert not result.passed and "answered 3 shadowed requests" in result.detail
    assert "the policy needs 5" in result.detail
    with pytest.raises(RefusedError, match="shadow gate failed"):
        promote(reg["bob"], "bot", "2", "production")

    shadow_rows(3, errors=1, start=3)  # 6 answered, 1 failed: 16.7% <= 20%
    result = shadow_result()
    assert result.passed and result.evidence["shadowed"] == 6 and result.evidence["min_requests"] == 5
    shadow_rows(2, errors=2, start=6)  # 3 of 8 failed
    result = shadow_result()
    assert not result.passed and "3 of 8 shadow answers failed" in result.detail

    from registry.release import override

    override(reg["admin"], "bot", "2", "shadow", "errors were a load-balancer incident, not the model")
    entry = promote(reg["bob"], "bot", "2", "production")
    shadow = next(g for g in entry.evidence["gates"] if g["gate"] == "shadow")
    assert not shadow["passed"] and shadow["ok"] and shadow["overridden_by"]["by"] == "admin"


def test_shadow_gate_reads_the_stored_report_and_says_how_to_make_one(reg):
    from mlops.requestlog import LoggedRequest, write_requests

    result = shadow_result()
    assert not result.passed and "no stored shadow report" in result.detail and "mlops shadow report" in result.detail
    write_requests([LoggedRequest("s-late", "bot", "2", "/v1/chat/completions", [], "late", role="shadow")])
    assert "no stored shadow report" in shadow_result().detail  # live rows are not evidence until reported
    shadow_rows(6)
    result = shadow_result()
    assert result.passed and result.evidence["shadow_run"] and result.evidence["agreement"]["exact"] == 1.0


def test_a_registry_bootstrapped_without_a_policy_file_applies_no_new_gate(mlops_home):
    from registry.gates import policy_gates
    from registry.resolve import release_policy
    from registry.testing import make_identities

    make_identities()
    assert policy_gates(None, None, release_policy()) == []


def test_a_policy_file_with_a_misspelt_key_names_the_field_and_the_fix(tmp_path):
    from mlops.errors import NotFoundError
    from registry.config import read_policy_file

    with pytest.raises(ConfigError, match=r"unknown key 'registry.spot_check.requird'.*did you mean 'required'"):
        read_policy_file(policy(tmp_path, spot_check={"requird": True}))
    with pytest.raises(NotFoundError, match="does not exist"):
        read_policy_file(tmp_path / "nowhere.yaml")
