"""Training-step throughput of async (max_lag 64) vs sync REINFORCE Zero on the same multi-turn workload.

    python bench/async_vs_sync.py --json
    python bench/async_vs_sync.py --env python_tool --json      # the Python tool env

Both modes run the same code (the local runtime); sync is max_lag = 0: generate a batch, train, publish.
Both keep the same number of episodes in flight: sync can only ever run one batch at a time (its
lag bound admits nothing more), so async's max_concurrent_episodes is one batch too (--concurrency,
default group_size x groups_per_batch; a larger value is allowed and reported, but then async also
gains from overlapping several batches' env latency, and the ideal bound below no longer bounds it).
The episodes actually in flight are sampled every 20 ms in both runs and reported.

The sync run also measures where its time goes: waiting for data (generation + env) and the learner step
(training + weight publication). From those, in the same process:

    ideal_ratio     = (gen_env + train) / max(gen_env, train)   what overlapping the two phases can give
    async_over_sync = async steps/s / sync steps/s              what the async runtime achieved
    fraction_of_ideal = async_over_sync / ideal_ratio           goal >= 0.9

Every per-step figure (steps/s, wait, train, publish, engine forward) covers the same steps: those after
the --warmup first steps of each run.

On 2 CPU cores, generation and training share the cores: both use ``--threads`` torch threads (1 each by
default, so each phase has one core; torch's thread count is process-wide, and alignment needs the engine
and the learner to use the same count).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.runtime import EnvSpec, LearnerSpec, LocalRun, ModelSpec, RolloutSpec, TrainConfig
from rz_agents.trainer.optim import OptimConfig


def _config(args, mode: str) -> TrainConfig:
    if args.env == "python_tool":
        # A random tiny policy rarely writes a tool call: its episodes are the sandbox boot (bubblewrap) at
        # reset plus math-verify scoring of the answer, real subprocess latency either way.
        env = EnvSpec(
            id="rz_agents/PythonTool-v0", kwargs={"max_turns": args.turns, "prompt_style": "compact"}
        )
    else:
        env = EnvSpec(kwargs={"max_turns": args.turns, "latency_s": args.env_latency})
    return TrainConfig(
        mode=mode,
        steps=args.warmup + args.steps,
        num_threads=args.threads,
        seed=args.seed,
        model=ModelSpec(
            tiny_overrides={
                "hidden_size": args.hidden,
                "num_hidden_layers": args.layers,
                "intermediate_size": 2 * args.hidden,
            }
        ),
        env=env,
        rollout=RolloutSpec(
            group_size=args.group_size,
            groups_per_batch=args.groups_per_batch,
            max_concurrent_episodes=args.concurrency,
            max_lag=args.max_lag,
            max_ahead_batches=args.max_ahead,
            limits=EpisodeLimits(args.turns, args.tokens_per_turn, max_episode_tokens=1000),
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=1e-3)),
        learner_process=args.learner_process == "on",
        **_pinning(args),
    )


def _pinning(args) -> dict:
    """--pin: the learner process gets the last CPU, engine + envs the others (needs the learner process)."""
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin == "off" or args.learner_process == "off" or len(cpus) < 2:
        return {}
    return {"learner_cpus": cpus[-1:], "rollout_cpus": cpus[:-1]}


def _mean_positive(values: list[int]) -> float:
    pos = [v for v in values if v > 0]
    return sum(pos) / len(pos) if pos else 0.0


def _measure(args, mode: str) -> dict:
    import asyncio

    from rz_agents.engine import EngineConfig

    cfg = _config(args, mode)
    cfg.engine = EngineConfig(max_running=args.concurrency + 8, max_len=1040, max_batch_tokens=1024)
    run = LocalRun(cfg)
    samples: list[
        tuple[float, int, int, float]
    ] = []  # (time, steps done, episodes in flight, engine forward s)

    async def sample(done: asyncio.Event) -> None:
        c = run.controller.counters
        while not done.is_set():
            in_flight = c["episodes_started"] - c["episodes_finished"] - c["episodes_failed"]
            samples.append(
                (time.perf_counter(), len(run.history), in_flight, run.engine.counters["forward_s"])
            )
            try:
                await asyncio.wait_for(done.wait(), 0.02)
            except TimeoutError:
                pass

    async def train_and_sample():
        done = asyncio.Event()
        sampler = asyncio.ensure_future(sample(done))
        try:
            return await run.train()
        finally:
            done.set()
            await sampler

    try:
        t0 = time.perf_counter()
        summary = asyncio.run(train_and_sample())
        wall = time.perf_counter() - t0
    finally:
        run.close()
    h = run.history[args.warmup :]
    n = len(h)
    # Steady state: from the end of the last warm-up step to the end of the run.
    step_ends, t = [], 0.0
    for m in run.history:
        t += m["time_step_s"]
        step_ends.append(t)
    span = step_ends[-1] - step_ends[args.warmup - 1] if args.warmup else step_ends[-1]
    measured = [s for s in samples if s[1] >= args.warmup]
    # engine forward seconds over the measured steps (the counter at the first measured sample is the
    # value at the end of the warm-up, within one 20 ms sample)
    gen_s = (summary["engine"]["forward_s"] - measured[0][3]) / n if measured else float("nan")

    def mean(key):
        return sum(m[key] for m in h) / n

    return {
        "mode": mode,
        "steps_measured": n,
        "steps_per_s": n / span,
        "wall_s_total": wall,
        "episodes_in_flight_mean": sum(s[2] for s in measured) / max(len(measured), 1),
        # sync idles while it trains: its mean over the samples where anything was running
        "episodes_in_flight_mean_while_running": _mean_positive([s[2] for s in measured]),
        "episodes_in_flight_max": max((s[2] for s in measured), default=0),
        "max_concurrent_episodes": cfg.rollout.max_concurrent_episodes,
        "wait_data_s": mean("time_wait_data_s"),
        "train_s": mean("time_forward_s") + mean("time_backward_s") + mean("time_optimizer_s"),
        "publish_s": mean("time_publish_s"),
        "engine_forward_s": gen_s,
        "train_thread_cpu_s": mean("learner_thread_cpu_s"),
        "step_s": mean("time_step_s"),
        "max_lag_seen": max(m.get("lag_max", 0) for m in h),
        "lag_mean": sum(m.get("lag_mean", 0) for m in h) / n,
        "reward_first": run.history[0].get("reward_mean"),
        "reward_last": run.history[-1].get("reward_mean"),
        "dropped_stale_groups": summary["rollout"]["groups_dropped_stale"],
        "episodes_failed": summary["rollout"]["episodes_failed"],
    }


def main(argv=None) -> int:
    """Run both modes and print the comparison."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--env", choices=["stand_in", "python_tool"], default="stand_in")
    p.add_argument("--env-latency", type=float, default=0.3, help="stand-in env: seconds per step (sleep)")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--tokens-per-turn", type=int, default=16)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--groups-per-batch", type=int, default=4)
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="episodes in flight in both modes (default: one batch, group_size x groups_per_batch)",
    )
    p.add_argument("--max-lag", type=int, default=64)
    p.add_argument(
        "--max-ahead", type=int, default=None, help="batches rollouts may run ahead (default: max_lag + 1)"
    )
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument(
        "--pin", choices=["on", "off"], default="on", help="pin learner and rollouts to separate CPUs"
    )
    p.add_argument(
        "--learner-process",
        choices=["on", "off"],
        default="on",
        help="learner in a child process (on) or a thread of the engine's process (off: shares the GIL)",
    )
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.concurrency is None:
        args.concurrency = args.group_size * args.groups_per_batch
    if args.warmup < 1:
        p.error("--warmup must be >= 1 (the first step includes start-up costs)")

    load0 = os.getloadavg()[0]
    sync = _measure(args, "sync")
    asyn = _measure(args, "async")
    gen_env, train = sync["wait_data_s"], sync["train_s"] + sync["publish_s"]
    ideal = (gen_env + train) / max(gen_env, train)
    ratio = asyn["steps_per_s"] / sync["steps_per_s"]
    # Generation vs env inside the sync wait: the engine's forward time is generation; the rest is env + glue.
    gen = sync["engine_forward_s"]
    env = max(gen_env - gen, 0.0)
    ideal3 = (gen + env + train) / max(gen, env, train)
    out = {
        "async_over_sync": ratio,
        "ideal_ratio": ideal,
        "fraction_of_ideal": ratio / ideal,
        "ideal_ratio_3way": ideal3,
        "episodes_in_flight_mean": {
            "sync": sync["episodes_in_flight_mean"],
            "async": asyn["episodes_in_flight_mean"],
        },
        "max_lag_seen": asyn["max_lag_seen"],
        "sync": sync,
        "async": asyn,
        "sync_gen_s_per_step": gen,
        "sync_env_s_per_step": env,
        "sync_train_s_per_step": train,
        "workload": vars(args),
        "loadavg_start_end": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"async/sync = {ratio:.2f}x  (ideal {ideal:.2f}x, {ratio / ideal:.0%} of it; 3-way ideal "
            f"{ideal3:.2f}x)\n"
            f"episodes in flight: max sync {sync['episodes_in_flight_max']} / async "
            f"{asyn['episodes_in_flight_max']}, mean while running sync "
            f"{sync['episodes_in_flight_mean_while_running']:.1f} / async "
            f"{asyn['episodes_in_flight_mean_while_running']:.1f}\n"
            f"sync: gen {gen:.2f}s + env {env:.2f}s + train {train:.2f}s per step; "
            f"async max lag {asyn['max_lag_seen']:.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
