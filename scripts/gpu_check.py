#!/usr/bin/env python3
"""One-shot GPU check: alignment, kernel speed and learner/engine steps on a CUDA machine.

    python3 scripts/gpu_check.py --out RESULTS/gpu_check.json     # on a CUDA machine, ends inside ~530 s
    python3 scripts/gpu_check.py --only gemm attention --out g.json
    python3 scripts/gpu_check.py --dry-run --out /tmp/g.json      # here: every section on CPU, tiny shapes,
                                                                  # the Triton kernels in the interpreter

Built to survive a command limit: the results go to ``--out`` (default ./gpu_check.json) after EVERY section,
written atomically (a kill leaves the finished sections), output is unbuffered, one short line per section
and a short human summary come last (no JSON dump on stdout). Each section runs under its own time budget
(SIGALRM) capped by what is left of the total (``--budget-s``, GPU default 520 s; the sections' budgets sum to
520 s, inside it); Triton JIT compile time is inside those budgets, recorded per kernel (``triton_compile``).
Triton's compile cache is ``runs/triton-cache/`` in the repository (unless TRITON_CACHE_DIR is set), never
beside ``--out``: a device call returns only a few files from its results folder, and hundreds of cache files
there can push the JSON out. A rerun with ``--resume`` or ``--only`` on the same machine reuses the compiles.
The results file is written before the first section (the card and the plan) and after every section.

The card: its name, memory and bandwidth come from the device (``torch.cuda.get_device_properties``) and the
card table (``rz_kernels.compile_check.cards``), keyed by the device name; a card not in the table is
described by a device-to-device copy measured at the start (always recorded beside the table's figure).
Every roofline fraction, every size skipped for memory and the cost model's bound and estimate are taken
from it. ``--card NAME`` names the card to take the figures from instead (a dry run uses it to show the
figures an H100 or H200 would give).

One device call (the per-call limit is 600 s; the script's total budget is 520 s, cold JIT included), and a
``--resume`` call at once if sections were cut (the machine stays warm ~30 s)::

    OUT=$OUT bash scripts/gpu_check_device.sh            # results: $OUT/gpu_check.json, one file
    OUT=$OUT bash scripts/gpu_check_device.sh --resume   # the sections the first call lacked or cut

(``scripts/gpu_check_device.sh --dry-run``: the same command on CPU, tests/scripts/test_gpu_check_device.py.)

A section passes (``ok``) only if it ran to its end inside its budget and recorded no failure. Its budget
firing reads ``timeout`` however the section ended (``SectionTimeout`` is a BaseException, which the engine's
and the sections' ``except Exception`` handlers do not catch; where a library re-raises or swallows it anyway,
the expiry is still recorded); a section that sampled checks every completion's finish reason and the number
of tokens it compared, and any shortfall reads ``FAILED`` (never ``ok``); an exception reads ``ERROR``. The
exit status is 0 only if every section is ``ok`` or ``skipped``.

Needs only Python 3.12, torch (2.11+), triton (3.6+) and numpy besides this repository: nothing else is
imported at module level. Every section but rl_demo imports only what the H200 machine has (torch, triton,
numpy, safetensors, transformers; not gymnasium, ray, math-verify or vllm: checked by importing each section's
modules with those four absent); rl_demo needs yaml and gymnasium and is skipped, named, without them.
(To bring a missing pure-Python package to a machine without a registry: on a machine with one,
``pip download --only-binary=:all: --python-version 3.12 --no-deps -d wheels PACKAGE``, carry ``wheels/``,
then ``pip install --no-index --no-deps --target .deps wheels/*.whl`` and ``PYTHONPATH=.deps``.)

A run that the total budget cut short is continued by the same command with ``--resume``: it keeps every
section of the file that passed (written by this version of the script) and runs all others again: those it
lacks, timed out, failed, errored or skipped (the NOTES' one GPU call of <= 540 s, then a second one if device
time is left).

Sections (owner: the issue that maintains the section; other issues add theirs to this table), listed by
topic with their budgets before issue 37; they RUN in the order of ``SECTIONS`` below, with its budgets
(issue 37: env 5, alignment 50, engine_vs_trainer 30, gemm 55, attention 25, logprobs_vocab 15, engine_decode
80, nccl_one_rank 25, grad_determinism 35, engine_sync 15, model_0.6b 45, train_16k 35, model_moe 35,
fp32_triton 25, decode_profile 10, rl_loop 20, rl_demo 10): bit identity first, then speed, then the rest:

  section          owner  GPU budget s  what
  env              #23      10  torch / triton / GPU
  gemm             #23      75  aligned Triton GEMM vs cuBLAS (bf16) on Qwen3-4B's GEMM shapes (N = 1024,
                                2560, 4096, 9728, 151936 over K = 2560 / 4096 / 9728) at M = 1, 16, 24, 48,
                                512, 16384; every row bit-identical across M (cuBLAS for contrast)
  attention        #23      30  aligned attention vs batched SDPA (one call, padded): prefill 4 x 2048 and
                                decode 64 x 2048 (split-KV: splits, tile rows); decode rows == prefill rows ==
                                trainer rows bit for bit, at and around the 512-key split boundaries
  alignment        #23      60  `rz align-check`'s suite: dense + MoE, bf16; aligned bit-identical, standard
                                differs
  fp32_triton      #23      40  the same suite in fp32 on the Triton op set (its fp32 paths, once)
  frontier_alignment #51/52 20  the same suite on qwen3_5, kimi_linear, deepseek_v4, qwen3_5_moe (bf16, the
                                Triton delta rule / KDA / sparse selection kernels; max_len 96 crosses the
                                64-token chunk): aligned bit-identical with 0 selection flips, standard
                                differs; families the budget cannot reach are named (the dry run: the hybrids)
  logprobs_vocab   #23      20  full 151,936-token vocabulary: engine log-softmax vs trainer
                                log-softmax+gather (multi-block), bit for bit, and a row alone == the row in
                                the batch
  grad_determinism #23      45  the same train step twice (dense and MoE): gradients bitwise equal; the Triton
                                MoE forward + backward's synchronizing CUDA calls (0 wanted)
  nccl_one_rank    #23      30  a one-rank NCCL group (gloo in a dry run) running the sharded MoE learner step
                                (and the meta-device start from a checkpoint, weights compared bitwise): every
                                collective on the device its group takes
  model_0.6b       #23      70  Qwen3-0.6B-shaped random model, bf16: decode step (64 x 1,024 context) and
                                train step (8 x 1,024 tokens), aligned vs standard, interleaved; engine path
                                == training forward
  model_moe        #23      50  a small Qwen3-MoE-shaped model (64 experts, top-8), the same measurements
  train_16k        #23      60  Qwen3-4B-shaped learner (8 of its 36 layers) train step on one 16,384-token
                                sequence with activation checkpointing: time and peak memory vs the
                                `--dry-run` estimator
  decode_profile   #23      25  torch.profiler over one decode step: kernel count, GPU-busy vs wall time
  rl_loop          #23      30  3 RL steps: the rz engine samples on the GPU, the learner trains, weights go
                                back
  rl_demo          #23      30  3 RL steps of configs/demo.yaml (needs the demo's packages: skips, naming
                                them)
  engine_decode    #22      90  Qwen3-4B-shaped decode step (LM head + sampler) at batch 1/16/48/128/256,
                                context 2K/8K: eager vs CUDA graph, aligned vs standard, graph == eager
                                bitwise, tokens/s, fraction of the HBM roofline; sizes that do not fit
                                (memory, budget) skipped, named
  engine_sync      #22      20  graph-less decode step (dense, MoE) under set_sync_debug_mode("error") +
                                host-read recorder: no host sync before the step's one copy of its tokens
  engine_vs_trainer #22     30  engine (paged, shared prefix, graph decode) vs trainer forward, bf16, dense +
                                MoE; on the GPU 500-token prompts, so split-KV decode crosses the 512-key
                                split
  production_decode #54     20  the engine's production decode path at Qwen3-4B's head layout (d128, GQA 4;
                                Qwen3-4B cut to 2 layers on the GPU): paged K/V, chunked prefill, a shared
                                prefix, split-KV decode up to 5 splits (a dry run: 128-key splits, rows at
                                1, 2 and 4), CUDA-graph replay, vs the learner's forward row by row
                                (torch.equal); >= 3 splits reached; the standard op set must differ
  v4_graph_decode  #52      20  a tiny DeepSeek-V4 (sliding, CSA, HCA; hash + learned MoE), bf16, through the
                                engine with its decode step captured and replayed as CUDA graphs: log-probs
                                torch.equal to the learner and to eager decode, across CSA / HCA blocks and
                                a page given back behind the window; the standard op set must differ

Budgets of frontier_alignment and v4_graph_decode (20 s each) came from engine_decode (80 -> 45 s; it skips,
and names, the sizes its budget cannot reach) and gemm (50 -> 45 s).

Goals (from issue 23): aligned GEMM >= 0.8x cuBLAS at M >= 1024 (bf16); aligned train step >= 0.9x standard;
every aligned row bit-identical; gradients bitwise reproducible.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The GPU run's total budget: inside the device machine's 540 s command (NOTES-gpu-device) with room for the
# interpreter start, the imports before the clock starts and the last write. The sections' budgets (SECTIONS)
# sum to no more than this (tests/scripts/test_gpu_check_budgets.py).
GPU_TOTAL_BUDGET_S = 520.0
# Version of what a section's result means: --resume keeps only results written by this version (an older
# file's "ok" may predate the finish-reason and token-count checks).
RESULT_FORMAT = 2


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, Triton interpreter")
    p.add_argument("--out", default="gpu_check.json", help="JSON results, rewritten after every section")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help=f"total time budget in s (GPU default {GPU_TOTAL_BUDGET_S:.0f}; dry run: none)",
    )
    p.add_argument("--section-budget-scale", type=float, default=1.0, help="scale every section's budget")
    p.add_argument("--only", nargs="*", default=None, help="run only these sections")
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the sections --out already holds; run only those it lacks or skipped for time",
    )
    p.add_argument("--device", default="cuda", help="CUDA device (ignored with --dry-run)")
    p.add_argument(
        "--card",
        default=None,
        help="take bandwidth / memory figures from this card name (default: the device's own name)",
    )
    return p.parse_args()


ARGS = parse_args()
for _stream in (sys.stdout, sys.stderr):  # unbuffered: a kill keeps every line printed so far
    with contextlib.suppress(AttributeError, ValueError):
        _stream.reconfigure(line_buffering=True, write_through=True)
if ARGS.dry_run:  # must precede any import of the kernels (@triton.jit reads it)
    os.environ["TRITON_INTERPRET"] = "1"
# Triton's compile cache under runs/ (unless the caller chose one), never beside the results: a device call
# returns only a few files of its results folder. A rerun with --resume or --only reuses every compile.
RUNS = REPO / "runs"
os.environ.setdefault("TRITON_CACHE_DIR", str(RUNS / "triton-cache"))
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
        self.budget_s = (
            args.budget_s if args.budget_s is not None else (1e9 if self.dry else GPU_TOTAL_BUDGET_S)
        )
        self.deadline = float("inf")  # the running section's end (perf_counter), set by run_section
        self.card = None  # the Card every roofline and memory limit is taken from (detect_card)
        if self.dry:
            torch.set_num_threads(1)
            from rz_kernels.triton_ops.interpreter import patch_interpreter

            patch_interpreter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def section_left(self) -> float:
        """Seconds left of the running section's budget (inf without one)."""
        return self.deadline - time.perf_counter()

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


