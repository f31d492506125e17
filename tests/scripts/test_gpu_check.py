"""scripts/gpu_check.py --dry-run: the GPU check's code paths run on CPU (Triton interpreter, tiny shapes)
and print one JSON summary with goals and per-section results."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def _run(*args: str, timeout: int) -> dict:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", *args], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_dry_run_kernel_sections_report_bit_identical_rows():
    summary = _run("--only", "env", "gemm", "attention", timeout=300)
    sections = summary["sections"]
    assert sections["env"]["dry_run"] is True
    assert sections["gemm"]["rows_bit_identical"] is True
    assert set(sections["gemm"]["shapes"]["96x64"]) == {"1", "7", "64", "129"}
    assert sections["attention"]["decode_rows_equal_prefill_rows"] is True
    assert summary["goals"]["gemm_bf16_ge_0.8x_cublas_at_M_ge_1024"] is None  # no M >= 1024 on CPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_the_real_run_refuses_clearly():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", "env"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("RZ_SLOW_INTERPRETER_TESTS") != "1", reason="~5 min: set RZ_SLOW_INTERPRETER_TESTS=1"
)
@pytest.mark.timeout(3600)
def test_dry_run_every_section():
    summary = _run(timeout=3000)
    for name, result in summary["sections"].items():
        assert "error" not in result, (name, result)
    assert summary["goals"]["every_aligned_row_bit_identical"] is True
    assert summary["sections"]["rl_loop"]["lag0_abs_dlogp_max"] == 0.0
