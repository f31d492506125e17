"""Kernel benchmark: aligned vs standard op set, and ours vs HF transformers, measured in one run.

Config: Qwen3 architecture, hidden 512, 8 layers, 8 heads / 4 KV heads, head_dim 64,
intermediate 1536, vocab 151,936. Prints throughput ratios (higher = ours faster).

  python bench/kernels.py --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from bench_model import bench_config  # bench/ is on sys.path when run as a script

from rz_agents.model import KVCache, Transformer
from rz_agents.model.logprobs import packed_token_logprobs, token_logprobs


def timeit(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def train_forward(model: Transformer, seqs: list[torch.Tensor]) -> None:
    with torch.no_grad():
        packed_token_logprobs(model, seqs)


def hf_train_forward(hf, seqs: list[torch.Tensor]) -> None:
    # HF's usual training batch: right-padded [B, S] with an attention mask; logprobs of tokens[1:].
    width = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
        mask[i, : len(s)] = 1
    with torch.no_grad():
        logits = hf(input_ids=tokens, attention_mask=mask).logits[:, :-1].float()
        torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None])


def decode_steps(model: Transformer, batch: int, context: int, steps: int, vocab: int) -> float:
    """Seconds per batched decode step (batch sequences, each with `context` cached tokens)."""
    cache = KVCache(model.config, num_slots=batch, max_len=context + steps + 1)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, vocab, (batch, context), generator=gen)
    slots = torch.arange(batch)
    with torch.no_grad():
        for i in range(batch):  # prefill each sequence
            model(prompts[i], torch.arange(context), torch.full((context,), i), kv_cache=cache)
        last = prompts[:, -1]
        times = []
        for s in range(steps):
            pos = torch.full((batch,), context + s)
            t0 = time.perf_counter()
            h = model(last, pos, slots, kv_cache=cache)
            token_logprobs(model, h, last)
            times.append(time.perf_counter() - t0)
    return statistics.median(times[1:] if len(times) > 1 else times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seqs", type=int, default=8, help="sequences per training batch")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--decode-batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    cfg = bench_config(args.vocab, args.dtype)
    model = Transformer(cfg)
    model.reset_parameters(seed=0)
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, args.vocab, (args.seq_len,), generator=gen) for _ in range(args.seqs)]
    tokens = sum(len(s) for s in seqs)

    results: dict = {
        "config": {"hidden": 512, "layers": 8, "vocab": args.vocab, "dtype": args.dtype},
        "threads": args.threads,
    }
    for kernels in ("aligned", "standard"):
        model.set_kernels(kernels)
        t = timeit(lambda: train_forward(model, seqs), args.repeats)
        results[f"{kernels}_train_tokens_per_s"] = tokens / t
        d = decode_steps(model, args.decode_batch, args.context, 6, args.vocab)
        results[f"{kernels}_decode_tokens_per_s"] = args.decode_batch / d

    import tempfile

    from transformers import AutoModelForCausalLM

    from rz_agents.model.checkpoint import save_hf_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        save_hf_checkpoint(model, tmp)
        hf = AutoModelForCausalLM.from_pretrained(tmp, dtype=cfg.torch_dtype).eval()
    t = timeit(lambda: hf_train_forward(hf, seqs), args.repeats)
    results["hf_train_tokens_per_s"] = tokens / t

    results["aligned_over_standard_train"] = (
        results["aligned_train_tokens_per_s"] / results["standard_train_tokens_per_s"]
    )
    results["aligned_over_standard_decode"] = (
        results["aligned_decode_tokens_per_s"] / results["standard_decode_tokens_per_s"]
    )
    results["ours_over_hf_train"] = results["aligned_train_tokens_per_s"] / results["hf_train_tokens_per_s"]
    if args.json:
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in results.items()}))
    else:
        for k, v in results.items():
            print(f"{k:36s} {v:.3f}" if isinstance(v, float) else f"{k:36s} {v}")


if __name__ == "__main__":
    main()
