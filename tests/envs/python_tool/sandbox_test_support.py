"""Helpers shared by the python_tool tests (a uniquely named module: tests dirs have no __init__)."""

import os

from rz_agents.envs.python_tool import PythonSandbox, SandboxLimits

FAST = SandboxLimits(wall_s=2.0, cpu_s=2, memory_bytes=512 << 20, file_bytes=8 << 20, tmp_bytes=24 << 20)


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


def assert_healthy(sb: PythonSandbox) -> None:
    """The session answers a normal call afterwards, and only its worker and pid 1 are alive."""
    r = sb.run("import os; sorted(int(p) for p in os.listdir('/proc') if p.isdigit())")
    assert r.error is None, r
    assert r.stdout.strip() in ("[1, 2]", "[1, 3]"), r.stdout  # reaper + worker (pid 2 or 3)
    assert sb.run("21 * 2").stdout == "42\n"