def measured_copy_bytes_per_s(device: torch.device, gib: float = 1.0, iters: int = 5) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second), the best of ``iters`` copies."""
    n = int(gib * 2**30) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    best = float("inf")
    for _ in range(iters):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    del src, dst
    return 2 * n * 2 / best


def detect_card(check: Check, card_name: str | None) -> tuple[object | None, dict]:
    """The card the figures come from, and what was found: on CUDA the device's name and memory, a measured
    copy bandwidth, and the card table's entry (``card_name`` overrides the name). In a dry run the card is
    ``card_name``'s table entry, or none (roofline fractions then read None). An unknown name with a
    measured copy is described by the copy; an unknown name without one raises ValueError."""
    from rz_kernels.compile_check.cards import card_for

    found: dict = {}
    if check.device.type == "cuda":
        props = torch.cuda.get_device_properties(check.device)
        found.update(device_name=props.name, device_memory_gib=round(props.total_memory / 2**30, 1))
        measured = None
        try:
            measured = measured_copy_bytes_per_s(check.device)
            found["measured_copy_bytes_per_s"] = round(measured, -9)
        except Exception as exc:  # noqa: BLE001 - the table's figure stands without it
            found["measured_copy_error"] = f"{type(exc).__name__}: {exc}"[:200]
        card = card_for(card_name or props.name, props.total_memory, measured)
    elif card_name:
        card = card_for(card_name)
    else:
        return None, found
    return card, {**found, **card.to_json()}


def roofline_fraction(card, step_bytes: float, seconds: float) -> float | None:
    """The fraction of ``card``'s datasheet HBM bandwidth a step that must read ``step_bytes`` in
    ``seconds`` reaches (None without a card)."""
    return None if card is None else round(step_bytes / seconds / card.hbm_bytes_per_s, 4)


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
        # Qwen3-4B's GEMMs, weight [N, K]: q (2560 -> 4096), k/v (-> 1024), gate/up (-> 9728), down
        # (9728 -> 2560), o (4096 -> 2560), LM head (2560 -> 151936); M: decode batches to a 16K-token step
        shapes = {
            "q_2560x4096": (4096, 2560),
            "kv_2560x1024": (1024, 2560),
            "up_2560x9728": (9728, 2560),
            "down_9728x2560": (2560, 9728),
            "o_4096x2560": (2560, 4096),
            "lm_head_2560x151936": (151936, 2560),
        }
        ms, dtype = (1, 16, 24, 48, 512, 16384), torch.bfloat16
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
            iters = 3 if m * n * k > 2**38 else 10
            t_al = check.time_ms(lambda xm=xm, w=w: gemm.matmul(xm, w), iters=iters)
            t_cb = check.time_ms(lambda xm=xm, w=w: F.linear(xm, w), iters=iters)
            t_bm = check.time_ms(
                lambda xm=xm, w=w: gemm.matmul(xm, w, table=gemm.GEMM_CONFIGS_BY_M), iters=iters
            )
            cfg = gemm.config_for(dtype, m)
            rows[str(m)] = {
                "aligned_ms": round(t_al, 4),
                "cublas_ms": round(t_cb, 4),
                "aligned_vs_cublas": round(t_cb / t_al, 3),  # >1: aligned faster
                "by_m_table_ms": round(t_bm, 4),  # the former per-M tile table (gemm.GEMM_CONFIGS_BY_M)
                "single_over_by_m_table": round(t_bm / t_al, 3),  # >1: the single tile config is faster
                "tflops_aligned": round(2 * m * n * k / t_al / 1e9, 1),
                "row0_equals_alone": bool(torch.equal(aligned[0], alone)),
                "last_row_equals_alone": bool(torch.equal(aligned[m - 1], gemm.matmul(xm[m - 1 :], w)[0])),
                "cublas_row0_equals_alone": bool(torch.equal(cublas[0], alone_cublas)),
                "max_abs_diff_vs_cublas": float((aligned - cublas).abs().max()),
                "tile": [cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages],
            }
        out["shapes"][label] = rows
        # The former per-M table (mma.sync at 16 rows, wgmma from 64): are its rows the same at every M on
        # this GPU, and equal to the single config's? (The default is one tile config for every M.)
        by_m = gemm.GEMM_CONFIGS_BY_M
        one = gemm.matmul(x[:1], w, table=by_m)[0]
        out.setdefault("by_m_table_rows_bit_identical", True)
        out["by_m_table_rows_bit_identical"] &= all(
            torch.equal(gemm.matmul(x[:m].contiguous(), w, table=by_m)[0], one) for m in ms
        )
        out.setdefault("by_m_table_equals_single_tile", True)
        out["by_m_table_equals_single_tile"] &= bool(torch.equal(one, alone))
    big = [r for rows in out["shapes"].values() for m, r in rows.items() if int(m) >= 1024]
    out["min_ratio_at_M_ge_1024"] = min((r["aligned_vs_cublas"] for r in big), default=None)
    out["rows_bit_identical"] = all(
        r["row0_equals_alone"] and r["last_row_equals_alone"]
        for rows in out["shapes"].values()
        for r in rows.values()
    )
    return out


def section_attention(check: Check) -> dict:
    import torch.nn.functional as F

    from rz_kernels.triton_ops import attention as ta

    dtype = torch.bfloat16
    if check.dry:
        b, t, h, hkv, d, bd, ctx = 1, 576, 4, 2, 16, 3, 80  # t crosses the first 512-key split
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
    # Decode rows of the prefill above (the split-KV decode kernels, one token alone, at and around the
    # 512-key split boundaries) must equal its prefill row and the trainer's (autograd) forward row.
    split = ta.SPLIT_BLOCKS * ta.BLOCK_N
    probe = sorted({0, t // 3, t - 1} | {p for p in (split - 1, split, 2 * split, 3 * split + 1) if p < t})
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
    trainer = ta.attention(qg, kg, vg, ta.plan_attention(seq, pos, h, hkv), scale).detach()
    decoded = {
        p: ta.attention(
            q[p : p + 1],
            k,
            v,
            ta.plan_attention(seq[:1], pos[p : p + 1], h, hkv, max_position=p, decode_positions=[p]),
            scale,
        )[0]
        for p in probe
    }
    same = all(torch.equal(decoded[p], ours[p]) for p in probe)
    out["decode_probe_positions"] = probe
    out["decode_probe_splits"] = [ta.split_count(p) for p in probe]
    out["decode_rows_equal_trainer_rows"] = all(torch.equal(decoded[p], trainer[p]) for p in probe)
    out["prefill_equals_trainer"] = bool(torch.equal(ours, trainer))
    # Decode step: bd sequences, one query each at position ctx - 1.
    qd, kd, vd = rand(bd, h, d), rand(bd, hkv, ctx, d), rand(bd, hkv, ctx, d)
    dseq = torch.arange(bd, device=dev)
    dpos = torch.full((bd,), ctx - 1, device=dev)
    qd4 = qd.view(bd, h, 1, d)

    def decode_plan():  # the engine's: fixed shape from the host's bound, split-KV kernels
        return ta.plan_attention(dseq, dpos, h, hkv, max_position=ctx - 1, decode_positions=[ctx - 1] * bd)

    out["decode"] = {
        "shape": f"{bd} sequences at context {ctx}",
        "splits": decode_plan().decode_splits,
        "tile_rows": decode_plan().block_m,
        "aligned_ms": round(check.time_ms(lambda: ta.attention(qd, kd, vd, decode_plan(), scale)), 4),
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
    out = {
        "reports": rows,
        "aligned_bit_identical": all(r.bit_identical for r in aligned),
        "aligned_tokens_checked": sum(r.tokens_checked for r in aligned),
        "standard_differs": any(r.mismatched_tokens for r in reports if r.kernels == "standard"),
    }
    fail_unless(out, out["aligned_tokens_checked"] > 0, "no aligned token compared")
    fail_unless(out, out["aligned_bit_identical"], "aligned log-probs not bit-identical")
    return out


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
    fail_unless(out, rep.tokens_checked > 0, "no engine-path token compared with the training forward")
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
        LearnerConfig(micro_batch_tokens=train_seqs * train_len, optim=OptimConfig(lr=1e-6)),
        max_lag=None,
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
    engine = RZEngine(copy.deepcopy(model).requires_grad_(False), EngineConfig(max_running=64, max_len=256))
    learner = Learner(model, LearnerConfig(optim=OptimConfig(lr=1e-3)), max_lag=64)
    engine.load_weights(learner.weights(), learner.version)
    gen = torch.Generator().manual_seed(0)
    history = []
    for _ in range(steps):
        prompts = [torch.randint(0, cfg.vocab_size, (12,), generator=gen).tolist() for _ in range(groups)]
        flat = [p for p in prompts for _ in range(group_size)]
        t0 = time.perf_counter()
        completions = generate_batch(engine, flat, SamplingParams(max_tokens=new_tokens, ignore_eos=True))
        t_gen = time.perf_counter() - t0
        checked: dict = {}
        check_completions(checked, completions, "length", new_tokens)
        if checked.get("failures"):  # a failed engine step: training on what is left proves nothing
            return {"steps": history, **checked}
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
    out = {
        "steps": history,
        "lag0_abs_dlogp_max": max(dl) if dl else None,
        "lag0_tokens": sum(h["lag0_tokens"] for h in history),
    }
    fail_unless(out, out["lag0_tokens"] > 0, "no lag-0 token trained")
    fail_unless(
        out, out["lag0_abs_dlogp_max"] == 0.0, f"lag-0 |dlogp| max {out['lag0_abs_dlogp_max']}, not 0"
    )
    return out


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
    out = {
        "steps": len(run.history),
        "kernels": cfg.model.kernels,
        "lag0_abs_dlogp_max": max(dl) if dl else None,
        "lag0_tokens": int(sum(m.get("lag0_token_count", 0) for m in run.history)),
        "rl_wall_s": summary.get("wall_s"),
    }
    fail_unless(out, out["steps"] > 0 and out["lag0_tokens"] > 0, "no RL step trained a lag-0 token")
    return out


def section_fp32_triton(check: Check) -> dict:
    """The alignment suite in fp32 on the Triton op set: its fp32 GEMM, attention and norm paths, once."""
    from rz_agents.model.alignment import check_random_models

    reports = check_random_models(
        archs=("qwen3", "qwen3_moe"),
        dtypes=("float32",),
        kernels=(check.aligned,),
        batch_sizes=(2,) if check.dry else (1, 7),
        max_len=8 if check.dry else 64,
        device=check.device,
    )
    out = {
        "reports": [r.to_json() for r in reports],
        "aligned_bit_identical": all(r.bit_identical for r in reports),
        "aligned_tokens_checked": sum(r.tokens_checked for r in reports),
    }
    fail_unless(out, out["aligned_tokens_checked"] > 0, "no aligned token compared")
    fail_unless(out, out["aligned_bit_identical"], "aligned log-probs not bit-identical")
    return out


# The frontier families, in the order the GPU run checks them (the dry run: the two hybrids only, ~2.5 min in
# the Triton interpreter; V4 alone takes ~4.5 min there).
FRONTIER_ARCHS = ("qwen3_5", "kimi_linear", "deepseek_v4", "qwen3_5_moe")
FRONTIER_DRY_ARCHS = ("qwen3_5", "kimi_linear")


def section_frontier_alignment(check: Check) -> dict:
    """`rz align-check`'s suite on the frontier families (Gated DeltaNet, KDA + MLA, DeepSeek-V4's sparse
    attention and hash/learned routers, Qwen3.5 MoE), bf16, on the Triton op set: every sampled token's
    log-prob bit-identical between the cached (engine) path and the packed training forward, across batch
    sizes, chunk cuts and decode (max_len 96 crosses the delta rule's 64-token chunk); 0 selection flips
    (V4's indexer top-k, every router); the standard op set must differ somewhere. One family at a time;
    those the section's budget cannot reach are named (the section then fails, so ``--resume`` reruns it with
    the compiles cached)."""
    from rz_agents.model.alignment import check_random_models

    archs = FRONTIER_DRY_ARCHS if check.dry else FRONTIER_ARCHS
    sizes, max_len = ((2,), 8) if check.dry else ((1, 3), 96)
    out: dict = {"reports": [], "not_reached": []}
    for arch in archs:
        if out["reports"] and check.section_left() < 10.0:  # no room for another family's compiles
            out["not_reached"].append(arch)
            continue
        reports = check_random_models(
            archs=(arch,),
            dtypes=("bfloat16",),
            kernels=(check.aligned, "standard"),
            batch_sizes=sizes,
            max_len=max_len,
            device=check.device,
        )
        out["reports"] += [r.to_json() for r in reports]
    aligned = [r for r in out["reports"] if r["kernels"] == check.aligned]
    out["aligned_bit_identical"] = bool(aligned) and all(r["bit_identical"] for r in aligned)
    out["aligned_tokens_checked"] = sum(r["tokens_checked"] for r in aligned)
    out["aligned_selection_flips"] = sum(sum(r["selection_flips"].values()) for r in aligned)
    out["standard_differs_in"] = sorted(
        {r["arch"] for r in out["reports"] if r["kernels"] == "standard" and not r["bit_identical"]}
    )
    fail_unless(out, not out["not_reached"], f"families not reached within the budget: {out['not_reached']}")
    fail_unless(out, out["aligned_tokens_checked"] > 0, "no aligned token compared")
    fail_unless(out, out["aligned_bit_identical"], "aligned log-probs not bit-identical (or a flip)")
    fail_unless(out, bool(out["standard_differs_in"]), "the standard op set matched everywhere (no control)")
    return out


def section_logprobs_vocab(check: Check) -> dict:
    """The full 151,936-token vocabulary through the multi-block log-softmax: engine (log-softmax, then a
    gather) vs trainer (log-softmax + gather in one kernel), and one row alone vs inside the batch."""
    from rz_kernels.triton_ops import softmax

    vocab, rows = 151_936, (3 if check.dry else 64)
    gen = torch.Generator(device=check.device).manual_seed(3)
    x = torch.randn(rows, vocab, generator=gen, device=check.device) * 4.0
    targets = torch.randint(0, vocab, (rows,), generator=gen, device=check.device)
    engine = softmax.log_softmax(x).gather(1, targets[:, None])[:, 0]
    trainer = softmax.log_softmax_gather(x, targets)
    alone = softmax.log_softmax_gather(x[rows - 1 :].contiguous(), targets[rows - 1 :])
    reference = torch.log_softmax(x.double(), dim=-1).gather(1, targets[:, None])[:, 0]
    return {
        "rows": rows,
        "vocab": vocab,
        "engine_equals_trainer": bool(torch.equal(engine, trainer)),
        "row_alone_equals_batch_row": bool(torch.equal(alone[0], trainer[rows - 1])),
        "max_abs_diff_vs_fp64": float((trainer.double() - reference).abs().max()),
        "trainer_ms": round(check.time_ms(lambda: softmax.log_softmax_gather(x, targets)), 4),
        "torch_log_softmax_ms": round(check.time_ms(lambda: torch.log_softmax(x, dim=-1)), 4),
    }


def _gradients(check: Check, config, trajs) -> list[torch.Tensor]:
    """Gradients of one learner loss (packed forward, REINFORCE Zero loss, backward) from a fixed init."""
    from rz_agents.model.logprobs import packed_token_logprobs
    from rz_agents.trainer.loss import LossConfig, sequence_loss, token_scales

    model = random_model(check, config, check.aligned).train()
    masks = [torch.tensor(t.loss_mask[1:]) for t in trajs]
    behavior = [torch.tensor(t.behavior_logprobs[1:]) for t in trajs]
    scales = token_scales(masks, "token")
    logps = packed_token_logprobs(model, [t.tokens for t in trajs])
    dev = check.device
    loss = sum(
        sequence_loss(lp, b.to(dev), m.to(dev), 1.0 - 2.0 * (i % 2), s.to(dev), LossConfig())
        for i, (lp, b, m, s) in enumerate(zip(logps, behavior, masks, scales, strict=True))
    )
    loss.backward()
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def _moe_host_syncs(check: Check) -> int | None:
    """Synchronizing CUDA calls (``torch.cuda.set_sync_debug_mode``) in one Triton MoE forward + backward
    after a warm-up (64 experts, top-8, 512 tokens, bf16); None off CUDA. Issue 23 wants 0."""
    if check.device.type != "cuda":
        return None
    import warnings

    from rz_kernels.triton_ops import moe as tm

    gen = torch.Generator(device=check.device).manual_seed(7)
    experts, hidden, inter, tokens = 64, 256, 128, 512

    def param(*shape):
        t = torch.randn(*shape, generator=gen, device=check.device) * 0.05
        return t.to(torch.bfloat16).requires_grad_(True)

    weights = tuple(
        [param(*shape) for _ in range(experts)] for shape in ((inter, hidden),) * 2 + ((hidden, inter),)
    )
    x, logits = param(tokens, hidden), param(tokens, experts)

    def step():
        w, ex = tm.route(logits, 8, True)
        tm.aligned_moe(x, w, ex, experts, expert_weights=weights).float().sum().backward()

    step()  # compile first
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def section_grad_determinism(check: Check) -> dict:
    """The same train step twice from the same weights and batch: every gradient bitwise equal."""
    from rz_agents.model import ModelConfig
    from rz_agents.model.presets import preset_config

    out: dict = {}
    if check.dry:
        configs = {
            "dense": ModelConfig.tiny("qwen3", dtype="bfloat16", num_hidden_layers=1, vocab_size=256),
            "moe": ModelConfig.tiny("qwen3_moe", dtype="bfloat16", num_hidden_layers=1, vocab_size=256),
        }
        seqs, length = 2, 12
    else:
        configs = {
            "dense": preset_config("qwen3-0.6b", num_hidden_layers=4, max_position_embeddings=4096),
            "moe": preset_config(
                "qwen3-30b-a3b",
                hidden_size=1024,
                num_hidden_layers=4,
                num_attention_heads=16,
                num_key_value_heads=4,
                num_experts=64,
                moe_intermediate_size=384,
                max_position_embeddings=4096,
            ),
        }
        seqs, length = 4, 1024
    for name, config in configs.items():
        trajs = _trajectories(config.vocab_size, seqs, length, torch.Generator().manual_seed(5))
        first = _gradients(check, config, trajs)
        second = _gradients(check, config, trajs)
        out[name] = {
            "tensors": len(first),
            "bitwise_equal": len(first) == len(second) and all(map(torch.equal, first, second)),
        }
    out["gradients_bitwise_reproducible"] = all(v["bitwise_equal"] for v in out.values())
    out["moe_forward_backward_host_syncs"] = _moe_host_syncs(check)
    return out


def section_nccl_one_rank(check: Check) -> dict:
    """A one-rank NCCL group (gloo in a dry run) running the sharded learner step: every collective's tensors
    on the device its group takes (the CPU-tensor-on-NCCL class of bug fails here on one GPU)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from rz_agents.model import ModelConfig
    from rz_agents.model.checkpoint import LazyState, model_skeleton, save_hf_checkpoint
    from rz_agents.trainer.learner import Learner, LearnerConfig
    from rz_agents.trainer.sharding import ShardedRanks

    backend = "gloo" if check.dry else "nccl"
    # The checkpoint round trip needs safetensors; the sharded step (what crashed on torch 2.11) does not.
    has_safetensors = not _missing("safetensors")
    meta_same: bool | None = None
    meta_device = "skipped: needs safetensors (not installed here)"
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(backend, init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            cfg = ModelConfig.tiny("qwen3_moe", dtype="bfloat16", vocab_size=256)  # MoE: unused experts
            model = random_model(check, cfg, check.aligned)
            if has_safetensors:
                ckpt = save_hf_checkpoint(model, Path(tmp) / "ckpt")  # what the meta start below reads
            ranks = ShardedRanks(check.device.type)
            learner = Learner(model, LearnerConfig(micro_batch_tokens=32), ranks=ranks, max_lag=None)
            start = {k: v.clone() for k, v in learner.weights().items()}
            if has_safetensors:
                # The meta-device start of sharded ranks: only this rank's shards allocated on the device, cut
                # from the checkpoint one tensor at a time; the same weights, bitwise.
                skeleton = model_skeleton(ckpt, kernels=check.aligned, dtype="bfloat16")
                meta = Learner(skeleton, LearnerConfig(micro_batch_tokens=32),
                               ranks=ShardedRanks(check.device.type), max_lag=None)  # fmt: skip
                meta.replace_weights(LazyState(ckpt, torch.bfloat16))
                meta_same = all(torch.equal(start[k], w) for k, w in meta.weights().items())
                meta_device = str(next(meta.model.parameters()).device)
            trajs = _trajectories(cfg.vocab_size, 4, 16, torch.Generator().manual_seed(6))
            metrics = [learner.step(trajs) for _ in range(2)]
            weights = learner.weights()
        finally:
            dist.destroy_process_group()
    out = {
        "backend": backend,
        "collective_device": str(ranks.comm_device),
        "steps": len(metrics),
        "steps_skipped": sum(m.get("step_skipped_nonfinite", 0) for m in metrics),
        "version": learner.version,
        "weights_finite": all(bool(torch.isfinite(w.float()).all()) for w in weights.values()),
        "meta_start_weights_bitwise": meta_same,
        "meta_start_device": meta_device,
        # how MoE experts no token reached join the reduce-scatter (trainer/sharding.py): "fsdp" from torch
        # 2.13, "zero_grads" (a forward hook) before it
        "unused_experts": "fsdp" if hasattr(FSDPModule, "set_reduce_scatter_unused_params") else "zero_grads",
        "ok": learner.version == 2 and meta_same is not False,
    }
    fail_unless(out, out["ok"], f"version {learner.version} after 2 steps, meta start bitwise: {meta_same}")
    return out


def section_train_16k(check: Check) -> dict:
    """Qwen3-4B-shaped learner train step on one 16K-token sequence with activation checkpointing: time and
    peak memory against the estimator's figure for the same model and micro-batch."""
    from types import SimpleNamespace

    from rz_agents.engine.config import EngineConfig
    from rz_agents.model import ModelConfig
    from rz_agents.model.presets import preset_config
    from rz_agents.runtime.memory_estimate import GIB, estimate_memory
    from rz_agents.trainer.learner import Learner, LearnerConfig
    from rz_agents.trainer.optim import OptimConfig

    if check.dry:
        config = ModelConfig.tiny(
            "qwen3", dtype="bfloat16", num_hidden_layers=2, vocab_size=256, activation_checkpointing=True
        )
        tokens = 64
    else:
        config = preset_config(
            "qwen3-4b", num_hidden_layers=8, max_position_embeddings=16384, activation_checkpointing=True
        )
        tokens = 16384
    if check.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(check.device)
        base = torch.cuda.memory_allocated(check.device)
    model = random_model(check, config, check.aligned)
    learner = Learner(
        model, LearnerConfig(micro_batch_tokens=tokens, optim=OptimConfig(lr=1e-6)), max_lag=None
    )
    trajs = _trajectories(config.vocab_size, 1, tokens, torch.Generator().manual_seed(7))
    t0 = time.perf_counter()
    first = learner.step(trajs)  # (compiles)
    check.sync()
    first_s = time.perf_counter() - t0
    step_ms = check.time_ms(lambda: learner.step(trajs), iters=1, warmup=0)
    cfg = SimpleNamespace(
        # the device the step ran on: a CUDA estimate has no CPU-only terms (packed GEMM copies, process base)
        model=SimpleNamespace(activation_checkpointing=True, device=check.device.type),
        learner=SimpleNamespace(micro_batch_tokens=tokens),
        rollout=SimpleNamespace(limits=SimpleNamespace(max_episode_tokens=tokens)),
        engine=EngineConfig(max_len=tokens, kv_cache_bytes=None, max_running=1, max_batch_tokens=1),
    )
    est = estimate_memory(cfg, config)
    out = {
        "layers": config.num_hidden_layers,
        "tokens": tokens,
        "parameters": est.parameters,
        "first_step_s": round(first_s, 2),
        "step_ms": round(step_ms, 1),
        "tokens_per_s": round(tokens / step_ms * 1e3, 1),
        "step_skipped": first.get("step_skipped_nonfinite"),
        "estimate_learner_gib": round(est.learner_total / GIB, 3),
        "estimate_learner_mib": round(est.learner_total / 2**20, 1),
    }
    if check.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(check.device) - base
        out["peak_gib"] = round(peak / GIB, 2)
        out["peak_over_estimate"] = round(peak / est.learner_total, 3)
    return out


def section_decode_profile(check: Check) -> dict:
    """torch.profiler over one decode step of a Qwen3-0.6B-shaped model: kernels launched, device-busy time
    vs wall time (a low ratio: the step waits on the host)."""
    from torch.profiler import ProfilerActivity, profile

    from rz_agents.model import ModelConfig
    from rz_agents.model.kv_cache import sequence_cache
    from rz_agents.model.presets import preset_config

    if check.dry:
        config, batch, context = (
            ModelConfig.tiny("qwen3", dtype="bfloat16", num_hidden_layers=1, vocab_size=256),
            3,
            8,
        )
    else:
        config, batch, context = preset_config("qwen3-0.6b", max_position_embeddings=4096), 64, 1024
    model = random_model(check, config, check.aligned).eval()
    dev = check.device
    cache = sequence_cache(config, batch, context + 8, device=dev)
    gen = torch.Generator().manual_seed(8)
    with torch.inference_mode():
        toks = torch.randint(0, config.vocab_size, (batch * context,), generator=gen).to(dev)
        model(
            toks,
            torch.arange(context, device=dev).repeat(batch),
            torch.arange(batch, device=dev).repeat_interleave(context),
            kv_cache=cache,
        )
        tok = torch.randint(0, config.vocab_size, (batch,), generator=gen).to(dev)
        pos = torch.full((batch,), context, device=dev)
        slots = torch.arange(batch, device=dev)

        def step():
            return model.logits(model(tok, pos, slots, kv_cache=cache)).argmax(-1)

        step()  # warm (compiles)
        check.sync()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=activities) as prof:
            t0 = time.perf_counter()
            step()
            check.sync()
            wall_ms = (time.perf_counter() - t0) * 1e3
    events = prof.key_averages()
    if dev.type == "cuda":
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy_ms = sum(e.device_time for e in kernels) / 1e3
        top = sorted(events, key=lambda e: -getattr(e, "device_time_total", 0))[:6]
        top_rows = [[e.key[:60], e.count, round(getattr(e, "device_time_total", 0) / 1e3, 3)] for e in top]
    else:
        kernels = [e for e in prof.events() if e.name.startswith("aten::")]
        busy_ms = float("nan")
        top = sorted(events, key=lambda e: -e.cpu_time_total)[:6]
        top_rows = [[e.key[:60], e.count, round(e.cpu_time_total / 1e3, 3)] for e in top]
    return {
        "shape": f"{batch} sequences at context {context}",
        "wall_ms": round(wall_ms, 3),
        "kernels": len(kernels),
        "device_busy_ms": round(busy_ms, 3),
        "device_busy_fraction": round(busy_ms / wall_ms, 3) if wall_ms > 0 and busy_ms == busy_ms else None,
        "top": top_rows,
    }


# --- engine (issue 22): static decode step, CUDA graphs, no host sync ---------------------------------------
def _random_cache(check: Check, config, pages: int):
    """A paged KV cache of `pages` pages plus the scratch page, filled with random K/V (a decode step's cost
    does not depend on their values, and filling is far cheaper than a prefill)."""
    from rz_agents.model.kv_cache import KVCache

    cache = KVCache(config, num_pages=pages + 1, device=check.device)
    gen = torch.Generator(device=check.device).manual_seed(3)
    for buf in (*cache.k, *cache.v):
        buf.normal_(0.0, 1.0, generator=gen)
    return cache


def _decode_setup(check: Check, model, batch: int, context: int, cache=None):
    """A DecodeStep of exactly `batch` rows at position `context` over a random paged cache (`cache`, or a
    new one just big enough): row i owns pages i*W .. i*W+W-1, the cache's last page is the scratch page."""
    from rz_agents.engine.decode_step import DecodeStep
    from rz_agents.model.kv_cache import pages_for

    width = pages_for(context + 1)
    cache = cache if cache is not None else _random_cache(check, model.config, batch * width)
    step = DecodeStep(model, cache, max_batch=batch, width=width, scratch_page=cache.num_pages - 1)
    step.buckets = [batch]
    g = torch.Generator().manual_seed(batch)
    rows = dict(
        tokens=torch.randint(0, model.config.vocab_size, (batch,), generator=g).tolist(),
        positions=[context] * batch,
        page_tables=[list(range(i * width, (i + 1) * width)) for i in range(batch)],
    )
    return step, rows


def _full_step(model, run, rows, params, gens, sgen):
    """One engine decode step: forward (eager or replay), LM head, sampler on the device, one copy back."""
    from rz_agents.engine.sampler import HostTokens, sample_on_device

    hidden = run(rows["tokens"], rows["positions"], rows["page_tables"])
    return HostTokens(*sample_on_device(model.logits(hidden), params, gens, sgen)).lists()


def _time_step(check: Check, model, run, rows, params, sgen) -> float:
    """Median ms of one full decode step (see _full_step), 10 iterations."""
    gens = [None] * len(params)
    return round(check.time_ms(lambda: _full_step(model, run, rows, params, gens, sgen), iters=10), 3)


def _step_bytes(model, batch: int, context: int) -> int:
    """Bytes a decode step must read from HBM: every weight once (the embedding only if tied to the LM
    head) plus every row's K/V in whole 64-key blocks up to its position."""
    from rz_agents.model.kv_cache import PAGE_SIZE, pages_for

    cfg = model.config
    seen, total = set(), 0
    for name, p in model.named_parameters():
        if id(p) in seen or (name.endswith("embed_tokens.weight") and not cfg.tie_word_embeddings):
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
    per_position = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    return total + batch * pages_for(context + 1) * PAGE_SIZE * per_position


def _add_predictions(cfg, sizes: list[tuple[int, int]], results: dict, card, timeout_s: float) -> None:
    """Beside each measured size, the cost model's figures on ``card`` (rz_agents.compile_check.predict,
    issue 54): ``bound_ms`` (bytes / datasheet bandwidth), ``triton_bound_ms`` (the Triton launches alone at
    that bandwidth) and ``estimate_ms`` (every kernel, the sampler, achievable bandwidth, the host gap), and
    the measured step over each. Computed in a child process (the launch recorder patches Triton's launcher,
    which this process is using), bounded by ``timeout_s``; a failure is recorded as ``prediction_error`` and
    changes no measured figure. Without a card (a dry run without --card): nothing."""
    import dataclasses
    import subprocess

    sizes = [(b, c) for b, c in sizes if "skipped" not in results[f"b{b}_ctx{c}"]]  # the measured ones
    if not sizes or card is None:
        return
    keys = ("bound_ms", "triton_bound_ms", "estimate_ms")
    code = (
        "import json, sys; from rz_agents.model import ModelConfig; "
        "from rz_agents.compile_check.predict import predict_decode_step; "
        "a = json.loads(sys.argv[1]); cfg = ModelConfig(**a['cfg']); "
        "p = {f'b{b}_ctx{c}': predict_decode_step(cfg, b, c, a['card']) for b, c in a['sizes']}; "
        "print(json.dumps({k: {x: v.get(x) for x in a['keys']} for k, v in p.items()}))"
    )
    arg = json.dumps({"cfg": dataclasses.asdict(cfg), "sizes": sizes, "card": card.name, "keys": keys})
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "kernels"), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("TRITON_INTERPRET", None)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, arg], capture_output=True, text=True, timeout=timeout_s, env=env
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output")
        predicted = json.loads(done.stdout.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001 - the measured figures stand without it
        for r in results.values():
            if "skipped" not in r:
                r["prediction_error"] = f"{type(exc).__name__}: {exc}"[:300]
        return
    for key, figures in predicted.items():
        row = results[key]
        best = row.get("aligned_graph_ms") or row.get("aligned_eager_ms")
        for name in keys:
            if figures.get(name) is None:
                continue
            row[name] = round(figures[name], 6)
            if best:
                row[f"measured_over_{name[:-3]}"] = round(best / figures[name], 3)


def section_engine_decode(check: Check) -> dict:
    """Qwen3-4B-shaped random model, bf16: the engine's decode step (static, bucketed; LM head and sampler
    included) at batch 1/16/48/128/256 and context 2K/8K, eager vs CUDA graph, aligned vs standard; graph
    rows == eager rows bit for bit; tokens/s and the fraction of the card's HBM roofline (bytes / time / the
    card's bandwidth; K/V limited to 55% of the card's memory).
    Sizes whose K/V do not fit, or that the section's budget cannot reach, are skipped with the reason."""
    from rz_agents.engine.cuda_graphs import DecodeGraphs
    from rz_agents.engine.params import SamplingParams
    from rz_agents.model import ModelConfig
    from rz_agents.model.kv_cache import bytes_per_page, pages_for
    from rz_agents.model.presets import preset_config
    from rz_kernels.triton_ops import attention as ta

    if check.dry:
        cfg = ModelConfig.tiny("qwen3", dtype="bfloat16", num_hidden_layers=1, vocab_size=256)
        batches, contexts, budget = (1, 3), (8, 70), 1e9
    else:
        cfg = preset_config("qwen3-4b", max_position_embeddings=8192 + 128)
        batches, contexts = (1, 16, 48, 128, 256), (2048, 8192)
        # the sizes must end inside the section's budget (a margin for the last size's cleanup)
        budget = min(check.section_left() - 5.0, 1e9)
    t_start = time.perf_counter()
    model = random_model(check, cfg, check.aligned).eval().requires_grad_(False)
    page_bytes = bytes_per_page(cfg)
    # K/V may take 55% of the card's memory (the weights, the step's activations and the LM head's logits
    # take the rest); a dry run without a card: 2 GiB
    kv_limit = 0.55 * check.card.memory_gib * 2**30 if check.card is not None else 2**31
    sizes = [(b, c) for c in contexts for b in batches]
    fits = [(b, c) for b, c in sizes if (b * pages_for(c + 1) + 1) * page_bytes <= kv_limit]
    pages = max(b * pages_for(c + 1) for b, c in fits)
    cache = _random_cache(check, cfg, pages)  # one cache for every size (sequence i: its first pages)
    out: dict = {"model": "qwen3-4b shape" if not check.dry else "tiny", "parameters": model.num_parameters()}
    out["kv_cache_gib"] = round((pages + 1) * page_bytes / 2**30, 2)
    out["attention_tile_rows"] = ta.tile_rows(cfg.num_attention_heads, cfg.num_key_value_heads)
    results: dict = {}
    graphs_ok = check.device.type == "cuda"
    last_cost = 0.0
    for b, c in sizes:
        key = f"b{b}_ctx{c}"
        if (b, c) not in fits:
            need = (b * pages_for(c + 1) + 1) * page_bytes / 2**30
            results[key] = {
                "skipped": f"K/V of {b} x {c} positions = {need:.0f} GiB > {kv_limit / 2**30:.0f} GiB"
            }
            continue
        spent = time.perf_counter() - t_start
        if spent + 1.5 * last_cost > budget:
            results[key] = {
                "skipped": f"section budget: {spent:.0f} s spent, the last size took {last_cost:.0f} s"
            }
            continue
        t0 = time.perf_counter()
        step, rows = _decode_setup(check, model, b, c, cache)
        params = [SamplingParams(temperature=1.0)] * b
        sgen = torch.Generator().manual_seed(1)
        row: dict = {}
        eager_hidden = None
        for label, kernels in (("aligned", check.aligned), ("standard", "standard")):
            model.set_kernels(kernels)
            with torch.inference_mode():
                hidden = step.run(**rows).clone()
            if label == "aligned":
                eager_hidden = hidden
            row[f"{label}_eager_ms"] = _time_step(check, model, step.run, rows, params, sgen)
            if graphs_ok:
                try:
                    graphs = DecodeGraphs(step)
                    graphs.capture(b, step.graph_max_position(c))  # the bound a replay at context c uses
                    with torch.inference_mode():
                        replay = graphs.run(**rows).clone()
                    row[f"{label}_graph_equals_eager"] = bool(torch.equal(replay, hidden))
                    row[f"{label}_graph_ms"] = _time_step(check, model, graphs.run, rows, params, sgen)
                    del graphs
                except Exception as exc:  # noqa: BLE001 - reported, the eager figures stand
                    row[f"{label}_graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
            if label == "standard":
                row["standard_differs_from_aligned"] = not torch.equal(hidden, eager_hidden)
        model.set_kernels(check.aligned)
        row["attention_splits_eager"] = ta.split_count(c)  # the decode grid's bound: eager, then graph
        row["attention_splits_graph"] = ta.split_count(step.graph_max_position(c))
        row["attention_splits_at_max_len"] = ta.split_count(step.static_max_position)  # before issue 37
        best = row.get("aligned_graph_ms") or row["aligned_eager_ms"]
        row["aligned_tokens_per_s"] = round(b / best * 1e3, 1)
        row["step_bytes"] = _step_bytes(model, b, c)
        row["hbm_roofline_fraction"] = roofline_fraction(check.card, row["step_bytes"], best / 1e3)
        std = row.get("standard_graph_ms") or row["standard_eager_ms"]
        row["aligned_over_standard"] = round(std / best, 3)  # > 1: aligned faster
        results[key] = row
        del step
        if check.device.type == "cuda":
            torch.cuda.empty_cache()
        last_cost = time.perf_counter() - t0
    out["sizes"] = results
    done = [r for r in results.values() if "skipped" not in r]
    if graphs_ok and done:
        out["graph_equals_eager"] = all(r.get("aligned_graph_equals_eager") for r in done)
    out["standard_differs"] = all(r["standard_differs_from_aligned"] for r in done) if done else None
    out["card"] = None if check.card is None else check.card.name
    _add_predictions(
        cfg, sizes, results, check.card, timeout_s=min(30.0, max(5.0, check.section_left() - 2.0))
    )
    b48 = results.get("b48_ctx2048", {})
    out["b48_ctx2k_roofline_fraction"] = b48.get("hbm_roofline_fraction")
    out["b48_ctx2k_tokens_per_s"] = b48.get("aligned_tokens_per_s")
    out["b48_ctx2k_aligned_over_standard"] = b48.get("aligned_over_standard")
    return out


def section_engine_sync(check: Check) -> dict:
    """The graph-less decode step (forward, LM head, sampler; dense and MoE) under
    torch.cuda.set_sync_debug_mode("error") and the host-read recorder (rz_agents.engine.host_reads): any
    host sync before the step's one copy of its sampled tokens is named."""
    from rz_agents.engine.host_reads import HostReads
    from rz_agents.engine.params import SamplingParams
    from rz_agents.engine.sampler import HostTokens, sample_on_device
    from rz_agents.model import ModelConfig

    out: dict = {}
    for model_type in ("qwen3", "qwen3_moe"):
        if check.dry:
            cfg = ModelConfig.tiny(model_type, dtype="bfloat16", num_hidden_layers=1, vocab_size=256)
            batch, context = 3, 8
        else:
            cfg = ModelConfig.tiny(
                model_type,
                dtype="bfloat16",
                hidden_size=1024,
                intermediate_size=3072,
                num_hidden_layers=4,
                num_attention_heads=16,
                num_key_value_heads=8,
                head_dim=128,
                vocab_size=32768,
                max_position_embeddings=4096,
                **(
                    {"num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 512}
                    if "moe" in model_type
                    else {}
                ),
            )
            batch, context = 16, 1000
        model = random_model(check, cfg, check.aligned).eval().requires_grad_(False)
        step, rows = _decode_setup(check, model, batch, context)
        params = [SamplingParams(temperature=0.8, top_k=20), SamplingParams(temperature=0.0)] * (
            batch // 2
        ) + [SamplingParams()] * (batch % 2)
        gens, sgen = [None] * batch, torch.Generator().manual_seed(1)
        _full_step(model, step.run, rows, params, gens, sgen)  # warm: compiles, device tables
        check.sync()
        result: dict = {"sync_error": None}
        rec = HostReads()
        try:
            if check.device.type == "cuda":
                torch.cuda.set_sync_debug_mode("error")
            with rec, torch.inference_mode():
                hidden = step.run(**rows)
                host = HostTokens(*sample_on_device(model.logits(hidden), params, gens, sgen))
        except RuntimeError as exc:
            result["sync_error"] = str(exc)[:300]
        finally:
            if check.device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
        if result["sync_error"] is None:
            tokens, _ = host.lists()  # the one wait, outside the guarded region
            result["tokens"] = len(tokens)
        if result["sync_error"] is None:  # (a sync is reported in no_host_sync and the goals)
            fail_unless(
                out,
                result.get("tokens") == batch,
                f"{model_type}: {result.get('tokens')} tokens, not {batch}",
            )
        result["host_reads"] = len(rec.reads)
        result["first_host_reads"] = [f"{op} at {where}" for op, where in rec.reads[:4]]
        result["no_host_sync"] = result["sync_error"] is None and not rec.reads
        out[model_type] = result
        del model, step
    out["dense_no_host_sync"] = out["qwen3"]["no_host_sync"]
    out["moe_no_host_sync"] = out["qwen3_moe"]["no_host_sync"]
    return out


def section_engine_vs_trainer(check: Check) -> dict:
    """The engine (paged K/V, a group sharing its prompt's pages, decode by CUDA-graph replay on a GPU)
    vs the trainer's packed forward, bf16, dense and MoE: every sampled token's log-prob torch.equal."""
    from rz_agents.engine import EngineConfig, RZEngine
    from rz_agents.engine.batch import generate_batch
    from rz_agents.engine.params import SamplingParams
    from rz_agents.model import ModelConfig
    from rz_agents.model.logprobs import packed_token_logprobs
    from rz_kernels.triton_ops import attention as ta

    out: dict = {}
    for model_type in ("qwen3", "qwen3_moe"):
        size = (
            dict(num_hidden_layers=1)
            if check.dry
            else dict(hidden_size=256, intermediate_size=768, head_dim=64, num_hidden_layers=2)
        )
        cfg = ModelConfig.tiny(model_type, dtype="bfloat16", vocab_size=512, **size)
        model = random_model(check, cfg, check.aligned).eval().requires_grad_(False)
        group, new, length = (2, 2, 12) if check.dry else (8, 24, 500)  # GPU: decode crosses key 512
        gen = torch.Generator().manual_seed(5)
        prompt = torch.randint(0, cfg.vocab_size, (length,), generator=gen).tolist()
        prompts = [prompt] * group + [torch.randint(0, cfg.vocab_size, (5,), generator=gen).tolist()]
        params = [
            SamplingParams(temperature=1.0, max_tokens=new, seed=i, ignore_eos=True) for i in range(group)
        ]
        params.append(SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True))
        max_len = 128 if check.dry else 640
        engine = RZEngine(model, EngineConfig(max_running=16, max_len=max_len, share_prefix_min_tokens=8))
        done = generate_batch(engine, prompts, params)
        equal, compared = [], 0
        for p, sp, c in zip(prompts, params, done, strict=True):
            (lp,) = packed_token_logprobs(model, [p + c.tokens], temperature=sp.logprob_temperature)
            trainer = lp[len(p) - 1 :].cpu()
            equal.append(c.logprobs.shape == trainer.shape and bool(torch.equal(c.logprobs, trainer)))
            compared += int(c.logprobs.numel())
        stats = engine.stats()
        row: dict = {}
        # A step that failed (e.g. cut by the budget) finishes its sequences with "error" and few or no
        # tokens: comparing what is left would be a false pass. Every sequence must run to max_tokens.
        check_completions(row, done, "length", new)
        fail_unless(row, compared == len(done) * new, f"compared {compared} tokens, not {len(done) * new}")
        fail_unless(row, all(equal), "engine log-probs differ from the trainer's")
        out[model_type] = {
            **row,
            "bit_identical": all(equal) and compared > 0,
            "tokens_compared": compared,
            "sequences": len(equal),
            "shared_prefix_tokens": stats["shared_prefix_tokens"],
            "cuda_graphs": stats["cuda_graphs"],
            "cuda_graphs_off": stats["cuda_graphs_off"],
            "graph_replays": engine.graphs.replays if engine.graphs is not None else 0,
            "attention_splits_at_last_token": ta.split_count(length + new - 1),
        }
        del engine, model
    out["bit_identical"] = all(r["bit_identical"] for r in out.values())
    for model_type in ("qwen3", "qwen3_moe"):  # the section fails with either model's failures
        for failure in out[model_type].get("failures", []):
            fail_unless(out, False, f"{model_type}: {failure}")
    return out


def section_production_decode(check: Check) -> dict:
    """The engine's production decode path at Qwen3-4B's head layout vs the learner's forward (issue 54):
    head dim 128 with 4 query heads per K/V head (GQA 4; on the GPU Qwen3-4B itself cut to 2 layers, its
    151,936-token LM head kept), paged K/V, prompts prefilled in chunks of ``max_batch_tokens`` with decode
    rows riding along, a group sharing its prompt's pages, split-KV decode over several splits (on the GPU
    the production 512-key splits, rows at 1 to 5; in a dry run 128-key splits, rows at 1, 2 and 4: the same
    split and combine kernels folding >= 3 partials, where 3 production splits would cost the interpreter
    minutes per forward), decode by CUDA-graph replay on a GPU. Every sampled token's log-prob, row by row,
    torch.equal to the trainer's unpaged packed forward (packed_token_logprobs) at the same split size.
    Negative control: the same rows against the standard op set's forward must differ (the comparison can
    fail)."""
    from rz_agents.model import ModelConfig
    from rz_agents.model.presets import preset_config
    from rz_kernels.triton_ops import attention as ta

    if check.dry:
        cfg = ModelConfig.tiny(
            "qwen3", dtype="bfloat16", vocab_size=256, hidden_size=64, intermediate_size=64,
            num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=1, head_dim=128,
            max_position_embeddings=600,
        )  # fmt: skip
        # 128-key splits (2 key blocks): rows at 4, 2 and 1 splits within the interpreter's reach
        lengths, new, chunk, max_len, split_blocks = (400, 400, 200, 5), 2, 128, 600, 2
    else:
        cfg = preset_config("qwen3-4b", num_hidden_layers=2, max_position_embeddings=2560)
        lengths, new, chunk, max_len = (2300, 2300, 1100, 600, 5), 16, 1024, 2400
        split_blocks = ta.SPLIT_BLOCKS  # the production split: 512 keys
    with _split_blocks(ta, split_blocks):  # engine and learner alike: the split size is part of the bits
        out = _production_rows(check, cfg, lengths, new, chunk, max_len)
    out["split_keys"] = split_blocks * ta.BLOCK_N
    want = 3
    fail_unless(out, out["max_splits"] >= want, f"decode reached {out['max_splits']} splits, not >= {want}")
    grid = out["engine_decode_grid_splits_max"]
    fail_unless(out, grid >= out["max_splits"], f"the engine's decode grid had {grid} splits at most")
    return out


@contextlib.contextmanager
def _split_blocks(ta, blocks: int):
    """The Triton attention's split size set to ``blocks`` key blocks while inside (every kernel launch and
    split count reads the module's value at the call), then restored."""
    saved = ta.SPLIT_BLOCKS
    ta.SPLIT_BLOCKS = blocks
    try:
        yield
    finally:
        ta.SPLIT_BLOCKS = saved


def _production_rows(check: Check, cfg, lengths: tuple[int, ...], new: int, chunk: int, max_len: int) -> dict:
    """section_production_decode's engine run and row-by-row comparisons at the current split size."""
    from rz_agents.engine import EngineConfig, RZEngine
    from rz_agents.engine.batch import generate_batch
    from rz_agents.engine.params import SamplingParams
    from rz_agents.model.logprobs import packed_token_logprobs
    from rz_kernels.triton_ops import attention as ta

    model = random_model(check, cfg, check.aligned).eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(11)
    prompts, first = [], {}
    for n in lengths:  # equal lengths share one prompt: the second reads the first's pages (shared prefix)
        first.setdefault(n, torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist())
        prompts.append(first[n])
    params = [
        SamplingParams(temperature=1.0, max_tokens=new, seed=i, ignore_eos=True) for i in range(len(prompts))
    ]
    engine = RZEngine(
        model,
        EngineConfig(max_running=8, max_len=max_len, max_batch_tokens=chunk, share_prefix_min_tokens=64),
    )
    grids: list[int] = []  # every split-KV decode launch's split grid (a CUDA graph's: at its capture)
    real_partials = ta.decode_partials

    def counted_partials(q, k, v, plan, scale):
        grids.append(plan.decode_splits)
        return real_partials(q, k, v, plan, scale)

    ta.decode_partials = counted_partials
    try:
        done = generate_batch(engine, prompts, params)
    finally:
        ta.decode_partials = real_partials
    stats = engine.stats()
    rows: list[dict] = []
    standard_rows_equal = []
    for p, sp, c in zip(prompts, params, done, strict=True):
        (lp,) = packed_token_logprobs(model, [p + c.tokens], temperature=sp.logprob_temperature)
        trainer = lp[len(p) - 1 :].cpu()
        same = c.logprobs.shape == trainer.shape and bool(torch.equal(c.logprobs, trainer))
        rows.append({"prompt": len(p), "tokens": int(c.logprobs.numel()), "equal": same,
                     "splits_at_last_token": ta.split_count(len(p) + new - 1)})  # fmt: skip
    model.set_kernels("standard")
    for p, sp, c in zip(prompts, params, done, strict=True):
        (lp,) = packed_token_logprobs(model, [p + c.tokens], temperature=sp.logprob_temperature)
        standard_rows_equal.append(bool(torch.equal(c.logprobs, lp[len(p) - 1 :].cpu())))
    model.set_kernels(check.aligned)
    out: dict = {
        "model": "qwen3-4b, 2 layers" if not check.dry else "tiny, head dim 128, GQA 4",
        "head_dim": cfg.head_dim,
        "gqa": cfg.num_attention_heads // cfg.num_key_value_heads,
        "prefill_chunk_tokens": chunk,
        "rows": rows,
        "tokens_compared": sum(r["tokens"] for r in rows),
        "max_splits": max(r["splits_at_last_token"] for r in rows),
        # the engine really ran split-KV decode that wide (the grid bounds a token's splits from above)
        "engine_decode_grid_splits_max": max(grids, default=0),
        "shared_prefix_tokens": stats["shared_prefix_tokens"],
        "cuda_graphs": stats["cuda_graphs"],
        "cuda_graphs_off": stats["cuda_graphs_off"],
        "graph_replays": engine.graphs.replays if engine.graphs is not None else 0,
        "standard_rows_equal": standard_rows_equal,
    }
    out["bit_identical"] = bool(rows) and all(r["equal"] for r in rows)
    out["standard_differs"] = not all(standard_rows_equal)
    check_completions(out, done, "length", new)
    fail_unless(out, out["tokens_compared"] == len(prompts) * new,
                f"compared {out['tokens_compared']} tokens, not {len(prompts) * new}")  # fmt: skip
    fail_unless(out, out["bit_identical"], "engine log-probs differ from the trainer's")
    fail_unless(out, out["standard_differs"], "negative control: the standard forward equals the engine")
    if check.device.type == "cuda":
        fail_unless(out, out["graph_replays"] > 0, f"no CUDA-graph replay ({out['cuda_graphs_off']})")
    del engine, model
    return out


def _v4_model(check: Check, layers: tuple[str, ...], moe: tuple[str, ...]):
    """A tiny random DeepSeek-V4 in bf16 with sharp logits (weights std 0.15, the head x3, random sinks,
    pooling position biases, hyper-connection bases and router biases), on the check's device."""
    from rz_agents.model.deepseek_v4 import DeepseekV4ForCausalLM
    from rz_agents.model.deepseek_v4_config import DeepseekV4Config

    cfg = DeepseekV4Config.tiny(
        vocab_size=128, dtype="bfloat16", num_hidden_layers=len(layers), layer_types=layers,
        mlp_layer_types=moe, max_position_embeddings=512,
    )  # fmt: skip
    model = DeepseekV4ForCausalLM(cfg, check.aligned)
    model.reset_parameters(std=0.15, seed=0)
    model.randomize_biases(0)
    with torch.no_grad():
        model.head.weight.mul_(3)
    return model.to(check.device).eval().requires_grad_(False)


def section_v4_graph_decode(check: Check) -> dict:
    """DeepSeek-V4's decode step by CUDA-graph replay (issue 52; model/deepseek_v4_decode.py: the pages read
    in place in shapes fixed by (batch bucket, position bound)): a tiny V4 in bf16 (on the GPU sliding, CSA,
    HCA, CSA with hash and learned MoE; prompts of 140, 60 and 2 tokens decoded across CSA (m=4) and HCA
    (m'=16) blocks, a page boundary and the sliding window, page 0 given back behind it) through the engine
    with CUDA graphs: every sampled log-prob torch.equal to the learner's packed forward and to an engine
    decoding eagerly (cuda_graphs off); graphs captured and replayed (a capture the step refused, e.g. for a
    host read, fails the section with its reason; the host-read check a capture starts with also runs on its
    own, so a dry run has it too). Negative control: the standard op set's learner differs. A dry run: CSA +
    HCA layers (hash and learned MoE) on the Triton op set in the interpreter, shorter prompts, no graphs."""
    from rz_agents.engine import EngineConfig, RZEngine
    from rz_agents.engine.batch import generate_batch
    from rz_agents.engine.cuda_graphs import CaptureRefused, warm_up
    from rz_agents.engine.params import SamplingParams
    from rz_agents.model.logprobs import packed_token_logprobs

    if check.dry:
        layers, moe = ("compressed_sparse_attention", "heavily_compressed_attention"), ("hash_moe", "moe")
        lengths, new, max_len = (6, 2), (4, 6), 64
    else:
        layers = ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                  "compressed_sparse_attention")  # fmt: skip
        moe, lengths, new, max_len = ("hash_moe", "moe", "moe", "moe"), (140, 60, 2), (12, 8, 16), 256
    model = _v4_model(check, layers, moe)
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in lengths]
    params = [
        SamplingParams(temperature=1.0, max_tokens=n, seed=i, ignore_eos=True) for i, n in enumerate(new)
    ]
    runs = {}
    for graphs in (True, False):
        engine = RZEngine(model, EngineConfig(max_running=4, max_len=max_len, cuda_graphs=graphs))
        runs[graphs] = (generate_batch(engine, prompts, params), engine.stats(), engine)
    (done, stats, engine), (eager, _, _) = runs[True], runs[False]
    graphs, step = engine.graphs, engine.runner.decode_step
    try:  # what a capture checks first (a dry run has no capture): the step reads nothing back
        warm_up(step, step.buffers(step.buckets[-1]))
        refused = None
    except CaptureRefused as exc:
        refused = str(exc)[:300]
    rows, standard_equal = [], []
    for p, sp, c, e in zip(prompts, params, done, eager, strict=True):
        (lp,) = packed_token_logprobs(model, [p + c.tokens], temperature=sp.logprob_temperature)
        trainer = lp[len(p) - 1 :].cpu()
        same = c.logprobs.shape == trainer.shape and bool(torch.equal(c.logprobs, trainer))
        as_eager = c.tokens == e.tokens and bool(torch.equal(c.logprobs, e.logprobs))
        rows.append({"prompt": len(p), "tokens": int(c.logprobs.numel()), "equal_learner": same,
                     "equal_eager": as_eager})  # fmt: skip
    model.set_kernels("standard")
    for p, sp, c in zip(prompts, params, done, strict=True):
        (lp,) = packed_token_logprobs(model, [p + c.tokens], temperature=sp.logprob_temperature)
        standard_equal.append(bool(torch.equal(c.logprobs, lp[len(p) - 1 :].cpu())))
    model.set_kernels(check.aligned)
    out: dict = {
        "layers": list(layers),
        "rows": rows,
        "tokens_compared": sum(r["tokens"] for r in rows),
        "bit_identical": bool(rows) and all(r["equal_learner"] for r in rows),
        "graph_equals_eager": all(r["equal_eager"] for r in rows),
        "standard_differs": not all(standard_equal),
        "static_decode_steps": stats["static_decode_steps"],
        "pages_released_behind_window": stats["kv_pages_released_behind_window"],
        "cuda_graphs": stats["cuda_graphs"],
        "cuda_graphs_off": stats["cuda_graphs_off"],
        "graph_captures": graphs.captures if graphs is not None else 0,
        "graph_replays": graphs.replays if graphs is not None else 0,
        "capture_refused": refused,
    }
    check_completions(out, done, "length", None)
    fail_unless(out, refused is None, f"the decode step reads back: {refused}")
    fail_unless(out, out["tokens_compared"] == sum(new), f"compared {out['tokens_compared']} tokens")
    fail_unless(out, out["bit_identical"], "engine log-probs differ from the learner's")
    fail_unless(out, out["graph_equals_eager"], "graph decode differs from eager decode")
    fail_unless(out, out["standard_differs"], "negative control: the standard forward equals the engine")
    if check.device.type == "cuda":
        fail_unless(out, out["graph_replays"] > 0, f"no CUDA-graph replay ({out['cuda_graphs_off']})")
        fail_unless(out, out["pages_released_behind_window"] > 0, "no page given back behind the window")
    del model
    return out


