"""The training loop every runtime runs: batch -> learner step -> weight publication -> metrics, checkpoints.

A runtime places the pieces (``LocalRun``: one process; ``RayRun``: Ray actors) and then this same code
drives them: the ``RolloutController`` (admission under the lag bound, the trajectory queue, the agent loop
per episode) runs in this process either way, and the learner step is ``Learner.step`` either way. What
differs is behind the placement hooks at the end of ``TrainLoop``: where the learner step runs, what a
published set of weights is (tensors, or a reference into Ray's object store) and how it reaches the engines.

``rollout.fixed_lag: k`` keeps the engines exactly k versions behind: before each step the loop records the
weights the step starts from, and after it publishes those of version v - k (runtime/fixed_lag.py). The steps
of ``inspect_steps`` are recorded for the trajectory inspector before they train (run_dir/inspect/), scored
wherever the learner runs (``_inspection_record``).
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

from rz_agents.rollout.checkpoint_cut import check_consistent_cut, upgrade_state
from rz_agents.rollout.controller import RolloutController
from rz_agents.rollout.lag_governor import LagGovernor
from rz_agents.runtime.config import TrainConfig
from rz_agents.runtime.fixed_lag import WeightHistory
from rz_agents.runtime.memory import rss_bytes, trim_heap
from rz_agents.runtime.watchdog import Watchdog
from rz_agents.trainer.checkpoint import load_checkpoint, save_checkpoint
from rz_agents.trainer.health import HealthMonitor
from rz_agents.trainer.inspect import inspected_steps, write_step_record
from rz_agents.trainer.metrics_log import MetricsWriter


def _trained_groups(history: list[dict[str, Any]]) -> list[list[int]] | None:
    """The group indices trained at each step, if every step recorded them (older histories did not)."""
    if all("group_indices" in m for m in history):
        return [list(m["group_indices"]) for m in history]
    return None


class TrainLoop:
    """The control loop shared by the runtimes. A runtime's ``__init__`` sets ``cfg``, ``controller``,
    ``learner`` (anything with ``version`` and ``skipped_steps``) and ``engine``, then calls ``_init_loop``;
    it implements the placement hooks below."""

    cfg: TrainConfig
    controller: RolloutController
    learner: Any
    engine: Any

    def _init_loop(self) -> None:
        """History, metrics writer, fixed-lag weights; restore ``resume_from``; publish the first weights."""
        cfg = self.cfg
        self.history: list[dict[str, Any]] = []
        fixed = cfg.rollout.fixed_lag
        self.weight_history = WeightHistory(fixed, copy=self._snapshot_weights) if fixed else None
        if cfg.resume_from:
            payload = load_checkpoint(cfg.resume_from)
            self.history = list(payload["runtime"].get("history", []))
            state = upgrade_state(
                payload["runtime"]["controller"], len(self.history), cfg.rollout.groups_per_batch
            )
            check_consistent_cut(
                state, len(self.history), _trained_groups(self.history), where=str(cfg.resume_from)
            )
            self._load_learner_state(payload["learner"])
            self.controller.load_state_dict(state)
            if self.weight_history is not None:
                kept = payload["runtime"].get("weight_history", {})
                self.weight_history.load_state_dict(
                    {v: self._weights_from_tensors(w) for v, w in kept.items()}
                )
        self.health = HealthMonitor(self.history)  # rolling ESS/n and KL, the collapse alarm
        self.governor = None
        r = cfg.rollout
        if r.lag_governor and r.max_lag > 0:
            self.governor = LagGovernor.resumed(
                self.history, max_lag=r.max_lag, target_ess=r.lag_governor_target_ess
            )
            self.controller.admission_lag = self.governor.bound
        # The writer starts at the first step this run records: rows a killed run wrote after its last
        # checkpoint are removed, so no step number repeats in metrics.jsonl.
        self.writer = (
            MetricsWriter(cfg.output_dir, tensorboard=cfg.tensorboard, start_step=len(self.history))
            if cfg.output_dir
            else None
        )
        self.engine.load_weights(*self._to_publish())

    # ---- the loop ----------------------------------------------------------------------------------
    async def train(self) -> dict[str, Any]:
        """Run until ``cfg.steps`` learner steps are done; returns the summary."""
        cfg = self.cfg
        self._before_train()
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
                    self.weight_history.record(self._learner_weights(), self.learner.version)
                step = len(self.history)
                if cfg.output_dir and step in inspected_steps(cfg.inspect_steps, cfg.steps):
                    # before the step: the log-probs recorded are those the step's loss uses
                    record = await self._inspection_record(batch)
                    write_step_record(Path(cfg.output_dir) / "inspect", step, record)
                metrics = await self._learner_step(batch)
                if cfg.learner_step_delay_s:
                    await asyncio.sleep(cfg.learner_step_delay_s)
                trim_heap()
                t1 = time.perf_counter()
                if not metrics.get("step_skipped_nonfinite") and not metrics.get("step_skipped_empty"):
                    await self._send_weights(*self._to_publish())
                t_pub = time.perf_counter() - t1
                metrics.update(
                    step=step,
                    group_indices=sorted({int(t.group_id) for t in batch}),
                    time_wait_data_s=t_wait,
                    time_publish_s=t_pub,
                    time_step_s=time.perf_counter() - t0,
                    **{f"rollout_{k}": v for k, v in self.controller.counters.items()},
                    queue_groups=len(self.controller.queue),
                    **self._engine_step_metrics(),
                    rss_gb=rss_bytes() / 2**30,
                    trained_tokens_per_s=metrics.get("learner_tokens", 0)
                    / max(time.perf_counter() - t0, 1e-9),
                )
                metrics.update(self.health.update(metrics))
                if self.governor is not None:
                    bound = self.governor.update(metrics.get("is_weight_ess_fraction"))
                    self.controller.admission_lag = metrics["rollout_admission_lag"] = bound
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

    def _progress(self) -> tuple:
        """What the watchdog compares: engine work, episode events, learner steps."""
        c = self.controller.counters
        return (
            self._engine_progress(),
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

    def _to_publish(self) -> tuple[Any, int]:
        """(weights, version) the engines should sample with now (fixed-lag mode: version v - fixed_lag)."""
        weights, version = self._learner_weights(), self.learner.version
        if self.weight_history is not None:
            weights, version = self.weight_history.to_publish(weights, version)
        return weights, version

    def checkpoint(self, path: str | Path) -> Path:
        """Write an atomic checkpoint of learner, controller (queue, data position) and RNG states.

        Raises InconsistentCheckpoint (and writes nothing) if the controller state is not a consistent cut.
        """
        state = self.controller.state_dict()
        check_consistent_cut(state, len(self.history), _trained_groups(self.history), where="saving")
        runtime: dict[str, Any] = {"controller": state, "history": self.history}
        if self.weight_history is not None:
            runtime["weight_history"] = {
                v: self._weights_to_tensors(w) for v, w in self.weight_history.state_dict().items()
            }
        return save_checkpoint(path, self._learner_state(), runtime)

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
            "first_episode_error": self.controller.first_error,
            "engine": self._engine_summary(),
        }

    def _close_loop(self) -> None:
        writer = getattr(self, "writer", None)  # absent if the run failed while it was being built
        if writer:
            writer.close()

    # ---- what every runtime offers besides the loop ---------------------------------------------------
    def push_model_weights(self) -> None:
        """The runtime's ``model`` was changed in place (a supervised warm start): the learner takes its
        weights, keeping its version, and the engines sample with them."""
        raise NotImplementedError

    def export_model(self, out_dir: str | Path) -> Path:
        """The learner's current weights as an HF checkpoint directory (``rz eval --checkpoint`` reads it)."""
        raise NotImplementedError

    # ---- placement hooks ---------------------------------------------------------------------------
    def _before_train(self) -> None:
        """Called when ``train`` starts (e.g. CPU pinning)."""

    async def _learner_step(self, batch: list) -> dict[str, Any]:
        """``Learner.step`` on ``batch`` wherever the learner runs; returns its metrics."""
        raise NotImplementedError

    async def _inspection_record(self, batch: list) -> dict[str, Any]:
        """``trainer.inspect.record_step`` for ``batch`` under the learner's current weights (the trajectory
        inspector's data for a step of ``cfg.inspect_steps``)."""
        raise NotImplementedError

    def _learner_weights(self) -> Any:
        """The learner's current weights in the form the engines load (tensors, or an object reference)."""
        raise NotImplementedError

    def _snapshot_weights(self, weights: Any) -> Any:
        """An unchanging copy of ``_learner_weights()`` for the fixed-lag history."""
        raise NotImplementedError

    async def _send_weights(self, weights: Any, version: int) -> None:
        """Make every engine sample with ``weights`` as ``version`` (between its steps)."""
        raise NotImplementedError

    def _learner_state(self) -> dict[str, Any]:
        """``Learner.state_dict()`` (whole tensors) for a checkpoint."""
        raise NotImplementedError

    def _load_learner_state(self, state: dict[str, Any]) -> None:
        """``Learner.load_state_dict(state)`` wherever the learner runs."""
        raise NotImplementedError

    def _weights_to_tensors(self, weights: Any) -> dict:
        """Published weights as a dict of tensors (for checkpoints)."""
        return weights

    def _weights_from_tensors(self, tensors: dict) -> Any:
        """Inverse of ``_weights_to_tensors``."""
        return tensors

    def _engine_progress(self) -> int:
        """A number that grows while the engines work (for the watchdog)."""
        raise NotImplementedError

    def _engine_step_metrics(self) -> dict[str, Any]:
        """Per-step engine figures: ``engine_generated_tokens`` and ``engine_version``."""
        raise NotImplementedError

    def _engine_summary(self) -> dict[str, Any]:
        """The engines' counters for the run summary."""
        raise NotImplementedError
