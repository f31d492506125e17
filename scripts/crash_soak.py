#!/usr/bin/env python3
"""Crash soak: the demo workload (async mode) killed with SIGKILL at random moments, resumed each time.

    python scripts/crash_soak.py [--kills 20] [--steps 40] [--run-dir DIR] [--warm-start-model DIR]

1. A warm-start model is made once (the demo's supervised warm start, `steps=0`), unless given.
2. `rz train configs/demo.yaml --run-dir R model.checkpoint=<warm start> warm_start.demos=0
   checkpoint_every=1 steps=N` is started and SIGKILLed at a random moment; then `rz train --resume R`
   again and again, each launch killed, until --kills kills were made; the last launch runs to the end.
   The moments: a share while the launch starts up (before its first learner step), a share inside a
   checkpoint write (at a random time after the first step, the next write's temporary file is awaited
   and the process killed as soon as it appears; a torn temporary file left behind confirms the kill
   landed inside the write), the rest at a random time after the first learner step.
3. After every kill the surviving checkpoint is loaded and checked: a consistent cut (every started group
   trained, queued or in flight), steps_done equal to its history, no group index trained twice, its
   history equal to the first rows of metrics.jsonl. (Every checkpoint is also checked by the run itself
   when it is written.) A launch that makes no progress for --hang-s is a hang: the soak fails.
4. At the end: all steps done, every step number exactly once in metrics.jsonl, the group indices of
   the trained batches all distinct, the final checkpoint a consistent cut.

Prints a JSON summary (also written to R/soak_summary.json); exit code 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "kernels")]

from rz_agents.rollout.checkpoint_cut import check_consistent_cut  # noqa: E402
from rz_agents.trainer.checkpoint import load_checkpoint  # noqa: E402

PLANS = ("startup", "training", "write")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "kernels"), env.get("PYTHONPATH", "")])
    return env


def _rz(*args: str) -> list[str]:
    return [sys.executable, "-m", "rz_agents", "train", *args, "--no-progress"]


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line torn by the kill
            pass
    return rows


def _torn_tmp(run_dir: Path) -> list[Path]:
    return list(run_dir.glob(".checkpoint.pt.*.tmp"))


def make_warm_start_model(config: str, out: Path, extra: list[str]) -> Path:
    """The demo's warm start alone (steps=0); returns the exported model directory."""
    model = out / "warm_start_model"
    if (model / "config.json").is_file():
        return model
    print(f"[soak] making the warm-start model in {out} (the demo's supervised warm start) ...", flush=True)
    cmd = _rz(config, "--run-dir", str(out), "steps=0", "report=false", "export_final_model=false", *extra)
    subprocess.run(cmd, check=True, env=_env(), stdout=subprocess.DEVNULL)
    return model


def check_checkpoint(run_dir: Path) -> dict:
    """Check the run directory's checkpoint (if any) against the invariant and metrics.jsonl."""
    path = run_dir / "checkpoint.pt"
    if not path.is_file():
        return {"steps": 0, "checked": False}
    payload = load_checkpoint(path, restore_rng=False)
    history = payload["runtime"]["history"]
    state = payload["runtime"]["controller"]
    trained = [list(m["group_indices"]) for m in history]
    check_consistent_cut(state, len(history), trained, where=str(path))
    flat = [i for batch in trained for i in batch]
    assert len(flat) == len(set(flat)), f"{path}: a group trained twice"
    assert state["steps_done"] == len(history), f"{path}: steps_done {state['steps_done']} != {len(history)}"
    rows = _rows(run_dir)
    assert [r["step"] for r in rows[: len(history)]] == list(range(len(history))), f"{path}: metrics rows"
    assert [r["group_indices"] for r in rows[: len(history)]] == trained, f"{path}: metrics vs history"
    c = state["counters"]
    return {
        "steps": len(history),
        "checked": True,
        "queued": len(state["queued"]),
        "in_flight": len(state["in_flight"]),
        "groups_started": c["groups_started"],
        "groups_trained": c["groups_trained"],
        "dropped": c["groups_dropped_failed"] + c["groups_dropped_stale"],
    }


