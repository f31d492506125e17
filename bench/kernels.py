"""Kernel benchmark: aligned vs standard op set, and ours vs HF transformers, measured in one run.

Config: Qwen3 architecture, hidden 512, 8 layers, 8 heads / 4 KV heads, head_dim 64,
intermediate 1536, vocab 151,936. Prints throughput ratios (higher = ours faster).

- train: the learner's forward (no grad) of --seqs packed sequences of --seq-len tokens, to per-token
  log-probs of tokens[1:]. HF gets the same job the same way: its decoder on a right-padded batch,
  then the LM head + log-softmax on the real rows in the same LOGIT_CHUNK-row chunks as ours.
- decode: one batched decode step of --decode-batch sequences with --context cached tokens each,
  model forward + LM head + log-softmax (the engine's step without the sampler).
- fused: the aligned decode step with the q/k/v and gate/up projections fused (one GEMM each over
  stacked weights, as the engine runs them) vs separate GEMMs (`fused_over_unfused_decode`), and the
  projections alone at the decode batch (`fused_over_unfused_projections`).
- LM head: one GEMM over the decode batch's rows vs the engine's former row chunks (LOGIT_CHUNK_BYTES of
  fp32 logits each, 24 rows at this vocab), each chunk re-reading the weight (`lm_head_once_over_row_chunks`).

Each quantity is timed in CPU seconds (this process) over --repeats interleaved rounds (aligned,
standard and HF back to back in every round); a ratio is the median over rounds of that round's ratio.

  python bench/kernels.py --json
  python bench/kernels.py --json --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from bench_model import bench_config  # bench/ is on sys.path when run as a script

from rz_agents.engine.runner import LOGIT_CHUNK_BYTES
from rz_agents.model import Transformer
from rz_agents.model.kv_cache import sequence_cache
from rz_agents.model.logprobs import LOGIT_CHUNK, packed_token_logprobs, token_logprobs


def cpu_time(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def train_forward(model: Transformer, seqs: list[torch.Tensor]) -> None:
    with torch.no_grad():
        packed_token_logprobs(model, seqs)


def hf_train_forward(hf, seqs: list[torch.Tensor]) -> None:
    """HF's usual training batch (right-padded [B, S] with an attention mask), log-probs of tokens[1:]
    computed like ours: the LM head and log-softmax in LOGIT_CHUNK-row chunks of the real rows."""
    width = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
        mask[i, : len(s)] = 1
    with torch.no_grad():
        hidden = hf.model(input_ids=tokens, attention_mask=mask).last_hidden_state
        keep = mask.clone()
        keep[torch.arange(len(seqs)), mask.sum(1) - 1] = 0  # each sequence's last row predicts nothing
        rows = hidden[keep.bool()]
        targets = torch.cat([s[1:] for s in seqs])
        for i in range(0, rows.shape[0], LOGIT_CHUNK):
            logits = hf.lm_head(rows[i : i + LOGIT_CHUNK]).float()
            torch.log_softmax(logits, -1).gather(-1, targets[i : i + LOGIT_CHUNK, None])


class DecodeBench:
    """A batch of sequences with `context` cached tokens; `step()` runs one batched decode step."""

    def __init__(self, model: Transformer, batch: int, context: int, vocab: int) -> None:
        self.model = model
        self.cache = sequence_cache(model.config, batch, context + 1)  # a paged cache, pages in order
        gen = torch.Generator().manual_seed(0)
        prompts = torch.randint(0, vocab, (batch, context), generator=gen)
        with torch.no_grad():
            for i in range(batch):  # prefill each sequence (the cache is shared by both op sets:
                # only timing matters here, and a decode step rewrites only position `context`)
                model(prompts[i], torch.arange(context), torch.full((context,), i), kv_cache=self.cache)
        self.last = prompts[:, -1]
        self.slots = torch.arange(batch)
        self.pos = torch.full((batch,), context)

    def step(self) -> None:
        with torch.no_grad():
            h = self.model(self.last, self.pos, self.slots, kv_cache=self.cache)
            token_logprobs(self.model, h, self.last)


def projections(model: Transformer, x: torch.Tensor, fused: bool) -> None:
    """Every layer's q/k/v and gate/up projections of x: stacked GEMMs (fused) or one GEMM per weight."""
    ops = model.ops
    with torch.no_grad():
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            if fused:
                attn.qkv(x, ops)
                mlp.gate_up(x, ops)
            else:
                for m in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
                    ops.linear(x, m.weight)


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
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds after a warm-up round")
    ap.add_argument("--decode-steps", type=int, default=4, help="decode steps timed per round and op set")
    ap.add_argument("--no-hf", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    cfg = bench_config(args.vocab, args.dtype)
    model = Transformer(cfg)
    model.reset_parameters(seed=0)
    model.eval()
    model.verify_kernels()  # the GEMM guard's one-off cost, outside the timings
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, args.vocab, (args.seq_len,), generator=gen) for _ in range(args.seqs)]
    tokens = sum(len(s) for s in seqs)
    decode = DecodeBench(model, args.decode_batch, args.context, args.vocab)

    hf = None
    if not args.no_hf:
        import tempfile

        from transformers import AutoModelForCausalLM

        from rz_agents.model.checkpoint import save_hf_checkpoint

        with tempfile.TemporaryDirectory() as tmp:
            save_hf_checkpoint(model, tmp)
            hf = AutoModelForCausalLM.from_pretrained(tmp, dtype=cfg.torch_dtype).eval()

    model.fuse_projections()  # stacked storage (the parameters become views); toggled per timing below
    model.verify_kernels()
    model.fuse_projections(False)
    x_dec = torch.randn(args.decode_batch, cfg.hidden_size, generator=gen).to(cfg.torch_dtype)
    chunk = max(8, (LOGIT_CHUNK_BYTES // (4 * args.vocab)) // 8 * 8)

    def lm_head(rows: int) -> None:
        with torch.no_grad():
            for _ in range(args.decode_steps):
                for i in range(0, x_dec.shape[0], rows):
                    model.logits(x_dec[i : i + rows])

    load0 = os.getloadavg()[0]
    rounds = []
    for r in range(args.repeats + 1):  # round 0 warms up
        t = {}
        for kernels in ("aligned", "standard"):
            model.set_kernels(kernels)
            t[f"{kernels}_train"] = cpu_time(lambda: train_forward(model, seqs))
            t[f"{kernels}_decode"] = cpu_time(lambda: [decode.step() for _ in range(args.decode_steps)])
        model.set_kernels("aligned")
        # unfused and fused back to back (the same neighbours, caches and heap state for both)
        t["unfused_decode"] = cpu_time(lambda: [decode.step() for _ in range(args.decode_steps)])
        model.fuse_projections()
        t["fused_decode"] = cpu_time(lambda: [decode.step() for _ in range(args.decode_steps)])
        t["fused_projections"] = cpu_time(
            lambda: [projections(model, x_dec, True) for _ in range(args.decode_steps)]
        )
        model.fuse_projections(False)
        t["unfused_projections"] = cpu_time(
            lambda: [projections(model, x_dec, False) for _ in range(args.decode_steps)]
        )
        t["lm_head_once"] = cpu_time(lambda: lm_head(x_dec.shape[0]))
        t["lm_head_row_chunks"] = cpu_time(lambda: lm_head(chunk))
        if hf is not None:
            t["hf_train"] = cpu_time(lambda: hf_train_forward(hf, seqs))
        if r:
            rounds.append(t)
    model.set_kernels("aligned")

    def rate(name: str, work: int) -> float:
        return statistics.median(work / rd[name] for rd in rounds)

    def paired(a: str, b: str) -> float:
        return round(statistics.median(rd[b] / rd[a] for rd in rounds), 3)  # time ratio inverted: speed

    decode_tokens = args.decode_batch * args.decode_steps
    results: dict = {
        "config": {"hidden": 512, "layers": 8, "vocab": args.vocab, "dtype": args.dtype},
        "threads": args.threads,
        "rounds": len(rounds),
        "aligned_train_tokens_per_cpu_s": round(rate("aligned_train", tokens), 1),
        "standard_train_tokens_per_cpu_s": round(rate("standard_train", tokens), 1),
        "aligned_decode_tokens_per_cpu_s": round(rate("aligned_decode", decode_tokens), 1),
        "standard_decode_tokens_per_cpu_s": round(rate("standard_decode", decode_tokens), 1),
        "aligned_over_standard_train": paired("aligned_train", "standard_train"),
        "aligned_over_standard_decode": paired("aligned_decode", "standard_decode"),
        "fused_over_unfused_decode": paired("fused_decode", "unfused_decode"),
        "fused_over_unfused_projections": paired("fused_projections", "unfused_projections"),
        "lm_head_once_over_row_chunks": paired("lm_head_once", "lm_head_row_chunks"),
        "lm_head_row_chunk": chunk,
    }
    if hf is not None:
        results["hf_train_tokens_per_cpu_s"] = round(rate("hf_train", tokens), 1)
        results["ours_over_hf_train"] = paired("aligned_train", "hf_train")
    results["per_round_cpu_s"] = [{k: round(v, 3) for k, v in rd.items()} for rd in rounds]
    results["loadavg_start_end"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    if args.json:
        print(json.dumps(results))
    else:
        for k, v in results.items():
            print(f"{k:36s} {v}")


if __name__ == "__main__":
    main()
