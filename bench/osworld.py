"""Timings of the OSWorld desktop: one at a time, or N at once (density).

    python bench/osworld.py [--episodes 5] [--json]
    python bench/osworld.py --concurrent N [--domains os chrome] [--steps 5] [--observe tree] [--json]
    python bench/osworld.py --profile [--domains chrome] [--observe tree] [--json]   # CPU by process kind

Sequential mode, per domain (an ``os`` task and a ``chrome`` task from the local set): each
episode runs ``reset`` (fresh Xvfb + openbox + sandbox + setup steps), ``--steps`` pyautogui steps
with the observation (screenshot + accessibility tree), ``evaluate`` and ``close``; medians.

``--concurrent N [N ...]``: (``--json``: one JSON line per N) N desktops (tasks alternating over
``--domains``) are reset at once from N threads, then all of them step at once (``--steps`` each,
with the observation the RL env uses: ``--observe tree``), then all close; ``--reset fresh warm
kept`` runs each reset kind and prints each one's reset p50 against ``kept``. Reported: start
rate (desktops ready per second of the whole start), reset and step p50/p99 with all busy, PSS
per desktop (from ``/proc/*/smaps_rollup`` of the episode's processes), host memory and CPU use,
CPU seconds per reset (``tree_cpu_s_per_reset``: every process of this bench's tree, reaped ones
included, sampled by ``osworld_profile.CpuSampler``; other jobs' CPU is not in it), failures, and
processes or folders left after close.

``--pattern steady --duration S [--think-s T]``: N desktops start at once, then each runs episodes
back to back for S seconds (reset in place + ``--steps`` actions, each after T s of the policy
thinking), as an RL loop's env workers do; reported:
episodes per minute, reset and step p50/p99 with resets and steps interleaved, CPU use, leftovers.

``--profile``: one desktop's CPU seconds per operation (idle second, action, tree, screenshot,
step, warm reset) by process kind, from ``/proc`` (``bench/osworld_profile.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rz_agents.envs.osworld import LOCAL_TASKS
from rz_agents.envs.osworld.desktop_env import DesktopEnv
from rz_agents.envs.osworld.providers.local import episode_pids, process_tree

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from osworld_profile import CpuSampler, host_pids  # noqa: E402 - the bench folder is not a package

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
        desktop, pids = env.provider.desktop, env.provider.pids()
        t0 = time.perf_counter()
        env.close()
        times["close_s"].append(time.perf_counter() - t0)
        leftovers += len(_left_behind(desktop, pids))
    out = {k: round(statistics.median(v), 3) for k, v in times.items()}
    out.update(episodes=episodes, steps_per_episode=steps, leftover_processes=leftovers)
    return out


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def pss_bytes(pids: list[int]) -> int:
    """Proportional set size summed over ``pids`` (shared pages split among their users)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user + system, with reaped children's) summed over ``pids``."""
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += sum(int(x) for x in fields[11:15])
        except (OSError, ValueError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def mem_available() -> int:
    """The host's MemAvailable in bytes (0 where /proc/meminfo cannot say)."""
    from rz_agents.runtime.memory_estimate import available_memory_bytes

    return available_memory_bytes() or 0


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole host since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def _left_behind(desktop, pids: list[int]) -> set[int]:
    """Processes of a closed desktop still alive: its former pids, its uid's, its marker's."""
    alive = set(process_tree(pids)) & set(pids)  # process_tree keeps only live, non-zombie roots
    if desktop.uid is not None:
        alive |= set(process_tree([], desktop.uid))
    return alive | set(episode_pids(desktop.episode_id))


def _timed_reset(env: DesktopEnv, task: dict) -> float:
    t0 = time.perf_counter()
    env.reset(task)
    return time.perf_counter() - t0


def _timed_steps(env: DesktopEnv, steps: int, think_s: float = 0.0) -> list[float]:
    out = []
    for i in range(steps):
        time.sleep(think_s)  # the policy choosing the action: the desktop waits, its CPU is free
        t0 = time.perf_counter()
        _, _, _, info = env.step(f"pyautogui.moveTo({100 + 10 * i}, 200)", pause=0.0)
        if info.get("error"):
            raise RuntimeError(f"step failed: {info['error']}")
        out.append(time.perf_counter() - t0)
    return out


def _desktop_cpu(env: DesktopEnv) -> tuple[str | None, float]:
    """(episode id, CPU seconds used by its desktop so far)."""
    desktop = env.provider.desktop
    return (desktop.episode_id if desktop else None), cpu_seconds(env.provider.pids())


def _all_at_once(fn, items: list, failures: list[str], what: str) -> list:
    """``fn(item)`` for every item at once, one thread each; the results of those that worked."""
    with ThreadPoolExecutor(max(1, len(items))) as pool:  # shut down after: desktops outlive its threads
        futures = [pool.submit(fn, item) for item in items]
    out = []
    for item, fut in zip(items, futures, strict=True):
        if fut.exception() is None:
            out.append((item, fut.result()))
        else:
            failures.append(f"{what}: {type(fut.exception()).__name__}: {str(fut.exception())[:160]}")
    return out


def bench_concurrent(
    n: int, domains: list[str], steps: int, observe: str, reset: str, episodes: int, a11y_view: str = "agent"
) -> dict:
    """``n`` desktops reset at once, stepped at once (``episodes`` times), then closed at once.

    ``reset``: ``fresh`` (a new desktop per episode), ``warm`` (reset in place after the first, Chromium
    started afresh by each chrome task) or ``kept`` (reset in place, Chromium kept and cleaned over
    DevTools: ``chrome_keep.py``).
    ``a11y_view``: the tree observed (``agent``: what the RL env reads; ``full``: OSWorld's whole XML).
    """
    tasks = [json.loads(TASKS[domains[i % len(domains)]].read_text()) for i in range(n)]
    envs = [
        DesktopEnv(
            require_screenshot=observe in ("screenshot", "both"),
            require_a11y_tree=observe != "screenshot",
            provider_options={"warm_reset": reset in ("warm", "kept")},
            a11y_view=a11y_view,
            keep_browser=reset == "kept",
        )
        for _ in range(n)
    ]
    task_of = {id(env): task for env, task in zip(envs, tasks, strict=True)}
    avail_before = mem_available()
    load_before = os.getloadavg()[0]
    failures: list[str] = []
    first_resets, later_resets, step_times = [], [], []
    start_wall = step_wall = cpu_step_s = 0.0
    busy = total = 0
    up = envs
    reset_cpu: dict[bool, list[float]] = {True: [], False: []}  # first reset of a desktop / later ones
    tree_cpu: dict[bool, list[float]] = {True: [], False: []}  # whole tree's CPU-s per reset, as above
    host0 = os.times()
    for episode in range(episodes):
        before = {id(e): _desktop_cpu(e) for e in up}
        t0 = time.perf_counter()
        with CpuSampler(host_pids, interval_s=0.5) as sampler:
            done = _all_at_once(lambda e: _timed_reset(e, task_of[id(e)]), up, failures, "reset")
        wall = time.perf_counter() - t0
        tree_cpu[episode == 0].append(sum(sampler.by_kind().values()) / max(1, len(up)))
        up = [e for e, _ in done]
        for e in up:  # a desktop kept in place: CPU since; a fresh one: all of its CPU
            (episode_id, cpu), (old_id, old_cpu) = _desktop_cpu(e), before[id(e)]
            reset_cpu[episode == 0].append(cpu - old_cpu if episode_id == old_id else cpu)
        (first_resets if episode == 0 else later_resets).extend(t for _, t in done)
        if episode == 0:
            start_wall = wall
            started = len(up)
        cpu0 = sum(cpu_seconds(e.provider.pids()) for e in up)
        busy0, total0 = cpu_ticks()
        t0 = time.perf_counter()
        stepped = _all_at_once(lambda e: _timed_steps(e, steps), up, failures, "step")
        step_wall += time.perf_counter() - t0
        busy1, total1 = cpu_ticks()
        busy, total = busy + busy1 - busy0, total + total1 - total0
        cpu_step_s += sum(cpu_seconds(e.provider.pids()) for e in up) - cpu0
        step_times += [t for _, ts in stepped for t in ts]
        up = [e for e, _ in stepped]
    host1 = os.times()
    episodes_up = [(e.provider.desktop, e.provider.pids()) for e in up if e.provider.desktop is not None]
    pss = [pss_bytes(pids) for _, pids in episodes_up]
    procs = [len(pids) for _, pids in episodes_up]
    avail_up = mem_available()
    warm_resets = sum(getattr(e.provider, "warm_resets", 0) for e in envs)
    warm_refused = [r for e in envs for r in getattr(e.provider, "warm_reset_failures", [])]
    browser_keeps = sum(getattr(e.provider, "browser_keeps", 0) for e in envs)
    keep_refused = [r for e in envs for r in getattr(e.provider, "browser_keep_failures", [])]
    fresh_reasons: dict[str, int] = {}
    for e in envs:
        for reason, count in e.fresh_browser_reasons.items():
            fresh_reasons[reason] = fresh_reasons.get(reason, 0) + count
    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(lambda e: e.close(), envs))
    close_wall = time.perf_counter() - t0
    time.sleep(1.0)
    mib = 1 << 20

    def pct(values: list[float], q: float, digits: int = 2) -> float:
        return round(percentile(values, q), digits)

    return {
        "concurrent": n,
        "domains": domains,
        "observe": observe,
        "a11y_view": a11y_view if observe != "screenshot" else None,
        "reset": reset,
        "episodes_per_desktop": episodes,
        "started": started,
        "failed": len(failures),
        "failures": failures[:5],
        "start_wall_s": round(start_wall, 2),
        "start_rate_per_s": round(started / start_wall, 2) if start_wall else 0.0,
        "first_reset_p50_s": pct(first_resets, 50),
        "first_reset_p99_s": pct(first_resets, 99),
        "reset_p50_s": pct(later_resets or first_resets, 50),
        "reset_p99_s": pct(later_resets or first_resets, 99),
        "warm_resets": warm_resets,
        "warm_resets_refused": warm_refused[:5],
        "browser_keeps": browser_keeps,
        "browser_keeps_refused": keep_refused[:5],
        "fresh_browser_reasons": fresh_reasons,
        "steps": len(step_times),
        "step_p50_s": pct(step_times, 50, 3),
        "step_p99_s": pct(step_times, 99, 3),
        "desktop_cpu_s_per_first_reset": round(statistics.mean(reset_cpu[True]), 2)
        if reset_cpu[True]
        else 0.0,
        "desktop_cpu_s_per_reset": round(statistics.mean(reset_cpu[False] or reset_cpu[True] or [0.0]), 2),
        # every process of the bench's tree (desktops, Chromium, this process's DevTools client and
        # Playwright's driver), reaped ones included (osworld_profile.CpuSampler); no other job's CPU
        "tree_cpu_s_per_first_reset": round(statistics.mean(tree_cpu[True]), 2) if tree_cpu[True] else 0.0,
        "tree_cpu_s_per_reset": round(statistics.mean(tree_cpu[False] or tree_cpu[True] or [0.0]), 2),
        "bench_process_cpu_s": round(host1.user + host1.system - host0.user - host0.system, 2),
        "steps_per_s": round(len(step_times) / step_wall, 2) if step_wall else 0.0,
        "desktop_cpu_s_per_step": round(cpu_step_s / max(1, len(step_times)), 3),
        "cpu_busy_during_steps": round(busy / max(1, total), 2),
        "pss_per_desktop_mib": round(statistics.mean(pss) / mib, 1) if pss else 0.0,
        "pss_max_desktop_mib": round(max(pss) / mib, 1) if pss else 0.0,
        "processes_per_desktop": round(statistics.mean(procs), 1) if procs else 0.0,
        "host_mem_used_per_desktop_mib": round((avail_before - avail_up) / max(1, len(up)) / mib, 1),
        "cpus": os.cpu_count() or 1,
        "close_wall_s": round(close_wall, 2),
        "leftover_processes": sum(len(_left_behind(d, pids)) for d, pids in episodes_up),
        "leftover_dirs": sum(os.path.exists(d.root_dir) for d, _ in episodes_up),
        "load_avg_1m_before": round(load_before, 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }


def bench_steady(
    n: int,
    domains: list[str],
    steps: int,
    observe: str,
    a11y_view: str,
    duration_s: float,
    seed: int = 0,
    think_s: float = 0.0,
) -> dict:
    """``n`` desktops started at once, then each runs episodes back to back for ``duration_s``
    (reset in place, then ``steps`` actions with the observation), as an RL loop's env workers do:
    resets and steps interleave, so these are the latencies with every desktop busy. A desktop's
    first episode takes a random 1..``steps`` actions, so the resets spread out as they do in RL.
    ``think_s``: seconds before each action, the policy's time to answer (0: a desktop is never idle)."""
    import random
    import threading

    rng = random.Random(seed)
    tasks = [json.loads(TASKS[domains[i % len(domains)]].read_text()) for i in range(n)]
    envs = [
        DesktopEnv(
            require_screenshot=observe in ("screenshot", "both"),
            require_a11y_tree=observe != "screenshot",
            provider_options={"warm_reset": True},
            a11y_view=a11y_view,
        )
        for _ in range(n)
    ]
    task_of = {id(env): task for env, task in zip(envs, tasks, strict=True)}
    first_steps = {id(env): rng.randint(1, steps) for env in envs}
    failures: list[str] = []
    t0 = time.perf_counter()
    up = [e for e, _ in _all_at_once(lambda e: _timed_reset(e, task_of[id(e)]), envs, failures, "start")]
    start_wall = time.perf_counter() - t0
    resets: list[float] = []
    step_times: list[float] = []
    episodes = [0]
    lock = threading.Lock()
    busy0, total0 = cpu_ticks()
    began = time.perf_counter()
    deadline = began + duration_s

    def run(env: DesktopEnv) -> None:
        k = first_steps[id(env)]
        while time.perf_counter() < deadline:
            times = _timed_steps(env, k, think_s)
            with lock:
                step_times.extend(times)
            if time.perf_counter() >= deadline:
                break
            took = _timed_reset(env, task_of[id(env)])
            with lock:
                resets.append(took)
                episodes[0] += 1
            k = steps

    _all_at_once(run, up, failures, "episode")
    wall = time.perf_counter() - began
    busy1, total1 = cpu_ticks()
    episodes_up = [(e.provider.desktop, e.provider.pids()) for e in envs if e.provider.desktop is not None]
    pss = [pss_bytes(pids) for _, pids in episodes_up]
    warm = sum(getattr(e.provider, "warm_resets", 0) for e in envs)
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(lambda e: e.close(), envs))
    time.sleep(1.0)
    return {
        "concurrent": n,
        "pattern": "steady",
        "domains": domains,
        "observe": observe,
        "a11y_view": a11y_view if observe != "screenshot" else None,
        "steps_per_episode": steps,
        "think_s": think_s,
        "duration_s": round(wall, 1),
        "started": len(up),
        "start_wall_s": round(start_wall, 2),
        "failed": len(failures),
        "failures": failures[:5],
        "episodes": episodes[0],
        "episodes_per_min": round(60 * episodes[0] / wall, 1) if wall else 0.0,
        "warm_resets": warm,
        "reset_p50_s": round(percentile(resets, 50), 2),
        "reset_p99_s": round(percentile(resets, 99), 2),
        "steps": len(step_times),
        "steps_per_s": round(len(step_times) / wall, 2) if wall else 0.0,
        "step_p50_s": round(percentile(step_times, 50), 3),
        "step_p99_s": round(percentile(step_times, 99), 3),
        "cpu_busy": round((busy1 - busy0) / max(1, total1 - total0), 2),
        "pss_per_desktop_mib": round(statistics.mean(pss) / (1 << 20), 1) if pss else 0.0,
        "cpus": os.cpu_count() or 1,
        "leftover_processes": sum(len(_left_behind(d, pids)) for d, pids in episodes_up),
        "leftover_dirs": sum(os.path.exists(d.root_dir) for d, _ in episodes_up),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }


