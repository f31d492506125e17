"""A verifiers taskset that serves a tool (a ``vf.Toolset`` MCP server): the adapter refuses it."""

from __future__ import annotations

import verifiers.v1 as vf


class EchoToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "echo"

    @vf.tool
    def echo(self, text: str) -> str:
        """Return the text unchanged."""
        return text


class ToolTask(vf.Task[vf.TaskData]):
    @classmethod
    def toolsets(cls, config):
        return [EchoToolset(vf.ToolsetConfig())]

    @vf.reward
    async def said(self, trace: vf.Trace) -> float:
        return float("hi" in trace.last_reply)


class ToolTaskset(vf.Taskset[ToolTask, vf.TasksetConfig]):
    def load(self):
        yield ToolTask(vf.TaskData(prompt="Echo hi with the tool."), self.config.task)


__all__ = ["ToolTaskset"]
