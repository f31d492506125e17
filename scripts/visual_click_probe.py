"""Probe a VisualClick policy checkpoint (docs/visual_envs.md, "Why RL did not learn"): on the demo's task
(2 buttons in columns, the red one named, short prompt) it prints

- the decision: logp(click the red button) - logp(click the other), averaged over pictures with red on the
  left and on the right (a policy that reads the picture separates them; one that does not gives the same
  number for both: its side preference);
- the scale of the tower's output rows against the token embeddings', and their picture-dependent part;
- the RL gradient's signal and noise per module group: g(picture) = d[logp(red click) - logp(other)]/dθ,
  signal = its mean over a balanced set of pictures (what REINFORCE follows in expectation), noise = its
  spread, SNR@16 = signal / (noise / sqrt(16)) for a batch of 16 pictures.

  python scripts/visual_click_probe.py RUN/warm_start_model [--pictures 32]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import gymnasium
import torch

import rz_agents.envs  # noqa: F401  (registers the envs)
from rz_agents.eval.checkpoint_policy import load_checkpoint_policy
from rz_agents.images import message_images, to_png
from rz_agents.model.qwen3_vl import VLSequence, packed_logprobs
from rz_agents.model.vl_processor import png_image_inputs


def _group(name: str) -> str:
    if "visual." in name:
        return "visual." + name.split("visual.")[1].split(".")[0]
    if "language_model.layers" in name:
        return "lm.layers.*." + name.split("layers.")[1].split(".")[1]
    return name.replace("model.language_model.", "lm.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--pictures", type=int, default=32, help="training pictures 0..N-1")
    args = ap.parse_args()
    torch.set_num_threads(1)
    pol = load_checkpoint_policy(args.checkpoint, kernels="standard", tokenizer="byte")
    model, tok, template = pol.model, pol.tokenizer, pol.template
    env = gymnasium.make(
        "rz_agents/VisualClick-v0", image_size=64, n_buttons=2, name_by="color", arrangement="columns",
        target_color="red", system_prompt=False,
    )  # fmt: skip
    stop = template.stop_token_ids(tok)[0]
    grads, z, left, embeds = [], [], [], []
    for i in range(args.pictures):
        messages, info = env.reset(seed=i, options={"task": {"split": "train", "index": i}})
        prompt = template.encode_prompt(tok, messages)
        pngs = [to_png(m) for m in message_images(messages)]
        pixels, grids = png_image_inputs(pngs, model.vl_config.vision)
        target = info["target"]
        buttons = sorted(env.unwrapped.layout.buttons, key=lambda b: b != target)  # the red one first
        seqs = []
        for b in buttons:
            reply = tok.encode(f"click({(b.x0 + b.x1) // 2}, {(b.y0 + b.y1) // 2})")
            seqs.append(VLSequence(prompt + [*reply, stop], grids, pixels))
        model.zero_grad()
        lps = packed_logprobs(model, seqs)
        diff = lps[0][len(prompt) - 1 :].sum() - lps[1][len(prompt) - 1 :].sum()
        diff.backward()
        z.append(float(diff.detach()))
        left.append(target.x0 < 32)
        grads.append({n: p.grad.detach().flatten().clone() for n, p in model.named_parameters()})
        with torch.no_grad():
            embeds.append(model.encode_images(pixels, grids).embeds)
    side = torch.tensor(left)
    lr = torch.where(side, torch.tensor(z), -torch.tensor(z))  # logp(left click) - logp(right click)
    print(
        f"logp(left click) - logp(right click): red left {lr[side].mean():+.5f}, "
        f"red right {lr[~side].mean():+.5f}"
    )
    e = torch.stack(embeds)
    token_rms = float(model.get_input_embeddings().weight.detach().pow(2).mean().sqrt())
    print(
        f"tower output rms {float(e.pow(2).mean().sqrt()):.4f} (token embeddings {token_rms:.4f}); "
        f"picture-dependent part {float((e - e.mean(0)).pow(2).mean().sqrt()):.4f}"
    )
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])

    for name, _ in model.named_parameters():
        g = torch.stack([d[name] for d in grads])
        signal = 0.5 * (g[side].mean(0) + g[~side].mean(0))  # red left / right weighed 50/50
        for key in (_group(name), "all parameters"):
            sums[key][0] += float(signal.pow(2).sum())
            sums[key][1] += float(g.var(0).sum())
    for key, (s, v) in sorted(sums.items(), key=lambda kv: kv[0] == "all parameters"):
        snr = (s / (v / 16)) ** 0.5 if v > 0 else float("nan")
        print(f"{key:36s} signal {s**0.5:.2e}  noise {v**0.5:.2e}  SNR@16 {snr:.3f}")


if __name__ == "__main__":
    main()
