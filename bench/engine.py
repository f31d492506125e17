"""Engine benchmark: generation throughput of rz (aligned, standard), HF generate and vLLM-CPU.

Same model config (Qwen3, hidden 512, 8 layers, 8 heads / 4 KV heads, head_dim 64, intermediate 1536,
vocab 151,669), same random weights (saved once as an HF checkpoint directory and loaded by every
backend), same prompts, same sampling (temperature 1, no top-k/top-p, EOS ignored so every request
generates exactly --gen tokens). Workloads:

  b1, b16, b64   N concurrent requests with --prompt-len token prompts, --gen new tokens each
  multiturn      --episodes concurrent episodes x --turns turns: each turn's prompt is the previous
                 prompt + completion + --obs observation tokens (what an agent rollout does)

Throughput = generated tokens / time of the whole workload (prefill included), best of --repeats,
reported per wall-second and per CPU-second (this process and its children, e.g. vLLM's workers).
Ratios use --metric (default cpu: on a shared machine wall time mostly measures the neighbours;
run with --threads 1 there, as OpenMP spin-waits inflate CPU time when cores are oversubscribed).

  python bench/engine.py --json                 # all backends found, full sizes
  python bench/engine.py --quick                # smaller sizes, for a smoke run
  python bench/engine.py --profile              # where rz aligned spends a batch-64 decode step
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_model import bench_config as shared_bench_config  # bench/ is on sys.path as a script

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams
from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.checkpoint import save_hf_checkpoint

VOCAB = 151_669
VLLM_PYTHON_DEFAULT = "/opt/vllm-venv/bin/python"


def bench_config() -> ModelConfig:
    return shared_bench_config(VOCAB, "float32", eos_token_id=VOCAB - 1)


def make_prompts(n: int, length: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB - 1, (length,), generator=gen).tolist() for _ in range(n)]


def workloads(args) -> dict[str, dict]:
    out = {
        f"b{b}": {"kind": "batch", "prompts": make_prompts(b, args.prompt_len, seed=b)} for b in args.batches
    }
    out["multiturn"] = {
        "kind": "multiturn",
        "prompts": make_prompts(args.episodes, args.prompt_len, seed=1000),
        "obs": make_prompts(args.episodes * args.turns, args.obs, seed=2000),
    }
    return out


def cpu_seconds_tree() -> float:
    """CPU seconds (user + system) used so far by this process and its live descendants.

    On a shared machine wall time mostly measures the neighbours; CPU time measures our work
    (vLLM computes in child processes, so they are counted too).
    """
    ticks = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)
    tree, frontier = {os.getpid()}, [os.getpid()]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _) in stats.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    return sum(stats[pid][1] for pid in tree if pid in stats)


def best_of(repeats: int, fn) -> dict[str, float]:
    """Best wall and best CPU seconds of fn() over repeats runs (after one warm-up run)."""
    fn()
    walls, cpus = [], []
    for _ in range(repeats):
        c0, t0 = cpu_seconds_tree(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(cpu_seconds_tree() - c0)
    return {"wall": min(walls), "cpu": min(cpus)}


def throughput(tokens: int, seconds: dict[str, float]) -> dict[str, float]:
    return {
        "tok_per_s": round(tokens / seconds["wall"], 1),
        "tok_per_cpu_s": round(tokens / seconds["cpu"], 1),
    }


# -- rz ------------------------------------------------------------------------------------------
def rz_engine(model: Transformer, args, batch: int) -> RZEngine:
    cfg = EngineConfig(
        num_slots=max(batch, args.episodes),
        max_len=args.prompt_len + args.turns * (args.gen + args.obs) + 64,
        max_batch_tokens=args.max_batch_tokens,
        num_threads=args.threads,
        eos_token_ids=(),
    )
    return RZEngine(model, cfg)


def run_rz(model: Transformer, args, spec: dict) -> float:
    """Tokens/s of one workload on a fresh rz engine (a fresh engine: no prefix cache from the warm-up)."""
    params = SamplingParams(temperature=1.0, max_tokens=args.gen, ignore_eos=True)
    n_req = len(spec["prompts"])

    def once():
        engine = rz_engine(model, args, n_req)

        async def batch():
            await asyncio.gather(*(engine.generate(p, params) for p in spec["prompts"]))

        async def episodes():
            async def episode(i: int):
                tokens = list(spec["prompts"][i])
                for turn in range(args.turns):
                    out = await engine.generate(tokens, params)
                    tokens = tokens + out.tokens + spec["obs"][i * args.turns + turn]

            await asyncio.gather(*(episode(i) for i in range(n_req)))

        asyncio.run(batch() if spec["kind"] == "batch" else episodes())

    turns = args.turns if spec["kind"] == "multiturn" else 1
    return throughput(n_req * turns * args.gen, best_of(args.repeats, once))


# -- HF transformers ----------------------------------------------------------------------------
def run_hf(hf_model, args, spec: dict) -> float:
    """Tokens/s with transformers' generate; multi-turn runs each turn as one batched generate."""

    def generate(prompts: list[list[int]]) -> list[list[int]]:
        ids = torch.tensor(prompts)  # equal lengths by construction: no padding needed
        with torch.inference_mode():
            out = hf_model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.gen,
                min_new_tokens=args.gen,
                pad_token_id=0,
            )
        return [row[ids.shape[1] :] for row in out.tolist()]

    def once():
        if spec["kind"] == "batch":
            generate(spec["prompts"])
            return
        prompts = [list(p) for p in spec["prompts"]]
        for turn in range(args.turns):
            outs = generate(prompts)
            prompts = [
                p + o + spec["obs"][i * args.turns + turn]
                for i, (p, o) in enumerate(zip(prompts, outs, strict=True))
            ]

    torch.set_num_threads(args.threads)
    turns = args.turns if spec["kind"] == "multiturn" else 1
    return throughput(len(spec["prompts"]) * turns * args.gen, best_of(args.repeats, once))


