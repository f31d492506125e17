"""Timings of the OSWorld desktop: median reset / step / evaluate / close over a few episodes.

    python bench/osworld.py [--episodes 5] [--json]

Per domain (an ``os`` task and a ``chrome`` task from the local set), each episode runs
``reset`` (fresh Xvfb + openbox + sandbox + setup steps), ``--steps`` pyautogui steps with the
observation (screenshot + accessibility tree), ``evaluate`` and ``close``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from rz_agents.envs.osworld import LOCAL_TASKS
from rz_agents.envs.osworld.desktop_env import DesktopEnv
from rz_agents.envs.osworld.providers.local import episode_pids

TASKS = {
    "os": Path(LOCAL_TASKS) / "os" / "rz-os-rename-file.json",
    "chrome": Path(LOCAL_TASKS) / "chrome" / "rz-chrome-open-about.json",
}
STEP_CODE = "pyautogui.moveTo(200, 200)"


def bench_domain(domain: str, episodes: int, steps: int) -> dict:
    """Median timings (seconds) for one domain's task, plus leftover-process count after close."""
    task = json.loads(TASKS[domain].read_text())
    times: dict[str, list[float]] = {
        "reset_s": [],
        "step_s": [],
        "evaluate_s": [],
        "close_s": [],
        "observe_s": [],
    }
    leftovers = 0
    for _ in range(episodes):
        env = DesktopEnv()
        t0 = time.perf_counter()
        env.reset(task)
        times["reset_s"].append(time.perf_counter() - t0)
        for _ in range(steps):
            t0 = time.perf_counter()
            env.step(STEP_CODE, pause=0.0)
            times["step_s"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        env._get_obs()
        times["observe_s"].append(time.perf_counter() - t0)
        env.step("DONE")
        t0 = time.perf_counter()
        env.evaluate()
        times["evaluate_s"].append(time.perf_counter() - t0)
        episode = env.provider.desktop.episode_id
        t0 = time.perf_counter()
        env.close()
        times["close_s"].append(time.perf_counter() - t0)
        leftovers += len(episode_pids(episode))
    out = {k: round(statistics.median(v), 3) for k, v in times.items()}
    out.update(episodes=episodes, steps_per_episode=steps, leftover_processes=leftovers)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--domains", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = {d: bench_domain(d, args.episodes, args.steps) for d in args.domains}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for d, r in results.items():
            print(
                f"{d:<7} reset {r['reset_s']:.2f}s  step {r['step_s']:.2f}s (incl. observation)  "
                f"observe {r['observe_s']:.2f}s  evaluate {r['evaluate_s']:.2f}s  close {r['close_s']:.2f}s  "
                f"leftover processes {r['leftover_processes']}  (median of {r['episodes']})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
