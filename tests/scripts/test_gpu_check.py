"""scripts/gpu_check.py --dry-run: the GPU check's code paths run on CPU (Triton interpreter, tiny shapes),
its results reach the --out file after every section (so a killed run keeps what finished), and it ends with
a short human summary instead of a JSON dump."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def _run(out: Path, *args: str, timeout: int, returncode: int = 0) -> tuple[dict, str]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == returncode, proc.stderr[-3000:] + proc.stdout[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_dry_run_kernel_sections_report_bit_identical_rows(tmp_path):
    summary, stdout = _run(tmp_path / "g.json", "--only", "env", "gemm", "attention", timeout=300)
    sections = summary["sections"]
    assert summary["complete"] is True
    assert sections["env"]["dry_run"] is True
    assert sections["gemm"]["rows_bit_identical"] is True
    assert set(sections["gemm"]["shapes"]["96x64"]) == {"1", "7", "64", "129"}
    assert sections["attention"]["decode_rows_equal_prefill_rows"] is True
    assert sections["attention"]["decode_rows_equal_trainer_rows"] is True  # split-KV decode, 512-key split
    assert (
        max(sections["attention"]["decode_probe_splits"]) == 2
        and sections["attention"]["decode"]["tile_rows"] == 16
    )
    assert summary["goals"]["gemm_bf16_ge_0.8x_cublas_at_M_ge_1024"] is None  # no M >= 1024 on CPU
    # stdout: a line per section and a short summary, never the JSON
    assert "results in" in stdout and "{" not in stdout and len(stdout) < 3000


def test_a_run_killed_after_a_section_leaves_that_section_in_the_out_file(tmp_path):
    out = tmp_path / "g.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            "--dry-run",
            "--out",
            str(out),
            "--only",
            "env",
            "nccl_one_rank",
            "model_0.6b",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for line in proc.stdout:  # unbuffered: the line comes as the section ends
            if "nccl_one_rank:" in line:
                break
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    saved = json.loads(out.read_text())
    assert saved["complete"] is False
    assert list(saved["sections"]) == ["env", "nccl_one_rank"]
    assert saved["sections"]["nccl_one_rank"]["ok"] is True  # the sharded learner step on a one-rank group
    assert saved["sections"]["nccl_one_rank"]["collective_device"] == "cpu"


def test_a_section_past_its_budget_is_cut_and_the_next_one_still_runs(tmp_path):
    summary, _ = _run(
        tmp_path / "g.json",
        "--only",
        "gemm",
        "attention",
        "--budget-s",
        "600",
        "--section-budget-scale",
        "0.002",  # 0.15 s for gemm: the interpreter needs a second or more
        timeout=300,
        returncode=1,  # a section did not pass
    )
    assert "past its budget" in summary["sections"]["gemm"]["timeout"]
    assert summary["sections"]["gemm"]["budget_s"] == 0.1  # (0.15 s, rounded)
    assert "attention" in summary["sections"] and summary["complete"] is True


def test_dry_run_engine_sections_run_the_decode_step_sync_free_and_bit_identical(tmp_path):
    summary, _ = _run(
        tmp_path / "g.json", "--only", "engine_decode", "engine_sync", "engine_vs_trainer", timeout=900
    )
    sections = summary["sections"]
    decode = sections["engine_decode"]["sizes"]
    assert set(decode) == {"b1_ctx8", "b3_ctx8", "b1_ctx70", "b3_ctx70"}
    assert all(r["aligned_eager_ms"] > 0 and r["standard_eager_ms"] > 0 for r in decode.values())
    assert decode["b3_ctx70"]["standard_differs_from_aligned"] is True
    assert sections["engine_sync"]["qwen3"]["host_reads"] == 0  # the interpreter's own reads are not counted
    assert summary["goals"]["decode_step_no_host_sync"] is True
    trainer = sections["engine_vs_trainer"]
    assert trainer["bit_identical"] is True and trainer["qwen3"]["shared_prefix_tokens"] > 0
    assert "CUDA graphs need a CUDA device" in trainer["qwen3"]["cuda_graphs_off"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_the_real_run_refuses_clearly(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", "env", "--out", str(tmp_path / "g.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("RZ_SLOW_INTERPRETER_TESTS") != "1", reason="~10 min: set RZ_SLOW_INTERPRETER_TESTS=1"
)
@pytest.mark.timeout(3600)
def test_dry_run_every_section(tmp_path):
    summary, _ = _run(tmp_path / "g.json", timeout=3000)
    for name, result in summary["sections"].items():
        assert "error" not in result, (name, result)
    goals = summary["goals"]
    assert goals["every_aligned_row_bit_identical"] is True
    assert goals["gradients_bitwise_reproducible"] is True and goals["sharded_step_on_one_rank_group"] is True
    assert summary["sections"]["rl_loop"]["lag0_abs_dlogp_max"] == 0.0


def test_resume_runs_only_the_sections_the_budget_stopped_and_keeps_the_rest(tmp_path):
    out = tmp_path / "g.json"
    first, _ = _run(out, "--only", "env", "logprobs_vocab", "--budget-s", "0", timeout=120)
    assert all(r["skipped"].startswith("total time budget") for r in first["sections"].values())
    second, _ = _run(out, "--resume", "--only", "env", "logprobs_vocab", timeout=300)
    assert (
        second["sections"]["env"]["dry_run"] is True and "skipped" not in second["sections"]["logprobs_vocab"]
    )
    third, stdout = _run(out, "--resume", "--only", "env", timeout=120)
    assert third["sections"] == second["sections"]  # both kept, nothing rerun
    assert third["section_seconds"] == second["section_seconds"] and "[gpu_check] env:" not in stdout


def test_a_timeout_a_library_re_raises_as_another_error_is_still_reported_as_past_the_budget(tmp_path):
    # Triton's JIT, cut mid-compile, re-raises the SectionTimeout as `TypeError: unsupported callable`: the
    # section must still read as stopped for time (and --resume must rerun it), not as a broken section.
    # (In a subprocess: the script parses its arguments and sets the interpreter's environment on import.)
    code = f"""
