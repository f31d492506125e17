"""scripts/import_graph.py on the real tree: rz_agents and rz_kernels import in one direction only (no cycle
between top-level packages, none between files, no import running up the layering; DESIGN.md)."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _report(*args: str) -> dict:
    roots = [str(REPO / "rz_agents"), str(REPO / "kernels" / "rz_kernels")]
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "import_graph.py"), "--json", *args, *roots],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_the_real_tree_has_no_package_cycle_no_file_cycle_and_no_upward_import():
    result = _report()
    assert result["files"] > 300  # the whole tree was read
    assert result["package_cycles"] == [], result["package_cycles"]
    assert result["file_cycles"] == [], result["file_cycles"]
    assert result["upward_imports"] == [], result["upward_imports"]


def test_no_function_in_the_real_tree_is_longer_than_80_lines():
    longest = _report("--top", "5")["longest_functions"]
    assert longest and all(row["lines"] <= 80 for row in longest), longest
