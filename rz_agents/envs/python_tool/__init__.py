"""The Python tool: a sandboxed persistent interpreter and the env that lets a policy call it."""

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
