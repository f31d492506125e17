"""A quick copy probe of a tool-tiny checkpoint (scripts/train_tool_policy.py saves one every --save-every
steps): first turns only, greedy, through the aligned engine, on N held-out requests (real tool names and
values), N unseen training-style requests and N repeat exercises; prints the shares and a few answers.

    python experiments/tool_policy_probe.py /tmp/tt/final_model 12
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

import torch

from rz_agents.engine import EngineConfig, RZEngine
from rz_agents.envs.tool_calls import parse_tool_calls
from rz_agents.model.checkpoint import load_hf_checkpoint
from rz_agents.rollout.byte_chat import ByteChatTemplate, ByteTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import train_tool_policy as tp  # noqa: E402 - the script's task and scoring


def calls_figures(label: str, convs: list[dict[str, Any]], texts: list[str]) -> None:
    """Well-formed, right tool and exact arguments shares of the first turns, and three examples."""
    formed = right = exact = 0
    for c, text in zip(convs, texts, strict=True):
        formed += tp._written_call(text) is not None  # noqa: SLF001
        turn = parse_tool_calls(text, c["tools"])
        if turn.calls and not turn.errors:
            right += turn.calls[0].name == c["name"]
            exact += turn.calls[0].name == c["name"] and turn.calls[0].arguments == c["arguments"]
    n = len(convs)
    print(f"{label}: well-formed {formed / n:.2f} right tool {right / n:.2f} exact arguments {exact / n:.2f}")
    for c, text in list(zip(convs, texts, strict=True))[:3]:
        print("   ", c["name"], json.dumps(c["arguments"]), "->", text.replace("\n", " ")[:110])


def main() -> None:
    directory, n = Path(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    tok, tpl = ByteTokenizer(), ByteChatTemplate()
    model = load_hf_checkpoint(directory, kernels="aligned").eval().requires_grad_(False)
    config = EngineConfig(max_running=3 * n, max_len=2048, max_batch_tokens=16384)  # one wave
    engine = RZEngine(model, config, decode=tok.decode)
    rng = random.Random(1)
    held = [tp.conversation(rng, held_out=True) for _ in range(n)]
    unseen = tp.unseen_training_style(n, 0, tp.training_set(12000, 0, 0.3))
    repeats = [tp.repeat_task(random.Random(99 + i)) for i in range(n)]
    prompts = [tpl.encode_prompt(tok, c["messages"][:1], tools=c["tools"]) for c in held + unseen]
    prompts += [tpl.encode_prompt(tok, c["messages"][:1]) for c in repeats]
    texts = asyncio.run(tp._answers(engine, prompts))  # noqa: SLF001
    calls_figures("held-out", held, texts[:n])
    calls_figures("unseen training-style", unseen, texts[n : 2 * n])
    said = [c["messages"][1]["content"] for c in repeats]
    print(f"repeat exact {sum(s == t.strip() for s, t in zip(said, texts[2 * n :], strict=True)) / n:.2f}")
    for s, t in list(zip(said, texts[2 * n :], strict=True))[:2]:
        print("   ", s, "->", t[:110])


if __name__ == "__main__":
    main()
