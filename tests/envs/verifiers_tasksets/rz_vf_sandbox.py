"""A verifiers taskset whose reward reads the task's runtime (a sandbox): the adapter refuses it."""

from __future__ import annotations

import verifiers.v1 as vf


class SandboxTask(vf.Task[vf.TaskData]):
    @vf.reward
    async def file_written(self, trace: vf.Trace, runtime: vf.Runtime) -> float:
        return float(bool(await runtime.read("/tmp/out.txt")))


class SandboxTaskset(vf.Taskset[SandboxTask, vf.TasksetConfig]):
    def load(self):
        yield SandboxTask(vf.TaskData(prompt="Write /tmp/out.txt."), self.config.task)


__all__ = ["SandboxTaskset"]
