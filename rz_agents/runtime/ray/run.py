"""The Ray runtime: the run's engines, env workers and learner ranks as Ray actors, placed by config.

The driver (this process) runs what the local runtime runs: the rollout controller with its agent loop
per episode, the lag bound and the trajectory queue, and the training loop (runtime/loop.py). Only the
loop runtime differs: the controller's engine is ``EngineReplicas`` (routing episodes to engine actors), its
env factory hands out handles on envs living in ``EnvHost`` actors, and the learner step runs in the learner
ranks. The same ``Trajectory`` objects and versioned weights move between them through Ray.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from pathlib import Path
from typing import Any

import ray

from rz_agents.model.weight_update import WeightUpdate
from rz_agents.runtime.config import TrainConfig
from rz_agents.runtime.factories import (
    build_controller,
    build_model,
    build_tokenizer,
    env_build_args,
    policy_template,
    spec_vl_config,
    tokenizer_files,
    vocab_size,
)
from rz_agents.runtime.loop import RunHandle, TrainLoop
from rz_agents.runtime.loop_runtime import LoopRuntime
from rz_agents.runtime.memory import limit_heap_growth
from rz_agents.runtime.plan import RunPlan
from rz_agents.runtime.ray.cluster import actor_options, connect
from rz_agents.runtime.ray.engines import EngineReplicas, EngineServer
from rz_agents.runtime.ray.env_workers import EnvHost, RemoteEnvFactory, check_env_workers, driver_sys_path
from rz_agents.runtime.ray.learner import LearnerGroup, LearnerRank
from rz_agents.runtime.ray.preflight import preflight, run_estimate
from rz_agents.runtime.ray.publishers import BroadcastPublisher, ObjectStorePublisher

log = logging.getLogger(__name__)


class RayRun(RunHandle):
    """The wired actors of one run; ``train`` (its ``TrainLoop``, over a ``RayLoopRuntime``) drives them from
    this process."""

    def __init__(self, cfg: TrainConfig, plan: RunPlan | None = None) -> None:
        # ``plan``: what ``cfg.validate()`` returned; None validates here (the run schema's checks only)
        plan = TrainConfig.validate(cfg) if plan is None else plan
        if cfg.runtime != "ray":
            raise ValueError(f"RayRun needs runtime: ray, got {cfg.runtime!r} (use build_run)")
        self.cfg, self.plan = cfg, plan  # the config as written; what it decides (runtime/plan.py)
        limit_heap_growth()
        self._owns_ray = connect(cfg)
        self._actors: list[Any] = []
        try:
            preflight(cfg.actors, run_estimate(cfg))  # one line naming the shortfall, not a wait forever
            self._place()
            self.loop_runtime = RayLoopRuntime(self)
            self.loop = TrainLoop(cfg, self.controller, self.loop_runtime)
        except BaseException:
            self.close()
            raise

    def _place(self) -> None:
        cfg, plan, p = self.cfg, self.plan, self.cfg.actors
        self.tokenizer, self.template = build_tokenizer(cfg.tokenizer, cfg.model.checkpoint)
        self.vocab = vocab_size(cfg.tokenizer, self.tokenizer)
        # a vision-language model's template renders images
        self.template = policy_template(self.template, spec_vl_config(cfg.model, self.vocab))
        # model.device is where engines and learner ranks run (validate: it agrees with their GPUs); the
        # driver's own copy of the policy (warm start, export) stays on the CPU
        self.spec = dataclasses.replace(cfg.model, device="cpu")
        engines = self._start_engines("cuda" if p.engine_gpus else "cpu")
        # Each env call holds one thread of its worker while it blocks: enough threads for every env there.
        per_worker = math.ceil(cfg.rollout.max_concurrent_episodes / p.env_workers) + 2
        env_cls = ray.remote(EnvHost)
        workers = [
            env_cls.options(
                **actor_options(
                    p.cpus_per_env_worker, 0, p.env_worker_resources, max_concurrency=per_worker,
                    max_restarts=p.actor_restarts,
                )
            ).remote(*env_build_args(cfg, plan), sys_path=driver_sys_path())
            for _ in range(p.env_workers)
        ]  # fmt: skip
        self._actors += workers
        learner_device = "cuda" if p.learner_gpus else "cpu"
        rank_cls = ray.remote(LearnerRank)
        ranks = [
            rank_cls.options(
                **actor_options(p.cpus_per_learner_rank, p.learner_gpus, p.learner_resources, max_restarts=0)
            ).remote(r, p.learner_ranks, self.spec, self.vocab, plan, learner_device)
            for r in range(p.learner_ranks)
        ]
        self._actors += ranks
        self.engine = EngineReplicas(engines)
        self.env_workers = workers
        self.learner = LearnerGroup(ranks, store_weights=p.weight_transport != "broadcast")
        check_env_workers(workers, timeout_s=cfg.watchdog_s or None)
        # The envs live in the workers. An episode runner that steps none (agent.kind: openai: rz serve
        # sessions over the replica router) runs in the controller, here in the driver, where the router is.
        self.controller = build_controller(
            cfg, plan, self.engine, RemoteEnvFactory(workers), self.template, self.tokenizer
        )

    def _start_engines(self, device: str) -> list[Any]:
        """The engine actors; each runs the plan's engine config (its torch threads: the learner ranks')."""
        p = self.cfg.actors
        engine_cls = ray.remote(EngineServer)
        engines = [
            engine_cls.options(
                **actor_options(
                    p.cpus_per_engine, p.engine_gpus, p.engine_resources, max_restarts=p.actor_restarts
                )
            ).remote(self.spec, self.vocab, self.plan.engine, self.cfg.tokenizer, device, self._lora())
            for _ in range(p.engines)
        ]
        self._actors += engines
        return engines

    def _lora(self):
        """The learner's LoRA config: the engines' policy holds the same adapters, whose values come with
        the learner's first weights (``load_engine_base``); None: no LoRA."""
        lora = self.plan.learner.lora
        return lora if lora.enabled else None

    @functools.cached_property
    def model(self):
        """A copy of the policy in this process, for a supervised warm start (then ``push_model_weights``)
        and for exporting; built on first use, with the learner's current weights (adapters included)."""
        # the learner's policy (the warm start's SFT leaves the tower as the learner does)
        learner = self.plan.learner
        model = build_model(self.spec, self.vocab, lora=learner.lora, freeze_vision=learner.freeze_vision)
        model.load_state_dict(self.learner.full_weights())
        return model

    def push_model_weights(self) -> None:
        """``model`` was changed in place (a supervised warm start): the learner ranks take its weights
        (fp32 masters included), keeping their version, and the engines sample with them (with LoRA the
        whole weights once: the warm start changed the otherwise frozen base)."""
        self.learner.replace_weights({k: v.detach() for k, v in self.model.state_dict().items()})
        self.loop_runtime.load_engine_base()
        self.engine.load_weights(*self.loop.weights_to_publish())

    def export_model(self, out_dir: str | Path) -> Path:
        """The learner's current weights as an HF checkpoint directory (``rz eval --checkpoint`` reads it;
        with LoRA the adapter goes to its ``lora_adapter/``)."""
        from rz_agents.model.checkpoint import save_hf_checkpoint

        self.model.load_state_dict(self.learner.full_weights())
        extra = tokenizer_files(self.cfg.tokenizer, self.cfg.model.checkpoint)
        return save_hf_checkpoint(self.model, out_dir, extra_files=extra)

    @property
    def publications(self) -> dict[str, int]:
        """How many weight publications went by broadcast and by the object store."""
        return self.loop_runtime.publications

    def close(self) -> None:
        """Close envs and end every actor of this run (and the local Ray instance if this run started it)."""
        controller = getattr(self, "controller", None)
        if controller is not None:
            controller.close()
        for worker in getattr(self, "env_workers", []):
            try:
                ray.get(worker.close_all.remote(), timeout=30)
            except Exception as e:  # a dead worker has nothing left to close
                log.warning("env worker did not close its envs: %r", e)
        learner = getattr(self, "learner", None)
        if learner is not None:
            learner.close()
        for actor in self._actors:
            ray.kill(actor)
        self._actors = []
        self._close_loop()
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False


