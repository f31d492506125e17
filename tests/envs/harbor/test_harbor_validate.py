"""`rz harbor validate`: every packaged task builds here, its untouched environment scores 0.0 and its
reference solution 1.0; a task that cannot be built or checked is left out with its reason."""

import json
import shutil
import subprocess
import sys

import pytest

from rz_agents.envs.harbor.task import packaged_tasks_dir
from rz_agents.envs.python_tool.local import bwrap_problem

pytestmark = pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap unusable: {bwrap_problem()}")


def test_every_packaged_task_builds_and_its_oracle_scores_1_and_untouched_0():
    proc = subprocess.run(
        [sys.executable, "-m", "rz_agents.cli", "harbor", "validate", "--json"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = json.loads(proc.stdout)
    assert report["left_out"] == {}, report["left_out"]
    assert report["buildable"] == report["total"] >= 30
    assert all(r["oracle"] == 1.0 and r["untouched"] == 0.0 for r in report["tasks"])
    assert proc.returncode == 0


def test_tasks_that_cannot_be_checked_here_are_left_out_with_a_reason(tmp_path):
    src = packaged_tasks_dir()
    shutil.copytree(src / "csv-sum", tmp_path / "ok")
    shutil.copytree(src / "csv-sum", tmp_path / "no-solution")
    shutil.rmtree(tmp_path / "no-solution" / "solution")
    shutil.copytree(src / "csv-sum", tmp_path / "alpine")
    (tmp_path / "alpine" / "environment" / "Dockerfile").write_text("FROM alpine:3\n")
    shutil.copytree(src / "csv-sum", tmp_path / "vacuous")
    (tmp_path / "vacuous" / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    shutil.copytree(src / "csv-sum", tmp_path / "wrong-solution")
    (tmp_path / "wrong-solution" / "solution" / "solve.sh").write_text("echo 7 > /app/total.txt\n")
    proc = subprocess.run(
        [sys.executable, "-m", "rz_agents.cli", "harbor", "validate", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(proc.stdout)
    assert (report["buildable"], report["total"], proc.returncode) == (1, 5, 1)
    reasons = report["left_out"]
    assert "no solution/solve.sh" in reasons["no-solution"]
    assert "not Debian-based" in reasons["alpine"]
    assert "untouched environment scores 1.0" in reasons["vacuous"]
    assert "reference solution scores 0.0" in reasons["wrong-solution"]
