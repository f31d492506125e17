"""Factories shared by every runtime: the policy model, tokenizer + chat template, env constructors and the
rollout controller."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rz_agents.model.lora import LoraConfig
from rz_agents.model.packaged import resolve_checkpoint
from rz_agents.model.policy import PolicySpec, build_policy, tiny_vl_config  # noqa: F401 (tiny_vl_config: moved)
from rz_agents.model.qwen3_5_config import MODEL_TYPES as QWEN3_5_TYPES
from rz_agents.model.qwen3_5_config import MOE_TYPES as QWEN3_5_MOE_TYPES
from rz_agents.rollout.controller import RolloutController
from rz_agents.rollout.policy_template import policy_template  # noqa: F401 (moved to rollout/)
from rz_agents.rollout.task_source import TaskSource
from rz_agents.runtime.config import EnvSpec, ModelSpec, TrainConfig
from rz_agents.runtime.device import resolve_device
from rz_agents.runtime.plan import RunPlan


def policy_spec(
    spec: ModelSpec, vocab_size: int, *, lora: LoraConfig | None = None, freeze_vision: bool = False
) -> PolicySpec:
    """The run's ``model:`` section as the policy builder's spec (``model.policy.PolicySpec``), with the
    learner's adapters (``lora``: learner.lora; None for an engine-only model such as ``rz serve``'s) and
    frozen parts (``freeze_vision``: learner.freeze_vision)."""
    return PolicySpec(
        checkpoint=resolve_checkpoint(spec.checkpoint) if spec.checkpoint else None,
        model_type=spec.model_type,
        vocab_size=vocab_size,
        tiny_overrides=dict(spec.tiny_overrides),
        init_seed=spec.init_seed,
        kernels=spec.kernels,  # the only place a run's op set is named
        dtype=spec.dtype,
        activation_checkpointing=spec.activation_checkpointing,
        adapter=spec.adapter,
        lora=lora,
        freeze_vision=freeze_vision,
    )


def build_model(
    spec: ModelSpec, vocab_size: int, *, lora: LoraConfig | None = None, freeze_vision: bool = False
):
    """The policy model (random tiny, or loaded from an HF checkpoint) on ``spec.device``, with
    ``spec.adapter`` (a PEFT LoRA directory) loaded on it, the learner's ``lora`` adapters and its
    ``freeze_vision``: ``model.policy.build_policy`` of ``policy_spec``.

    Raises DeviceError (a ValueError) when the device is absent on this machine."""
    device = resolve_device(spec.device, "model.device")
    return build_policy(policy_spec(spec, vocab_size, lora=lora, freeze_vision=freeze_vision), device)


def spec_vl_config(spec: ModelSpec, vocab_size: int):
    """The vision-language config (Qwen3-VL's, or Qwen3.5's with its tower) of ``spec``'s model without
    building it (None for a text model)."""
    if spec.checkpoint:
        from rz_agents.model.checkpoint import read_model_config

        config = read_model_config(resolve_checkpoint(spec.checkpoint), spec.dtype)
        return config if hasattr(config, "vision") else None
    if spec.model_type in QWEN3_5_TYPES and "vision" in spec.tiny_overrides:
        from rz_agents.model.qwen3_5_vl_config import Qwen35VLConfig

        moe = spec.model_type in QWEN3_5_MOE_TYPES
        return Qwen35VLConfig.tiny(
            moe=moe, **{"vocab_size": vocab_size, "dtype": spec.dtype, **spec.tiny_overrides}
        )
    if spec.model_type != "qwen3_vl":
        return None
    return tiny_vl_config({"vocab_size": vocab_size, "dtype": spec.dtype, **spec.tiny_overrides})


def checkpoint_skeleton(spec: ModelSpec, *, freeze_vision: bool = False):
    """``spec``'s checkpoint model on the meta device (no storage), for sharded learner ranks
    (``freeze_vision``: learner.freeze_vision)."""
    return build_policy(policy_spec(spec, 0, freeze_vision=freeze_vision), "meta")


def checkpoint_weights(spec: ModelSpec):
    """``spec``'s checkpoint tensors by name, read one at a time and cast to the model's dtype (as
    ``build_model`` loads them)."""
    from rz_agents.model.checkpoint import LazyState

    return LazyState(resolve_checkpoint(spec.checkpoint), getattr(torch, spec.dtype))


def build_tokenizer(name: str, checkpoint: str | None = None):
    """(tokenizer, chat template) for the run."""
    if name == "byte":
        from rz_agents.rollout.byte_chat import ByteChatTemplate, ByteTokenizer

        return ByteTokenizer(), ByteChatTemplate()
    if name == "checkpoint":
        from rz_agents.model.chat_template import checkpoint_template
        from rz_agents.model.tokenizer import Tokenizer

        directory = resolve_checkpoint(checkpoint or "")
        if not (directory / "tokenizer.json").is_file():
            raise FileNotFoundError(f"tokenizer: checkpoint, but {directory} has no tokenizer.json")
        tokenizer = Tokenizer.from_dir(directory)
        return tokenizer, checkpoint_template(tokenizer, directory)
    from rz_agents.model.chat_template import ChatTemplate
    from rz_agents.model.tokenizer import qwen3_tokenizer

    return qwen3_tokenizer(), ChatTemplate()


def env_factory(spec: EnvSpec, imports: Sequence[str] = (), max_turns: int | None = None):
    """A zero-argument callable building one env instance.

    ``imports`` (the config's ``imports:``) are imported and the ``rz_agents.envs`` plugins loaded first, in
    whichever process builds the envs (a Ray env worker too); ``max_turns`` is the run's turn limit, given to
    the env when its constructor takes one (``rz_agents.envs.resolve.run_kwargs``). A registered id keeps
    its Gymnasium wrappers.
    """
    from rz_agents.envs.resolve import import_modules, resolve_env, run_kwargs

    import_modules(imports)
    target = resolve_env(spec.id)
    kwargs = run_kwargs(target, spec.kwargs, max_turns)
    return lambda: target.make(**kwargs)


def vocab_size(tokenizer_name: str, tokenizer) -> int:
    """The model's vocabulary size for the run's tokenizer (the byte tokenizer's tiny vocab is padded)."""
    return max(int(tokenizer.vocab_size), 320) if tokenizer_name == "byte" else len(tokenizer)


def tokenizer_files(tokenizer_name: str, checkpoint: str | None) -> dict[str, str]:
    """The source checkpoint's tokenizer files, exported with the model when the run uses its tokenizer."""
    extra: dict[str, str] = {}
    if tokenizer_name == "checkpoint":
        source = resolve_checkpoint(checkpoint or "")
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            if (source / name).is_file():
                extra[name] = (source / name).read_text()
    return extra


def env_build_args(cfg: TrainConfig, plan: RunPlan) -> tuple[EnvSpec, tuple[str, ...], int]:
    """What builds a run's envs, wherever they are built (this process, a Ray env worker): its ``env``,
    ``imports`` and the plan's turn limit."""
    return cfg.env, tuple(cfg.imports), plan.max_turns


def run_env_factory(cfg: TrainConfig, plan: RunPlan):
    """The env factory of a run in this process (``env_build_args``)."""
    return env_factory(*env_build_args(cfg, plan))


def build_controller(
    cfg: TrainConfig, plan: RunPlan, engine, make_env, template, tokenizer
) -> RolloutController:
    """The rollout controller of a run: the plan's rollout config, lag policy and sampling, the run's tasks
    and its episode runner (``agent:``), over ``engine`` (an engine, or the Ray runtime's replica router)
    and ``make_env`` (an env factory: local envs, or handles on envs in Ray env workers; unused by a runner
    that steps no env, which runs in this process: the driver, under Ray)."""
    from rz_agents.agents import episode_runner
    from rz_agents.envs.tasks import load_tasks

    tasks = TaskSource(load_tasks(cfg.env.tasks, "env.tasks"), seed=cfg.seed)
    runner = episode_runner(cfg.agent)
    return RolloutController(
        engine,
        make_env,
        template,
        tokenizer,
        tasks,
        plan.rollout,
        lag=plan.lag,
        sampling=plan.sampling,
        runner=runner,
    )
