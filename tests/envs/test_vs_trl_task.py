"""bench/vs_trl.py's task and rz config: the env both sides are scored by rewards exactly a correct boxed
answer, its prompt is the one TRL's dataset holds, and the generated ``rz train`` config validates."""

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    sys.path.insert(0, str(ROOT / "bench"))  # vs_trl imports vs_trl_task by its module name, as rz train does
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_env_rewards_a_correct_boxed_answer_and_nothing_else():
    task = _load("vs_trl_task")
    problem = task.problems(1, seed=0)[0]
    env = task.WordProblemTextEnv()
    messages, _ = env._reset(problem, np.random.default_rng(0))
    assert messages == [{"role": "user", "content": task.prompt_of(problem["question"])}]
    assert env._step(f"so \\boxed{{{problem['answer']}}}")[1] == 1.0
    assert env._step(f"so \\boxed{{{int(problem['answer']) + 1}}}")[1] == 0.0
    assert env._step(problem["answer"])[1] == 0.0  # no boxed answer


def test_the_rz_side_config_validates(tmp_path):
    from rz_agents.cli.train import RunConfig
    from rz_agents.config_io import load_config

    bench = _load("vs_trl")
    a = argparse.Namespace(
        steps=3, seed=0, threads=1, prompts_per_step=2, group_size=8, max_tokens=96, lr=3e-5
    )
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(bench.rz_config(a, tmp_path / "run")))
    cfg = load_config(RunConfig, path, [])
    assert cfg.rollout.group_size * cfg.rollout.groups_per_batch == 16
    assert cfg.warm_start.demos == 0 and cfg.model.checkpoint == "smollm2-135m-instruct"
