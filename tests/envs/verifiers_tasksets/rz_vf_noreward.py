"""A verifiers taskset whose task has no ``@vf.reward``: every episode would score 0, so the adapter refuses
it."""

from __future__ import annotations

import verifiers.v1 as vf


class QuietTaskset(vf.Taskset[vf.Task, vf.TasksetConfig]):
    def load(self):
        yield vf.Task(vf.TaskData(prompt="Say anything."), self.config.task)


__all__ = ["QuietTaskset"]
