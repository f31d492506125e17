"""The shell env on Harbor tasks: an episode end to end, the held-out checks the Python tool env passes
(hostile commands contained, malformed calls answered, nothing left after close), infra failures masked."""

import json
import os
import subprocess

import pytest

from rz_agents.envs.harbor.env import ShellTaskEnv
from rz_agents.envs.harbor.shell import ShellLimits
from rz_agents.envs.harbor.task import load_task, packaged_tasks_dir
from rz_agents.envs.harbor.trial import Trial
from rz_agents.envs.python_tool.local import bwrap_problem

pytestmark = pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap unusable: {bwrap_problem()}")

TASKS = packaged_tasks_dir()


def call(command: str) -> str:
    return "<tool_call>" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "</tool_call>"


def _processes_of(uid: int) -> list[str]:
    out = subprocess.run(["ps", "-e", "-o", "uid=,pid=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.split() and line.split()[0] == str(uid)]


def test_an_episode_solves_a_task_through_the_bash_tool_and_is_scored_by_its_verifier():
    env = ShellTaskEnv(tasks=str(TASKS), names=["csv-sum"])
    messages, info = env.reset(seed=0)
    assert info["task_id"] == "csv-sum" and info["tools"][0]["function"]["name"] == "bash"
    assert "amount" in messages[-1]["content"]
    obs, reward, done, _, _ = env.step(call("head -2 sales.csv"))
    assert not done and reward == 0.0 and obs[0]["content"].startswith("[exit code 0]\nid,region,amount")
    env.step(call("awk -F, 'NR>1{s+=$3} END{print s}' sales.csv > total.txt"))
    obs, reward, done, _, info = env.step("Done: the total is in /app/total.txt.")
    assert done and reward == 1.0 and info["verifier_error"] is None
    env.close()


def test_an_agent_that_stops_without_doing_the_task_scores_zero_and_so_does_a_truncated_one():
    env = ShellTaskEnv(tasks=str(TASKS), names=["csv-sum"], max_turns=2)
    env.reset(seed=0)
    assert env.step("I give up.")[1] == 0.0
    env.reset(seed=1)
    env.step(call("ls"))
    _, reward, terminated, truncated, _ = env.step(call("echo 499 > total.txt"))
    assert (reward, terminated, truncated) == (0.0, False, True)
    env.close()


def test_malformed_calls_get_an_error_observation_and_the_episode_goes_on():
    env = ShellTaskEnv(tasks=str(TASKS), names=["hello-file"])
    env.reset(seed=0)
    bad = [
        '<tool_call>{"name": "bash", "arguments": {"command": 5}}</tool_call>',
        '<tool_call>{"name": "bash", "arguments": {}}</tool_call>',
        "<tool_call>{not json</tool_call>",
        '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>',
        call(""),
    ]
    for text in bad:
        obs, reward, done, _, _ = env.step(text) if not env._done else (None, 0, True, 0, 0)
        assert not done and obs[0]["content"].startswith("Error"), (text, obs)
        env.reset(seed=0)
    env.close()


def test_hostile_commands_are_contained():
    task = load_task(TASKS / "hello-file")
    with Trial(task, ShellLimits(wall_s=5, processes=64, file_bytes=1 << 20, output_bytes=2048)) as trial:
        # no network, read-only system, no host files, no privileges
        assert (
            trial.run("python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), 2)'").exit_code
            != 0
        )
        assert "Read-only" in trial.run("touch /usr/bin/evil").output
        assert trial.run("ls /work /root/.ssh 2>&1; ls /home 2>&1").exit_code != 0
        assert trial.run("id -u").output.strip() != "0"
        # a fork bomb hits the process limit, dies with its command, and the next command still works
        bomb = trial.run(":(){ :|:& };:", wall_s=3)
        assert bomb.duration_s < 10
        assert _processes_of(trial.shell.uid) == []
        assert trial.run("echo alive").output.strip() == "alive"
        # a huge file is cut at file_bytes; endless output is capped; a hung command dies at its wall time
        assert trial.run("head -c 5000000 /dev/zero > big; stat -c %s big").output.strip().endswith("1048576")
        spam = trial.run("yes rz", wall_s=2)
        assert spam.output_cut > 0 and len(spam.output) < 2200
        slow = trial.run("sleep 60", wall_s=1)
        assert slow.timed_out and slow.exit_code is None and slow.duration_s < 10
        # a background process does not outlive its command
        trial.run("(sleep 300 &) ; nohup sleep 301 >/dev/null 2>&1 &")
        assert _processes_of(trial.shell.uid) == []
        # the verifier's files cannot be planted: /tests and /logs are fresh at verify time
        trial.run("mkdir -p /app/logs; echo 1 > /app/reward.txt")
        assert trial.verify().reward == 0.0


def test_close_deletes_the_workspace_and_leaves_no_process():
    env = ShellTaskEnv(tasks=str(TASKS), names=["hello-file"])
    env.reset(seed=0)
    trial = env.trial
    env.step(call("sleep 200 & echo started"))
    workspace, uid = trial.dir, trial.shell.uid
    assert workspace.exists()
    env.close()
    assert not workspace.exists() and _processes_of(uid) == []


def test_an_environment_that_cannot_be_built_is_an_infra_failure_not_a_zero(tmp_path):
    d = tmp_path / "broken"
    for sub in ("environment", "tests", "solution"):
        (d / sub).mkdir(parents=True)
    (d / "instruction.md").write_text("Do it.\n")
    (d / "task.toml").write_text('version = "1.0"\n')
    (d / "environment" / "Dockerfile").write_text("FROM debian\nWORKDIR /app\nRUN exit 3\n")
    (d / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (d / "solution" / "solve.sh").write_text("true\n")
    env = ShellTaskEnv(tasks=str(tmp_path))
    _, info = env.reset(seed=0)
    assert "RUN 'exit 3' failed" in info["infra_failure"]
    _, _, done, _, info = env.step(call("ls"))
    assert done and info["infra_failure"]
    env.close()


def test_a_task_given_per_episode_by_path_and_unknown_names_are_refused():
    env = ShellTaskEnv(tasks=str(TASKS))
    _, info = env.reset(seed=0, options={"task": {"path": str(TASKS / "git-tag")}})
    assert info["task_id"] == "git-tag"
    env.close()
    with pytest.raises(ValueError, match="no-such-task"):
        ShellTaskEnv(tasks=str(TASKS), names=["no-such-task"])


def test_no_process_of_any_sandbox_user_survives_the_tests():
    # every sandbox uid is >= 2,000,000: none may be left running
    out = subprocess.run(["ps", "-e", "-o", "uid="], capture_output=True, text=True).stdout
    assert not [u for u in out.split() if int(u) >= 2_000_000 and os.geteuid() == 0]