def _missing(*modules: str) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


# name -> (function, GPU time budget in s, modules it needs beyond torch / triton / numpy); order = run order.
# First what decides the product (bit identity, the kernels it rests on) and the speed figures, then the rest:
# a run that the total budget cuts short loses the least, and `--resume` continues it. The budgets include
# Triton's cold compiles and sum to at most GPU_TOTAL_BUDGET_S (a rerun reuses the compile cache).
SECTIONS = {
    "env": (section_env, 5, ()),
    "alignment": (section_alignment, 50, ()),
    "engine_vs_trainer": (section_engine_vs_trainer, 30, ()),
    "production_decode": (section_production_decode, 20, ()),
    "gemm": (section_gemm, 45, ()),
    "attention": (section_attention, 25, ()),
    "logprobs_vocab": (section_logprobs_vocab, 15, ()),
    "engine_decode": (section_engine_decode, 45, ()),
    "nccl_one_rank": (section_nccl_one_rank, 25, ()),
    "grad_determinism": (section_grad_determinism, 35, ()),
    "engine_sync": (section_engine_sync, 15, ()),
    "model_0.6b": (section_model_dense, 40, ()),
    "train_16k": (section_train_16k, 35, ()),
    "model_moe": (section_model_moe, 35, ()),
    "fp32_triton": (section_fp32_triton, 20, ()),
    "frontier_alignment": (section_frontier_alignment, 20, ()),
    "decode_profile": (section_decode_profile, 10, ()),
    "rl_loop": (section_rl_loop, 20, ()),
    "rl_demo": (section_rl_demo, 10, ("yaml", "gymnasium")),
    "v4_graph_decode": (section_v4_graph_decode, 20, ()),
}


