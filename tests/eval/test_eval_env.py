"""`rz eval RUN/config.yaml --checkpoint DIR`: the run's own env, its tasks, its reward; failures counted."""

from __future__ import annotations

import importlib
import json

import pytest

from rz_agents.cli import main
from rz_agents.envs import MultiTurnTextEnv
from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.checkpoint import save_hf_checkpoint


class TaskRewardEnv(MultiTurnTextEnv):
    """One turn; the reward is the task's own ``reward`` field (whatever the policy writes), so the metrics
    are known exactly. A task with ``boom`` raises from step."""

    def _reset(self, task, rng):
        self.task = task or {"reward": 0.25}
        return "Say anything.", {}

    seen: list[str] = []  # every text the policy wrote, in any instance

    def _step(self, text):
        TaskRewardEnv.seen.append(text)
        if self.task.get("boom"):
            raise RuntimeError("env exploded")
        return None, float(self.task["reward"]), True, {}


TASKS = [{"id": "a", "reward": 1.0}, {"id": "b", "reward": 0.5}, {"id": "c", "reward": 0.0}]
RUN = (
    "tokenizer: byte\nnum_threads: 1\nengine: {{max_running: 4, max_len: 128}}\n"
    "env:\n  id: tests.eval.test_eval_env:TaskRewardEnv\n  eval_tasks: {tasks}\n"
    "rollout: {{limits: {{max_turns: 1, max_tokens_per_turn: 4, max_episode_tokens: 100}}}}\neval: {{}}\n"
)
FAST = ["--num-threads", "1", "--quiet"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    model = Transformer(ModelConfig.tiny("qwen3", vocab_size=320, hidden_size=32, intermediate_size=64))
    model.reset_parameters(seed=0)
    save_hf_checkpoint(model, root / "final_model")
    return root


def _config(run_dir, tasks) -> str:
    path = run_dir / f"config-{abs(hash(json.dumps(tasks)))}.yaml"
    path.write_text(RUN.format(tasks=json.dumps(tasks)))
    return str(path)


def _eval(run_dir, capsys, tasks, *extra) -> tuple[int, str, str]:
    argv = ["eval", _config(run_dir, tasks), "--checkpoint", str(run_dir / "final_model"), *FAST, *extra]
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_run_env_is_evaluated_on_its_eval_tasks_with_its_reward(run_dir, capsys):
    rc, out, _ = _eval(run_dir, capsys, TASKS, "--k", "2", "--json")
    assert rc == 0
    result = json.loads(out)
    assert result["env"] == "tests.eval.test_eval_env:TaskRewardEnv" and "benchmark" not in result
    assert (result["num_tasks"], result["num_samples"], result["num_failed"]) == (3, 6, 0)
    assert result["mean_reward"] == pytest.approx(0.5)
    assert result["success_rate"] == pytest.approx(1 / 3) and result["pass_at_k"] == pytest.approx(1 / 3)
    assert [(t["id"], t["mean_reward"], t["num_success"]) for t in result["tasks"]] == [
        ("a", 1.0, 2),
        ("b", 0.5, 0),
        ("c", 0.0, 0),
    ]


def test_the_threshold_decides_success_and_the_table_prints_the_metrics(run_dir, capsys):
    rc, out, _ = _eval(run_dir, capsys, TASKS, "--k", "1", "--threshold", "0.5")
    assert rc == 0
    assert "success rate (reward >= 0.5): 66.67%" in out and "mean reward: 0.5000" in out
    assert "avg@1: 66.67%   pass@1: 66.67%" in out and "failed samples: 0 of 3" in out
    assert any(line.split()[:3] == ["b", "0.500", "1/1"] for line in out.splitlines())


def test_tasks_file_replaces_the_configs_eval_tasks(run_dir, tmp_path, capsys):
    path = tmp_path / "held_out.jsonl"
    path.write_text('{"id": "x", "reward": 1.0}\n')
    rc, out, _ = _eval(run_dir, capsys, TASKS, "--tasks", str(path), "--k", "1", "--json")
    result = json.loads(out)
    assert rc == 0 and [t["id"] for t in result["tasks"]] == ["x"] and result["mean_reward"] == 1.0


def test_a_failed_sample_is_counted_and_all_failed_exits_non_zero(run_dir, capsys):
    tasks = [*TASKS[:1], {"id": "bad", "reward": 1.0, "boom": True}]
    rc, out, _ = _eval(run_dir, capsys, tasks, "--k", "2", "--json")
    result = json.loads(out)
    assert rc == 0 and result["num_failed"] == 2 and result["mean_reward"] == pytest.approx(0.5)
    assert result["first_error"] == "EpisodeError: env.step failed: RuntimeError: env exploded"
    rc, out, err = _eval(run_dir, capsys, tasks[1:], "--k", "2")
    assert rc == 1
    assert err.strip() == (
        "rz eval: error: all 2 samples failed; the first: EpisodeError: env.step failed: "
        "RuntimeError: env exploded"
    )


def test_save_text_keeps_each_samples_episode_as_the_env_saw_it(run_dir, capsys):
    env_cls = importlib.import_module("tests.eval.test_eval_env").TaskRewardEnv  # the class env.id names
    env_cls.seen.clear()
    rc, out, _ = _eval(run_dir, capsys, TASKS, "--k", "2", "--json", "--save-text")
    samples = [s for t in json.loads(out)["tasks"] for s in t["samples"]]
    assert rc == 0 and len(samples) == 6
    # each text is the policy's turn (turn markers kept); the env received the same turn, markers stripped
    assert sorted(s["text"].removesuffix("<|im_end|>") for s in samples) == sorted(env_cls.seen)
    rc, out, _ = _eval(run_dir, capsys, TASKS, "--k", "1", "--json")
    assert all("text" not in s for t in json.loads(out)["tasks"] for s in t["samples"])


def test_no_eval_tasks_is_one_error_line_naming_the_fixes(run_dir, capsys):
    path = run_dir / "no_tasks.yaml"
    path.write_text(RUN.format(tasks="null"))
    assert main(["eval", str(path), "--checkpoint", str(run_dir / "final_model"), *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rz eval: error: no eval tasks: set eval.num_tasks: N") and "\n" not in err
    assert "env.eval_tasks" in err and err.endswith("(or pass --tasks FILE / --num-tasks N)")
    assert (
        main(["eval", str(path), "--checkpoint", str(run_dir / "final_model"), "--num-tasks", "2", *FAST])
        == 0
    )
    assert "2 tasks, k=4" in capsys.readouterr().out  # the env drew its own tasks


def test_a_benchmark_keeps_the_math_evaluation(run_dir, capsys):
    argv = ["--benchmark", "gsm8k", "--limit", "1", "--k", "1", "--max-tokens", "4", "--json"]
    assert (
        main(["eval", _config(run_dir, TASKS), "--checkpoint", str(run_dir / "final_model"), *FAST, *argv])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["benchmark"] == "gsm8k"
