"""Per-GPU memory estimate of a training run, from its config alone (`rz train CONFIG --dry-run`).

The model is built on the meta device (no memory, no weights) to count its parameters exactly; the other terms
follow from the config: the learner's weights, fp32 master weights, gradients and AdamW state, its activations
for one micro-batch (with or without activation checkpointing), the LM head's logits, and the engine's
weights, KV cache and step activations. A vision-language model (Qwen3-VL) adds its vision tower: its weights
(and, unless learner.freeze_vision, their masters, gradients and AdamW state), the tower's activations for the
images of a micro-batch, the engine's byte budget of encoded images (engine.image_cache_bytes) and the tower's
transient activations while it encodes a chunk's images; image placeholder tokens take KV pages like text
tokens (counted in the sequence lengths). Under ``runtime: ray`` the two sides have GPUs of their own: one
engine replica per GPU, and the learner's state sharded over its FSDP2 ranks; a rank then also holds what is
gathered whole for a while: FSDP2's unsharded layers (the running one and the one prefetched) and, when
weights are published, one gathered tensor (``Learner.iter_weights``) or, with ``weight_transport:
broadcast``, one bucket and its packed copy; an engine replica receiving a broadcast holds the whole new state
beside its weights until it applies it between steps (``weight_receive_staging``: it keeps generating with the
old weights meanwhile). Checkpoints add nothing on the device: each rank writes its own shards
(torch.distributed.checkpoint), no rank gathers the state. Figures are estimates of what PyTorch holds
(allocator slack, CUDA context and fragmentation come on top: keep ~10% free).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rz_agents.model.config import ModelConfig
from rz_agents.model.kv_cache import PAGE_SIZE, bytes_per_page, pages_for
from rz_agents.model.logprobs import KEEP_LOGITS_BYTES, LOGIT_CHUNK
from rz_agents.model.qwen3_vl_config import ImageProcessing

GIB = 1024**3
# Accelerators the estimate is compared with (usable GiB).
GPUS = {"H100 80GB": 80, "H200 141GB": 141}


@dataclass
class MemoryEstimate:
    """Bytes per component; `learner` and `engine` are the two sides of a run, `one_device` both together."""

    model: str
    parameters: int
    dtype: str
    activation_checkpointing: bool
    learner: dict[str, int] = field(default_factory=dict)
    engine: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # runtime: ray places each engine replica and each FSDP2 learner rank on GPUs of its own; 0: the local
    # runtime, learner and engine on one device
    engine_replicas: int = 0
    learner_ranks: int = 0
    # sequences one engine replica's paged KV cache holds at once at the assumed length distribution
    # (capped by engine.max_running), and what a slot cache of max_len positions would hold
    concurrent_sequences: int = 0
    slot_cache_sequences: int = 0
    vision_parameters: int = 0  # of `parameters`, a vision-language model's tower
    # learner entries every FSDP2 rank holds whole (LoRA: the adapters, their masters, gradients and AdamW
    # state are replicated; only the frozen base, ``weights``, is sharded)
    replicated: tuple[str, ...] = ()

    @property
    def learner_total(self) -> int:
        return sum(self.learner.values())

    @property
    def engine_total(self) -> int:
        return sum(self.engine.values())

    @property
    def one_device_total(self) -> int:
        return self.learner_total + self.engine_total

    def learner_sharded(self, shards: int) -> int:
        """Per-GPU learner bytes with weights, masters, gradients and optimizer state sharded (FSDP2; with
        LoRA only the frozen base)."""
        sharded = {"weights", "master_weights_fp32", "gradients", "adamw_state_fp32"} - set(self.replicated)
        return sum(v // shards if k in sharded else v for k, v in self.learner.items())

    @property
    def placed(self) -> bool:
        """Whether the run places engine replicas and learner ranks apart (runtime: ray)."""
        return self.learner_ranks > 0

    @property
    def learner_rank_total(self) -> int:
        """Per-GPU bytes of one learner rank (the whole learner when it is not sharded)."""
        return self.learner_sharded(self.learner_ranks) if self.learner_ranks > 1 else self.learner_total

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "parameters": self.parameters,
            "dtype": self.dtype,
            "activation_checkpointing": self.activation_checkpointing,
            "learner_gib": {k: round(v / GIB, 2) for k, v in self.learner.items()},
            "engine_gib": {k: round(v / GIB, 2) for k, v in self.engine.items()},
            "learner_total_gib": round(self.learner_total / GIB, 2),
            "engine_total_gib": round(self.engine_total / GIB, 2),
            "one_device_total_gib": round(self.one_device_total / GIB, 2),
            "engine_replicas": self.engine_replicas,
            "learner_ranks": self.learner_ranks,
            "learner_rank_total_gib": round(self.learner_rank_total / GIB, 2),
            "concurrent_sequences_per_replica": self.concurrent_sequences,
            "slot_cache_sequences_per_replica": self.slot_cache_sequences,
            "notes": self.notes,
        }

    def format(self) -> str:
        lines = [
            f"memory estimate per GPU: {self.model}, {self.parameters / 1e9:.2f}B parameters, {self.dtype}, "
            f"activation checkpointing {'on' if self.activation_checkpointing else 'off'}"
        ]
        for title, part, total in (
            ("learner", self.learner, self.learner_total),
            ("engine", self.engine, self.engine_total),
        ):
            lines.append(f"  {title}: {total / GIB:8.1f} GiB")
            lines += [f"    {k:28s} {v / GIB:8.2f} GiB" for k, v in part.items()]

        def fits(total: int) -> str:
            return ", ".join(
                f"{name}: {'fits' if total <= cap * GIB * 0.9 else 'does NOT fit'}"
                for name, cap in GPUS.items()
            )

        if self.placed:
            lines.append(
                f"  per engine replica (runtime: ray, {self.engine_replicas} replicas): "
                f"{self.engine_total / GIB:.1f} GiB ({fits(self.engine_total)})"
            )
            lines.append(
                f"  per learner rank (runtime: ray, FSDP2 over {self.learner_ranks} ranks): "
                f"{self.learner_rank_total / GIB:.1f} GiB ({fits(self.learner_rank_total)})"
            )
        else:
            lines.append(
                f"  one device (local runtime: learner + engine): {self.one_device_total / GIB:.1f} GiB "
                f"({fits(self.one_device_total)})"
            )
            lines.append(
                "  learner state sharded (runtime: ray, FSDP2): "
                + ", ".join(f"{n} GPUs {self.learner_sharded(n) / GIB:.1f} GiB" for n in (8, 16, 32))
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def count_parameters(config) -> int:
    """Exact parameter count of a ModelConfig's or a Qwen3VLConfig's model, from a model built on the meta
    device (no memory used)."""
    from rz_agents.model.checkpoint import build_model

    with torch.device("meta"):
        model = build_model(config, init=False)
    return model.num_parameters()


def count_vision_parameters(config) -> int:
    """Parameters of a Qwen3VLConfig's vision tower (from the meta device)."""
    from rz_agents.model.vision import VisionTower

    with torch.device("meta"):
        tower = VisionTower(config.vision)
    return sum(p.numel() for p in tower.parameters())


