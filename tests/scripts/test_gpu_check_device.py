"""The GPU check's device call (issue 54): the one documented command returns its results as one file with
Triton's cache kept out of the results folder, a --resume call keeps what the first passed, and every
roofline figure is taken from the card the device names (a fake name here: no GPU on CI)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"
DEVICE_CALL = REPO / "scripts" / "gpu_check_device.sh"


@pytest.fixture
def gpu_check(monkeypatch, tmp_path):
    """The script as a module (it parses sys.argv on import): a GPU-mode parse, nothing run."""
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(tmp_path / "g.json")])
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton_cache"))
    spec = importlib.util.spec_from_file_location("gpu_check_device_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _device_call(out: Path, runs: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_CACHE_DIR"}
    env.update(OUT=str(out), GPU_CHECK_RUNS=str(runs), PYTHON=sys.executable)
    return subprocess.run(
        ["bash", str(DEVICE_CALL), "--dry-run", *args], capture_output=True, text=True, timeout=300, env=env
    )


def test_the_device_call_returns_one_small_file_and_resumes(tmp_path):
    out, runs = tmp_path / "OUT", tmp_path / "runs"
    first = _device_call(out, runs, "--only", "env", "logprobs_vocab", "--budget-s", "0")
    assert first.returncode == 0, first.stderr[-2000:] + first.stdout[-2000:]
    assert sorted(p.name for p in out.rglob("*")) == ["gpu_check.json"]  # the cache is not in $OUT
    assert (out / "gpu_check.json").stat().st_size < 64 * 1024
    saved = json.loads((out / "gpu_check.json").read_text())
    assert saved["triton_cache_dir"] == str(runs.resolve() / "triton-cache")
    assert all(r["skipped"].startswith("total time budget") for r in saved["sections"].values())
    second = _device_call(out, runs, "--resume", "--only", "env", "logprobs_vocab")
    assert second.returncode == 0, second.stderr[-2000:] + second.stdout[-2000:]
    resumed = json.loads((out / "gpu_check.json").read_text())
    assert resumed["complete"] is True and "skipped" not in resumed["sections"]["logprobs_vocab"]
    assert sorted(p.name for p in out.rglob("*")) == ["gpu_check.json"]


def test_the_results_file_is_written_before_the_first_section(tmp_path):
    out = tmp_path / "g.json"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--only", "env", "model_0.6b",
         "--card", "NVIDIA H200"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for line in proc.stdout:
            if "env:" in line:
                break
        proc.kill()
    finally:
        proc.wait(timeout=60)
    saved = json.loads(out.read_text())
    assert saved["complete"] is False and saved["card"]["hbm_bytes_per_s"] == 4.8e12


def test_a_fake_h100_takes_its_roofline_and_memory_from_the_card(gpu_check, monkeypatch):
    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=79 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(gpu_check, "measured_copy_bytes_per_s", lambda device: 3.0e12)
    check = SimpleNamespace(device=torch.device("cuda"))
    card, found = gpu_check.detect_card(check, None)
    assert (card.hbm_bytes_per_s, card.memory_gib, card.name) == (3.35e12, 79.0, "NVIDIA H100 80GB HBM3")
    assert found["measured_copy_bytes_per_s"] == 3.0e12 and found["source"] == "table"
    # 3.35 GB read in 1 ms is the whole H100 roofline; the H200's figure would have read 0.70
    assert gpu_check.roofline_fraction(card, 3.35e9, 1e-3) == 1.0
    # a card the table lacks is described by its measured copy; an H200 keeps its own figures
    props.name = "NVIDIA Future GPU"
    unknown, _ = gpu_check.detect_card(check, None)
    assert unknown.source == "measured copy" and unknown.hbm_bytes_per_s == 3.0e12
    props.name = "NVIDIA H200"
    assert gpu_check.detect_card(check, None)[0].hbm_bytes_per_s == 4.8e12


def test_the_card_table_matches_the_longest_name_and_refuses_an_unknown_card_without_a_measurement():
    from rz_kernels.compile_check.cards import card_for

    assert card_for("NVIDIA H100 PCIe").hbm_bytes_per_s == 2.0e12
    assert card_for("NVIDIA H100 80GB HBM3").hbm_bytes_per_s == 3.35e12
    assert card_for("NVIDIA A100-SXM4-80GB").hbm_bytes_per_s == 2.039e12
    with pytest.raises(ValueError, match="unknown GPU 'Mystery'"):
        card_for("Mystery")


def test_a_dry_run_with_a_named_card_derives_the_decode_figures_from_it(tmp_path):
    out = tmp_path / "g.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--only", "engine_decode",
         "--card", "NVIDIA H100 80GB HBM3"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    decode = json.loads(out.read_text())["sections"]["engine_decode"]
    assert decode["card"] == "NVIDIA H100 80GB HBM3"
    for row in decode["sizes"].values():
        ms = row["aligned_eager_ms"]
        assert row["hbm_roofline_fraction"] == round(row["step_bytes"] / (ms / 1e3) / 3.35e12, 4)
        assert 0 < row["bound_ms"] < row["triton_bound_ms"] < row["estimate_ms"]
        assert row["measured_over_bound"] == pytest.approx(ms / row["bound_ms"], rel=0.02)  # bound: 6 digits
