"""Baseline policies for ``rz_agents/VisualClick-v0`` and ``rz_agents/ChartRead-v0``: oracles that read
the picture, and random answers.

All are ``policy(messages) -> reply``, seeing what a model sees (the image part and the text), never
the env's state. The click oracle finds the buttons by their palette colours and, when the
instruction names a label, tells which button wears it by painting each candidate with that label
(``render.draw_button``) and comparing pixels. The chart oracle measures the named bar in pixels and
divides by the tick spacing. So an oracle score of 1.0 shows a task is solvable from the image alone.

``python -m rz_agents.envs.visual_click.policies --episodes 400`` prints the oracle's and the random
policy's mean reward per split and the chance rate (``--task chart`` for the charts).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from rz_agents.envs.visual_click.render import INK, PALETTE, Button, draw_button, glyph_scale
from rz_agents.images import as_pil, message_images

Policy = Callable[[list[dict[str, Any]]], str]
_COLOR = re.compile(r"Click the (\w+) button\.")
_LABEL = re.compile(r"Click the button labelled (\d)\.")
_BAR = re.compile(r"value of the (\w+) bar\?")


def _last_user(messages: list[dict[str, Any]]) -> tuple[np.ndarray, str]:
    user = [m for m in messages if m["role"] == "user" and isinstance(m["content"], list)][-1]
    (image,) = message_images([user])
    text = "".join(p["text"] for p in user["content"] if p["type"] == "text")
    return np.asarray(as_pil(image)), text


def find_buttons(pixels: np.ndarray) -> list[Button]:
    """Every button in the picture: the bounding box of each palette colour present (label unknown)."""
    found = []
    for name, rgb in PALETTE.items():
        ys, xs = np.nonzero(np.all(pixels == np.array(rgb, dtype=np.uint8), axis=-1))
        if len(xs):
            found.append(Button(int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1, name, ""))
    return found


def oracle_click(pixels: np.ndarray, instruction: str) -> tuple[int, int]:
    """The centre of the button the instruction names (ValueError when it names none in the picture)."""
    buttons = find_buttons(pixels)
    m = _COLOR.search(instruction)
    if m:
        hits = [b for b in buttons if b.color == m.group(1)]
    else:
        m = _LABEL.search(instruction)
        if not m:
            raise ValueError(f"the instruction names no colour nor label: {instruction!r}")
        hits = []
        for b in buttons:
            painted = pixels.copy()
            draw_button(
                painted, Button(b.x0, b.y0, b.x1, b.y1, b.color, m.group(1)), glyph_scale(len(pixels))
            )
            if np.array_equal(painted, pixels):  # painting that label changed nothing: it is this button's
                hits.append(b)
    if len(hits) != 1:
        raise ValueError(f"{len(hits)} buttons match {instruction!r}")
    return hits[0].centre


def oracle_policy(messages: list[dict[str, Any]]) -> str:
    """Clicks the centre of the named button, read off the picture."""
    pixels, text = _last_user(messages)
    x, y = oracle_click(pixels, text)
    return f"click({x}, {y})"


def random_policy(seed: int = 0) -> Policy:
    """Clicks a uniformly random pixel of the picture: its hit rate is the target's share of the image."""
    rng = np.random.default_rng(seed)

    def policy(messages: list[dict[str, Any]]) -> str:
        pixels, _ = _last_user(messages)
        h, w = pixels.shape[:2]
        return f"click({int(rng.integers(w))}, {int(rng.integers(h))})"

    return policy


def chart_value(pixels: np.ndarray, question: str) -> int:
    """The named bar's value: its height in pixels over the spacing of the ticks on the left edge."""
    m = _BAR.search(question)
    if not m or m.group(1) not in PALETTE:
        raise ValueError(f"the question names no bar colour: {question!r}")
    ys = np.nonzero(np.all(pixels == np.array(PALETTE[m.group(1)], dtype=np.uint8), axis=-1))[0]
    ticks = np.nonzero(np.all(pixels[:, 0] == np.array(INK, dtype=np.uint8), axis=-1))[0]
    if not len(ys) or len(ticks) < 2:
        raise ValueError(f"no {m.group(1)} bar or no ticks in the picture")
    return int(round((ys.max() - ys.min() + 1) / (ticks[1] - ticks[0])))


def chart_oracle_policy(messages: list[dict[str, Any]]) -> str:
    """Answers the named bar's value, measured on the picture."""
    pixels, text = _last_user(messages)
    return str(chart_value(pixels, text))


def guess_policy(max_value: int = 9, seed: int = 0) -> Policy:
    """Answers a uniformly random value in ``1..max_value`` (hit rate ``1 / max_value``)."""
    rng = np.random.default_rng(seed)
    return lambda messages: str(int(rng.integers(1, max_value + 1)))


def mean_reward(
    policy: Policy, episodes: int, seed: int = 0, task: str = "click", **env_kwargs: Any
) -> dict[str, float]:
    """The policy's mean reward over ``episodes`` episodes (reset seeds ``seed``, ``seed + 1``, ...) of
    ``task`` (``click``: VisualClickEnv, ``chart``: ChartReadEnv), and the mean chance rate."""
    from rz_agents.envs.visual_click.chart_env import ChartReadEnv
    from rz_agents.envs.visual_click.env import VisualClickEnv

    if task not in ("click", "chart"):
        raise ValueError(f"task must be click or chart, got {task!r}")
    env = VisualClickEnv(**env_kwargs) if task == "click" else ChartReadEnv(**env_kwargs)
    rewards, chances = [], []
    for k in range(episodes):
        messages, info = env.reset(seed=seed + k)
        done, total = False, 0.0
        while not done:
            reply = policy(messages)
            messages = messages + [{"role": "assistant", "content": reply}]
            obs, reward, terminated, truncated, _ = env.step(reply)
            messages += obs
            total += reward
            done = terminated or truncated
        rewards.append(total)
        chances.append(info["chance"] if task == "click" else 1 / env.max_value)
    return {"reward": float(np.mean(rewards)), "chance": float(np.mean(chances)), "episodes": episodes}


def main(argv: list[str] | None = None) -> None:
    """Print the oracle's and random clicks' mean reward per split (JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=("click", "chart"), default="click")
    ap.add_argument("--episodes", type=int, default=400)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--n-buttons", type=int, default=3, help="click: buttons per picture")
    ap.add_argument("--name-by", default="color", help="click: color or label")
    ap.add_argument("--n-bars", type=int, default=4, help="chart: bars per chart")
    ap.add_argument("--max-value", type=int, default=9, help="chart: the largest value")
    args = ap.parse_args(argv)
    if args.task == "click":
        kw = {"image_size": args.image_size, "n_buttons": args.n_buttons, "name_by": args.name_by}
        oracle, rand = oracle_policy, random_policy(1)
    else:
        kw = {"image_size": args.image_size, "n_bars": args.n_bars, "max_value": args.max_value}
        oracle, rand = chart_oracle_policy, guess_policy(args.max_value, 1)
    out = {
        split: {
            "oracle": mean_reward(oracle, args.episodes, task=args.task, split=split, **kw),
            "random": mean_reward(rand, args.episodes, task=args.task, split=split, **kw),
        }
        for split in ("train", "test")
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
