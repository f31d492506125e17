"""Helpers writing a user's env package to disk (outside rz_agents), as a new user would have one."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import gymnasium

ENV_SOURCE = '''
"""A user's env package: one-turn 'reverse the word', registered on import."""
from rz_agents.envs import MultiTurnTextEnv, register_env


class ReverseWordEnv(MultiTurnTextEnv):
    def __init__(self, partial: float = 0.0, max_turns: int = 1):
        super().__init__(max_turns=max_turns)
        self.partial = partial

    def _reset(self, task, rng):
        self.word = (task or {}).get("word") or "apple"
        return f"Reverse the word {self.word}.", {}

    def _step(self, text):
        ok = text.strip() == self.word[::-1]
        return None, 1.0 if ok else self.partial, False, {}


register_env("{NAME}/ReverseWord-v0", "{NAME}:ReverseWordEnv", partial=0.1)
'''


def write_package(root: Path, name: str, monkeypatch) -> Path:
    """Write package ``name`` (ReverseWordEnv, registered as ``{name}/ReverseWord-v0``) under ``root``
    and put ``root`` on sys.path; the registration and the module are removed when the test ends."""
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(ENV_SOURCE).replace("{NAME}", name))
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return pkg


def forget(name: str) -> None:
    """Drop the package's module and its registered ids."""
    sys.modules.pop(name, None)
    for env_id in [i for i in gymnasium.registry if i.startswith(f"{name}/")]:
        del gymnasium.registry[env_id]
