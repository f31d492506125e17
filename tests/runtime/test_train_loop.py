"""TrainLoop(cfg, controller, loop_runtime): the runtime's half is an explicit LoopRuntime, and the loop's
step counter is its own (saved in checkpoints, checked against the history on resume)."""

import asyncio

import pytest

from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.rollout.checkpoint_cut import InconsistentCheckpoint
from rz_agents.runtime import LearnerSpec, LocalRun, RolloutSpec, TrainConfig
from rz_agents.runtime.local import LocalLoopRuntime
from rz_agents.runtime.loop_runtime import LoopRuntime
from rz_agents.trainer.checkpoint import load_checkpoint, save_checkpoint
from rz_agents.trainer.optim import OptimConfig


def _cfg(tmp_path, steps=2, **kw):
    return TrainConfig(
        steps=steps,
        num_threads=1,
        output_dir=str(tmp_path / "run"),
        rollout=RolloutSpec(
            group_size=2, groups_per_batch=1, max_concurrent_episodes=2, max_lag=4,
            limits=EpisodeLimits(max_turns=1, max_tokens_per_turn=4, max_episode_tokens=100),
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=1e-2)),
        **kw,
    )  # fmt: skip


def _train(cfg):
    run = LocalRun(cfg)
    try:
        asyncio.run(run.train())
        return run.history, run.steps_done
    finally:
        run.close()


def test_a_loop_runtime_missing_a_hook_fails_when_built_not_mid_run():
    hooks = {name: (lambda self, *args: None) for name in LoopRuntime.__abstractmethods__ - {"send_weights"}}
    missing = type("Missing", (LoopRuntime,), hooks)
    with pytest.raises(TypeError, match="send_weights"):
        missing()
    assert not LocalLoopRuntime.__abstractmethods__  # the local loop runtime implements every hook


def test_checkpoints_carry_the_step_counter_and_a_resume_continues_it(tmp_path):
    history, steps = _train(_cfg(tmp_path, steps=2))
    ckpt = tmp_path / "run" / "checkpoint.pt"
    payload = load_checkpoint(ckpt, restore_rng=False)
    assert payload["runtime"]["steps_done"] == steps == len(history) == 2
    more, steps = _train(_cfg(tmp_path / "b", steps=3, resume_from=str(ckpt)))
    assert steps == len(more) == 3 and [m["step"] for m in more] == [0, 1, 2]


def test_a_checkpoint_whose_counter_disagrees_with_its_history_is_refused(tmp_path):
    _train(_cfg(tmp_path, steps=2))
    ckpt = tmp_path / "run" / "checkpoint.pt"
    payload = load_checkpoint(ckpt, restore_rng=False)
    payload["runtime"]["steps_done"] = 3
    bad = save_checkpoint(tmp_path / "bad.pt", payload["learner"], payload["runtime"])
    with pytest.raises(InconsistentCheckpoint, match="steps_done 3 != 2 learner steps"):
        LocalRun(_cfg(tmp_path / "c", steps=3, resume_from=str(bad)))
    # a checkpoint from before the counter: its history is the count
    del payload["runtime"]["steps_done"]
    old = save_checkpoint(tmp_path / "old.pt", payload["learner"], payload["runtime"])
    _, steps = _train(_cfg(tmp_path / "d", steps=3, resume_from=str(old)))
    assert steps == 3


def test_every_learner_class_has_one_state_api_the_folder_format():
    """Learner, the child-process learner and the Ray learner ranks / group save and load the learner's
    state one way (``save_state(folder)`` / ``load_state(state, folder)``); the whole-tensor
    ``state_dict`` is gone."""
    import inspect

    pytest.importorskip("ray")
    from rz_agents.runtime.learner_process import LearnerProcess
    from rz_agents.runtime.ray.learner import LearnerGroup, LearnerRank
    from rz_agents.trainer.learner import Learner

    def positional(fn) -> list[str]:  # Ray adds a keyword-only _ray_trace_ctx to an actor class's methods
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        return [p.name for p in inspect.signature(fn).parameters.values() if p.kind in kinds]

    for cls in (Learner, LearnerProcess, LearnerRank, LearnerGroup):
        assert not hasattr(cls, "state_dict") and not hasattr(cls, "load_state_dict"), cls.__name__
        assert len(positional(cls.save_state)) == 2, cls.__name__  # (self, folder)
        assert len(positional(cls.load_state)) == 3, cls.__name__  # (self, state, folder)
