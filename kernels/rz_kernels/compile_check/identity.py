"""Engine vs trainer: are the binaries behind each shared op byte-identical, and if not, why the bits agree.

For each op the engine and the learner share (linear, attention, norms, RoPE, SiLU-mul, log-softmax, MoE),
the recorded launches of each side (the learner's forward only: launches made outside the autograd
engine) are mapped to their compiled cubins; the op's verdict is ``identical`` when both sides use the same
set of cubins (same SHA-256). Otherwise the table names each engine binary's difference from the nearest
trainer binary (kernel, constexprs, specialization) and gives the reason that difference cannot change the
order of any element's reduction (``REASONS``), together with the MMA instructions both sides issue.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from rz_kernels.compile_check.recorder import Launch

# kernel name -> the op it implements, for the kernels the forward of both sides runs.
SHARED_OPS = {
    "_matmul_kernel": "linear",
    "_splitk_combine_kernel": "linear",  # a split-K GEMM's second launch: partials summed in split order
    "_sigmoid_kernel": "moe_route_sigmoid",  # DeepSeek-V3's router scores
    "_attn_fwd_kernel": "attention",
    "_attn_decode_split_kernel": "attention",
    "_attn_decode_combine_kernel": "attention",
    "_rms_norm_kernel": "rms_norm",
    "_rope_kernel": "rope",
    "_silu_mul_kernel": "silu_mul",
    "_log_softmax_gather_kernel": "log_softmax",
    "_grouped_matmul_kernel": "moe_grouped_gemm",
    # Gated DeltaNet (Qwen3.5) and DeepSeek-V4's sparse attention (recorded op by op: op_workloads.py)
    "_causal_conv_kernel": "causal_conv1d",
    "_delta_rule_kernel": "delta_rule",
    "_kda_kernel": "delta_rule_kda",  # Kimi Linear: the delta rule with a per-channel decay
    "_gated_rms_norm_kernel": "gated_rms_norm",
    "_window_pool_kernel": "window_pool",
    "_index_scores_kernel": "index_scores",
    "_top_k_kernel": "index_top_k",
    "_sink_attention_kernel": "sink_attention",
    "_clamped_swiglu_kernel": "clamped_swiglu",  # DeepSeek-V4's expert activation
}

# Why a named difference keeps each element's reduction order (checked against the kernels' source).
REASONS = {
    "attention": (
        "engine prefill/chunked prefill run _attn_fwd_kernel with PAGED=True (trainer: PAGED=False); "
        "decode runs _attn_decode_split_kernel + _attn_decode_combine_kernel. PAGED only changes where a "
        "key block is loaded from (page table lookup vs sequence row), not which keys or in what order. "
        "All three kernels call the same @triton.jit helpers on the same [BLOCK_M, HEAD_D] x [HEAD_D, "
        "BLOCK_N] tiles: _split_partial (online softmax of one 512-key split from a fresh state, key "
        "blocks in order), _combine (splits folded in order 0, 1, ... with explicit fma) and _finish; "
        "decode stores a split's partial and the combine kernel folds them in the same order with the "
        "same helper. The MMA instructions (mma_shapes) are listed per side: equal shapes and types on "
        "both sides."
    ),
    "log_softmax": (
        "the engine samples from _softmax_kernel(LOG=True) (full row), the learner gathers with "
        "_log_softmax_gather_kernel: both call the same @triton.jit _row_stats (max over BLOCK-wide "
        "column blocks in order, then sum of exp(x - max) accumulated lane-wise in block order, reduced "
        "once) with the same BLOCK and V, compute lse = m + log(s) and return x[t] - lse: the same "
        "operations on the same values in the same order; only the store differs (the whole row vs one "
        "element)."
    ),
    "linear": ("different tiles or K order would change the sums: a difference here is a defect."),
    "rms_norm": (
        "one program per row, the row reduced by tl.sum over one BLOCK_H block: a difference is a defect."
    ),
    "rope": ("elementwise per (token, head): no reduction; a specialization difference cannot reorder one."),
    "silu_mul": ("elementwise per row: no reduction; a specialization difference cannot reorder one."),
    "clamped_swiglu": ("elementwise per row: no reduction; a specialization difference cannot reorder one."),
    "moe_grouped_gemm": ("one tile config whatever the rows: a difference here is a defect."),
    "moe_route_softmax": ("one program per row, fixed column blocks: a difference is a defect."),
    "moe_route_sigmoid": ("elementwise: no reduction; a specialization difference cannot reorder one."),
}

_FIELDS = ("kernel", "signature", "constexprs", "attrs", "num_warps", "num_stages")


def op_of(launch: Launch) -> str | None:
    """The shared op a launch belongs to (the row softmax kernel: log-softmax with LOG, else the router's)."""
    name = _short(launch.kernel)
    if name == "_softmax_kernel":
        return "log_softmax" if launch.constexprs.get("LOG") else "moe_route_softmax"
    return SHARED_OPS.get(name)


def _short(kernel: str) -> str:
    return kernel.rsplit(".", 1)[-1]


def _diff(a: dict, b: dict) -> dict[str, Any]:
    """Fields in which two launches differ (per argument for the dict fields)."""
    out: dict[str, Any] = {}
    for f in _FIELDS:
        va, vb = a[f], b[f]
        if isinstance(va, dict):
            keys = sorted(set(va) | set(vb))
            d = {k: [va.get(k), vb.get(k)] for k in keys if va.get(k) != vb.get(k)}
            if d:
                out[f] = d
        elif va != vb:
            out[f] = [va, vb]
    return out


def identity_table(
    launches: list[Launch], results: dict[tuple[str, int], dict], capability: int, model: str | None = None
) -> list[dict]:
    """Per shared op: engine vs trainer cubins at ``capability`` (``results`` keyed by (key, capability))."""
    sides: dict[str, dict[str, dict[str, dict]]] = defaultdict(lambda: {"engine": {}, "trainer": {}})
    for launch in launches:
        op = op_of(launch)
        side = launch.tags.get("side")
        if op is None or side not in ("engine", "trainer") or (model and launch.tags.get("model") != model):
            continue
        if side == "trainer" and launch.tags.get("in_backward"):
            continue  # the gradient's binaries are not part of the bit-identity contract
        sides[op][side].setdefault(launch.key(), launch.to_json())
    table = []
    for op, by_side in sorted(sides.items()):
        row: dict[str, Any] = {"op": op, "capability": capability}
        cubins = {}
        for side, keyed in by_side.items():
            got = {}
            for key, launch in keyed.items():
                res = results.get((key, capability), {})
                got[key] = {
                    "kernel": _short(launch["kernel"]),
                    "cubin_sha256": res.get("cubin_sha256"),
                    "mma_shapes": res.get("mma_shapes", []),
                    "ok": res.get("ok"),
                }
            cubins[side] = got
            row[side] = sorted({(v["kernel"], v["cubin_sha256"] or "not compiled") for v in got.values()})
        eng = {v["cubin_sha256"] for v in cubins["engine"].values()}
        trn = {v["cubin_sha256"] for v in cubins["trainer"].values()}
        if not cubins["engine"] or not cubins["trainer"]:
            row["verdict"] = "one side only"
        elif None in eng or None in trn:
            row["verdict"] = "not compiled"
        elif eng == trn:
            row["verdict"] = "identical"
        else:
            row["verdict"] = "different"
            diffs = []
            for key, v in cubins["engine"].items():
                if v["cubin_sha256"] in trn:
                    continue
                ek = by_side["engine"][key]
                nearest = min(by_side["trainer"].values(), key=lambda t: len(json.dumps(_diff(ek, t))))
                diffs.append({"engine_kernel": v["kernel"], "vs_trainer_kernel": _short(nearest["kernel"]),
                              "difference": _diff(ek, nearest)})  # fmt: skip
            row["differences"] = diffs
            row["why_the_bits_agree"] = REASONS.get(op, "")
        row["mma_shapes"] = {
            side: sorted({s for v in got.values() for s in v["mma_shapes"]}) for side, got in cubins.items()
        }
        table.append(row)
    return table
