"""The Triton launches of the engine and the learner at a recipe's shapes, recorded on meta tensors.

The model is built on the ``meta`` device (no weights, no memory) and run through the code the GPU runs:
``Transformer.forward`` with the Triton op set, the engine's paged KV cache (``KVCache``, ``CacheView``),
``DecodeStep.forward`` over each CUDA-graph bucket's static buffers (what ``DecodeGraphs`` captures), the
engine's LM head and sampling log-softmax (``sampling_logprobs``), and the learner's
``packed_token_logprobs`` forward and backward (activation checkpointing as configured). Host-side index
tensors (positions, sequence ids, page tables) are real, so attention plans are the real ones;
``rz_kernels.compile_check.recorder`` records each launch instead of running it.

Not driven (stated, not hidden): the sampler's draw (``sample_on_device`` uploads from pinned memory, which a
CPU-only torch cannot allocate; its log-softmax is driven directly, with the chunk rows the engine uses), the
optimizer step and FSDP collectives (no Triton launches). A vision-language recipe's decoder is driven as its
text model (the M-RoPE rotation is the same ``_rope_kernel`` launch over rows gathered per token); its vision
tower runs one screenshot (``VL_IMAGE_GRID``) on the engine side (the learner runs the same tower code).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from rz_agents.config_io import rename_fields
from rz_agents.engine.config import EngineConfig
from rz_agents.engine.decode_step import DecodeStep, StepBuffers, decode_buckets
from rz_agents.engine.runner import LOGIT_CHUNK_BYTES
from rz_agents.model.config import ModelConfig
from rz_agents.model.kv_cache import KVCache, pages_for
from rz_agents.model.logprobs import packed_token_logprobs
from rz_agents.model.lora import LoraConfig
from rz_agents.model.policy import PolicySpec, build_policy
from rz_agents.model.presets import preset_config, preset_for_checkpoint
from rz_agents.model.qwen3_vl_config import Qwen3VLConfig
from rz_agents.model.transformer import Transformer
from rz_kernels.compile_check.recorder import Launch, LaunchRecorder, record_launches
from rz_kernels.logprobs import sampling_logprobs

RECIPES = {
    "qwen3-4b": "configs/qwen3-4b-python-tool.yaml",
    "qwen3-30b-a3b": "configs/qwen3-30b-a3b-python-tool.yaml",
    # the other families (issue 40) at a recipe's engine and learner sizes: "config#preset" swaps the model
    "qwen2.5-1.5b": "configs/qwen3-4b-python-tool.yaml#qwen2.5-1.5b-instruct",
    # DeepSeek-V3 cut to 4 layers (its 3 dense first layers and one MoE layer): every distinct launch of the
    # 61-layer model at a fifteenth of the recording time
    "deepseek-v3": "configs/qwen3-30b-a3b-python-tool.yaml#deepseek-v3:num_hidden_layers=4",
    # issue 54: the one-GPU LoRA recipe (the adapters' launches on both sides), and Qwen3-VL-8B (its vision
    # tower, head dim 72, and the M-RoPE decode) at the OSWorld VL recipe's sizes, its decoder cut to 3 layers
    "qwen3-4b-lora": "configs/qwen3-4b-python-tool-lora-1gpu.yaml",
    "qwen3-vl-8b": "configs/qwen3-vl-4b-osworld.yaml#qwen3-vl-8b-instruct:num_hidden_layers=3",
}
# One image of the VL recipes' screenshots (1024 x 576, 16-pixel patches): the tower's launches at its size.
VL_IMAGE_GRID = (1, 36, 64)


@dataclass(frozen=True)
class RecipeShapes:
    """What a recipe config fixes about the launches: the model, the engine's sizes and the micro-batch."""

    name: str
    model: ModelConfig
    max_running: int
    max_len: int
    max_batch_tokens: int
    micro_batch_tokens: int
    activation_checkpointing: bool
    lora: dict | None = None  # learner.lora of the recipe (rank, alpha, ...): adapters on both sides

    @property
    def max_decode_batch(self) -> int:
        return min(self.max_running, self.max_batch_tokens)  # as Engine builds its DecodeStep


def recipe_shapes(config_path: str | Path, repo_root: Path | None = None) -> RecipeShapes:
    """Read a recipe YAML: the model preset named by its checkpoint directory, engine and learner sizes."""
    config_path, _, swap = str(config_path).partition("#")  # "config.yaml#preset": another model, same sizes
    path = Path(config_path)
    if not path.is_absolute() and repo_root is not None:
        path = repo_root / path
    raw = yaml.safe_load(path.read_text())
    model = raw.get("model") or {}
    swap, _, layers = swap.partition(":num_hidden_layers=")
    preset = swap or preset_for_checkpoint(str(model.get("checkpoint", "")))
    if preset is None:
        raise ValueError(f"{path}: model.checkpoint {model.get('checkpoint')!r} names no preset architecture")
    ckpt = bool(model.get("activation_checkpointing", False))
    cfg = preset_config(
        preset, activation_checkpointing=ckpt, **({"num_hidden_layers": int(layers)} if layers else {})
    )
    engine = rename_fields(EngineConfig, raw.get("engine") or {}, "engine")
    learner = raw.get("learner") or {}
    return RecipeShapes(
        name=preset,
        model=cfg,
        max_running=int(engine.get("max_running", 64)),
        max_len=int(engine.get("max_len", 4096)),
        max_batch_tokens=int(engine.get("max_batch_tokens", 8192)),
        micro_batch_tokens=int(learner.get("micro_batch_tokens", 4096)),
        activation_checkpointing=ckpt,
        lora=dict(learner["lora"]) if learner.get("lora") else None,
    )


