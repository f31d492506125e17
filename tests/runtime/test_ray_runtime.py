"""The Ray runtime against the local one, on the shared two-node test cluster (conftest.py).

What is deterministic under Ray, and tested here:
- sync mode (1 engine, 1 env worker, 1 learner rank; and 2 engines, 2 env workers): trajectories and weights
  are those of the local runtime, bit for bit, step after step;
- rollout.fixed_lag (async): the same, because each batch is generated with the weights published for it;
- async mode, any actors layout (2 engines, 2 env workers, actors killed mid-run): every trajectory is a pure
  function of its task, its episode seed and the policy versions its tokens record. Replayed in one process
  with those weights, each single-version trajectory comes out identical (tokens, log-probs, reward).
What is not: in async mode, which version samples which token (when a publication lands between engine
steps), which groups finish first and so which batch trains on them, and how many groups go stale; these
follow the OS and Ray's scheduling, as in the local runtime.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams
from rz_agents.rollout.agent_loop import EpisodeLimits, EpisodeSpec, run_episode
from rz_agents.runtime import (
    ActorsConfig,
    EnvSpec,
    LearnerSpec,
    LocalRun,
    ModelSpec,
    RolloutSpec,
    TrainConfig,
    build_run,
)
from rz_agents.runtime.factories import build_model, build_tokenizer, vocab_size
from rz_agents.runtime.synthetic_env import LowercaseLettersEnv
from rz_agents.trainer.checkpoint import load_checkpoint
from rz_agents.trainer.optim import OptimConfig
from tests.cli.test_train_resume import lowercase_episodes

ray = pytest.importorskip("ray")

ROLLOUT_NODE = {"rollout_node": 0.01}
LEARNER_NODE = {"learner_node": 0.01}
LIMITS = EpisodeLimits(max_turns=2, max_tokens_per_turn=8, max_episode_tokens=200)


def _cfg(runtime="ray", mode="sync", steps=4, actors=None, env_latency=0.0, **kw):
    rollout = dict(group_size=2, groups_per_batch=2, max_concurrent_episodes=8, max_lag=8, limits=LIMITS)
    rollout.update(kw.pop("rollout", {}))
    extra = {"actors": actors or ActorsConfig()} if runtime == "ray" else {}
    return TrainConfig(
        runtime=runtime,
        mode=mode,
        steps=steps,
        seed=5,
        num_threads=1,
        env=EnvSpec(kwargs={"max_turns": 2, "latency_s": env_latency}),
        engine=EngineConfig(max_running=16, max_len=256, max_batch_tokens=512),
        rollout=RolloutSpec(**rollout),
        learner=LearnerSpec(optim=OptimConfig(lr=1e-2), assert_lag0_exact=kw.pop("exact", True)),
        **extra,
        **kw,
    )


class _StepHook:
    """Stands in for the run's metrics writer: calls ``on_step(step)`` after each learner step."""

    def __init__(self, inner, on_step) -> None:
        self.inner, self.on_step = inner, on_step

    def write(self, step, metrics) -> None:
        if self.inner:
            self.inner.write(step, metrics)
        self.on_step(step)

    def close(self) -> None:
        if self.inner:
            self.inner.close()


def record_batches(run) -> list:
    """The batches ``run``'s learner takes, appended in training order as it takes them."""
    batches = []
    take = run.controller.next_batch

    async def recording(version):
        batch = await take(version)
        batches.append(batch)
        return batch

    run.controller.next_batch = recording
    return batches


def _train(run, on_step=None):
    """Train ``run``; returns (summary, batches in training order, final weights)."""
    batches = record_batches(run)
    if on_step is not None:
        run.writer = _StepHook(run.writer, on_step)
    summary = asyncio.run(run.train())
    if isinstance(run, LocalRun):
        weights = {k: v.clone() for k, v in run.learner.weights().items()}
    else:
        weights = dict(ray.get(run.learner.weights_ref()).tensors)
    return summary, batches, weights


def _run(cfg, on_step=None):
    run = build_run(cfg)
    try:
        summary, batches, weights = _train(run, on_step)
        return run, summary, batches, weights
    finally:
        run.close()


def _same_trajectories(a, b):
    assert len(a) == len(b)
    for batch_a, batch_b in zip(a, b, strict=True):
        assert [t.to_dict() for t in batch_a] == [t.to_dict() for t in batch_b]


def _same_weights(a, b):
    assert set(a) == set(b)
    for k, v in a.items():
        assert torch.equal(v, b[k]), k


@pytest.fixture(scope="module")
def local_sync():
    run, summary, batches, weights = _run(_cfg(runtime="local"))
    return run.history, batches, weights


