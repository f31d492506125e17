"""Every module scripts/gpu_check.py imports (at top level or inside a section) imports on the H200 machine,
which has torch, triton, numpy, safetensors and transformers but not gymnasium, ray, math-verify or vllm
(NOTES-gpu-device): checked in a subprocess where those four are absent."""

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"
ABSENT = ("gymnasium", "ray", "math_verify", "vllm")


def test_every_module_gpu_check_imports_needs_none_of_the_packages_the_gpu_box_lacks():
    modules = sorted(set(re.findall(r"^\s*from (rz_[\w.]+) import", SCRIPT.read_text(), re.M)))
    assert "rz_agents.trainer.sharding" in modules and "rz_agents.model.checkpoint" in modules
    code = (
        "import importlib, sys\n"
        f"for m in {ABSENT!r}: sys.modules[m] = None  # absent: import fails, find_spec is None\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print('ok')\n"
    )
    root = SCRIPT.parents[1]
    env_path = f"{root}:{root / 'kernels'}"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": env_path},
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_the_learner_and_the_checkpoint_module_import_without_safetensors():
    # (safetensors is imported where a file is read or written: the sharded learner step runs without it)
    code = (
        "import sys\n"
        "sys.modules['safetensors'] = None\n"
        "import rz_agents.model.checkpoint, rz_agents.trainer.learner, rz_agents.trainer.sharding\n"
        "print('ok')\n"
    )
    root = SCRIPT.parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": f"{root}:{root / 'kernels'}"},
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
