"""The local runtime: dataset/env -> rollout controller -> engine -> learner, in one process.

One asyncio event loop runs the engine's step loop, the episodes (env calls in a thread pool) and the
learner loop; each learner step runs in a worker thread so generation continues while it trains (torch
releases the GIL inside its ops). ``mode="sync"`` is the same code with max_lag = 0: one batch is
generated with the current weights, trained, published, then the next one starts.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from rz_agents.engine import RZEngine
from rz_agents.model.packaged import resolve_checkpoint
from rz_agents.rollout.checkpoint_cut import check_consistent_cut, upgrade_state
from rz_agents.rollout.controller import RolloutController
from rz_agents.rollout.task_source import TaskSource
from rz_agents.runtime.config import TrainConfig, resolve
from rz_agents.runtime.factories import build_model, build_tokenizer, env_factory
from rz_agents.runtime.fixed_lag import WeightHistory
from rz_agents.runtime.memory import limit_heap_growth, rss_bytes, trim_heap
from rz_agents.runtime.watchdog import Watchdog
from rz_agents.trainer.checkpoint import load_checkpoint, save_checkpoint
from rz_agents.trainer.inspect import inspected_steps, record_step, write_step_record
from rz_agents.trainer.learner import Learner
from rz_agents.trainer.metrics_log import MetricsWriter

log = logging.getLogger(__name__)


def _set_threads(n: int | None) -> None:
    if n is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)


def _trained_groups(history: list[dict[str, Any]]) -> list[list[int]] | None:
    """The group indices trained at each step, if every step recorded them (older histories did not)."""
    if all("group_indices" in m for m in history):
        return [list(m["group_indices"]) for m in history]
    return None


class LocalRun:
    """The wired components of one run; ``run_training`` drives it. Kept as an object for tests/benchmarks."""

    def __init__(self, cfg: TrainConfig) -> None:
        cfg.validate()
        # derived fields filled in: the lag bound, the sampling the learner scores under, the kernels
        self.cfg = cfg = resolve(cfg)
        limit_heap_growth()  # the resident set would otherwise creep up step after step
        _set_threads(cfg.num_threads)
        self.tokenizer, self.template = build_tokenizer(cfg.tokenizer, cfg.model.checkpoint)
        vocab = max(int(self.tokenizer.vocab_size), 320) if cfg.tokenizer == "byte" else len(self.tokenizer)
        self.model = build_model(cfg.model, vocab)
        # The engine samples from its own copy; the learner publishes into it after each step.
        engine_model = copy.deepcopy(self.model)
        engine_model.requires_grad_(False)
        eng_cfg = cfg.engine
        if cfg.num_threads is not None and eng_cfg.num_threads is None:
            eng_cfg = dataclasses.replace(eng_cfg, num_threads=cfg.num_threads)
        self.engine = RZEngine(engine_model, eng_cfg, decode=self.tokenizer.decode)
        lcfg = cfg.learner
        if cfg.learner_process:
            from rz_agents.runtime.learner_process import LearnerProcess

            self.learner = LearnerProcess(
                self.model, lcfg, num_threads=cfg.num_threads, cpus=cfg.learner_cpus
            )
        else:
            self.learner = Learner(self.model, lcfg)
        self.controller = RolloutController(
            self.engine,
            env_factory(cfg.env),
            self.template,
            self.tokenizer,
            TaskSource(cfg.env.tasks, seed=cfg.seed),
            cfg.rollout,
        )
        self.history: list[dict[str, Any]] = []
        fixed = cfg.rollout.fixed_lag
        self.weight_history = WeightHistory(fixed) if fixed else None
        self._saved_affinity: set[int] | None = None
        if cfg.resume_from:
            payload = load_checkpoint(cfg.resume_from)
            self.history = list(payload["runtime"].get("history", []))
            state = upgrade_state(
                payload["runtime"]["controller"], len(self.history), cfg.rollout.groups_per_batch
            )
            check_consistent_cut(
                state, len(self.history), _trained_groups(self.history), where=str(cfg.resume_from)
            )
            self.learner.load_state_dict(payload["learner"])
            self.controller.load_state_dict(state)
            if self.weight_history is not None:
                self.weight_history.load_state_dict(payload["runtime"].get("weight_history", {}))
        # The writer starts at the first step this run records: rows a killed run wrote after its last
        # checkpoint are removed, so no step number repeats in metrics.jsonl.
        self.writer = (
            MetricsWriter(cfg.output_dir, tensorboard=cfg.tensorboard, start_step=len(self.history))
            if cfg.output_dir
            else None
        )
        self._publish()

    def export_model(self, out_dir: str | Path) -> Path:
        """The learner's current weights as an HF checkpoint directory (``rz eval --checkpoint`` reads it),
        with the tokenizer files of the source checkpoint when the run uses its tokenizer."""
        from rz_agents.model.checkpoint import save_hf_checkpoint

        extra: dict[str, str] = {}
        if self.cfg.tokenizer == "checkpoint":
            source = resolve_checkpoint(self.cfg.model.checkpoint or "")
            for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
                if (source / name).is_file():
                    extra[name] = (source / name).read_text()
        if self.cfg.learner_process:  # the child trains; its weights live in shared memory
            with torch.no_grad():
                self.model.load_state_dict(self.learner.weights())
        return save_hf_checkpoint(self.model, out_dir, extra_files=extra)

    def checkpoint(self, path: str | Path) -> Path:
        """Write an atomic checkpoint of learner, controller (queue, data position) and RNG states.

        Raises InconsistentCheckpoint (and writes nothing) if the controller state is not a consistent cut.
        """
        state = self.controller.state_dict()
        check_consistent_cut(state, len(self.history), _trained_groups(self.history), where="saving")
        runtime = {"controller": state, "history": self.history}
        if self.weight_history is not None:
            runtime["weight_history"] = self.weight_history.state_dict()
        return save_checkpoint(path, self.learner.state_dict(), runtime)

    def _progress(self) -> tuple:
        """What the watchdog compares: engine steps, episode events, learner steps."""
        c = self.controller.counters
        engine_steps = getattr(self.engine, "counters", {}).get("steps", 0)
        return (
            engine_steps,
            c["episodes_started"],
            c["episodes_finished"],
            c["episodes_failed"],
            len(self.history),
        )

    def _describe(self) -> str:
        c = self.controller
        return (
            f"learner steps {len(self.history)}/{self.cfg.steps}, steps_done {c.steps_done}, queued groups "
            f"{len(c.queue)}, groups in flight {len(c.in_flight)}, counters {dict(c.counters)}"
        )

    def _learner_step(self, batch):
        _set_threads(self.cfg.num_threads)  # this worker thread's torch threads
        step = len(self.history)
        if self.cfg.output_dir and step in inspected_steps(self.cfg.inspect_steps, self.cfg.steps):
            self._record_for_inspection(step, batch)
        m = self.learner.step(batch)
        if self.cfg.learner_step_delay_s:
            time.sleep(self.cfg.learner_step_delay_s)
        return m

    def _record_for_inspection(self, step: int, batch) -> None:
        """The batch with the learner's log-probs, for the trajectory inspector (run_dir/inspect/)."""
        if self.cfg.learner_process:  # the child trains; bring its current weights here
            with torch.no_grad():
                self.model.load_state_dict(self.learner.weights())
        decode = self.tokenizer.decode
        record = record_step(self.model, batch, self.cfg.learner, self.learner.version, lambda t: decode([t]))
        write_step_record(Path(self.cfg.output_dir) / "inspect", step, record)

    def _publish(self) -> None:
        """Send the learner's weights to the engine (in fixed-lag mode, those of version v - fixed_lag)."""
        weights, version = self.learner.weights(), self.learner.version
        if self.weight_history is not None:
            weights, version = self.weight_history.to_publish(weights, version)
        self.controller.publish(weights, version)

    async def train(self) -> dict[str, Any]:
        """Run until ``cfg.steps`` learner steps are done; returns the summary."""
        cfg = self.cfg
        if cfg.rollout_cpus and self._saved_affinity is None:
            # Threads and subprocesses started from here on (env pool, sandboxes) inherit this affinity.
            self._saved_affinity = os.sched_getaffinity(0)
            os.sched_setaffinity(0, cfg.rollout_cpus)
        producer = asyncio.ensure_future(self.controller.run())
        t_start = time.perf_counter()
        start_step = len(self.history)
        watchdog = None
        if cfg.watchdog_s:
            dump = Path(cfg.output_dir) / "stall_stacks.txt" if cfg.output_dir else None
            watchdog = Watchdog(cfg.watchdog_s, self._progress, self._describe, dump_path=dump)
            watchdog.start(asyncio.current_task())
        try:
            while len(self.history) < cfg.steps:
                t0 = time.perf_counter()
                batch = await self.controller.next_batch(self.learner.version)
                t_wait = time.perf_counter() - t0
                if self.weight_history is not None:
                    self.weight_history.record(self.learner.weights(), self.learner.version)
                metrics = await asyncio.to_thread(self._learner_step, batch)
                trim_heap()
                t1 = time.perf_counter()
                if not metrics.get("step_skipped_nonfinite") and not metrics.get("step_skipped_empty"):
                    self._publish()
                t_pub = time.perf_counter() - t1
                step = len(self.history)
                metrics.update(
                    step=step,
                    group_indices=sorted({int(t.group_id) for t in batch}),
                    time_wait_data_s=t_wait,
                    time_publish_s=t_pub,
                    time_step_s=time.perf_counter() - t0,
                    **{f"rollout_{k}": v for k, v in self.controller.counters.items()},
                    queue_groups=len(self.controller.queue),
                    engine_generated_tokens=self.engine.counters["generated_tokens"],
                    engine_version=self.engine.version,
                    rss_gb=rss_bytes() / 2**30,
                    trained_tokens_per_s=metrics.get("learner_tokens", 0)
                    / max(time.perf_counter() - t0, 1e-9),
                )
                # The step is counted (history and controller) before it is logged or checkpointed: a
                # checkpoint whose steps_done lagged its history shrank the admission window on every
                # resume until nothing was admitted (issue 17).
                self.history.append(metrics)
                self.controller.step_done()
                if self.writer:
                    self.writer.write(step, metrics)
                if cfg.output_dir and cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
                    self.checkpoint(Path(cfg.output_dir) / "checkpoint.pt")
        except asyncio.CancelledError:
            if watchdog is not None and watchdog.error is not None:
                raise watchdog.error from None
            raise
        finally:
            if watchdog is not None:
                watchdog.stop()
            self.controller.stop()
            await asyncio.gather(producer, return_exceptions=True)
        wall = time.perf_counter() - t_start
        if cfg.output_dir:
            self.checkpoint(Path(cfg.output_dir) / "checkpoint.pt")
        return self.summary(wall, len(self.history) - start_step)

    def summary(self, wall_s: float, steps_run: int) -> dict[str, Any]:
        """What the run did, in plain numbers."""
        h = self.history
        rewards = [m.get("reward_mean", math.nan) for m in h]
        lag_max = max((m.get("lag_max", 0) for m in h), default=0)
        return {
            "steps": len(h),
            "steps_this_run": steps_run,
            "version": self.learner.version,
            "wall_s": wall_s,
            "steps_per_s": steps_run / wall_s if wall_s > 0 else 0.0,
            "reward_mean_per_step": rewards,
            "max_lag_seen": lag_max,
            "skipped_steps": self.learner.skipped_steps,
            "rollout": dict(self.controller.counters),
            "engine": {k: v for k, v in self.engine.stats().items() if isinstance(v, (int, float))},
        }

    def close(self) -> None:
        """Release envs, threads and files; undo the CPU pinning of this thread."""
        if self._saved_affinity is not None:
            os.sched_setaffinity(0, self._saved_affinity)
            self._saved_affinity = None
        self.controller.close()
        if hasattr(self.learner, "close"):
            self.learner.close()
        if self.writer:
            self.writer.close()


def run_training(cfg: TrainConfig) -> dict[str, Any]:
    """Build everything from ``cfg``, train ``cfg.steps`` steps in one process, and return a summary."""
    run = LocalRun(cfg)
    try:
        return asyncio.run(run.train())
    finally:
        run.close()
