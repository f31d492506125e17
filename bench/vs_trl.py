"""Whole RL runs, rz vs TRL's GRPO trainer: the same model, task, batch shape, optimizer and threads.

Both sides train SmolLM2-135M-Instruct (the packaged checkpoint, fp32) on one-turn plain-text word problems
(bench/vs_trl_task.py: the same generator, prompt and 0/1 boxed-answer reward), --steps RL steps of
--prompts-per-step prompts x --group-size samples (the episodes per step), at most --max-tokens generated
tokens each, temperature 1, AdamW at --lr (betas 0.9/0.999, no weight decay), no KL term and no reference
model, one optimizer step per batch, --threads threads on every side.

  rz   ``rz train`` on a generated config: the aligned engine and learner in one process, async REINFORCE Zero
       (rollouts one batch ahead of the learner, max_lag 64), no warm start.
  trl  ``trl.GRPOTrainer`` (trl 1.16, transformers' generate on CPU) with GRPOConfig matching the above
       (beta 0, num_iterations 1, per-device batch = the episodes per step, num_generations = group size).
       TRL lives in its own environment (--trl-python; default /work/venvs/trl/bin/python, a venv made with
       --system-site-packages, which shares this torch 2.13 / transformers 5.19: trl 1.16 pins neither;
       `bash scripts/install_trl.sh` makes it).

Each side runs in a process of its own (its peak RSS: the process tree's resident set sampled every 50 ms);
--rounds rounds alternate which side goes first. Per side: episodes/s, generated tokens/s and learner
(trained: prompt and completion) tokens/s over the whole run, start-up included (model load, the aligned
kernels' guards, the trainer's set-up: each side pays its own), per CPU-second of the side's processes
(--metric cpu, the default: robust on a shared machine) or per wall-second (--metric wall: an idle machine
only); wall and CPU seconds per step, peak RSS, and the mean reward of the last step's episodes. rz's
generated tokens include the rollouts it ran ahead of the last step (async); its episodes are the trained
ones. Ratios are rz/TRL per round, then the median over rounds.

  python bench/vs_trl.py --json                         # default: 3 steps x 16 episodes, 1 round (~15 min)
  python bench/vs_trl.py --json --steps 10 --rounds 2   # a longer, steadier comparison
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIDES = ("rz", "trl")
GB = 2**30
DEFAULT_TRL_PYTHON = "/work/venvs/trl/bin/python"


# -- the rz side ---------------------------------------------------------------------------------------
def rz_config(a, run_dir: Path) -> dict:
    """The ``rz train`` config of this comparison."""
    episode_tokens = 512
    return {
        "description": "bench/vs_trl.py: rz side",
        "mode": "async",
        "steps": a.steps,
        "seed": a.seed,
        "num_threads": a.threads,
        "tokenizer": "checkpoint",
        "tensorboard": False,
        "report": False,
        "export_final_model": False,
        "output_dir": str(run_dir),
        # no stall watchdog (TRL has none): on a loaded shared machine one learner step can outlast its 600 s
        "watchdog_s": 0,
        "model": {
            "checkpoint": "smollm2-135m-instruct",
            "kernels": "aligned",
            "dtype": "float32",
            "activation_checkpointing": False,
        },
        "env": {"id": "vs_trl_task:WordProblemTextEnv", "kwargs": {"max_turns": 1}},
        "engine": {
            "max_running": a.prompts_per_step * a.group_size,
            "max_len": episode_tokens + 64,
            "max_batch_tokens": 2048,
        },
        "rollout": {
            "group_size": a.group_size,
            "groups_per_batch": a.prompts_per_step,
            "max_concurrent_episodes": a.prompts_per_step * a.group_size,
            "max_lag": 64,
            "max_ahead_batches": 2,
            "temperature": 1.0,
            "limits": {
                "max_turns": 1,
                "max_tokens_per_turn": a.max_tokens,
                "max_episode_tokens": episode_tokens,
            },
        },
        # one micro-batch holds a whole step (16 episodes of at most ~200 tokens), as TRL's one batch does
        "learner": {"micro_batch_tokens": 4096, "optim": {"lr": a.lr}},
        "warm_start": {"demos": 0},
    }


def rz_side(a) -> dict:
    """One ``rz train`` run in this process; its per-step figures from the run directory."""
    import yaml

    from rz_agents.cli import main as rz_main

    with tempfile.TemporaryDirectory(prefix="vs_trl_rz_") as tmp:
        run_dir = Path(tmp) / "run"
        cfg = Path(tmp) / "vs_trl.yaml"
        cfg.write_text(yaml.safe_dump(rz_config(a, run_dir)))
        t0 = time.perf_counter()
        rc = rz_main(["train", str(cfg), "--run-dir", str(run_dir), "--no-progress"])
        wall = time.perf_counter() - t0
        if rc != 0:
            log = run_dir / "rz.log"
            raise SystemExit(f"rz train exited {rc}: {log.read_text()[-3000:] if log.exists() else ''}")
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        summary = json.loads((run_dir / "summary.json").read_text())
    return {"wall_s": wall, "rows": rows, "summary": summary}


def rz_figures(out: dict) -> dict:
    """Episodes, generated and trained tokens and the last step's reward of an rz run."""
    rows = [r for r in out["rows"] if "version" in r or "step" in r]
    episodes = sum(int(r.get("batch_trajectories", 0)) for r in rows)
    learner_tokens = sum(int(r.get("learner_tokens", 0)) for r in rows)
    generated = int(out["summary"].get("generated_tokens") or 0)
    last = rows[-1] if rows else {}
    reward = last.get("reward_mean", last.get("reward"))
    return {
        "episodes": episodes,
        "generated_tokens": generated,
        "learner_tokens": learner_tokens,
        "last_step_reward": reward,
        "steps": len(rows),
    }


