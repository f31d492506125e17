"""The evidence scripts run end to end in their --quick mode and write the files they document."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("experiments")
    return base / "runs", base / "results"


def _run(script: str, dirs, *extra: str) -> None:
    runs, results = dirs
    env = {**os.environ, "RZ_EXPERIMENT_RESULTS": str(results), "RZ_EXPERIMENT_RUNS": str(runs)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "kernels"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(REPO / "experiments" / script), "--quick", "--runs", str(runs), *extra],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_lag_sweep_quick_trains_two_arms_evaluates_them_and_summarizes(dirs):
    _run("lag_sweep.py", dirs)
    out = dirs[1] / "lag_sweep_demo_quick"
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["arms"]) == {"sync", "std_is_lag64"}
    for arm in ("sync", "std_is_lag64"):
        run = json.loads((out / f"{arm}-s0.json").read_text())
        assert 0.0 <= run["heldout_accuracy"] <= 1.0 and run["skipped_steps"] == 0
        assert len((out / f"{arm}-s0.csv").read_text().splitlines()) == 1 + 3  # header + 3 steps
    # Synchronous aligned training has IS weights of exactly 1; the standard op set's do not.
    assert summary["arms"]["sync"]["is_weight_max"]["mean"] == 1.0
    assert (out / "summary.md").read_text().count("\n| ") >= 3
    assert len(summary["commands"]) == 1 and "--quick" in summary["commands"][0]
    # Rebuilding the summary from the files trains nothing and keeps the command that trained the runs.
    mtime = (out / "sync-s0.json").stat().st_mtime_ns
    _run("lag_sweep.py", dirs, "--summarize-only")
    rebuilt = json.loads((out / "summary.json").read_text())
    assert rebuilt["commands"] == summary["commands"] and rebuilt["steps"] == summary["steps"] == 3
    assert json.dumps(rebuilt["arms"]) == json.dumps(summary["arms"])  # (NaN-safe comparison)
    assert (out / "sync-s0.json").stat().st_mtime_ns == mtime


def test_mismatch_quick_separates_aligned_from_standard(dirs):
    _run("mismatch.py", dirs)
    summary = json.loads((dirs[1] / "mismatch_quick" / "summary.json").read_text())
    a = summary["part_a"]
    assert a["rz_aligned__trainer_aligned"]["bit_identical_fraction"] == 1.0
    assert a["rz_standard__trainer_standard"]["abs_dlogp_max"] > 0.0
    b = summary["part_b"]
    assert b["sync_aligned-s0"]["is_dev_peak"] == 0.0 and b["sync_aligned-s0"]["lag0_abs_dlogp_max"] == 0.0
    assert b["sync_standard-s0"]["is_dev_peak"] > 0.0


def test_mismatch_quick_on_deepseek_v4_is_bit_identical_on_the_aligned_op_set(dirs):
    """DeepSeek-V4 sampled through the rz engine (its paged V4 cache: chunked prefill, continuous-batching
    decode), scored by the learner's packed forward."""
    _run("mismatch.py", dirs, "--parts", "a", "--tiny", "deepseek_v4")
    a = json.loads((dirs[1] / "mismatch_quick_deepseek_v4" / "summary.json").read_text())["part_a"]
    assert a["sampler"] == "rz engine"
    assert a["rz_aligned__trainer_aligned"]["bit_identical_fraction"] == 1.0
    assert a["rz_aligned__trainer_aligned"]["tokens"] == 6 * 12
    assert a["rz_standard__trainer_aligned"]["bit_identical_fraction"] < 1.0


def test_moe_routing_quick_reports_no_flips_for_the_aligned_op_set(dirs):
    _run("moe_routing.py", dirs)
    summary = json.loads((dirs[1] / "moe_routing_quick" / "summary.json").read_text())
    aligned = summary["random_init__aligned"]
    assert aligned["expert_set_differs_fraction"] == 0.0
    assert aligned["sampled_tokens_without_a_flip_before"]["abs_dlogp_max"] == 0.0
    assert summary["random_init__standard"]["router_decisions"] == aligned["router_decisions"] > 0