def budgets_sum_s() -> float:
    """The sum of every section's GPU budget (at most GPU_TOTAL_BUDGET_S)."""
    return float(sum(budget for _, budget, _ in SECTIONS.values()))


def goals(results: dict) -> dict:
    def get(section, *keys):
        node = results.get(section, {})
        for k in keys:
            node = node.get(k) if isinstance(node, dict) else None
        return node

    def at_least(value, bound):
        return None if value is None else value >= bound

    identical = [
        get("gemm", "rows_bit_identical"),
        get("attention", "decode_rows_equal_prefill_rows"),
        get("attention", "decode_rows_equal_trainer_rows"),
        get("alignment", "aligned_bit_identical"),
        get("fp32_triton", "aligned_bit_identical"),
        get("frontier_alignment", "aligned_bit_identical"),
        get("logprobs_vocab", "engine_equals_trainer"),
        get("model_0.6b", "engine_vs_training_bit_identical"),
        get("model_moe", "engine_vs_training_bit_identical"),
        get("engine_vs_trainer", "bit_identical"),
        get("production_decode", "bit_identical"),
        None if get("rl_loop", "lag0_abs_dlogp_max") is None else get("rl_loop", "lag0_abs_dlogp_max") == 0.0,
    ]
    return {
        "gemm_bf16_ge_0.8x_cublas_at_M_ge_1024": at_least(get("gemm", "min_ratio_at_M_ge_1024"), 0.8),
        "train_step_ge_0.9x_standard": at_least(get("model_0.6b", "train_step_ratio"), 0.9),
        "decode_step_ge_0.9x_standard": at_least(get("model_0.6b", "decode_step_ratio"), 0.9),
        "every_aligned_row_bit_identical": None if any(v is None for v in identical) else all(identical),
        "gradients_bitwise_reproducible": get("grad_determinism", "gradients_bitwise_reproducible"),
        "sharded_step_on_one_rank_group": get("nccl_one_rank", "ok"),
        "standard_differs": get("alignment", "standard_differs"),
        "decode_b48_2k_ge_0.5_hbm_roofline": at_least(
            get("engine_decode", "b48_ctx2k_roofline_fraction"), 0.5
        ),
        "decode_b48_2k_ge_8k_tokens_per_s": at_least(get("engine_decode", "b48_ctx2k_tokens_per_s"), 8000),
        "decode_aligned_ge_0.85x_standard": at_least(
            get("engine_decode", "b48_ctx2k_aligned_over_standard"), 0.85
        ),
        "graph_decode_equals_eager": get("engine_decode", "graph_equals_eager"),
        "v4_graph_decode_equals_learner": get("v4_graph_decode", "bit_identical"),
        "decode_step_no_host_sync": get("engine_sync", "dense_no_host_sync"),
    }


