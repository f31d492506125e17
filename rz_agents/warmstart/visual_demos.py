"""Synthetic demonstrations for ``rz_agents/VisualClick-v0`` (the warm start of a vision-language policy).

Each demonstration is the env's own first observation (picture + instruction, rendered with the run's
template, images kept as PNG) followed by ``click(x, y)`` at the centre of a button and the template's stop
token. With probability ``named_fraction`` the button is the one the instruction names, otherwise one of
the picture's buttons drawn uniformly: at ``named_fraction: 0`` the warm start teaches the reply format and
where buttons are, never which one to pick (the policy starts near 1 / n_buttons); RL has to learn to read
the instruction against the picture.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from rz_agents.images import message_images, to_png
from rz_agents.warmstart.demos import Demonstration


def visual_click_demos(
    make_env: Callable[[], Any], tokenizer: Any, template: Any, n: int, *, seed: int = 0,
    named_fraction: float = 0.0,
) -> list[Demonstration]:  # fmt: skip
    """``n`` demonstrations on training tasks ``0..n-1`` of the env ``make_env`` builds (see module doc)."""
    env = make_env()
    rng = random.Random(seed)
    stop = template.stop_token_ids(tokenizer)[0]
    demos = []
    try:
        for i in range(n):
            messages, info = env.reset(seed=seed + i, options={"task": {"split": "train", "index": i}})
            layout = env.unwrapped.layout
            button = info["target"] if rng.random() < named_fraction else rng.choice(layout.buttons)
            x, y = (button.x0 + button.x1) // 2, (button.y0 + button.y1) // 2
            prompt = template.encode_prompt(tokenizer, messages)
            reply = [*tokenizer.encode(f"click({x}, {y})"), stop]
            images = [to_png(im) for im in message_images(messages)]
            demos.append(
                Demonstration(prompt + reply, [False] * len(prompt) + [True] * len(reply), False, images)
            )
    finally:
        env.close()
    return demos
