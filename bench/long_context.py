"""Long-context benchmark: rz engine prefill/decode and a learner step at 1K, 4K and 16K tokens.

Every measurement runs in a fresh child process, so its peak RSS (ru_maxrss) is that measurement's
own. Engine (aligned kernels, the bench model of bench/engine.py with a longer position table): one
prompt of C tokens is prefilled (chunks of --max-batch-tokens, the time to its first token), then the
same prompt plus that token is sent again: the prefix cache supplies the C cached positions and the
engine decodes --gen tokens against a context of C..C+gen (that request's time). Learner: one
REINFORCE Zero step (forward, backward, AdamW) on a single C-token trajectory of a smaller model
(hidden 256, 4 layers, vocab 32,000: the bench model's 151k-wide LM head would make a 16K step take
many minutes here), with activation checkpointing on, and off where it fits (--no-ckpt-max).

Reports tokens per CPU-second and per wall-second, peak RSS, the KV cache's bytes, and the ratios the
goals are stated in: decode_16k_over_1k (goal >= 0.5) and peak-RSS growth per 1K tokens between
sizes (linear memory: the growth per token stays flat from 4K to 16K).

  python bench/long_context.py --json
  python bench/engine.py --long --json          # the same
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_model import bench_config  # noqa: E402

VOCAB = 151_669


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def engine_worker(context: int, args) -> dict:
    import asyncio

    from rz_agents.engine import EngineConfig, RZEngine, SamplingParams
    from rz_agents.model import Transformer

    torch.set_num_threads(args.threads)
    max_len = context + args.gen + 64
    cfg = bench_config(VOCAB, "float32", eos_token_id=VOCAB - 1).replace(max_position_embeddings=max_len)
    model = Transformer(cfg, kernels=args.kernels)
    model.reset_parameters(seed=0)
    model.eval()
    engine = RZEngine(
        model,
        EngineConfig(
            max_running=1,
            max_len=max_len,
            max_batch_tokens=args.max_batch_tokens,
            num_threads=args.threads,
            eos_token_ids=(),
        ),
    )
    rss_model = peak_rss_mb()
    prompt = torch.randint(
        0, VOCAB - 1, (context,), generator=torch.Generator().manual_seed(context)
    ).tolist()

    async def run():
        w0, c0 = _clock()
        first = await engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=1, ignore_eos=True))
        w1, c1 = _clock()
        out = await engine.generate(
            prompt + first.tokens, SamplingParams(temperature=1.0, max_tokens=args.gen, ignore_eos=True)
        )
        w2, c2 = _clock()
        assert out.num_cached_prompt_tokens == context, out.num_cached_prompt_tokens
        return (w1 - w0, c1 - c0), (w2 - w1, c2 - c1)

    (pw, pc), (dw, dc) = asyncio.run(run())
    return {
        "context": context,
        "prefill_tok_per_s": round(context / pw, 1),
        "prefill_tok_per_cpu_s": round(context / pc, 1),
        "decode_tok_per_s": round(args.gen / dw, 2),
        "decode_tok_per_cpu_s": round(args.gen / dc, 2),
        "kv_cache_mb": round(engine.kv_cache.bytes_total / 2**20, 1),
        "rss_after_model_mb": round(rss_model, 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "peak_over_model_mb": round(peak_rss_mb() - rss_model, 1),
    }


def learner_worker(context: int, args, checkpointing: bool) -> dict:
    from rz_agents.model import ModelConfig, Transformer
    from rz_agents.trainer.learner import Learner, LearnerConfig
    from rz_agents.trainer.optim import OptimConfig
    from rz_agents.trajectory import Trajectory

    torch.set_num_threads(args.threads)
    cfg = ModelConfig(
        model_type="qwen3",
        vocab_size=32_000,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=context + 64,
        activation_checkpointing=checkpointing,
    )
    model = Transformer(cfg, kernels=args.kernels)
    model.reset_parameters(seed=0)
    learner = Learner(model, LearnerConfig(optim=OptimConfig(lr=1e-4), micro_batch_tokens=4096))
    rss_model = peak_rss_mb()
    tokens = torch.randint(0, cfg.vocab_size, (context,), generator=torch.Generator().manual_seed(1)).tolist()
    half = context // 2  # the second half is "sampled" (a long prompt, then a long completion)
    traj = Trajectory(
        tokens=tokens,
        loss_mask=[False] * half + [True] * (context - half),
        behavior_logprobs=[0.0] * half + [-10.0] * (context - half),
        versions=[0] * context,
        reward=1.0,
        group_id=0,
    )
    w0, c0 = _clock()
    metrics = learner.step([traj])
    w1, c1 = _clock()
    assert metrics.get("step_skipped_nonfinite") == 0, metrics
    return {
        "context": context,
        "activation_checkpointing": checkpointing,
        "step_s": round(w1 - w0, 2),
        "step_cpu_s": round(c1 - c0, 2),
        "tok_per_cpu_s": round(context / (c1 - c0), 1),
        "rss_after_model_mb": round(rss_model, 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "peak_over_model_mb": round(peak_rss_mb() - rss_model, 1),
    }


def _child(kind: str, context: int, args, extra: list[str]) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, str(context), *extra]
    cmd += ["--threads", str(args.threads), "--gen", str(args.gen), "--kernels", args.kernels]
    cmd += ["--max-batch-tokens", str(args.max_batch_tokens)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if proc.returncode != 0:
        return {"context": context, "error": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _growth_per_1k(rows: list[dict]) -> list[dict]:
    """Growth per 1K tokens, between consecutive context sizes, of the peak RSS above the RSS with the
    model built (flat from size to size: memory linear in the context)."""
    ok = [r for r in rows if "peak_over_model_mb" in r]
    return [
        {
            "from": a["context"],
            "to": b["context"],
            "mb_per_1k_tokens": round(
                (b["peak_over_model_mb"] - a["peak_over_model_mb"]) / ((b["context"] - a["context"]) / 1024),
                2,
            ),
        }
        for a, b in zip(ok, ok[1:], strict=False)
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kernels", default="aligned", choices=["aligned", "standard"])
    ap.add_argument("--max-batch-tokens", type=int, default=512)
    ap.add_argument(
        "--no-ckpt-max", type=int, default=4096, help="largest context also run without checkpointing"
    )
    ap.add_argument("--skip", nargs="*", default=[], choices=["engine", "learner"])
    ap.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--no-ckpt", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        kind, context = args.worker[0], int(args.worker[1])
        result = (
            engine_worker(context, args)
            if kind == "engine"
            else learner_worker(context, args, not args.no_ckpt)
        )
        print(json.dumps(result))
        return

    t0 = time.time()
    load0 = os.getloadavg()[0]
    out: dict = {"threads": args.threads, "kernels": args.kernels}
    if "engine" not in args.skip:
        rows = [_child("engine", c, args, []) for c in args.contexts]
        out["engine"] = rows
        out["engine_peak_rss_growth"] = _growth_per_1k(rows)
        by = {r["context"]: r for r in rows if "decode_tok_per_cpu_s" in r}
        lo, hi = min(args.contexts), max(args.contexts)
        if lo in by and hi in by:
            out[f"decode_{hi // 1024}k_over_{lo // 1024}k"] = round(
                by[hi]["decode_tok_per_cpu_s"] / by[lo]["decode_tok_per_cpu_s"], 3
            )
        if not args.json:
            print(json.dumps(rows, indent=1), flush=True)
    if "learner" not in args.skip:
        rows = [_child("learner", c, args, []) for c in args.contexts]
        out["learner"] = rows
        out["learner_peak_rss_growth"] = _growth_per_1k(rows)
        out["learner_without_checkpointing"] = [
            _child("learner", c, args, ["--no-ckpt"]) for c in args.contexts if c <= args.no_ckpt_max
        ]
    out["loadavg_start_end"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    out["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
