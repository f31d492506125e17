"""A verifiers taskset whose task serves a tool (a ``vf.Toolset``, as ``vf init -T`` scaffolds one): the
episode is multi-turn while the policy calls it, and the reward reads the tool's result from the trace."""

from __future__ import annotations

import verifiers.v1 as vf

SECRETS = {"north": "castle", "south": "harbor", "east": "forest"}


class LookupToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "atlas"

    @vf.tool
    def lookup(self, key: str) -> str:
        """Return the code word stored under key."""
        if key not in SECRETS:
            raise KeyError(f"no code word under {key!r}")
        return SECRETS[key]


class LookupData(vf.TaskData):
    key: str = ""


class LookupTask(vf.Task[LookupData]):
    @classmethod
    def toolsets(cls, config):
        return [LookupToolset(vf.ToolsetConfig())]

    @vf.reward
    async def answered(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == SECRETS[self.data.key])

    @vf.metric
    async def looked_up(self, trace: vf.Trace) -> float:
        return float(any(m.content == SECRETS[self.data.key] for m in trace.tool_messages))


class LookupTaskset(vf.Taskset[LookupTask, vf.TasksetConfig]):
    def load(self):
        for key in SECRETS:
            data = LookupData(
                id=key, prompt=f"Look up the code word under {key} and answer with it.", key=key
            )
            yield LookupTask(data, self.config.task)


__all__ = ["LookupTaskset"]