# The image size the estimate quotes per image: the Qwen2-VL processor defaults' cap, a large screenshot
# (released Qwen3-VL checkpoints allow up to 16,777,216 pixels: their preprocessor_config.json)
VL_MAX_PIXELS = ImageProcessing().max_pixels


def vision_token_bytes(vl, dtype_bytes: int) -> dict[str, int]:
    """Per merged image token of a Qwen3VLConfig ``vl``: the bytes of its encoding the engine keeps (merged
    row and deepstack rows), the tower's activations the learner keeps for its backward (depth x its
    spatial_merge_size^2 patches: layer norms, q/k/v and rotated q/k, the padded K/V buffers, attention and
    projection outputs, the residual, the MLP's two intermediate rows; the mergers' rows), the same with each
    block checkpointed (``activation_checkpointing``: each block's input kept, one block's activations live
    while the backward recomputes it), and one block's worth (the most a no-grad encoding holds at once)."""
    v = vl.vision
    patches = v.spatial_merge_size**2
    h, i = v.hidden_size, v.intermediate_size
    block = patches * dtype_bytes * (12 * h + 2 * i) + patches * v.num_heads * 4  # + softmax stats (fp32)
    merged = h * patches
    mergers = (1 + len(v.deepstack_visual_indexes)) * dtype_bytes * (3 * merged + v.out_hidden_size)
    return {
        "encoding": (1 + len(v.deepstack_visual_indexes)) * vl.text.hidden_size * dtype_bytes,
        "trained_activations": v.depth * block + mergers + patches * dtype_bytes * v.patch_dim,
        "checkpointed_activations": (
            v.depth * patches * dtype_bytes * h + block + mergers + patches * dtype_bytes * v.patch_dim
        ),
        "inference_activations": 2 * block + mergers,
    }


