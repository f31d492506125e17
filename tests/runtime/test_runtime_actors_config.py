"""The runtime / ray / actors fields of the run schema: defaults, YAML round trip, one clear error each."""

import re

import pytest

from rz_agents.config_io import ConfigError, from_dict, load_config, to_dict
from rz_agents.runtime import ActorsConfig, RayConfig, TrainConfig


def _load(tmp_path, text: str) -> TrainConfig:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return load_config(TrainConfig, path)


def test_local_is_the_default_and_a_ray_config_round_trips_through_yaml(tmp_path):
    assert TrainConfig().runtime == "local"
    cfg = _load(
        tmp_path,
        "runtime: ray\nray: {address: auto}\n"
        "actors: {engines: 2, env_workers: 4, learner_ranks: 2, engine_gpus: 0, learner_gpus: 0,\n"
        "            engine_resources: {rollout_node: 0.01}}\n",
    )
    assert cfg.ray == RayConfig(address="auto")
    assert cfg.actors.engines == 2 and cfg.actors.env_workers == 4 and cfg.actors.learner_ranks == 2
    assert cfg.actors.engine_resources == {"rollout_node": 0.01}
    assert from_dict(TrainConfig, to_dict(cfg)) == cfg


@pytest.mark.parametrize(
    "text, message",
    [
        ("runtime: slurm\n", "runtime must be one of"),
        ("runtime: ray\nactors: {engines: 0}\n", "actors.engines must be >= 1"),
        ("runtime: ray\nactors: {learner_ranks: 0}\n", "actors.learner_ranks must be >= 1"),
        (
            "runtime: ray\nactors: {learner_gpus: 0.5}\n",
            "actors.learner_gpus must be 0 or a whole number",
        ),
        ("runtime: ray\nactors: {engine_gpus: -1}\n", "actors.engine_gpus must be >= 0"),
        ("runtime: ray\nactors: {engine_resources: {a: 0}}\n", "actors.engine_resources.a must be > 0"),
        ("runtime: ray\nactors: {actor_restarts: -1}\n", "actors.actor_restarts must be >= 0"),
        ("runtime: ray\nray: {object_store_mb: 10}\n", "ray.object_store_mb must be >= 64"),
        ("runtime: ray\nactors: {weight_transport: nccl}\n", "actors.weight_transport must be one of"),
        (
            "runtime: ray\nactors: {weight_transport: broadcast}\nrollout: {fixed_lag: 2, max_lag: 4, "
            "limits: {max_episode_tokens: 100}}\n",
            "weight_transport: broadcast sends the newest weights only",
        ),
        ("actors: {engines: 2}\n", "actors: is set but runtime is 'local'"),
        ("ray: {address: auto}\n", "ray: is set but runtime is 'local'"),
        ("runtime: ray\nlearner_process: true\n", "local-runtime settings"),
        (
            "runtime: ray\nmodel: {device: cuda}\n",
            "actors.engine_gpus (0.0) conflicts with model.device ('cuda')",
        ),
        (
            "runtime: ray\nactors: {engine_gpus: 1, learner_gpus: 0}\nmodel: {device: cuda}\n",
            "actors.learner_gpus (0.0) conflicts with model.device ('cuda')",
        ),
        (
            "runtime: ray\nactors: {engine_gpus: 1}\n",
            "actors.engine_gpus (1.0) conflicts with model.device",
        ),
        ("runtime: ray\nmodel: {device: 'cuda:1'}\n", "model.device must be cpu or cuda with runtime: ray"),
        (
            "runtime: ray\nactors: {enignes: 2}\n",
            "actors.enignes: unknown field (did you mean engines?)",
        ),
        (
            "rollout: {max_episode_reruns: -1, limits: {max_episode_tokens: 100}}\n",
            "rollout.max_episode_reruns must be >= 0",
        ),
    ],
)
def test_bad_runtime_settings_are_one_error_naming_the_field(tmp_path, text, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        _load(tmp_path, text)


def test_actors_defaults_are_one_of_each_on_cpu():
    p = ActorsConfig()
    assert (p.engines, p.env_workers, p.learner_ranks, p.engine_gpus, p.learner_gpus) == (1, 1, 1, 0, 0)