# -- vLLM (separate interpreter) -------------------------------------------------------------------
def run_vllm(ckpt: Path, args, specs: dict) -> dict[str, float] | None:
    """Run the vLLM workloads in the vLLM venv's interpreter; None if that interpreter is missing."""
    python = args.vllm_python
    if not python or not Path(python).exists():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = Path(tmp) / "spec.json"
        result_file = Path(tmp) / "result.json"
        spec_file.write_text(json.dumps({"ckpt": str(ckpt), "args": vars(args), "workloads": specs}))
        root = Path(__file__).resolve().parents[1]
        env = {**os.environ, "PYTHONPATH": f"{root}:{root / 'kernels'}", "OMP_NUM_THREADS": str(args.threads)}
        cmd = [python, str(Path(__file__).resolve()), "--vllm-worker", str(spec_file), str(result_file)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.vllm_timeout)
        if proc.returncode != 0 or not result_file.exists():
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
            raise RuntimeError(f"vLLM benchmark failed (exit {proc.returncode})")
        return json.loads(result_file.read_text())


def vllm_worker(spec_file: str, result_file: str) -> None:
    """Inside the vLLM venv: run every workload on a VLLMEngine and write tokens/s as JSON."""
    from types import SimpleNamespace

    from rz_agents.engine.vllm_backend import VLLMEngine

    spec = json.loads(Path(spec_file).read_text())
    args = SimpleNamespace(**spec["args"])
    max_len = args.prompt_len + args.turns * (args.gen + args.obs) + 64
    engine = VLLMEngine(
        spec["ckpt"], max_len=max_len, dtype="float32", max_num_seqs=max(max(args.batches), args.episodes)
    )
    params = SamplingParams(temperature=1.0, max_tokens=args.gen, ignore_eos=True)
    results = {}
    for name, wl in spec["workloads"].items():

        def once(wl=wl):
            async def batch():
                outs = await asyncio.gather(*(engine.generate(p, params) for p in wl["prompts"]))
                assert all(len(o.tokens) == args.gen for o in outs), [o.finish_reason for o in outs]

            async def episodes():
                async def episode(i: int):
                    tokens = list(wl["prompts"][i])
                    for turn in range(args.turns):
                        out = await engine.generate(tokens, params)
                        tokens = tokens + out.tokens + wl["obs"][i * args.turns + turn]

                await asyncio.gather(*(episode(i) for i in range(len(wl["prompts"]))))

            asyncio.run(batch() if wl["kind"] == "batch" else episodes())

        turns = args.turns if wl["kind"] == "multiturn" else 1
        results[name] = throughput(len(wl["prompts"]) * turns * args.gen, best_of(args.repeats, once))
    engine.close()
    Path(result_file).write_text(json.dumps(results))


