"""A verifiers (0.4) taskset whose reward no reply scores 0 on: ``1 / (1 + len(reply))``. A tiny untrained
policy earns it too, so a test can tell the taskset's own reward reached the trained batch (the Ray runtime's
env workers score it in their processes: tests/runtime/test_ray_envs.py)."""

from __future__ import annotations

import verifiers.v1 as vf


class BrevityTask(vf.Task[vf.TaskData]):
    @vf.reward(weight=1.0)
    async def brevity(self, trace: vf.Trace) -> float:
        return 1.0 / (1.0 + len(trace.last_reply))


class BrevityConfig(vf.TasksetConfig):
    num_tasks: int = 4


class BrevityTaskset(vf.Taskset[BrevityTask, BrevityConfig]):
    def load(self):
        for i in range(self.config.num_tasks):
            yield BrevityTask(vf.TaskData(id=f"b{i}", prompt=f"Say something short ({i})."), self.config.task)


__all__ = ["BrevityTaskset"]
