"""MoE routing under kernel mismatch: how often the router's top-k differs between inference and training.

A small Qwen3-MoE policy (8 experts, top-2, bf16) samples episodes of the demo task through the cached
inference path the engine runs (chunked prefill, then batched one-token decodes over a KV cache); the
trainer then runs its packed forward over the same tokens. Every router decision (token, layer) is
recorded on both sides. Per op set (aligned, standard) we report the fraction of decisions whose
expert set (and whose ordered top-k) differs, the fraction of tokens with any differing decision, and
the |dlogp| of tokens with and without one. Two policies: random init, and the same architecture
warm-started on the demo task (trained routers have other margins than random ones).

    python3 experiments/moe_routing.py --quick     # CI: random init only, a few sequences
    python3 experiments/moe_routing.py             # the documented run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DEFAULT_RUNS, RESULTS, command_line, log, warm_start_checkpoint, write_json  # noqa: E402

MOE_OVERRIDES = [
    "model.model_type=qwen3_moe",
    "model.tiny_overrides.num_experts=8",
    "model.tiny_overrides.num_experts_per_tok=2",
    "model.tiny_overrides.moe_intermediate_size=96",
]


class RouteRecorder:
    """Wraps every SparseMoE layer's routing: records (sequence, position) -> experts per layer."""

    def __init__(self, model) -> None:
        from rz_agents.model.transformer import SparseMoE

        self.records: dict[tuple[int, int, int], tuple[int, ...]] = {}  # (layer, seq, pos) -> experts
        self.enabled = False
        layers = [m for m in model.modules() if isinstance(m, SparseMoE)]
        for index, layer in enumerate(layers):
            layer.forward = self._wrap(layer, index)

    def _wrap(self, layer, index: int):
        """The layer's own forward, with an op set whose ``route`` also records its top-k decisions."""
        recorder, original = self, layer.forward

        def forward(x, ctx):
            ops = ctx.ops

            def route(logits, top_k, normalize):
                weights, experts = ops.route(logits, top_k, normalize)
                if recorder.enabled:
                    seqs = ctx.record_seq.tolist()
                    for s, p, e in zip(seqs, ctx.positions.tolist(), experts.tolist(), strict=True):
                        recorder.records[(index, s, p)] = tuple(e)
                return weights, experts

            ctx.ops = dataclasses.replace(ops, route=route)
            try:
                return original(x, ctx)
            finally:
                ctx.ops = ops

        return forward


def _with_seq(model, tokens, positions, seq_ids, cache=None):
    """A forward that tells the recorder which sequence each row belongs to (seq_ids are sequence indices)."""
    from rz_agents.model import transformer

    original = transformer._Context.__init__

    def init(self, m, pos, sid, kv, *rest):
        original(self, m, pos, sid, kv, *rest)
        self.record_seq = sid

    transformer._Context.__init__ = init
    try:
        return model(tokens, positions, seq_ids, cache)
    finally:
        transformer._Context.__init__ = original


def sample_cached(model, prompts: list[list[int]], max_new: int, seed: int):
    """The engine's path in miniature: prompts prefilled in random-size chunks, then all sequences decode
    together one token per step over a KV cache. Returns (tokens, behavior logprobs) per sequence."""
    import torch

    from rz_agents.model.kv_cache import sequence_cache
    from rz_agents.model.logprobs import sampling_logprobs

    rng = random.Random(seed)
    n = len(prompts)
    cache = sequence_cache(model.config, n, max(map(len, prompts)) + max_new + 1)
    last: list[torch.Tensor] = []
    for i, p in enumerate(prompts):  # chunked prefill, one sequence at a time
        start = 0
        while start < len(p):
            end = min(len(p), start + rng.randint(1, 24))
            h = _with_seq(
                model,
                torch.tensor(p[start:end]),
                torch.arange(start, end),
                torch.full((end - start,), i),
                cache,
            )
            start = end
        last.append(h[-1])
    gens = [torch.Generator().manual_seed(seed * 1000 + i) for i in range(n)]
    seqs = [list(p) for p in prompts]
    blp: list[list[float]] = [[] for _ in range(n)]
    hidden = torch.stack(last)
    for _ in range(max_new):
        lp = sampling_logprobs(model.logits(hidden), 1.0, 0, 1.0)
        new = [int(torch.multinomial(lp[i].exp(), 1, generator=gens[i])) for i in range(n)]
        for i, t in enumerate(new):
            seqs[i].append(t)
            blp[i].append(float(lp[i, t]))
        pos = torch.tensor([len(s) - 1 for s in seqs])
        hidden = _with_seq(model, torch.tensor(new), pos, torch.arange(n), cache)
    return seqs, blp


