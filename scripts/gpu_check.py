#!/usr/bin/env python3
"""One-shot GPU check: alignment, kernel speed and model steps on a CUDA machine, as one JSON summary.

    python3 scripts/gpu_check.py [--out FILE] [--budget-s 450]   # on a CUDA machine with this repo
    python3 scripts/gpu_check.py --dry-run                       # here: every section on CPU, tiny shapes,
                                                                 # the Triton kernels in the interpreter

Needs only torch (+ triton, numpy) besides this repository: the sections that need more (the demo's
environment stack: yaml, gymnasium, ...) report what is missing and the rest still runs. Sections, in
order (a section that would start past the time budget is skipped and says so):

  env            torch / triton / GPU
  gemm           aligned Triton GEMM vs cuBLAS (bf16) at M = 1, 64, 1024, 8192 on 4096x4096 and
                 4096x14336; a row alone vs inside every M, bit for bit (and cuBLAS, for contrast)
  attention      aligned attention vs SDPA: prefill (4 x 2048 tokens) and decode (64 x 2048 context);
                 decode rows == prefill rows bit for bit
  alignment      `rz align-check`'s suite on the GPU: dense + MoE, bf16, its batch compositions;
                 aligned bit-identical, standard (cuBLAS + SDPA) differs
  model_0.6b     Qwen3-0.6B-shaped random model, bf16: decode step (64 sequences at 1,024 context) and
                 learner train step (8 x 1,024 tokens), aligned vs standard, interleaved; engine path
                 vs training forward bit for bit
  model_moe      a small Qwen3-MoE-shaped model (64 experts, top-8), the same measurements
  rl_loop        3 RL steps: the rz engine samples on the GPU, the learner trains, weights go back;
                 lag-0 |dlogp|
  rl_demo        3 RL steps of configs/demo.yaml with model.device=cuda (needs the demo's packages)

Goals (from the issue): aligned GEMM >= 0.8x cuBLAS at M >= 1024 (bf16); aligned decode step and
train step >= 0.9x of standard; every aligned row bit-identical.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, Triton interpreter")
    p.add_argument("--out", default=None, help="also write the JSON summary to this file")
    p.add_argument(
        "--budget-s", type=float, default=None, help="skip sections that would start later (GPU default 450)"
    )
    p.add_argument("--only", nargs="*", default=None, help="run only these sections")
    p.add_argument("--device", default="cuda", help="CUDA device (ignored with --dry-run)")
    return p.parse_args()


ARGS = parse_args()
if ARGS.dry_run:  # must precede any import of the kernels (@triton.jit reads it)
    os.environ["TRITON_INTERPRET"] = "1"
sys.path[:0] = [str(REPO), str(REPO / "kernels")]

import torch  # noqa: E402


class Check:
    """Sizes and device for the mode (GPU or dry run), timing, and the deadline."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.dry = args.dry_run
        self.device = torch.device("cpu" if self.dry else args.device)
        # "aligned" resolves to the Triton op set on CUDA; on CPU the Triton set must be named.
        self.aligned = "triton" if self.dry else "aligned"
        self.start = time.perf_counter()
        self.budget_s = args.budget_s if args.budget_s is not None else (1e9 if self.dry else 450.0)
        if self.dry:
            torch.set_num_threads(1)
            from rz_kernels.triton_ops.interpreter import patch_interpreter

            patch_interpreter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time_ms(self, fn, iters: int = 10, warmup: int = 2) -> float:
        """Median wall time of fn() in ms (synchronised; one iteration in a dry run)."""
        if self.dry:
            iters, warmup = 1, 0
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            self.sync()
            t0 = time.perf_counter()
            fn()
            self.sync()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def random_model(check: Check, config, kernels: str, seed: int = 0):
    """A random-init Transformer built on the meta device and initialised where it lives (no CPU copy)."""
    from rz_agents.model import Transformer

    with torch.device("meta"):
        model = Transformer(config, kernels=kernels, init=False)
    model.to_empty(device=check.device)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    gen = torch.Generator(device=check.device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, device=check.device) * 0.02)
    return model