class RayLoopRuntime(LoopRuntime):
    """Actors: the learner steps in its ranks, weights are object-store references (or a torch.distributed
    broadcast from learner rank 0 to the engine replicas, ``actors.weight_transport: broadcast``)."""

    def __init__(self, run: RayRun) -> None:
        self.run = run
        self.engine, self.learner = run.engine, run.learner
        self.object_store = ObjectStorePublisher(run.learner, run.engine)
        self.broadcast: BroadcastPublisher | None = None
        self.publication_bytes = 0  # bytes of the latest weight update (with LoRA: the adapters')
        p = run.cfg.actors
        if p.weight_transport == "broadcast":
            backend = "nccl" if p.engine_gpus and p.learner_gpus else "gloo"
            self.broadcast = BroadcastPublisher(run.learner, run.engine, backend)

    @property
    def publications(self) -> dict[str, int]:
        """How many weight updates went by broadcast and by the object store."""
        by_broadcast = self.broadcast.count if self.broadcast is not None else 0
        return {"broadcast": by_broadcast, "object_store": self.object_store.count}

    async def learner_step(self, batch: list) -> dict[str, Any]:
        return await self.learner.step(batch)

    async def inspection_record(self, batch: list) -> dict[str, Any]:
        return await self.learner.inspection_record(batch, self.run.cfg.tokenizer)

    def learner_state(self, folder: Path) -> dict[str, Any]:
        return self.learner.save_state(folder)

    def load_learner_state(self, state: dict[str, Any], folder: Path | None = None) -> None:
        self.learner.load_state(state, folder)

    def learner_weights(self) -> Any:
        # None while the weights travel by broadcast and are not in the store (send_weights copes).
        return self.object_store.current()

    def snapshot_weights(self, weights: Any) -> Any:
        return weights  # an object in the store never changes

    def load_engine_weights(self, weights: Any, version: int) -> None:
        self.object_store.load(weights, version)

    def load_engine_base(self) -> None:
        self.object_store.load_whole()

    async def send_weights(self, weights: Any, version: int) -> None:
        if self.broadcast is not None and await self.broadcast.publish(version):
            self.publication_bytes = self.broadcast.last_bytes
            return
        await self.object_store.publish(weights, version)
        self.publication_bytes = self.object_store.last_bytes

    def weights_to_tensors(self, weights: Any) -> dict:
        return ray.get(weights).to_state()

    def weights_from_tensors(self, tensors: dict, version: int) -> Any:
        return ray.put(WeightUpdate.from_state(tensors, version))

    def engine_progress(self) -> int:
        return self.engine.counters["requests"] + self.engine.counters["generated_tokens"]

    def engine_step_metrics(self) -> dict[str, Any]:
        return {
            "engine_generated_tokens": self.engine.counters["generated_tokens"],
            "engine_version": self.engine.version,
            "engine_replicas_lost": self.engine.counters["replicas_lost"],
            **{f"weights_published_by_{k}": v for k, v in self.publications.items()},
            "weight_update_bytes": self.publication_bytes,
        }

    def engine_summary(self) -> dict[str, Any]:
        return self.engine.stats()
