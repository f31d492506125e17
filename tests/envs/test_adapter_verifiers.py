"""``env.id: verifiers:NAME``: a verifiers 0.4 taskset (written with verifiers' own classes, loaded by its own
loader) runs as a Gymnasium multi-turn env, is scored by the task's own rewards, trains under ``rz train`` and
evaluates under ``rz eval``; what cannot map is one line at config load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip(
    "verifiers.v1", reason="verifiers>=0.4 is not installed (bash scripts/install.sh installs it)"
)

from rz_agents.cli import main  # noqa: E402
from rz_agents.cli.train import RunConfig  # noqa: E402
from rz_agents.config_io import ConfigError, load_config  # noqa: E402
from rz_agents.envs.resolve import check_env_kwargs, resolve_env  # noqa: E402

TASKSETS = Path(__file__).parent / "verifiers_tasksets"
ENV_ID = "verifiers:rz-vf-reverse"


@pytest.fixture(autouse=True)
def tasksets_on_path(monkeypatch):
    # a verifiers taskset is an installed top-level package; this folder stands in for site-packages
    monkeypatch.syspath_prepend(str(TASKSETS))


@pytest.fixture(scope="module")
def target():
    import sys

    sys.path.insert(0, str(TASKSETS))
    try:
        return resolve_env(ENV_ID)
    finally:
        sys.path.remove(str(TASKSETS))


def test_a_row_is_reset_as_its_system_prompt_and_prompt_and_scored_by_the_tasks_own_rewards(target):
    env = target.make(config={"num_tasks": 4})
    obs, info = env.reset(options={"task": {"idx": 0}})
    assert obs == [
        {"role": "system", "content": "Answer with the reversed word only."},
        {"role": "user", "content": "Reverse the word apple."},
    ]
    assert info == {"task_id": "w0", "tools": []}
    obs, reward, terminated, truncated, info = env.step("elppa")
    # exact (weight 1) + starts_right (weight 0.5), as verifiers' Trace.reward sums them
    assert (obs, reward, terminated, truncated) == ([], 1.5, True, False)
    assert info["rewards"] == {"exact": 1.0, "starts_right": 1.0} and info["metrics"] == {"reply_chars": 5.0}
    env.reset(options={"task": {"idx": 0}})
    assert env.step("ELPPX")[1] == 0.5  # the reward functions see the reply as the policy wrote it
    env.reset(options={"task": {"idx": 0}})
    assert env.step("nope")[1] == 0.0


def test_rows_are_drawn_by_the_reset_seed_picked_by_id_or_given_as_fields(target):
    env = target.make(config={"num_tasks": 8})
    drawn = {env.reset(seed=s)[1]["task_id"] for s in range(40)}
    assert drawn == {f"w{i}" for i in range(8)}
    assert env.reset(seed=7) == env.reset(seed=7)
    assert env.reset(options={"task": {"id": "w3"}})[0][1]["content"] == "Reverse the word cloud."
    obs, info = env.reset(options={"task": {"id": "t1", "prompt": "Reverse the word ab.", "answer": "ba"}})
    assert obs == [{"role": "user", "content": "Reverse the word ab."}] and info["task_id"] == "t1"
    assert env.step("ba")[1] == 1.5
    with pytest.raises(ValueError, match=r"idx must be an int in \[0, 8\)"):
        env.reset(options={"task": {"idx": 8}})


def test_the_taskset_config_is_verifiers_own_and_checked(target):
    check_env_kwargs(target, {"config": {"num_tasks": 2}, "max_turns": 1})
    with pytest.raises(ValueError, match="takes no argument 'confg' \\(did you mean config\\?\\)"):
        check_env_kwargs(target, {"confg": {}})
    assert len(target.make(config={"num_tasks": 2}).rows()) == 2
    with pytest.raises(ValueError) as info:
        target.make(config={"num_taks": 2})
    assert str(info.value).startswith(
        "env.kwargs.config: ReverseConfig: ValidationError"
    ) and "num_taks" in str(info.value)


@pytest.mark.parametrize(
    ("env_id", "expected"),
    [
        ("verifiers:rz-vf-nope", "taskset 'rz-vf-nope' not found (tried to import 'rz_vf_nope')"),
        ("verifiers:", "verifiers: needs a taskset name after the colon"),
        ("verifiers:json", "exports no Taskset subclass via `__all__`"),
        (
            "verifiers:rz-vf-sandbox",
            "reward(s) file_written of SandboxTask read the task's runtime (a sandbox)",
        ),
        (
            "verifiers:rz-vf-docker-tools",
            "its toolset ShellToolset runs in a DockerConfig runtime (a sandbox), "
            "which the adapter does not run",
        ),
    ],
)
def test_what_cannot_run_is_one_line_at_config_load(tmp_path, env_id, expected):
    path = tmp_path / "run.yaml"
    path.write_text(f"env: {{id: '{env_id}'}}\nrollout: {{limits: {{max_turns: 1}}}}\n")
    with pytest.raises(ConfigError) as info:
        load_config(RunConfig, path, [])
    message = str(info.value)
    assert expected in message and f"env.id '{env_id}'" in message and "\n" not in message


def test_a_tasks_toolset_is_served_in_process_and_the_episode_goes_on_while_the_policy_calls_it():
    from rz_agents.envs.tool_calls import format_tool_call

    env = resolve_env("verifiers:rz-vf-tools").make(max_turns=4)
    obs, info = env.reset(options={"task": {"id": "north"}})
    assert obs == [{"role": "user", "content": "Look up the code word under north and answer with it."}]
    (spec,) = info["tools"]  # named <server>_<tool>, described and typed as verifiers' MCP server lists it
    assert spec["function"]["name"] == "atlas_lookup"
    assert spec["function"]["description"] == "Return the code word stored under key."
    assert spec["function"]["parameters"]["required"] == ["key"]
    assert env.step(format_tool_call("atlas_lookup", {"key": "north"})) == (
        [{"role": "tool", "content": "castle"}],
        0.0,
        False,
        False,
        {"turn": 1},
    )
    obs, *_ = env.step(format_tool_call("atlas_lookup", {"key": "west"}) + format_tool_call("atlas_nope", {}))
    assert obs[0]["content"].startswith("Error: ") and "no code word under 'west'" in obs[0]["content"]
    assert obs[1]["content"] == "unknown tool 'atlas_nope'; available: atlas_lookup"
    _, reward, terminated, truncated, info = env.step("castle")  # no call: the chat ends and is scored
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["rewards"] == {"answered": 1.0} and info["metrics"] == {
        "looked_up": 1.0
    }  # read from the trace
    env.close()


def test_at_the_turn_limit_the_conversation_so_far_is_scored():
    from rz_agents.envs.tool_calls import format_tool_call

    env = resolve_env("verifiers:rz-vf-tools").make(max_turns=2)
    call = format_tool_call("atlas_lookup", {"key": "east"})
    env.reset(options={"task": {"id": "east"}})
    assert env.step(call)[2:4] == (False, False)
    _, reward, terminated, truncated, _ = env.step(call)
    assert (reward, terminated, truncated) == (0.0, False, True)  # no answer yet
    env.reset(options={"task": {"id": "east"}})
    env.step(call)
    _, reward, terminated, truncated, _ = env.step("forest " + call)
    # the text beside the call is the assistant message's content, verifiers' last_reply: scored 1
    assert (reward, terminated, truncated) == (1.0, False, True)
    env.close()
    env.close()  # twice is safe


def test_a_task_with_no_reward_is_refused_when_the_env_is_built():
    target = resolve_env("verifiers:rz-vf-noreward")
    with pytest.raises(ValueError) as info:
        target.make()
    assert str(info.value) == (
        "env.id 'verifiers:rz-vf-noreward': its task Task has no @vf.reward: every episode would score 0"
    )


TRAIN = (
    "steps: 1\nnum_threads: 1\nreport: false\nwarm_start: {demos: 0}\n"
    "model: {tiny_overrides: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1}}\n"
    f"env:\n  id: '{ENV_ID}'\n  kwargs: {{config: {{num_tasks: 4}}}}\n"
    "  eval_tasks: [{idx: 0}, {idx: 1}, {idx: 2}]\n"
    "rollout:\n  group_size: 2\n  groups_per_batch: 2\n  max_concurrent_episodes: 4\n"
    "  limits: {max_turns: 1, max_tokens_per_turn: 6, max_episode_tokens: 200}\n"
    "engine: {max_running: 4, max_len: 256}\n"
)


def test_rz_train_then_rz_eval_run_the_taskset_end_to_end(train_then_eval, tmp_path, capsys):
    summary, result = train_then_eval(TRAIN)
    run_dir = tmp_path / "run"  # where train_then_eval trained
    assert summary["steps"] == 1
    assert result["env"] == ENV_ID and (result["num_tasks"], result["num_samples"]) == (3, 6)
    assert result["num_failed"] == 0 and 0.0 <= result["mean_reward"] <= 1.5
    assert [t["id"] for t in result["tasks"]] == ["w0", "w1", "w2"]

    # the same checkpoint on the taskset with a tool: its spec is in the prompt, the episodes complete
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["env"] = {"id": "verifiers:rz-vf-tools", "eval_tasks": [{"id": "north"}, {"id": "south"}]}
    config["rollout"]["limits"] = {"max_turns": 2, "max_tokens_per_turn": 8, "max_episode_tokens": 1000}
    config["engine"]["max_len"] = 1024
    tools_config = tmp_path / "tools.yaml"
    tools_config.write_text(yaml.safe_dump(config))
    argv = ["eval", str(tools_config), "--checkpoint", str(run_dir / "final_model")]
    assert main([*argv, "--num-threads", "1", "--quiet", "--k", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["env"] == "verifiers:rz-vf-tools" and result["num_failed"] == 0
    assert [t["id"] for t in result["tasks"]] == ["north", "south"]
