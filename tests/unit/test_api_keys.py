"""API keys in the configuration: refused by name (never by secret) when malformed,
read from the environment whose commas also separate scopes, masked on command lines
and in what the process shows, and matched in constant time against every key."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, load
from gateway.http.keys import ADMIN, Credentials, Unauthorized, parse_api_keys
from gateway.redact import config_secrets, redact_argv

TOKEN_KEYS = ("k1:token-key-secret",)


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("backend:short:send", "at least 16"),
        ("backend:0123456789abcdef:send,fly", "not fly"),
        ("back end:0123456789abcdef:send", "name"),
        ("backend:0123456789abcdef", "NAME:SECRET:SCOPES"),
    ],
)
def test_a_bad_key_is_refused_by_name(bad: str, says: str) -> None:
    cfg = load({"api_keys": (bad,), "admin_port": 8080, "token_keys": TOKEN_KEYS})
    with pytest.raises(ConfigError, match=says) as e:
        cfg.validate()
    assert "0123456789abcdef" not in str(e.value)


def test_keys_need_the_admin_listener() -> None:
    cfg = load({"api_keys": ("a:0123456789abcdef:send",), "token_keys": TOKEN_KEYS})
    with pytest.raises(ConfigError, match="admin-port"):
        cfg.validate()


def test_the_environment_splits_at_commas_and_scopes_still_belong_to_their_key() -> None:
    env = {"IMGW_API_KEYS": "a:0123456789abcdef:send,read,b:fedcba98:76543210:push"}
    keys = parse_api_keys(load(env=env).api_keys)
    assert [(k.name, k.secret, sorted(k.scopes)) for k in keys] == [
        ("a", b"0123456789abcdef", ["read", "send"]),
        ("b", b"fedcba98:76543210", ["push"]),  # a secret may hold a colon
    ]


def test_secrets_are_masked_and_names_kept() -> None:
    argv = ["serve", "--api-key", "a:0123456789abcdef:send", "--api-key=b:fedcba9876543210:read"]
    assert redact_argv(argv) == ["serve", "--api-key", "a:***:send", "--api-key=b:***:read"]
    cfg = load({"api_keys": ("a:0123456789abcdef:send",), "token_keys": TOKEN_KEYS})
    assert "0123456789abcdef" in config_secrets(cfg)
    assert not {"a", "send"} & config_secrets(cfg)


def test_credentials() -> None:
    keys = parse_api_keys(["a:0123456789abcdef:send", "a:rotated-0123456789:send"])
    creds = Credentials("admin-token", keys)
    assert creds.caller("Bearer admin-token").name == ADMIN
    assert creds.caller("bearer 0123456789abcdef").name == "a"
    assert creds.caller("Bearer rotated-0123456789").scopes == {"send"}
    for bad, says in ((None, "needed"), ("Basic abc", "needed"), ("Bearer nope", "invalid")):
        with pytest.raises(Unauthorized, match=says):
            creds.caller(bad)
    # no admin token: loopback only, where a call without credentials is the admin's
    open_ = Credentials("", keys)
    assert open_.caller(None).name == ADMIN
    with pytest.raises(Unauthorized, match="invalid"):
        open_.caller("Bearer nope")
