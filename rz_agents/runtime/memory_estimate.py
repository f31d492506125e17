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

The estimate is the sum of terms, each reported by a function named for the part of the system that holds
the memory (trainer state, the aligned GEMM's packed weight copies, model activations, the LM head's
log-probs, the optimizer step's temporary, the vision tower, the engine, the weight broadcast, FSDP2 ranks,
the process itself). On CPU three of them exist only there: oneDNN-packed copies of every linear weight,
which the aligned op set keeps on each weight (learner and engine alike), the RSS of the process's
interpreter and libraries, and what a learner's start adds to it (torch.optim's import of torch._dynamo, the
GEMM guard's oneDNN state). The learner's peak is either the backward (activations, log-probs) or the
optimizer step (its temporary), never both: the step's temporary counts only by what it exceeds the
backward's terms.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rz_agents.model.config import ModelConfig
from rz_agents.model.deepseek_v4_config import DeepseekV4Config
from rz_agents.model.kv_cache import PAGE_SIZE, bytes_per_page, pages_for
from rz_agents.model.logprobs import KEEP_LOGITS_BYTES, LOGIT_CHUNK
from rz_agents.model.qwen3_vl_config import ImageProcessing
from rz_kernels.gemm import forms_available

GIB = 1024**3
# The learner terms live only during the forward/backward (freed before the optimizer step)
BACKWARD_TERMS = ("activations", "vision_activations", "lm_head_logits", "lm_head_grad_partials")
STEP_TRANSIENT = "adamw_step_transient"
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
    # bytes of the optimizer step's temporary, whole (the `adamw_step_transient` entry is what it adds to the
    # peak: its excess over the backward's terms)
    optimizer_temporary: int = 0

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
        out = sum(v // shards if k in sharded else v for k, v in self.learner.items() if k != STEP_TRANSIENT)
        # the optimizer's temporary is sharded with the state it is computed from (not with LoRA's replicated
        # adapters), and it adds only by what it exceeds the backward's (unsharded) terms
        temporary = self.optimizer_temporary // (1 if "adamw_state_fp32" in self.replicated else shards)
        backward = sum(self.learner.get(k, 0) for k in BACKWARD_TERMS)
        return out + (max(0, temporary - backward) if STEP_TRANSIENT in self.learner else 0)

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


def _meta_model(config):
    """The model of a language model's config (any family), built on the meta device (no memory)."""
    from rz_agents.model.checkpoint import build_model

    with torch.device("meta"):
        return build_model(config, init=False)


def largest_tensors(config: ModelConfig) -> tuple[int, int]:
    """(elements of the largest parameter, elements of the largest decoder layer), from the meta device."""
    return _largest_of(_meta_model(config))


def _largest_of(model) -> tuple[int, int]:
    """``largest_tensors`` of a model already built."""
    largest = max(p.numel() for p in model.parameters())
    layer = max(sum(p.numel() for p in layer.parameters()) for layer in model.decoder.layers)
    return largest, layer


def _hybrid(c):
    """A hybrid linear-attention language model's own memory terms (Qwen3.5, Kimi Linear: its layers and
    cache size themselves, model/memory_terms.py), or None."""
    from rz_agents.model.memory_terms import hybrid_memory_terms

    return hybrid_memory_terms(c)


# -- the terms, each from the part of the system that holds the memory ------------------------------------
@dataclass(frozen=True)
class _Sizing:
    """What every term is sized from: the language model's config, the parameter counts, the dtype's bytes,
    the learner's micro-batch and where the run computes."""

    c: ModelConfig  # the language model (a VL model's text part; a Qwen35Config for a hybrid model)
    vl: object | None  # a Qwen3VLConfig, or None
    n: int  # all parameters
    t: int  # trained parameters (LoRA: the adapters; a frozen tower left out)
    adapters: int  # LoRA parameters beside the base (0: none)
    e: int  # bytes per element of the model dtype
    ckpt: bool  # activation checkpointing
    tokens: int  # tokens of one learner micro-batch
    cpu: bool  # the model runs on CPU (oneDNN's packed weight copies, a process baseline)
    aligned: bool  # the aligned op set (its GEMMs keep packed weight copies on CPU)
    tower_trained: bool = False
    gemm_elements: int = 0  # elements of the linear weights (counted on CPU only: gemm_weight_elements)

    @property
    def low_precision(self) -> bool:
        return self.c.torch_dtype != torch.float32


def _sizing(cfg, model_config, est: MemoryEstimate) -> _Sizing:
    """The sizes of a TrainConfig's run (and the LoRA / vision notes they come with, on ``est``)."""
    vl = model_config if hasattr(model_config, "vision") else None
    c = vl.text if vl is not None else model_config
    n, e = est.parameters, torch.empty(0, dtype=c.torch_dtype).element_size()
    lora = getattr(cfg.learner, "lora", None)
    t, adapters = n, 0
    if lora is not None and lora.enabled:
        from rz_agents.model.lora import publication_bytes

        t = adapters = publication_bytes(c, lora)[0] // e
        est.notes.append(f"LoRA rank {lora.rank}: {t:,} trained adapter parameters on a frozen base of {n:,}")
    tower_trained = False
    if vl is not None:
        est.vision_parameters = count_vision_parameters(vl)
        if t == n and bool(getattr(cfg.learner, "freeze_vision", False)):
            t = n - est.vision_parameters
        tower_trained = t == n
    # A micro-batch fills its token budget; one episode longer than the budget gets a micro-batch alone.
    tokens = max(cfg.learner.micro_batch_tokens, cfg.rollout.limits.max_episode_tokens)
    device = str(getattr(cfg.model, "device", "cpu"))
    aligned = getattr(cfg.model, "kernels", "aligned") == "aligned"
    ckpt = cfg.model.activation_checkpointing
    gemm = gemm_weight_elements(c) if device == "cpu" else 0  # (one more meta build, once per estimate)
    return _Sizing(c, vl, n, t, adapters, e, ckpt, tokens, device == "cpu", aligned, tower_trained, gemm)


def trainer_state_bytes(z: _Sizing) -> dict[str, int]:
    """The trainer's (trainer/optim.py): the weights, with LoRA the adapters beside them, fp32 masters of a
    low-precision model, the gradients of one micro-batch (plus their fp32 sums on the masters) and AdamW's
    two fp32 moments, all of the trained parameters."""
    out = {"weights": z.n * z.e}
    if z.adapters:  # (an entry of their own: sharded ranks hold the adapters whole, the base in shards)
        out["lora_adapters"] = z.adapters * z.e
    if z.low_precision:
        out["master_weights_fp32"] = z.t * 4
    out["gradients"] = z.t * z.e + (z.t * 4 if z.low_precision else 0)
    out["adamw_state_fp32"] = 2 * z.t * 4
    return out


def gemm_weight_elements(config: ModelConfig) -> int:
    """Elements of the weights the language model multiplies with its linear op (every 2-D weight but the
    embedding table; the LM head's once, tied or not), from the meta device."""
    model = _meta_model(config)
    embed = model.get_input_embeddings().weight
    linear = sum(p.numel() for p in model.parameters() if p.dim() == 2 and p is not embed)
    return linear + (embed.numel() if config.tie_word_embeddings else 0)


def packed_weight_bytes(z: _Sizing) -> dict[str, int]:
    """The aligned GEMM's (rz_kernels.gemm ``_operand``): on CPU it multiplies with oneDNN-packed copies of
    the weights, kept on each weight until the weight changes (one copy of every linear weight, rebuilt
    after each optimizer step), where this machine's oneDNN packs the dtype. Sharded learner ranks and GPUs
    keep none."""
    if not (z.cpu and z.aligned and "packed" in forms_available(z.c.torch_dtype)):
        return {}  # (bf16 on an AVX2-only CPU: oneDNN has no packed kernel, the aligned GEMM uses torch.mm)
    return {"packed_weights": z.gemm_elements * z.e}


# RSS of a process that has imported torch and rz_agents, before any model (CPU; measured 0.23-0.26 GiB on
# torch 2.13 / Python 3.11): interpreter, libraries, oneDNN/OpenMP runtimes
PROCESS_BASELINE_BYTES = int(0.25 * GIB)


def process_baseline_bytes(z: _Sizing) -> dict[str, int]:
    """The process's own (CPU runs, where the estimate is compared with RSS): libraries and interpreter.
    On a GPU that memory is host memory, and the CUDA context is left to the 10% headroom."""
    return {"process_baseline": PROCESS_BASELINE_BYTES} if z.cpu else {}


# What a learner's start adds to the process on CPU, measured on torch 2.13 / Python 3.11 (RSS before and
# after; a malloc_trim in between changes nothing): torch.optim's first param group imports torch._dynamo
# (with sympy and triton, ~880 modules: 0.13-0.14 GiB, whatever the model), and the aligned GEMM's guard
# leaves oneDNN's primitive and scratchpad state for every checked shape resident (0.07-0.08 GiB for a
# 4-layer 32K-vocab model and for SmolLM2 alike).
OPTIMIZER_IMPORT_BYTES = int(0.135 * GIB)
GEMM_GUARD_STATE_BYTES = int(0.075 * GIB)


def learner_startup_bytes(z: _Sizing) -> dict[str, int]:
    """The learner process's start (CPU runs): the modules torch.optim imports (torch._dynamo) and, with the
    aligned op set, the GEMM guard's resident oneDNN state (rz_kernels.gemm ``verify_weights``)."""
    if not z.cpu:
        return {}
    out = {"optimizer_imports": OPTIMIZER_IMPORT_BYTES}
    if z.aligned:
        out["gemm_guard_state"] = GEMM_GUARD_STATE_BYTES
    return out


def optimizer_step_transient_bytes(z: _Sizing, backward_peak: int) -> dict[str, int]:
    """The optimizer step's (torch's foreach AdamW, trainer/optim.py): one fp32 temporary as large as the
    trained parameters (the scaled gradients, then the second moment's square root). It is live after the
    backward has freed the activations and the LM head's log-probs (``backward_peak`` bytes), while the
    gradients still are: the peak is the larger of the two, so only what it exceeds them adds up."""
    return {STEP_TRANSIENT: max(0, z.t * 4 - backward_peak)}


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


def model_activation_bytes(z: _Sizing, est: MemoryEstimate) -> dict[str, int]:
    """The model's (model/transformer.py): what the decoder layers keep for the backward of one micro-batch
    (with checkpointing: each layer's input, and one layer's graph rebuilt at a time), plus the embeddings
    and the final norm."""
    c, tokens, e = z.c, z.tokens, z.e
    hybrid = _hybrid(c)
    if hybrid is not None:
        per_layer = hybrid.layer_activation_bytes(c, tokens)
    else:
        layers = range(c.num_hidden_layers)
        per_layer = [_layer_activation_bytes(c, tokens, c.is_moe_layer(i)) for i in layers]
    act_on = len(per_layer) * tokens * c.hidden_size * e + max(per_layer)
    act_off = sum(per_layer)
    edges = tokens * c.hidden_size * e * 2  # embeddings and final norm
    est.notes.append(
        f"activations with layer checkpointing {(act_on + edges) / GIB:.1f} GiB, without "
        f"{(act_off + edges) / GIB:.1f} GiB"
    )
    return {"activations": (act_on if z.ckpt else act_off) + edges}


def lm_head_logit_bytes(z: _Sizing) -> dict[str, int]:
    """The log-probs' (model/logprobs.py ``token_logprobs``): logits come LOGIT_CHUNK rows at a time. Kept
    for the backward, each chunk leaves its fp32 log-softmax (one [tokens, vocab] in all) and two chunks
    are live beside it (the chunk being computed and its gradient); recomputed (checkpointing on, or above
    KEEP_LOGITS_BYTES), a few chunks are live at once."""
    chunk = min(z.tokens, LOGIT_CHUNK) * z.c.vocab_size * 4
    logits_all = z.tokens * z.c.vocab_size * 4
    # Each chunk's backward makes a [vocab, hidden] gradient of the LM head's weight that autograd sums into
    # the one before it (two live at once), and a tied head's table also gets the embedding's own dense
    # gradient: transients beside `gradients` (measured: 0.2 GiB of SmolLM2's peak, tied, fp32)
    head = 0 if z.adapters else z.c.vocab_size * z.c.hidden_size * z.e  # (LoRA: the head is frozen)
    partials = {"lm_head_grad_partials": (2 if z.c.tie_word_embeddings else 1) * head}
    if logits_all > KEEP_LOGITS_BYTES or z.ckpt:
        return {"lm_head_logits": 3 * chunk, **partials}
    return {"lm_head_logits": logits_all + 2 * chunk, **partials}


def vision_learner_bytes(z: _Sizing, est: MemoryEstimate) -> dict[str, int]:
    """The vision tower's (model/vision.py) on the learner: its activations for a micro-batch of image tokens
    (a trained tower keeps every block's, checkpointed: their inputs and one block's; a frozen one one
    block's at a time)."""
    if z.vl is None:
        return {}
    per = vision_token_bytes(z.vl, z.e)
    image = tokens_per_image(z.vl)
    hybrid = _hybrid(z.c)  # a hybrid decoder's page holds its recurrent inputs and state snapshots too
    page = hybrid.page_bytes(z.c, z.c.torch_dtype) if hybrid is not None else bytes_per_page(z.c)
    if z.tower_trained:
        kind = "checkpointed_activations" if z.ckpt else "trained_activations"
    else:
        kind = "inference_activations"
    est.notes.append(
        f"vision tower: {est.vision_parameters:,} parameters "
        f"({'trained' if z.tower_trained else 'frozen'}); "
        f"a {VL_MAX_PIXELS:,}-pixel image is {image} tokens: "
        f"{image * per['encoding'] / 2**20:.1f} MiB encoded (engine), "
        f"{image * per['trained_activations'] / GIB:.2f} GiB of tower activations when trained "
        f"({image * per['checkpointed_activations'] / GIB:.2f} GiB checkpointed), "
        f"{image * page / PAGE_SIZE / 2**20:.0f} MiB of engine cache; vision_activations assume "
        f"the whole micro-batch ({z.tokens} tokens) is image tokens"
    )
    return {"vision_activations": z.tokens * per[kind]}


def engine_bytes(z: _Sizing, eng, est: MemoryEstimate) -> dict[str, int]:
    """The engine's (engine/engine.py, engine/config.py): its weights (with LoRA the base and the adapters),
    the paged KV cache, one step's activations, the sampler's logits, and on CPU with the aligned op set the
    packed weight copies; a vision-language model adds the encoded-image budget and the tower's activations
    while it encodes a chunk's images."""
    c, e = z.c, z.e
    hybrid = _hybrid(c)
    if hybrid is not None:  # K/V, recurrent inputs and state snapshots per page, the step's recurrent state
        page = hybrid.page_bytes(c, c.torch_dtype)
        pages = eng.num_kv_pages(page)
        running = min(eng.max_running, eng.max_batch_tokens)
        out = {
            "weights": (z.n + z.adapters) * e,
            **hybrid.engine_cache_terms(c, pages, running, c.torch_dtype),
        }
        widest = hybrid.engine_step_width(c)
        est.notes.append(hybrid.cache_note(c, c.torch_dtype))
    else:
        page = bytes_per_page(c)
        pages = eng.num_kv_pages(page)
        out = {"weights": (z.n + z.adapters) * e, "kv_cache": pages * page}
        widest = max(c.intermediate_size, c.num_experts_per_tok * c.moe_intermediate_size)
    out.update(packed_weight_bytes(z))
    step_tokens = eng.max_batch_tokens
    out["step_activations"] = step_tokens * e * (4 * c.hidden_size + 3 * widest)
    sampled = min(eng.max_running, step_tokens)
    out["sampling_logits"] = 4 * sampled * c.vocab_size * 4  # logits, log-probs, probs, CDF scratch
    if z.vl is not None:
        out["image_encodings"] = eng.image_cache_bytes  # the cache's budget (engine/images.py)
        # a prefill chunk's images encoded at once: at most max_batch_tokens image tokens, or one whole image
        chunk_tokens = max(step_tokens, tokens_per_image(z.vl))
        out["vision_step_activations"] = chunk_tokens * vision_token_bytes(z.vl, e)["inference_activations"]
    _kv_notes(eng, pages, page, est)
    return out


def _kv_notes(eng, pages: int, page: int, est: MemoryEstimate) -> None:
    """How many sequences the paged KV cache holds at the assumed lengths (on ``est``, with its notes)."""
    mean_positions = expected_sequence_positions(eng.max_len)
    by_memory = int(pages * PAGE_SIZE // (mean_positions + PAGE_SIZE / 2))  # half a page wasted per sequence
    est.concurrent_sequences = min(eng.max_running, by_memory)
    est.slot_cache_sequences = pages // pages_for(eng.max_len)
    from_bytes = eng.kv_cache_bytes is not None
    source = " (from engine.kv_cache_bytes)" if from_bytes else " (engine.max_running x max_len)"
    est.notes.append(
        f"KV cache: {pages} pages of {PAGE_SIZE} positions ({page / 2**20:.1f} MiB each) = "
        f"{pages * page / GIB:.1f} GiB" + source
    )
    est.notes.append(
        f"concurrent sequences per replica (paged cache): {est.concurrent_sequences} "
        f"(the pages hold {by_memory} at a mean of {mean_positions:.0f} positions, sequence lengths "
        f"log-uniform on [{SHORTEST_SEQUENCE}, {eng.max_len}], group prompts not counted as shared; "
        f"engine.max_running caps running at {eng.max_running}); a slot cache of max_len {eng.max_len} "
        f"would hold {est.slot_cache_sequences}"
    )


def weight_receive_bytes(z: _Sizing, actors, est: MemoryEstimate) -> dict[str, int]:
    """The weight broadcast's receiving end (runtime/ray/weight_broadcast.py): ``WeightBroadcast.receive``
    keeps every bucket until the engine loads them, a second full copy of every state-dict name (tied
    embeddings travel twice: embed_tokens and lm_head); with LoRA only the adapters travel (the base
    reaches an engine once, through the object store)."""
    if actors.weight_transport != "broadcast":
        return {}
    c = z.c
    tied = c.vocab_size * c.hidden_size if c.tie_word_embeddings else 0
    staged = z.adapters * z.e if z.adapters else (z.n + tied) * z.e
    est.notes.append(
        f"weight broadcast: each engine replica receives the "
        f"{'adapters' if z.adapters else 'whole new state'} ({staged / GIB:.3f} GiB) beside its weights "
        "before applying them between steps (weight_receive_staging)"
    )
    return {"weight_receive_staging": staged}


def sharded_learner_bytes(
    z: _Sizing, actors, est: MemoryEstimate, tensors: tuple[int, int] | None = None
) -> dict[str, int]:
    """FSDP2's and the weight publication's on each learner rank (trainer/sharding.py, Learner.iter_weights):
    the running and the prefetched unsharded layer, one tensor gathered whole for publication (with a
    broadcast: a bucket and its packed copy), and with LoRA one fp32 row of adapter gradients per rank
    (trainer/replicated_grads.py; the adapters and their state are replicated). ``tensors``: (elements of the
    largest parameter, of the largest layer) when `largest_tensors` cannot build the model."""
    from rz_agents.runtime.ray.weight_broadcast import BUCKET_BYTES

    largest, layer = tensors or largest_tensors(z.c)
    out = {"fsdp_unsharded_layers": 2 * layer * z.e}
    publish = largest * z.e  # one tensor gathered whole at a time, copied to the host at once
    if actors.weight_transport == "broadcast":  # a bucket of gathered tensors and its packed copy
        publish = max(publish, 2 * BUCKET_BYTES)
    out["publication_transient"] = publish
    if z.adapters:
        est.replicated = ("lora_adapters", "master_weights_fp32", "gradients", "adamw_state_fp32")
        out["lora_gradient_rows"] = actors.learner_ranks * z.t * 4
    est.notes.append(
        f"weight publication gathers one tensor at a time: {publish / GIB:.2f} GiB transient per "
        f"rank (a whole copy of the weights would be {z.n * z.e / GIB:.1f} GiB)"
    )
    est.notes.append(
        "checkpoints: each rank writes its own shards of weights, fp32 masters and AdamW state "
        "(torch.distributed.checkpoint): no gathered transient"
    )
    return out


def estimate_memory(cfg, model_config, model_name: str = "") -> MemoryEstimate:
    """Estimate the per-GPU memory of a TrainConfig `cfg` whose policy has `model_config` (a ModelConfig, or a
    Qwen3VLConfig: its language model plus the vision terms; a DeepseekV4Config: `estimate_deepseek_v4`): the
    sum of the terms each owner reports."""
    if isinstance(model_config, DeepseekV4Config):
        return estimate_deepseek_v4(cfg, model_config, model_name)
    c = model_config.text if hasattr(model_config, "vision") else model_config
    name = model_name or getattr(model_config, "model_type", c.model_type)
    tensors = None
    if c is model_config:  # one meta build (slow for 256-expert models) counts and finds the largest tensors
        meta = _meta_model(model_config)
        n, tensors = meta.num_parameters(), _largest_of(meta)
        del meta
    else:
        n = count_parameters(model_config)
    est = MemoryEstimate(name, n, c.dtype, cfg.model.activation_checkpointing)
    z = _sizing(cfg, model_config, est)
    ray = getattr(cfg, "runtime", "local") == "ray"
    sharded = ray and cfg.actors.learner_ranks > 1
    if sharded:  # FSDP2 ranks pack per call (rz_kernels.gemm.set_packed_cache): no copies kept
        z = dataclasses.replace(z, aligned=False)
    for terms in (
        trainer_state_bytes(z),
        packed_weight_bytes(z),
        model_activation_bytes(z, est),
        vision_learner_bytes(z, est),
        lm_head_logit_bytes(z),
    ):
        est.learner.update(terms)
    backward_peak = sum(est.learner.get(k, 0) for k in BACKWARD_TERMS)
    est.optimizer_temporary = z.t * 4
    for terms in (
        optimizer_step_transient_bytes(z, backward_peak),
        process_baseline_bytes(z),
        learner_startup_bytes(z),
    ):
        est.learner.update(terms)
    engine_z = dataclasses.replace(z, aligned=getattr(cfg.model, "kernels", "aligned") == "aligned")
    est.engine.update(engine_bytes(engine_z, cfg.engine, est))
    est.notes.append(f"learner micro-batch: {z.tokens} tokens")
    if ray:
        est.engine_replicas, est.learner_ranks = cfg.actors.engines, cfg.actors.learner_ranks
        est.engine.update(weight_receive_bytes(z, cfg.actors, est))
        if z.cpu:  # an engine replica is a process of its own
            est.engine.update(process_baseline_bytes(z))
        if sharded:
            est.learner.update(sharded_learner_bytes(z, cfg.actors, est, tensors))
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
    from rz_agents.model.deepseek_v4 import is_deepseek_v4
    from rz_agents.model.deepseek_v4_presets import V4_PRESETS, deepseek_v4_preset
    from rz_agents.model.packaged import PACKAGED_MODELS, resolve_checkpoint
    from rz_agents.model.presets import preset_config, preset_for_checkpoint

    if spec.checkpoint:
        # a packaged model's name (smollm2-135m-instruct): its HF directory, built on first use
        packaged = str(spec.checkpoint) in PACKAGED_MODELS
        path = resolve_checkpoint(spec.checkpoint) if packaged else Path(spec.checkpoint)
        if (path / "config.json").is_file():
            if is_deepseek_v4(path):
                return DeepseekV4Config.from_checkpoint(path, spec.dtype), f"{spec.checkpoint} (config.json)"
            return read_config(path, spec.dtype), f"{spec.checkpoint} (config.json)"
        v4 = Path(str(spec.checkpoint)).name.lower()
        if v4 in V4_PRESETS:
            return deepseek_v4_preset(v4, dtype=spec.dtype), f"{v4} (published config; absent here)"
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
    from rz_agents.model.qwen3_5_config import MODEL_TYPES, MOE_TYPES, Qwen35Config

    if spec.model_type in MODEL_TYPES:  # hybrid linear attention (model/qwen3_5_memory.py), dense or MoE
        moe = spec.model_type in MOE_TYPES
        vision = overrides.pop("vision", None)
        if vision is not None:  # the whole model: the hybrid decoder and its tower (counted as Qwen3-VL's)
            from rz_agents.model.qwen3_5_vl_config import Qwen35VLConfig

            config = Qwen35VLConfig.tiny(vision=dict(vision), moe=moe, **overrides)
            return config, "tiny random model (Qwen3.5 vision-language)"
        return Qwen35Config.tiny(moe=moe, **overrides), f"tiny random model (Qwen3.5{'-MoE' if moe else ''})"
    if spec.model_type == "deepseek_v4":
        return DeepseekV4Config.tiny(**overrides), "tiny random model (DeepSeek-V4)"
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


# -- DeepSeek-V4: its own cache kinds and layer shapes, from model/deepseek_v4_memory.py --------------------
def _v4_shapes(v4: DeepseekV4Config) -> tuple[int, int, int, int]:
    """(parameters, elements of the linear weights, of the largest parameter, of the largest layer) of a
    DeepSeek-V4 model (model/deepseek_v4_memory.py: a meta-device build, the experts past two counted)."""
    from rz_agents.model.deepseek_v4_memory import parameter_shapes

    return parameter_shapes(v4)


def deepseek_v4_activation_bytes(z: _Sizing, v4: DeepseekV4Config, est: MemoryEstimate) -> dict[str, int]:
    """The DeepSeek-V4 model's (model/deepseek_v4.py) autograd graph for one micro-batch, per token from
    `deepseek_v4_memory.activation_bytes_per_token` (with checkpointing: each layer's streams, and one
    layer's graph rebuilt at a time), plus the embeddings and the hyper head."""
    from rz_agents.model.deepseek_v4_memory import activation_bytes_per_token

    per = activation_bytes_per_token(v4, z.e, z.tokens)
    on = z.tokens * (v4.num_hidden_layers * per["layer_input"] + per["max_layer"])
    off = z.tokens * per["per_layer"]
    edges = z.tokens * v4.hidden_size * z.e * (2 + v4.hc_mult)
    est.notes.append(
        f"activations with layer checkpointing {(on + edges) / GIB:.1f} GiB, without "
        f"{(off + edges) / GIB:.1f} GiB (DeepSeek-V4: top-k and HCA entry reads, hyper-connection streams)"
    )
    return {"activations": int((on if z.ckpt else off) + edges)}


def deepseek_v4_engine_bytes(z: _Sizing, v4: DeepseekV4Config, eng, est: MemoryEstimate) -> dict[str, int]:
    """The engine's for a DeepSeek-V4 model: its weights, its paged cache (model/deepseek_v4_cache.py: a page
    holds every position's rows and the entries of the windows ending in it; `v4_bytes_per_page`) for
    engine.max_running sequences of max_len (or the engine.kv_cache_bytes budget), one step's activations and
    the sampler's logits. With engine.free_behind_window (the default) a sequence holds only the pages from
    its window on plus one archive page per `archive_span` pages given back (`deepseek_v4_cache.pages_held`),
    close to the model's own bounded figures (`deepseek_v4_memory.cache_sizes`: the sliding window's K/V and
    the compressors' unpooled windows per sequence, entries per token), which are noted beside it."""
    from rz_agents.model.deepseek_v4_cache import pages_held, v4_bytes_per_page
    from rz_agents.model.deepseek_v4_memory import activation_bytes_per_token, cache_sizes

    sizes = cache_sizes(v4, z.e)
    page = (v4_bytes_per_page(v4) - 1) // v4.torch_dtype.itemsize * z.e + 1
    freed = eng.free_behind_window
    longest = pages_held(v4, eng.max_len, freed) * page
    mean = expected_sequence_positions(eng.max_len)
    budget = eng.kv_cache_bytes if eng.kv_cache_bytes is not None else int(eng.max_running * longest)
    at_mean = pages_held(v4, math.ceil(mean), freed) * page
    est.concurrent_sequences = min(eng.max_running, int(budget // at_mean))
    est.slot_cache_sequences = int(budget // longest)
    step = eng.max_batch_tokens * activation_bytes_per_token(v4, z.e, eng.max_len)["max_layer"]
    sampled = min(eng.max_running, eng.max_batch_tokens)
    token_parts = ", ".join(f"{k} {v:,.0f}" for k, v in sizes.per_token.items())
    seq_parts = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sizes.per_sequence.items())
    est.notes.append(
        f"DeepSeek-V4 caches per token: {token_parts} bytes ({sum(sizes.per_token.values()):,.0f} in all); "
        f"per sequence whatever its length ({sizes.rows_held} positions of rows): {seq_parts}; a max_len "
        f"({eng.max_len}) sequence {sizes.sequence_bytes(eng.max_len) / 2**20:.1f} MiB (the bounded figure)"
    )
    source = "engine.kv_cache_bytes" if eng.kv_cache_bytes is not None else "engine.max_running x max_len"
    kept = (
        "pages behind the sliding window given back (engine.free_behind_window), their entries in archive "
        "pages"
        if freed
        else "every position's rows kept (engine.free_behind_window false)"
    )
    est.notes.append(
        f"paged caches {budget / GIB:.1f} GiB ({source}): {kept}; a page {page / PAGE_SIZE:,.0f} bytes per "
        f"position, a max_len sequence {longest / 2**20:.1f} MiB; {est.slot_cache_sequences} sequences of "
        "max_len, "
        f"{est.concurrent_sequences} at the mean length {mean:.0f} (capped by engine.max_running "
        f"{eng.max_running})"
    )
    return {
        "weights": z.n * z.e,
        "paged_caches": int(budget),
        **packed_weight_bytes(z),
        "step_activations": int(step),
        "sampling_logits": 4 * sampled * v4.vocab_size * 4,
    }


def estimate_deepseek_v4(cfg, v4: DeepseekV4Config, model_name: str = "") -> MemoryEstimate:
    """`estimate_memory` for a DeepSeek-V4 policy: the trainer's state, LM head and process terms as for
    every model, the activations and engine caches from the model's own sizes (model/deepseek_v4_memory.py).
    LoRA is refused (build_policy takes no adapters for this family yet)."""
    lora = getattr(cfg.learner, "lora", None)
    if lora is not None and lora.enabled:
        raise ValueError("the memory estimate (and build_policy) take no LoRA adapters for deepseek_v4 yet")
    n, linear, largest, layer = _v4_shapes(v4)
    est = MemoryEstimate(model_name or "deepseek_v4", n, v4.dtype, cfg.model.activation_checkpointing)
    e = torch.empty(0, dtype=v4.torch_dtype).element_size()
    cpu = str(getattr(cfg.model, "device", "cpu")) == "cpu"
    aligned = getattr(cfg.model, "kernels", "aligned") == "aligned"
    tokens = max(cfg.learner.micro_batch_tokens, cfg.rollout.limits.max_episode_tokens)
    z = _Sizing(v4, None, n, n, 0, e, cfg.model.activation_checkpointing, tokens, cpu, aligned, False, linear)
    ray = getattr(cfg, "runtime", "local") == "ray"
    sharded = ray and cfg.actors.learner_ranks > 1
    learner_z = dataclasses.replace(z, aligned=False) if sharded else z
    for terms in (
        trainer_state_bytes(learner_z),
        packed_weight_bytes(learner_z),
        deepseek_v4_activation_bytes(learner_z, v4, est),
        lm_head_logit_bytes(learner_z),
    ):
        est.learner.update(terms)
    backward_peak = sum(est.learner.get(k, 0) for k in BACKWARD_TERMS)
    est.optimizer_temporary = n * 4
    for terms in (
        optimizer_step_transient_bytes(z, backward_peak),
        process_baseline_bytes(z),
        learner_startup_bytes(z),
    ):
        est.learner.update(terms)
    est.engine.update(deepseek_v4_engine_bytes(z, v4, cfg.engine, est))
    est.notes.append(f"learner micro-batch: {tokens} tokens")
    if ray:
        est.engine_replicas, est.learner_ranks = cfg.actors.engines, cfg.actors.learner_ranks
        est.engine.update(weight_receive_bytes(z, cfg.actors, est))
        if cpu:
            est.engine.update(process_baseline_bytes(z))
        if sharded:
            est.learner.update(sharded_learner_bytes(z, cfg.actors, est, (largest, layer)))
    return est