def tokens_per_image(vl, max_pixels: int = VL_MAX_PIXELS) -> int:
    """Merged tokens of an image at the processor's pixel cap (a screenshot of that size or larger)."""
    side = vl.vision.patch_size * vl.vision.spatial_merge_size
    return max_pixels // (side * side)


def largest_tensors(config: ModelConfig) -> tuple[int, int]:
    """(elements of the largest parameter, elements of the largest decoder layer), from the meta device."""
    from rz_agents.model.transformer import Transformer

    with torch.device("meta"):
        model = Transformer(config, init=False)
    largest = max(p.numel() for p in model.parameters())
    layer = max(sum(p.numel() for p in layer.parameters()) for layer in model.model.layers)
    return largest, layer


def _layer_activation_bytes(c: ModelConfig, tokens: int, moe: bool) -> int:
    """What one decoder layer's autograd graph keeps for `tokens` tokens (model dtype, fp32 where fp32)."""
    e = torch.empty(0, dtype=c.torch_dtype).element_size()
    h, q, kv = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    # two norm inputs/outputs, q/k/v and their normed and rotated copies, the K/V buffers, attention output
    attn = tokens * e * (4 * h + 3 * q + 5 * kv + q) + tokens * c.num_attention_heads * 4
    if moe:
        rows = tokens * c.num_experts_per_tok
        mlp = rows * e * (h + 3 * c.moe_intermediate_size) + rows * h * 4 + tokens * c.num_experts * 4
        mlp += tokens * e * 3 * c.n_shared_experts * c.moe_intermediate_size  # DeepSeek's shared experts
    else:
        mlp = tokens * e * (h + 3 * c.intermediate_size)
    return attn + mlp


