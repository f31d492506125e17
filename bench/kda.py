"""Cost of exactness for Kimi Delta Attention (KDA: the delta rule with a per-channel decay): the aligned
chunked delta rule on its fixed grid (rz_kernels.delta_rule with g [T, H, dk]) vs transformers' pure-torch
chunked KDA vs its recurrent form, prefill and decode tokens/s on CPU, measured in one run.

Shapes: one KDA layer of Kimi-Linear-48B-A3B has 32 heads x 128; the defaults take 16 heads (--heads) to fit
the shared CPU machine. fp32 inputs.
- prefill: --batch sequences of --prefill tokens from position 0 in one call (aligned: packed, and with
  --before "aligned_before", the same code (a prefill that keeps no caches never takes the row path): their
  spread is the noise; transformers: a [B, T] batch chunked from the call's first token; recurrent: the
  token loop).
- decode: --batch sequences with --context tokens cached, --steps one-token steps. Aligned: each step
  computes only the token's row of its chunk on the fixed grid (the row path, rz_kernels/delta_rule_rows.py:
  a token's bits are the packed forward's); with --before also "aligned_before", the form before the row
  path (each step recomputes the sequence's current chunk: the same bits); transformers' chunked path pads
  each one-token call to a chunk of its own; the recurrent form (what transformers' model runs for decode)
  is one state update.

Each figure is CPU seconds of this process over --repeats interleaved rounds (each round starting with
another form); ratios are medians over rounds of that round's ratio (aligned time / other time: > 1 means
aligned is slower).

  python bench/kda.py --json --before
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch
from transformers.models.kimi_linear.modeling_kimi_linear import (
    chunk_kimi_delta_attention,
    recurrent_kimi_delta_attention,
)

from rz_kernels import delta_rule
from rz_kernels.delta_rule import gated_delta_rule, l2_normalize


def cpu_time(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def inputs(b: int, t: int, h: int, d: int, seed: int):
    """[B, T, H, *] inputs in the model's ranges (l2-normalized q/k, a per-channel log decay <= 0)."""
    gen = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(b, t, h, d, generator=gen))
    k = l2_normalize(torch.randn(b, t, h, d, generator=gen))
    v = torch.randn(b, t, h, d, generator=gen)
    g = -torch.nn.functional.softplus(torch.randn(b, t, h, d, generator=gen)) * 0.5
    beta = torch.rand(b, t, h, generator=gen)
    return q, k, v, g, beta


def packed(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, *x.shape[2:])


def forms(args) -> tuple[dict, dict]:
    """The timed callables per phase and the tokens each phase processes."""
    b, h, d = args.batch, args.heads, args.head_dim
    q, k, v, g, beta = xs = inputs(b, args.prefill, h, d, 0)
    flat = [packed(x) for x in xs]
    ctx, steps = inputs(b, args.context, h, d, 1), inputs(b, args.steps, h, d, 2)
    _, caches = gated_delta_rule(*(packed(x) for x in ctx), [args.context] * b, keep_caches=True)
    _, state = chunk_kimi_delta_attention(*ctx, output_final_state=True)

    def decode_aligned():
        cs = caches
        for i in range(args.steps):
            _, cs = gated_delta_rule(*(x[:, i] for x in steps), [1] * b, cs, keep_caches=True)

    def decode_chunk():
        s = state
        for i in range(args.steps):
            part = (x[:, i : i + 1] for x in steps)
            _, s = chunk_kimi_delta_attention(*part, initial_state=s, output_final_state=True)

    def decode_before():
        cs = [dataclasses.replace(c, rows=None) for c in caches]
        for i in range(args.steps):
            step = (x[:, i] for x in steps)
            _, cs = gated_delta_rule(*step, [1] * b, cs, keep_caches=True, row_decode=False)

    def decode_recurrent():
        s = state
        for i in range(args.steps):
            _, s = recurrent_kimi_delta_attention(*(x[:, i : i + 1] for x in steps), s, True)

    timed = {
        "prefill": {
            "aligned": lambda: gated_delta_rule(*flat, [args.prefill] * b),
            "chunk": lambda: chunk_kimi_delta_attention(q, k, v, g, beta, output_final_state=True),
            "recurrent": lambda: recurrent_kimi_delta_attention(q, k, v, g, beta, None, True),
        },
        "decode": {"aligned": decode_aligned, "chunk": decode_chunk, "recurrent": decode_recurrent},
    }
    if args.before:  # (prefill keeps no caches: the same code before and after, a check of the noise)
        lens = [args.prefill] * b
        timed["prefill"]["aligned_before"] = lambda: gated_delta_rule(*flat, lens, row_decode=False)
        timed["decode"]["aligned_before"] = decode_before
    return timed, {"prefill": b * args.prefill, "decode": b * args.steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("heads", 16), ("head-dim", 128), ("batch", 2), ("prefill", 256),
                          ("context", 100), ("steps", 32), ("repeats", 3), ("threads", 1)):  # fmt: skip
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--before", action="store_true", help="also time decode as before the row path")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    timed, tokens = forms(args)
    for phase in timed.values():  # warm-up (first-call costs, the allocator)
        for fn in phase.values():
            fn()
    times = {p: {f: [] for f in timed[p]} for p in timed}
    for rnd in range(args.repeats):
        for p, phase in timed.items():
            order = list(phase.items())
            # each round starts with another form: the first after a phase change pays for the memory the
            # others freed (on this VM freed pages go back to the host), so no form always goes first
            for f, fn in order[rnd % len(order) :] + order[: rnd % len(order)]:
                times[p][f].append(cpu_time(fn))
    result = {"shape": {**vars(args), "dtype": "float32"}}
    result["shape"].pop("json")
    for p in timed:
        med = {f: statistics.median(ts) for f, ts in times[p].items()}
        result[p] = {f"{f}_tokens_per_s": round(tokens[p] / med[f], 1) for f in med}
        for other in ("chunk", "recurrent", "aligned_before"):
            if other not in times[p]:
                continue
            ratios = [a / o for a, o in zip(times[p]["aligned"], times[p][other], strict=True)]
            result[p][f"aligned_time_over_{other}"] = round(statistics.median(ratios), 3)
    # which row-path form decoded (the check's verdict per shape; None: decoded by chunks)
    result["decode"]["row_form"] = {str(k): f for k, f in delta_rule._row_verdicts.items()}
    print(json.dumps(result, indent=2) if args.json else result)


if __name__ == "__main__":
    main()
