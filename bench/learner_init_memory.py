"""Host memory of a sharded learner rank at start-up: the meta-device start vs building the whole model.

Two gloo ranks start a learner (FSDP2, bf16 compute, fp32 shards) from one HF checkpoint, each way in fresh
processes:
- full: every rank loads the whole checkpoint as a bf16 model, casts it to fp32 and shards it (the path
  before the meta start; with 30B-A3B that is ~61 GB + ~122 GB per rank);
- meta: every rank shards a meta-device skeleton, allocates its fp32 shards and cuts them from the
  checkpoint one tensor at a time (``LazyState``).
Reported per way: the ranks' peak resident set while building (VmHWM after a reset, Linux) minus what a rank
held before (the interpreter, torch, the process group), the parameter bytes of the model, and
meta_over_full_peak = meta / full (lower is better; the shards alone are 2 x params / world in fp32 bytes).

  python bench/learner_init_memory.py [--hidden 1024 --layers 8 --vocab 32768] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> float:
    """Reset this process's peak resident set (Linux: clear_refs 5) and return the resident set now."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_mb("VmRSS")


def _rank(rank: int, way: str, store: str, ckpt: str, out: str) -> None:
    import torch.distributed as dist

    from rz_agents.model.checkpoint import LazyState, load_hf_checkpoint, model_skeleton
    from rz_agents.trainer.learner import Learner, LearnerConfig
    from rz_agents.trainer.sharding import ShardedRanks

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    ranks = ShardedRanks()
    base = _reset_peak()
    if way == "full":
        learner = Learner(load_hf_checkpoint(ckpt, dtype="bfloat16"), LearnerConfig(), ranks=ranks)
    else:
        learner = Learner(model_skeleton(ckpt, dtype="bfloat16"), LearnerConfig(), ranks=ranks)
        learner.replace_weights(LazyState(ckpt, torch.bfloat16))
    peak = _status_mb("VmHWM") - base
    shard_mb = sum(p.to_local().numel() * 4 for p in learner.params) / 2**20
    Path(out, f"{way}{rank}.json").write_text(json.dumps({"peak_mb": peak, "shard_mb": shard_mb}))
    dist.destroy_process_group()


def _run(way: str, ckpt: str, tmp: str) -> dict:
    ctx = mp.get_context("spawn")
    store = tempfile.mktemp(dir=tmp)
    procs = [ctx.Process(target=_rank, args=(r, way, store, ckpt, tmp)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise SystemExit(f"{way}: a rank failed")
    rows = [json.loads(Path(tmp, f"{way}{r}.json").read_text()) for r in range(2)]
    return {"peak_mb": max(r["peak_mb"] for r in rows), "shard_mb": rows[0]["shard_mb"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from rz_agents.model import ModelConfig, Transformer
    from rz_agents.model.checkpoint import save_hf_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        cfg = ModelConfig.tiny(
            "qwen3", hidden_size=args.hidden, intermediate_size=3 * args.hidden,
            num_hidden_layers=args.layers, vocab_size=args.vocab, num_attention_heads=8,
            num_key_value_heads=4, head_dim=args.hidden // 8,
            dtype="bfloat16",
        )  # fmt: skip
        with torch.device("meta"):
            n_params = Transformer(cfg, init=False).num_parameters()
        model = Transformer(cfg)
        model.reset_parameters(std=0.02, seed=0)
        ckpt = str(save_hf_checkpoint(model, Path(tmp) / "ckpt"))
        del model
        result = {"params": n_params, "param_mb_bf16": n_params * 2 / 2**20}
        for way in ("full", "meta"):
            result[way] = _run(way, ckpt, tmp)
        result["meta_over_full_peak"] = result["meta"]["peak_mb"] / max(result["full"]["peak_mb"], 1e-9)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"model: {n_params / 1e6:.0f}M parameters ({result['param_mb_bf16']:.0f} MB in bf16), 2 ranks")
        for way in ("full", "meta"):
            r = result[way]
            print(f"{way:5s}: rank peak +{r['peak_mb']:.0f} MB (its fp32 shards: {r['shard_mb']:.0f} MB)")
        print(f"meta_over_full_peak: {result['meta_over_full_peak']:.2f}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