# -- profile ------------------------------------------------------------------------------------
def profile_decode(model: Transformer, args, batch: int = 64) -> str:
    """Top ops of rz aligned decode steps at the given batch (torch profiler table)."""
    engine = rz_engine(model, args, batch)
    params = SamplingParams(temperature=1.0, max_tokens=args.gen, ignore_eos=True)
    prompts = make_prompts(batch, args.prompt_len, seed=batch)

    async def main():
        tasks = [asyncio.create_task(engine.generate(p, params)) for p in prompts]
        while not engine.scheduler.running or engine.scheduler.running[0].num_pending > 1:
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(8):
                engine.step()
        await asyncio.gather(*tasks)
        return prof

    prof = asyncio.run(main())
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else round(a / b, 3)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--vllm-worker":
        vllm_worker(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--obs", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-batch-tokens", type=int, default=512)
    ap.add_argument("--backends", nargs="+", default=["rz_aligned", "rz_standard", "hf", "vllm"])
    ap.add_argument("--vllm-python", default=os.environ.get("RZ_VLLM_PYTHON", VLLM_PYTHON_DEFAULT))
    ap.add_argument("--vllm-timeout", type=int, default=1800)
    ap.add_argument(
        "--metric",
        choices=["cpu", "wall"],
        default="cpu",
        help="ratios from tokens per CPU-second (default; robust on a shared machine) or per wall-second",
    )
    ap.add_argument("--profile", action="store_true", help="print where rz aligned spends a b64 decode step")
    args = ap.parse_args()
    if args.quick:
        args.gen, args.prompt_len, args.episodes, args.turns, args.obs, args.repeats = 16, 32, 8, 2, 16, 1
    torch.set_num_threads(args.threads)

    cfg = bench_config()
    model = Transformer(cfg, kernels="aligned")
    model.reset_parameters(seed=0)
    model.eval()
    if args.profile:
        print(profile_decode(model, args))
        return
    specs = workloads(args)
    results: dict[str, dict[str, float] | None] = {}
    t_start = time.time()
    for backend in args.backends:
        if backend in ("rz_aligned", "rz_standard"):
            model.set_kernels(backend.removeprefix("rz_"))
            results[backend] = {name: run_rz(model, args, spec) for name, spec in specs.items()}
            model.set_kernels("aligned")
        elif backend == "hf":
            from transformers import Qwen3ForCausalLM

            with tempfile.TemporaryDirectory() as tmp:
                save_hf_checkpoint(model, Path(tmp) / "ckpt")
                hf = Qwen3ForCausalLM.from_pretrained(Path(tmp) / "ckpt", dtype=torch.float32).eval()
            results["hf"] = {name: run_hf(hf, args, spec) for name, spec in specs.items()}
            del hf
        elif backend == "vllm":
            with tempfile.TemporaryDirectory() as tmp:
                ckpt = save_hf_checkpoint(model, Path(tmp) / "ckpt")
                results["vllm"] = run_vllm(ckpt, args, specs)
        else:
            raise SystemExit(f"unknown backend {backend!r}")
        if not args.json:
            print(f"{backend}: {results[backend]}", flush=True)

    def get(backend, workload):
        return ((results.get(backend) or {}).get(workload) or {}).get(metric)

    metric = "tok_per_cpu_s" if args.metric == "cpu" else "tok_per_s"

    summary = {
        "config": {
            k: getattr(cfg, k) for k in ("hidden_size", "num_hidden_layers", "head_dim", "vocab_size")
        },
        "workload": {
            k: getattr(args, k) for k in ("batches", "prompt_len", "gen", "episodes", "turns", "obs")
        },
        "threads": args.threads,
        "ratio_metric": metric,
        "results": results,
        "rz_over_hf_b64": ratio(get("rz_aligned", "b64"), get("hf", "b64")),
        "rz_over_vllm_b64": ratio(get("rz_aligned", "b64"), get("vllm", "b64")),
        "aligned_over_standard_b64": ratio(get("rz_aligned", "b64"), get("rz_standard", "b64")),
        "rz_over_hf_multiturn": ratio(get("rz_aligned", "multiturn"), get("hf", "multiturn")),
        "rz_over_vllm_multiturn": ratio(get("rz_aligned", "multiturn"), get("vllm", "multiturn")),
        "seconds": round(time.time() - t_start, 1),
    }
    print(json.dumps(summary, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