def run_profile(domain: str, observe: str, repeats: int, as_json: bool, a11y_view: str = "agent") -> int:
    """Print one desktop's CPU per operation by process kind (``osworld_profile.py``)."""
    from osworld_profile import profile_ops

    env = DesktopEnv(
        require_screenshot=observe in ("screenshot", "both"),
        require_a11y_tree=observe != "screenshot",
        provider_options={"warm_reset": True},
        a11y_view=a11y_view,
    )
    try:
        ops = profile_ops(env, json.loads(TASKS[domain].read_text()), repeats)
        desktop, pids = env.provider.desktop, env.provider.pids()
    finally:
        env.close()
    time.sleep(1.0)
    result = {
        "profile": domain,
        "observe": observe,
        "a11y_view": a11y_view,
        "ops": ops,
        "leftover_processes": len(_left_behind(desktop, pids)),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if as_json:
        print(json.dumps(result), flush=True)
        return 0
    for name, op in ops.items():
        print(
            f"{name:<10} wall {op['wall_s']:.3f}s  desktop CPU {op['desktop_cpu_s']:.3f}s  "
            f"host CPU {op['host_cpu_s']:.3f}s  (mean of {op['repeats']})"
        )
        for kind, cpu in op["by_kind"].items():
            print(f"    {cpu:8.4f}  {kind}")
    print(f"leftover processes {result['leftover_processes']}  load {result['load_avg_1m']}")
    return 0


def _print_ratios(rows: list[dict], as_json: bool) -> None:
    """Per N: reset p50 of each reset mode against ``kept`` (how many times slower it is)."""
    for n in sorted({r["concurrent"] for r in rows if "reset" in r}):
        by = {r["reset"]: r for r in rows if r.get("concurrent") == n and "reset" in r}
        if "kept" not in by or not by["kept"]["reset_p50_s"]:
            continue
        ratios = {
            mode: round(r["reset_p50_s"] / by["kept"]["reset_p50_s"], 2)
            for mode, r in by.items()
            if mode != "kept"
        }
        line = {"concurrent": n, "reset_p50_ratio_to_kept": ratios}
        print(json.dumps(line) if as_json else f"N={n}: reset p50 ratio to kept {ratios}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--domains", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--concurrent", type=int, nargs="+", metavar="N", help="desktops at once (several: one run each)"
    )
    parser.add_argument("--observe", default="tree", choices=["tree", "screenshot", "both"])
    parser.add_argument(
        "--a11y-view",
        default="agent",
        choices=["agent", "full"],
        help="the tree observed: what the RL env reads (agent) or OSWorld's whole XML (full)",
    )
    parser.add_argument(
        "--reset",
        nargs="+",
        default=["fresh"],
        choices=["fresh", "warm", "kept"],
        help="one run per N and each (kept: reset in place keeping Chromium; see chrome_keep.py)",
    )
    parser.add_argument(
        "--episodes-per-desktop", type=int, default=1, help="resets per desktop (warm: in place)"
    )
    parser.add_argument(
        "--mib-per-desktop", type=int, default=450, help="memory a desktop may need (skip guard)"
    )
    parser.add_argument("--reserve-gib", type=float, default=4.0, help="MemAvailable to leave to others")
    parser.add_argument(
        "--pattern",
        default="lockstep",
        choices=["lockstep", "steady"],
        help="lockstep: all reset, then all step, at once; steady: each desktop runs episodes back to back",
    )
    parser.add_argument(
        "--duration", type=float, default=120.0, help="seconds of episodes (--pattern steady)"
    )
    parser.add_argument(
        "--think-s", type=float, default=0.0, help="seconds before each action (--pattern steady): the policy"
    )
    parser.add_argument("--profile", action="store_true", help="CPU by process kind, one desktop")
    parser.add_argument("--profile-repeats", type=int, default=10)
    args = parser.parse_args(argv)
    if args.profile:
        return run_profile(args.domains[0], args.observe, args.profile_repeats, args.json, args.a11y_view)
    if args.concurrent:
        if min(args.concurrent) < 1:
            parser.error("--concurrent takes positive counts")
        rows = []
        for n, flags in [(n, f) for n in args.concurrent for f in args.reset]:
            need = int(n * args.mib_per_desktop * (1 << 20) + args.reserve_gib * (1 << 30))
            if mem_available() < need:  # the machine may be shared: never push it into the OOM killer
                rows.append(
                    {
                        "concurrent": n,
                        "skipped": f"MemAvailable {mem_available() >> 20} MiB < {need >> 20} MiB",
                    }
                )
                print(
                    json.dumps(rows[-1]) if args.json else f"N={n}: skipped, {rows[-1]['skipped']}",
                    flush=True,
                )
                continue
            if args.pattern == "steady":
                rows.append(
                    bench_steady(
                        n,
                        args.domains,
                        args.steps,
                        args.observe,
                        args.a11y_view,
                        args.duration,
                        think_s=args.think_s,
                    )
                )
            else:
                rows.append(
                    bench_concurrent(
                        n,
                        args.domains,
                        args.steps,
                        args.observe,
                        flags,
                        args.episodes_per_desktop,
                        args.a11y_view,
                    )
                )
            if args.json:  # one JSON object per line, as each N finishes
                print(json.dumps(rows[-1]), flush=True)
            elif args.pattern == "steady":
                r = rows[-1]
                print(
                    f"N={n:<3} steady think {r['think_s']:g}s started {r['started']}/{n}  "
                    f"{r['episodes']} episodes "
                    f"({r['episodes_per_min']}/min)  reset p50 {r['reset_p50_s']:.2f}s "
                    f"p99 {r['reset_p99_s']:.2f}s  "
                    f"step p50 {r['step_p50_s']:.2f}s p99 {r['step_p99_s']:.2f}s  cpu {r['cpu_busy']:.0%}  "
                    f"failed {r['failed']}  leftovers {r['leftover_processes']} procs "
                    f"{r['leftover_dirs']} dirs",
                    flush=True,
                )
            else:
                r = rows[-1]
                print(
                    f"N={n:<3} {flags:<5} started {r['started']}/{n} ({r['start_rate_per_s']:.2f}/s)  "
                    f"first reset p50 {r['first_reset_p50_s']:.2f}s p99 {r['first_reset_p99_s']:.2f}s  "
                    f"reset p50 {r['reset_p50_s']:.2f}s p99 {r['reset_p99_s']:.2f}s  "
                    f"step p50 {r['step_p50_s']:.2f}s p99 {r['step_p99_s']:.2f}s  "
                    f"CPU-s/reset {r['tree_cpu_s_per_reset']:.2f}  "
                    f"PSS {r['pss_per_desktop_mib']:.0f} MiB/desktop  cpu {r['cpu_busy_during_steps']:.0%}  "
                    f"leftovers {r['leftover_processes']} procs {r['leftover_dirs']} dirs  "
                    f"load {r['load_avg_1m_before']}->{r['load_avg_1m_after']}"
                    + (f"  browser kept {r['browser_keeps']}" if flags == "kept" else ""),
                    flush=True,
                )
        _print_ratios(rows, args.json)
        return 0
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
