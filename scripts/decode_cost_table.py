#!/usr/bin/env python3
"""The cost model's decode-step figures per card: bound, Triton bound and estimate (no GPU needed).

    python3 scripts/decode_cost_table.py                       # Qwen3-4B, b1/16/48/128 x 2K/8K, H100 + H200
    python3 scripts/decode_cost_table.py --cards "NVIDIA A100-SXM4-80GB" --batches 48 --contexts 2048
    python3 scripts/decode_cost_table.py --json out.json

bound: bytes a step must read / the card's datasheet bandwidth (no step is faster). triton bound: the
engine's Triton launches alone at that bandwidth with a 2 us floor each (a lower bound too). estimate: every
kernel (Triton at the card's achievable bandwidth, the other aten kernels of the captured graph), the
sampler's draw and the host gap between steps (rz_agents.compile_check.predict: its constants and their
calibration). Each step is recorded once on meta tensors and costed for every card.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "kernels")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen3-4b", help="a preset name (rz_agents.model.presets)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 48, 128])
    p.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192])
    p.add_argument("--cards", nargs="+", default=["NVIDIA H100 80GB HBM3", "NVIDIA H200"])
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args()

    from rz_agents.compile_check.predict import record_decode_step, step_figures
    from rz_agents.model.presets import preset_config

    cfg = preset_config(args.model, max_position_embeddings=max(args.contexts) + 128)
    rows = []
    print(f"{args.model} decode step (ms; tokens/s of the estimate; est/bound = the bound's share of it)")
    print(f"{'card':24s} {'batch':>5s} {'ctx':>5s} {'bound':>7s} {'triton':>7s} {'estimate':>8s} "
          f"{'est/bound':>9s} {'tok/s est':>9s}")  # fmt: skip
    for context in args.contexts:
        for batch in args.batches:
            step = record_decode_step(cfg, batch, context)
            for card in args.cards:
                f = step_figures(step, card)
                f.pop("by_kernel", None)
                rows.append(f)
                print(
                    f"{f['card'][:24]:24s} {batch:5d} {context:5d} {f['bound_ms']:7.2f} "
                    f"{f['triton_bound_ms']:7.2f} {f['estimate_ms']:8.2f} "
                    f"{f['estimate_fraction_of_bound']:9.2f} {f['estimate_tokens_per_s']:9.0f}"
                )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
