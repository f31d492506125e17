"""A wheel built from the repository holds what `rz` needs after `pip install`: configs, data, tasks."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_ships_the_packaged_configs_data_and_kernels(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (the wheel is built from the tracked files)")
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    src = tmp_path / "src"
    for name in files.stdout.splitlines():  # a copy: building writes build/ and *.egg-info into the tree
        if (ROOT / name).is_file() and not (ROOT / name).is_symlink():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    code = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=src, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    names = set(zipfile.ZipFile(tmp_path / out.stdout.strip().splitlines()[-1]).namelist())
    configs = sorted(p.name for p in (ROOT / "rz_agents" / "configs").glob("*.yaml"))
    assert "demo.yaml" in configs
    for name in configs:
        assert f"rz_agents/configs/{name}" in names
    for name in ("rz_kernels/__init__.py", "rz_agents/data/math/aime24.jsonl", "rz_agents/cli/configs.py"):
        assert name in names, name
    assert any(n.startswith("rz_agents/envs/osworld/tasks/") for n in names)
    # OSWorld's multi-app task files, their task list and licence (data of the whole-benchmark run)
    official = "rz_agents/envs/osworld/official/"
    assert {official + n for n in ("test_all.json", "LICENSE", "SOURCE.md")} <= names
    assert sum(n.startswith(official + "examples/multi_apps/") for n in names) == 105
