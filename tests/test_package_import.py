"""``import rz_agents`` alone is enough to ``gymnasium.make`` the rz_agents envs."""

import subprocess
import sys


def test_importing_the_package_registers_the_gymnasium_ids():
    # a fresh interpreter: in this one, other tests have imported rz_agents.envs already
    code = (
        "import gymnasium, rz_agents, sys\n"
        "assert 'rz_agents.envs.python_tool' not in sys.modules  # registering imports no env module\n"
        "env = gymnasium.make('rz_agents/PythonTool-v0', disable_env_checker=True).unwrapped\n"
        "print(type(env).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "PythonToolEnv"
