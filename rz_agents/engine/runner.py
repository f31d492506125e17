"""The model runner executes a scheduled batch: one packed forward over the KV cache, then logits.

It owns the model and the cache; it knows nothing about queues or sampling policy.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from rz_agents.engine.scheduler import ScheduledBatch

LOGIT_CHUNK_BYTES = 15 << 20


class ModelRunner:
    """Runs ``model`` over packed chunks of many sequences, each in its own cache slot."""

    def __init__(self, model: torch.nn.Module, kv_cache) -> None:
        self.model = model
        self.kv_cache = kv_cache

    @torch.inference_mode()
    def forward(self, batch: ScheduledBatch) -> torch.Tensor:
        """Feed every chunk; return the final hidden states [k, hidden] of the k chunks that end at a
        sampling point (rows in the order of ``[c for c in batch.chunks if c.samples]``)."""
        tokens: list[int] = []
        positions: list[int] = []
        slot_ids: list[int] = []
        sample_rows: list[int] = []
        for chunk in batch.chunks:
            seq = chunk.seq
            tokens.extend(seq.tokens[chunk.start : chunk.start + chunk.length])
            positions.extend(range(chunk.start, chunk.start + chunk.length))
            slot_ids.extend([seq.slot] * chunk.length)
            if chunk.samples:
                sample_rows.append(len(tokens) - 1)
        device = self.kv_cache.device
        hidden = self.model(
            torch.tensor(tokens, dtype=torch.long, device=device),
            torch.tensor(positions, dtype=torch.long, device=device),
            seq_ids=torch.tensor(slot_ids, dtype=torch.long, device=device),
            kv_cache=self.kv_cache,
        )
        return hidden[torch.tensor(sample_rows, dtype=torch.long, device=device)]

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits [k, vocab] of hidden rows (the LM head)."""
        return self.model.logits(hidden)

    def logit_rows_per_chunk(self) -> int:
        """Rows of logits to materialise at once: [rows, vocab] fp32 stays under LOGIT_CHUNK_BYTES.

        A [64, 151,669] fp32 tensor is 39 MB: glibc maps a block that large fresh from the kernel at
        every allocation, and the page faults of the logits, their log-softmax and its exp cost more
        than the sampling itself. Chunks of at most 15 MiB are reused from the heap instead. Any
        chunking gives the same bits (the LM head's rows do not depend on the batch).
        """
        vocab = self.model.config.vocab_size
        return max(8, (LOGIT_CHUNK_BYTES // (4 * vocab)) // 8 * 8)

    @torch.no_grad()
    def copy_prefix(self, src_slot: int, dst_slot: int, num_positions: int) -> None:
        """Copy the K/V of positions 0..num_positions-1 from one slot to another (every layer)."""
        for layer in range(len(self.kv_cache.k)):
            for buf in (self.kv_cache.k[layer], self.kv_cache.v[layer]):
                buf[dst_slot, :, :num_positions].copy_(buf[src_slot, :, :num_positions])

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
                    f"load_weights: {name} has shape {tuple(value.shape)}, the model expects {tuple(own[name].shape)}"
                )

    @torch.no_grad()
    def load_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy tensors into the model's parameters/buffers by name (dtype converted by copy_)."""
        own = self._named_tensors()
        for name, value in state.items():
            own[name].copy_(value)
