"""Does a tiny Qwen3 (the model code, standard kernels, one CPU thread) learn to copy at all, and how fast?

The tool-tiny attempts (scripts/train_tool_policy.py) learn the call format but never copy a name or a value
from the context. This isolates copying: each sequence is a start token, ``L`` random letters (an alphabet of
``K``) and the same letters again; the loss is on the second copy's letters 2..L, predictable only by
copying. With ``--variable-offset`` the first copy starts after P random letters and the second after L - P
more (P drawn per step), so the distance varies over L..2L: a fixed-distance (positional) head cannot do it,
only a content one (find the current letter earlier, emit what followed it: an induction head), which is
what copying a tool's name or a request's value needs.

    python experiments/copy_check.py                      # fixed distance
    python experiments/copy_check.py --variable-offset    # content-based copying

Prints the copy loss (nats per letter; chance is ln K) and the mean probability of the right letter every
``--every`` steps.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.logprobs import token_logprobs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from train_tool_policy import shape  # noqa: E402 - the tool-tiny script's model shape


def batch(args: argparse.Namespace) -> tuple[torch.Tensor, int]:
    """[B, T] tokens and where the second copy starts."""
    b, n, k = args.batch, args.length, args.alphabet
    letters = torch.randint(97, 97 + k, (b, n))
    start = torch.full((b, 1), 256)
    if not args.variable_offset:
        return torch.cat([start, letters, letters], 1), 1 + n
    noise = torch.randint(97, 97 + k, (b, n))
    if args.per_row_offset:  # each sequence its own distance (no one distance fits a whole step)
        offsets = torch.randint(0, n + 1, (b,)).tolist()
        parts = [(noise[i, :q], letters[i], noise[i, q:], letters[i]) for i, q in enumerate(offsets)]
        rows = [torch.cat(row) for row in parts]
        return torch.cat([start, torch.stack(rows)], 1), 1 + 2 * n
    p = int(torch.randint(0, n + 1, ()))  # one distance per step (the logs committed before the flag)
    return torch.cat([start, noise[:, :p], letters, noise[:, p:], letters], 1), 1 + 2 * n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--alphabet", type=int, default=26)
    p.add_argument("--length", type=int, default=16)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--variable-offset", action="store_true")
    p.add_argument("--per-row-offset", action="store_true", help="with --variable-offset: a distance per row")
    p.add_argument(
        "--qk-gain",
        type=float,
        default=1.0,
        help="initial q_norm/k_norm weights (Qwen3 normalizes q and k, so these bound the attention logits)",
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig.tiny("qwen3", **shape(args.hidden, args.layers, args.heads)), kernels="standard"
    )
    model.reset_parameters(std=0.02, seed=0)
    with torch.no_grad():  # with unit gains a logit is at most head_dim / sqrt(head_dim) = 4 at head_dim 16
        for name, param in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                param.fill_(args.qk_gain)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        tokens, second = batch(args)
        n_rows, length = tokens.shape
        hidden = model(tokens, torch.arange(length).expand(n_rows, length)).view(n_rows, length, -1)
        # rows second..T-2 predict the second copy's letters 2..L
        rows = hidden[:, second:-1].reshape(-1, args.hidden)
        logp = token_logprobs(model, rows, tokens[:, second + 1 :].reshape(-1))
        loss = -logp.mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if step % args.every == 0:
            chance, right = math.log(args.alphabet), logp.exp().mean().item()
            print(f"step {step} copy loss {loss.item():.3f} (chance {chance:.2f}) p(right) {right:.2f} "
                  f"{time.perf_counter() - t0:.0f}s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
