"""The Ray runtime against the local one, and two engine replicas against one.

    python bench/runtime.py --json [--repeats 2]

ray_over_local: trained tokens/s of ``runtime: ray`` (1 engine, 1 env worker, 1 learner rank) over
``runtime: local`` on the same async training workload (tiny model, multi-turn env), steady state (the
first ``--warmup`` steps of each run are not counted, nor is actor start-up). Runs alternate local, ray,
local, ray, ...; the ratio is of the summed tokens over the summed time of each side.

two_engines_over_one: generated tokens/s of the rollouts alone (the controller fills batches that nothing
trains on) with 2 engine replicas over 1, on a generation-bound workload: long single-turn completions of a
larger model, no env latency, one torch thread per engine. Runs alternate 1, 2, 1, 2, ...

Other work on this machine slows both sides alike only when it is steady: the load average before and
after is printed with the results. On Linux with autogroup scheduling (``/proc/sys/kernel/sched_autogroup_
enabled``), all processes of this session share one session's CPU share: while other sessions keep the
cores busy, a second engine process cannot get more CPU than the first had, and two_engines_over_one
stays near 1 whatever the runtime does. Measure it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import ray

from rz_agents.engine import EngineConfig
from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.runtime import (
    ActorsConfig,
    EnvSpec,
    LearnerSpec,
    ModelSpec,
    RolloutSpec,
    TrainConfig,
    build_run,
)
from rz_agents.trainer.optim import OptimConfig


def training_config(args, runtime: str) -> TrainConfig:
    extra = {"actors": ActorsConfig()} if runtime == "ray" else {}
    return TrainConfig(
        runtime=runtime,
        mode="async",
        steps=args.warmup + args.steps,
        seed=0,
        num_threads=1,
        model=ModelSpec(
            tiny_overrides={"hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 256}
        ),
        env=EnvSpec(kwargs={"max_turns": 2, "latency_s": 0.01}),
        engine=EngineConfig(max_running=48, max_len=256, max_batch_tokens=2048),
        rollout=RolloutSpec(
            group_size=4,
            groups_per_batch=4,
            max_concurrent_episodes=32,
            max_lag=64,
            max_ahead_batches=2,
            limits=EpisodeLimits(max_turns=2, max_tokens_per_turn=32, max_episode_tokens=200),
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=1e-3)),
        **extra,
    )


def generation_config(args, engines: int) -> TrainConfig:
    return TrainConfig(
        runtime="ray",
        actors=ActorsConfig(engines=engines, env_workers=1),
        mode="async",
        seed=0,
        num_threads=1,
        model=ModelSpec(
            tiny_overrides={"hidden_size": args.gen_hidden, "num_hidden_layers": 4, "intermediate_size": 768}
        ),
        env=EnvSpec(kwargs={"max_turns": 1, "latency_s": 0.0}),
        engine=EngineConfig(max_running=64, max_len=256, max_batch_tokens=4096),
        rollout=RolloutSpec(
            group_size=4,
            groups_per_batch=4,
            max_concurrent_episodes=args.gen_concurrency,
            max_lag=64,
            limits=EpisodeLimits(max_turns=1, max_tokens_per_turn=160, max_episode_tokens=200),
        ),
    )


def trained_tokens_per_s(args, runtime: str) -> float:
    run = build_run(training_config(args, runtime))
    try:
        asyncio.run(run.train())
        steady = run.history[args.warmup :]
        return sum(m["learner_tokens"] for m in steady) / sum(m["time_step_s"] for m in steady)
    finally:
        run.close()


def generated_tokens_per_s(args, engines: int) -> tuple[float, float]:
    """(generated tokens/s, the driver's CPU seconds per wall second) of the rollouts alone."""
    run = build_run(generation_config(args, engines))

    async def rollouts_only() -> tuple[float, float]:
        c = run.controller
        producer = asyncio.ensure_future(c.run())
        try:
            for i in range(args.gen_warmup + args.gen_batches):
                if i == args.gen_warmup:
                    t0, tokens0 = time.perf_counter(), run.engine.counters["generated_tokens"]
                    cpu0 = time.process_time()
                await c.next_batch(0)
                c.step_done()
            wall = time.perf_counter() - t0
            tokens = run.engine.counters["generated_tokens"] - tokens0
            return tokens / wall, (time.process_time() - cpu0) / wall
        finally:
            c.stop()
            await asyncio.gather(producer, return_exceptions=True)

    try:
        return asyncio.run(rollouts_only())
    finally:
        run.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=8, help="measured training steps per run")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--gen-batches", type=int, default=8, help="measured rollout batches per run")
    p.add_argument("--gen-warmup", type=int, default=2)
    p.add_argument("--gen-hidden", type=int, default=256)
    p.add_argument("--gen-concurrency", type=int, default=32)
    p.add_argument("--skip", choices=["training", "generation"], default=None)
    args = p.parse_args()

    load_before = os.getloadavg()
    # As a run's local instance does (RayConfig): no memory monitor, actors at nice 0 (Ray's default is 15).
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(num_cpus=8, object_store_memory=256 * 2**20, include_dashboard=False, logging_level="WARNING")
    result: dict = {"cores": os.cpu_count(), "load_before": load_before}
    try:
        if args.skip != "training":
            local, on_ray = [], []
            for _ in range(args.repeats):
                local.append(trained_tokens_per_s(args, "local"))
                on_ray.append(trained_tokens_per_s(args, "ray"))
                print(f"trained tokens/s  local {local[-1]:,.0f}   ray {on_ray[-1]:,.0f}", file=sys.stderr)
            result.update(
                local_trained_tokens_per_s=local,
                ray_trained_tokens_per_s=on_ray,
                ray_over_local=sum(on_ray) / sum(local),
            )
        if args.skip != "generation":
            one, two, driver = [], [], []
            for _ in range(args.repeats):
                for n, out in ((1, one), (2, two)):
                    tps, cpu = generated_tokens_per_s(args, n)
                    out.append(tps)
                    driver.append(cpu)
                print(
                    f"generated tokens/s  1 engine {one[-1]:,.0f}   2 engines {two[-1]:,.0f}", file=sys.stderr
                )
            result.update(
                one_engine_generated_tokens_per_s=one,
                two_engines_generated_tokens_per_s=two,
                two_engines_over_one=sum(two) / sum(one),
                driver_cpu_per_wall_s=driver,  # the driver's share of a core, runs 1, 2, 1, 2, ...
            )
    finally:
        ray.shutdown()
    result["load_after"] = os.getloadavg()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
