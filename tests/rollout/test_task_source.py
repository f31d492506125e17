"""The task stream resumes where it stopped, and refuses a checkpoint counted in another task list."""

import asyncio
import json

import pytest

from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.rollout.task_source import TaskListChanged, TaskSource
from rz_agents.runtime import EnvSpec, LearnerSpec, LocalRun, RolloutSpec, TrainConfig
from rz_agents.trainer.optim import OptimConfig

TASKS = [{"word": w} for w in ("apple", "pear", "plum")]


def test_a_resumed_stream_continues_the_same_sequence():
    a = TaskSource(TASKS, seed=3)
    first = [a.next() for _ in range(4)]
    b = TaskSource(list(TASKS), seed=3)
    b.load_state_dict(a.state_dict())
    assert a.state_dict() == {"position": 4, "task_count": 3, "fingerprint": a.fingerprint}
    assert [b.next() for _ in range(5)] == [a.next() for _ in range(5)] and first


def test_a_checkpoint_of_another_task_list_is_refused_and_nothing_changes():
    saved = TaskSource(TASKS).state_dict() | {"position": 2}
    edited = TaskSource([*TASKS[:2], {"word": "fig"}])
    with pytest.raises(TaskListChanged) as info:
        edited.load_state_dict(saved)
    message = str(info.value)
    assert message.startswith("env.tasks changed since the checkpoint: it was made with 3 tasks")
    assert "\n" not in message and edited.position == 0
    with pytest.raises(TaskListChanged, match="no task list"):
        TaskSource(None).load_state_dict(saved)
    reordered = TaskSource(list(reversed(TASKS)))  # the same tasks in another order pose others too
    with pytest.raises(TaskListChanged):
        reordered.load_state_dict(saved)
    old = TaskSource(TASKS)
    old.load_state_dict({"position": 2})  # a checkpoint from before the fingerprint
    assert old.position == 2


def _cfg(tmp_path, tasks_file, steps, **kw):
    return TrainConfig(
        steps=steps,
        num_threads=1,
        output_dir=str(tmp_path / "run"),
        env=EnvSpec(tasks=str(tasks_file)),
        rollout=RolloutSpec(
            group_size=2, groups_per_batch=1, max_concurrent_episodes=2, max_lag=2,
            limits=EpisodeLimits(max_turns=1, max_tokens_per_turn=4, max_episode_tokens=100),
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=1e-2)),
        **kw,
    )  # fmt: skip


def test_resuming_after_the_task_file_was_edited_is_one_error_line(tmp_path):
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    run = LocalRun(_cfg(tmp_path, tasks_file, steps=1))
    try:
        asyncio.run(run.train())
    finally:
        run.close()
    ckpt = tmp_path / "run" / "checkpoint.pt"
    tasks_file.write_text("".join(json.dumps(t) + "\n" for t in TASKS[:2]))
    with pytest.raises(TaskListChanged, match="it was made with 3 tasks .* now has 2 tasks"):
        LocalRun(_cfg(tmp_path / "again", tasks_file, steps=2, resume_from=str(ckpt)))
