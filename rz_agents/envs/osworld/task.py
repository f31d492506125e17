"""OSWorld task files: parse the JSON format into plain dataclasses, never crashing on a bad file.

A task has an ``id``, a ``snapshot`` (the VM image it assumes), an ``instruction``, ``config``
setup steps, ``related_apps`` and an ``evaluator``: ``func`` (one metric name or a list), ``conj``
(``"and"``/``"or"`` for lists), ``result``/``expected`` getter configs (one or a list, matching
``func``), ``options`` (per metric) and ``postconfig`` steps run before evaluation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the task files packaged with rz (envs/osworld/tasks; ``tasks_path: local``)
LOCAL_TASKS = str(Path(__file__).parent / "tasks")


class TaskFormatError(ValueError):
    """A task file that does not follow the OSWorld JSON format; the message names the field."""


@dataclass
class SetupStep:
    """One setup step: ``{"type": ..., "parameters": {...}}``."""

    type: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class Evaluator:
    """How a task is scored; lists are aligned so metric i reads result[i] and expected[i]."""

    funcs: list[str]
    conj: str = "and"
    results: list[dict[str, Any] | None] = field(default_factory=list)
    expected: list[dict[str, Any] | None] = field(default_factory=list)
    options: list[dict[str, Any]] = field(default_factory=list)
    postconfig: list[SetupStep] = field(default_factory=list)

    @property
    def is_infeasible(self) -> bool:
        """True for tasks whose correct answer is to declare them infeasible (``FAIL``)."""
        return self.funcs == ["infeasible"]


@dataclass
class Task:
    """A parsed OSWorld task; ``raw`` keeps the original JSON object."""

    id: str
    instruction: str
    snapshot: str
    config: list[SetupStep]
    related_apps: list[str]
    evaluator: Evaluator
    raw: dict[str, Any]
    source_path: str | None = None

    @property
    def domain(self) -> str:
        """The domain folder the task came from (else its snapshot)."""
        if self.source_path:
            return Path(self.source_path).parent.name
        return self.snapshot


def _steps(value: Any, where: str) -> list[SetupStep]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TaskFormatError(f"{where} must be a list of steps, got {type(value).__name__}")
    steps = []
    for i, step in enumerate(value):
        if not isinstance(step, dict) or not isinstance(step.get("type"), str):
            raise TaskFormatError(f"{where}[{i}] must be an object with a string 'type'")
        params = step.get("parameters", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise TaskFormatError(f"{where}[{i}].parameters must be an object")
        steps.append(SetupStep(step["type"], params))
    return steps


def _aligned(value: Any, n: int, where: str) -> list[Any]:
    """Broadcast a single getter/options object over ``n`` metrics; check list lengths."""
    if isinstance(value, list):
        if len(value) != n:
            raise TaskFormatError(f"evaluator.{where} has {len(value)} entries for {n} metrics")
        return list(value)
    return [value] * n


def parse_evaluator(ev: Any) -> Evaluator:
    """Parse an ``evaluator`` object; raises ``TaskFormatError`` naming the bad field.

    Some published tasks carry a placeholder evaluator (a bare string such as
    ``"evaluation_dir"``, or ``func: ""`` with empty getters): they parse to an evaluator with no
    metrics, which the runnability check reports instead of rejecting the file.
    """
    if isinstance(ev, str) or ev is None:
        return Evaluator(funcs=[])
    if not isinstance(ev, dict):
        raise TaskFormatError(f"evaluator must be an object, got {type(ev).__name__}")
    func = ev.get("func")
    if func in ("", None, []):
        return Evaluator(funcs=[], postconfig=_steps(ev.get("postconfig"), "evaluator.postconfig"))
    funcs = func if isinstance(func, list) else [func]
    if not funcs or not all(isinstance(f, str) for f in funcs):
        raise TaskFormatError("evaluator.func must be a metric name or a list of names")
    n = len(funcs)
    results = _aligned(ev.get("result"), n, "result")
    expected = _aligned(ev.get("expected"), n, "expected")
    # An empty object means "no getter" in the published files.
    results = [g or None for g in results]
    expected = [g or None for g in expected]
    for name, getters in (("result", results), ("expected", expected)):
        for g in getters:
            if g is not None and not (isinstance(g, dict) and isinstance(g.get("type"), str)):
                raise TaskFormatError(f"evaluator.{name} entries must be objects with a string 'type'")
    options = _aligned(ev.get("options", {}), n, "options")
    options = [o or {} for o in options]
    if not all(isinstance(o, dict) for o in options):
        raise TaskFormatError("evaluator.options must be objects")
    conj = ev.get("conj", "and")
    if conj not in ("and", "or"):
        raise TaskFormatError(f"evaluator.conj must be 'and' or 'or', got {conj!r}")
    return Evaluator(
        funcs, conj, results, expected, options, _steps(ev.get("postconfig"), "evaluator.postconfig")
    )


def parse_task(obj: Any, source_path: str | None = None) -> Task:
    """Parse one task object; raises ``TaskFormatError`` naming the bad field."""
    if not isinstance(obj, dict):
        raise TaskFormatError(f"a task must be a JSON object, got {type(obj).__name__}")
    for key in ("id", "instruction"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            raise TaskFormatError(f"task field {key!r} must be a non-empty string")
    apps = obj.get("related_apps", [])
    if not isinstance(apps, list) or not all(isinstance(a, str) for a in apps):
        raise TaskFormatError("task field 'related_apps' must be a list of strings")
    return Task(
        id=obj["id"],
        instruction=obj["instruction"],
        snapshot=str(obj.get("snapshot", "")),
        config=_steps(obj.get("config"), "config"),
        related_apps=apps,
        evaluator=parse_evaluator(obj.get("evaluator")),
        raw=obj,
        source_path=source_path,
    )


def load_task(path: str | Path) -> Task:
    """Read and parse one task file; raises ``TaskFormatError`` (also for unreadable JSON)."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TaskFormatError(f"{path}: cannot read JSON: {exc}") from exc
    return parse_task(obj, str(path))


def task_files(path: str | Path) -> list[Path]:
    """The task JSON files at ``path`` (a file, or a directory searched recursively), sorted.

    Files under an ``oracles`` folder hold trajectories, not tasks, and are skipped.
    """
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"no task file or directory at {path}")
    return sorted(p for p in path.rglob("*.json") if "oracles" not in p.relative_to(path).parts)


def load_tasks(path: str | Path) -> list[tuple[Path, Task | TaskFormatError]]:
    """Parse every task under ``path``; a bad file yields its error in place of a task."""
    out: list[tuple[Path, Task | TaskFormatError]] = []
    for f in task_files(path):
        try:
            out.append((f, load_task(f)))
        except TaskFormatError as exc:
            out.append((f, exc))
    return out
