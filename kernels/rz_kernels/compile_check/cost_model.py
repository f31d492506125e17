"""A static cost model of recorded Triton launches: bytes and FLOPs per launch, grid vs SMs, a card's figures.

Per launch (``launch_cost``) the HBM bytes it must move and the FLOPs its MMAs execute come from the
recorded shapes and constexprs (``Launch.args``); its time is

    t = max(bytes / (BW * f), flops / (PEAK * f)) + LAUNCH_S,   f = min(1, programs / SMS) per wave

with BW, PEAK and SMS the card's (``rz_kernels.compile_check.cards``; the H200 unless one is named) and BW its
datasheet peak unless the caller passes another (the estimate passes the card's achievable bandwidth).
Summed over the Triton launches at the peak, this is a lower bound on the Triton kernels' time, not a
prediction of the step: ``rz_agents.compile_check.predict`` adds what it leaves out for its estimate.
i.e. a grid that covers fewer SMs than the GPU has gets that fraction of the bandwidth and the tensor
throughput (one SM's share each: an assumption, stated; a single SM can pull somewhat more than 1/132 of
HBM), and every launch pays a fixed floor (a CUDA-graph kernel node: ramp, tail, the gap to the next).
A decode step's Triton bound is the sum over its launches; its roofline (the bound) is the bytes it must read
(every weight once, the LM head included, plus the K/V of every row's context) over BW.

What the bytes assume: an operand tile re-read by several programs comes from L2 (read once from HBM); a
row softmax over the vocabulary reads its row from HBM once (the 600 KB row's second and third passes hit
L2 at decode batch sizes); attention decode reads each (token, kv head)'s K/V once. Decode attention
programs past a token's last split (the CUDA-graph grid's upper bound) cost only the launch floor.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from rz_kernels.compile_check.cards import CARDS, Card
from rz_kernels.compile_check.recorder import Launch

H200 = CARDS["H200"]  # the default card (the compile check's report)
HBM_BYTES_PER_S = H200.hbm_bytes_per_s  # H200 HBM3e
PEAK_BF16_FLOPS = H200.peak_bf16_flops  # dense bf16 MMA, measured 770-800 TFLOP/s on the H200
SMS = H200.sms
LAUNCH_S = 2.0e-6  # per kernel node in a replayed graph: ramp-up, tail and the gap to the next kernel
CUBLAS_EFFICIENCY = 0.7  # the learner's backward GEMMs (torch.mm on cuBLAS), of PEAK_BF16_FLOPS

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4, "int64": 8}


@dataclass
class LaunchCost:
    kernel: str
    bytes: float
    flops: float
    programs: int
    busy_programs: int
    seconds: float


def _bytes_of(arg: Any) -> float:
    if not isinstance(arg, dict) or "shape" not in arg:
        return 0.0
    return math.prod(arg["shape"]) * _DTYPE_BYTES.get(arg["dtype"], 4)


def _elt(arg: Any) -> int:
    return _DTYPE_BYTES.get(arg.get("dtype", "float32"), 4) if isinstance(arg, dict) else 4


def _matmul(a: dict, c: dict) -> tuple[float, float]:
    m, n, k = a["M"], a["N"], a["K"]
    split = c.get("SPLIT", False)
    out = _bytes_of(a["c_ptr"]) if split else m * n * _elt(a["c_ptr"])
    return m * k * _elt(a["a_ptr"]) + _bytes_of(a["b_ptr"]) + out, 2.0 * m * n * k


def _attention_decode(launch: Launch, context: int | None) -> tuple[float, float, int]:
    """K/V bytes of the live splits: each (token, kv head) reads ``context + 1`` positions of K and V."""
    a, c = launch.args, launch.constexprs
    tokens, hkv, splits = launch.grid
    d = c["HEAD_D"]
    elt = _elt(a["q_ptr"])
    keys = (context + 1) if context is not None else 1
    split_keys = c["SPLIT_BLOCKS"] * c["BLOCK_N"]
    live = min(splits, -(-keys // split_keys))
    kv = tokens * hkv * keys * d * 2 * elt
    partial = tokens * a["H"] * live * (d + 2) * 4
    flops = 2.0 * 2 * tokens * hkv * live * split_keys * c["BLOCK_M"] * d  # the 16-row tile's MMAs
    return kv + partial + _bytes_of(a["q_ptr"]), flops, tokens * hkv * live


def launch_cost(launch: Launch, card: Card = H200, bytes_per_s: float | None = None) -> LaunchCost:
    """Bytes, FLOPs and seconds of one launch on ``card`` at ``bytes_per_s`` (default: the card's datasheet
    bandwidth; see the module docstring)."""
    name = launch.kernel.rsplit(".", 1)[-1]
    a, c = launch.args, launch.constexprs
    programs = launch.grid[0] * launch.grid[1] * launch.grid[2]
    busy = programs
    flops = 0.0
    if name == "_matmul_kernel":
        nbytes, flops = _matmul(a, c)
    elif name == "_splitk_combine_kernel":
        nbytes = _bytes_of(a["part_ptr"]) + a["M"] * a["N"] * _elt(a["c_ptr"])
    elif name == "_attn_decode_split_kernel":
        nbytes, flops, busy = _attention_decode(launch, launch.tags.get("context"))
    elif name == "_attn_decode_combine_kernel":
        ctx = launch.tags.get("context")
        live = -(-((ctx or 0) + 1) // (c["SPLIT_BLOCKS"] * 64))
        t = launch.grid[0]
        nbytes = t * a["H"] * live * (c["HEAD_D"] + 2) * 4 + 2 * t * a["H"] * c["HEAD_D"] * 2
    elif (
        name == "_rope_kernel"
    ):  # x in, x out, and the cos/sin rows of the tokens' positions (not the tables)
        t = a["T"]
        nbytes = 2 * _bytes_of(a["x_ptr"]) + t * 2 * c["HALF"] * 4 * 2
    elif name == "_softmax_kernel" or name == "_log_softmax_gather_kernel":
        nbytes = a["R"] * a["V"] * 4 * (2 if name == "_softmax_kernel" else 1)
    elif name == "_grouped_matmul_kernel":
        # the experts a batch reaches: at most one weight per (row, top-k slot) or all experts
        m, n, k = a["M"], a["N"], a["K"]
        experts = a["w_table"]["shape"][0]
        nbytes, flops = m * k * 2 + m * n * 2 + min(m, experts) * n * k * 2, 2.0 * m * n * k
    else:  # row-wise and elementwise kernels, attention forward/backward: every tensor argument once
        nbytes = sum(_bytes_of(v) for v in a.values())
        if name.startswith("_attn") and "HEAD_D" in c:
            flops = _attention_flops(launch)
    f = min(1.0, busy / card.sms) if busy else 1.0
    bw = bytes_per_s or card.hbm_bytes_per_s
    seconds = max(nbytes / (bw * f), flops / (card.peak_bf16_flops * f)) + LAUNCH_S
    return LaunchCost(name, nbytes, flops, programs, busy, seconds)


def _attention_flops(launch: Launch) -> float:
    """Prefill / training attention MMAs: each (tile, kv head) walks its keys in BLOCK_N blocks, on average
    half the buffer's span (causal); q.k and p.v are 2 dots, the dQ kernel 3, the dK/dV kernel 4."""
    a, c = launch.args, launch.constexprs
    tiles = a["tile_tokens"]["shape"][0] if "tile_tokens" in a else launch.grid[0]
    hkv = launch.grid[2] if launch.kernel.endswith("_attn_bwd_dkdv_kernel") else launch.grid[1]
    span = max(int(a.get("L", 0) or 0), 1)
    dots = {"_attn_bwd_dq_kernel": 3, "_attn_bwd_dkdv_kernel": 4}.get(launch.kernel.rsplit(".", 1)[-1], 2)
    return dots * 2.0 * c["BLOCK_M"] * c["HEAD_D"] * (span / 2) * tiles * hkv


