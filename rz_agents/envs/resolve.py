"""From a config's ``env.id`` to something to build: plugins, ``imports``, the three id forms, kwargs checks.

``env.id`` is one of

* a registered Gymnasium id (``rz_agents/PythonTool-v0``, or one a plugin or an ``imports:`` module
  registered: ``myenvs/ReverseWord-v0``);
* Gymnasium's ``module:env-id`` (``myenvs:myenvs/ReverseWord-v0``): ``module`` is imported, then the id
  is looked up;
* ``module:Class`` (``myenvs:ReverseWordEnv``): the class itself, with the defaults (and wrappers) of its
  registration when exactly one registered id has it as its entry point;
* an adapter's ``verifiers:NAME`` or ``openenv:URL`` (``rz_agents.envs.adapters``, docs/env_adapters.md).

Plugins: every entry point of the group ``rz_agents.envs`` (``[project.entry-points."rz_agents.envs"]
myenvs = "myenvs"`` in a package's pyproject.toml) is loaded before an id is resolved; one that names a
function is called. Each failure is one ValueError line naming the culprit, with a did-you-mean.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium
from gymnasium.envs.registration import load_env_creator

from rz_agents.envs.adapters import resolve_adapter

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "rz_agents.envs"
_loaded_plugins: set[str] = set()


def _did_you_mean(word: str, choices: Sequence[str], prefix: str = "", cutoff: float = 0.6) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def load_env_plugins() -> list[str]:
    """Load every entry point of the ``rz_agents.envs`` group not loaded yet; return their names.

    An entry point naming a module registers its envs by being imported; one naming a callable is called
    with no argument. A plugin that fails is logged (one warning naming it) and skipped: a broken package
    installed next to rz_agents must not stop every run.
    """
    loaded = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        key = f"{ep.name}={ep.value}"
        if key in _loaded_plugins:
            continue
        _loaded_plugins.add(key)
        try:
            target = ep.load()
            if callable(target) and not inspect.ismodule(target):
                target()
        except Exception as exc:  # noqa: BLE001 - any plugin error: reported, not fatal
            log.warning(
                "env plugin %r (%s) failed to load: %s: %s", ep.name, ep.value, type(exc).__name__, exc
            )
            continue
        loaded.append(ep.name)
    return loaded


# A module name is checked against every installed module: a looser match suggests unrelated ones
# ('rayenvs' -> 'rz_agents' scores 0.62); a typo of a letter or two ('lookup_env' -> 'lookup_envs')
# scores >= 0.9.
MODULE_CUTOFF = 0.8


def _missing_module_hint(module_name: str) -> str:
    parent, _, leaf = module_name.rpartition(".")
    siblings: list[str] = []
    if parent:
        try:
            siblings = [m.name for m in pkgutil.iter_modules(importlib.import_module(parent).__path__)]
        except (ImportError, AttributeError):
            siblings = []
        return _did_you_mean(leaf, siblings, prefix=f"{parent}.", cutoff=MODULE_CUTOFF)
    return _did_you_mean(leaf, [m.name for m in pkgutil.iter_modules()], cutoff=MODULE_CUTOFF)


def _working_directory_hint(module_name: str) -> str:
    """The hint for a module that lies in the working directory, which the ``rz`` command does not put on
    sys.path (``python -m`` does): env workers in other processes must find it too, so say how."""
    top = module_name.partition(".")[0]
    cwd = Path.cwd()
    if not ((cwd / top / "__init__.py").is_file() or (cwd / f"{top}.py").is_file()):
        return ""
    if importlib.util.find_spec(top) is not None:
        return ""  # the package is importable (from elsewhere, or the path has the directory): not the cause
    return (
        f" (it is in the working directory {cwd}, which is not on the import path: run "
        f"`PYTHONPATH=. rz ...`, or `pip install -e .` your package)"
    )


def import_module(module_name: str, where: str) -> Any:
    """Import ``module_name`` for the config field ``where``; ValueError naming the field and the cause."""
    try:
        found = importlib.util.find_spec(module_name) is not None
    except (ModuleNotFoundError, ValueError):  # a parent package is missing
        found = False
    if not found:
        hint = _working_directory_hint(module_name) or _missing_module_hint(module_name)
        raise ValueError(f"{where}: no module named {module_name!r}{hint}")
    try:
        return importlib.import_module(module_name)
    except Exception as exc:
        raise ValueError(f"{where}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc


def import_modules(names: Sequence[str], field_name: str = "imports") -> None:
    """Import a config's ``imports:`` (modules that register envs); ValueError naming the entry."""
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{field_name}[{i}]: expected a module name, got {name!r}")
        import_module(name.strip(), f"{field_name}[{i}]")


@dataclass(frozen=True)
class EnvTarget:
    """What ``env.id`` resolved to: a registered Gymnasium id (built with ``gymnasium.make``, wrappers kept)
    or a class (called with the kwargs)."""

    env_id: str
    gym_id: str | None = None
    cls: Any = None
    defaults: dict[str, Any] = field(default_factory=dict)

    def constructor(self) -> Callable[..., Any]:
        """The callable whose signature the kwargs must fit (the registered entry point, or the class)."""
        if self.gym_id is None:
            return self.cls
        entry = gymnasium.spec(self.gym_id).entry_point
        return load_env_creator(entry) if isinstance(entry, str) else entry

    def make(self, **kwargs: Any) -> Any:
        """One env instance. A Gymnasium id keeps the wrappers its registration gives (TimeLimit for
        ``max_episode_steps``, ``additional_wrappers``, order enforcing); the passive env checker stays off
        (it expects array spaces)."""
        if self.gym_id is None:
            return self.cls(**kwargs)
        return gymnasium.make(self.gym_id, disable_env_checker=True, **kwargs)


