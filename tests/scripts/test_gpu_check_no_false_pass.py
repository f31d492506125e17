"""scripts/gpu_check.py cannot report a pass it did not earn: a section its budget cut reads ``timeout``
however it ended (raised, re-raised as another error, or swallowed and returned), a section whose completions
did not finish as asked or that compared no token reads ``FAILED``, and ``--resume`` keeps only real passes.
Its budgets fit: the sections' budgets sum inside the total, which fits the device machine's 540 s command.

Before (79df6e8): engine_vs_trainer cut at 1.5 s in a dry run logged "sampling failed" inside the engine
and returned ``ok`` with ``bit_identical: true`` (the engine's ``except Exception`` swallowed the
SectionTimeout); the budgets summed to 715 s inside a 450 s total."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


@pytest.fixture
def gpu_check(monkeypatch, tmp_path):
    """The script as a module (it parses sys.argv on import): a GPU-mode parse, nothing run."""
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(tmp_path / "g.json")])
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton_cache"))
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_engine_section_cut_by_its_budget_reads_timeout_never_ok(tmp_path):
    out = tmp_path / "g.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--only", "engine_vs_trainer"]
        # 30 s x 0.04 = 1.2 s: the dry-run section takes several seconds, cut inside the engine's steps
        + ["--budget-s", "100", "--section-budget-scale", "0.04"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    result = json.loads(out.read_text())["sections"]["engine_vs_trainer"]
    assert "timeout" in result and "bit_identical" not in result, result
    assert "engine_vs_trainer: timeout" in proc.stdout
    assert proc.returncode == 1  # not a pass


def test_a_timeout_the_section_swallowed_still_reads_timeout(gpu_check):
    def swallowing_section(check):
        try:
            time.sleep(5)
        except BaseException:  # noqa: BLE001 - what a careless handler does
            pass
        return {"bit_identical": True}

    result = gpu_check.run_section(SimpleNamespace(deadline=None), swallowing_section, 0.1)
    assert gpu_check.status_of(result) == "timeout"
    assert "swallowed" in result["timeout"] and result["partial"] == {"bit_identical": True}


def test_a_timeout_inside_a_real_engine_step_reads_timeout(gpu_check):
    """The alarm fires inside RZEngine's model forward (under its ``except Exception`` handler)."""
    import torch

    from rz_agents.engine import EngineConfig, RZEngine, SamplingParams, generate_batch
    from rz_agents.model import ModelConfig, Transformer

    torch.manual_seed(0)
    engine = RZEngine(Transformer(ModelConfig.tiny("qwen3")), EngineConfig(max_running=4, max_len=64))
    real_forward = engine.runner.forward

    def slow_forward(batch):
        time.sleep(0.2)
        return real_forward(batch)

    engine.runner.forward = slow_forward

    def section(check):
        done = generate_batch(engine, [[1, 2, 3], [4, 5]], SamplingParams(max_tokens=8, ignore_eos=True))
        out = {"bit_identical": True}
        gpu_check.check_completions(out, done, "length", 8)
        return out

    result = gpu_check.run_section(SimpleNamespace(deadline=None), section, 0.5)
    assert gpu_check.status_of(result) == "timeout", result


def test_completions_that_did_not_finish_as_asked_fail_the_section(gpu_check):
    def completion(reason, n):
        return SimpleNamespace(finish_reason=reason, tokens=[0] * n, error="sampling failed: boom")

    out: dict = {}
    gpu_check.check_completions(out, [completion("length", 8), completion("error", 2)], "length", 8)
    assert gpu_check.status_of(out) == "FAILED"
    assert out["finish_reasons"] == {"length": 1, "error": 1}
    assert any("'error'" in f and "sampling failed" in f for f in out["failures"])
    assert any("[2] tokens" in f for f in out["failures"])
    fine: dict = {}
    gpu_check.check_completions(fine, [completion("length", 8)], "length", 8)
    assert gpu_check.status_of(fine) == "ok"


def test_resume_keeps_only_real_passes_of_this_result_format(gpu_check, tmp_path):
    out = tmp_path / "old.json"
    sections = {
        "env": {"torch": "x"},
        "alignment": {"aligned_bit_identical": True, "failures": ["no aligned token compared"]},
        "gemm": {"timeout": "past its budget of 55 s"},
        "attention": {"error": "RuntimeError: x"},
        "rl_demo": {"skipped": "needs gymnasium (not installed here)"},
    }
    out.write_text(json.dumps({"sections": sections, "result_format": gpu_check.RESULT_FORMAT}))
    assert set(gpu_check.previous_sections(out)) == {"env"}
    out.write_text(json.dumps({"sections": sections}))  # an older script's file: its "ok" is not trusted
    assert gpu_check.previous_sections(out) == {}


def test_section_budgets_sum_inside_the_total_which_fits_the_540_s_command(gpu_check):
    assert gpu_check.budgets_sum_s() <= gpu_check.GPU_TOTAL_BUDGET_S <= 540
    order = list(gpu_check.SECTIONS)
    identity_and_speed = [
        "alignment", "engine_vs_trainer", "production_decode", "gemm", "attention", "logprobs_vocab"
    ]
    assert order[: len(identity_and_speed) + 1] == ["env", *identity_and_speed]
    assert order.index("engine_decode") < order.index("model_0.6b") < order.index("rl_loop")


def test_the_triton_cache_lives_under_runs_never_beside_the_results(tmp_path):
    out = tmp_path / "run" / "g.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--only", "env"],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "TRITON_CACHE_DIR"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    saved = json.loads(out.read_text())
    assert saved["triton_cache_dir"] == str(SCRIPT.parent.parent / "runs" / "triton-cache")
    assert sorted(p.name for p in out.parent.iterdir()) == ["g.json"]
    assert saved["budgets_sum_s"] <= 520 and "sections' budgets sum to" in proc.stdout