class SectionTimeout(BaseException):
    """A section ran past its time budget.

    A BaseException, not an Exception: the engine's and the sections' broad ``except Exception`` handlers
    (a failed step fails its sequences and carries on) must not swallow it and let the section report a
    pass. Where a library still turns it into another exception, ``Expiry`` records that it fired."""


class Expiry:
    """Whether a ``time_limit`` fired: the SectionTimeout it raised can reach the section's caller as another
    exception (a library that catches and re-raises, e.g. Triton's JIT mid-compile: ``TypeError: unsupported
    callable``) or not at all (a handler that swallowed it), so the caller asks this instead of the
    exception's type."""

    def __init__(self) -> None:
        self.message: str | None = None


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise SectionTimeout in this (main) thread after ``seconds`` (none in a dry run: no limit given);
    yields an ``Expiry`` that records it."""
    expiry = Expiry()
    if seconds == float("inf"):
        yield expiry
        return

    def expire(signum, frame):
        expiry.message = f"past its budget of {seconds:.0f} s"
        raise SectionTimeout(expiry.message)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield expiry
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def fail_unless(out: dict, condition: bool, message: str) -> None:
    """Record ``message`` in ``out["failures"]`` unless ``condition``: the section then reads FAILED, never
    ok."""
    if not condition:
        out.setdefault("failures", []).append(message)


def check_completions(out: dict, completions, expected_reason: str, expected_tokens: int | None) -> None:
    """Every completion finished for ``expected_reason`` (with ``expected_tokens`` tokens when given);
    failures name the first few that did not (an engine that failed a step finishes them with "error")."""
    reasons: dict[str, int] = {}
    for c in completions:
        reasons[c.finish_reason] = reasons.get(c.finish_reason, 0) + 1
    out["finish_reasons"] = reasons
    bad = [c for c in completions if c.finish_reason != expected_reason]
    fail_unless(
        out,
        not bad,
        f"{len(bad)} of {len(completions)} completions finished "
        f"{sorted({c.finish_reason for c in bad})}, not {expected_reason!r}"
        + (f" ({bad[0].error})"[:200] if bad and getattr(bad[0], "error", None) else ""),
    )
    if expected_tokens is not None:
        short = [len(c.tokens) for c in completions if len(c.tokens) != expected_tokens]
        fail_unless(out, not short, f"completions of {short[:4]} tokens, not {expected_tokens}")


def run_section(check: Check, fn, allowed: float) -> dict:
    """``fn(check)`` under a budget of ``allowed`` s; its result, or ``{"timeout": ...}`` if the budget fired
    (however the section ended: returned, raised, or raised something else), or ``{"error": ...}``."""
    expiry = Expiry()
    check.deadline = time.perf_counter() + allowed
    try:
        with time_limit(allowed) as expiry:
            result = fn(check)
    except SectionTimeout as exc:
        result = {"timeout": str(exc)}
    except ModuleNotFoundError as exc:
        result = {"skipped": f"needs {exc.name} (not installed here)"}
    except Exception as exc:  # one broken (or slow) section must not hide the others
        result = {"error": f"{type(exc).__name__}: {exc}"[:500], "trace": traceback.format_exc()[-2000:]}
    finally:
        check.deadline = float("inf")
    if expiry.message and "timeout" not in result:  # swallowed, or re-raised as another exception
        how = result.get("error") or "swallowed by the section, which returned"
        result = {"timeout": f"{expiry.message} (surfaced as: {how})"[:500], "partial": result}
    return result


class CompileTimes:
    """Triton JIT compile time per kernel, from triton.knobs' cache / post-compile hooks (when present)."""

    def __init__(self) -> None:
        self.per_kernel: dict[str, float] = {}
        self._started: dict = {}
        self.available = False
        try:
            from triton import knobs

            knobs.runtime.jit_cache_hook = self._before
            knobs.runtime.jit_post_compile_hook = self._after
            self.available = True
        except Exception:  # an older triton, or none: compile time stays inside the section budgets
            pass

    @staticmethod
    def _name(kw: dict) -> str:
        fn = kw.get("fn")
        return str(getattr(fn, "name", None) or getattr(fn, "__name__", None) or fn)

    def _before(self, *args, **kw):
        self._started[str(kw.get("key"))] = time.perf_counter()
        return False  # never skips the compile

    def _after(self, *args, **kw):
        t0 = self._started.pop(str(kw.get("key")), None)
        if t0 is not None:
            name = self._name(kw)
            self.per_kernel[name] = round(self.per_kernel.get(name, 0.0) + time.perf_counter() - t0, 3)
        return False

    def to_json(self) -> dict:
        return {
            "available": self.available,
            "total_s": round(sum(self.per_kernel.values()), 2),
            "per_kernel_s": dict(sorted(self.per_kernel.items(), key=lambda kv: -kv[1])),
        }


