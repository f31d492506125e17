"""A verifiers taskset whose toolset runs in a Docker runtime (a sandbox): the adapter refuses it."""

from __future__ import annotations

import verifiers.v1 as vf


class ShellToolset(vf.Toolset[vf.ToolsetConfig]):
    @vf.tool
    def run(self, command: str) -> str:
        """Run a shell command in the box."""
        return command


class BoxTask(vf.Task[vf.TaskData]):
    @classmethod
    def toolsets(cls, config):
        return [ShellToolset(vf.ToolsetConfig(runtime=vf.DockerConfig()))]

    @vf.reward
    async def done(self, trace: vf.Trace) -> float:
        return 0.0


class BoxTaskset(vf.Taskset[BoxTask, vf.TasksetConfig]):
    def load(self):
        yield BoxTask(vf.TaskData(prompt="List the files."), self.config.task)


__all__ = ["BoxTaskset"]
