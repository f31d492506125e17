"""Screenshot episodes with and without prefix reuse: prefill tokens per episode and engine wall per turn.

Runs the model and engine settings of two packaged vision-language configs on multi-turn screenshot episodes
driven the way the agent loop drives them (rz_agents/rollout/agent_loop.py: the transcript is kept as tokens;
each turn's request is the whole history plus the new observation, with every screenshot so far):

- ``visual-click-demo``: the real VisualClick env (its kwargs from the config), the byte VL chat template and
  the real image processor; ``group_size`` members per task, each sampling ``max_tokens_per_turn`` tokens,
  ``max_turns`` turns (the demo's 1: the group shares the prompt; ``--turns 3`` adds "Missed" turns).
- ``osworld-screenshot-vl``: a real desktop is too slow for this bench (Xvfb + Chromium per episode), so the
  episodes are recorded-shaped: a ~1,600-token prompt (rules + task, as OSWorld's screenshot prompt) with a
  128x72 screenshot, then per turn a ~270-token observation (an error line + a new 128x72 screenshot, other
  pixels per member and turn), ``max_turns`` 3, ``max_tokens_per_turn`` 24, ``group_size`` 2.

Each workload runs on two engines with the config's engine settings: ``reuse`` (the prefix index, which now
keys image placeholders by their image's content) and ``no_reuse`` (prefix_cache false,
share_prefix_min_tokens 0: what every image request got before, when image sequences bypassed the index).
Reported per engine: prefill tokens per episode, engine wall per turn (request to completion, the episodes
running concurrently) and per turn index, the engine's forward seconds, and lag-0 max |dlogp| (the
learner's packed forward, which re-encodes every screenshot, against the engine's sampled log-probs: 0.0);
and whether both engines sampled the same tokens with the same log-probs (torch.equal).

  python bench/vl_prefix_reuse.py --json [--config visual-click-demo] [--groups 4] [--turns 3]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rz_agents.engine import ImagePrompt, RZEngine, SamplingParams  # noqa: E402
from rz_agents.images import image_part, text_part  # noqa: E402
from rz_agents.model.qwen3_vl import VLSequence, packed_logprobs  # noqa: E402
from rz_agents.model.vl_processor import png_image_inputs  # noqa: E402
from rz_agents.rollout.agent_loop import message_pngs  # noqa: E402

CONFIGS = ("visual-click-demo", "osworld-screenshot-vl")


class ShapedDesktop:
    """OSWorld-shaped screenshot observations (no desktop): a long rules prompt and a screenshot, then an
    error line and a new screenshot per turn (its pixels follow the task, the member's action, the turn)."""

    def __init__(self, size: tuple[int, int] = (128, 72), rules_bytes: int = 1450, obs_bytes: int = 250):
        self.size, self.rules_bytes, self.obs_bytes = size, rules_bytes, obs_bytes
        self.task, self.turn = 0, 0

    def _screen(self, seed: int):
        from PIL import Image

        rng = np.random.default_rng(seed)
        w, h = self.size
        return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))

    def _text(self, seed: int, n: int) -> str:
        rng = np.random.default_rng(seed)
        words = ["click", "the", "window", "pyautogui", "screen", "button", "task", "done", "wait", "type"]
        return " ".join(rng.choice(words, n // 5))[:n]

    def reset(self, seed: int, options=None):
        self.task, self.turn = seed, 0
        rules = {"role": "system", "content": self._text(seed, self.rules_bytes)}
        task = self._text(seed + 1, 100)
        return [rules, {"role": "user", "content": [text_part(task), image_part(self._screen(seed))]}], {}

    def step(self, action: str):
        self.turn += 1
        seed = zlib.crc32(f"{self.task} {self.turn} {action}".encode())
        error = "Error: " + self._text(seed, self.obs_bytes - 7)
        obs = [{"role": "user", "content": [text_part(error), image_part(self._screen(seed))]}]
        return obs, 0.0, False, False, {}


def make_env(name: str, cfg, turns: int):
    if name == "osworld-screenshot-vl":
        return ShapedDesktop()
    from rz_agents.envs.visual_click.env import VisualClickEnv

    return VisualClickEnv(**{**cfg.env.kwargs, "max_turns": turns})


def load(name: str):
    """(run config, model, tokenizer, template) of a packaged config (as `rz train` builds them)."""
    from rz_agents.cli.train import load_run_config
    from rz_agents.runtime.factories import build_model, build_tokenizer, policy_template, vocab_size

    cfg = load_run_config(name)
    tokenizer, template = build_tokenizer(cfg.tokenizer, cfg.model.checkpoint)
    model = build_model(cfg.model, vocab_size(cfg.tokenizer, tokenizer)).eval()
    return cfg, model, tokenizer, policy_template(template, model.vl_config)


@dataclasses.dataclass
class Episode:
    tokens: list[int]
    pngs: list[bytes]
    sampled: list[tuple[int, torch.Tensor]] = dataclasses.field(default_factory=list)  # (start, logprobs)
    turn_walls: list[float] = dataclasses.field(default_factory=list)
    completions: list = dataclasses.field(default_factory=list)
    sampled_mask: list[bool] = dataclasses.field(default_factory=list)  # per token: sampled by the policy

    def add(self, ids: list[int], sampled: bool) -> None:
        self.tokens += ids
        self.sampled_mask += [sampled] * len(ids)


async def episode(engine, env, template, tokenizer, task: int, seed: int, turns: int, limits, temp: float):
    """One episode, turn by turn, as the agent loop runs it (tokens kept from start to end)."""
    messages, _ = env.reset(seed=task, options=None)
    ep = Episode([], message_pngs(messages))
    ep.add(template.encode_prompt(tokenizer, messages), sampled=False)
    stops = tuple(template.stop_token_ids(tokenizer))
    for turn in range(turns):
        budget = min(limits.max_tokens_per_turn, limits.max_episode_tokens - len(ep.tokens))
        if budget < 1:
            break
        params = SamplingParams(
            temperature=temp, max_tokens=budget, seed=seed * 100 + turn, stop_token_ids=list(stops)
        )
        pixels, grids = png_image_inputs(ep.pngs, template.vision)
        t0 = time.perf_counter()
        out = await engine.generate(list(ep.tokens), params, images=ImagePrompt(pixels, grids))
        ep.turn_walls.append(time.perf_counter() - t0)
        ep.sampled.append((len(ep.tokens), out.logprobs))
        ep.completions.append(out)
        ep.add(out.tokens, sampled=True)
        if turn + 1 == turns or set(out.tokens) & set(template.vision_token_ids):
            break  # (a sampled vision token ends the episode, as in the agent loop)
        if not out.tokens or out.tokens[-1] not in stops:
            ep.add([stops[0]], sampled=False)
        obs, *_ = env.step(tokenizer.decode(out.tokens))
        ep.add(template.encode_continuation(tokenizer, obs), sampled=False)
        ep.pngs += message_pngs(obs)
    return ep


def lag0_dlogp(model, template, episodes: list[Episode]) -> float:
    """Max |learner - engine| log-prob over every sampled token (the learner re-encodes the screenshots)."""
    worst = 0.0
    for ep in episodes:
        pixels, grids = png_image_inputs(ep.pngs, template.vision)
        with torch.no_grad():
            # the template's placeholders only (a sampled <|image_pad|> is an ordinary token)
            marks = torch.tensor(
                [
                    t == template.image_token_id and not s
                    for t, s in zip(ep.tokens, ep.sampled_mask, strict=True)
                ]
            )
            (lp,) = packed_logprobs(model, [VLSequence(ep.tokens, grids, pixels, placeholders=marks)])
        for start, got in ep.sampled:
            ref = lp[start - 1 : start - 1 + len(got)]
            worst = max(worst, float((ref - got).abs().max()) if len(got) else 0.0)
    return worst


def new_tokens(ep: Episode, t: int) -> int:
    """Prompt tokens of turn ``t`` whose K/V no earlier turn of the episode computed."""
    prompt = len(ep.completions[t].prompt)
    if t == 0:
        return prompt
    before = ep.completions[t - 1]
    return prompt - (len(before.prompt) + len(before.tokens) - 1)


def by_turn_mean(episodes: list[Episode], of) -> list[float]:
    """The mean of ``of(episode, t)`` over the episodes that have a turn ``t``, for each turn index."""
    turns = max(len(e.completions) for e in episodes)
    out = []
    for t in range(turns):
        values = [of(e, t) for e in episodes if len(e.completions) > t]
        out.append(round(sum(values) / len(values), 1))
    return out


def run(name: str, reuse: bool, groups: int, turns: int | None) -> tuple[dict, list[Episode]]:
    cfg, model, tokenizer, template = load(name)
    torch.set_num_threads(cfg.num_threads or 1)
    engine_cfg = (
        cfg.engine
        if reuse
        else dataclasses.replace(cfg.engine, prefix_cache=False, share_prefix_min_tokens=0)
    )
    engine = RZEngine(model, engine_cfg, decode=tokenizer.decode)
    limits = cfg.rollout.limits
    turns = turns or limits.max_turns
    members = cfg.rollout.group_size

    async def go():
        return await asyncio.gather(
            *(
                episode(engine, make_env(name, cfg, turns), template, tokenizer, 1000 + g, g * members + m,
                        turns, limits, cfg.rollout.temperature)
                for g in range(groups)
                for m in range(members)
            )
        )  # fmt: skip

    t0 = time.perf_counter()
    episodes = asyncio.run(go())
    wall = time.perf_counter() - t0
    stats = engine.stats()
    n_turns = sum(len(e.turn_walls) for e in episodes)
    by_turn = [
        [e.turn_walls[t] for e in episodes if len(e.turn_walls) > t]
        for t in range(max(len(e.turn_walls) for e in episodes))
    ]
    result = {
        "episodes": len(episodes),
        "turns": n_turns,
        "prompt_tokens_per_episode": round(
            sum(len(c.prompt) for e in episodes for c in e.completions) / len(episodes), 1
        ),
        "prefill_tokens_per_episode": round(stats["prefill_tokens"] / len(episodes), 1),
        # per turn index, the mean over episodes: tokens new since the last turn's K/V (the observation, and
        # the last sampled token), and the prompt tokens the engine did not find in the prefix index
        "new_tokens_by_turn": by_turn_mean(episodes, new_tokens),
        "uncached_prompt_tokens_by_turn": by_turn_mean(
            episodes, lambda e, t: len(e.completions[t].prompt) - e.completions[t].num_cached_prompt_tokens
        ),
        "prefix_tokens_reused": stats["prefix_tokens_reused"],
        "shared_prefix_tokens": stats["shared_prefix_tokens"],
        "images_encoded": stats["images_encoded"],
        "engine_wall_per_turn_s": round(sum(sum(w) for w in by_turn) / n_turns, 4),
        "engine_wall_per_turn_by_index_s": [round(sum(w) / len(w), 4) for w in by_turn],
        "forward_s": round(stats["forward_s"], 3),
        "forward_s_per_turn": round(stats["forward_s"] / n_turns, 4),
        "workload_wall_s": round(wall, 3),
        "lag0_max_abs_dlogp": lag0_dlogp(model, template, episodes),
    }
    return result, episodes


def fastest(runs: list[tuple[dict, list[Episode]]]) -> tuple[dict, list[Episode]]:
    """The run with the least engine wall per turn (counts are the same in every run: seeded sampling)."""
    return min(runs, key=lambda r: r[0]["engine_wall_per_turn_s"])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--config", choices=CONFIGS, action="append", help="default: both")
    ap.add_argument("--groups", type=int, default=None, help="groups per workload (default 4 / 2)")
    ap.add_argument("--turns", type=int, default=None, help="turns per episode (default: the config's)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each engine (the fastest is reported)")
    args = ap.parse_args(argv)
    result = {}
    for name in args.config or CONFIGS:
        groups = args.groups or (4 if name == "visual-click-demo" else 2)
        run(name, False, 1, 1)  # warm-up (imports, the image processor, first calls): not measured
        runs: dict[bool, list] = {True: [], False: []}
        for _ in range(args.repeats):  # alternated, the fastest kept: this machine is shared
            for reuse in (True, False):
                runs[reuse].append(run(name, reuse, groups, args.turns))
        (after, a), (before, b) = (fastest(runs[True]), fastest(runs[False]))
        same = all(
            x.tokens == y.tokens
            and all(torch.equal(p, q) for (_, p), (_, q) in zip(x.sampled, y.sampled, strict=True))
            for x, y in zip(a, b, strict=True)
        )
        result[name] = {
            "reuse": after,
            "no_reuse": before,
            "prefill_tokens_ratio": round(
                after["prefill_tokens_per_episode"] / before["prefill_tokens_per_episode"], 3
            ),
            "engine_wall_per_turn_ratio": round(
                after["engine_wall_per_turn_s"] / before["engine_wall_per_turn_s"], 3
            ),
            "same_tokens_and_logprobs": same,
        }
    print(json.dumps(result, indent=2) if args.json else result)
    return result


if __name__ == "__main__":
    main()
