"""The local runtime: dataset/env -> rollout controller -> engine -> learner, in one process.

One asyncio event loop runs the engine's step loop, the episodes (env calls in a thread pool) and the
learner loop (runtime/loop.py's ``TrainLoop``, shared with the Ray runtime, over a ``LocalLoopRuntime``);
each learner step runs in a worker thread so generation continues while it trains (torch releases the GIL
inside its ops), or in a child process with ``learner_process: true``. ``mode="sync"`` is the same code
with max_lag = 0: one batch is generated with the current weights, trained, published, then the next one
starts.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
from pathlib import Path
from typing import Any

import torch

from rz_agents.engine import RZEngine
from rz_agents.model.policy import build_policy
from rz_agents.model.weight_update import WeightUpdate
from rz_agents.runtime.config import TrainConfig
from rz_agents.runtime.device import resolve_device
from rz_agents.runtime.factories import (
    build_controller,
    build_tokenizer,
    policy_spec,
    policy_template,
    run_env_factory,
    spec_vl_config,
    tokenizer_files,
    vocab_size,
)
from rz_agents.runtime.loop import RunHandle, TrainLoop
from rz_agents.runtime.loop_runtime import LoopRuntime
from rz_agents.runtime.memory import limit_heap_growth
from rz_agents.runtime.plan import RunPlan
from rz_agents.runtime.publish_local import InProcessPublisher
from rz_agents.trainer.inspect import record_step

log = logging.getLogger(__name__)


def _set_threads(n: int | None) -> None:
    if n is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)


def _at_version(update: WeightUpdate, version: int) -> WeightUpdate:
    """``update``, checked to be of ``version`` (a fixed-lag record keeps the version it was made at)."""
    if update.version != version:
        raise ValueError(f"weight update of version {update.version} published as version {version}")
    return update


class LocalLoopRuntime(LoopRuntime):
    """One process: the learner steps in a worker thread (or a child process), weights are tensors the
    engine copies between its steps."""

    def __init__(self, run: LocalRun) -> None:
        self.run = run
        self.engine, self.learner, self.plan = run.engine, run.learner, run.plan
        self._saved_affinity: set[int] | None = None
        self.publication_bytes = 0  # bytes of the latest weight update (with LoRA: the adapters')
        self.publisher = InProcessPublisher(run.engine, run.learner)

    def before_train(self) -> None:
        cpus = self.run.cfg.rollout_cpus
        if cpus and self._saved_affinity is None:
            # Threads and subprocesses started from here on (env pool, sandboxes) inherit this affinity.
            self._saved_affinity = os.sched_getaffinity(0)
            os.sched_setaffinity(0, cpus)

    def restore_affinity(self) -> None:
        """Undo ``before_train``'s CPU pinning of this thread."""
        if self._saved_affinity is not None:
            os.sched_setaffinity(0, self._saved_affinity)
            self._saved_affinity = None

    async def learner_step(self, batch: list) -> dict[str, Any]:
        return await asyncio.to_thread(self._learner_step_in_thread, batch)

    def _learner_step_in_thread(self, batch: list) -> dict[str, Any]:
        _set_threads(self.plan.num_threads)  # this worker thread's torch threads
        return self.learner.step(batch)

    async def inspection_record(self, batch: list) -> dict[str, Any]:
        return await asyncio.to_thread(self._inspection_record_in_thread, batch)

    def _inspection_record_in_thread(self, batch: list) -> dict[str, Any]:
        _set_threads(self.plan.num_threads)
        run = self.run
        if run.cfg.learner_process:  # the child trains; bring its current weights here
            with torch.no_grad():
                run.model.load_state_dict(self.learner.weights())
        decode = run.tokenizer.decode
        return record_step(
            run.model, batch, self.plan.learner, self.learner.version, lambda t: decode([t]),
            sampling=self.plan.sampling, max_lag=self.plan.lag.bound,
        )  # fmt: skip

    def learner_state(self, folder: Path) -> dict[str, Any]:
        return self.learner.save_state(folder)

    def load_learner_state(self, state: dict[str, Any], folder: Path | None = None) -> None:
        self.learner.load_state(state, folder)

    def learner_weights(self) -> WeightUpdate:
        return self.publisher.current()

    def snapshot_weights(self, weights: WeightUpdate) -> WeightUpdate:
        return self.publisher.snapshot(weights)

    def load_engine_weights(self, weights: WeightUpdate, version: int) -> None:
        self.publisher.publish(_at_version(weights, version))

    def load_engine_base(self) -> None:
        if self.publisher.current_is_partial():
            self.publisher.publish(self.publisher.whole())

    async def send_weights(self, weights: WeightUpdate, version: int) -> None:
        self.publisher.publish(_at_version(weights, version))  # episodes in flight continue with them
        self.publication_bytes = self.publisher.last_bytes

    def weights_to_tensors(self, weights: WeightUpdate) -> dict:
        return weights.to_state()

    def weights_from_tensors(self, tensors: dict, version: int) -> WeightUpdate:
        return WeightUpdate.from_state(tensors, version)

    def engine_progress(self) -> int:
        return self.engine.counters["steps"]

    def engine_step_metrics(self) -> dict[str, Any]:
        return {
            "engine_generated_tokens": self.engine.counters["generated_tokens"],
            "engine_version": self.engine.version,
            "weight_update_bytes": self.publication_bytes,
        }

    def engine_summary(self) -> dict[str, Any]:
        return {k: v for k, v in self.engine.stats().items() if isinstance(v, (int, float))}


