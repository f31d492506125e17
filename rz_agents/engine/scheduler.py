"""The scheduler decides what each engine step computes; it never runs the model.

Continuous batching: every step takes one token from each decoding sequence, then fills the rest
of the token budget with prefill chunks (oldest first), so new requests join between decode steps
and a long prompt never stalls the running ones for more than one chunk. A forward never holds
more than ``max_batch_tokens`` tokens: when decodes alone would fill it while a prefill waits,
``min_prefill_chunk`` tokens are kept for the prefill and the decodes take turns.

Memory is paged (rz_agents.engine.pages): a request is admitted when the pages of its tokens can
be found (FIFO; at most ``max_running`` at once), and a running sequence takes one more page each
time it crosses a 64-position boundary. When none is left, the most recently admitted sequence is
preempted: its pages are freed, it goes back to the head of the queue, and when re-admitted it
recomputes its K/V (prompt and generated tokens alike; in aligned mode bit-identical to before).
Requests never fail for lack of memory.

Prefix reuse is one mechanism, the page pool's prefix index (rz_agents.engine.pages: a hash chain over
full pages, reference counts, an LRU cache of finished sequences' pages): at admission a request takes the
longest prefix of its prompt whose K/V some pages already hold, full pages by reference and the last,
partial page as a bit-exact copy, so the result equals a cold prefill (images too: a placeholder is keyed
by its image's content, so a screenshot prompt is shared and reused like text). Pages a running sequence is
still writing count when the match is at least ``share_min_tokens`` long: the request then waits until they
are computed (a group's prompt is prefilled once), keeping its place in the queue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rz_agents.engine.pages import PagePool, PrefixMatch
from rz_agents.engine.sequence import Sequence, SequenceStatus
from rz_agents.engine.window_release import WindowRelease, release_behind
from rz_agents.model.kv_cache import pages_for

CopyPage = Callable[[int, int, int], None]  # (src_page, dst_page, num_positions)
StopCheck = Callable[[Sequence], "tuple[str, int | str | None] | None"]  # -> (finish_reason, stop_reason)


@dataclass
class ScheduledChunk:
    """Feed ``seq.tokens[start:start + length]`` at positions start.. into ``seq.pages``."""

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

    @property
    def sampling(self) -> list[Sequence]:
        """Sequences that get a new token from this step, in chunk order."""
        return [c.seq for c in self.chunks if c.samples]


class Scheduler:
    """Queues, admits, batches and preempts sequences; owns the page pool."""

    def __init__(
        self,
        pages: PagePool,
        max_batch_tokens: int = 512,
        min_prefill_chunk: int = 16,
        copy_page: CopyPage | None = None,
        share_min_tokens: int = 32,
        max_running: int | None = None,
        window: WindowRelease | None = None,
    ) -> None:
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        self.pages = pages
        self.max_batch_tokens = max_batch_tokens
        # Prefill always progresses by at least this many tokens, even when decodes fill the budget.
        self.min_prefill_chunk = max(1, min(min_prefill_chunk, max_batch_tokens))
        self.copy_page = copy_page
        self.share_min_tokens = share_min_tokens
        self.max_running = max_running
        # the cache's pages behind a sliding window, given back after each step (engine/window_release.py)
        self.window = window
        self.pages_released_behind_window = 0  # page-table columns given back
        self.archive_pages = 0  # pages taken to archive what later tokens still read of them
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order
        self.shared_prefix_tokens = 0  # prompt tokens shared from running sequences instead of prefilled
        # images whose placeholders all lay in a reused prefix (shared or cached): never looked up or encoded
        self.images_prefix_reused = 0
        self.preemptions = 0
        self._decode_turn = 0  # rotates which decodes wait when the budget cannot hold them all

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    # -- admission ----------------------------------------------------------------------------
    def admit(self, version: int) -> None:
        """Move waiting sequences into pages while pages and running places are available (FIFO).

        A sequence whose prefix a running sequence is still prefilling steps aside (keeping its
        place) until that prefix is cached; the others behind it may go first meanwhile.
        """
        deferred: list[Sequence] = []
        while self.waiting:
            if self.max_running is not None and len(self.running) >= self.max_running:
                break
            seq = self.waiting.popleft()
            match = self._match(seq, version)
            if match.running and match.potential > match.computed:
                deferred.append(seq)
                continue
            if not self._place(seq, match, version):
                self.waiting.appendleft(seq)
                break
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
        self.waiting.extendleft(reversed(deferred))

    def _match(self, seq: Sequence, version: int) -> PrefixMatch:
        if self.copy_page is None:  # nothing can be reused without copying a partial page
            return PrefixMatch()
        # index tokens: an image placeholder matches only a placeholder of the same image (pages.py)
        return self.pages.match(seq.index_tokens(), version, self.share_min_tokens)

    def _place(self, seq: Sequence, match: PrefixMatch, version: int) -> bool:
        """Give ``seq`` pages for all its tokens, reusing ``match``; False if the pages cannot be found."""
        held = list(match.full)
        source = [match.partial_page] if match.partial_page is not None else []
        self.pages.ref(held + source)  # keep them alive while allocating (which may evict cached pages)
        fresh = self.pages.allocate(pages_for(seq.num_tokens) - len(held))
        if fresh is None:
            self.pages.unref(held + source)
            return False
        if source:
            self.copy_page(source[0], fresh[0], match.partial)
            self.pages.unref(source)
        seq.new_table(held + fresh)
        seq.num_cached = reuse = match.computed
        self.pages.track(seq, version)
        if not seq.admitted:  # what the first admission found (re-admissions recompute, not report)
            seq.num_cached_prompt_tokens = min(reuse, len(seq.prompt))
            seq.admitted = True
        if reuse and seq.images is not None:
            self.images_prefix_reused += sum(1 for last in seq.images.last_slot if last < reuse)
        if reuse and match.running:
            self.shared_prefix_tokens += reuse
        elif reuse:
            self.pages.prefix_hits += 1
            self.pages.prefix_tokens_reused += reuse
        return True

    # -- batching -----------------------------------------------------------------------------
    def schedule(self, version: int) -> ScheduledBatch:
        """Admit what fits, then pick this step's tokens (decodes, then prefill chunks) and make
        sure every chunk's positions have pages, preempting the newest sequences if needed."""
        self.admit(version)
        decodes = [s for s in self.running if s.num_pending == 1]
        prefills = [s for s in self.running if s.num_pending > 1]
        reserve = self.min_prefill_chunk if prefills else 0
        room = self.max_batch_tokens - reserve
        if len(decodes) > room:  # take turns, so no decode waits twice in a row behind the others
            turn = self._decode_turn % len(decodes)
            decodes = (decodes[turn:] + decodes[:turn])[:room]
            self._decode_turn += room
        chunks = [ScheduledChunk(s, s.num_cached, 1) for s in decodes]
        budget = self.max_batch_tokens - len(decodes)
        for seq in prefills:
            if budget <= 0:
                break
            n = min(seq.num_pending, budget)
            chunks.append(ScheduledChunk(seq, seq.num_cached, n))
            budget -= n
        return ScheduledBatch(self._grow(chunks, version))

    def _grow(self, chunks: list[ScheduledChunk], version: int) -> list[ScheduledChunk]:
        """Allocate the pages each chunk writes into; preempt the newest sequences when pages run out."""
        for chunk in chunks:
            seq = chunk.seq
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted for an earlier chunk
            need = pages_for(chunk.start + chunk.length) - len(seq.pages)
            while need > 0:
                got = self.pages.allocate(need)
                if got is not None:
                    seq.pages.extend(got)
                    if not seq.kv_from_old_weights:
                        self.pages.track(seq, version)
                    break
                victim = self.running[-1]
                self.preempt(victim)
                if victim is seq:
                    break
        return [c for c in chunks if c.seq.status is SequenceStatus.RUNNING]

    def preempt(self, seq: Sequence, count: bool = True) -> None:
        """Free a running sequence's pages and queue it first: it recomputes its K/V when re-admitted."""
        self.running.remove(seq)
        self.pages.release(seq, keep=False)
        seq.new_table([])
        seq.num_cached = 0
        seq.kv_from_old_weights = False
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        if count:
            seq.num_preemptions += 1
            self.preemptions += 1

    # -- after a step -------------------------------------------------------------------------
    def postprocess(
        self,
        batch: ScheduledBatch,
        tokens: list[int],
        logprobs: list[float],
        version: int,
        stop: StopCheck,
    ) -> list[Sequence]:
        """Record the step: every chunk's K/V are now cached, each sampling sequence gets its token;
        sequences that meet a stop condition finish and give back their pages. Returns those.

        ``tokens``/``logprobs`` follow ``batch.sampling``; a stop check that raises fails only its
        sequence (finish_reason "error").
        """
        for chunk in batch.chunks:
            chunk.seq.num_cached = chunk.start + chunk.length
        finished = []
        for seq, token, value in zip(batch.sampling, tokens, logprobs, strict=True):
            seq.append(token, value, version)
            if not seq.kv_from_old_weights:
                self.pages.track(seq, version)  # a page whose 64 tokens are now known joins the hash chain
            try:
                got = stop(seq)
            except Exception as e:
                seq.error = f"stop check failed: {e!r}"
                got = ("error", None)
            if got is not None:
                seq.finish(*got)
                self.remove(seq, keep_prefix=got[0] != "error", version=version)
                finished.append(seq)
        if self.window is not None:
            for chunk in batch.chunks:
                if chunk.seq.status is SequenceStatus.RUNNING:
                    given, taken = release_behind(self.pages, chunk.seq, self.window)
                    self.pages_released_behind_window += given
                    self.archive_pages += taken
        return finished

    def remove(self, seq: Sequence, keep_prefix: bool, version: int) -> None:
        """Take a sequence out of the queues and give back its pages (kept as a prefix entry if asked)."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        if seq.pages:
            self.pages.release(seq, keep=keep_prefix and not seq.kv_from_old_weights)
            seq.new_table([])

    def on_weights_updated(self, recompute: bool) -> None:
        """Apply the kv_on_update policy to running sequences after a weight swap.

        recompute: free their pages and queue them first, so each one prefills its whole history
        with the new weights (shared prompts are again computed once per group). keep: their K/V
        stay; mark them as coming from old weights.
        """
        self.pages.invalidate()
        for seq in list(reversed(self.running)):
            if recompute:
                self.preempt(seq, count=False)  # not for lack of memory
            elif seq.num_cached > 0:
                seq.kv_from_old_weights = True
                self.pages.untrack(seq)  # its pages now mix versions: nobody may reuse them