def write_atomically(path: Path, payload: dict) -> None:
    """Write JSON to ``path`` through a temporary file in the same folder and a rename (never half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=1, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def status_of(result: dict) -> str:
    """ok only for a section that ran to its end within its budget with no failure recorded."""
    if "timeout" in result:
        return "timeout"
    if "error" in result:
        return "ERROR"
    if result.get("failures"):
        return "FAILED"
    if "skipped" in result:
        return "skipped"
    return "ok"


def human_summary(payload: dict, out: Path) -> str:
    lines = [
        f"[gpu_check] {payload['total_s']} s total (budget {payload['budget_s']:.0f} s, sections' budgets "
        f"sum to {payload['budgets_sum_s']:.0f} s), results in {out}"
    ]
    for name, result in payload["sections"].items():
        note = _note(result)
        seconds = payload["section_seconds"].get(name, 0.0)
        lines.append(f"  {name:18s} {status_of(result):8s} {seconds:6.1f} s  {str(note)[:90]}")
    lines.append("  goals: " + ", ".join(f"{k}={v}" for k, v in payload["goals"].items()))
    compile_s = payload.get("triton_compile", {}).get("total_s")
    if compile_s:
        lines.append(f"  triton compile: {compile_s} s in all")
    return "\n".join(lines)


def _note(result: dict) -> str:
    return str(
        result.get("timeout")
        or result.get("error")
        or "; ".join(result.get("failures") or [])
        or result.get("skipped")
        or ""
    )


def previous_sections(out: Path) -> dict[str, tuple[dict, float]]:
    """--resume: the sections a previous run (of this result format) wrote to ``out`` that passed: name ->
    (result, seconds). Everything else (timeout, error, failed, skipped, an older format) runs again."""
    try:
        old = json.loads(out.read_text())
    except (OSError, ValueError):
        return {}
    if old.get("result_format") != RESULT_FORMAT:
        return {}
    seconds = old.get("section_seconds", {})
    return {
        name: (result, seconds.get(name, 0.0))
        for name, result in old.get("sections", {}).items()
        if name in SECTIONS and isinstance(result, dict) and status_of(result) == "ok"
    }


def main() -> int:
    check = Check(ARGS)
    out = Path(ARGS.out)
    if check.device.type == "cuda" and not torch.cuda.is_available():
        print("[gpu_check] no CUDA device here; use --dry-run on CPU")
        return 2
    try:
        check.card, card_info = detect_card(check, ARGS.card)
    except ValueError as exc:
        print(f"[gpu_check] {exc}; name a known card with --card")
        return 2
    compiles = CompileTimes()
    payload: dict = {
        "card": card_info or None,
        "goals": {},
        "sections": {},
        "section_seconds": {},
        "total_s": 0.0,
        "budget_s": check.budget_s,
        "budgets_sum_s": budgets_sum_s() * ARGS.section_budget_scale,
        "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR"),
        "result_format": RESULT_FORMAT,
        "complete": False,
    }
    kept = previous_sections(out) if ARGS.resume else {}
    for name in SECTIONS:  # the earlier run's results, in run order, before anything new
        if name in kept:
            payload["sections"][name], payload["section_seconds"][name] = kept[name]
    write_atomically(out, payload)  # first: the card and the kept sections, before any section can hang
    for name, (fn, budget, needs) in SECTIONS.items():
        if (ARGS.only and name not in ARGS.only) or name in kept:
            continue
        left = check.budget_s - check.elapsed()
        allowed = (
            float("inf")
            if check.dry and ARGS.budget_s is None
            else min(budget * ARGS.section_budget_scale, left)
        )
        t0 = time.perf_counter()
        missing = _missing(*needs)
        if missing:
            result = {"skipped": f"needs {', '.join(missing)} (not installed here)"}
        elif left < 1.0:
            result = {"skipped": f"total time budget {check.budget_s:.0f} s spent"}
        else:
            result = run_section(check, fn, allowed)
            if check.device.type == "cuda":
                with contextlib.suppress(Exception):
                    torch.cuda.synchronize(check.device)
                    torch.cuda.empty_cache()  # the previous section's models are gone
        result["budget_s"] = None if allowed == float("inf") else round(allowed, 1)
        payload["sections"][name] = result
        payload["section_seconds"][name] = round(time.perf_counter() - t0, 1)
        payload["total_s"] = round(check.elapsed(), 1)
        payload["goals"] = goals(payload["sections"])
        payload["triton_compile"] = compiles.to_json()
        write_atomically(out, payload)
        note = _note(result)
        print(
            f"[gpu_check] {name}: {status_of(result)} in {payload['section_seconds'][name]} s "
            f"{str(note)[:120]}"
        )
    payload["complete"] = True
    write_atomically(out, payload)
    print(human_summary(payload, out))
    passed = all(status_of(r) in ("ok", "skipped") for r in payload["sections"].values())
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