import importlib.util, json, sys, time
sys.argv = ["gpu_check.py", "--dry-run", "--out", {str(tmp_path / "unused.json")!r}]
spec = importlib.util.spec_from_file_location("gpu_check_mod", {str(SCRIPT)!r})
gc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gc)
try:
    with gc.time_limit(0.05) as expiry:
        try:
            time.sleep(5)
        except gc.SectionTimeout:
            raise TypeError("unsupported callable") from None
except TypeError:
    pass
with gc.time_limit(5) as quiet:
    pass
print(json.dumps([expiry.message, quiet.message]))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["past its budget of 0 s", None]


@pytest.mark.timeout(2400)
def test_dry_run_production_decode_rows_equal_the_trainer_and_the_standard_forward_differs(tmp_path):
    # issue 54: the engine's paged, split-KV, chunked-prefill decode at head dim 128 / GQA 4 vs the learner's
    # forward, row by row, with rows folding 4, 2 and 1 splits (128-key splits in the interpreter)
    summary, _ = _run(tmp_path / "g.json", "--only", "production_decode", timeout=2400)
    section = summary["sections"]["production_decode"]
    assert (section["head_dim"], section["gqa"]) == (128, 4)
    assert section["bit_identical"] is True and all(r["equal"] for r in section["rows"])
    assert section["split_keys"] == 128
    assert [r["splits_at_last_token"] for r in section["rows"]] == [4, 4, 2, 1]
    assert section["tokens_compared"] == 8 and section["max_splits"] >= 3
    assert section["engine_decode_grid_splits_max"] >= 4  # the engine's split-KV decode ran them
    assert section["shared_prefix_tokens"] > 0
    assert section["standard_differs"] is True  # the negative control: the comparison can fail
    assert not section.get("failures")
