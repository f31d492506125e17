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