def estimate_memory(cfg, model_config, model_name: str = "") -> MemoryEstimate:
    """Estimate the per-GPU memory of a TrainConfig `cfg` whose policy has `model_config` (a ModelConfig, or a
    Qwen3VLConfig: its language model plus the vision terms)."""
    vl = model_config if hasattr(model_config, "vision") else None
    c = vl.text if vl is not None else model_config
    n = count_parameters(model_config)
    e = torch.empty(0, dtype=c.torch_dtype).element_size()
    ckpt = cfg.model.activation_checkpointing  # ModelSpec: layers and LM-head chunks recomputed
    est = MemoryEstimate(model_name or getattr(model_config, "model_type", c.model_type), n, c.dtype, ckpt)

    # Learner. With LoRA only the adapters (t parameters) train: masters, gradients and AdamW state are
    # theirs.
    lora = getattr(cfg.learner, "lora", None)
    t = n
    adapters = 0  # LoRA's parameters beside the base
    if lora is not None and lora.enabled:
        from rz_agents.model.lora import publication_bytes

        t = adapters = publication_bytes(c, lora)[0] // e
        est.notes.append(f"LoRA rank {lora.rank}: {t:,} trained adapter parameters on a frozen base of {n:,}")
    tower_trained = False
    if vl is not None:
        est.vision_parameters = count_vision_parameters(vl)
        frozen = bool(getattr(cfg.learner, "freeze_vision", False))
        if t == n and frozen:
            t = n - est.vision_parameters
        tower_trained = t == n
    est.learner["weights"] = n * e
    if adapters:  # (an entry of their own: sharded ranks hold the adapters whole, the base in shards)
        est.learner["lora_adapters"] = adapters * e
    low_precision = c.torch_dtype != torch.float32
    if low_precision:
        est.learner["master_weights_fp32"] = t * 4
    # The model's own gradients (one micro-batch) plus, in bf16, their fp32 sums on the masters.
    est.learner["gradients"] = t * e + (t * 4 if low_precision else 0)
    est.learner["adamw_state_fp32"] = 2 * t * 4
    # A micro-batch fills its token budget; one episode longer than the budget gets a micro-batch alone.
    tokens = max(cfg.learner.micro_batch_tokens, cfg.rollout.limits.max_episode_tokens)
    layers = [c.is_moe_layer(i) for i in range(c.num_hidden_layers)]
    per_layer = [_layer_activation_bytes(c, tokens, moe) for moe in layers]
    # With checkpointing each layer keeps its input and one layer's graph is rebuilt at a time in the
    # backward.
    act_on = len(layers) * tokens * c.hidden_size * e + max(per_layer)
    act_off = sum(per_layer)
    edges = tokens * c.hidden_size * e * 2  # embeddings and final norm
    est.learner["activations"] = (act_on if ckpt else act_off) + edges
    est.notes.append(
        f"activations with layer checkpointing {(act_on + edges) / GIB:.1f} GiB, without "
        f"{(act_off + edges) / GIB:.1f} GiB"
    )
    if vl is not None:
        per = vision_token_bytes(vl, e)
        image = tokens_per_image(vl)
        # at most a micro-batch of image tokens (screenshot-heavy episodes come close); a trained tower keeps
        # every block's activations (with checkpointing: their inputs and one block's), a frozen one one
        # block's at a time
        if tower_trained:
            kind = "checkpointed_activations" if ckpt else "trained_activations"
        else:
            kind = "inference_activations"
        est.learner["vision_activations"] = tokens * per[kind]
        est.notes.append(
            f"vision tower: {est.vision_parameters:,} parameters "
            f"({'trained' if tower_trained else 'frozen'}); "
            f"a {VL_MAX_PIXELS:,}-pixel image is {image} tokens: "
            f"{image * per['encoding'] / 2**20:.1f} MiB encoded (engine), "
            f"{image * per['trained_activations'] / GIB:.2f} GiB of tower activations when trained "
            f"({image * per['checkpointed_activations'] / GIB:.2f} GiB checkpointed), "
            f"{image * bytes_per_page(c) / PAGE_SIZE / 2**20:.0f} MiB of KV; vision_activations assume "
            f"the whole micro-batch ({tokens} tokens) is image tokens"
        )
    logits_all = tokens * c.vocab_size * 4
    # Chunks recomputed in the backward (above KEEP_LOGITS_BYTES, or with checkpointing on, as
    # rz_agents.model.logprobs.token_logprobs does): a few chunks live at once.
    if logits_all > KEEP_LOGITS_BYTES or ckpt:
        est.learner["lm_head_logits"] = 3 * min(tokens, LOGIT_CHUNK) * c.vocab_size * 4
    else:
        est.learner["lm_head_logits"] = 2 * logits_all
    # Engine.
    eng = cfg.engine
    page = bytes_per_page(c)
    pages = eng.num_kv_pages(page)
    # (with LoRA: the base and the adapters, like the learner)
    est.engine["weights"] = est.learner["weights"] + est.learner.get("lora_adapters", 0)
    est.engine["kv_cache"] = pages * page
    step_tokens = eng.max_batch_tokens
    sampled = min(eng.max_running, step_tokens)
    est.engine["step_activations"] = (
        step_tokens
        * e
        * (4 * c.hidden_size + 3 * max(c.intermediate_size, c.num_experts_per_tok * c.moe_intermediate_size))
    )
    est.engine["sampling_logits"] = 4 * sampled * c.vocab_size * 4  # logits, log-probs, probs, CDF scratch
    if vl is not None:
        est.engine["image_encodings"] = eng.image_cache_bytes  # the cache's budget (engine/images.py)
        # a prefill chunk's images encoded at once: at most max_batch_tokens image tokens, or one whole image
        chunk_tokens = max(step_tokens, tokens_per_image(vl))
        est.engine["vision_step_activations"] = (
            chunk_tokens * vision_token_bytes(vl, e)["inference_activations"]
        )
    mean_positions = expected_sequence_positions(eng.max_len)
    by_memory = int(pages * PAGE_SIZE // (mean_positions + PAGE_SIZE / 2))  # half a page wasted per sequence
    est.concurrent_sequences = min(eng.max_running, by_memory)
    est.slot_cache_sequences = pages // pages_for(eng.max_len)
    est.notes.append(
        f"KV cache: {pages} pages of {PAGE_SIZE} positions ({page / 2**20:.1f} MiB each) = "
        f"{pages * page / GIB:.1f} GiB"
        + (
            " (from engine.kv_cache_bytes)"
            if eng.kv_cache_bytes is not None
            else " (engine.max_running x max_len)"
        )
    )
    est.notes.append(
        f"concurrent sequences per replica (paged cache): {est.concurrent_sequences} "
        f"(the pages hold {by_memory} at a mean of {mean_positions:.0f} positions, sequence lengths "
        f"log-uniform on [{SHORTEST_SEQUENCE}, {eng.max_len}], group prompts not counted as shared; "
        f"engine.max_running caps running at {eng.max_running}); a slot cache of max_len {eng.max_len} "
        f"would hold {est.slot_cache_sequences}"
    )
    est.notes.append(f"learner micro-batch: {tokens} tokens")
    if getattr(cfg, "runtime", "local") == "ray":
        est.engine_replicas, est.learner_ranks = cfg.actors.engines, cfg.actors.learner_ranks
        if cfg.actors.weight_transport == "broadcast":
            # WeightBroadcast.receive keeps every bucket until the engine loads them: a second full copy, of
            # every state-dict name (tied embeddings travel twice: embed_tokens and lm_head)
            # With LoRA a broadcast carries the adapters only (the base reaches an engine once, through
            # the object store: runtime/ray/run.py load_engine_base).
            tied = c.vocab_size * c.hidden_size if c.tie_word_embeddings else 0
            staged = adapters * e if adapters else (n + tied) * e
            est.engine["weight_receive_staging"] = staged
            est.notes.append(
                f"weight broadcast: each engine replica receives the "
                f"{'adapters' if adapters else 'whole new state'} ({staged / GIB:.3f} GiB) beside its "
                "weights "
                "before applying them between steps (weight_receive_staging)"
            )
        if est.learner_ranks > 1:
            from rz_agents.runtime.ray.weight_broadcast import BUCKET_BYTES

            largest, layer = largest_tensors(c)
            est.learner["fsdp_unsharded_layers"] = 2 * layer * e  # the running layer and the prefetched one
            publish = largest * e  # one tensor gathered whole at a time, copied to the host at once
            if (
                cfg.actors.weight_transport == "broadcast"
            ):  # a bucket of gathered tensors and its packed copy
                publish = max(publish, 2 * BUCKET_BYTES)
            est.learner["publication_transient"] = publish
            if adapters:
                # adapters whole on every rank; per round of micro-batches the ranks all-gather one fp32 row
                # of adapter gradients each (trainer/replicated_grads.py)
                est.replicated = ("lora_adapters", "master_weights_fp32", "gradients", "adamw_state_fp32")
                est.learner["lora_gradient_rows"] = est.learner_ranks * t * 4
            est.notes.append(
                f"weight publication gathers one tensor at a time: {publish / GIB:.2f} GiB transient per "
                f"rank (a whole copy of the weights would be {n * e / GIB:.1f} GiB)"
            )
            est.notes.append(
                "checkpoints: each rank writes its own shards of weights, fp32 masters and AdamW state "
                "(torch.distributed.checkpoint): no gathered transient"
            )
    return est


SHORTEST_SEQUENCE = 256  # a prompt and a first turn: the shortest episodes the recipes produce


def expected_sequence_positions(max_len: int, shortest: int = SHORTEST_SEQUENCE) -> float:
    """Mean positions per sequence when lengths are log-uniform on [shortest, max_len].

    The assumed distribution of agent episodes (most end long before max_len, a few reach it):
    its mean is (max_len - shortest) / ln(max_len / shortest).
    """
    lo = min(shortest, max_len)
    if max_len <= lo:
        return float(max_len)
    return (max_len - lo) / math.log(max_len / lo)


def model_config_of(spec, vocab_size: int | None = None) -> tuple[ModelConfig, str]:
    """The architecture a ModelSpec names, without loading weights: the checkpoint's config.json when
    it is on this machine (a packaged model's name included), else the published config matching the
    checkpoint's directory name, else the tiny random model. Returns (config, a description of where it
    came from)."""
    from rz_agents.model.checkpoint import read_config
    from rz_agents.model.packaged import PACKAGED_MODELS, resolve_checkpoint
    from rz_agents.model.presets import preset_config, preset_for_checkpoint

    if spec.checkpoint:
        # a packaged model's name (smollm2-135m-instruct): its HF directory, built on first use
        packaged = str(spec.checkpoint) in PACKAGED_MODELS
        path = resolve_checkpoint(spec.checkpoint) if packaged else Path(spec.checkpoint)
        if (path / "config.json").is_file():
            return read_config(path, spec.dtype), f"{spec.checkpoint} (config.json)"
        preset = preset_for_checkpoint(spec.checkpoint)
        if preset is None:
            raise FileNotFoundError(
                f"model.checkpoint {spec.checkpoint} is not on this machine and its name matches no preset"
            )
        return preset_config(
            preset, dtype=spec.dtype
        ), f"{preset} (published config; {spec.checkpoint} absent here)"
    overrides = {"dtype": spec.dtype, **spec.tiny_overrides}
    if vocab_size is not None:
        overrides.setdefault("vocab_size", vocab_size)
    if spec.model_type == "qwen3_vl":  # the whole model: its language model and its vision tower
        from rz_agents.runtime.factories import tiny_vl_config

        return tiny_vl_config(overrides), "tiny random model (Qwen3-VL)"
    return ModelConfig.tiny(spec.model_type, **overrides), "tiny random model"


def available_memory_bytes() -> int | None:
    """MemAvailable of this machine (Linux), None where /proc/meminfo cannot say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cpu_memory_warning(cfg, available: int | None = None) -> str | None:
    """One line when a CPU run's estimated learner plus engine memory exceeds what this machine has free
    (``available`` bytes; default MemAvailable), with what layer checkpointing would need; None when it fits,
    on other devices, or when the model cannot be sized. The kernel's OOM killer otherwise ends such a run
    minutes in (the learner of configs/osworld-local.yaml without checkpointing: 16 GiB of a 24 GiB node)."""
    if cfg.model.device != "cpu":
        return None
    available = available_memory_bytes() if available is None else available
    try:
        model_cfg, source = model_config_of(cfg.model)
    except (FileNotFoundError, ValueError, ImportError):
        return None
    if available is None:
        return None
    est = estimate_memory(cfg, model_cfg, source)
    engines = max(1, cfg.actors.engines) if cfg.runtime == "ray" else 1
    need = est.learner_total + engines * est.engine_total
    if need <= available:
        return None
    engine = (
        f"engine {est.engine_total / GIB:.1f}"
        if engines == 1
        else f"{engines} engines {est.engine_total / GIB:.1f} each"
    )
    line = (
        f"this run needs ~{need / GIB:.1f} GiB (learner {est.learner_total / GIB:.1f}, of it activations "
        f"{est.learner['activations'] / GIB:.1f}; {engine}) and this machine has {available / GIB:.1f} GiB "
        "available"
    )
    if not cfg.model.activation_checkpointing:
        on = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, activation_checkpointing=True))
        line += (
            "; model.activation_checkpointing=true needs "
            f"~{estimate_memory(on, model_cfg, source).learner_total / GIB:.1f}"
            " GiB for the learner"
        )
    return line + " (rz train CONFIG --dry-run shows the estimate)"
