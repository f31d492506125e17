"""kv_on_update: keep vs recompute, measured on the same requests and the same weight updates.

A small random Qwen3 model (hidden 256, 4 layers, vocab 4,096, aligned kernels) serves --requests
concurrent requests of mixed prompt lengths while the weights change every --update-every engine
steps (a perturbation of scale --scale per update: a learner step). Each policy runs the identical
workload. Reported per policy:
- generated tokens per CPU-second of the whole workload (recompute re-prefills every running
  sequence at each update; keep does not);
- prefill tokens computed;
- the IS weights the learner would see for tokens it trains at the version that sampled them
  (lag 0): w = exp(logp_learner - behavior_logprob) per token, with the learner's packed forward on
  that version's weights. recompute: exactly 1 (bit-identical); keep: tokens sampled after an
  update attend to K/V the old weights computed, so w != 1 there. Reported: the fraction of
  tokens with w != 1, mean and max |log w|, and the spread of the versions recorded per sequence.

  python bench/kv_on_update.py --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams  # noqa: E402
from rz_agents.model import ModelConfig, Transformer  # noqa: E402
from rz_agents.model.logprobs import packed_token_logprobs  # noqa: E402


def make_model(seed: int = 0) -> Transformer:
    cfg = ModelConfig.tiny(
        "qwen3",
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=4096,
        max_position_embeddings=1024,
    )
    model = Transformer(cfg, kernels="aligned")
    model.reset_parameters(std=0.05, seed=seed)
    return model.eval()


def states(model: Transformer, n: int, scale: float) -> list[dict[str, torch.Tensor]]:
    """Weights of versions 1..n, each a small perturbation of the previous one."""
    out, cur = [], {k: p.detach().clone() for k, p in model.named_parameters()}
    for v in range(n):
        gen = torch.Generator().manual_seed(100 + v)
        cur = {k: p + scale * torch.randn(p.shape, generator=gen) for k, p in cur.items()}
        out.append(cur)
    return out


def run(policy: str, args, prompts, versions) -> dict:
    model = make_model()
    engine = RZEngine(
        model,
        EngineConfig(
            max_running=args.requests, max_len=1024, max_batch_tokens=256, kv_on_update=policy, num_threads=1
        ),
    )
    params = [
        SamplingParams(temperature=1.0, max_tokens=args.gen, seed=i, ignore_eos=True)
        for i in range(len(prompts))
    ]

    async def main():
        tasks = [asyncio.create_task(engine.generate(p, sp)) for p, sp in zip(prompts, params, strict=True)]
        applied = 0
        while not all(t.done() for t in tasks):
            if applied < len(versions) and engine.counters["steps"] >= (applied + 1) * args.update_every:
                engine.load_weights(versions[applied], applied + 1)
                applied += 1
            await asyncio.sleep(0)
        return [t.result() for t in tasks]

    t0, c0 = time.perf_counter(), time.process_time()
    outs = asyncio.run(main())
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    generated = sum(len(o.tokens) for o in outs)
    # the learner's log-probs at the version that sampled each token (lag 0)
    learner = make_model()
    all_states = [{k: p.detach().clone() for k, p in make_model().named_parameters()}, *versions]
    log_w = []
    for prompt, out in zip(prompts, outs, strict=True):
        for v in sorted(set(out.versions)):
            learner.load_state_dict(all_states[v], strict=False)
            with torch.no_grad():
                (lp,) = packed_token_logprobs(learner, [prompt + out.tokens])
            lp = lp[len(prompt) - 1 :]
            for i, tv in enumerate(out.versions):
                if tv == v:
                    log_w.append(float(lp[i]) - float(out.logprobs[i]))
    off = [abs(x) for x in log_w if x != 0.0]
    spans = [len(set(o.versions)) for o in outs]
    return {
        "generated_tokens": generated,
        "tokens_per_cpu_s": round(generated / cpu, 1),
        "tokens_per_wall_s": round(generated / wall, 1),
        "prefill_tokens": engine.counters["prefill_tokens"],
        "weight_updates": engine.counters["weight_updates"],
        "is_weight_not_1_fraction": round(len(off) / len(log_w), 4),
        "mean_abs_log_is_weight": sum(abs(x) for x in log_w) / len(log_w),
        "max_abs_log_is_weight": max((abs(x) for x in log_w), default=0.0),
        "max_is_weight": math.exp(max(log_w)),
        "min_is_weight": math.exp(min(log_w)),
        "mean_versions_per_sequence": sum(spans) / len(spans),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--gen", type=int, default=96)
    ap.add_argument("--updates", type=int, default=4)
    ap.add_argument("--update-every", type=int, default=20, help="engine steps between weight updates")
    ap.add_argument("--scale", type=float, default=0.002, help="weight change per update")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    lengths = [32, 200, 64, 400, 128, 16, 300, 90]
    prompts = [
        torch.randint(0, 4096, (lengths[i % len(lengths)],), generator=gen).tolist()
        for i in range(args.requests)
    ]
    versions = states(make_model(), args.updates, args.scale)
    result = {p: run(p, args, prompts, versions) for p in ("recompute", "keep")}
    result["keep_over_recompute_tokens_per_cpu_s"] = round(
        result["keep"]["tokens_per_cpu_s"] / result["recompute"]["tokens_per_cpu_s"], 3
    )
    print(json.dumps(result, indent=2) if args.json else result)
    return result


if __name__ == "__main__":
    main()