def measure(model, prompts, max_new: int, seed: int) -> dict[str, Any]:
    import torch

    from rz_agents.model.logprobs import packed_token_logprobs

    rec = RouteRecorder(model)
    with torch.no_grad():
        rec.enabled = True
        seqs, blp = sample_cached(model, prompts, max_new, seed)
        infer = rec.records
        rec.records = {}
        lengths = [len(s) for s in seqs]
        tokens = torch.tensor([t for s in seqs for t in s])
        positions = torch.cat([torch.arange(n) for n in lengths])
        seq_ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
        _with_seq(model, tokens, positions, seq_ids)  # the trainer's packed forward, recorded
        train = rec.records
        rec.enabled = False
        # Trainer log-probs of the sampled tokens (the learner's function: the same packed forward again).
        learner = packed_token_logprobs(model, seqs)
    keys = sorted(infer)
    set_diff = sum(set(infer[k]) != set(train[k]) for k in keys)
    order_diff = sum(infer[k] != train[k] for k in keys)
    # Tokens (seq, pos) with any differing decision in any layer; |dlogp| on sampled tokens split by it.
    flipped = {(s, p) for (_, s, p) in keys if set(infer[(_, s, p)]) != set(train[(_, s, p)])}
    with_flip, without = [], []
    for i, (p, b) in enumerate(zip(prompts, blp, strict=True)):
        lps = learner[i][len(p) - 1 :].tolist()
        for j, (t, e) in enumerate(zip(lps, b, strict=True)):
            pos = len(p) + j  # position of the sampled token; its logits came from position pos - 1
            (with_flip if any((i, q) in flipped for q in range(pos)) else without).append(abs(t - e))

    def stats(v):
        return {
            "tokens": len(v),
            "abs_dlogp_mean": sum(v) / len(v) if v else None,
            "abs_dlogp_max": max(v) if v else None,
        }

    return {
        "router_decisions": len(keys),
        "expert_set_differs_fraction": set_diff / len(keys),
        "ordered_topk_differs_fraction": order_diff / len(keys),
        "positions_with_a_flip_fraction": len(flipped) / len({(s, p) for (_, s, p) in keys}),
        "sampled_tokens_after_a_flip": stats(with_flip),
        "sampled_tokens_without_a_flip_before": stats(without),
    }


def demo_prompts(n: int, seed: int) -> list[list[int]]:
    from rz_agents.data.synthetic import generate_arithmetic_tasks
    from rz_agents.rollout.byte_chat import ByteChatTemplate, ByteTokenizer

    tok, template = ByteTokenizer(), ByteChatTemplate()
    tasks = generate_arithmetic_tasks(n, seed=seed, difficulty=1)
    return [template.encode_prompt(tok, [{"role": "user", "content": t["question"]}]) for t in tasks]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sequences", type=int, default=64)
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    import torch

    from rz_agents.model import ModelConfig
    from rz_agents.model.checkpoint import load_hf_checkpoint

    torch.set_num_threads(1)
    if args.quick:
        args.sequences, args.max_new = 4, 8
    prompts = demo_prompts(args.sequences, seed=77)
    policies: dict[str, Any] = {}
    cfg = ModelConfig.tiny(
        "qwen3_moe",
        vocab_size=320,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=96,
        dtype=args.dtype,
    )
    policies["random_init"] = lambda kernels: _random(cfg, kernels)
    if not args.quick:
        warm = warm_start_checkpoint(args.runs, "configs/demo.yaml", MOE_OVERRIDES, name="warm_demo_moe")
        policies["warm_started"] = lambda kernels: load_hf_checkpoint(warm, kernels=kernels, dtype=args.dtype)
    results: dict[str, Any] = {
        "command": command_line(),
        "dtype": args.dtype,
        "sequences": len(prompts),
        "max_new": args.max_new,
    }
    for name, make in policies.items():
        for kernels in ("aligned", "standard"):
            log(f"{name} / {kernels}")
            results[f"{name}__{kernels}"] = measure(make(kernels), prompts, args.max_new, args.seed)
    out = RESULTS / ("moe_routing_quick" if args.quick else "moe_routing") / "summary.json"
    write_json(out, results)
    print(json.dumps(results, indent=2))
    return 0


def _random(cfg, kernels):
    from rz_agents.model import Transformer

    m = Transformer(cfg, kernels=kernels)
    m.reset_parameters(seed=0)
    return m.to(cfg.torch_dtype)


if __name__ == "__main__":
    sys.exit(main())
