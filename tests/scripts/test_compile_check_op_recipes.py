"""The compile check's op recipes for the new families (qwen3.5-gdn, kimi-linear-kda, deepseek-v4-sparse: V4's
sparse attention and its MoE's grouped GEMMs with the clamped SwiGLU): every new Triton kernel is recorded on
the engine's side and the learner's, and each op's engine and learner launches bind to the same binary key
(signature, constexprs, specialization), so the identity table can only say identical. Recording only (a
subprocess without the interpreter: the recorder needs real @triton.jit functions)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
KERNELS = {
    "qwen3.5-gdn": {"_causal_conv_kernel", "_delta_rule_kernel", "_gated_rms_norm_kernel"},
    "kimi-linear-kda": {"_causal_conv_kernel", "_kda_kernel"},
    "deepseek-v4-sparse": {"_window_pool_kernel", "_index_scores_kernel", "_top_k_kernel",
                           "_sink_attention_kernel", "_grouped_matmul_kernel", "_clamped_swiglu_kernel"},
}  # fmt: skip
SCRIPT = """
import json
from rz_agents.compile_check.op_workloads import OP_RECIPES
out = {}
for name, record in OP_RECIPES.items():
    rows = out[name] = []
    for x in record(name):
        rows.append([x.kernel.rsplit(".", 1)[-1], x.tags["side"], x.tags["phase"], x.key()])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def recorded():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("recipe", sorted(KERNELS))
def test_every_new_kernel_is_recorded_on_both_sides_with_one_binary(recorded, recipe):
    rows = recorded[recipe]
    assert {r[0] for r in rows} == KERNELS[recipe]
    for kernel in KERNELS[recipe]:
        sides = {
            side: {key for k, s, _, key in rows if k == kernel and s == side}
            for side in ("engine", "trainer")
        }
        assert sides["engine"] and sides["trainer"], kernel
        assert sides["engine"] == sides["trainer"], kernel  # decode, prefill and training: one binary
    phases = {r[2] for r in rows}
    assert {"prefill", "chunked_prefill", "decode", "train"} <= phases
