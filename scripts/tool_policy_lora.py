"""scripts/train_tool_policy.py's ``--base smollm2-135m-instruct --lora-rank R`` mode: the packaged policy
``smollm2-135m-tools``, a LoRA adapter on the pretrained SmolLM2-135M-Instruct (rz's own adapters,
model/lora.py) taught to call the tools a request lists.

Every conversation is rendered as the token ids ``rz serve`` builds for it (the checkpoint's chat template,
``encode_prompt`` with the request's ``tools``): the prompt of the first request (the tool list and the
question) and of the second (the history with the call the server renders back, and the tool's result) are
both prefixes of the whole conversation's ids, and the loss covers the two assistant turns, each up to its
``<|im_end|>``. So the model learns to write exactly the call text the server's template renders in a
history, and answers after a result rendered exactly as the server renders it.

The adapter is written (bf16, PEFT layout) every ``--save-every`` steps, so a stopped run leaves a usable
policy; it is evaluated merged into the base (``merged_checkpoint``: what ``rz serve smollm2-135m-tools``
serves), through the aligned engine with greedy decoding.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rz_agents.engine import EngineConfig, RZEngine
from rz_agents.engine.params import SamplingParams
from rz_agents.model.checkpoint import load_hf_checkpoint
from rz_agents.model.lora import LoraConfig
from rz_agents.model.packaged import resolve_checkpoint
from rz_agents.model.peft_files import CONFIG_NAME, WEIGHTS_NAME, save_peft_adapter
from rz_agents.model.policy import PolicySpec, build_policy
from rz_agents.model.tool_policy import merged_checkpoint
from rz_agents.runtime.factories import build_tokenizer
from rz_agents.warmstart.demos import Demonstration
from rz_agents.warmstart.sft import WarmStartConfig, supervised_warm_start

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]


def server_demo(tok: Any, tpl: Any, conversation: dict[str, Any]) -> Demonstration:
    """The conversation as the ids ``rz serve`` builds, the loss on each assistant turn (its ``<|im_end|>``
    included): each turn's prompt (the request the server gets) is a prefix of the whole."""
    messages, tools = conversation["messages"], conversation.get("tools")
    tokens = tpl.encode_prompt(tok, messages, tools=tools, add_generation_prompt=False)
    end = tpl.turn_end_id(tok)
    mask = [False] * len(tokens)
    for turn in (i for i, m in enumerate(messages) if m["role"] == "assistant"):
        prompt = tpl.encode_prompt(tok, messages[:turn], tools=tools)
        if tokens[: len(prompt)] != prompt:
            raise ValueError(f"the request before turn {turn} is not a prefix of the conversation's tokens")
        stop = tokens.index(end, len(prompt))
        mask[len(prompt) : stop + 1] = [True] * (stop + 1 - len(prompt))
    return Demonstration(tokens, mask, uses_tool=bool(tools))


def save_adapter(model: torch.nn.Module, out: Path, base: str) -> Path:
    """The model's adapters as a PEFT directory at ``out`` with bf16 tensors (half the bytes; the merge and
    every load cast them to the model's dtype), replaced atomically."""
    from safetensors.torch import load_file, save_file

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_peft_adapter(model, tmp, base_model=base)
        tensors = {k: v.to(torch.bfloat16) for k, v in load_file(str(tmp / WEIGHTS_NAME)).items()}
        save_file(tensors, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        if out.is_dir():  # beside a progress.json / report.json: each file replaced whole
            for name in (CONFIG_NAME, WEIGHTS_NAME):
                (tmp / name).replace(out / name)
        else:
            tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def train_lora(conversations: list[dict[str, Any]], args: argparse.Namespace) -> tuple[torch.nn.Module, dict]:
    """Supervised steps on the adapters only (cosine LR after a short warmup), the adapter written to
    ``args.out`` every ``args.save_every`` steps with a progress.json beside it."""
    base = resolve_checkpoint(args.base)
    tok, tpl = build_tokenizer("checkpoint", str(base))
    demos = [server_demo(tok, tpl, c) for c in conversations]
    targets = ATTENTION + (MLP if args.lora_mlp else [])
    lora = LoraConfig(rank=args.lora_rank, alpha=args.lora_alpha, target_modules=targets, init_seed=args.seed)
    model = build_policy(PolicySpec(checkpoint=str(base), kernels="standard", lora=lora))
    cfg = WarmStartConfig(
        epochs=1, batch_size=args.batch, lr=args.lr, warmup_steps=args.warmup, seed=args.seed
    )
    t0 = time.perf_counter()

    def on_step(step: int, total: int, loss: float) -> None:
        print(f"step {step}/{total} loss {loss:.4f} {time.perf_counter() - t0:.0f}s", flush=True)
        if step % args.save_every == 0 or step == total:
            save_adapter(model, args.out, args.base)
            saved = {"saved_step": step, "steps": total, "loss": loss, "wall_s": time.perf_counter() - t0}
            args.out.joinpath("progress.json").write_text(json.dumps(saved) + "\n")

    stats = supervised_warm_start(model, demos, cfg, on_step=on_step)
    tokens = [len(d.tokens) for d in demos]
    return model, {**stats, "mean_tokens": sum(tokens) / len(tokens), "targets": targets}


async def _generate(engine: RZEngine, prompts: list[list[int]], stops: tuple[int, ...]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=80, stop_token_ids=stops)  # a call is ~30 tokens
    outs = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    return [o.tokens for o in outs]


def answers(checkpoint: Path, held: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(first replies, replies after the tool's result) of ``checkpoint`` (an HF directory with SmolLM2's
    tokenizer) to ``held``'s two requests, rendered as ``rz serve`` renders them: greedy, the aligned
    engine, each turn ending where the server ends it (its stop ids)."""
    tok, tpl = build_tokenizer("checkpoint", str(checkpoint))
    model = load_hf_checkpoint(checkpoint, kernels="aligned").eval().requires_grad_(False)
    engine = RZEngine(model, EngineConfig(max_running=len(held), max_len=1024), decode=tok.decode)
    stops = tuple(tpl.stop_token_ids(tok))
    texts = []
    for turn in (1, 3):  # the question; the question, the call and the tool's result
        prompts = [tpl.encode_prompt(tok, c["messages"][:turn], tools=c["tools"]) for c in held]
        outs = asyncio.run(_generate(engine, prompts, stops))
        texts.append([tok.decode(t, skip_special_tokens=True) for t in outs])
    return texts[0], texts[1]


def merged(args: argparse.Namespace) -> Path:
    """``args.out``'s adapter merged into the base, as the packaged policy is served (cached beside it)."""
    return merged_checkpoint(resolve_checkpoint(args.base), args.out, args.merged_dir)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This mode's flags (the shared ones, --steps --batch --lr --seed --held-out --out, are the script's)."""
    p.add_argument("--base", default=None, help="a pretrained checkpoint to adapt with LoRA (this mode)")
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-alpha", type=float, default=16.0)
    p.add_argument("--lora-mlp", action="store_true", help="adapt the MLP projections too")
    p.add_argument("--warmup", type=int, default=5, help="warmup steps (LoRA mode)")
    p.add_argument(
        "--base-figures", action="store_true",
        help="also measure the base model without the adapter on the held-out requests (the control)",
    )  # fmt: skip
    p.add_argument(
        "--merged-dir", type=Path, default=Path(tempfile.gettempdir()) / "rz-tool-policy-merged",
        help="where the evaluated merged checkpoint is written",
    )  # fmt: skip
