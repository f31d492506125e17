"""The scheduler decides what each engine step computes; it never runs the model.

Continuous batching: every step takes one token from each decoding sequence, then fills the rest
of the token budget with prefill chunks (oldest first), so new requests join between decode steps
and a long prompt never stalls the running ones for more than one chunk. Requests wait in FIFO
order while no cache slot is free; they never fail for lack of memory.

Prompts shared by concurrent requests (a group of samples of one prompt, a common system prompt)
are prefilled once: a request whose prompt shares at least ``share_min_tokens`` leading tokens with
a running sequence waits until that sequence has the shared prefix in its slot, then gets a copy of
those K/V (a bit-exact copy, so the result equals a cold prefill) and prefills only the rest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rz_agents.engine.sequence import Sequence, SequenceStatus
from rz_agents.engine.slots import SlotPool, common_prefix_len

CopyKV = Callable[[int, int, int], None]  # (src_slot, dst_slot, num_positions)


@dataclass
class ScheduledChunk:
    """Feed ``seq.tokens[start:start + length]`` at positions start.. into ``seq.slot``."""

    seq: Sequence
    start: int
    length: int

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the newest token, so its last row yields the next token."""
        return self.start + self.length == self.seq.num_tokens


@dataclass
class ScheduledBatch:
    chunks: list[ScheduledChunk]

    @property
    def num_tokens(self) -> int:
        return sum(c.length for c in self.chunks)


class Scheduler:
    """Queues, admits and batches sequences; owns the slot pool."""

    def __init__(
        self,
        slots: SlotPool,
        max_batch_tokens: int = 512,
        min_prefill_chunk: int = 16,
        copy_kv: CopyKV | None = None,
        share_min_tokens: int = 32,
    ) -> None:
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        self.slots = slots
        self.max_batch_tokens = max_batch_tokens
        # Prefill always progresses by at least this many tokens, even when decodes fill the budget.
        self.min_prefill_chunk = max(1, min(min_prefill_chunk, max_batch_tokens))
        self.copy_kv = copy_kv
        self.share_min_tokens = share_min_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order
        self.shared_prefix_tokens = 0  # prompt tokens copied from running sequences instead of prefilled

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def admit(self, version: int) -> None:
        """Move waiting sequences into slots while slots are available (FIFO).

        A sequence whose prompt prefix a running sequence is still prefilling steps aside (keeping
        its place) until that prefix is cached; the others behind it may go first meanwhile.
        """
        deferred: list[Sequence] = []
        while self.waiting:
            seq = self.waiting.popleft()
            donor, shared = self._find_donor(seq.prompt)
            if donor is not None and donor.num_cached < shared:
                deferred.append(seq)
                continue
            got = self.slots.acquire(seq.prompt, version)
            if got is None:
                self.waiting.appendleft(seq)
                break
            slot, cached = got
            if donor is not None and shared > cached:
                self.copy_kv(donor.slot, slot, shared)
                self.shared_prefix_tokens += shared - cached
                cached = shared
            seq.slot, seq.num_cached = slot, cached
            seq.num_cached_prompt_tokens = cached
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
        self.waiting.extendleft(reversed(deferred))

    def _find_donor(self, prompt: list[int]) -> tuple[Sequence | None, int]:
        """The running sequence sharing the longest prompt prefix (>= share_min_tokens), and its length."""
        k = self.share_min_tokens
        if self.copy_kv is None or k < 1 or len(prompt) <= k:
            return None, 0
        head = prompt[:k]
        best, best_len = None, 0
        for seq in self.running:
            if seq.kv_from_old_weights or seq.prompt[:k] != head:
                continue
            n = min(common_prefix_len(seq.tokens, prompt), len(prompt) - 1)
            if n >= k and n > best_len:
                best, best_len = seq, n
        return best, best_len

    def schedule(self, version: int) -> ScheduledBatch:
        """Admit what fits, then pick this step's tokens: all decodes, then prefill chunks."""
        self.admit(version)
        decodes = [s for s in self.running if s.num_pending == 1]
        prefills = [s for s in self.running if s.num_pending > 1]
        chunks = [ScheduledChunk(s, s.num_cached, 1) for s in decodes]
        budget = max(self.max_batch_tokens - len(decodes), self.min_prefill_chunk if prefills else 0)
        for seq in prefills:
            if budget <= 0:
                break
            n = min(seq.num_pending, budget)
            chunks.append(ScheduledChunk(seq, seq.num_cached, n))
            budget -= n
        return ScheduledBatch(chunks)

    def remove(self, seq: Sequence, keep_prefix: bool, version: int) -> None:
        """Take a sequence out of the queues and give back its slot (kept as a prefix entry if asked)."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        if seq.slot is not None:
            cached = seq.tokens[: seq.num_cached] if keep_prefix and not seq.kv_from_old_weights else None
            self.slots.release(seq.slot, cached, version)
            seq.slot = None

    def on_weights_updated(self, recompute: bool) -> None:
        """Apply the kv_on_update policy to running sequences after a weight swap.

        recompute: forget their K/V, so each one prefills its whole history with the new weights.
        keep: their K/V stays; mark it as coming from old weights.
        """
        self.slots.invalidate()
        for seq in self.running:
            if recompute:
                seq.num_cached = 0
                seq.kv_from_old_weights = False
            elif seq.num_cached > 0:
                seq.kv_from_old_weights = True