@pytest.mark.parametrize(
    "engines, env_workers", [(1, 1), (2, 2)], ids=["1-engine", "2-engines-2-env-workers"]
)
def test_ray_sync_run_equals_the_local_run_bit_for_bit(ray_cluster, local_sync, engines, env_workers):
    """Each episode is a function of its task, seed and weights: how many replicas and workers serve the
    episodes does not change them."""
    history, batches, weights = local_sync
    actors = ActorsConfig(engines=engines, env_workers=env_workers)
    run, summary, ray_batches, ray_weights = _run(_cfg(actors=actors))
    assert summary["steps"] == 4 and summary["version"] == 4
    _same_trajectories(batches, ray_batches)
    _same_weights(weights, ray_weights)
    for mine, theirs in zip(run.history, history, strict=True):
        assert mine["loss"] == theirs["loss"] and mine["lag0_abs_dlogp_max"] == 0.0
        assert mine["engine_version"] == theirs["engine_version"] == mine["step"] + 1


def test_fixed_lag_runs_are_the_same_in_both_runtimes(ray_cluster):
    cfg = dict(mode="async", steps=4, exact=False, rollout={"fixed_lag": 2})
    local, _, local_batches, local_weights = _run(_cfg(runtime="local", **cfg))
    run, _, ray_batches, ray_weights = _run(_cfg(**cfg))
    _same_trajectories(local_batches, ray_batches)
    _same_weights(local_weights, ray_weights)
    for step, m in enumerate(run.history):
        assert m["lag_min"] == m["lag_max"] == min(step, 2)
        assert m["engine_version"] == max(step + 1 - 2, 0)


def _when_alive(method, timeout_s=120.0):
    """The method's result once its actor is up again (Ray restarts a killed actor)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(method.remote(), timeout=30)
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _replay(cfg, trajectory, weights, version):
    """Run the trajectory's episode again in one process: same task, seeds and (single) policy version."""
    tokenizer, template = build_tokenizer(cfg.tokenizer)
    model = build_model(cfg.model, vocab_size(cfg.tokenizer, tokenizer))
    model.load_state_dict(weights)
    engine = RZEngine(
        model, dataclasses.replace(cfg.engine, num_threads=1), tokenizer.decode, version=version
    )
    env = LowercaseLettersEnv(max_turns=2)
    r = cfg.rollout
    info = trajectory.info
    spec = EpisodeSpec(None, trajectory.group_id, info["member"], info["seed"], info["reset_seed"])
    sampling = SamplingParams(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p)
    return asyncio.run(run_episode(engine, env, template, tokenizer, spec, sampling, r.limits))


def test_killed_env_worker_and_engine_cost_only_their_episodes_and_async_trajectories_replay_exactly(
    ray_cluster,
):
    # Weights go by torch.distributed broadcast (gloo) until the engine dies, then through the object store.
    actors = ActorsConfig(engines=2, env_workers=2, weight_transport="broadcast")
    cfg = _cfg(
        mode="async",
        steps=6,
        actors=actors,
        env_latency=0.05,
        exact=False,
        rollout={"max_ahead_batches": 2, "max_lag": 4},
    )
    run = build_run(cfg)
    published = {0: dict(ray.get(run.learner.weights_ref()).tensors)}
    killed = {}

    def on_step(step):
        published[step + 1] = dict(ray.get(run.learner.weights_ref()).tensors)  # what the engines got
        # Mid-run, while the next batch's episodes are in flight (rollouts run up to 2 batches ahead).
        if step == 1:
            killed["env_worker"] = run.env_workers[0]
            ray.kill(run.env_workers[0], no_restart=False)
        if step == 3:
            killed["engine"] = run.engine.replicas[0].actor
            ray.kill(run.engine.replicas[0].actor, no_restart=False)

    try:
        summary, batches, _ = _train(run, on_step)
        rollout = summary["rollout"]
        # The run finished, the losses were counted, and Ray restarted both actors.
        assert summary["steps"] == 6 and summary["version"] == 6
        assert rollout["episodes_rerun"] + rollout["episodes_lost"] >= 2, rollout
        assert run.engine.counters["replicas_lost"] == 1
        assert _when_alive(killed["engine"].node) and _when_alive(killed["env_worker"].node)
        assert run.publications["broadcast"] >= 3 and run.publications["object_store"] >= 1
        assert all(m.get("lag0_abs_dlogp_max", 0.0) == 0.0 for m in run.history)
    finally:
        run.close()
    # No trajectory twice, none truncated: every trained episode ran all its turns.
    trained = [t for batch in batches for t in batch]
    keys = [(t.group_id, t.info["member"]) for t in trained]
    assert len(keys) == len(set(keys))
    for t in trained:
        t.validate()
        assert t.info["turns"] == 2 and t.info["finish"] in ("truncated", "max_turns")
    for m in run.history:
        assert m["lag_max"] <= 4
    # Async scheduling decided the versions; given them, each episode is reproducible.
    replayed = 0
    for t in trained:
        versions = set(t.sampled_versions())
        if len(versions) == 1:
            (v,) = versions
            again = _replay(cfg, t, published[v], v)
            assert again.to_dict() == t.to_dict()
            replayed += 1
    assert replayed >= len(trained) // 2, (replayed, len(trained))