def text_config(cfg) -> ModelConfig:
    """The decoder's config: a VL config's text part (its decoder's launches are a text model's: the M-RoPE
    decode rotates with rows gathered per token, the same ``_rope_kernel`` launch), else the config."""
    return cfg.text if isinstance(cfg, Qwen3VLConfig) else cfg


def meta_model(cfg: ModelConfig, engine: bool, lora: dict | None = None) -> Transformer:
    """The model on the meta device with the Triton op set (what ``aligned`` resolves to on CUDA); a
    vision-language config builds the VL model; ``lora``: adapters attached as the run attaches them."""
    spec = PolicySpec(
        kernels="triton",
        config=cfg,
        lora=LoraConfig(**lora) if lora else None,
    )
    model = build_policy(spec, "meta")
    if engine:
        model.fuse_projections()  # the engine stacks q/k/v and gate/up (Engine.__init__)
        model.eval()
    return model


def _step_buffers(step: DecodeStep, bucket: int) -> StepBuffers:
    """A bucket's static buffers as host tensors (the device copy is what the meta model reads anyway)."""
    host = torch.zeros(StepBuffers.size(bucket, step.width), dtype=torch.long)
    buf = StepBuffers(host, host, bucket, step.width)
    step.fill_padding(buf)
    return buf


