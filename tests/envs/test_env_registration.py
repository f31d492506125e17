"""env.id from a user's package: registered ids, ``module:env-id``, ``module:Class``, plugins, ``imports:``;
env.kwargs checked at load; Gymnasium wrappers and re-registration kept as Gymnasium has them."""

from __future__ import annotations

import logging

import gymnasium
import pytest

from rz_agents.cli.train import RunConfig
from rz_agents.config_io import ConfigError, load_config
from rz_agents.envs import register_env
from rz_agents.envs.resolve import load_env_plugins, resolve_env
from rz_agents.runtime.config import EnvSpec
from rz_agents.runtime.factories import env_factory
from tests.envs.user_package import forget, write_package

BASE = "rollout: {limits: {max_turns: 1, max_tokens_per_turn: 4, max_episode_tokens: 100}}\n"


@pytest.fixture
def pkg(tmp_path, monkeypatch, request):
    name = f"userenvs_{request.node.name.split('[')[0][-20:]}".replace("-", "_")
    write_package(tmp_path / "src", name, monkeypatch)
    yield name
    forget(name)


def _load(tmp_path, extra: str = "", overrides=()):
    path = tmp_path / "run.yaml"
    path.write_text(BASE + extra)
    return load_config(RunConfig, path, list(overrides))


def test_a_registered_id_of_an_unimported_package_names_both_fixes(tmp_path, pkg):
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, overrides=[f"env.id={pkg}/ReverseWord-v0"])
    msg = str(info.value)
    assert f"no Gymnasium env '{pkg}/ReverseWord-v0' is registered" in msg
    assert "imports: [PACKAGE]" in msg and "\n" not in msg


def test_imports_field_makes_a_registered_id_work_and_did_you_mean_covers_it(tmp_path, pkg):
    cfg = _load(tmp_path, f"imports: [{pkg}]\n", [f"env.id={pkg}/ReverseWord-v0"])
    assert cfg.env.id == f"{pkg}/ReverseWord-v0"
    with pytest.raises(ConfigError, match=rf"did you mean {pkg}/ReverseWord-v0\?"):
        _load(tmp_path, f"imports: [{pkg}]\n", [f"env.id={pkg}/ReverseWrd-v0"])


def test_a_misspelt_import_is_one_line_with_did_you_mean(tmp_path, pkg):
    with pytest.raises(ConfigError, match=rf"imports\[0\]: no module named '{pkg}x'"):
        _load(tmp_path, f"imports: [{pkg}x]\n")


def test_gymnasium_module_colon_id_form_imports_the_module(pkg):
    target = resolve_env(f"{pkg}:{pkg}/ReverseWord-v0")
    assert target.gym_id == f"{pkg}/ReverseWord-v0"
    env = env_factory(EnvSpec(id=f"{pkg}:{pkg}/ReverseWord-v0"))()
    assert env.unwrapped.partial == 0.1  # the registered default


def test_module_colon_class_applies_the_registered_defaults_and_kwargs_override_them(pkg):
    env = env_factory(EnvSpec(id=f"{pkg}:ReverseWordEnv"))()
    assert env.unwrapped.partial == 0.1
    env = env_factory(EnvSpec(id=f"{pkg}:ReverseWordEnv", kwargs={"partial": 0.5}))()
    assert env.unwrapped.partial == 0.5


def test_an_unregistered_class_is_built_as_is(tmp_path, monkeypatch):
    (tmp_path / "plainenvs.py").write_text(
        "from rz_agents.envs.examples.guess_number import GuessNumberEnv\n\n"
        "class Bigger(GuessNumberEnv):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = env_factory(EnvSpec(id="plainenvs:Bigger", kwargs={"high": 7}))()
    assert type(env).__name__ == "Bigger" and env.high == 7


def test_env_kwargs_typo_fails_at_config_load_with_did_you_mean(tmp_path, pkg):
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, overrides=[f"env.id={pkg}:ReverseWordEnv", "env.kwargs.partal=0.5"])
    assert str(info.value) == (
        "env.kwargs.partal: ReverseWordEnv() takes no argument 'partal' (did you mean partial?); "
        "it takes partial, max_turns"
    )


def test_a_missing_required_constructor_argument_fails_at_load(tmp_path, monkeypatch):
    (tmp_path / "needy.py").write_text(
        "from rz_agents.envs.examples.guess_number import GuessNumberEnv\n\n"
        "class Needy(GuessNumberEnv):\n    def __init__(self, word, max_turns=1):\n"
        "        super().__init__(max_turns=max_turns)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ConfigError, match=r"env.kwargs: Needy\(\) needs the argument 'word'; set env.kwargs.word"
    ):
        _load(tmp_path, overrides=["env.id=needy:Needy"])