class _RecordingReplica:
    """An engine actor handle that records which episode (asyncio task) each generate call came from."""

    def __init__(self, actor, index: int, calls: list) -> None:
        self._actor, self._index, self._calls = actor, index, calls

    def __getattr__(self, name):
        method = getattr(self._actor, name)
        if name != "generate":
            return method
        index, calls = self._index, self._calls

        class _Generate:
            @staticmethod
            def remote(*args):
                calls.append((asyncio.current_task(), index))  # (holding the task: ids are reused)
                return method.remote(*args)

        return _Generate


def test_two_nodes_learner_ranks_sharded_with_fsdp2_and_engines_on_the_other_node(
    ray_cluster, local_sync, tmp_path
):
    history, _, _ = local_sync
    actors = ActorsConfig(
        engines=2,
        env_workers=1,
        learner_ranks=2,
        engine_resources=ROLLOUT_NODE,
        env_worker_resources=ROLLOUT_NODE,
        learner_resources=LEARNER_NODE,
    )
    run = build_run(_cfg(steps=2, actors=actors, output_dir=str(tmp_path)))
    try:
        head = ray_cluster.head_node.node_id
        engine_nodes = {ray.get(r.actor.node.remote()) for r in run.engine.replicas}
        assert engine_nodes == {head} and ray.get(run.env_workers[0].node.remote()) == head
        assert len(set(run.learner.nodes)) == 1 and head not in run.learner.nodes
        calls = []
        for r in run.engine.replicas:
            r.actor = _RecordingReplica(r.actor, r.index, calls)
        summary, _, _ = _train(run)
    finally:
        run.close()
    assert summary["steps"] == 2
    # Each episode (2 turns) stayed on one replica; new episodes went to the least-loaded one.
    by_episode = {}
    for episode, replica in calls:
        by_episode.setdefault(episode, set()).add(replica)
    assert len(by_episode) == 2 * 2 * 2 and all(len(r) == 1 for r in by_episode.values())
    per_replica = [sum(1 for r in by_episode.values() if r == {i}) for i in range(2)]
    assert per_replica == [4, 4]
    for step, m in enumerate(run.history):
        # Weights crossed nodes: the engines sample with exactly the sharded learner's weights.
        assert m["lag0_abs_dlogp_max"] == 0.0 and m["lag0_token_count"] == m["num_sampled_tokens"] > 0
        assert m["engine_version"] == step + 1
    # Same initial weights and seeds: the first batch and its loss are the one-process learner's, bitwise.
    assert run.history[0]["loss"] == history[0]["loss"]
    assert run.history[0]["reward_mean"] == history[0]["reward_mean"]
    # The inspector's records (inspect_steps 0 and -1) were scored on the sharded ranks: in sync mode every
    # sampled token's learner log-prob is its behavior log-prob, bitwise.
    for step in (0, 1):
        record = json.loads((tmp_path / "inspect" / f"step_{step:05d}.json").read_text())
        assert record["version"] == step and len(record["episodes"]) == 4
        for e in record["episodes"]:
            sampled = [i for i, m in enumerate(e["loss_mask"]) if m]
            assert sampled and all(e["learner_logprobs"][i] == e["behavior_logprobs"][i] for i in sampled)


def test_a_dead_learner_rank_ends_the_run_and_resume_continues_it_bit_for_bit(
    ray_cluster, local_sync, tmp_path
):
    from rz_agents.runtime.ray.learner import LearnerLost

    _, _, weights = local_sync
    cfg = _cfg(output_dir=str(tmp_path), checkpoint_every=1)
    run = build_run(cfg)

    def on_step(step):
        if step == 1:  # before this step's checkpoint: the last one left is step 0's
            ray.kill(run.learner.actors[0])

    try:
        with pytest.raises(LearnerLost):
            _train(run, on_step)
    finally:
        run.close()
    assert load_checkpoint(tmp_path / "checkpoint.pt", restore_rng=False)["learner"]["version"] == 1
    resumed, summary, _, resumed_weights = _run(
        dataclasses.replace(cfg, resume_from=str(tmp_path / "checkpoint.pt"))
    )
    assert summary["steps"] == 4 and summary["steps_this_run"] == 3
    _same_weights(weights, resumed_weights)