def _registered_ids() -> list[str]:
    return list(gymnasium.registry)


def _specs_of(module_name: str, name: str, obj: Any) -> list[str]:
    """The registered ids whose entry point is ``module_name:name`` (or the object itself)."""
    wanted = f"{module_name}:{name}"
    return [i for i, s in gymnasium.registry.items() if s.entry_point == wanted or s.entry_point is obj]


def resolve_env(env_id: str) -> EnvTarget:
    """Resolve ``env_id`` (see the module docstring); ValueError with a did-you-mean when it names nothing."""
    if not isinstance(env_id, str) or not env_id.strip():
        raise ValueError("env.id is empty")
    load_env_plugins()
    adapted = resolve_adapter(env_id)
    if adapted is not None:
        return adapted
    if env_id in gymnasium.registry:
        return EnvTarget(env_id, gym_id=env_id)
    if ":" not in env_id:
        hint = _did_you_mean(env_id, _registered_ids()) or (
            f"; an id your package registers needs it imported: env.id: PACKAGE:{env_id}, or imports: "
            "[PACKAGE]"
        )
        raise ValueError(f"env.id: no Gymnasium env {env_id!r} is registered{hint}")
    module_name, _, name = env_id.partition(":")
    module = import_module(module_name, f"env.id {env_id!r}")
    if name in gymnasium.registry:
        return EnvTarget(env_id, gym_id=name)
    obj = getattr(module, name, None)
    if obj is None or "/" in name:
        classes = [k for k, v in vars(module).items() if isinstance(v, type)]
        registered = [i for i, s in gymnasium.registry.items() if str(s.entry_point).startswith(module_name)]
        hint = _did_you_mean(name, classes + registered)
        raise ValueError(
            f"env.id {env_id!r}: {module_name} has no {name!r}{hint}: neither a class there nor a Gymnasium "
            "id it registers"
        )
    if not callable(obj):
        raise ValueError(
            f"env.id {env_id!r}: {module_name}.{name} is a {type(obj).__name__}, not an env class"
        )
    ids = _specs_of(module_name, name, obj)
    if len(ids) == 1:  # the class is registered: its registered defaults and wrappers apply
        return EnvTarget(env_id, gym_id=ids[0], cls=obj)
    return EnvTarget(env_id, cls=obj)


def _parameters(fn: Callable[..., Any]) -> tuple[dict[str, inspect.Parameter], bool] | None:
    """(named parameters, whether it takes **kwargs), or None when the signature cannot be read."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    named = {
        n: p
        for n, p in sig.parameters.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    return named, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())


def takes_argument(target: EnvTarget, name: str) -> bool:
    """True when the env's constructor names the parameter ``name``."""
    params = _parameters(target.constructor())
    return params is not None and name in params[0]


def check_env_kwargs(target: EnvTarget, kwargs: dict[str, Any]) -> None:
    """Raise ValueError naming the first ``env.kwargs`` key the constructor does not take (with a
    did-you-mean), or the first required argument that neither the registration nor env.kwargs gives."""
    fn = target.constructor()
    params = _parameters(fn)
    if params is None:
        return
    named, var_kw = params
    what = getattr(fn, "__qualname__", None) or repr(fn)
    if not var_kw:
        for key in kwargs:
            if key not in named:
                hint = _did_you_mean(key, list(named))
                raise ValueError(
                    f"env.kwargs.{key}: {what}() takes no argument {key!r}{hint}; it takes "
                    f"{', '.join(named) or 'none'}"
                )
    given = {**(gymnasium.spec(target.gym_id).kwargs if target.gym_id else {}), **kwargs}
    for n, p in named.items():
        if p.default is inspect.Parameter.empty and n not in given:
            raise ValueError(f"env.kwargs: {what}() needs the argument {n!r}; set env.kwargs.{n}")


def run_kwargs(target: EnvTarget, kwargs: dict[str, Any], max_turns: int | None) -> dict[str, Any]:
    """The kwargs a run builds its envs with: ``env.kwargs``, plus ``max_turns`` when the run has a turn
    limit (``rollout.limits.max_turns``), the env's constructor takes one and env.kwargs leaves it out.

    One turn limit: the run's. An env built with it truncates (and adds its ``_on_truncate`` reward) at the
    same turn the rollout loop would stop; a registered default ``max_turns`` is replaced by it. A different
    ``env.kwargs.max_turns`` is a config error (``check_turn_limit``).
    """
    out = dict(kwargs)
    if max_turns is not None and "max_turns" not in out and takes_argument(target, "max_turns"):
        out["max_turns"] = max_turns
    return out


def check_turn_limit(kwargs: dict[str, Any], max_turns: int) -> None:
    """ValueError when ``env.kwargs.max_turns`` disagrees with ``rollout.limits.max_turns``."""
    if "max_turns" in kwargs and kwargs["max_turns"] != max_turns:
        raise ValueError(
            f"env.kwargs.max_turns ({kwargs['max_turns']!r}) conflicts with rollout.limits.max_turns "
            f"({max_turns}): a run has one turn limit, and the env is built with rollout.limits.max_turns; "
            "set only rollout.limits.max_turns"
        )
