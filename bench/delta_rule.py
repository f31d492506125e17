"""Cost of exactness for Gated DeltaNet: the aligned chunked delta rule vs transformers' pure-torch chunked
path vs the recurrent form, prefill and decode tokens/s on CPU, measured in one run.

Shapes: one linear-attention layer of Qwen3.5-0.8B (16 value heads, key/value head dim 128), fp32 inputs.
- prefill: --batch sequences of --prefill tokens from position 0 in one call (aligned: packed, and with
  --before "aligned_before", the same code (a prefill that keeps no caches never takes the row path): their
  spread is the noise; transformers: a [B, T] batch, chunked from the call's first token; recurrent: the
  token loop).
- decode: --batch sequences with --context tokens cached, --steps one-token steps (64 steps visit every
  offset within a chunk once). Aligned: each step computes only the token's row of its chunk on the fixed
  grid (the row path, rz_kernels/delta_rule_rows.py: a token's bits are the packed forward's); with
  --before also "aligned_before", the form before the row path (each step recomputes the sequence's current
  chunk: the same bits); transformers' chunked path pads each one-token call to a chunk of its own; the
  recurrent form (what transformers' model runs for decode) is one state update.

Each figure is CPU seconds of this process over --repeats interleaved rounds (all forms back to back in
each round, each round starting with another form); ratios are medians over rounds of that round's ratio
(aligned time / other time: > 1 means aligned is slower).

  python bench/delta_rule.py --json --before
  python bench/delta_rule.py --json --threads 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
)

from rz_kernels import delta_rule
from rz_kernels.delta_rule import gated_delta_rule, l2_normalize


def cpu_time(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def inputs(b: int, t: int, h: int, dk: int, dv: int, seed: int):
    """[B, T, H, *] inputs in the model's ranges (l2-normalized q/k, log decay <= 0, beta in (0, 1))."""
    gen = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(b, t, h, dk, generator=gen))
    k = l2_normalize(torch.randn(b, t, h, dk, generator=gen))
    v = torch.randn(b, t, h, dv, generator=gen)
    g = -torch.nn.functional.softplus(torch.randn(b, t, h, generator=gen)) * 0.5
    beta = torch.rand(b, t, h, generator=gen)
    return q, k, v, g, beta


def packed(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, *x.shape[2:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--before", action="store_true", help="also time decode as before the row path")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    b, h, d = args.batch, args.heads, args.head_dim
    lens = [args.prefill] * b

    q, k, v, g, beta = inputs(b, args.prefill, h, d, d, 0)
    flat = [packed(x) for x in (q, k, v, g, beta)]

    def prefill_aligned():
        gated_delta_rule(*flat, lens)

    def prefill_chunk():
        torch_chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)

    def prefill_recurrent():
        torch_recurrent_gated_delta_rule(q, k, v, g, beta, None, True, False)

    # decode: --context tokens cached, then --steps single tokens per sequence
    ctx = inputs(b, args.context, h, d, d, 1)
    steps = inputs(b, args.steps, h, d, d, 2)
    _, caches = gated_delta_rule(*(packed(x) for x in ctx), [args.context] * b, keep_caches=True)
    _, state = torch_chunk_gated_delta_rule(*ctx, output_final_state=True)

    def decode_aligned():
        cs = caches
        for i in range(args.steps):
            _, cs = gated_delta_rule(*(x[:, i] for x in steps), [1] * b, cs, keep_caches=True)

    def decode_chunk():
        s = state
        for i in range(args.steps):
            _, s = torch_chunk_gated_delta_rule(
                *(x[:, i : i + 1] for x in steps), initial_state=s, output_final_state=True
            )

    def decode_before():
        cs = [dataclasses.replace(c, rows=None) for c in caches]
        for i in range(args.steps):
            step = (x[:, i] for x in steps)
            _, cs = gated_delta_rule(*step, [1] * b, cs, keep_caches=True, row_decode=False)

    def decode_recurrent():
        s = state
        for i in range(args.steps):
            _, s = torch_recurrent_gated_delta_rule(*(x[:, i : i + 1] for x in steps), s, True, False)

    forms = {
        "prefill": {"aligned": prefill_aligned, "chunk": prefill_chunk, "recurrent": prefill_recurrent},
        "decode": {"aligned": decode_aligned, "chunk": decode_chunk, "recurrent": decode_recurrent},
    }
    if args.before:  # (prefill keeps no caches: the same code before and after, a check of the noise)
        forms["prefill"]["aligned_before"] = lambda: gated_delta_rule(*flat, lens, row_decode=False)
        forms["decode"]["aligned_before"] = decode_before
    tokens = {"prefill": b * args.prefill, "decode": b * args.steps}
    for phase in forms.values():  # warm-up (first-call costs, the allocator)
        for fn in phase.values():
            fn()
    times = {p: {f: [] for f in forms[p]} for p in forms}
    for rnd in range(args.repeats):
        for p, phase in forms.items():
            order = list(phase.items())
            # each round starts with another form: the first after a phase change pays for the memory the
            # others freed (on this VM freed pages go back to the host), so no form always goes first
            for f, fn in order[rnd % len(order) :] + order[: rnd % len(order)]:
                times[p][f].append(cpu_time(fn))
    result = {
        "shape": {"heads": h, "head_dim": d, "batch": b, "prefill": args.prefill, "context": args.context,
                  "decode_steps": args.steps, "threads": args.threads, "repeats": args.repeats,
                  "dtype": "float32"},
    }  # fmt: skip
    for p in forms:
        med = {f: statistics.median(ts) for f, ts in times[p].items()}
        result[p] = {f"{f}_tokens_per_s": round(tokens[p] / med[f], 1) for f in med}
        for other in ("chunk", "recurrent", "aligned_before"):
            if other not in times[p]:
                continue
            ratios = [a / o for a, o in zip(times[p]["aligned"], times[p][other], strict=True)]
            result[p][f"aligned_time_over_{other}"] = round(statistics.median(ratios), 3)
    # which row-path form decoded (the check's verdict per shape; None: decoded by chunks)
    result["decode"]["row_form"] = {str(k): f for k, f in delta_rule._row_verdicts.items()}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for p in forms:
            print(p, result[p])


if __name__ == "__main__":
    main()
