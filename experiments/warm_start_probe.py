"""Probe one phase of a config's synthetic warm start: train it on the config's model (its random init, or a
checkpoint) and measure, every few steps, what the policy will do in RL, on held-out demonstrations:

* ``p_call``: the mean probability of the first token of a tool call (how often the policy calls its tool);
* ``tool_turn0``: mean NLL per token of the call turn (the question's expression copied into the call);
* ``tool_turn1``: mean NLL per token of the answer turn after the tool's result (its output into \\boxed{});
* ``direct_turn0``: mean NLL per token of a direct (guessed) answer.

It saves the phase's model at the steps asked and at its end (HF checkpoint folders, ``rz eval --checkpoint``
reads them), so each phase can be probed from the one before without repeating it. Tells why a warm start
leaves a policy RL cannot improve (experiments/results/qwen3_5_demo_prior_phase/):

    python experiments/warm_start_probe.py configs/qwen3_5-demo.yaml /tmp/probe/format --phase format
    python experiments/warm_start_probe.py configs/qwen3_5-demo.yaml /tmp/probe/prior --phase prior \\
        --init /tmp/probe/format/step564 --probe-every 5 warm_start.prior_lr=0.001
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rz_agents.cli.train import load_run_config
from rz_agents.model.checkpoint import save_hf_checkpoint
from rz_agents.model.logprobs import pack, token_logprobs
from rz_agents.model.policy import PolicySpec, build_policy
from rz_agents.runtime.factories import build_model, build_tokenizer, tokenizer_files, vocab_size
from rz_agents.warmstart import DEMO_TASKS, supervised_warm_start
from rz_agents.warmstart.demos import Demonstration

HELD_OUT_SEED = 777  # the warm start's own demonstrations use seeds 0 (format) and 1 (prior)


def turn_figures(model: torch.nn.Module, demos: Sequence[Demonstration]) -> dict[str, float]:
    """Held-out figures of ``demos`` under ``model`` (see the module docstring), one sequence per forward."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}

    def add(key: str, value: float) -> None:
        sums[key] = sums.get(key, 0.0) + value
        counts[key] = counts.get(key, 0) + 1

    was_training = model.training
    model.eval()
    with torch.no_grad():
        for d in demos:
            tokens, positions, seq_ids = pack([d.tokens])
            logp = token_logprobs(model, model(tokens, positions, seq_ids)[:-1], tokens[1:])
            turn, inside = -1, False
            for t in range(1, len(d.tokens)):
                if d.loss_mask[t] and not inside:
                    turn += 1
                    if turn == 0 and d.uses_tool:
                        add("p_call", float(logp[t - 1].exp()))
                inside = d.loss_mask[t]
                if inside:
                    add(f"{'tool' if d.uses_tool else 'direct'}_turn{turn}", -float(logp[t - 1]))
    model.train(was_training)
    return {k: round(sums[k] / counts[k], 4) for k in sorted(sums)}


def _model(cfg: Any, tokenizer: Any, init: str | None) -> torch.nn.Module:
    if init:
        return build_policy(PolicySpec(checkpoint=init, kernels=cfg.model.kernels, dtype=None), "cpu")
    return build_model(cfg.model, vocab_size(cfg.tokenizer, tokenizer))


def main(argv: list[str] | None = None) -> int:
    """Run the probe; prints one JSON line per probe and writes ``OUT/probe.jsonl`` and the checkpoints."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", help="a training config with a synthetic warm start (warm_start.demos > 0)")
    ap.add_argument("out", help="folder for the checkpoints (OUT/stepN) and probe.jsonl")
    ap.add_argument("overrides", nargs="*", help="key.path=value overrides of the config")
    ap.add_argument("--phase", choices=("format", "prior"), default="format")
    ap.add_argument("--init", default=None, help="start from this checkpoint (default: the config's init)")
    ap.add_argument("--save-at", default="", help="comma-separated steps to save besides the last")
    ap.add_argument("--probe-every", type=int, default=0, help="probe every N steps (0: before and after)")
    ap.add_argument("--held-out", type=int, default=48, help="held-out tool demonstrations (and 1/3 direct)")
    args = ap.parse_intermixed_args(argv)
    cfg = load_run_config(args.config, args.overrides)
    ws = cfg.warm_start
    if ws.demos <= 0 or ws.task not in DEMO_TASKS:
        print(f"{args.config}: no synthetic warm start to probe (warm_start.demos, task)", file=sys.stderr)
        return 2
    torch.set_num_threads(ws.num_threads or cfg.num_threads or 1)
    tokenizer, template = build_tokenizer(cfg.tokenizer)
    model = _model(cfg, tokenizer, args.init)
    model.set_kernels(ws.kernels or cfg.model.kernels)
    make = DEMO_TASKS[ws.task]
    kw = dict(difficulty=ws.difficulty)
    held = make(tokenizer, template, args.held_out, seed=HELD_OUT_SEED, tool_fraction=1.0, **kw)
    held += make(tokenizer, template, args.held_out // 3, seed=HELD_OUT_SEED + 1, tool_fraction=0.0, **kw)
    if args.phase == "format":  # the same demonstrations and schedule as rz train's warm start
        demos = make(tokenizer, template, ws.demos, seed=ws.seed, tool_fraction=1.0, **kw)
        phase_kw: dict[str, Any] = {}
    else:
        fraction = ws.tool_fraction
        demos = make(tokenizer, template, ws.prior_demos, seed=ws.seed + 1, tool_fraction=fraction, **kw)
        phase_kw = dict(epochs=1, lr=ws.prior_lr, warmup_steps=0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_at = {int(s) for s in args.save_at.split(",") if s}
    extra = tokenizer_files(cfg.tokenizer, cfg.model.checkpoint)
    t0 = time.perf_counter()
    log = (out / "probe.jsonl").open("w")

    def record(step: int, loss: float | None) -> None:
        row = {"phase": args.phase, "step": step, "train_loss": loss, **turn_figures(model, held)}
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(row), flush=True)
        log.write(json.dumps(row) + "\n")
        log.flush()

    def on_step(step: int, total: int, loss: float) -> None:
        if step == total or (args.probe_every and step % args.probe_every == 0):
            record(step, round(loss, 4))
        if step in save_at or step == total:
            save_hf_checkpoint(model, out / f"step{step}", extra_files=extra)

    record(0, None)
    supervised_warm_start(model, demos, ws, on_step=on_step, **phase_kw)
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