class EngineDriver:
    """The engine's forwards on a meta model and a meta paged cache."""

    def __init__(self, shapes: RecipeShapes) -> None:
        self.shapes = shapes
        self.model = meta_model(text_config(shapes.model), engine=True, lora=shapes.lora)
        self.width = pages_for(shapes.max_len)
        # Pages for every slot at max_len plus the scratch page (only addresses matter on meta).
        self.num_pages = shapes.max_running * self.width + 1
        self.cache = KVCache(text_config(shapes.model), self.num_pages, device="meta")
        self.step = DecodeStep(
            self.model, self.cache, shapes.max_decode_batch, self.width, scratch_page=self.num_pages - 1
        )

    def _pages(self, slot: int, length: int) -> list[int]:
        return [slot * self.width + j for j in range(pages_for(length))]

    @torch.inference_mode()
    def decode(self, batch: int, context: int | None) -> torch.Tensor:
        """One decode step of ``batch`` rows at position ``context`` (None: the CUDA-graph capture, padding
        rows and the static bound) over the bucket's static buffers; then the LM head and log-softmax."""
        step = self.step
        bucket = step.bucket(batch)
        buf = _step_buffers(step, bucket)
        if context is None:
            hidden = step.forward(buf, step.static_max_position, [0] * bucket)[:batch]
        else:
            tables = [self._pages(i, context + 1) for i in range(batch)]
            step._write(buf, [1] * batch, [context] * batch, tables)
            hidden = step.forward(buf, context, [context] * batch + [0] * (bucket - batch))[:batch]
        self.sample(hidden)
        return hidden

    @torch.inference_mode()
    def prefill(self, chunks: list[tuple[int, int]]) -> None:
        """One packed forward over chunks (start, length) of distinct sequences (a length-1 chunk is a decode
        row riding along), as ModelRunner.forward runs a mixed batch; sampled rows: each chunk's last."""
        tokens, positions, rows, sample_rows, tables = [], [], [], [], []
        for i, (start, length) in enumerate(chunks):
            positions.extend(range(start, start + length))
            tokens.extend([1] * length)
            rows.extend([i] * length)
            sample_rows.append(len(tokens) - 1)
            tables.append(self._pages(i, start + length))
        width = max(len(t) for t in tables)
        table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long)
        top = max(s + n for s, n in chunks) - 1
        decode = [s for s, _ in chunks] if all(n == 1 for _, n in chunks) else None
        view = self.cache.view(table, top, decode_positions=decode)
        hidden = self.model(
            torch.tensor(tokens), torch.tensor(positions), seq_ids=torch.tensor(rows), kv_cache=view
        )
        self.sample(hidden[torch.tensor(sample_rows)])

    def sample(self, hidden: torch.Tensor) -> None:
        """LM head over all rows at once, then the sampling log-softmax per chunk of rows (Engine._sample)."""
        logits = self.model.logits(hidden)
        vocab = text_config(self.shapes.model).vocab_size
        rows = max(8, (LOGIT_CHUNK_BYTES // (4 * vocab)) // 8 * 8)  # ModelRunner.logit_rows_per_chunk
        for i in range(0, logits.shape[0], rows):
            sampling_logprobs(logits[i : i + rows])


class _HostIndexed:
    """The model as ``packed_token_logprobs`` sees it, but reporting the CPU as its device: the packed
    forward's index tensors (positions, sequence ids, rows) then stay real host tensors, so the attention
    plan is the real one; weights and activations stay on meta. Everything else is the model's."""

    def __init__(self, model: Transformer) -> None:
        self._model = model
        self.device = torch.device("cpu")

    def __call__(self, *args, **kwargs):
        return self._model(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._model, name)


def learner_step(model: Transformer, lengths: list[int]) -> None:
    """The learner's micro-batch: the packed forward of sequences of ``lengths`` and its backward, on the
    learner's (unfused, training-mode) meta model."""
    model.train()
    seqs = [torch.ones(n, dtype=torch.long) for n in lengths]
    logps = packed_token_logprobs(_HostIndexed(model), seqs)  # type: ignore[arg-type]
    torch.cat(logps).sum().backward()


def micro_batches_for(shapes: RecipeShapes) -> list[list[int]]:
    """Micro-batches the learner packs at this recipe: one longest episode filling the budget, and several
    shorter ones packed together (different plans and tile counts, the same kernels)."""
    budget = shapes.micro_batch_tokens
    return [[budget], [budget // 2, budget // 4, budget // 8, budget // 8]]


def record_recipe(
    shapes: RecipeShapes, buckets: list[int] | None = None, contexts: tuple[int, ...] = (2048, 8192),
    train: bool = True, prefill: bool = True,
) -> list[Launch]:  # fmt: skip
    """Every launch of the engine (prefill, chunked prefill, decode at each bucket: graph capture and eager at
    each context) and the learner (forward + backward of each micro-batch) at a recipe's shapes."""
    buckets = buckets if buckets is not None else decode_buckets(shapes.max_decode_batch)
    with record_launches() as rec:
        engine = EngineDriver(shapes)  # built inside: the Triton op set is selectable only there
        _record_engine(rec, engine, shapes, buckets, contexts, prefill)
        if train:
            learner = meta_model(text_config(shapes.model), engine=False, lora=shapes.lora)
            for i, lengths in enumerate(micro_batches_for(shapes)):
                tags = dict(
                    model=shapes.name, side="trainer", phase="train", rows=sum(lengths), micro_batch=i
                )
                with rec.tagged(**tags, sequences=len(lengths)):
                    learner_step(learner, lengths)
    return rec.launches


def record_vision_tower(model, grid: tuple[int, int, int] = VL_IMAGE_GRID) -> None:
    """One image through a VL model's vision tower on meta tensors (the engine's image encoding). The
    tower's per-call index tensors and rotary rows stay real host tensors (as the attention plans do)."""
    from rz_agents.model import vision

    tower = model.visual
    patches = grid[0] * grid[1] * grid[2]
    pixels = torch.empty(patches, tower.config.patch_dim, device="meta", dtype=model.lm_head.weight.dtype)
    init = vision._Segments.__init__

    def host_segments(self, grids, merge, rope_base, head_dim, device):
        host = torch.device("cpu") if device.type == "meta" else device
        init(self, grids, merge, rope_base, head_dim, host)

    vision._Segments.__init__ = host_segments
    try:
        with torch.inference_mode():
            tower(pixels, [grid], model.ops_for("meta"))
    finally:
        vision._Segments.__init__ = init


def _record_engine(rec: LaunchRecorder, engine: EngineDriver, shapes, buckets, contexts, prefill) -> None:
    name = shapes.name
    if isinstance(shapes.model, Qwen3VLConfig):
        with rec.tagged(model=name, side="engine", phase="vision", rows=VL_IMAGE_GRID[1] * VL_IMAGE_GRID[2]):
            record_vision_tower(meta_model(shapes.model, engine=False))
    if prefill:
        n = min(2048, shapes.max_batch_tokens)
        with rec.tagged(model=name, side="engine", phase="prefill", rows=n):
            engine.prefill([(0, n)])
        # chunked prefill: a chunk deep into a long prompt, decode rows riding along in the same batch
        chunk = min(4096, shapes.max_batch_tokens // 2)
        riders = [(1000 + 37 * i, 1) for i in range(16)]
        with rec.tagged(model=name, side="engine", phase="chunked_prefill", rows=chunk + len(riders)):
            engine.prefill([(shapes.max_len // 2, chunk), *riders])
    for b in buckets:
        with rec.tagged(model=name, side="engine", phase="decode_graph", rows=b, context=None):
            engine.decode(b, None)
        for ctx in contexts:
            with rec.tagged(model=name, side="engine", phase="decode", rows=b, context=ctx):
                engine.decode(b, ctx)
