"""The prefix index under random traffic: every position a sequence reuses holds the K/V of its own token,
computed by the current weights; reference counts equal the page tables; no page is lost or held twice.

The K/V of a page are simulated as the (token, version) written at each of its 64 positions: a forward
writes them, ``copy_page`` copies them, so a wrong match, a stale page or a page freed while still in use
shows up as a wrong entry at some position."""

from __future__ import annotations

import random

import pytest

from rz_agents.engine.pages import PagePool
from rz_agents.engine.params import SamplingParams
from rz_agents.engine.scheduler import Scheduler
from rz_agents.engine.sequence import Sequence, SequenceStatus

PAGE = 64


class _Sim:
    def __init__(self, num_pages: int, rng: random.Random, prefix_cache: bool, share: int) -> None:
        self.kv: dict[int, list] = {p: [None] * PAGE for p in range(num_pages)}
        self.pool = PagePool(num_pages, 1, prefix_cache=prefix_cache)
        self.sched = Scheduler(
            self.pool, max_batch_tokens=96, min_prefill_chunk=8, copy_page=self.copy, share_min_tokens=share
        )
        self.rng = rng
        self.version = 0
        self.checked = 0

    def copy(self, src: int, dst: int, n: int) -> None:
        self.kv[dst][:n] = self.kv[src][:n]

    def check_cached(self, seq: Sequence) -> None:
        for pos in range(seq.num_cached):
            got = self.kv[seq.pages[pos // PAGE]][pos % PAGE]
            assert got == (seq.tokens[pos], self.version) or (
                seq.kv_from_old_weights and got[0] == seq.tokens[pos]
            )
            self.checked += 1

    def check_pool(self) -> None:
        held: dict[int, int] = {}
        for seq in self.sched.running:
            for p in seq.pages:
                held[p] = held.get(p, 0) + 1
        for p in range(self.pool.num_pages):
            assert self.pool.refcount(p) == held.get(p, 0), p
        free = set(self.pool._free)
        cached = set(self.pool._cached)
        assert not free & cached and not free & set(held) and not cached & set(held)
        assert len(free) + len(cached) + len(held) == self.pool.num_pages

    def step(self) -> None:
        sched = self.sched
        before = {id(s) for s in sched.running}
        batch = sched.schedule(self.version)
        for seq in sched.running:
            if id(seq) not in before:  # just admitted: what it reuses must be its own tokens' K/V
                self.check_cached(seq)
        for c in batch.chunks:
            for pos in range(c.start, c.start + c.length):
                self.kv[c.seq.pages[pos // PAGE]][pos % PAGE] = (c.seq.tokens[pos], self.version)
        n = len(batch.sampling)
        toks = [self.rng.randrange(4) for _ in range(n)]  # a tiny vocabulary: continuations collide often

        def stop(seq):
            if len(seq.output) >= seq.params.max_tokens or self.rng.random() < 0.05:
                return ("stop", None)
            return None

        sched.postprocess(batch, toks, [0.0] * n, self.version, stop)
        self.check_pool()


def _prompt(rng: random.Random, bases: list[list[int]]) -> list[int]:
    base = rng.choice(bases)
    cut = rng.randrange(1, len(base) + 1)
    return base[:cut] + [rng.randrange(4) for _ in range(rng.randrange(0, 40))]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("prefix_cache,share", [(True, 16), (False, 16), (True, 0)])
def test_random_traffic_reuses_only_its_own_tokens_kv_and_loses_no_page(seed, prefix_cache, share):
    rng = random.Random(seed * 7 + share + prefix_cache)
    sim = _Sim(num_pages=24, rng=rng, prefix_cache=prefix_cache, share=share)
    bases = [[rng.randrange(4) for _ in range(rng.randrange(60, 200))] for _ in range(3)]
    finished: list[Sequence] = []
    for _ in range(300):
        r = rng.random()
        if r < 0.25 and len(sim.sched.waiting) < 12:
            if finished and rng.random() < 0.5:  # a next turn: the previous turn's tokens and more
                prev = rng.choice(finished)
                prompt = prev.tokens + [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
            else:
                prompt = _prompt(rng, bases)
            if len(prompt) < 6 * PAGE:
                sim.sched.add(Sequence(prompt, SamplingParams(max_tokens=rng.randrange(1, 40))))
        elif r < 0.27:  # a weight update
            sim.version += 1
            recompute = rng.random() < 0.6
            sim.sched.on_weights_updated(recompute=recompute)
        elif r < 0.29 and sim.sched.running:  # a cancel
            seq = rng.choice(sim.sched.running)
            sim.sched.remove(seq, keep_prefix=True, version=sim.version)
        if sim.sched.has_work:
            done_before = {id(s) for s in finished}
            running = list(sim.sched.running)
            sim.step()
            finished += [
                s for s in running if s.status is SequenceStatus.FINISHED and id(s) not in done_before
            ]
    assert sim.checked > 0
