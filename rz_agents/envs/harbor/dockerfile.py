"""A task's ``environment/Dockerfile`` read as a build plan for the bubblewrap sandbox.

No container registry is reachable here, so an environment is built on this machine's Debian root: the
base image stands for the host's system (Debian and Ubuntu bases, and ``python:*`` images, which are
Debian), the task's workspace (its ``WORKDIR``, ``/app`` by default) is a fresh directory, ``COPY``/``ADD``
fill it from the build context and ``RUN`` steps run in the sandbox, without network. A step that needs
what the host does not have (an apt package or a Python package that is not installed, a download, a write
outside the workspace) makes the task unbuildable here, and :func:`plan_build` says which step and why.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import PurePosixPath

_DEBIAN_BASES = re.compile(r"^(docker\.io/)?(library/)?(debian|ubuntu|python|buildpack-deps)(:|@|$)")
_IGNORED = {
    "CMD",
    "ENTRYPOINT",
    "EXPOSE",
    "LABEL",
    "MAINTAINER",
    "HEALTHCHECK",
    "STOPSIGNAL",
    "VOLUME",
    "USER",
}
_SYSTEM_PREFIXES = ("/usr", "/bin", "/sbin", "/lib", "/etc", "/proc", "/dev", "/sys", "/var", "/opt", "/root")
_SKIP_SEGMENT = re.compile(
    r"^(apt(-get)? (update|clean|autoremove)\b.*|rm -rf /var/lib/apt/lists.*|pip(3)? cache purge.*|true)$"
)
_APT_INSTALL = re.compile(r"^(DEBIAN_FRONTEND=\S+ )?apt(-get)? install\b(.*)$")
_COMPOUND = re.compile(r"(^|[;&|(\s])(for|while|until|if|case|function)\s|[{}()`]|\|\|")
_PIP_INSTALL = re.compile(r"^(python3? -m )?(pip3?|uv pip) install\b(.*)$")


class PlanError(ValueError):
    """The Dockerfile cannot be built here; the message names the step and the reason."""


@dataclass
class BuildPlan:
    """What building the environment does, in order."""

    root: str = "/app"  # the workspace's mount point in the sandbox (the first WORKDIR)
    workdir: str = "/app"  # where commands start (the last WORKDIR)
    env: dict[str, str] = field(default_factory=dict)
    copies: list[tuple[list[str], str]] = field(default_factory=list)  # (context sources, dest) in order
    steps: list[tuple[str, object]] = field(default_factory=list)  # ("copy", index) / ("run", command)
    satisfied: list[str] = field(default_factory=list)  # install steps the host already satisfies


def _lines(text: str) -> list[str]:
    """Instructions with their continuations joined and comments dropped."""
    out: list[str] = []
    buf = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        out.append((buf + stripped).strip())
        buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out


@lru_cache(maxsize=4096)
def apt_installed(package: str) -> bool:
    """True when Debian package ``package`` is installed on this machine."""
    try:
        proc = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and "install ok installed" in proc.stdout


def pip_satisfied(requirement: str) -> bool:
    """True when ``requirement`` (``name``, ``name==v`` or ``name>=v``) is installed for this interpreter."""
    m = re.match(r"^([A-Za-z0-9_.\-\[\]]+)\s*(==|>=)?\s*([^\s;]*)", requirement)
    if not m:
        return False
    name = re.sub(r"\[.*\]", "", m.group(1))
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    if m.group(2) == "==":
        return have == m.group(3)
    if m.group(2) == ">=":
        return _version_tuple(have) >= _version_tuple(m.group(3))
    return True


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:4])


def _check_install(segment: str, plan: BuildPlan) -> bool:
    """True when ``segment`` is an install command (checked against the host); raises when unsatisfied."""
    if m := _APT_INSTALL.match(segment):
        packages = [a for a in shlex.split(m.group(3)) if not a.startswith("-")]
        missing = [p for p in packages if not apt_installed(p.split("=")[0])]
        if missing:
            raise PlanError(
                f"apt packages not installed here (the sandbox has no network): {' '.join(missing)}"
            )
        plan.satisfied.append(segment)
        return True
    if m := _PIP_INSTALL.match(segment):
        args = shlex.split(m.group(3))
        if any(a in ("-r", "--requirement", "-e", "--editable") for a in args):
            raise PlanError(f"pip install from a file or path is not supported here: {segment!r}")
        packages = [a for a in args if not a.startswith("-")]
        missing = [p for p in packages if not pip_satisfied(p)]
        if missing:
            raise PlanError(f"Python packages not installed here (no network): {' '.join(missing)}")
        plan.satisfied.append(segment)
        return True
    return False


def _run_step(arg: str, plan: BuildPlan) -> None:
    if arg.startswith("<<"):
        raise PlanError("RUN heredocs are not supported")
    if arg.startswith("["):
        try:
            arg = shlex.join(json.loads(arg))
        except (ValueError, TypeError):
            raise PlanError(f"RUN: malformed exec form {arg!r}") from None
    if re.search(r"\b(curl|wget)\b|\bgit clone\b", arg):
        raise PlanError(f"RUN downloads (the sandbox has no network): {arg!r}")
    if _COMPOUND.search(arg):  # loops and conditionals run whole; installs inside them cannot be checked
        if re.search(r"\b(apt(-get)?|pip3?) install\b", arg):
            raise PlanError(f"an install inside a compound shell command cannot be checked here: {arg!r}")
        plan.steps.append(("run", arg))
        return
    kept = []
    for segment in (s.strip() for s in re.split(r"&&|;|\n", arg)):
        if not segment or _SKIP_SEGMENT.match(segment) or _check_install(segment, plan):
            continue
        kept.append(segment)
    if kept:
        plan.steps.append(("run", " && ".join(kept)))


def _dest(path: str, plan: BuildPlan) -> str:
    p = path if path.startswith("/") else str(PurePosixPath(plan.workdir) / path)
    inside = p == plan.root or p.startswith(plan.root.rstrip("/") + "/")
    if not inside:
        raise PlanError(f"writes to {p}, outside the workspace {plan.root}")
    return p


def _key_values(arg: str) -> dict[str, str]:
    if "=" in arg.split()[0]:
        return {k: v for k, _, v in (item.partition("=") for item in shlex.split(arg))}
    key, _, value = arg.partition(" ")
    return {key: value.strip().strip('"')}


def plan_build(dockerfile_text: str) -> BuildPlan:
    """The build plan of a Dockerfile; :class:`PlanError` names the first step that cannot run here."""
    plan = BuildPlan()
    seen_from = seen_workdir = False
    for line in _lines(dockerfile_text):
        op, _, arg = line.partition(" ")
        op, arg = op.upper(), arg.strip()
        if op == "FROM":
            if seen_from:
                raise PlanError("multi-stage builds (a second FROM) are not supported")
            seen_from = True
            image = arg.split()[0].replace("--platform=", "") if arg else ""
            if not _DEBIAN_BASES.match(image):
                raise PlanError(
                    f"base image {image!r} is not Debian-based: this sandbox runs on the host's Debian"
                )
        elif op == "WORKDIR":
            path = arg if arg.startswith("/") else str(PurePosixPath(plan.workdir) / arg)
            if not seen_workdir:
                if path.startswith(_SYSTEM_PREFIXES) or path == "/":
                    raise PlanError(
                        f"WORKDIR {path} is a system directory; the workspace must be its own folder"
                    )
                plan.root = plan.workdir = path
                seen_workdir = True
            else:
                plan.workdir = _dest(path, plan)
        elif op in ("COPY", "ADD"):
            parts = [a for a in shlex.split(arg) if not a.startswith("--")]
            if len(parts) < 2:
                raise PlanError(f"{op} needs a source and a destination: {line!r}")
            if any("://" in s for s in parts[:-1]):
                raise PlanError(f"{op} of a URL needs the network: {line!r}")
            plan.copies.append((parts[:-1], _dest(parts[-1], plan)))
            plan.steps.append(("copy", len(plan.copies) - 1))
        elif op == "RUN":
            _run_step(arg, plan)
        elif op in ("ENV", "ARG"):
            if op == "ARG" and "=" not in arg:
                continue
            plan.env.update(_key_values(arg))
        elif op in _IGNORED or op in ("SHELL", "ONBUILD"):
            continue
        else:
            raise PlanError(f"unknown Dockerfile instruction {op}")
    if not seen_from:
        raise PlanError("no FROM line")
    return plan