# -- the TRL side --------------------------------------------------------------------------------------
def trl_side(a) -> dict:
    """One ``GRPOTrainer.train()`` in this process (run under --trl-python)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, str(HERE))
    from vs_trl_task import problems, prompt_of, reward

    from rz_agents.model.gguf import smollm2_checkpoint_dir

    episodes = a.prompts_per_step * a.group_size
    data = problems(a.prompts_per_step * (a.steps + 1), a.seed)
    dataset = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": prompt_of(p["question"])}], "answer": p["answer"]}
            for p in data
        ]
    )
    counts = {"generated_tokens": 0, "learner_tokens": 0, "rewards": []}

    def boxed_answer(completions, answer, completion_ids=None, **_):
        """The 0/1 reward of the task module (and a count of the tokens TRL generated)."""
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores = [reward(t, g) for t, g in zip(texts, answer, strict=True)]
        if completion_ids is not None:
            counts["generated_tokens"] += sum(len(c) for c in completion_ids)
        counts["rewards"].append(sum(scores) / len(scores))
        return scores

    out_dir = tempfile.mkdtemp(prefix="vs_trl_trl_")
    config = GRPOConfig(
        output_dir=out_dir,
        use_cpu=True,
        seed=a.seed,
        max_steps=a.steps,
        learning_rate=a.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        optim="adamw_torch",
        per_device_train_batch_size=episodes,
        gradient_accumulation_steps=1,
        num_generations=a.group_size,
        max_completion_length=a.max_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        num_iterations=1,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        bf16=False,
        fp16=False,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    step_walls: list[float] = []

    class StepClock(TrainerCallback):
        """Wall time of each optimizer step, as the trainer sees it."""

        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            step_walls.append(time.perf_counter() - self.t)

    torch.manual_seed(a.seed)
    model = AutoModelForCausalLM.from_pretrained(smollm2_checkpoint_dir(), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(smollm2_checkpoint_dir())
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=boxed_answer,
        args=config,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[StepClock()],
    )
    t0 = time.perf_counter()
    trainer.train()
    train_wall = time.perf_counter() - t0
    logs = [h for h in trainer.state.log_history if "loss" in h or "reward" in h]
    # the learner trains every token of every episode's prompt and completion (TRL's forward); rz counts
    # the tokens it packs likewise
    learner_tokens = sum(int(h.get("num_tokens", 0)) for h in logs[-1:])
    return {
        "train_wall_s": train_wall,
        "step_walls": step_walls,
        "episodes": episodes * len(step_walls),
        "generated_tokens": counts["generated_tokens"],
        "learner_tokens_cumulative": learner_tokens,
        "last_step_reward": counts["rewards"][-1] if counts["rewards"] else None,
        "log": logs,
    }


# -- one side's process -------------------------------------------------------------------------------
class TreeRss:
    """Peak resident set of this process and its children, sampled every 50 ms by a daemon thread."""

    def __init__(self) -> None:
        import psutil

        self.proc, self.peak = psutil.Process(), 0
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        import psutil

        while True:
            try:
                rss = self.proc.memory_info().rss + sum(
                    c.memory_info().rss for c in self.proc.children(recursive=True)
                )
            except psutil.Error:
                rss = 0
            self.peak = max(self.peak, rss)
            time.sleep(0.05)


def worker(a) -> None:
    """Run one side and print one JSON line with its figures."""
    import torch

    torch.set_num_threads(a.threads)
    rss = TreeRss()
    t0 = time.perf_counter()
    if a.worker == "rz":
        out = rz_side(a)
        fig = rz_figures(out)
        wall = out["wall_s"]
        steps = fig.pop("steps")
    else:
        out = trl_side(a)
        fig = {k: out[k] for k in ("episodes", "generated_tokens", "last_step_reward")}
        fig["learner_tokens"] = out["learner_tokens_cumulative"]
        steps = len(out["step_walls"])
        wall = time.perf_counter() - t0  # the model load and trainer set-up included, like rz train's
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(u.ru_utime + u.ru_stime for u in usage)
    seconds = cpu if a.metric == "cpu" else wall
    print(
        json.dumps(
            {
                "side": a.worker,
                "steps": steps,
                "wall_s": wall,
                "cpu_s": cpu,
                "per": a.metric,
                "wall_per_step_s": wall / max(steps, 1),
                "cpu_per_step_s": cpu / max(steps, 1),
                "episodes_per_s": fig["episodes"] / seconds,
                "generated_tokens_per_s": fig["generated_tokens"] / seconds,
                "learner_tokens_per_s": fig["learner_tokens"] / seconds,
                "peak_rss_gb": rss.peak / GB,
                **fig,
            }
        ),
        flush=True,
    )


def run_side(a, side: str) -> dict:
    python = sys.executable if side == "rz" else a.trl_python
    argv = [python, str(Path(__file__).resolve()), "--worker", side]
    for k in ("steps", "prompts_per_step", "group_size", "max_tokens", "lr", "threads", "seed", "metric"):
        argv += [f"--{k.replace('_', '-')}", str(getattr(a, k))]
    path = os.pathsep.join([str(HERE), str(ROOT), str(ROOT / "kernels"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "PYTHONPATH": path, "TOKENIZERS_PARALLELISM": "0"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=a.timeout)
    if done.returncode != 0:
        raise SystemExit(f"{side} failed (rc {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="end with one JSON object (the summary)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts-per-step", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96, help="generated tokens per episode, at most")
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--metric",
        default="cpu",
        choices=["cpu", "wall"],
        help="rates per CPU-second of the side's processes (robust on a shared machine) or per wall-second",
    )
    ap.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    ap.add_argument("--trl-python", default=DEFAULT_TRL_PYTHON, help="the interpreter with trl installed")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per side process")
    ap.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return
    if "trl" in a.sides and not Path(a.trl_python).exists():
        raise SystemExit(f"--trl-python {a.trl_python} does not exist: make a venv with trl (see --help)")
    t_start, load_start = time.time(), os.getloadavg()[0]
    rounds = []
    for r in range(a.rounds):
        order = a.sides[r % len(a.sides) :] + a.sides[: r % len(a.sides)]  # alternate who goes first
        this = {side: run_side(a, side) for side in order}
        rounds.append(this)
        if not a.json:
            print(f"round {r + 1}: {json.dumps(this)}", flush=True)
    keys = (
        "episodes_per_s",
        "generated_tokens_per_s",
        "learner_tokens_per_s",
        "wall_per_step_s",
        "cpu_per_step_s",
        "peak_rss_gb",
        "last_step_reward",
    )

    def median(side: str, k: str):
        vals = [rd[side][k] for rd in rounds if rd[side].get(k) is not None]
        return round(statistics.median(vals), 4) if vals else None

    def ratio(k: str):
        if set(SIDES) - set(a.sides):
            return None
        vals = [rd["rz"][k] / rd["trl"][k] for rd in rounds if rd["trl"].get(k)]
        return round(statistics.median(vals), 3) if vals else None

    summary = {
        "model": "SmolLM2-135M-Instruct (packaged checkpoint), float32",
        "task": "one-turn word problems, difficulty 1, 0/1 boxed answer (bench/vs_trl_task.py)",
        "steps": a.steps,
        "episodes_per_step": a.prompts_per_step * a.group_size,
        "group_size": a.group_size,
        "max_tokens": a.max_tokens,
        "lr": a.lr,
        "threads": a.threads,
        "rounds": a.rounds,
        "results": {s: {k: median(s, k) for k in keys} for s in a.sides},
        "rz_over_trl_episodes_per_s": ratio("episodes_per_s"),
        "rz_over_trl_generated_tokens_per_s": ratio("generated_tokens_per_s"),
        "rz_over_trl_learner_tokens_per_s": ratio("learner_tokens_per_s"),
        "rz_over_trl_wall_per_step": ratio("wall_per_step_s"),
        "rz_over_trl_cpu_per_step": ratio("cpu_per_step_s"),
        "rates_per": "CPU-second" if a.metric == "cpu" else "wall-second",
        "rz_over_trl_peak_rss": ratio("peak_rss_gb"),
        "per_round": rounds,
        "loadavg_start_end": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "seconds": round(time.time() - t_start, 1),
    }
    print(json.dumps(summary, indent=None if a.json else 2))


if __name__ == "__main__":
    main()
