"""Helpers shared by the python_tool tests (a uniquely named module: tests dirs have no __init__)."""

import ast
import os

from rz_agents.envs.python_tool import PythonSandbox, SandboxLimits

FAST = SandboxLimits(wall_s=2.0, cpu_s=2, memory_bytes=512 << 20, file_bytes=8 << 20, tmp_bytes=24 << 20)


def docker_problem() -> str | None:
    """Why the docker backend cannot run here (no SDK, no engine, no sandbox image), or None."""
    try:
        import docker
    except ImportError:
        return "the Docker SDK is not installed (pip install 'rz-agents[docker]')"
    from rz_agents.envs.python_tool.docker_backend import DEFAULT_IMAGE

    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means no usable engine
        return f"no Docker engine ({type(exc).__name__}); scripts/install.sh --docker starts one"
    try:
        client.images.get(DEFAULT_IMAGE)
    except Exception:  # noqa: BLE001
        return f"no {DEFAULT_IMAGE} image; scripts/install.sh --docker builds it"
    finally:
        client.close()
    return None


def processes_of_uid(uid: int) -> list[int]:
    """Host pids running as ``uid`` (to prove nothing of a sandbox outlives a call)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            if int(line.split()[1]) == uid:
                                pids.append(int(name))
                            break
            except OSError:
                continue
    return pids


def sandbox_pids(sb: PythonSandbox) -> tuple[int, list[int]]:
    """(the worker's pid, every pid the sandbox sees), as seen from inside."""
    r = sb.run("import os; (os.getpid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    assert r.error is None, r
    me, pids = ast.literal_eval(r.stdout)
    return me, pids


def assert_healthy(sb: PythonSandbox) -> None:
    """The session answers a normal call afterwards, and only its worker and pid 1 (the reaper) are alive."""
    me, pids = sandbox_pids(sb)
    assert pids == sorted({1, me}), pids
    assert sb.run("21 * 2").stdout == "42\n"
