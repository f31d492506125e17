"""Evaluate a trained policy on a task file with the tool, using its run's tokenizer and chat template.

`rz eval` reads a checkpoint's own tokenizer.json; the CPU demo's policy uses the byte tokenizer of its
run config instead, so the experiments evaluate through the same library call (``run_math_eval``) with
the policy assembled from the run's config.yaml:

    python3 experiments/eval_policy.py RUN_DIR --tasks FILE.jsonl --k 4 --out eval.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, help="a run directory (config.yaml + final_model/)")
    p.add_argument("--model", default="final_model", help="checkpoint folder inside the run directory")
    p.add_argument("--tasks", required=True, help="JSONL of {id, question, answer}")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--dtype", default=None, help="model dtype (default: the run's model.dtype)")
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()

    import torch
    import yaml

    from rz_agents.eval.checkpoint_policy import CheckpointPolicy
    from rz_agents.eval.math import run_math_eval
    from rz_agents.eval.math_config import MathEvalConfig
    from rz_agents.model.checkpoint import load_hf_checkpoint
    from rz_agents.runtime.factories import build_tokenizer

    torch.set_num_threads(args.num_threads)
    run_cfg = yaml.safe_load((args.run_dir / "config.yaml").read_text())
    model_cfg = run_cfg.get("model", {})
    dtype = args.dtype or model_cfg.get("dtype", "float32")
    kernels = model_cfg.get("kernels", "aligned")
    checkpoint = args.run_dir / args.model
    tokenizer, template = build_tokenizer(run_cfg.get("tokenizer", "byte"), str(checkpoint))
    model = load_hf_checkpoint(checkpoint, kernels=kernels, dtype=dtype).eval()
    policy = CheckpointPolicy(model, tokenizer, template, f"{args.run_dir.name}/{args.model}")
    env_kwargs = run_cfg.get("env", {}).get("kwargs", {})
    config = MathEvalConfig(
        checkpoint=str(checkpoint),
        benchmark=args.tasks,
        k=args.k,
        tool=True,
        temperature=args.temperature,
        top_p=1.0,
        max_tokens=args.max_tokens,
        max_turns=args.max_turns,
        seed=args.seed,
        num_threads=args.num_threads,
        kernels=kernels,
        dtype=dtype,
        thinking=False,
        system_prompt=None,
        prompt_style="compact",
        max_running=64,
    )
    if "max_turns" in env_kwargs:
        config.max_turns = int(env_kwargs["max_turns"])
    result = run_math_eval(config, policy)
    result.pop("problems", None)  # per-problem rows are not needed by the experiments
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("avg_at_k", "pass_at_k", "num_samples", "wall_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
