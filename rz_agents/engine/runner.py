"""The model runner executes a scheduled batch: one packed forward over the paged KV cache, then logits.

It owns the model and the cache; it knows nothing about queues or sampling policy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from rz_agents.engine.config import EngineConfig
from rz_agents.engine.cuda_graphs import DecodeGraphs
from rz_agents.engine.decode_step import DecodeStep
from rz_agents.engine.images import ImageCache, SequenceImages
from rz_agents.engine.scheduler import ScheduledBatch
from rz_agents.model.forward_inputs import Segment
from rz_agents.model.kv_cache import pages_for
from rz_agents.model.vision import ImageEmbeddings

LOGIT_CHUNK_BYTES = 15 << 20
log = logging.getLogger(__name__)


@dataclass
class StepInputs:
    """One forward's metadata on the model's device (views into one uploaded tensor)."""

    tokens: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    rows: torch.Tensor  # [T] row of each token's sequence in page_table
    sample_rows: torch.Tensor  # [k] rows of the hidden states that yield a token
    page_table: torch.Tensor  # [chunks, W] pages of each chunk's sequence
    max_position: int  # known on the host: no device read-back to check capacity


class ModelRunner:
    """Runs ``model`` over packed chunks of many sequences, each reading and writing its own pages."""

    def __init__(
        self,
        model: torch.nn.Module,
        kv_cache,
        decode_step: DecodeStep | None = None,
        graphs: DecodeGraphs | None = None,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.decode_step = decode_step  # decode-only steps go through it (static, bucketed buffers)
        self.graphs = graphs  # on CUDA: that step's captured graphs, replayed instead
        self.cuda_graphs_off: str | None = None if graphs is not None else "no CUDA graphs were given"
        self.static_decode_steps = 0  # decode-only steps run by the static decode step (or its graphs)
        self.image_cache = ImageCache()  # encoded images by content, for the current weights (images.py)
        # keys of the encodings live sequences still need (the engine sets it: it knows the sequences)
        self.needed_images: Callable[[], set] = set

    @classmethod
    def for_engine(
        cls, model: torch.nn.Module, kv_cache, config: EngineConfig, scratch_page: int
    ) -> ModelRunner:
        """The runner with the forward paths ``config`` and the device allow, chosen here and nowhere else: a
        decode-only step replays its CUDA graph (``cuda_graphs``, on CUDA), or runs the static decode step
        (``static_decode``: the batch padded to a bucket over preallocated buffers), and every other step the
        general packed forward (``forward``). ``cuda_graphs_off`` says why graphs are off, if they are."""
        decode_step = None
        if config.static_decode:
            decode_step = DecodeStep(
                model,
                kv_cache,
                max_batch=min(config.max_running, config.max_batch_tokens),
                width=pages_for(config.max_len),
                scratch_page=scratch_page,
            )
        off = None
        if not config.cuda_graphs:
            off = "engine.cuda_graphs is false"
        elif decode_step is None:
            off = "engine.static_decode is false (graphs capture the static decode step)"
        elif kv_cache.device.type != "cuda":
            off = f"the engine runs on {kv_cache.device.type}, CUDA graphs need a CUDA device"
        if config.cuda_graphs and off:
            log.info("engine.cuda_graphs ignored: %s", off)
        runner = cls(model, kv_cache, decode_step, DecodeGraphs(decode_step) if off is None else None)
        runner.cuda_graphs_off = off
        return runner

    def step_inputs(self, batch: ScheduledBatch) -> StepInputs:
        """The forward's inputs, built on the host from what the scheduler knows and uploaded in one copy.

        Tokens, positions, row of each token in the page table, sampled rows and the page tables
        travel as one int64 tensor (pinned and non-blocking on CUDA), then split into views.
        """
        tokens: list[int] = []
        positions: list[int] = []
        rows: list[int] = []
        sample_rows: list[int] = []
        width = max(len(c.seq.pages) for c in batch.chunks)
        table: list[int] = []
        for i, chunk in enumerate(batch.chunks):
            seq = chunk.seq
            end = chunk.start + chunk.length
            tokens.extend(seq.tokens[chunk.start : end])
            positions.extend(range(chunk.start, end))
            rows.extend([i] * chunk.length)
            if chunk.samples:
                sample_rows.append(len(tokens) - 1)
            table.extend(seq.pages)
            table.extend([0] * (width - len(seq.pages)))  # never read: past the sequence's last block
        n, k = len(tokens), len(sample_rows)
        host = torch.tensor(tokens + positions + rows + sample_rows + table, dtype=torch.long)
        device = self.kv_cache.device
        if device.type == "cuda":
            flat = host.pin_memory().to(device, non_blocking=True)
        else:
            flat = host
        return StepInputs(
            tokens=flat[:n],
            positions=flat[n : 2 * n],
            rows=flat[2 * n : 3 * n],
            sample_rows=flat[3 * n : 3 * n + k],
            page_table=flat[3 * n + k :].view(len(batch.chunks), width),
            max_position=max(c.start + c.length for c in batch.chunks) - 1,
        )

    @torch.inference_mode()
    def forward(self, batch: ScheduledBatch) -> torch.Tensor:
        """Feed every chunk; return the final hidden states [k, hidden] of the k chunks that end at a
        sampling point (rows in the order of ``batch.sampling``)."""
        if self.decode_step is not None and all(c.length == 1 and c.samples for c in batch.chunks):
            rope = self._text_rope_positions(batch)
            if rope is not None:
                run = self.graphs.run if self.graphs is not None else self.decode_step.run
                self.static_decode_steps += 1
                rows = (
                    [c.seq.last_token for c in batch.chunks],
                    [c.start for c in batch.chunks],
                    [c.seq.pages for c in batch.chunks],
                )
                return run(*rows, rope)
        inputs = self.step_inputs(batch)
        # one token per chunk: a decode step (each chunk one row), planned without read-back
        decode = [c.start for c in batch.chunks] if all(c.length == 1 for c in batch.chunks) else None
        extra = self._extra_inputs(batch)
        hidden = self.model(
            inputs.tokens,
            inputs.positions,
            seq_ids=inputs.rows,
            kv_cache=self.kv_cache.view(inputs.page_table, inputs.max_position, decode_positions=decode),
            **extra,
        )
        return hidden[inputs.sample_rows]

    @staticmethod
    def _text_rope_positions(batch: ScheduledBatch) -> list[int] | None:
        """The decode rows' RoPE positions: a text sequence's positions; a sequence with images (a
        vision-language model's): index + its M-RoPE delta, all three axes alike. None when a row is a
        prompt's image placeholder (its 3D rotation and image embedding need the general forward)."""
        out = []
        for chunk in batch.chunks:
            images = chunk.seq.images
            got = chunk.start if images is None else images.text_rope_position(chunk.start)
            if got is None:
                return None
            out.append(got)
        return out

    def _extra_inputs(self, batch: ScheduledBatch) -> dict:
        """The model's extra forward inputs for the batch's chunks (``extra_inputs``, the forward contract's
        hook): a chunk of a sequence with images brings its 3D positions and the embeddings of the prompt
        placeholders it holds (from the image cache, the missing ones encoded now: engine/images.py)."""
        step_keys: set[tuple] = set()  # this step's images: never evicted while it builds its inputs

        def encodings(images: SequenceImages, span: range) -> list[ImageEmbeddings]:
            return self._encodings(images, span, step_keys)

        segments = [
            Segment(c.start, c.length)
            if c.seq.images is None
            else c.seq.images.segment(c.start, c.start + c.length, encodings)
            for c in batch.chunks
        ]
        return self.model.extra_inputs(segments)

    @property
    def images_encoded(self) -> int:
        """Images run through a vision-language model's tower: the cache's misses (each one is encoded)."""
        return self.image_cache.misses

    @property
    def images_reused(self) -> int:
        """Images a request carried that came from the cache, not encoded again: its hits."""
        return self.image_cache.hits

    def _encodings(self, images: SequenceImages, span: range, step_keys: set) -> list[ImageEmbeddings]:
        """The encodings of a sequence's images ``span``: cached ones by content, the others encoded now in
        one tower call and cached."""
        step_keys.update(images.keys[i] for i in span)
        got = {i: self.image_cache.get(images.keys[i]) for i in span}
        missing = [i for i in span if got[i] is None]
        if missing:
            rows = images.pixel_rows
            pixels = torch.cat([images.pixel_values[rows[i] : rows[i + 1]] for i in missing])
            fresh = self.model.encode_images(pixels.to(self.kv_cache.device), images.grids[missing]).split()
            for i, emb in zip(missing, fresh, strict=True):
                got[i] = self.image_cache.put(images.keys[i], emb, step_keys, self.needed_images)
        return [got[i] for i in span]

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits [k, vocab] of hidden rows (the LM head)."""
        return self.model.logits(hidden)

    def logit_rows_per_chunk(self) -> int:
        """Rows the sampler takes at once: its [rows, vocab] fp32 temporaries stay under LOGIT_CHUNK_BYTES.

        A [64, 151,669] fp32 tensor is 39 MB: glibc maps a block that large fresh from the kernel at
        every allocation, and the page faults of the log-softmax and its exp cost more than the sampling
        itself. Chunks of at most 15 MiB are reused from the heap instead. The LM head itself runs once
        over all rows (reading its weight once per step, not once per chunk). Any chunking gives the
        same bits (rows do not depend on the batch).
        """
        vocab = self.model.config.vocab_size
        return max(8, (LOGIT_CHUNK_BYTES // (4 * vocab)) // 8 * 8)

    def copy_page(self, src: int, dst: int, num_positions: int) -> None:
        """Copy the K/V of the first num_positions positions of page src into page dst (every layer)."""
        self.kv_cache.copy_page(src, dst, num_positions)

    def _named_tensors(self) -> dict[str, torch.Tensor]:
        # remove_duplicate=False: with tied embeddings both HF names (embed_tokens, lm_head) resolve.
        own = dict(self.model.named_parameters(remove_duplicate=False))
        own.update(dict(self.model.named_buffers(remove_duplicate=False)))
        return own

    def validate_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Raise ValueError naming the problem if ``state`` does not fit the model; changes nothing."""
        own = self._named_tensors()
        unknown = [k for k in state if k not in own]
        if unknown:
            raise ValueError(f"load_weights: unknown parameter names {unknown[:5]} (of {len(unknown)})")
        for name, value in state.items():
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"load_weights: {name} is a {type(value).__name__}, not a tensor")
            if tuple(value.shape) != tuple(own[name].shape):
                raise ValueError(
                    f"load_weights: {name} has shape {tuple(value.shape)}, "
                    f"the model expects {tuple(own[name].shape)}"
                )

    @torch.no_grad()
    def load_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy tensors into the model's parameters/buffers by name (dtype converted by copy_)."""
        own = self._named_tensors()
        for name, value in state.items():
            own[name].copy_(value)
