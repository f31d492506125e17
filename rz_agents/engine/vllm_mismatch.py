"""How far vLLM's sampling log-probs are from our trainer's (``rz align-check --engine vllm``).

The rz engine matches the trainer bit for bit; vLLM runs its own kernels, so its recorded
log-probs differ. This measures by how much: random prompts at several batch sizes go through a
VLLMEngine, and every generated token's log-prob is compared with ``packed_token_logprobs`` of the
same weights (aligned op set). Importing this module needs vLLM (ImportError otherwise).
"""

from __future__ import annotations

import asyncio
import math
import random
import tempfile
from pathlib import Path
from typing import Any

import torch

from rz_agents.engine.params import SamplingParams
from rz_agents.engine.vllm_backend import VLLMEngine, import_vllm

import_vllm()  # fail at import time: the caller reports "vLLM backend unavailable"


def _tiny_config(arch: str, dtype: str):
    from rz_agents.model import ModelConfig

    # vLLM's CPU attention needs head_dim >= 64.
    return ModelConfig.tiny(
        arch, hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64, dtype=dtype
    )


def _mismatch(engine: VLLMEngine, model, batch_sizes, max_len: int, seed: int) -> dict[str, Any]:
    from rz_agents.model.logprobs import packed_token_logprobs

    rng = random.Random(seed)
    vocab = model.config.vocab_size
    half = max(2, max_len // 2)
    params = SamplingParams(temperature=1.0, max_tokens=half, ignore_eos=True)
    diffs: list[torch.Tensor] = []
    for batch in batch_sizes:
        prompts = [[rng.randrange(vocab) for _ in range(rng.randint(1, half))] for _ in range(batch)]

        async def run(prompts=prompts):
            return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

        for prompt, out in zip(prompts, asyncio.run(run()), strict=True):
            if out.finish_reason == "error" or not out.tokens:
                raise RuntimeError(f"vLLM generation failed: {out.error}")
            (ref,) = packed_token_logprobs(model, [prompt + out.tokens])
            diffs.append(ref[len(prompt) - 1 :].double() - out.logprobs.double())
    d = torch.cat(diffs)  # logp_learner - logp_behavior per token
    ratio = d.exp()  # the unclipped IS weight the learner would apply
    return {
        "tokens": int(d.numel()),
        "bit_identical_tokens": int((d == 0).sum()),
        "max_abs_dlogp": float(d.abs().max()),
        "mean_abs_dlogp": float(d.abs().mean()),
        "kl_k1": float((-d).mean()),  # estimates of KL(behavior || learner) from behavior samples
        "kl_k3": float((ratio - 1 - d).mean()),
        "is_weight_max": float(ratio.max()),
        "is_weight_min": float(ratio.min()),
    }


def measure_vllm_mismatch(args) -> dict[str, Any]:
    """Run the comparison for ``rz align-check --engine vllm`` arguments; returns a JSON-able dict."""
    from rz_agents.model import Transformer
    from rz_agents.model.checkpoint import load_hf_checkpoint, save_hf_checkpoint

    if args.threads:
        torch.set_num_threads(args.threads)
    batch_sizes = [b for b in args.batch_sizes if b <= 64] or [1]  # keep the run to minutes
    reports = []
    combos = (
        [(None, d) for d in args.dtype]
        if args.checkpoint
        else [(a, d) for a in args.arch for d in args.dtype]
    )
    for arch, dtype in combos:
        with tempfile.TemporaryDirectory() as tmp:
            if args.checkpoint:
                model = load_hf_checkpoint(args.checkpoint, dtype=dtype)
                ckpt = Path(args.checkpoint)
            else:
                model = Transformer(_tiny_config(arch, dtype), kernels="aligned")
                model.reset_parameters(std=0.05, seed=args.seed)
                ckpt = save_hf_checkpoint(model, Path(tmp) / "ckpt")
            model.set_kernels("aligned")
            max_len = args.max_len + 8
            engine = VLLMEngine(
                ckpt, max_len=max_len, dtype=dtype, seed=args.seed, max_num_seqs=max(batch_sizes)
            )
            try:
                result = _mismatch(engine, model, batch_sizes, args.max_len, args.seed)
            finally:
                engine.close()
        result.update(arch=model.config.model_type, dtype=dtype, batch_sizes=batch_sizes)
        reports.append(
            {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in result.items()}
        )
    return {"engine": "vllm", "reports": reports}
