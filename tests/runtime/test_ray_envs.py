"""A user's envs and the env ecosystems' adapters under ``runtime: ray``, on the shared two-node test cluster
(conftest.py): the env workers, Ray actors in processes of their own, build the envs themselves (the run's
``imports``, ``env.id`` resolved there), each episode's reset and step run there, and the reward the env
computes there is the one the learner trains on.

The user's package and the verifiers tasksets are on the driver's ``sys.path`` only (as a folder a script or
a notebook adds, not an installed package): the workers find them through the driver's path entries.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from rz_agents.engine import EngineConfig
from rz_agents.rollout.agent_loop import EpisodeLimits, _turn_text
from rz_agents.runtime import ActorsConfig, EnvSpec, RolloutSpec, TrainConfig, build_run
from rz_agents.runtime.factories import build_tokenizer
from tests.envs.user_package import forget, write_package
from tests.runtime.test_ray_runtime import record_batches

ray = pytest.importorskip("ray")

TASKSETS = Path(__file__).parents[1] / "envs" / "verifiers_tasksets"
PACKAGE = "rayenvs"


def _cfg(env: EnvSpec, imports=(), max_turns: int = 1) -> TrainConfig:
    return TrainConfig(
        runtime="ray",
        mode="sync",
        steps=1,
        seed=3,
        num_threads=1,
        env=env,
        imports=list(imports),
        engine=EngineConfig(max_running=8, max_len=256, max_batch_tokens=512),
        rollout=RolloutSpec(
            group_size=2,
            groups_per_batch=2,
            max_concurrent_episodes=4,
            limits=EpisodeLimits(max_turns=max_turns, max_tokens_per_turn=6, max_episode_tokens=200),
        ),
        actors=ActorsConfig(),
    )


def _train(cfg: TrainConfig):
    """Train ``cfg`` (a Ray run); returns (summary, the trained trajectories)."""
    run = build_run(cfg)
    batches = record_batches(run)
    try:
        summary = asyncio.run(run.train())
    finally:
        run.close()
    trained = [t for batch in batches for t in batch]
    assert summary["steps"] == 1 and len(trained) == 4
    assert summary["rollout"]["episodes_failed"] == summary["rollout"]["episodes_lost"] == 0
    return summary, trained


def _replies(trajectory) -> list[str]:
    """The text of each turn the policy sampled, as the env received it."""
    tokenizer, template = build_tokenizer("byte")
    stops = template.stop_token_ids(tokenizer)
    turns, turn = [], []
    for token, sampled in zip(trajectory.tokens, trajectory.loss_mask, strict=True):
        if sampled:
            turn.append(token)
        elif turn:
            turns.append(turn)
            turn = []
    turns += [turn] if turn else []
    return [_turn_text(tokenizer, t, stops)[0] for t in turns]


@pytest.fixture
def package(tmp_path, monkeypatch):
    write_package(tmp_path, PACKAGE, monkeypatch)  # ReverseWordEnv, registered with partial=0.1
    yield tmp_path / PACKAGE
    forget(PACKAGE)


@pytest.mark.parametrize(
    ("env_id", "imports"),
    [
        (f"{PACKAGE}/ReverseWord-v0", [PACKAGE]),
        (f"{PACKAGE}:{PACKAGE}/ReverseWord-v0", []),
        (f"{PACKAGE}:ReverseWordEnv", []),
    ],
    ids=["registered-id-with-imports", "module-colon-env-id", "module-colon-class"],
)
def test_a_users_package_env_trains_in_the_env_workers_with_its_registered_defaults(
    ray_cluster, package, env_id, imports
):
    _, trained = _train(_cfg(EnvSpec(id=env_id, tasks=[{"word": "apple"}]), imports))
    # every miss scores the registration's partial=0.1 (ReverseWordEnv's own default is 0.0)
    for t in trained:
        assert t.reward == (1.0 if _replies(t) == ["elppa"] else 0.1)


def test_an_entry_point_plugin_registers_its_env_in_the_env_workers_too(ray_cluster, tmp_path, monkeypatch):
    from rz_agents.envs import resolve

    name = "rayplugin"  # a package of its own: the driver loads each plugin once per process
    monkeypatch.setattr(resolve, "_loaded_plugins", set())
    write_package(tmp_path, name, monkeypatch)
    dist = tmp_path / f"{name}-0.1.dist-info"  # as pip installs one: no imports: in the config
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[rz_agents.envs]\n{name} = {name}\n")
    try:
        _, trained = _train(_cfg(EnvSpec(id=f"{name}/ReverseWord-v0", tasks=[{"word": "apple"}])))
    finally:
        forget(name)
    for t in trained:
        assert t.reward == (1.0 if _replies(t) == ["elppa"] else 0.1)


def test_an_env_worker_that_cannot_import_the_users_module_is_one_line_at_start(ray_cluster, package):
    cfg = _cfg(EnvSpec(id=f"{PACKAGE}/ReverseWord-v0"), [PACKAGE])
    cfg.validate()  # the driver imports the package; then its folder is gone, as on a node without it
    shutil.rmtree(package)
    with pytest.raises(ValueError) as info:
        build_run(cfg)
    message = str(info.value)
    assert message.startswith("env worker 0 (Ray node ") and "\n" not in message
    assert f"cannot build the run's envs: imports[0]: no module named '{PACKAGE}'" in message


def test_an_id_registered_only_in_the_driver_is_one_line_at_start(ray_cluster):
    import gymnasium

    from rz_agents.envs import register_env
    from rz_agents.runtime.synthetic_env import LowercaseLettersEnv

    register_env("driveronly/Letters-v0", LowercaseLettersEnv)  # in a script, not in a module to import
    try:
        with pytest.raises(ValueError) as info:
            build_run(_cfg(EnvSpec(id="driveronly/Letters-v0")))
    finally:
        del gymnasium.registry["driveronly/Letters-v0"]
    message = str(info.value)
    assert (
        "cannot build the run's envs: env.id: no Gymnasium env 'driveronly/Letters-v0' is registered"
        in message
    )
    assert "\n" not in message


def test_a_verifiers_taskset_trains_scored_by_its_own_reward_in_the_env_workers(ray_cluster, monkeypatch):
    pytest.importorskip("verifiers.v1", reason="verifiers>=0.4 is not installed")
    monkeypatch.syspath_prepend(str(TASKSETS))
    _, trained = _train(_cfg(EnvSpec(id="verifiers:rz-vf-brevity")))
    for t in trained:  # the taskset's @vf.reward: 1 / (1 + len(reply)), never 0
        (reply,) = _replies(t)
        assert t.reward == 1.0 / (1.0 + len(reply)) > 0.0


@pytest.fixture(scope="module")
def openenv_server(tmp_path_factory):
    pytest.importorskip("openenv.core", reason="openenv-core is not installed")
    pytest.importorskip("websockets", reason="websockets (openenv-core's client) is not installed")
    from tests.envs.openenv_server_process import echo_server

    with echo_server(tmp_path_factory.mktemp("openenv")) as url:
        yield url


def test_an_openenv_server_plays_the_episodes_and_its_rewards_are_trained_on(ray_cluster, openenv_server):
    task = {"id": "t", "word": "tiger", "miss_reward": 0.25}  # the server rewards each miss with 0.25
    _, trained = _train(_cfg(EnvSpec(id=f"openenv:{openenv_server}", tasks=[task]), max_turns=2))
    tokenizer, _ = build_tokenizer("byte")
    for t in trained:
        hits = ["tiger" in r.lower() for r in _replies(t)]
        assert t.reward == 0.25 * hits.count(False) + 1.0 * hits.count(True)
        if not hits[0]:  # the server's answer to the first turn is in the episode's tokens
            assert "No. Say the word tiger." in tokenizer.decode(t.tokens)


def test_rz_train_with_runtime_ray_then_rz_eval_run_a_users_package_env(
    ray_cluster, package, tmp_path, capsys
):
    from rz_agents.cli import main

    config = tmp_path / "run.yaml"
    config.write_text(
        f"runtime: ray\nsteps: 1\nmode: sync\nnum_threads: 1\nreport: false\nimports: [{PACKAGE}]\n"
        f"env:\n  id: {PACKAGE}/ReverseWord-v0\n  tasks: [{{word: apple}}]\n"
        "  eval_tasks: [{id: a, word: apple}, {id: t, word: tiger}]\n"
        "rollout:\n  group_size: 2\n  groups_per_batch: 2\n  max_concurrent_episodes: 4\n"
        "  limits: {max_turns: 1, max_tokens_per_turn: 6, max_episode_tokens: 200}\n"
        "engine: {max_running: 4, max_len: 256}\n"
    )
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run_dir), "--no-progress"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["episodes"]["failed"] == 0
    capsys.readouterr()
    # rz eval runs the config's env in its own process (no Ray): the same registered env and defaults
    argv = ["eval", str(run_dir / "config.yaml"), "--checkpoint", str(run_dir / "final_model")]
    assert main([*argv, "--num-threads", "1", "--quiet", "--k", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["env"] == f"{PACKAGE}/ReverseWord-v0" and result["num_samples"] == 4
    assert result["num_failed"] == 0 and result["mean_reward"] >= 0.1
