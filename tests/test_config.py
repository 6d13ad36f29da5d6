"""Configuration precedence: defaults < TOML file < TIDEWIRE_* environment < flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidewire.config import SETTINGS, ConfigError, env_name, load_config


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "tidewire.toml"
    path.write_text(text)
    return str(path)


def test_defaults() -> None:
    config = load_config(None, environ={})
    assert config.data_dir == "./tidewire-data"
    assert config.host == "127.0.0.1"
    assert config.http_port == 7480
    assert config.log.fsync is True
    assert config.log.defaults.retention_bytes is None
    assert config.log.defaults.retention_ms is None


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'data_dir = "/from/file"\nhost = "127.0.0.2"\n[http]\nport = 1111\n'
        "[log]\nsegment_bytes = 65536\nretention_ms = 1000\nfsync = false\n",
    )
    config = load_config(path, environ={})
    assert (config.data_dir, config.host, config.http_port) == ("/from/file", "127.0.0.2", 1111)
    assert config.log.defaults.segment_bytes == 65536
    assert config.log.defaults.retention_ms == 1000
    assert config.log.fsync is False

    env = {"TIDEWIRE_HTTP_PORT": "2222", "TIDEWIRE_LOG_FSYNC": "true", "TIDEWIRE_HOST": "::1"}
    config = load_config(path, environ=env)
    assert (config.http_port, config.log.fsync, config.host) == (2222, True, "::1")
    assert config.data_dir == "/from/file"

    config = load_config(path, {"http.port": 3333, "host": None, "log.retention_ms": "5"}, env)
    assert config.http_port == 3333
    assert config.host == "::1"  # None means "flag not given"
    assert config.log.defaults.retention_ms == 5


def test_per_stream_settings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[log]\nretention_bytes = 1000000\n[log.streams."orders.eu"]\nretention_ms = 60000\n',
    )
    config = load_config(path, environ={})
    orders = config.log.for_stream("orders.eu")
    assert orders.retention_ms == 60000
    assert orders.retention_bytes == 1000000  # inherited from [log]
    assert config.log.for_stream("other").retention_ms is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bogus = 1\n", "unknown setting 'bogus'"),
        ("[http]\nport = 'x'\n", "http.port: 'x' is not a valid int"),
        ("[http]\nport = 1.5\n", "http.port: expected int"),
        ("[log]\nfsync = 1\n", "log.fsync: expected bool"),
        ("log_level = 'loud'\n", "log_level"),
        ("[http]\nport = 70000\n", "http.port: 70000 is outside 0..65535"),
        ("[log]\nmax_pending_bytes = -5\n", "log.max_pending_bytes: -5 is outside"),
        ("[log]\nmax_record_bytes = 4294967296\n", "log.max_record_bytes"),
        ("[log]\nretention_check_interval_s = 0\n", "log.retention_check_interval_s"),
        ("[log]\nretention_ms = -2\n", "neither -1 \\(no limit\\) nor >= 0"),
        ('[log.streams."a"]\nretention_bytes = -7\n', "log.streams.a.retention_bytes"),
        ("[log]\nsegment_bytes = 10\n", "segment_bytes must be at least 4096"),
        ('[log.streams."a"]\ncolour = 1\n', "allowed keys"),
        ('[log.streams."a b"]\nretention_ms = 1\n', "whitespace"),
        ("this is not toml", "cannot read config file"),
    ],
)
def test_bad_files_are_clear_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_config(write(tmp_path, text), environ={})


def test_bad_environment_and_flags() -> None:
    with pytest.raises(ConfigError, match="TIDEWIRE_HTTP_PORT"):
        load_config(None, environ={"TIDEWIRE_HTTP_PORT": "eighty"})
    with pytest.raises(ConfigError, match="unknown setting 'nope'"):
        load_config(None, {"nope": "1"}, environ={})


VALID_TEXT = {"tls.client_auth": ("none", "none"), "tls.min_version": ("1.3", "1.3"),
              "log_format": ("json", "json"),
              "memory.budget_bytes": ("4294967296", 2**32),
              "memory.principal_bytes": ("134217728", 2**27),
              "memory.connection_bytes": ("8388608", 2**23)}
VALID_TEXT.update({"limits.peer_prefix_v4": ("24", 24), "limits.peer_prefix_v6": ("48", 48)})
VALID_TEXT.update({"storage.url": ("nats://h1:4222", "nats://h1:4222"),  # (issue 21)
                   "cluster.shards": ("64", 64), "cluster.replicas": ("5", 5)})  # fmt: skip
VALID_TEXT["log.journal_bytes"] = ("1048576", 2**20)  # (issue 22: at least 64 KiB)
VALID_TEXT["limits.anonymous_loop_share"] = ("0.5", 0.5)  # (issue 20: a share of the loop)
VALID_TEXT["dashboard.history_streams"] = ("64", 64)  # (issue 23: at most 1024)
COMPANIONS = {  # settings that are only valid together
    "tls.cert_file": ("tls.key_file", "tls.ca_file"),
    "tls.key_file": ("tls.cert_file", "tls.ca_file"),
}


def test_memory_shares_must_nest() -> None:
    with pytest.raises(ConfigError, match="connection_bytes <= principal_bytes"):
        load_config(None, environ={"TIDEWIRE_MEMORY_CONNECTION_BYTES": str(2**30)})


def test_every_setting_has_an_environment_variable() -> None:
    for key, (kind, default, _) in SETTINGS.items():
        raw, expected = {bool: ("false", False), int: ("4096", 4096), float: ("1.5", 1.5),
                         str: ("info", "info")}[kind]  # fmt: skip
        raw, expected = VALID_TEXT.get(key, (raw, expected))
        environ = {env_name(k): "x.pem" for k in COMPANIONS.get(key, ())}
        config = load_config(None, environ={**environ, env_name(key): raw})
        assert config.values[key] == expected
        assert env_name(key).startswith("TIDEWIRE_")
        assert isinstance(default, kind)