def launch(cmd: list[str], run_dir: Path, plan: tuple[str, float] | None, hang_s: float, log) -> dict:
    """Run ``cmd`` and SIGKILL it as ``plan`` says: ("startup", t) t s after the start; ("training", t) t s
    after its first learner step; ("write", t) at the first checkpoint write that begins t s after its first
    learner step. None: let it finish. Raises AssertionError if no metrics row appears for ``hang_s`` s."""
    log_path = run_dir / "soak_stderr.log"
    stderr = open(log_path, "a")  # noqa: SIM115 (closed below)
    offset = stderr.tell()
    tmp_before = set(_torn_tmp(run_dir))
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=stderr)
    rows0 = len(_rows(run_dir))
    last_rows, last_change, next_look = rows0, t0, t0
    trained_from = None  # when this launch logged its first learner step
    killed = False
    try:
        while proc.poll() is None:
            now = time.monotonic()
            if plan is not None:
                kind, delay = plan
                origin = t0 if kind == "startup" else trained_from
                due = origin is not None and now - origin >= delay
                if due and (kind != "write" or _torn_tmp(run_dir)):
                    os.kill(proc.pid, signal.SIGKILL)
                    killed = True
                    break
                if due and kind == "write":
                    time.sleep(0.0005)  # poll fast for the temporary file of the next checkpoint write
                    continue
            if now >= next_look:  # progress (a new metrics row), a hang, the first learner step
                next_look = now + 0.05
                n = len(_rows(run_dir))
                if n != last_rows:
                    last_rows, last_change = n, now
                elif now - last_change > hang_s:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
                    raise AssertionError(f"launch hung: no new metrics row for {hang_s:.0f} s ({cmd})")
                if trained_from is None:
                    with open(log_path) as f:
                        f.seek(offset)
                        if any(line.startswith("step ") for line in f.read().splitlines()):
                            trained_from = now
            time.sleep(0.02)
        proc.wait()
    finally:
        stderr.close()
    rc = proc.returncode
    if not killed and rc != 0:
        raise AssertionError(f"launch failed with exit code {rc}; see {run_dir / 'soak_stderr.log'}")
    result = {
        "killed": killed,
        "plan": plan[0] if plan else "finish",
        "delay_s": round(plan[1], 2) if plan else None,
        # A new torn temporary file: the kill landed between the start and the rename of a checkpoint write.
        "killed_inside_write": killed and bool(set(_torn_tmp(run_dir)) - tmp_before),
        "seconds": round(time.monotonic() - t0, 1),
        "rows_before": rows0,
        "rows_after": len(_rows(run_dir)),
    }
    log(result)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(REPO / "configs" / "demo.yaml"))
    p.add_argument("--run-dir", default="/tmp/rz_crash_soak/run")
    p.add_argument(
        "--warm-start-model",
        default=None,
        help="HF dir to start from; 'none': the config's random init; default: made once by the warm start",
    )
    p.add_argument("--warm-start-dir", default="/tmp/rz_crash_soak/warm", help="where the warm start is made")
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument(
        "--span-s", type=float, default=12.0, help="kills fall up to this long after a launch's first step"
    )
    p.add_argument("--startup-s", type=float, default=8.0, help="startup kills: up to this long after start")
    p.add_argument("--startup-kill-fraction", type=float, default=0.15, help="kills while the run starts")
    p.add_argument("--write-kill-fraction", type=float, default=0.35, help="kills inside a checkpoint write")
    p.add_argument("--hang-s", type=float, default=240.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for the run")
    args = p.parse_args()

    rng = random.Random(args.seed)
    run_dir = Path(args.run_dir)
    if (run_dir / "checkpoint.pt").exists():
        sys.exit(f"{run_dir} already holds a run; give a fresh --run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    events = []

    def log(result: dict) -> None:
        events.append(result)
        print(f"[soak] {json.dumps(result)}", flush=True)

    if args.warm_start_model == "none":  # the config's own model (random init), no warm start
        start = []
    else:
        model = args.warm_start_model or make_warm_start_model(
            args.config, Path(args.warm_start_dir), args.overrides
        )
        start = [f"model.checkpoint={model}"]
    first = _rz(
        args.config,
        "--run-dir",
        str(run_dir),
        *start,
        "warm_start.demos=0",
        "checkpoint_every=1",
        f"steps={args.steps}",
        "mode=async",
        "report=false",
        "export_final_model=false",
        *args.overrides,
    )
    resume = _rz("--resume", str(run_dir))
    t_start = time.monotonic()
    checks, failures = [], []
    kills = 0
    try:
        while True:
            cmd = first if not (run_dir / "config.yaml").exists() else resume
            plan = None  # the last launch runs to the end
            if kills < args.kills:
                # Shorter spans when few steps are left for the kills still to come, so the run does not
                # finish before every kill was made (a launch makes roughly one step per few seconds).
                left = args.steps - (checks[-1]["steps"] if checks else 0)
                span = args.span_s * min(1.0, left / (3.0 * (args.kills - kills)))
                u = rng.random()
                if u < args.startup_kill_fraction:
                    plan = ("startup", rng.uniform(0.5, args.startup_s))
                elif u < args.startup_kill_fraction + args.write_kill_fraction:
                    plan = ("write", rng.uniform(0.0, span))
                else:
                    plan = ("training", rng.uniform(0.0, span))
            result = launch(cmd, run_dir, plan, args.hang_s, log)
            check = check_checkpoint(run_dir)
            checks.append(check)
            print(f"[soak] checkpoint after launch {len(events)}: {json.dumps(check)}", flush=True)
            if result["killed"]:
                kills += 1
            else:
                break
    except AssertionError as e:
        failures.append(str(e))

    rows = _rows(run_dir)
    steps = [r["step"] for r in rows]
    trained = [i for r in rows for i in r.get("group_indices", [])]
    summary_file = run_dir / "summary.json"
    final = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    if not failures:
        if final.get("steps") != args.steps:
            failures.append(f"summary.json steps {final.get('steps')} != {args.steps}")
        if steps != list(range(args.steps)):
            failures.append(f"metrics.jsonl steps are not 0..{args.steps - 1} once each: {steps}")
        if len(trained) != len(set(trained)):
            failures.append(f"{len(trained) - len(set(trained))} group indices trained more than once")
    report = {
        "ok": not failures,
        "failures": failures,
        "kills": kills,
        "kills_by_plan": {k: sum(e["killed"] and e["plan"] == k for e in events) for k in PLANS},
        "kills_inside_checkpoint_writes": sum(e["killed_inside_write"] for e in events),
        "launches": len(events),
        "checkpoints_checked": sum(c["checked"] for c in checks),
        "resumed_from_steps": [c["steps"] for c in checks],
        "steps_logged": len(steps),
        "distinct_steps": len(set(steps)),
        "groups_trained": len(trained),
        "distinct_groups_trained": len(set(trained)),
        "wall_s": round(time.monotonic() - t_start, 1),
        "final_reward_end": final.get("reward_end"),
    }
    (run_dir / "soak_summary.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