def test_a_graceful_stop_saves_at_the_step_boundary_and_resume_continues_it_bit_for_bit(
    ray_cluster, local_sync, tmp_path
):
    """The stop `rz train` requests on SIGINT / SIGTERM (runtime/stop.py): the Ray run stops after the step
    it is in, saves the learner ranks' state there (no periodic checkpoint), and the resume finishes it with
    the uninterrupted local run's weights."""
    from rz_agents.runtime.stop import StopRequest

    _, _, weights = local_sync
    cfg = _cfg(output_dir=str(tmp_path), checkpoint_every=100)
    run = build_run(cfg)
    stop = StopRequest()
    run.writer = _StepHook(run.writer, lambda step: stop.request(15) if step == 1 else None)
    try:
        stopped = asyncio.run(run.train(stop))["stopped"]
    finally:
        run.close()
    assert stopped == {"signal": "SIGTERM", "signum": 15, "checkpoint": str(tmp_path / "checkpoint.pt")}
    assert load_checkpoint(tmp_path / "checkpoint.pt", restore_rng=False)["runtime"]["steps_done"] == 2
    resume = dataclasses.replace(cfg, resume_from=str(tmp_path / "checkpoint.pt"))
    _, summary, _, resumed_weights = _run(resume)
    assert summary["steps"] == 4 and summary["steps_this_run"] == 2
    _same_weights(weights, resumed_weights)


def test_rz_train_with_runtime_ray_warm_starts_trains_and_exports(ray_cluster, tmp_path, capsys):
    """The CLI path: the warm start trains the driver's copy, then learner ranks and engines take it."""
    import json

    from rz_agents.cli import main
    from rz_agents.model.checkpoint import load_hf_checkpoint

    episodes = lowercase_episodes(tmp_path)  # the default env (lowercase letters): answers of its own
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(
        "steps: 2\nnum_threads: 1\nmode: sync\nruntime: ray\n"
        "rollout:\n  group_size: 2\n  groups_per_batch: 2\n  max_concurrent_episodes: 4\n"
        "  limits: {max_turns: 2, max_tokens_per_turn: 8, max_episode_tokens: 200}\n"
        "engine: {max_running: 8, max_len: 256}\nenv:\n  kwargs: {latency_s: 0.0}\n"
        "learner: {assert_lag0_exact: true}\n"
        f"warm_start: {{episodes: {episodes}, epochs: 1, batch_size: 8, warmup_steps: 0}}\n"
    )
    run_dir = tmp_path / "run"
    assert main(["train", str(cfg), "--run-dir", str(run_dir), "--no-progress"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["lag0_max_abs_dlogp"] == 0.0
    warm = load_hf_checkpoint(run_dir / "warm_start_model")
    final = load_hf_checkpoint(run_dir / "final_model")
    initial = build_model(_cfg().model, 320)
    # The warm start changed the policy, RL changed it again: each export holds its own weights.
    for a, b in ((initial, warm), (warm, final)):
        before = a.state_dict()
        assert any(not torch.equal(before[k], v) for k, v in b.state_dict().items())
    assert "=== rz train: summary ===" in capsys.readouterr().out


def test_sharded_learner_ranks_start_from_a_checkpoint_on_the_meta_device(ray_cluster, tmp_path):
    """learner_ranks 2 with model.checkpoint: each rank shards a meta skeleton and cuts its shards from the
    checkpoint (no rank builds the whole model); the engines sample with exactly those weights, and the first
    step is the one-process learner's, which builds the whole model."""
    from rz_agents.model import ModelConfig, Transformer
    from rz_agents.model.checkpoint import save_hf_checkpoint

    model = Transformer(ModelConfig.tiny("qwen3", vocab_size=320))
    model.reset_parameters(std=0.05, seed=4)
    spec = ModelSpec(checkpoint=str(save_hf_checkpoint(model, tmp_path / "ckpt")))
    local, local_summary, _, _ = _run(_cfg(runtime="local", steps=1, model=spec))
    run, summary, _, _ = _run(_cfg(steps=1, actors=ActorsConfig(learner_ranks=2), model=spec))
    assert summary["steps"] == local_summary["steps"] == 1
    first, expected = run.history[0], local.history[0]
    assert first["lag0_abs_dlogp_max"] == 0.0 and first["lag0_token_count"] > 0
    assert first["loss"] == expected["loss"] and first["reward_mean"] == expected["reward_mean"]
