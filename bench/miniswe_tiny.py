"""Episode-level figures of configs/miniswe-tiny.yaml: what mini-swe-agent, unmodified, does with a policy.

    python bench/miniswe_tiny.py --checkpoint RUN_DIR/warm_start_model [--steps 2] [--out FILE.json]
    python bench/miniswe_tiny.py --steps 1          # the random init (no checkpoint, no warm start)

Runs the config's async RZ training for ``--steps`` learner steps from ``--checkpoint`` (an exported model,
e.g. the ``warm_start_model`` ``rz train`` writes in its run directory; none: the config's random init; the
config's warm start is not run) and records, per episode the run trained: the task, the commands
mini-swe-agent ran in the sandbox, how it ended, the verifier's reward, the session's segments and its
sampled tokens; per step: reward, lag-0 |dlogp| max, sampled vs trained tokens. Prints one JSON object.
The episodes are recorded by an episode runner that wraps the config's own (the real CLI, sandbox and
verifier run unchanged); the training is the run's own loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rz_agents.cli.train import load_run_config
from rz_agents.runtime.launch import build_run

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "miniswe-tiny.yaml"


class RecordingRunner:
    """An episode runner that runs ``inner``'s episodes unchanged and keeps a summary of each one."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.uses_env = inner.uses_env
        self.episodes: list[dict[str, Any]] = []

    async def run_episode(self, *args: Any, **kwargs: Any) -> Any:
        """``inner.run_episode``; its trajectory's task, commands, ending, reward, segments and tokens."""
        traj = await self.inner.run_episode(*args, **kwargs)
        self.episodes.append(
            {
                "task": traj.info.get("task_id"),
                "commands": traj.info.get("commands"),
                "finish": traj.info.get("finish"),
                "reward": traj.reward,
                "segments": len(traj.segments()),
                "sampled_tokens": sum(traj.loss_mask),
            }
        )
        return traj


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="an exported model (default: the random init)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    overrides = [f"steps={args.steps}", "warm_start.episodes=null"]
    if args.checkpoint:
        overrides += [f"model.checkpoint={Path(args.checkpoint).resolve()}", "model.tiny_overrides={}"]
    cfg = load_run_config(str(CONFIG), overrides)
    run = build_run(cfg)
    recorder = RecordingRunner(run.controller.runner)
    run.controller.runner = recorder
    t0 = time.perf_counter()
    try:
        summary = asyncio.run(run.train())
        history = run.loop.history
    finally:
        run.close()
    episodes = recorder.episodes
    result = {
        "config": "configs/miniswe-tiny.yaml",
        "checkpoint": args.checkpoint,
        "steps": summary["steps"],
        "wall_s": round(time.perf_counter() - t0, 1),
        "reward_mean_per_step": [h["reward_mean"] for h in history],
        "lag0_abs_dlogp_max_per_step": [h["lag0_abs_dlogp_max"] for h in history],
        "is_weight_min_max_per_step": [[h["is_weight_min"], h["is_weight_max"]] for h in history],
        "sampled_tokens_per_step": [h["lag_sampled_tokens"] for h in history],
        "lag0_tokens_trained_per_step": [h["lag0_token_count"] for h in history],
        "episodes_failed": summary["rollout"]["episodes_failed"],
        "episodes_recorded": len(episodes),
        "commands_per_episode_mean": sum(e["commands"] or 0 for e in episodes) / max(1, len(episodes)),
        "reward_mean_recorded": sum(e["reward"] for e in episodes) / max(1, len(episodes)),
        "finish": dict(Counter(str(e["finish"]) for e in episodes)),
        "reward_by_task": _by_task(episodes),
        "episodes": episodes,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


def _by_task(episodes: list[dict[str, Any]]) -> dict[str, float]:
    rewards: dict[str, list[float]] = {}
    for e in episodes:
        rewards.setdefault(str(e["task"]), []).append(e["reward"])
    return {k: sum(v) / len(v) for k, v in sorted(rewards.items())}


if __name__ == "__main__":
    raise SystemExit(main())
