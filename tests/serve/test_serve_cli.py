"""`rz serve CONFIG|CHECKPOINT`: the subcommand is registered and builds the config's model and engine."""

from __future__ import annotations

import pytest

from rz_agents.cli import build_parser
from rz_agents.cli.serve import build_server


def test_rz_serve_is_a_subcommand_with_a_port_option():
    args = build_parser().parse_args(["serve", "openai-agent", "engine.max_len=256", "--port", "9123"])
    assert args.command == "serve" and args.port == 9123 and args.overrides == ["engine.max_len=256"]


def test_build_server_takes_the_config_model_tokenizer_and_engine_settings_with_overrides():
    server, engine = build_server("openai-agent", ["engine.max_len=448"], model_name="policy", max_running=4)
    assert server.model_name == "policy" and server.models()["data"][0]["id"] == "policy"
    assert engine.config.max_len == 448 and engine.config.max_running == 4
    assert engine.model.config.hidden_size == 128  # configs/openai-agent.yaml's policy
    assert type(server.template).__name__ == "ByteChatTemplate"


def test_a_vision_language_config_is_served_with_a_template_that_renders_images():
    server, _ = build_server("visual-click-demo")
    assert type(server.template).__name__ == "ByteVLChatTemplate" and server.template.renders_images


def test_a_bad_target_is_a_clear_error():
    with pytest.raises(Exception, match="no-such-config"):
        build_server("no-such-config.yaml")


@pytest.mark.parametrize(
    "override, message",
    [
        ("rollout.max_lagg=3", "did you mean max_lag?"),
        ("learner.temperature=0.5", "conflicts with rollout.temperature"),
    ],
)
def test_a_bad_config_is_one_line_and_exit_2(override, message, capsys):
    from rz_agents.cli import main

    assert main(["serve", "openai-agent", override]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_access_flags_build_the_serve_options(monkeypatch):
    from rz_agents.cli.serve import serve_options

    monkeypatch.setenv("RZ_API_KEY", "env-one, env-two")
    monkeypatch.setenv("RZ_CONTROL_KEY", "ctl")
    args = build_parser().parse_args(["serve", "openai-agent", "--control", "--allow-host", "rz.lan"])
    options = serve_options(args)
    assert options.api_keys == ("env-one", "env-two") and options.control_key == "ctl"
    assert options.hosts == frozenset({"rz.lan", "127.0.0.1"}) and not options.session_records
    args = build_parser().parse_args(
        ["serve", "x", "--api-key", "a", "--api-key", "b", "--max-body-bytes", "9"]
    )
    options = serve_options(args)
    assert options.api_keys == ("a", "b") and options.control_key is None and options.max_body_bytes == 9


def test_control_without_a_control_key_is_one_line_and_exit_2(monkeypatch, capsys):
    from rz_agents.cli import main

    monkeypatch.delenv("RZ_CONTROL_KEY", raising=False)
    assert main(["serve", "openai-agent", "--control"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--control needs --control-key" in err
