"""Config: TOML < env < CLI, and bad fields fail before anything starts, named."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlbus.cli import app
from rlbus.config import ConfigError, load_settings, parse_overrides, settings_variables
from rlbus.config.runs import RunConfig


def test_precedence_toml_env_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text('run_id = "from-file"\n[kafka]\npartitions = 3\ntopic_prefix = "f."\n')
    monkeypatch.setenv("RLBUS_KAFKA__PARTITIONS", "5")
    s = load_settings(toml, ["--kafka.topic-prefix", "cli.", "--store.batch-rows=7"])
    assert (s.run_id, s.kafka.partitions, s.kafka.topic_prefix, s.store.batch_rows) == (
        "from-file",
        5,
        "cli.",
        7,
    )


def test_env_set_to_the_default_beats_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text('run_id = "from-file"\n[kafka]\npartitions = 3\n[store]\nserve_http = false\n')
    monkeypatch.setenv("RLBUS_RUN_ID", "default")
    monkeypatch.setenv("RLBUS_KAFKA__PARTITIONS", "4")
    monkeypatch.setenv("RLBUS_STORE__SERVE_HTTP", "true")
    s = load_settings(toml)
    assert (s.run_id, s.kafka.partitions, s.store.serve_http) == ("default", 4, True)
    # ...and the CLI, set to the default too, beats both.
    monkeypatch.setenv("RLBUS_KAFKA__PARTITIONS", "5")
    assert load_settings(toml, ["--kafka.partitions", "4"]).kafka.partitions == 4


def test_typo_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"kafka\.bootstrap_server: unknown field"):
        load_settings(overrides=["--kafka.bootstrap-server", "h:9092"])
    toml = tmp_path / "c.toml"
    toml.write_text("[stor]\nurl = 'x'\n")
    with pytest.raises(ConfigError, match=r"stor: unknown field"):
        load_settings(toml)


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read config .*missing\.toml"):
        load_settings(tmp_path / "missing.toml")
    toml = tmp_path / "bad.toml"
    toml.write_text("[kafka\n")
    with pytest.raises(ConfigError, match=r"cannot read config .*bad\.toml"):
        load_settings(toml)


def test_wrong_type_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"kafka\.partitions: .*integer.*'four'"):
        load_settings(overrides=["--kafka.partitions", "four"])
    monkeypatch.setenv("RLBUS_STORE__FLUSH_INTERVAL_S", "-1")
    with pytest.raises(ConfigError, match=r"store\.flush_interval_s: .*greater than 0"):
        load_settings()
    monkeypatch.setenv("RLBUS_KAFKA", "{not json")
    with pytest.raises(ConfigError, match=r'environment.*field "kafka"'):
        load_settings()


def test_cli_rejects_bad_field_before_starting() -> None:
    result = CliRunner().invoke(app, ["topics", "--kafka.bootstrap-srvers", "127.0.0.1:1"])
    assert result.exit_code == 2
    assert "kafka.bootstrap_srvers: unknown field" in result.output


def test_overrides_parse_nested_and_flags() -> None:
    assert parse_overrides(["--a.b-c", "1", "--flag", "--x=y"]) == {
        "a": {"b_c": "1"},
        "flag": "true",
        "x": "y",
    }
    with pytest.raises(ConfigError, match="unexpected argument"):
        parse_overrides(["stray"])


def test_an_entry_of_a_named_section_keeps_its_name_and_its_fields_take_dashes(
    tmp_path: Path,
) -> None:
    """`--envs.reverse-text.weight 2` set the weight of an entry `reverse_text`, a second
    environment the run never had; `-` is `_` in field names only."""
    config = tmp_path / "run.toml"
    config.write_text('[envs.reverse-text]\npath = "a"\n[envs.chain_sum]\npath = "b"\n')
    overrides = ["--envs.reverse-text.weight", "2", "--envs.chain-sum.weight", "3"]
    with pytest.raises(ConfigError, match="envs.chain-sum.path: Field required"):
        load_settings(config, overrides, model=RunConfig)
    cfg = load_settings(
        config,
        [*overrides[:2], "--envs.reverse-text.algorithm.normalize-std", "true"],
        model=RunConfig,
    )
    assert sorted(cfg.envs) == ["chain_sum", "reverse-text"]
    assert cfg.envs["reverse-text"].weight == 2.0
    assert cfg.envs["reverse-text"].algorithm.normalize_std
    assert parse_overrides(["--envs.x-y.overrides.group-size", "4"], RunConfig) == {
        "envs": {"x-y": {"overrides": {"group_size": "4"}}}
    }


def test_settings_variables_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings(overrides=["--kafka.bootstrap-servers", "h:1", "--store.serve-http", "false"])
    for key, value in settings_variables(s).items():
        monkeypatch.setenv(key, value)
    assert load_settings() == s
