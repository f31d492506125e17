"""The training loop every runtime runs: batch -> learner step -> weight publication -> metrics, checkpoints.

A runtime places the pieces (``LocalRun``: one process; ``RayRun``: Ray actors) and then this same code
drives them: the ``RolloutController`` (admission under the lag bound, the trajectory queue, the agent loop
per episode) runs in this process either way, and the learner step is ``Learner.step`` either way. What
differs is the runtime's ``LoopRuntime`` (runtime/loop_runtime.py), handed to ``TrainLoop``: where the
learner step runs, what a published set of weights is (tensors, or a reference into Ray's object store)
and how it reaches the engines.

``rollout.fixed_lag: k`` keeps the engines exactly k versions behind: before each step the loop records the
weights the step starts from, and after it publishes those of version v - k (runtime/fixed_lag.py). The steps
of ``inspect_steps`` are recorded for the trajectory inspector before they train (run_dir/inspect/), scored
wherever the learner runs (``LoopRuntime.inspection_record``).
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

from rz_agents.eval.in_loop import START_PREFIX, LoopEvaluator, eval_points, plan_loop_eval
from rz_agents.rollout.checkpoint_cut import InconsistentCheckpoint, check_consistent_cut, upgrade_state
from rz_agents.rollout.controller import RolloutController
from rz_agents.runtime.config import TrainConfig
from rz_agents.runtime.factories import env_factory
from rz_agents.runtime.fixed_lag import WeightHistory
from rz_agents.runtime.loop_runtime import LoopRuntime
from rz_agents.runtime.memory import rss_bytes, trim_heap
from rz_agents.runtime.stop import StopRequest, signal_name
from rz_agents.runtime.watchdog import Watchdog
from rz_agents.trainer.checkpoint import load_checkpoint, save_checkpoint
from rz_agents.trainer.health import HealthMonitor
from rz_agents.trainer.inspect import inspected_steps, write_step_record
from rz_agents.trainer.metrics import staleness_histogram, staleness_metrics
from rz_agents.trainer.metrics_log import MetricsWriter


def _trained_groups(history: list[dict[str, Any]]) -> list[list[int]] | None:
    """The group indices trained at each step, if every step recorded them (older histories did not)."""
    if all("group_indices" in m for m in history):
        return [list(m["group_indices"]) for m in history]
    return None


class TrainLoop:
    """The control loop shared by the runtimes: ``TrainLoop(cfg, controller, loop_runtime)``.

    ``cfg``: the run's config (steps, output_dir, checkpoint_every, resume_from ...); ``controller``: the
    rollout controller (its ``lag`` is the run's lag policy); ``loop_runtime``: the runtime's half (where the
    learner step runs, how weights reach the engines; runtime/loop_runtime.py). ``steps_done`` counts learner
    steps, this run's and those of the checkpoint it resumed from; checkpoints save it, and it equals the
    length of ``history`` (a checkpoint where they differ is refused).
    """

    def __init__(self, cfg: TrainConfig, controller: RolloutController, loop_runtime: LoopRuntime) -> None:
        """History, metrics writer, fixed-lag weights; restore ``resume_from``; publish the first weights."""
        self.cfg, self.controller, self.loop_runtime = cfg, controller, loop_runtime
        self.steps_done = 0
        self._checkpointed_at: int | None = None  # steps_done of the last checkpoint this loop wrote
        self.history: list[dict[str, Any]] = []
        self._start_eval: dict[str, Any] = {}  # eval.at_start's figures, logged with step 0
        fixed = controller.lag.fixed_lag
        self.weight_history = WeightHistory(fixed, copy=loop_runtime.snapshot_weights) if fixed else None
        if cfg.resume_from:
            self._resume(cfg.resume_from)
        self.health = HealthMonitor(self.history)  # rolling ESS/n and KL, the collapse alarm
        controller.lag.resume(self.history)  # the lag governor's bound and windows, if it has one
        eval_plan = plan_loop_eval(cfg.eval, cfg)
        self.evaluator = (
            LoopEvaluator(
                eval_plan,
                cfg,
                controller.engine,
                controller.template,
                controller.tokenizer,
                controller.sampling,
                # the run's env, built here: eval/ imports nothing of runtime/ (one direction)
                env_factory(cfg.env, tuple(cfg.imports), controller.cfg.limits.max_turns),
            )  # fmt: skip
            if eval_plan is not None
            else None
        )
        # The writer starts at the first step this run records: rows a killed run wrote after its last
        # checkpoint are removed, so no step number repeats in metrics.jsonl.
        self.writer = (
            MetricsWriter(cfg.output_dir, tensorboard=cfg.tensorboard, start_step=self.steps_done)
            if cfg.output_dir
            else None
        )
        loop_runtime.load_engine_base()  # LoRA: the base, once (a resumed one may differ from the engines')
        loop_runtime.load_engine_weights(*self.weights_to_publish())
        controller.learner_version = loop_runtime.learner_version  # pacing counts lags from it

    def _resume(self, path: str) -> None:
        payload = load_checkpoint(path)
        runtime = payload["runtime"]
        self.history = list(runtime.get("history", []))
        # checkpoints before the explicit counter: their history is the count
        self.steps_done = int(runtime.get("steps_done", len(self.history)))
        if self.steps_done != len(self.history):
            raise InconsistentCheckpoint(
                f"inconsistent checkpoint ({path}): steps_done {self.steps_done} != {len(self.history)} "
                "learner steps in its history"
            )
        groups_per_batch = self.controller.cfg.groups_per_batch
        state = upgrade_state(runtime["controller"], self.steps_done, groups_per_batch)
        check_consistent_cut(state, self.steps_done, _trained_groups(self.history), where=str(path))
        self.loop_runtime.load_learner_state(payload["learner"], payload["learner_folder"])
        self.controller.load_state_dict(state)
        if self.weight_history is not None:
            kept = runtime.get("weight_history", {})
            self.weight_history.load_state_dict(
                {v: self.loop_runtime.weights_from_tensors(w, int(v)) for v, w in kept.items()}
            )

    # ---- the loop ----------------------------------------------------------------------------------
    async def train(self, stop: StopRequest | None = None) -> dict[str, Any]:
        """Run until ``cfg.steps`` learner steps are done or ``stop`` is requested; returns the summary.

        A stop (runtime/stop.py) ends the run at the next learner-step boundary: a step already running
        finishes, a wait for the next batch ends at once (a batch taken and not trained is saved in front of
        the queue, as at any checkpoint), then the checkpoint is written as at the end of a run. A stop before
        this call trained a step writes nothing (the run directory keeps its last checkpoint, if any). The
        summary's ``stopped`` says which signal stopped the run and where it saved (None: not stopped).
        """
        cfg = self.cfg
        self.loop_runtime.before_train()
        self.controller.last_batch = cfg.steps  # no rollouts past the run's last step
        producer = asyncio.ensure_future(self.controller.run())
        t_start = time.perf_counter()
        start_step = self.steps_done
        watchdog = None
        if cfg.watchdog_s:
            dump = Path(cfg.output_dir) / "stall_stacks.txt" if cfg.output_dir else None
            watchdog = Watchdog(cfg.watchdog_s, self._progress, self._describe, dump_path=dump)
            watchdog.start(asyncio.current_task())
        try:
            if self.evaluator is not None and self.evaluator.due_at_start(self.steps_done):
                await self._evaluate_at_start()
            while self.steps_done < cfg.steps and not (stop is not None and stop.requested):
                await self._train_one_step(stop)
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
        stopped = stop is not None and stop.requested
        saved = None
        if cfg.output_dir and not (stopped and self.steps_done == start_step):
            path = Path(cfg.output_dir) / "checkpoint.pt"
            # a stop right after a periodic checkpoint of this step saves no second copy (time is short then)
            saved = path if stopped and self._checkpointed_at == self.steps_done else self.checkpoint(path)
        summary = self.summary(wall, self.steps_done - start_step)
        summary["stopped"] = (
            {"signal": signal_name(stop.signum), "signum": stop.signum, "checkpoint": saved and str(saved)}
            if stopped
            else None
        )
        return summary

    async def _evaluate_at_start(self) -> None:
        """eval.at_start: the first weights, evaluated before the first step (the rollouts go on meanwhile);
        the figures wait for step 0's metrics, so a run stopped before that step evaluates again."""
        figures = await self.evaluator.evaluate(prefix=START_PREFIX)  # its wall_s: the time it took
        figures[f"{START_PREFIX}version"] = self.loop_runtime.learner_version
        self._start_eval = figures

    async def _train_one_step(self, stop: StopRequest | None = None) -> None:
        """Wait for a batch, train it, publish, record the step (history, controller, metrics, checkpoint).
        A ``stop`` requested while it waits for the batch ends it there, before anything is trained."""
        cfg, loop_runtime = self.cfg, self.loop_runtime
        t0 = time.perf_counter()
        batch = await self._next_batch_unless_stopped(stop)
        if batch is None:
            return
        t_wait = time.perf_counter() - t0
        if self.weight_history is not None:
            self.weight_history.record(loop_runtime.learner_weights(), loop_runtime.learner_version)
        step = self.steps_done
        if cfg.output_dir and step in inspected_steps(cfg.inspect_steps, cfg.steps):
            # before the step: the log-probs recorded are those the step's loss uses
            record = await loop_runtime.inspection_record(batch)
            write_step_record(Path(cfg.output_dir) / "inspect", step, record)
        staleness, token_lags, oldest_lags = self._staleness(batch, loop_runtime.learner_version)
        metrics = await loop_runtime.learner_step(batch)
        if cfg.learner_step_delay_s:
            await asyncio.sleep(cfg.learner_step_delay_s)
        trim_heap()
        t1 = time.perf_counter()
        if not metrics.get("step_skipped_nonfinite") and not metrics.get("step_skipped_empty"):
            await loop_runtime.send_weights(*self.weights_to_publish())
        metrics.update(
            step=step,
            group_indices=sorted({int(t.group_id) for t in batch}),
            time_wait_data_s=t_wait,
            time_publish_s=time.perf_counter() - t1,
            time_step_s=time.perf_counter() - t0,
            **{f"rollout_{k}": v for k, v in self.controller.counters.items()},
            queue_groups=len(self.controller.queue),
            **self.controller.episode_lengths.metrics(),
            **loop_runtime.engine_step_metrics(),
            rss_gb=rss_bytes() / 2**30,
            trained_tokens_per_s=metrics.get("learner_tokens", 0) / max(time.perf_counter() - t0, 1e-9),
        )
        metrics.update(staleness)
        metrics.update(self.health.update(metrics))
        self.controller.lag.observe(metrics)  # the lag governor moves the admission bound
        if step == 0:
            metrics.update(self._start_eval)
        if self.evaluator is not None and self.evaluator.due(self.steps_done + 1, cfg.steps):
            # the weights this step published, evaluated while the learner waits (the rollouts go on)
            t_eval = time.perf_counter()
            metrics.update(await self.evaluator.evaluate())
            metrics.update(
                {"eval/version": loop_runtime.learner_version, "time_eval_s": time.perf_counter() - t_eval}
            )
        # The step is counted (history, steps_done and controller) before it is logged or checkpointed: a
        # checkpoint whose steps_done lagged its history shrank the admission window on every resume until
        # nothing was admitted (issue 17).
        self.history.append(metrics)
        self.steps_done += 1
        self.controller.step_done(loop_runtime.learner_version)
        if self.writer:
            self.writer.write(step, metrics)
            histograms = getattr(self.writer, "write_histograms", None)  # a wrapping writer may not have it
            if histograms is not None:
                lags = {"staleness/token_lag": token_lags, "staleness/trajectory_oldest_lag": oldest_lags}
                histograms(step, lags)
        if cfg.output_dir and cfg.checkpoint_every and self.steps_done % cfg.checkpoint_every == 0:
            self.checkpoint(Path(cfg.output_dir) / "checkpoint.pt")

    async def _next_batch_unless_stopped(self, stop: StopRequest | None) -> list | None:
        """The controller's next batch, or None once ``stop`` is requested while waiting for it. The take
        is cancelled only while it waits (nothing taken yet); a batch taken as the stop came stays taken,
        untrained, and the checkpoint saves it in front of the queue."""
        take = self.controller.next_batch(self.loop_runtime.learner_version)
        if stop is None:
            return await take
        batch_task = asyncio.ensure_future(take)
        stop_task = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({batch_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (batch_task, stop_task):
                if not task.done():
                    task.cancel()
            await asyncio.gather(batch_task, stop_task, return_exceptions=True)
        if batch_task.done() and not batch_task.cancelled() and batch_task.exception() is not None:
            raise batch_task.exception()  # the run failed (a controller error): that, not the stop
        if stop.requested:
            return None
        return batch_task.result()

    def _staleness(self, batch: list, version: int) -> tuple[dict[str, float], list[int], list[int]]:
        """The batch's token-weighted staleness at the learner's ``version``
        (trainer.metrics.staleness_metrics): its metrics, every sampled token's lag, every trajectory's oldest
        lag."""
        lags = [[version - v for v, m in zip(t.versions, t.loss_mask, strict=True) if m] for t in batch]
        return staleness_metrics(lags, self.controller.lag.hard)

    def _progress(self) -> tuple:
        """What the watchdog compares: engine work, episode events, learner steps."""
        c = self.controller.counters
        return (
            self.loop_runtime.engine_progress(),
            c["episodes_started"],
            c["episodes_finished"],
            c["episodes_failed"],
            self.steps_done,
        )

    def _describe(self) -> str:
        c = self.controller
        return (
            f"learner steps {self.steps_done}/{self.cfg.steps}, steps_done {c.steps_done}, queued groups "
            f"{len(c.queue)}, groups in flight {len(c.in_flight)}, counters {dict(c.counters)}"
        )

    def weights_to_publish(self) -> tuple[Any, int]:
        """(weights, version) the engines should sample with now (fixed-lag mode: version v - fixed_lag)."""
        weights, version = self.loop_runtime.learner_weights(), self.loop_runtime.learner_version
        if self.weight_history is not None:
            weights, version = self.weight_history.to_publish(weights, version)
        return weights, version

    def checkpoint(self, path: str | Path) -> Path:
        """Write an atomic checkpoint of learner, controller (queue, data position) and RNG states.

        Raises InconsistentCheckpoint (and writes nothing) if the controller state is not a consistent cut.
        """
        state = self.controller.state_dict()
        check_consistent_cut(state, self.steps_done, _trained_groups(self.history), where="saving")
        runtime: dict[str, Any] = {
            "controller": state,
            "history": self.history,
            "steps_done": self.steps_done,
        }
        if self.weight_history is not None:
            to_tensors = self.loop_runtime.weights_to_tensors
            runtime["weight_history"] = {
                v: to_tensors(w) for v, w in self.weight_history.state_dict().items()
            }
        # (the learner writes its folder)
        saved = save_checkpoint(path, self.loop_runtime.learner_state, runtime)
        self._checkpointed_at = self.steps_done
        return saved

    def summary(self, wall_s: float, steps_run: int) -> dict[str, Any]:
        """What the run did, in plain numbers."""
        h = self.history
        rewards = [m.get("reward_mean", math.nan) for m in h]
        lag_max = max((m.get("lag_max", 0) for m in h), default=0)
        return {
            "steps": self.steps_done,
            "steps_this_run": steps_run,
            "version": self.loop_runtime.learner_version,
            "wall_s": wall_s,
            "steps_per_s": steps_run / wall_s if wall_s > 0 else 0.0,
            "reward_mean_per_step": rewards,
            "max_lag_seen": lag_max,
            "staleness": staleness_histogram(h),  # per lag bucket, over the run (report.write)
            # the in-loop evaluations (eval.at_start, eval.every): after which step, and their figures
            "eval": eval_points(h),
            "skipped_steps": self.loop_runtime.skipped_steps,
            "rollout": dict(self.controller.counters),
            # mean tokens of finished vs trained episodes (this process): dropping stale groups trains short
            # ones more often than they finish
            "episode_lengths": self.controller.episode_lengths.metrics(),
            "first_episode_error": self.controller.first_error,
            "engine": self.loop_runtime.engine_summary(),
        }

    def close(self) -> None:
        """Close the metrics writer."""
        if self.writer:
            self.writer.close()


class RunHandle:
    """What a built run (``LocalRun``, ``RayRun``) offers around its ``TrainLoop`` (``self.loop``)."""

    loop: TrainLoop

    async def train(self, stop: StopRequest | None = None) -> dict[str, Any]:
        """Run until ``cfg.steps`` learner steps are done or ``stop`` is requested (``TrainLoop.train``);
        returns the summary."""
        return await self.loop.train(stop)

    def checkpoint(self, path: str | Path) -> Path:
        """Write an atomic checkpoint (``TrainLoop.checkpoint``)."""
        return self.loop.checkpoint(path)

    @property
    def history(self) -> list[dict[str, Any]]:
        """The metrics of every learner step, this run's and those it resumed."""
        return self.loop.history

    @property
    def steps_done(self) -> int:
        """Learner steps done (``TrainLoop.steps_done``)."""
        return self.loop.steps_done

    @property
    def writer(self) -> MetricsWriter | None:
        """The metrics writer (wrap it to watch each step as it is written)."""
        return self.loop.writer

    @writer.setter
    def writer(self, writer: Any) -> None:
        self.loop.writer = writer

    def _close_loop(self) -> None:
        loop = getattr(self, "loop", None)  # absent if the run failed while it was being built
        if loop is not None:
            loop.close()