# --- sections --------------------------------------------------------------------------------------------
def section_env(check: Check) -> dict:
    out = {"torch": torch.__version__, "device": str(check.device), "dry_run": check.dry}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError as exc:
        out["triton"] = f"missing ({exc})"
    if check.device.type == "cuda":
        props = torch.cuda.get_device_properties(check.device)
        out.update(
            gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda
        )
    return out


def section_gemm(check: Check) -> dict:
    import torch.nn.functional as F

    from rz_kernels.triton_ops import gemm

    if check.dry:
        ms, shapes, dtype = (1, 7, 64, 129), {"96x64": (96, 64), "80x64": (80, 64)}, torch.bfloat16
    else:
        # weight [N, K]: "4096x14336" is a 4096 -> 14336 projection (an MLP's up/gate), its reverse the down
        shapes = {"4096x4096": (4096, 4096), "4096x14336": (14336, 4096), "14336x4096": (4096, 14336)}
        ms, dtype = (1, 64, 1024, 8192), torch.bfloat16
    out: dict = {"dtype": str(dtype).removeprefix("torch."), "shapes": {}}
    gen = torch.Generator(device=check.device).manual_seed(0)
    for label, (n, k) in shapes.items():
        w = torch.randn(n, k, generator=gen, device=check.device).to(dtype)
        x = torch.randn(max(ms), k, generator=gen, device=check.device).to(dtype)
        alone = gemm.matmul(x[:1], w)[0]
        alone_cublas = F.linear(x[:1], w)[0]
        rows = {}
        for m in ms:
            xm = x[:m].contiguous()
            aligned = gemm.matmul(xm, w)
            cublas = F.linear(xm, w)
            t_al = check.time_ms(lambda xm=xm, w=w: gemm.matmul(xm, w))
            t_cb = check.time_ms(lambda xm=xm, w=w: F.linear(xm, w))
            cfg = gemm.config_for(dtype, m)
            rows[str(m)] = {
                "aligned_ms": round(t_al, 4),
                "cublas_ms": round(t_cb, 4),
                "aligned_vs_cublas": round(t_cb / t_al, 3),  # >1: aligned faster
                "tflops_aligned": round(2 * m * n * k / t_al / 1e9, 1),
                "row0_equals_alone": bool(torch.equal(aligned[0], alone)),
                "cublas_row0_equals_alone": bool(torch.equal(cublas[0], alone_cublas)),
                "max_abs_diff_vs_cublas": float((aligned.float() - cublas.float()).abs().max()),
                "tile": [cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages],
            }
        out["shapes"][label] = rows
        # Diagnosis if per-M tiles ever break invariance on this GPU: the same rows with one tile config.
        single = {dtype: ((1 << 62, gemm.config_for(dtype, max(ms))),)}
        one = gemm.matmul(x[:1], w, table=single)[0]
        out.setdefault("single_config_rows_bit_identical", True)
        out["single_config_rows_bit_identical"] &= all(
            torch.equal(gemm.matmul(x[:m].contiguous(), w, table=single)[0], one) for m in ms
        )
        out.setdefault("per_m_tiles_equal_single_tile", True)
        out["per_m_tiles_equal_single_tile"] &= bool(torch.equal(one, alone))
    big = [r for rows in out["shapes"].values() for m, r in rows.items() if int(m) >= 1024]
    out["min_ratio_at_M_ge_1024"] = min((r["aligned_vs_cublas"] for r in big), default=None)
    out["rows_bit_identical"] = all(
        r["row0_equals_alone"] for rows in out["shapes"].values() for r in rows.values()
    )
    return out


