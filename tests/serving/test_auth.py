"""One token authorisation for every engine (serving/auth.py, serving/kserve/auth.py), without a server: the key
file each start writes, the switch, the refusal and which key each KServe route asks for (the real servers, every
port tried anonymously and with the key: tests/e2e/test_security.py)."""

from __future__ import annotations

import json
import stat

import pytest

from serving import auth
from serving.kserve.auth import api_of
from serving.kserve.config import KServeSettings
from serving.ray.cluster import RAY_TOKEN_FILE, cluster_auth_env


def test_each_start_writes_new_keys_only_its_user_may_read(tmp_path, monkeypatch):
    monkeypatch.delenv(auth.KEYS_ENV, raising=False)
    path = tmp_path / "key_file.json"
    first = auth.read_keys(auth.write_keys(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    second = auth.read_keys(auth.write_keys(path))
    assert set(first) == {auth.INFERENCE, auth.MANAGEMENT} and first != second
    assert first[auth.INFERENCE] != first[auth.MANAGEMENT]


def test_a_given_key_file_is_used_as_it_is_and_one_without_keys_stops_the_start(tmp_path, monkeypatch):
    given = tmp_path / "mounted.json"
    given.write_text(json.dumps({"inference": {"key": "in"}, "management": {"key": "man"}}))
    monkeypatch.setenv(auth.KEYS_ENV, str(given))
    assert auth.read_keys(auth.write_keys(tmp_path / "key_file.json")) == {"inference": "in", "management": "man"}
    assert auth.read_keys(auth.write_keys(given)) == {"inference": "in", "management": "man"}  # itself: kept
    given.write_text(json.dumps({"inference": {"key": "in"}}))
    with pytest.raises(auth.ServingError, match="has no management key"):
        auth.write_keys(tmp_path / "key_file.json")


@pytest.mark.parametrize("flag, environ, on", [
    (False, {}, False), (True, {}, True), (False, {auth.TOKEN_SWITCH_ENV: "FALSE"}, True),
    (False, {auth.TOKEN_SWITCH_ENV: "true"}, False), (False, {auth.KEYS_ENV: "/keys/key_file.json"}, True),
])
def test_one_switch_the_flag_torchserves_variable_or_keys_of_your_own(flag, environ, on):
    assert auth.switched_on(flag, environ) is on


def test_a_caller_needs_the_key_of_the_api_it_calls():
    keys = {"inference": "in-key", "management": "man-key"}
    assert auth.refusal("Bearer in-key", "inference", keys) is None
    assert auth.refusal("Bearer man-key", "management", keys) is None
    for header in (None, "", "Bearer ", "in-key", "Bearer man-key", "Basic in-key", "Bearer in-key2"):
        why = auth.refusal(header, "inference", keys)
        assert why and "send the inference key as 'Authorization: Bearer KEY'" in why, header
    assert auth.refusal("Bearer in-key", "management", keys)  # the inference key opens no version
    assert auth.refusal(None, "management", None) is None  # tokens off


def test_a_route_that_changes_what_is_served_asks_for_the_management_key_or_loopback_without_tokens(
        tmp_path, monkeypatch):
    monkeypatch.delenv(auth.KEYS_ENV, raising=False)
    auth.server_keys.cache_clear()
    try:
        assert auth.management_refusal(None, "127.0.0.1") is None and auth.management_refusal(None, "::1") is None
        for client in ("10.1.2.3", "192.168.0.7", None, "testclient"):
            assert auth.management_refusal("Bearer anything", client) == (auth.FORBIDDEN, auth.LOOPBACK_ONLY), client
        given = tmp_path / "key_file.json"
        given.write_text(json.dumps({"inference": {"key": "in"}, "management": {"key": "man"}}))
        monkeypatch.setenv(auth.KEYS_ENV, str(given))
        auth.server_keys.cache_clear()
        assert auth.management_refusal("Bearer man", "10.1.2.3") is None  # tokens on: the key, from anywhere
        for header in (None, "Bearer in"):
            status, why = auth.management_refusal(header, "127.0.0.1")
            assert status == auth.UNAUTHORISED and "send the management key" in why, header
    finally:
        auth.server_keys.cache_clear()


def test_the_settings_say_where_the_keys_are_never_what_they_are(tmp_path, monkeypatch):
    monkeypatch.delenv(auth.KEYS_ENV, raising=False)
    settings = KServeSettings(run_dir=tmp_path, token_auth=True)
    env = auth.key_env(settings)
    keys = auth.read_keys(settings.key_file)
    assert env == {auth.KEYS_ENV: str(settings.key_file)}
    assert auth.auth_headers(settings, "management") == {"Authorization": "Bearer " + keys["management"]}
    said = " ".join(auth.key_notes(settings)) + auth.curl_header(settings)
    assert str(settings.key_file) in said and not [key for key in keys.values() if key in said]
    off = KServeSettings(run_dir=tmp_path / "off")
    assert auth.key_env(off) == {} and auth.auth_headers(off) == {} and auth.key_notes(off) == []


@pytest.mark.parametrize("path, api", [
    ("/metrics", None), ("/health/live", None), ("/health/ready", None), ("/v2/health/ready", None), ("/", None),
    ("/v1/models/resnet18:predict", "inference"), ("/v2/models/resnet18/infer", "inference"),
    ("/v2/models/resnet18", "inference"), ("/v1/models", "inference"), ("/docs", "inference"),
    ("/openapi.json", "inference"), ("/anything/else", "inference"),
    ("/rollout/resnet18", "management"), ("/rollout/resnet18/captured", "management"),
    ("/v2/repository/models/resnet18/unload", "management"), ("/v2/repository/models/resnet18/load", "management"),
])
def test_every_kserve_route_asks_for_a_key_but_liveness_readiness_and_metrics(path, api):
    assert api_of(path) == api


def test_rays_cluster_token_is_new_at_each_start_and_a_join_needs_the_clusters(tmp_path, monkeypatch):
    env = cluster_auth_env(tmp_path, joining=False)
    token = (tmp_path / RAY_TOKEN_FILE).read_text()
    assert env == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(tmp_path / RAY_TOKEN_FILE)}
    assert stat.S_IMODE((tmp_path / RAY_TOKEN_FILE).stat().st_mode) == 0o600 and len(token) == 64
    cluster_auth_env(tmp_path, joining=False)
    assert (tmp_path / RAY_TOKEN_FILE).read_text() != token
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr("serving.ray.cluster.DEFAULT_TOKEN", tmp_path / "home" / ".ray" / "auth_token")
    with pytest.raises(auth.ServingError, match="needs its Ray token: set RAY_AUTH_TOKEN_PATH"):
        cluster_auth_env(tmp_path, joining=True)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / RAY_TOKEN_FILE))
    assert cluster_auth_env(tmp_path, joining=True) == {"RAY_AUTH_MODE": "token"}
