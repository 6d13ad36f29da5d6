"""``tidewire serve`` reloads its access policy (tokens and ACL files) on SIGHUP
(tidewire.server.serve.reload_access): unit tests on the function, no process, no sleep.
The real process receiving the signal is in tests/security/test_identity.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tidewire.config import ConfigError, ServerConfig, load_config
from tidewire.hub.access import Access, mint_token
from tidewire.model import Forbidden, Unauthenticated
from tidewire.server.app import parser_reason
from tidewire.server.serve import reload_access, security

ACL_ALL = '[principal."token:*"]\nread = ["*"]\nwrite = ["*"]\n'
ACL_READ = '[principal."token:*"]\nread = ["*"]\n'


def _policy(tmp_path: Path, tokens: str, acl: str | None) -> tuple[Access, ServerConfig]:
    (tmp_path / "tokens.toml").write_text(tokens)
    overrides: dict[str, object] = {"data_dir": str(tmp_path / "data"),
                                    "auth.tokens_file": str(tmp_path / "tokens.toml")}  # fmt: skip
    if acl is not None:
        (tmp_path / "acl.toml").write_text(acl)
        overrides["auth.acl_file"] = str(tmp_path / "acl.toml")
    config = load_config(None, overrides, environ={})
    access, _, _ = security(config)
    return access, config


def test_sighup_revokes_a_token_and_changes_the_acl(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ci, ci_table = mint_token("ci")
    etl, etl_table = mint_token("etl")
    access, config = _policy(tmp_path, ci_table + etl_table, ACL_ALL)
    ci_who, etl_who = access.authenticate(ci), access.authenticate(etl)
    access.check(ci_who, "write", "orders")
    (tmp_path / "tokens.toml").write_text(etl_table)
    (tmp_path / "acl.toml").write_text(ACL_READ)
    caplog.set_level(logging.INFO, "tidewire.server")
    assert reload_access(access, config)
    with pytest.raises(Unauthenticated, match="revoked"):
        access.check(ci_who, "read", "orders")  # an open connection's next decision
    access.check(etl_who, "read", "orders")
    with pytest.raises(Forbidden):
        access.check(etl_who, "write", "orders")  # the new ACL
    assert any("reloaded the access policy: 1 token(s), 1 ACL table(s)" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    assert ci.split(".", 1)[1] not in caplog.text  # no secret in any line


@pytest.mark.parametrize(
    ("tokens", "acl"),
    [
        ("not toml [", ACL_READ),  # the tokens file breaks: the ACL is not taken either
        (None, "[principal.x]\nread = 5\n"),
        (None, "unknown = 1\n"),
    ],
)
def test_a_bad_file_keeps_the_whole_old_policy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, tokens: str | None, acl: str
) -> None:
    ci, ci_table = mint_token("ci")
    access, config = _policy(tmp_path, ci_table, ACL_ALL)
    old_acl, old_tokens = access.acl, access.tokens
    if tokens is not None:
        (tmp_path / "tokens.toml").write_text(tokens)
    (tmp_path / "acl.toml").write_text(acl)
    caplog.set_level(logging.INFO, "tidewire.server")
    assert not reload_access(access, config)
    assert (access.acl, access.tokens) == (old_acl, old_tokens)
    access.check(access.authenticate(ci), "write", "orders")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "not reloaded, the policy in force stays" in errors[0].getMessage()


def test_a_missing_file_keeps_the_old_policy(tmp_path: Path) -> None:
    ci, ci_table = mint_token("ci")
    access, config = _policy(tmp_path, ci_table, None)
    (tmp_path / "tokens.toml").unlink()
    assert not reload_access(access, config)
    access.authenticate(ci)
    assert access.open  # (no acl_file: the hub stays open)


def test_a_bad_file_at_start_is_still_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tokens\.toml"):
        _policy(tmp_path, "not toml [", None)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("Invalid header value char:\n\n  b'Authorization: Bearer ci.S\\x01'\n      ^",
         "Invalid header value char"),
        ("Got more than 8190 bytes when reading: b'GET /?token=ci.S...'.",
         "Got more than 8190 bytes when reading"),
        ('Invalid method encountered:\n\n  b"GE\\x00T"\n    ^', "Invalid method encountered"),
        ("Got more than ...bytearray(b'/x?token=ci.S')", "Got more than"),
        ("Data after `Connection: close`", "Data after `Connection: close`"),
        ("b'ci.S'", "a malformed request"),
    ],
)
def test_a_parser_error_is_logged_without_the_bytes_it_quotes(message: str, reason: str) -> None:
    assert parser_reason(message) == reason
