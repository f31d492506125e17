"""A verifiers (0.4, ``verifiers.v1``) taskset written as ``vf init`` scaffolds one: TaskData with the row's
own field, a Task scoring the reply with ``@vf.reward``, a TasksetConfig and a Taskset exported in
``__all__``. Loaded by verifiers' own loader as ``verifiers:rz-vf-reverse`` (this folder on sys.path: a
verifiers taskset is a top-level package)."""

from __future__ import annotations

import verifiers.v1 as vf

WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "piano")


class ReverseData(vf.TaskData):
    answer: str = ""


class ReverseTask(vf.Task[ReverseData]):
    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip().lower() == self.data.answer)

    @vf.reward(weight=0.5)
    async def starts_right(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip().lower()[:1] == self.data.answer[:1])

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class ReverseConfig(vf.TasksetConfig):
    num_tasks: int = 8
    """How many words to ask for."""


class ReverseTaskset(vf.Taskset[ReverseTask, ReverseConfig]):
    def load(self):
        for i, word in enumerate(WORDS[: self.config.num_tasks]):
            data = ReverseData(
                id=f"w{i}",
                prompt=f"Reverse the word {word}.",
                system_prompt="Answer with the reversed word only.",
                answer=word[::-1],
            )
            yield ReverseTask(data, self.config.task)


__all__ = ["ReverseTaskset"]
