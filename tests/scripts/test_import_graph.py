"""scripts/import_graph.py on small synthetic package trees whose cycles and upward imports are known.

(The assertion on the real tree, no cycle in rz_agents, is the lead's to add once every branch has landed.)
"""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "import_graph.py"


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    """rz_agents with an envs <-> rollout package cycle (one edge inside a function), a model file cycle
    through relative imports, a cycle that exists only under TYPE_CHECKING, an ``import rz_agents``; and
    rz_kernels with an opset <-> triton_ops.opset cycle."""
    _write(
        tmp_path,
        {
            "rz_agents/__init__.py": "from rz_agents.envs.registry import ids\n",
            "rz_agents/images.py": "",
            "rz_agents/envs/__init__.py": "",
            "rz_agents/envs/registry.py": "ids = ()\n",
            "rz_agents/envs/agent.py": (
                "import rz_agents\nfrom rz_agents.images import *\n\n\n"
                "def run():\n    from rz_agents.rollout.loop import step\n    return step\n"
            ),
            "rz_agents/rollout/__init__.py": "",
            "rz_agents/rollout/loop.py": "from rz_agents.envs import agent\n\nstep = 1\n",
            "rz_agents/model/__init__.py": "",
            "rz_agents/model/x.py": "from . import y\n",
            "rz_agents/model/y.py": "class Y:\n    from .x import y as _y\n",
            "rz_agents/engine/__init__.py": "",
            "rz_agents/engine/a.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rz_agents.engine.b import B\n"
            ),
            "rz_agents/engine/b.py": "from rz_agents.engine.a import *\nfrom rz_agents.model import x\n",
            "kernels/rz_kernels/__init__.py": "",
            "kernels/rz_kernels/opset.py": "def triton():\n    from rz_kernels.triton_ops.opset import T\n",
            "kernels/rz_kernels/triton_ops/__init__.py": "",
            "kernels/rz_kernels/triton_ops/opset.py": "from ..opset import triton\n\nT = 1\n",
        },
    )
    return tmp_path / "rz_agents", tmp_path / "kernels" / "rz_kernels"


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120
    )


def test_it_finds_the_package_and_file_cycles_of_a_tree_with_known_ones_and_check_fails(tmp_path):
    roots = _tree(tmp_path)
    done = _run(*roots, "--json", "--check")
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    packages = [c["members"] for c in result["package_cycles"]]
    assert packages == [
        ["rz_agents.envs", "rz_agents.rollout"],
        ["rz_kernels.opset", "rz_kernels.triton_ops"],
    ]
    files = {tuple(c["members"]): c["cycle"] for c in result["file_cycles"]}
    assert set(files) == {
        ("rz_agents.envs.agent", "rz_agents.rollout.loop"),
        ("rz_agents.model.x", "rz_agents.model.y"),  # relative imports, one in a class body
        ("rz_kernels.opset", "rz_kernels.triton_ops.opset"),
    }  # engine.a <-> engine.b is not one: a's import of b runs only under TYPE_CHECKING
    kinds = {(s["from"], s["kind"]) for s in files[("rz_agents.envs.agent", "rz_agents.rollout.loop")]}
    assert kinds == {("rz_agents.envs.agent", "function"), ("rz_agents.rollout.loop", "module")}
    assert {s["kind"] for s in files[("rz_agents.model.x", "rz_agents.model.y")]} == {"module"}


def test_it_reports_imports_running_up_the_layering_and_what_envs_may_not_import(tmp_path):
    result = json.loads(_run(*_tree(tmp_path), "--json").stdout)
    up = {(u["from"], u["to"], u["kind"]) for u in result["upward_imports"]}
    # envs -> rollout runs up; envs -> images (a shared helper) and the explicit `import rz_agents` do not;
    # the root package importing its env registry, and engine -> model, run down
    assert up == {("rz_agents.envs.agent", "rz_agents.rollout.loop", "function")}


def test_module_level_edges_alone_leave_out_cycles_closed_only_inside_a_function(tmp_path):
    done = _run(*_tree(tmp_path), "--json", "--check", "--edges", "module")
    result = json.loads(done.stdout)
    assert result["edges_counted"] == ["module"]
    assert [c["members"] for c in result["file_cycles"]] == [["rz_agents.model.x", "rz_agents.model.y"]]
    assert result["package_cycles"] == [] and done.returncode == 1


def test_a_tree_without_cycles_passes_check_and_text_output_names_the_longest_function(tmp_path):
    _write(
        tmp_path,
        {
            "rz_agents/__init__.py": "",
            "rz_agents/model/__init__.py": "",
            "rz_agents/model/m.py": "def short():\n    return 1\n\n\ndef long():\n" + "    x = 1\n" * 30,
            "rz_agents/engine/__init__.py": "",
            "rz_agents/engine/e.py": "from rz_agents.model.m import short\n",
        },
    )
    done = _run(tmp_path / "rz_agents", "--check", "--top", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "package cycles: 0" in done.stdout and "file cycles: 0" in done.stdout
    assert "31  " in done.stdout and "m.py:5 long" in done.stdout


def test_a_root_that_is_not_a_package_is_a_one_line_error(tmp_path):
    done = _run(tmp_path)
    assert done.returncode == 2 and "is not a package directory" in done.stderr