def decode_roofline_bytes(model: dict, batch: int, context: int) -> float:
    """Bytes a decode step must read: every weight once (tied embeddings: the LM head's read) and the K/V
    of ``context + 1`` positions per row. ``model``: the ModelConfig's fields (dense models)."""
    h, layers = model["hidden_size"], model["num_hidden_layers"]
    d, nh, nkv = model["head_dim"], model["num_attention_heads"], model["num_key_value_heads"]
    per_layer = h * (nh * d + 2 * nkv * d) + nh * d * h + 3 * h * model["intermediate_size"]
    weights = (layers * per_layer + model["vocab_size"] * h) * 2
    kv = batch * (context + 1) * layers * nkv * d * 2 * 2
    return weights + kv


def step_prediction(
    launches: list[Launch], card: Card = H200, bytes_per_s: float | None = None
) -> dict[str, Any]:
    """The sum of the launches' costs on ``card`` (at ``bytes_per_s``), with the six largest kernels."""
    by_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    total = 0.0
    total_bytes = 0.0
    for launch in launches:
        cost = launch_cost(launch, card, bytes_per_s)
        total += cost.seconds
        total_bytes += cost.bytes
        row = by_kernel[cost.kernel]
        row[0] += cost.seconds
        row[1] += cost.bytes
        row[2] += 1
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:6]
    return {
        "seconds": total,
        "bytes": total_bytes,
        "launches": len(launches),
        "by_kernel": {
            k: {"ms": round(v[0] * 1e3, 3), "GB": round(v[1] / 1e9, 3), "launches": v[2]} for k, v in top
        },
    }


