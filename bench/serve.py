"""Throughput of ``rz serve`` (HTTP, OpenAI /v1/completions) against the same engine called in-process.

The same config builds both (``rz_agents.cli.serve.build_server``): the server runs as its own process
(``python -m rz_agents.cli serve``); B concurrent requests (token prompts of --prompt-len, --gen new tokens,
temperature 1, a seed each) go to it from an asyncio httpx client, and the same B requests go to an
in-process engine with ``generate_batch``. Throughput = generated tokens / wall time of the whole workload;
also per CPU-second of the process that runs the engine (the server's own /proc counters; the client's time
is not counted). One warm-up round, then one measured run per batch size (a shared machine's wall time
moves with its neighbours: read the CPU ratio first).

    python bench/serve.py --batches 16 64 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK  # utime + stime


def _requests(n: int, prompt_len: int, gen: int, vocab: int = 256) -> list[dict]:
    import random

    rng = random.Random(0)
    return [
        {
            "prompt": [rng.randrange(vocab) for _ in range(prompt_len)],
            "max_tokens": gen,
            "seed": i,
            "temperature": 1.0,
        }
        for i in range(n)
    ]


def in_process(config: str, overrides: list[str], reqs: list[dict], slots: int) -> dict:
    from rz_agents.cli.serve import build_server
    from rz_agents.engine import SamplingParams, generate_batch

    _, engine = build_server(config, overrides, max_running=slots)
    params = [
        SamplingParams(max_tokens=r["max_tokens"], seed=r["seed"], temperature=r["temperature"]) for r in reqs
    ]
    prompts = [r["prompt"] for r in reqs]
    generate_batch(engine, prompts[:2], params[:2])  # warm-up
    t0, c0 = time.perf_counter(), time.process_time()
    outs = generate_batch(engine, prompts, params)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(len(o.tokens) for o in outs)
    return _rates(tokens, wall, cpu)


def _rates(tokens: int, wall: float, cpu: float) -> dict:
    return {
        "tokens": tokens,
        "wall_s": wall,
        "cpu_s": cpu,
        "tok_per_s": tokens / wall,
        "tok_per_cpu_s": tokens / cpu,
    }


async def _post_all(url: str, model: str, reqs: list[dict]) -> int:
    import httpx

    limits = httpx.Limits(max_connections=len(reqs))
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def one(r):
            resp = await client.post(url, json={"model": model, "return_token_ids": True, **r})
            resp.raise_for_status()
            return len(resp.json()["choices"][0]["token_ids"])

        return sum(await asyncio.gather(*(one(r) for r in reqs)))


def served(config: str, overrides: list[str], reqs: list[dict], slots: int, port: int) -> dict:
    import httpx

    cmd = [sys.executable, "-m", "rz_agents.cli", "serve", config, *overrides, "--port", str(port)]
    cmd += ["--max-running", str(slots), "--model-name", "bench"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        url = f"http://127.0.0.1:{port}/v1/completions"
        asyncio.run(_post_all(url, "bench", reqs[:2]))  # warm-up
        t0, c0 = time.perf_counter(), _cpu_s(proc.pid)
        tokens = asyncio.run(_post_all(url, "bench", reqs))
        wall, cpu = time.perf_counter() - t0, _cpu_s(proc.pid) - c0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return _rates(tokens, wall, cpu)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=str(ROOT / "configs" / "openai-agent.yaml"))
    parser.add_argument(
        "overrides", nargs="*", help="config overrides (e.g. model.tiny_overrides.hidden_size=512)"
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--port", type=int, default=18600)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # the server pins the config's num_threads (1 in openai-agent.yaml)
    rows = []
    for b in args.batches:
        reqs = _requests(b, args.prompt_len, args.gen)
        engine = in_process(args.config, args.overrides, reqs, slots=b)
        http = served(args.config, args.overrides, reqs, slots=b, port=args.port)
        rows.append(
            {
                "batch": b,
                "engine": engine,
                "serve": http,
                "ratio_wall": http["tok_per_s"] / engine["tok_per_s"],
                "ratio_cpu": http["tok_per_cpu_s"] / engine["tok_per_cpu_s"],
            }
        )
        r = rows[-1]
        print(
            f"b{b}: engine {engine['tok_per_s']:.0f} tok/s ({engine['tok_per_cpu_s']:.0f}/cpu-s), rz serve "
            f"{http['tok_per_s']:.0f} tok/s ({http['tok_per_cpu_s']:.0f}/cpu-s): ratio wall "
            f"{r['ratio_wall']:.2f}, cpu {r['ratio_cpu']:.2f}",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
