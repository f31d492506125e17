"""CPU time of one warm-start (SFT) step of the tiny Qwen3.5 demo policy: this tree's kernels vs another's.

The step is the warm start's: 32 arithmetic tool-use demonstrations (byte tokenizer, ~4,400 tokens) packed
into one forward (`rz_agents.warmstart.sft._summed_nll`), backward, AdamW; model from
configs/qwen3_5-demo.yaml's `model:` section, `--layers` decoder layers (the last one full attention, the
rest Gated DeltaNet), 1 thread. Each side runs in its own process with PYTHONPATH set to its tree (and its
`kernels/`), in alternating rounds; per side the median forward and backward CPU-seconds (process time:
robust on a shared machine), and the ratio of the medians measured in this one run.

  mkdir /tmp/before && git archive HEAD~1 | tar -x -C /tmp/before   # or any tree to compare with
  python bench/qwen3_5_sft_step.py --before /tmp/before --layers 4 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_side(layers: int, steps: int) -> dict:
    """Run in a child process: time `steps` SFT steps after one warm-up step."""
    import torch
    import yaml

    from rz_agents.config_io import from_dict
    from rz_agents.runtime.config import ModelSpec
    from rz_agents.runtime.factories import build_model, build_tokenizer
    from rz_agents.warmstart.demos import arithmetic_tool_demos
    from rz_agents.warmstart.sft import _summed_nll

    torch.set_num_threads(1)
    raw = yaml.safe_load((ROOT / "rz_agents/configs/qwen3_5-demo.yaml").read_text())["model"]
    raw["tiny_overrides"]["num_hidden_layers"] = layers
    raw["tiny_overrides"]["layer_types"] = ["linear_attention"] * (layers - 1) + ["full_attention"]
    tokenizer, template = build_tokenizer("byte")
    model = build_model(from_dict(ModelSpec, raw), tokenizer.vocab_size)
    demos = arithmetic_tool_demos(tokenizer, template, 32, seed=0, difficulty=1, tool_fraction=1.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fwd, bwd, losses = [], [], []
    for i in range(steps + 1):
        opt.zero_grad()
        t0 = time.process_time()
        nll = _summed_nll(model, demos)
        t1 = time.process_time()
        nll.backward()
        t2 = time.process_time()
        opt.step()
        if i:  # the first step allocates optimizer state
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
        losses.append(float(nll.detach()))
    return {"fwd": fwd, "bwd": bwd, "losses": losses, "tokens": sum(len(d.tokens) for d in demos)}


def run_side(tree: Path, layers: int, steps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{tree}:{tree / 'kernels'}", OMP_NUM_THREADS="1")
    cmd = [sys.executable, __file__, "--child", "--layers", str(layers), "--steps", str(steps)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=tree).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="the tree to compare with (a checkout of another commit)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per process")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_side(args.layers, args.steps)))
        return
    sides = {"after": ROOT} | ({"before": args.before.resolve()} if args.before else {})
    samples: dict[str, dict[str, list[float]]] = {s: {"fwd": [], "bwd": []} for s in sides}
    losses = {}
    for r in range(args.rounds):
        for name in list(sides)[r % len(sides) :] + list(sides)[: r % len(sides)]:
            res = run_side(sides[name], args.layers, args.steps)
            samples[name]["fwd"] += res["fwd"]
            samples[name]["bwd"] += res["bwd"]
            losses[name] = res["losses"]
    report = {"layers": args.layers, "threads": 1, "tokens_per_step": res["tokens"]}
    for name, s in samples.items():
        f, b = statistics.median(s["fwd"]), statistics.median(s["bwd"])
        report[name] = {"fwd_cpu_s": round(f, 3), "bwd_cpu_s": round(b, 3), "step_cpu_s": round(f + b, 3)}
    if "before" in report:
        report["after/before step cpu"] = round(
            report["after"]["step_cpu_s"] / report["before"]["step_cpu_s"], 3
        )
        bwd = report["after"]["bwd_cpu_s"] / report["before"]["bwd_cpu_s"]
        report["after/before bwd cpu"] = round(bwd, 3)
        report["same losses (forward bits)"] = losses["after"] == losses["before"]
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