class LocalRun(RunHandle):
    """The wired components of one run in this process; ``train`` (its ``TrainLoop``) drives them."""

    def __init__(self, cfg: TrainConfig, plan: RunPlan | None = None) -> None:
        # ``plan``: what ``cfg.validate()`` returned (built from it, the config is not resolved again); None
        # validates here, with the run schema's own checks only (a CLI subclass validates its extras itself)
        plan = TrainConfig.validate(cfg) if plan is None else plan
        if cfg.runtime != "local":
            raise ValueError(f"LocalRun needs runtime: local, got {cfg.runtime!r} (use build_run)")
        self.cfg, self.plan = cfg, plan  # the config as written; what it decides (runtime/plan.py)
        limit_heap_growth()  # the resident set would otherwise creep up step after step
        _set_threads(plan.num_threads)
        self.tokenizer, self.template = build_tokenizer(cfg.tokenizer, cfg.model.checkpoint)
        vocab = vocab_size(cfg.tokenizer, self.tokenizer)
        # the learner's policy, adapters and frozen parts included (the warm start's SFT trains it too)
        self.policy = policy_spec(
            cfg.model, vocab, lora=plan.learner.lora, freeze_vision=plan.learner.freeze_vision
        )
        self.model = build_policy(self.policy, resolve_device(cfg.model.device, "model.device"))
        # a vision-language model's template renders images (from the spec, as the Ray runtime decides it)
        self.template = policy_template(self.template, spec_vl_config(cfg.model, vocab))
        # The engine samples from its own copy (the adapters' initial values with it); the learner publishes
        # into it after each step.
        engine_model = copy.deepcopy(self.model)
        engine_model.requires_grad_(False)
        self.engine = RZEngine(engine_model, plan.engine, decode=self.tokenizer.decode)
        if cfg.learner_process:
            from rz_agents.runtime.learner_process import LearnerProcess

            self.learner = LearnerProcess(self.model, self.policy, plan, cpus=cfg.learner_cpus)
        else:
            self.learner = plan.build_learner(self.model)
        self.controller = build_controller(
            cfg, plan, self.engine, run_env_factory(cfg, plan), self.template, self.tokenizer
        )
        self.loop_runtime = LocalLoopRuntime(self)
        try:  # a resume that fails (a bad checkpoint) releases the envs, threads and learner process
            self.loop = TrainLoop(cfg, self.controller, self.loop_runtime)
        except BaseException:
            self.close()
            raise

    def export_model(self, out_dir: str | Path) -> Path:
        """The learner's current weights as an HF checkpoint directory (``rz eval --checkpoint`` reads it),
        with the tokenizer files of the source checkpoint when the run uses its tokenizer."""
        from rz_agents.model.checkpoint import save_hf_checkpoint

        if self.cfg.learner_process:  # the child trains; its weights live in shared memory
            with torch.no_grad():
                self.model.load_state_dict(self.learner.weights())
        return save_hf_checkpoint(
            self.model, out_dir, extra_files=tokenizer_files(self.cfg.tokenizer, self.cfg.model.checkpoint)
        )

    def push_model_weights(self) -> None:
        """``model`` was changed in place (a supervised warm start): the learner takes its weights (fp32
        masters included), keeping its version, and the engine samples with them."""
        self.learner.replace_weights({k: v.detach() for k, v in self.model.state_dict().items()})
        self.loop_runtime.load_engine_base()  # LoRA: the warm start changed the (otherwise frozen) base
        self.loop_runtime.load_engine_weights(*self.loop.weights_to_publish())

    def close(self) -> None:
        """Release envs, threads and files; undo the CPU pinning of this thread."""
        loop_runtime = getattr(self, "loop_runtime", None)
        if loop_runtime is not None:
            loop_runtime.restore_affinity()
        controller = getattr(self, "controller", None)
        if controller is not None:
            controller.close()
        if hasattr(getattr(self, "learner", None), "close"):
            self.learner.close()
        self._close_loop()
