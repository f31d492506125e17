"""``HarborTask``: one task directory in the Harbor format, read and checked.

The layout (Harbor's task format, version 1.x; the Terminal-Bench successor the field's RL frameworks load):

    my-task/
      instruction.md        what the agent is asked (leading canary comment lines are dropped)
      task.toml             [metadata], [verifier] timeout_sec, [agent] timeout_sec,
                            [environment] docker_image / build_timeout_sec / cpus / memory_mb / allow_internet
      environment/          Dockerfile (+ its build context): the agent's starting state
      tests/test.sh         the verifier: run after the agent, writes /logs/verifier/reward.txt (a number)
                            or reward.json ({"reward": x})
      solution/solve.sh     the reference solution (what an oracle run executes)

A malformed directory raises :class:`TaskError` naming the file and the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

_CANARY = re.compile(r"^\s*(<!--.*canary.*-->|#.*canary.*)\s*$", re.IGNORECASE)
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*$", re.IGNORECASE)
_UNITS = {"": 1 / (1 << 20), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


class TaskError(ValueError):
    """A task directory that does not follow the Harbor format."""


@dataclass(frozen=True)
class TaskLimits:
    """The limits ``task.toml`` sets (Harbor's defaults where it is silent)."""

    agent_timeout_s: float = 600.0
    verifier_timeout_s: float = 600.0
    build_timeout_s: float = 600.0
    cpus: float = 1.0
    memory_mb: int = 2048
    allow_internet: bool = False


@dataclass(frozen=True)
class HarborTask:
    """A Harbor task directory, parsed."""

    name: str
    path: Path
    instruction: str
    limits: TaskLimits
    metadata: dict[str, Any] = field(default_factory=dict)
    docker_image: str | None = None  # [environment].docker_image: a prebuilt image instead of a Dockerfile
    verifier_env: dict[str, str] = field(default_factory=dict)

    @property
    def environment_dir(self) -> Path:
        """The build context (``environment/``)."""
        return self.path / "environment"

    @property
    def dockerfile(self) -> Path | None:
        """``environment/Dockerfile`` when the task has one."""
        p = self.environment_dir / "Dockerfile"
        return p if p.is_file() else None

    @property
    def tests_dir(self) -> Path:
        """``tests/``: uploaded to /tests after the agent finishes."""
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path | None:
        """``solution/`` (with ``solve.sh``) when the task ships a reference solution."""
        p = self.path / "solution"
        return p if (p / "solve.sh").is_file() else None

    @property
    def difficulty(self) -> str:
        """``metadata.difficulty`` (``"unknown"`` when not given)."""
        return str(self.metadata.get("difficulty", "unknown"))

    @property
    def category(self) -> str:
        """``metadata.category`` (``"unknown"`` when not given)."""
        return str(self.metadata.get("category", "unknown"))


def _number(section: dict[str, Any], key: str, default: float, where: str) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise TaskError(f"{where}.{key} must be a positive number, got {value!r}")
    return float(value)


def _memory_mb(env: dict[str, Any]) -> int:
    if "memory_mb" in env:
        return int(_number(env, "memory_mb", 2048, "task.toml [environment]"))
    if "memory" in env:  # Harbor also accepts "4G", "512M"
        m = _MEMORY.match(str(env["memory"]))
        if not m:
            raise TaskError(
                f"task.toml [environment].memory must look like '2G' or '512M', got {env['memory']!r}"
            )
        return max(1, int(float(m.group(1)) * _UNITS[m.group(2).upper()]))
    return 2048


def _instruction(path: Path) -> str:
    lines = path.read_text(encoding="utf-8").splitlines()
    while lines and (_CANARY.match(lines[0]) or not lines[0].strip()):
        lines.pop(0)
    text = "\n".join(lines).strip()
    if not text:
        raise TaskError(f"{path}: the instruction is empty")
    return text


def load_task(path: str | Path) -> HarborTask:
    """Read one task directory; raises :class:`TaskError` naming what is missing or malformed."""
    root = Path(path)
    if not root.is_dir():
        raise TaskError(f"{root}: not a directory")
    for required in ("instruction.md", "task.toml", "tests/test.sh"):
        if not (root / required).is_file():
            raise TaskError(f"{root.name}: {required} is missing")
    try:
        config = tomllib.loads((root / "task.toml").read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{root.name}/task.toml: {exc}") from None
    sections = {}
    for name in ("metadata", "verifier", "agent", "environment", "solution"):
        value = config.get(name, {})
        if not isinstance(value, dict):
            raise TaskError(f"{root.name}/task.toml: [{name}] must be a table")
        sections[name] = value
    env, where = sections["environment"], f"{root.name}/task.toml [environment]"
    limits = TaskLimits(
        agent_timeout_s=_number(sections["agent"], "timeout_sec", 600.0, f"{root.name}/task.toml [agent]"),
        verifier_timeout_s=_number(
            sections["verifier"], "timeout_sec", 600.0, f"{root.name}/task.toml [verifier]"
        ),
        build_timeout_s=_number(env, "build_timeout_sec", 600.0, where),
        cpus=_number(env, "cpus", 1.0, where),
        memory_mb=_memory_mb(env),
        allow_internet=bool(env.get("allow_internet", False)),
    )
    image = env.get("docker_image")
    if image is None and not (root / "environment" / "Dockerfile").is_file():
        raise TaskError(f"{root.name}: neither environment/Dockerfile nor [environment].docker_image")
    verifier_env = {str(k): str(v) for k, v in dict(sections["verifier"].get("env", {})).items()}
    return HarborTask(
        name=root.name,
        path=root.resolve(),
        instruction=_instruction(root / "instruction.md"),
        limits=limits,
        metadata=dict(sections["metadata"]),
        docker_image=str(image) if image else None,
        verifier_env=verifier_env,
    )


def find_tasks(path: str | Path) -> list[Path]:
    """Task directories under ``path`` (itself, or any folder holding a task.toml), sorted by name."""
    root = Path(path)
    if (root / "task.toml").is_file():
        return [root]
    found = [p.parent for p in root.rglob("task.toml") if not any(part.startswith(".") for part in p.parts)]
    return sorted(found, key=lambda p: p.name)


def packaged_tasks_dir() -> Path:
    """The Harbor tasks shipped with rz_agents."""
    return Path(__file__).with_name("tasks")
