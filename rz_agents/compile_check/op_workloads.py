"""The Triton launches of the new families' own ops (issues 51 and 52), recorded op by op at released shapes.

The Qwen3.5, Kimi Linear and DeepSeek-V4 models are not driven through the engine on meta tensors yet (their
engine caches and presets are other work), so their new kernels are recorded here directly, at the shapes
their layers launch them, on the engine's side (prefill, a chunk with earlier tokens cached plus decode rows
riding along, decode at the CUDA-graph buckets and two contexts) and the learner's (the forward of the
recipes' packed micro-batches; the backward is autograd through the torch forms: no Triton launch). The GEMMs,
norms and attention of these layers are the existing kernels, recorded by the model recipes.

Shapes: Gated DeltaNet as transformers' ``Qwen3_5TextConfig()`` defaults (16 key heads repeated to 32 value
heads, head dims 128, conv kernel 4: 8192 conv channels); Kimi Delta Attention as Kimi-Linear-48B-A3B (32
heads of 128, the decay per key channel, the q/k/v convs as one of 12288 channels); DeepSeek-V4 as
``DeepseekV4Config()`` (V4-Flash: 64 heads of 512, window 128, CSA rate 4 with overlapping windows of 8, HCA
rate 128, an indexer of 64 heads of 128 picking 512 entries; the MoE: 256 experts of 4096 -> 2048, top 6,
SwiGLU clamped at 10). bf16 activations, fp32 where the layer computes in fp32 (log decay, scores).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rz_kernels.compile_check.recorder import Launch, LaunchRecorder, record_launches
from rz_kernels.delta_rule import CHUNK, DeltaRuleCache

GDN = dict(heads=32, dk=128, dv=128, channels=8192, taps=4)
# Kimi-Linear-48B-A3B's KDA layers: 32 heads of 128, the q, k, v convs as one 3 * 4096-channel conv
KDA = dict(heads=32, dk=128, dv=128, channels=3 * 4096, taps=4)
V4 = dict(heads=64, dim=512, window=128, csa=4, hca=128, index_heads=64, index_dim=128, top_k=512)
V4_MOE = dict(hidden=4096, inter=2048, experts=256, top_k=6, limit=10.0)
BF16 = torch.bfloat16
MICRO_BATCHES = ([4096], [2048, 1024, 512, 512])  # the 4B recipe's learner micro-batch, one and packed
BUCKETS = (1, 16, 48, 128)
CONTEXTS = (2048, 8192)


def _meta(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def _gdn_cache(pending: int, shape: dict = GDN, channel: bool = False) -> DeltaRuleCache:
    h, dk, dv = shape["heads"], shape["dk"], shape["dv"]
    f = torch.float32
    return DeltaRuleCache(
        _meta(h, dk, dv, dtype=f), _meta(pending, h, dk, dtype=f), _meta(pending, h, dv, dtype=f),
        _meta(pending, h, *((dk,) if channel else ()), dtype=f), _meta(pending, h, dtype=f),
    )  # fmt: skip


def gated_deltanet_layer(
    lens: list[int], pending: list[int | None], keep: bool, shape: dict = GDN, channel: bool = False
) -> None:
    """One Gated DeltaNet layer's new ops over sequences of `lens` new tokens, each with `pending` tokens of
    its current chunk cached (None: it starts here). With `channel`, a KDA layer's (Kimi Linear): the decay
    per key channel, and no Triton gated norm (its sigmoid-gated norm is elementwise torch)."""
    from rz_kernels.triton_ops import causal_conv, delta_rule, gated_norm

    t, h, dk, dv = sum(lens), shape["heads"], shape["dk"], shape["dv"]
    windows = [None if p is None else _meta(shape["taps"] - 1, shape["channels"]) for p in pending]
    causal_conv.causal_conv1d(
        _meta(t, shape["channels"]), _meta(shape["channels"], 1, shape["taps"]), lens, windows,
        keep_windows=keep,
    )  # fmt: skip
    caches = [None if p is None else _gdn_cache(p, shape, channel) for p in pending]
    q, k, v = _meta(t, h, dk), _meta(t, h, dk), _meta(t, h, dv)
    g = _meta(t, h, *((dk,) if channel else ()), dtype=torch.float32)
    delta_rule.gated_delta_rule(q, k, v, g, _meta(t, h), lens, caches, keep_caches=keep)
    if not channel:
        gated_norm.gated_rms_norm(_meta(t * h, dv), _meta(t * h, dv), _meta(dv), 1e-6)


def deepseek_v4_layer(lens: list[int], contexts: list[int]) -> None:
    """A CSA and an HCA layer's new ops for queries of `lens` tokens ending at `contexts` (each query sees
    its sequence's entries so far: the widest row sets the padded entry count, as the packed forward does)."""
    from rz_kernels.triton_ops import sink_attention, sparse_select, window_pool

    t, h, d, c = sum(lens), V4["heads"], V4["dim"], V4["index_dim"]
    span = max(contexts)
    for rate, width, dim in (
        (V4["csa"], 2 * V4["csa"], d),
        (V4["csa"], 2 * V4["csa"], c),
        (V4["hca"], V4["hca"], d),
    ):
        windows = sum(n // rate + 1 for n in lens)  # the windows the call completes (at least one per row)
        window_pool.aligned_pool(_meta(windows, width, dim), _meta(windows, width, dim, dtype=torch.float32))
    entries = span // V4["csa"]
    scores = sparse_select.aligned_scores(
        _meta(t, V4["index_heads"], c), _meta(t, entries, c),
        _meta(t, V4["index_heads"], dtype=torch.float32), _meta(t, entries, dtype=torch.bool), c**-0.5,
    )  # fmt: skip
    sparse_select.aligned_top_k(scores, V4["top_k"])
    slide, slide_ok = _meta(t, V4["window"], d), _meta(t, V4["window"], dtype=torch.bool)
    sinks = _meta(h, dtype=torch.float32)
    for comp in (V4["top_k"], span // V4["hca"]):  # CSA: the picked entries; HCA: every entry so far
        sink_attention.aligned_sink_attention(
            _meta(t, h, d),
            slide,
            slide_ok,
            _meta(t, comp, d),
            _meta(t, comp, dtype=torch.bool),
            sinks,
            d**-0.5,
            64,
        )


def deepseek_v4_moe(t: int) -> None:
    """A V4 MoE layer's expert launches over t tokens: the routed experts' grouped GEMMs with the clamped
    SwiGLU between them, and the shared expert's clamped SwiGLU (its GEMMs are the dense linear's). The
    experts are a real CPU tensor (the grouping is planned on real values; the launch grid is an upper bound
    from the shapes alone, so which experts the tokens pick changes no launch)."""
    from rz_kernels.triton_ops import clamped_swiglu, moe

    hidden, inter, e, k = V4_MOE["hidden"], V4_MOE["inter"], V4_MOE["experts"], V4_MOE["top_k"]
    experts = (torch.arange(t * k) % e).view(t, k)
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    gate, up, down = ([_meta(*shape) for _ in range(e)] for shape in shapes)
    moe.aligned_moe(_meta(t, hidden), _meta(t, k, dtype=torch.float32), experts, e,
                    expert_weights=(gate, up, down), swiglu_limit=V4_MOE["limit"])  # fmt: skip
    clamped_swiglu.clamped_swiglu(_meta(t, inter), _meta(t, inter), V4_MOE["limit"])


def _record(
    name: str, rec: LaunchRecorder, prefill: Callable, chunk: Callable, decode: Callable, train
) -> None:
    with torch.no_grad():
        with rec.tagged(model=name, side="engine", phase="prefill", rows=2048):
            prefill()
        with rec.tagged(model=name, side="engine", phase="chunked_prefill", rows=4096 + 16):
            chunk()
        for b in BUCKETS:
            for ctx in CONTEXTS:
                with rec.tagged(model=name, side="engine", phase="decode", rows=b, context=ctx):
                    decode(b, ctx)
        for i, lens in enumerate(MICRO_BATCHES):
            tags = dict(model=name, side="trainer", phase="train", rows=sum(lens), micro_batch=i)
            with rec.tagged(**tags, sequences=len(lens)):
                train(lens)


def record_qwen3_5_ops(name: str = "qwen3.5-gdn") -> list[Launch]:
    """Every launch of a Gated DeltaNet layer's conv, delta rule and gated norm, engine and learner."""
    riders = [1] * 16
    with record_launches() as rec:
        _record(
            name, rec,
            prefill=lambda: gated_deltanet_layer([2048], [None], keep=True),
            chunk=lambda: gated_deltanet_layer([4096, *riders], [37] + [37 % CHUNK] * 16, keep=True),
            decode=lambda b, ctx: gated_deltanet_layer([1] * b, [ctx % CHUNK + 37] * b, keep=True),
            train=lambda lens: gated_deltanet_layer(lens, [None] * len(lens), keep=False),
        )  # fmt: skip
    return rec.launches


def record_kimi_linear_ops(name: str = "kimi-linear-kda") -> list[Launch]:
    """Every launch of a Kimi Linear KDA layer's conv and per-channel-decay delta rule, engine and learner
    (its MLA and MoE are the existing attention and grouped-GEMM kernels)."""
    riders = [1] * 16

    def layer(lens: list[int], pending: list[int | None], keep: bool) -> None:
        gated_deltanet_layer(lens, pending, keep, shape=KDA, channel=True)

    with record_launches() as rec:
        _record(
            name, rec,
            prefill=lambda: layer([2048], [None], keep=True),
            chunk=lambda: layer([4096, *riders], [37] + [37 % CHUNK] * 16, keep=True),
            decode=lambda b, ctx: layer([1] * b, [ctx % CHUNK + 37] * b, keep=True),
            train=lambda lens: layer(lens, [None] * len(lens), keep=False),
        )  # fmt: skip
    return rec.launches


def record_deepseek_v4_ops(name: str = "deepseek-v4-sparse") -> list[Launch]:
    """Every launch of a CSA and an HCA layer's pooling, indexer scores, top-k and sink attention, and of an
    MoE layer's grouped expert GEMMs and clamped SwiGLU."""

    def both(lens: list[int], contexts: list[int]) -> None:
        deepseek_v4_layer(lens, contexts)
        deepseek_v4_moe(sum(lens))

    with record_launches() as rec:
        _record(
            name, rec,
            prefill=lambda: both([2048], [2048]),
            chunk=lambda: both([4096] + [1] * 16, [8192] + [1000] * 16),
            decode=lambda b, ctx: both([1] * b, [ctx] * b),
            train=lambda lens: both(lens, list(lens)),
        )  # fmt: skip
    return rec.launches


OP_RECIPES: dict[str, Callable[[str], list[Launch]]] = {
    "qwen3.5-gdn": record_qwen3_5_ops,
    "kimi-linear-kda": record_kimi_linear_ops,
    "deepseek-v4-sparse": record_deepseek_v4_ops,
}