def learner_backward_gemm_seconds(launches: list[Launch]) -> float:
    """The learner's backward GEMMs run on torch.mm (cuBLAS), not Triton: 2 GEMMs of the forward's FLOPs per
    recorded forward linear (grad input, grad weight), at CUBLAS_EFFICIENCY of the peak."""
    flops = 0.0
    for launch in launches:
        if launch.kernel.endswith("_matmul_kernel") and not launch.tags.get("in_backward"):
            flops += 2 * 2.0 * launch.args["M"] * launch.args["N"] * launch.args["K"]
    return flops / (PEAK_BF16_FLOPS * CUBLAS_EFFICIENCY)


def report_bounds(launches: list[Launch], model_fields: dict[str, dict] | None = None) -> dict[str, Any]:
    """The Triton launches' lower bound per decode step (model, batch, context) recorded with a context
    (``triton_bound_ms``; ``step_ms`` its older name) and, for a dense model, the bandwidth bound
    (``bound_ms``; ``roofline_ms`` its older name) and their ratio; and per learner micro-batch. Bounds, never
    predictions: ``rz_agents.compile_check.predict`` gives the estimate."""
    groups: dict[tuple, list[Launch]] = defaultdict(list)
    for launch in launches:
        t = launch.tags
        if t.get("phase") == "decode" and t.get("context") is not None:
            groups[("decode", t["model"], t["rows"], t["context"])].append(launch)
        elif t.get("phase") == "train":
            groups[("train", t["model"], t["rows"], (t.get("micro_batch"), t.get("sequences")))].append(
                launch
            )
    assumptions = {"hbm_bytes_per_s": HBM_BYTES_PER_S, "peak_bf16_flops": PEAK_BF16_FLOPS, "sms": SMS,
                   "launch_floor_s": LAUNCH_S}  # fmt: skip
    out: dict[str, Any] = {"assumptions": assumptions, "decode": [], "train": []}
    for (kind, model, rows, ctx), group in sorted(groups.items(), key=lambda kv: str(kv[0])):
        pred = step_prediction(group)
        if kind == "decode":
            row = {"model": model, "batch": rows, "context": ctx, "triton_bound_ms": pred["seconds"] * 1e3,
                   "step_ms": pred["seconds"] * 1e3, "tokens_per_s": rows / pred["seconds"],
                   "launches": pred["launches"], "by_kernel": pred["by_kernel"]}  # fmt: skip
            fields = (model_fields or {}).get(model)
            if fields and not fields.get("num_experts"):
                roof = decode_roofline_bytes(fields, rows, ctx) / HBM_BYTES_PER_S
                row.update(bound_ms=roof * 1e3, roofline_ms=roof * 1e3, roofline_tokens_per_s=rows / roof,
                           fraction_of_roofline=roof / pred["seconds"])  # fmt: skip
            out["decode"].append(row)
        else:
            bwd = learner_backward_gemm_seconds(group)
            total = pred["seconds"] + bwd
            out["train"].append({
                "model": model, "tokens": rows, "sequences": ctx[1], "triton_ms": pred["seconds"] * 1e3,
                "cublas_backward_gemm_ms": bwd * 1e3, "micro_batch_ms": total * 1e3,
                "tokens_per_s": rows / total, "by_kernel": pred["by_kernel"],
            })  # fmt: skip
    return out


def as_dict(cost: LaunchCost) -> dict:
    return asdict(cost)
