"""API keys (missing, wrong, right, revoked; open probes), the keys CLI, /metrics and the access log."""

from __future__ import annotations

import json
import logging

import pytest

from mlops.profile import load_profile


@pytest.fixture(scope="module")
def engine(any_engine):
    """Each engine in turn (`hf`, `llamacpp`): the guarantees here hold on every engine."""
    return any_engine


@pytest.fixture
def keyed(tiny_model, engine, tmp_path):
    """A client of an app with API keys on, the keys file, and one valid key."""
    from fastapi.testclient import TestClient

    from serving.auth import KeyStore, add_key
    from serving.server import create_app

    path = tmp_path / "keys.json"
    key, entry = add_key(path, "tester")
    store = KeyStore(path, recheck_seconds=0)
    app = create_app(tiny_model["path"], load_profile(tiny_model["path"]), model_name="tiny", engine=engine,
                     version="5", keys=store)
    client = TestClient(app)  # no `with`: the module's engine outlives this app
    yield client, key, entry, path


def test_requests_need_a_valid_bearer_key_and_probes_stay_open(keyed):
    client, key, _, _ = keyed
    body = {"prompt": "hi", "max_tokens": 1}
    missing = client.post("/v1/completions", json=body)
    assert missing.status_code == 401 and "missing API key" in missing.json()["error"]["message"]
    assert missing.headers["www-authenticate"] == "Bearer" and missing.headers["x-request-id"]
    wrong = client.post("/v1/completions", json=body, headers={"Authorization": "Bearer mlk_nope_nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    basic = client.post("/v1/completions", json=body, headers={"Authorization": f"Basic {key}"})
    assert basic.status_code == 401
    right = client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert right.status_code == 200
    assert client.get("/v1/models").status_code == 401 and client.get("/metrics").status_code == 401
    assert client.get("/health").status_code == 200 and client.get("/ready").status_code == 200


def test_a_revoked_key_is_refused_without_a_restart_and_the_file_holds_no_key(keyed):
    from serving.auth import revoke_key

    client, key, entry, path = keyed
    auth = {"Authorization": f"Bearer {key}"}
    assert client.get("/v1/models", headers=auth).status_code == 200
    assert key not in path.read_text() and oct(path.stat().st_mode)[-3:] == "600"
    revoke_key(path, entry["id"])
    assert client.get("/v1/models", headers=auth).status_code == 401


def _cli(args: list[str]):
    from typer.testing import CliRunner

    from mlops.cli import _register_stages, app

    if not any(group.name == "serve-keys" for group in app.registered_groups):
        _register_stages()
    return CliRunner().invoke(app, args)


def test_serve_refuses_to_start_without_keys_and_no_auth_only_on_loopback(tiny_model, mlops_home, tmp_path):
    folder = tiny_model["path"]
    no_keys = _cli(["serve", "--model", folder, "--keys-file", str(tmp_path / "none.json")])
    assert no_keys.exit_code != 0 and "no API keys" in str(no_keys.exception)
    assert "serve-keys add" in str(no_keys.exception)
    public = _cli(["serve", "--model", folder, "--no-auth", "--host", "0.0.0.0"])
    assert public.exit_code != 0 and "loopback" in str(public.exception)


def test_keys_cli_adds_lists_and_revokes(mlops_home):
    added = _cli(["serve-keys", "add", "--name", "dashboard"])
    assert added.exit_code == 0, added.output
    key = added.stdout.strip().splitlines()[-1]
    assert key.startswith("mlk_")
    listed = _cli(["serve-keys", "list"])
    key_id = key.split("_")[1]
    assert key_id in listed.output and "dashboard" in listed.output and key not in listed.output
    assert _cli(["serve-keys", "revoke", key_id]).exit_code == 0
    assert "revoked" in _cli(["serve-keys", "list"]).output


def test_metrics_count_requests_latency_tokens_and_name_the_serving_version(keyed, caplog):
    client, key, _, _ = keyed
    auth = {"Authorization": f"Bearer {key}"}
    caplog.set_level(logging.INFO, logger="mlops.serve.access")
    client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2}, headers=auth)
    client.post("/v1/completions", json={"prompt": "x", "max_tokens": True}, headers=auth)
    with client.stream("POST", "/v1/chat/completions", headers={**auth, "X-Request-ID": "stream-1"}, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}) as response:
        list(response.iter_lines())
    text = client.get("/metrics", headers=auth).text
    assert 'mlops_serve_requests_total{method="POST",route="/v1/completions",status="200"} 1.0' in text
    assert 'mlops_serve_requests_total{method="POST",route="/v1/completions",status="400"} 1.0' in text
    assert 'mlops_serve_request_latency_seconds_count{route="/v1/chat/completions"} 1.0' in text
    assert 'mlops_serve_time_to_first_token_seconds_count{route="/v1/chat/completions"} 1.0' in text
    assert 'mlops_serve_prompt_tokens_total{route="/v1/completions"} 3.0' in text
    assert 'mlops_serve_completion_tokens_total{route="/v1/completions"}' in text
    assert 'mlops_serve_model_info{model="tiny",profile_hash=' in text and 'version="5"} 1.0' in text
    assert "mlops_serve_queue_depth " in text and 'mlops_serve_batch_size_count{kind="generate"}' in text
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "mlops.serve.access"]
    streamed = next(line for line in lines if line["request_id"] == "stream-1")
    assert streamed["route"] == "/v1/chat/completions" and streamed["status"] == 200
    assert streamed["completion_tokens"] >= 1 and streamed["prompt_tokens"] > 0 and streamed["latency_ms"] > 0
    assert streamed["ttft_ms"] is not None and streamed["model_version"] == "5" and streamed["key_id"]


def test_metrics_can_be_opened_for_a_scraper_while_the_api_stays_keyed(tiny_model, engine, tmp_path):
    from fastapi.testclient import TestClient

    from serving.auth import KeyStore, add_key
    from serving.config import AuthConfig, ServeConfig
    from serving.server import create_app

    add_key(tmp_path / "k.json", "x")
    app = create_app(tiny_model["path"], load_profile(tiny_model["path"]), model_name="tiny", engine=engine,
                     config=ServeConfig(auth=AuthConfig(open_metrics=True)), keys=KeyStore(tmp_path / "k.json"))
    client = TestClient(app)
    assert client.get("/metrics").status_code == 200 and client.get("/v1/models").status_code == 401


def test_a_registry_identity_signs_in_with_its_password_when_the_server_accepts_identities(tiny_model, engine,
                                                                                             tmp_path, mlops_home):
    from fastapi.testclient import TestClient

    from registry.testing import PASSWORDS, make_identities
    from serving.auth import IdentityVerifier, KeyStore
    from serving.server import create_app

    make_identities()
    verifier = IdentityVerifier()
    store = KeyStore(tmp_path / "keys.json", extra=[verifier])  # no API keys at all: identities only
    app = create_app(tiny_model["path"], load_profile(tiny_model["path"]), model_name="tiny", engine=engine,
                     version="5", keys=store)
    client = TestClient(app)
    body = {"prompt": "hi", "max_tokens": 1}
    user = next(iter(PASSWORDS))
    right = client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {user}:{PASSWORDS[user]}"})
    assert right.status_code == 200
    for token in (f"{user}:wrong-password", f"nobody:{PASSWORDS[user]}", user):
        refused = client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {token}"})
        assert refused.status_code == 401, token
    assert len(verifier._seen) == 3  # verdicts remembered: a retried wrong password costs no second argon2 hash
