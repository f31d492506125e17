"""A real env that fails every n-th episode inside step (like a crashed tool sandbox), for the runtime tests."""

import itertools

from rz_agents.runtime.synthetic_env import LowercaseLettersEnv

_episodes = itertools.count()


class FlakyLettersEnv(LowercaseLettersEnv):
    """LowercaseLettersEnv whose every ``fail_every``-th episode raises in its first step."""

    def __init__(self, fail_every: int = 3, **kw) -> None:
        super().__init__(**kw)
        self.fail_every = fail_every
        self._fail = False

    def _reset(self, task, rng):
        self._fail = next(_episodes) % self.fail_every == 0
        return super()._reset(task, rng)

    def _step(self, text):
        if self._fail:
            raise RuntimeError("sandbox crashed")
        return super()._step(text)
