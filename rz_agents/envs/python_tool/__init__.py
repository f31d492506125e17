"""The Python tool: a sandboxed persistent interpreter and the env that lets a policy call it.

>>> from rz_agents.envs.python_tool import PythonSandbox
>>> with PythonSandbox() as sb:            # safe defaults: SandboxLimits()
...     sb.run("import math; x = math.factorial(5)")
...     sb.run("x + 1").stdout             # '121\n' (a trailing expression is shown)

What a session gets (local backend, bubblewrap; see local.py for the details):
- per call: 10 s wall time (a Python-level timeout keeps the session; code that ignores it is
  killed with its whole sandbox and the session restarts), 10 s CPU;
- per process: 1 GiB address space, 32 MiB largest file, 256 open files; per session: 64
  processes/threads, 2 GiB resident memory in total, a 128 MiB private /tmp; 16 KiB of
  stdout/stderr returned per call (head and tail kept, the cut marked);
- no network, a read-only view of /usr, /lib*, /bin, /sbin, /etc and the Python installation,
  nothing of /home, /root, the project or the host's /tmp; an empty environment; no inherited
  file descriptors; its own pid namespace, so it sees and can signal only itself, and every
  process it started is killed after each call.
Without bubblewrap ``PythonSandbox()`` raises ``SandboxUnavailable``; ``allow_unsandboxed=True``
runs a plain subprocess with the rlimits only. ``backend="docker"`` runs one container per session.
Known limits: a total-memory overrun is caught by polling every 0.1 s, so it can overshoot briefly;
when the host runs as root, bubblewrap runs privileged (so the code can run under a uid of its
own) and nested user namespaces are refused by a seccomp filter that covers x86-64 only.
"""

from rz_agents.envs.python_tool.env import PYTHON_TOOL, PythonToolEnv
from rz_agents.envs.python_tool.limits import SandboxLimits
from rz_agents.envs.python_tool.local import SandboxUnavailable
from rz_agents.envs.python_tool.pool import SandboxPool
from rz_agents.envs.python_tool.sandbox import PythonSandbox, SandboxError, SandboxResult

__all__ = [
    "PYTHON_TOOL",
    "PythonSandbox",
    "PythonToolEnv",
    "SandboxError",
    "SandboxLimits",
    "SandboxPool",
    "SandboxResult",
    "SandboxUnavailable",
]