def test_entry_point_plugins_register_ids_without_imports(tmp_path, monkeypatch, pkg):
    dist = tmp_path / "src" / f"{pkg}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {pkg}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[rz_agents.envs]\n{pkg} = {pkg}\n")
    assert f"{pkg}/ReverseWord-v0" not in gymnasium.registry
    assert pkg in load_env_plugins()
    cfg = _load(tmp_path, overrides=[f"env.id={pkg}/ReverseWord-v0"])  # no imports: the plugin did it
    assert cfg.env.id == f"{pkg}/ReverseWord-v0"
    assert load_env_plugins() == []  # loaded once


def test_a_broken_plugin_is_one_warning_not_a_crash(tmp_path, monkeypatch, caplog):
    dist = tmp_path / "brokenplug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[rz_agents.envs]\nbroken = no_such_module_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="rz_agents"):
        assert "broken" not in load_env_plugins()
    assert "env plugin 'broken' (no_such_module_xyz) failed to load" in caplog.text


def test_registered_max_episode_steps_wrapper_is_kept():
    register_env(
        "rz_tests/GuessTimeLimit-v0",
        "rz_agents.envs.examples.guess_number:GuessNumberEnv",
        max_episode_steps=2,
        max_turns=5,
    )
    try:
        env = env_factory(EnvSpec(id="rz_tests/GuessTimeLimit-v0"))()
        env.reset(seed=0, options={"task": {"secret": 50}})
        assert env.step("1")[3] is False
        assert env.step("2")[3] is True  # TimeLimit truncates at 2 although the env allows 5 turns
    finally:
        del gymnasium.registry["rz_tests/GuessTimeLimit-v0"]


def test_re_registering_with_new_kwargs_warns_and_overrides(caplog):
    entry = "rz_agents.envs.examples.guess_number:GuessNumberEnv"
    register_env("rz_tests/Rereg-v0", entry, high=10)
    try:
        with caplog.at_level(logging.WARNING, logger="rz_agents"):
            register_env("rz_tests/Rereg-v0", entry, high=20)
        assert "register_env('rz_tests/Rereg-v0'): replacing its earlier registration" in caplog.text
        assert "{'high': 10} -> {'high': 20}" in caplog.text
        assert gymnasium.make("rz_tests/Rereg-v0").unwrapped.high == 20
    finally:
        del gymnasium.registry["rz_tests/Rereg-v0"]


def test_the_run_turn_limit_is_given_to_the_env_and_a_different_env_max_turns_is_an_error(tmp_path, pkg):
    env = env_factory(EnvSpec(id=f"{pkg}:ReverseWordEnv"), max_turns=3)()
    assert env.unwrapped.max_turns == 3
    with pytest.raises(
        ConfigError, match=r"env.kwargs.max_turns \(2\) conflicts with rollout.limits.max_turns \(1\)"
    ):
        _load(tmp_path, overrides=[f"env.id={pkg}:ReverseWordEnv", "env.kwargs.max_turns=2"])
    _load(tmp_path, overrides=[f"env.id={pkg}:ReverseWordEnv", "env.kwargs.max_turns=1"])  # agreeing: fine


def test_rz_train_dry_run_reports_an_env_kwargs_typo_in_one_line(tmp_path, pkg, capsys):
    from rz_agents.cli import main

    path = tmp_path / "run.yaml"
    path.write_text(BASE + f"env: {{id: '{pkg}:ReverseWordEnv', kwargs: {{partal: 0.5}}}}\n")
    assert main(["train", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "rz train: config error: env.kwargs.partal: ReverseWordEnv() takes no argument 'partal' "
        "(did you mean partial?); it takes partial, max_turns\n"
    )


def test_a_missing_module_suggests_a_near_name_and_not_an_unrelated_installed_one():
    from rz_agents.envs.resolve import import_module

    with pytest.raises(ValueError) as exc:
        import_module("rayenvs", "imports[0]")
    assert str(exc.value) == "imports[0]: no module named 'rayenvs'"  # was: (did you mean rz_agents?)
    with pytest.raises(ValueError, match=r"did you mean rz_agents\?"):
        import_module("rz_agent", "imports[0]")
    with pytest.raises(ValueError, match=r"did you mean rz_agents\.envs\?"):
        import_module("rz_agents.env", "imports[0]")