def section_attention(check: Check) -> dict:
    import torch.nn.functional as F

    from rz_kernels.triton_ops import attention as ta

    dtype = torch.bfloat16
    if check.dry:
        b, t, h, hkv, d, bd, ctx = 2, 80, 4, 2, 16, 3, 80
    else:
        b, t, h, hkv, d, bd, ctx = 4, 2048, 32, 8, 128, 64, 2048
    gen = torch.Generator(device=check.device).manual_seed(1)
    dev = check.device
    scale = d**-0.5

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=dev).to(dtype)

    # Prefill: b sequences of t tokens.
    q = rand(b * t, h, d)
    k, v = rand(b, hkv, t, d), rand(b, hkv, t, d)
    seq = torch.arange(b, device=dev).repeat_interleave(t)
    pos = torch.arange(t, device=dev).repeat(b)
    plan = ta.plan_attention(seq, pos, h, hkv)
    ours = ta.attention(q, k, v, plan, scale)
    q4 = q.view(b, t, h, d).transpose(1, 2)
    sdpa = F.scaled_dot_product_attention(q4, k, v, is_causal=True, scale=scale, enable_gqa=True)
    out = {
        "prefill": {
            "shape": f"{b}x{t} tokens, {h}/{hkv} heads, d={d}",
            "aligned_ms": round(
                check.time_ms(lambda: ta.attention(q, k, v, ta.plan_attention(seq, pos, h, hkv), scale)), 4
            ),
            "sdpa_ms": round(
                check.time_ms(
                    lambda: F.scaled_dot_product_attention(
                        q4, k, v, is_causal=True, scale=scale, enable_gqa=True
                    )
                ),
                4,
            ),
            "max_abs_diff_vs_sdpa": float(
                (ours.view(b, t, h, d).float() - sdpa.transpose(1, 2).float()).abs().max()
            ),
        }
    }
    out["prefill"]["aligned_vs_sdpa"] = round(out["prefill"]["sdpa_ms"] / out["prefill"]["aligned_ms"], 3)
    # Decode rows of the prefill above: each position alone must equal its prefill row.
    probe = [0, t // 3, t - 1]
    same = all(
        torch.equal(
            ta.attention(q[p : p + 1], k, v, ta.plan_attention(seq[:1], pos[p : p + 1], h, hkv), scale)[0],
            ours[p],
        )
        for p in probe
    )
    # Decode step: bd sequences, one query each at position ctx - 1.
    qd, kd, vd = rand(bd, h, d), rand(bd, hkv, ctx, d), rand(bd, hkv, ctx, d)
    dseq = torch.arange(bd, device=dev)
    dpos = torch.full((bd,), ctx - 1, device=dev)
    qd4 = qd.view(bd, h, 1, d)
    out["decode"] = {
        "shape": f"{bd} sequences at context {ctx}",
        "aligned_ms": round(
            check.time_ms(lambda: ta.attention(qd, kd, vd, ta.plan_attention(dseq, dpos, h, hkv), scale)), 4
        ),
        "sdpa_ms": round(
            check.time_ms(lambda: F.scaled_dot_product_attention(qd4, kd, vd, scale=scale, enable_gqa=True)),
            4,
        ),
    }
    out["decode"]["aligned_vs_sdpa"] = round(out["decode"]["sdpa_ms"] / out["decode"]["aligned_ms"], 3)
    out["decode_rows_equal_prefill_rows"] = bool(same)
    return out


def section_alignment(check: Check) -> dict:
    from rz_agents.model.alignment import DEFAULT_BATCH_SIZES, check_random_models

    sizes, max_len = ((2,), 8) if check.dry else (DEFAULT_BATCH_SIZES, 160)
    reports = check_random_models(
        archs=("qwen3", "qwen3_moe"),
        dtypes=("bfloat16",),
        kernels=(check.aligned, "standard"),
        batch_sizes=sizes,
        max_len=max_len,
        device=check.device,
    )
    rows = [r.to_json() for r in reports]
    aligned = [r for r in reports if r.kernels == check.aligned]
    return {
        "reports": rows,
        "aligned_bit_identical": all(r.bit_identical for r in aligned),
        "aligned_tokens_checked": sum(r.tokens_checked for r in aligned),
        "standard_differs": any(r.mismatched_tokens for r in reports if r.kernels == "standard"),
    }


def _trajectories(vocab: int, n: int, length: int, gen: torch.Generator):
    from rz_agents.trajectory import Trajectory

    out = []
    for i in range(n):
        tokens = torch.randint(0, vocab, (length,), generator=gen).tolist()
        prompt = length // 2
        mask = [j >= prompt for j in range(length)]
        out.append(
            Trajectory(
                tokens=tokens,
                loss_mask=mask,
                behavior_logprobs=[-3.0 if m else 0.0 for m in mask],
                versions=[0 if m else -1 for m in mask],
                reward=float(i % 2),
                group_id=i // 4,
            )
        )
    return out


def _model_steps(
    check: Check, config, decode_batch: int, context: int, train_seqs: int, train_len: int
) -> dict:
    from rz_agents.engine.params import SamplingParams
    from rz_agents.engine.sampler import sample
    from rz_agents.model.alignment import check_model
    from rz_agents.model.kv_cache import sequence_cache
    from rz_agents.trainer.learner import Learner, LearnerConfig
    from rz_agents.trainer.optim import OptimConfig

    dev = check.device
    model = random_model(check, config, check.aligned)
    out: dict = {"parameters": model.num_parameters()}
    # Engine path vs training forward on this model (aligned).
    rep = check_model(
        model.eval(), seed=0, batch_sizes=(1, 3) if check.dry else (1, 7), max_len=12 if check.dry else 64
    )
    out["engine_vs_training_bit_identical"] = rep.bit_identical
    out["engine_vs_training_tokens"] = rep.tokens_checked
    # Decode step: decode_batch sequences whose first `context` positions are cached.
    cache = sequence_cache(config, decode_batch, context + 64, device=dev)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        chunk = max(1, 8192 // context)
        for s0 in range(0, decode_batch, chunk):
            n = min(chunk, decode_batch - s0)
            toks = torch.randint(0, config.vocab_size, (n * context,), generator=gen).to(dev)
            model(
                toks,
                torch.arange(context, device=dev).repeat(n),
                torch.arange(s0, s0 + n, device=dev).repeat_interleave(context),
                kv_cache=cache,
            )
    tok = torch.randint(0, config.vocab_size, (decode_batch,), generator=gen).to(dev)
    pos = torch.full((decode_batch,), context, device=dev)
    slots = torch.arange(decode_batch, device=dev)
    params = [SamplingParams()] * decode_batch
    sgen = torch.Generator().manual_seed(1)

    def decode_step():
        with torch.inference_mode():
            logits = model.logits(model(tok, pos, slots, kv_cache=cache))
            sample(logits, params, [None] * decode_batch, sgen)

    # Train step: one learner step (packed forward, backward, fp32 masters, AdamW) on train_seqs sequences.
    trajs = _trajectories(config.vocab_size, train_seqs, train_len, gen)
    learner = Learner(
        model,
        LearnerConfig(micro_batch_tokens=train_seqs * train_len, max_lag=None, optim=OptimConfig(lr=1e-6)),
    )

    def train_step():
        m = learner.step(trajs)
        assert not m.get("step_skipped_nonfinite"), m

    timings = {"decode": {"aligned": [], "standard": []}, "train": {"aligned": [], "standard": []}}
    rounds = 1 if check.dry else 3
    for name, fn, iters in (("decode", decode_step, 10), ("train", train_step, 1)):
        for kernels in (check.aligned, "standard"):  # warm up (compiles) both
            model.set_kernels(kernels)
            fn()
        for _ in range(rounds):  # interleaved: both measured under the same conditions
            for label, kernels in (("aligned", check.aligned), ("standard", "standard")):
                model.set_kernels(kernels)
                timings[name][label].append(check.time_ms(fn, iters=iters, warmup=0))
        model.set_kernels(check.aligned)
    for name in ("decode", "train"):
        a = statistics.median(timings[name]["aligned"])
        s = statistics.median(timings[name]["standard"])
        out[f"{name}_step_ms"] = {"aligned": round(a, 3), "standard": round(s, 3)}
        out[f"{name}_step_ratio"] = round(s / a, 3)  # aligned speed relative to standard
    out["decode_shape"] = f"{decode_batch} sequences at context {context}"
    out["train_shape"] = f"{train_seqs} x {train_len} tokens"
    if dev.type == "cuda":
        out["max_memory_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
    return out


def section_model_dense(check: Check) -> dict:
    from rz_agents.model import ModelConfig
    from rz_agents.model.presets import preset_config

    if check.dry:
        cfg = ModelConfig.tiny("qwen3", dtype="bfloat16", num_hidden_layers=1, vocab_size=256)
        return _model_steps(check, cfg, decode_batch=3, context=8, train_seqs=2, train_len=12)
    cfg = preset_config("qwen3-0.6b", max_position_embeddings=4096)
    return _model_steps(check, cfg, decode_batch=64, context=1024, train_seqs=8, train_len=1024)


def section_model_moe(check: Check) -> dict:
    from rz_agents.model import ModelConfig
    from rz_agents.model.presets import preset_config

    if check.dry:
        cfg = ModelConfig.tiny("qwen3_moe", dtype="bfloat16", num_hidden_layers=1, vocab_size=256)
        return _model_steps(check, cfg, decode_batch=3, context=8, train_seqs=2, train_len=12)
    cfg = preset_config(
        "qwen3-30b-a3b",
        hidden_size=1024,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        num_experts=64,
        moe_intermediate_size=384,
        max_position_embeddings=4096,
    )
    return _model_steps(check, cfg, decode_batch=32, context=512, train_seqs=4, train_len=1024)


def section_rl_loop(check: Check) -> dict:
    """Engine (sampling on the device) -> trajectories -> learner step -> weights back, 3 times."""
    from rz_agents.engine import EngineConfig, RZEngine
    from rz_agents.engine.batch import generate_batch
    from rz_agents.engine.params import SamplingParams
    from rz_agents.model import ModelConfig
    from rz_agents.trainer.learner import Learner, LearnerConfig
    from rz_agents.trainer.optim import OptimConfig
    from rz_agents.trajectory import Trajectory

    groups, group_size, new_tokens, steps = (2, 2, 6, 1) if check.dry else (8, 8, 48, 3)
    cfg = ModelConfig.tiny(
        "qwen3", hidden_size=128, intermediate_size=384, head_dim=32, max_position_embeddings=512
    )
    model = random_model(check, cfg, check.aligned)
    engine = RZEngine(copy.deepcopy(model).requires_grad_(False), EngineConfig(num_slots=64, max_len=256))
    learner = Learner(model, LearnerConfig(max_lag=64, optim=OptimConfig(lr=1e-3)))
    engine.load_weights(learner.weights(), learner.version)
    gen = torch.Generator().manual_seed(0)
    history = []
    for _ in range(steps):
        prompts = [torch.randint(0, cfg.vocab_size, (12,), generator=gen).tolist() for _ in range(groups)]
        flat = [p for p in prompts for _ in range(group_size)]
        t0 = time.perf_counter()
        completions = generate_batch(engine, flat, SamplingParams(max_tokens=new_tokens, ignore_eos=True))
        t_gen = time.perf_counter() - t0
        trajs = []
        for i, (p, c) in enumerate(zip(flat, completions, strict=True)):
            n = len(c.tokens)
            trajs.append(
                Trajectory(
                    tokens=p + c.tokens,
                    loss_mask=[False] * len(p) + [True] * n,
                    behavior_logprobs=[0.0] * len(p) + c.logprobs.tolist(),
                    versions=[-1] * len(p) + list(c.versions),
                    reward=sum(t < cfg.vocab_size // 2 for t in c.tokens) / max(n, 1),  # a learnable signal
                    group_id=i // group_size,
                )
            )
        m = learner.step(trajs)
        engine.load_weights(learner.weights(), learner.version)
        history.append(
            {
                "reward_mean": round(m.get("reward_mean", float("nan")), 4),
                "lag0_abs_dlogp_max": m.get("lag0_abs_dlogp_max"),
                "lag0_tokens": int(m.get("lag0_token_count", 0)),
                "generate_s": round(t_gen, 3),
            }
        )
    dl = [h["lag0_abs_dlogp_max"] for h in history if h["lag0_abs_dlogp_max"] is not None]
    return {
        "steps": history,
        "lag0_abs_dlogp_max": max(dl) if dl else None,
        "lag0_tokens": sum(h["lag0_tokens"] for h in history),
    }


def section_rl_demo(check: Check) -> dict:
    """3 RL steps of configs/demo.yaml on the device (no warm start: the lag-0 |dlogp| is the point)."""
    import asyncio
    import tempfile

    try:
        from rz_agents.cli.train import RunConfig
        from rz_agents.config_io import load_config
        from rz_agents.runtime import LocalRun
    except ImportError as exc:
        return {"skipped": f"the demo's packages are missing here ({exc}); rl_loop covers engine + learner"}
    overrides = [
        f"model.device={check.device}",
        "warm_start.demos=0",
        "warm_start.prior_demos=0",
        "export_final_model=false",
        "report=false",
        "tensorboard=false",
    ]
    if check.dry:  # CPU op set: the interpreter would take minutes for a demo step
        overrides += [
            "steps=1",
            "rollout.groups_per_batch=2",
            "rollout.group_size=2",
            "rollout.limits.max_tokens_per_turn=8",
        ]
    else:
        overrides += ["steps=3"]
    cfg = load_config(RunConfig, REPO / "configs" / "demo.yaml", overrides)
    with tempfile.TemporaryDirectory() as tmp:
        cfg.output_dir = tmp
        run = LocalRun(cfg)
        try:
            summary = asyncio.run(run.train())
        finally:
            run.close()
    dl = [
        m["lag0_abs_dlogp_max"] for m in run.history if isinstance(m.get("lag0_abs_dlogp_max"), (int, float))
    ]
    return {
        "steps": len(run.history),
        "kernels": cfg.model.kernels,
        "lag0_abs_dlogp_max": max(dl) if dl else None,
        "lag0_tokens": int(sum(m.get("lag0_token_count", 0) for m in run.history)),
        "rl_wall_s": summary.get("wall_s"),
    }


SECTIONS = {
    "env": section_env,
    "gemm": section_gemm,
    "attention": section_attention,
    "alignment": section_alignment,
    "model_0.6b": section_model_dense,
    "model_moe": section_model_moe,
    "rl_loop": section_rl_loop,
    "rl_demo": section_rl_demo,
}


def goals(results: dict) -> dict:
    def get(section, *keys):
        node = results.get(section, {})
        for k in keys:
            node = node.get(k) if isinstance(node, dict) else None
        return node

    ratio = get("gemm", "min_ratio_at_M_ge_1024")
    identical = [
        get("gemm", "rows_bit_identical"),
        get("attention", "decode_rows_equal_prefill_rows"),
        get("alignment", "aligned_bit_identical"),
        get("model_0.6b", "engine_vs_training_bit_identical"),
        get("model_moe", "engine_vs_training_bit_identical"),
        get("rl_loop", "lag0_abs_dlogp_max") == 0.0
        if get("rl_loop", "lag0_abs_dlogp_max") is not None
        else None,
    ]
    out = {
        "gemm_bf16_ge_0.8x_cublas_at_M_ge_1024": None if ratio is None else ratio >= 0.8,
        "decode_step_ge_0.9x_standard": None
        if get("model_0.6b", "decode_step_ratio") is None
        else get("model_0.6b", "decode_step_ratio") >= 0.9,
        "train_step_ge_0.9x_standard": None
        if get("model_0.6b", "train_step_ratio") is None
        else get("model_0.6b", "train_step_ratio") >= 0.9,
        "every_aligned_row_bit_identical": None if any(v is None for v in identical) else all(identical),
        "standard_differs": get("alignment", "standard_differs"),
    }
    return out


def main() -> int:
    check = Check(ARGS)
    if check.device.type == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device here; use --dry-run on CPU"}))
        return 2
    results: dict = {}
    timings: dict = {}
    for name, fn in SECTIONS.items():
        if ARGS.only and name not in ARGS.only:
            continue
        if check.elapsed() > check.budget_s:
            results[name] = {"skipped": f"time budget {check.budget_s:.0f} s spent"}
            continue
        t0 = time.perf_counter()
        try:
            results[name] = fn(check)
            if check.device.type == "cuda":
                torch.cuda.empty_cache()  # the previous section's models are gone
        except Exception as exc:  # one broken section must not hide the others
            results[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
        timings[name] = round(time.perf_counter() - t0, 1)
        print(f"[gpu_check] {name}: {timings[name]} s", file=sys.stderr, flush=True)
    summary = {
        "goals": goals(results),
        "sections": results,
        "section_seconds": timings,
        "total_s": round(check.elapsed(), 1),
    }
    text = json.dumps(summary)
    print(text)
    if ARGS.out:
        Path(ARGS.out).write_text(text)
    return 0 if not any("error" in r for r in results.values() if isinstance(r, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
