"""Export a LoRA model as a merged HF checkpoint: base + adapter folded into plain weights.

    python scripts/merge_lora.py CHECKPOINT_DIR OUT_DIR [--adapter PEFT_DIR]

CHECKPOINT_DIR is an HF checkpoint directory; its adapter is CHECKPOINT_DIR/lora_adapter (what rz writes for
a LoRA run) or the PEFT directory given by --adapter. The merged weights compute W + scale * B A rounded once
to the model's dtype: close to the adapted model, not bit-identical, which is why merging is this explicit
step.
"""

from __future__ import annotations

import argparse

from rz_agents.model.checkpoint import save_hf_checkpoint
from rz_agents.model.lora import has_lora, merge_into_base
from rz_agents.model.policy import PolicySpec, build_policy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("out")
    parser.add_argument("--adapter", help="a PEFT adapter directory (default: CHECKPOINT/lora_adapter)")
    args = parser.parse_args(argv)
    model = build_policy(PolicySpec(checkpoint=args.checkpoint, adapter=args.adapter))
    if not has_lora(model):
        parser.error(f"{args.checkpoint} has no lora_adapter/ and no --adapter was given: nothing to merge")
    merge_into_base(model)
    print(save_hf_checkpoint(model, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
