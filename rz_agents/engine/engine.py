"""The rz engine: an asyncio front-end over scheduler, model runner and sampler.

``await engine.generate(prompt, params)`` queues a sequence and waits for its Completion. A step
loop (an asyncio task, started on demand and ended when idle) runs one engine step at a time:
schedule -> runner (packed forward over the paged KV cache) -> sample -> scheduler.postprocess (append,
stop checks, free pages) -> resolve finished requests,
yielding to the event loop between steps so episode coroutines and the learner run in between.
``load_weights`` swaps weights between steps (a lock keeps it out of a running step).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping

import torch

from rz_agents.engine.config import EngineConfig
from rz_agents.engine.images import ImageCache, ImagePrompt, SequenceImages
from rz_agents.engine.pages import PagePool
from rz_agents.engine.params import Completion, SamplingParams
from rz_agents.engine.pause import PauseGate, PauseMode
from rz_agents.engine.runner import ModelRunner
from rz_agents.engine.sampler import HostTokens, sample_on_device
from rz_agents.engine.scheduler import ScheduledBatch, Scheduler
from rz_agents.engine.sequence import Sequence
from rz_agents.engine.stops import check_stop
from rz_agents.model.held_weights import HeldWeights
from rz_agents.model.weight_update import WeightUpdate

log = logging.getLogger(__name__)


class RZEngine:
    """Continuous-batching engine over one ``Transformer`` and a paged KV cache.

    Args:
        model: the model to sample from (its op set decides alignment: ``kernels="aligned"`` gives
            log-probs bit-identical to the trainer's packed forward).
        config: batching, cache and update settings.
        decode: token ids -> text, needed only for SamplingParams.stop strings.
        version: policy version of the initial weights.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: EngineConfig | None = None,
        decode: Callable[[list[int]], str] | None = None,
        version: int = 0,
    ) -> None:
        from rz_agents.model.kv_cache import pages_for

        self.config = config or EngineConfig()
        self.decode = decode
        self.model = model
        self.held = HeldWeights(model)  # checks a partial update's claim on the tensors it leaves out
        self._pin_threads()
        fuse = getattr(model, "fuse_projections", None)
        if fuse is not None:  # one GEMM for q/k/v and one for gate/up per layer (same bits; model/fused.py)
            fuse()
        verify = getattr(model, "verify_kernels", None)
        if verify is not None:  # the aligned kernels' guards, paid (and logged) before any request
            verify()
        cfg = model.config
        page_bytes = model.kv_page_bytes()  # the model's cache kind (a hybrid model's holds recurrent state)
        total_pages = self.config.num_kv_pages(page_bytes)
        num_pages = total_pages - 1  # the last page is the scratch page of padding rows
        if num_pages < pages_for(self.config.max_len):
            raise ValueError(
                f"kv_cache_bytes={self.config.kv_cache_bytes} holds {total_pages} pages of 64 positions "
                f"({page_bytes} bytes each); one sequence of max_len {self.config.max_len} needs "
                f"{pages_for(self.config.max_len)} plus one scratch page"
            )
        device = next(model.parameters()).device
        self.kv_cache = model.new_kv_cache(total_pages, device)
        self.runner = ModelRunner.for_engine(model, self.kv_cache, self.config, scratch_page=num_pages)
        self.runner.image_cache = ImageCache(self.config.image_cache_bytes)
        self.runner.needed_images = self._needed_images
        pages = PagePool(
            num_pages,
            self.kv_cache.bytes_per_page,
            prefix_cache=self.config.prefix_cache,
            ttl_s=self.config.prefix_cache_ttl_s,
        )
        self.scheduler = Scheduler(
            pages,
            max_batch_tokens=self.config.max_batch_tokens,
            min_prefill_chunk=self.config.min_prefill_chunk,
            copy_page=self.runner.copy_page,
            share_min_tokens=self.config.share_prefix_min_tokens,
            max_running=self.config.max_running,
            window=self.kv_cache.window_release() if self.config.free_behind_window else None,
        )
        eos = self.config.eos_token_ids
        if eos is None:
            eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, (list, tuple)) else [cfg.eos_token_id]
        self.eos_token_ids = frozenset(int(t) for t in eos if t is not None)
        self.vocab_size = cfg.vocab_size
        self._version = int(version)
        self._generator = torch.Generator().manual_seed(self.config.seed)
        self._lock = threading.Lock()  # one step or one weight update at a time
        self._futures: dict[Sequence, asyncio.Future] = {}
        self._incoming: deque[Sequence] = deque()  # new requests, handed to the scheduler by the step
        self._loop_task: asyncio.Task | None = None
        self.pause_gate = PauseGate()  # the RL control API's pause / resume (engine/pause.py)
        self.counters = {
            "steps": 0,
            "forward_s": 0.0,
            "prefill_tokens": 0,
            "generated_tokens": 0,
            "weight_updates": 0,
            "errors": 0,
        }

    # -- public API ---------------------------------------------------------------------------
    @property
    def graphs(self):
        """The runner's CUDA graphs of the static decode step (None when off: ``cuda_graphs_off``)."""
        return self.runner.graphs

    @property
    def cuda_graphs_off(self) -> str | None:
        """Why the engine runs without CUDA graphs (None when it has them)."""
        return self.runner.cuda_graphs_off

    @property
    def version(self) -> int:
        return self._version

    async def generate(
        self,
        prompt: list[int] | torch.Tensor,
        params: SamplingParams | None = None,
        on_start: Callable[[Sequence], None] | None = None,
        images: ImagePrompt | None = None,
    ) -> Completion:
        """Generate a completion of ``prompt`` (token ids); raises ValueError for bad input.

        Failures inside the engine do not raise: the Completion then has finish_reason "error" and
        says why in ``error``. Cancelling the awaiting task frees the sequence's pages. ``on_start``
        receives the queued Sequence (read-only: a streaming server reads its ``output`` as it grows).
        ``images`` (a vision-language model only): the pixels and grids of the prompt's image placeholder
        runs, in order (engine/images.py); encoded once, at the first prefill chunk that needs them.
        """
        params = params or SamplingParams()
        prompt = self._check_request(prompt, params)
        loop = asyncio.get_running_loop()
        seq = Sequence(prompt, params)
        if images is not None:  # (a model without images refuses them: ValueError from image_positions)
            seq.images = SequenceImages(prompt, images, self.model)
            self._check_image_bytes(seq.images)
        if on_start is not None:
            on_start(seq)
        fut = loop.create_future()
        self._futures[seq] = fut
        self._incoming.append(seq)  # deque.append is atomic: safe while a step runs in a worker thread
        self._ensure_loop(loop)
        try:
            return await fut
        except asyncio.CancelledError:
            seq.cancelled = True  # the step loop frees its pages before the next step
            raise

    def load_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """``apply_update`` of a flat state dict (parameter name -> tensor, any subset; a partial one carries
        its claim under ``model.held_weights.HELD_KEY``: ``WeightUpdate.from_state``) as ``version``."""
        self.apply_update(WeightUpdate.from_state(state, version))

    def apply_update(self, update: WeightUpdate) -> None:
        """Copy ``update``'s tensors into the model between steps; tokens sampled after it carry its version.

        A partial update (LoRA's adapters, or all but a frozen vision tower) is refused unless this engine
        holds the tensors it leaves out with the bits its ``held_sha256`` claims. Invalid updates raise
        ValueError and change nothing. Running sequences continue; their cached K/V are kept or recomputed
        according to ``config.kv_on_update``. Kept prefix-cache entries are dropped (they belong to old
        weights).
        """
        state = dict(update.tensors)
        self.held.verify(state, update.held_sha256)
        self.runner.validate_state(state)
        with self._lock:
            self.runner.load_state(state)  # in place: the parameters keep their storage
            self.runner.image_cache.clear()  # encoded by the old vision tower: encode again when needed
            if self.graphs is not None:
                self.graphs.check_weights()  # recaptures if a parameter's storage moved anyway
            self._version = int(update.version)
            self.scheduler.on_weights_updated(recompute=self.config.kv_on_update == "recompute")
            self.counters["weight_updates"] += 1

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """Pause between steps for a weight update; ``mode`` says what happens to the requests in flight
        (engine/pause.py: "abort" finishes them now with their partial output, "wait" lets them finish,
        "keep" freezes them until ``resume_generation``). New requests wait until then."""
        self.pause_gate.close(mode)
        with self._lock:  # a step running in a worker thread ends first
            if mode == "abort":
                self._take_incoming()
                for seq in (*self.scheduler.waiting, *self.scheduler.running):
                    seq.cancelled = True
                done = self._sweep_cancelled()
            else:
                done = []
        self._resolve(done)
        await self.pause_gate.drained(lambda: self.scheduler.has_work)

    def resume_generation(self) -> None:
        """Resume after ``pause_generation``: frozen and queued requests continue."""
        self.pause_gate.open()

    @property
    def is_paused(self) -> bool:
        """True while generation is paused (for mode "wait": once the running requests finished)."""
        return self.pause_gate.paused

    def stats(self) -> dict[str, float | int]:
        """Queue, memory and throughput counters."""
        pages = self.scheduler.pages
        return {
            "version": self._version,
            "waiting": len(self.scheduler.waiting),
            "running": len(self.scheduler.running),
            "max_running": self.config.max_running,
            "kv_pages": pages.num_pages,
            "kv_pages_free": pages.num_free,
            "prefix_cached_pages": pages.num_cached_pages,
            "prefix_hits": pages.prefix_hits,
            "prefix_tokens_reused": pages.prefix_tokens_reused,
            "shared_prefix_tokens": self.scheduler.shared_prefix_tokens,
            "preemptions": self.scheduler.preemptions,
            # pages given back behind a sliding window, and the archive pages taken for what they still held
            "kv_pages_released_behind_window": self.scheduler.pages_released_behind_window,
            "kv_archive_pages": self.scheduler.archive_pages,
            "kv_bytes_total": pages.bytes_total,
            "kv_bytes_held": pages.bytes_held,
            "kv_bytes_prefix_cache": pages.bytes_prefix_cache,
            "cuda_graphs": self.graphs is not None and self.graphs.disabled_reason is None,
            "cuda_graphs_off": self.cuda_graphs_off
            or (self.graphs.disabled_reason if self.graphs is not None else None),
            "cuda_graphs_captured": len(self.graphs.captured) if self.graphs is not None else 0,
            "static_decode_steps": self.runner.static_decode_steps,
            "images_encoded": self.runner.images_encoded,
            "images_reused": self.runner.images_reused,
            "images_prefix_reused": self.scheduler.images_prefix_reused,  # their K/V reused: not even read
            # encoded images (engine/images.py; a text model's cache stays empty)
            **self.runner.image_cache.stats(),
            **self.counters,
        }

    def step(self) -> list[Sequence]:
        """Run one engine step now (synchronously); returns the sequences that finished in it."""
        with self._lock:
            return self._step()

    # -- request checks -------------------------------------------------------------------------
    def _check_image_bytes(self, images: SequenceImages) -> None:
        """Refuse a request with an image whose encoding alone exceeds engine.image_cache_bytes."""
        size = self.model.image_row_bytes()
        counts = [b - a for a, b in zip(images.token_rows[:-1], images.token_rows[1:], strict=True)]
        for i, n in enumerate(counts):
            if n * size > self.config.image_cache_bytes:
                raise ValueError(
                    f"image {i} (grid {images.grids[i].tolist()}, {n} tokens) encodes to {n * size} bytes, "
                    f"more than engine.image_cache_bytes={self.config.image_cache_bytes}"
                )

    def _needed_images(self) -> set[tuple]:
        """Keys of the image encodings queued and running sequences still need (placeholders not yet in their
        K/V): the image cache evicts others first."""
        keys: set[tuple] = set()
        for seq in (*self.scheduler.waiting, *self.scheduler.running):
            if seq.images is not None:
                keys |= seq.images.needed_keys(seq.num_cached)
        return keys

    def _check_request(self, prompt, params: SamplingParams) -> list[int]:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        if isinstance(prompt, torch.Tensor):
            if prompt.dim() != 1 or prompt.dtype.is_floating_point:
                raise ValueError(
                    f"prompt tensor must be 1-D integer, got {prompt.dtype} {tuple(prompt.shape)}"
                )
            prompt = prompt.tolist()
        try:
            prompt = [int(t) for t in prompt]
        except (TypeError, ValueError):
            raise ValueError("prompt must be a sequence of token ids") from None
        if not prompt:
            raise ValueError("prompt must contain at least one token")
        if len(prompt) >= self.config.max_len:
            raise ValueError(
                f"prompt has {len(prompt)} tokens; the engine's max_len {self.config.max_len} "
                "leaves no room to generate"
            )
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        if params.stop and self.decode is None:
            raise ValueError("SamplingParams.stop strings need an engine built with decode=tokenizer.decode")
        return prompt

    # -- the step loop ----------------------------------------------------------------------------
    def _ensure_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        task = self._loop_task
        if task is not None and not task.done():
            if task.get_loop() is loop:
                return
            if not task.get_loop().is_closed():
                raise RuntimeError("this engine is already serving requests from another event loop")
        self._drop_orphans(loop)
        self._loop_task = loop.create_task(self._run(), name="rz-engine-steps")

    def _drop_orphans(self, loop: asyncio.AbstractEventLoop) -> None:
        """Forget sequences whose caller's event loop is gone (nobody can receive their result)."""
        with self._lock:
            self._take_incoming()
            for seq, fut in list(self._futures.items()):
                if fut.get_loop() is not loop and fut.get_loop().is_closed():
                    self._futures.pop(seq)
                    self.scheduler.remove(seq, keep_prefix=False, version=self._version)

    async def _run(self) -> None:
        try:
            while self._incoming or self.scheduler.has_work:
                await self.pause_gate.before_step(self.scheduler.has_work)
                if self.config.step_in_thread:
                    finished = await asyncio.to_thread(self.step)
                else:
                    finished = self.step()
                self._resolve(finished)
                await asyncio.sleep(0)  # let episodes, the learner and new requests run
        except asyncio.CancelledError:
            self._fail_all("the engine's step loop was cancelled")
            raise
        except Exception as e:  # a bug in the engine itself: tell every waiting caller, do not hang them
            log.exception("engine step loop failed")
            self._fail_all(f"engine step loop failed: {e!r}")
        except BaseException as e:
            # Not the engine's to handle (KeyboardInterrupt, a caller's time limit such as gpu_check's
            # SectionTimeout): no step handler caught it (they catch Exception only). Free the sequences and
            # raise it in every waiting caller, so it reaches whoever set it instead of becoming "error"
            # completions that look like a finished run, and instead of leaving the callers waiting forever.
            # (Raised here too only when no caller received it: a task's exception nobody awaits is lost.)
            if not self._fail_all(f"engine step loop interrupted: {e!r}", raise_in_callers=e):
                raise

    def _resolve(self, finished: list[Sequence], raise_in_callers: BaseException | None = None) -> int:
        """Hand each finished sequence's caller its completion (or ``raise_in_callers``); how many callers."""
        told = 0
        for seq in finished:
            fut = self._futures.pop(seq, None)
            if fut is not None and not fut.done():
                if raise_in_callers is not None:
                    fut.set_exception(raise_in_callers)
                else:
                    fut.set_result(seq.to_completion())
                told += 1
        return told

    def _fail_all(self, reason: str, raise_in_callers: BaseException | None = None) -> int:
        with self._lock:  # a step may still be finishing in its worker thread
            self._take_incoming()
            pending = list(self.scheduler.waiting) + list(self.scheduler.running)
            for seq in pending:
                self._fail(seq, reason)
        return self._resolve(pending, raise_in_callers)

    def _take_incoming(self) -> None:
        while self._incoming:
            self.scheduler.add(self._incoming.popleft())

    def _fail(self, seq: Sequence, reason: str) -> None:
        seq.error = reason
        seq.finish("error")
        self.counters["errors"] += 1
        self.scheduler.remove(seq, keep_prefix=False, version=self._version)

    def _pin_threads(self) -> None:
        n = self.config.num_threads
        if n is not None and torch.get_num_threads() != n:
            torch.set_num_threads(n)

    def _step(self) -> list[Sequence]:
        """schedule -> runner -> sample -> scheduler.postprocess; returns the sequences that finished."""
        self._pin_threads()
        if not self.pause_gate.holds_new_requests:
            self._take_incoming()
        done = self._sweep_cancelled()
        batch = self.scheduler.schedule(self._version)
        if not batch.chunks:
            return done
        t0 = time.perf_counter()
        try:
            hidden = self.runner.forward(batch)
        except Exception:  # (not BaseException: an interrupt or a caller's time limit propagates)
            hidden = self._forward_each(batch, done)
            if hidden is None:
                return done
        self.counters["steps"] += 1
        self.counters["forward_s"] += time.perf_counter() - t0
        for chunk in batch.chunks:
            if not chunk.samples or chunk.length > 1:
                self.counters["prefill_tokens"] += chunk.length
        sampling = batch.sampling
        try:
            tokens, values = self._sample(sampling, hidden).lists()  # the step's one wait for the device
        except Exception as e:
            log.exception("sampling failed")
            for seq in sampling:
                self._fail(seq, f"sampling failed: {e!r}")
            batch.chunks = [c for c in batch.chunks if not c.samples]
            tokens, values, done = [], [], done + sampling
        finished = self.scheduler.postprocess(batch, tokens, values, self._version, self._stop)
        self.counters["generated_tokens"] += len(tokens)
        self.counters["errors"] += sum(1 for s in finished if s.finish_reason == "error")
        return done + finished

    def _forward_each(self, batch: ScheduledBatch, done: list[Sequence]) -> torch.Tensor | None:
        """After the step's forward failed: each chunk's forward on its own, so only the sequences whose own
        forward fails (a prompt the model cannot take) fail, never their batch-mates. The forward is batch
        invariant, so a chunk's rows are the ones the whole batch would have given. Keeps the chunks that
        succeeded in ``batch``; their sampling rows, or None when none is left."""
        log.warning("model forward failed on a batch of %d chunks; retrying each alone", len(batch.chunks))
        kept, rows = [], []
        for chunk in batch.chunks:
            try:
                out = self.runner.forward(ScheduledBatch([chunk]))
            except Exception as e:
                log.exception("model forward failed; failing its sequence")
                self._fail(chunk.seq, f"model forward failed: {e!r}")
                done.append(chunk.seq)
                continue
            kept.append(chunk)
            rows.append(out.clone())  # a static decode buffer is overwritten by the next chunk's run
        batch.chunks = kept
        return torch.cat(rows) if rows else None

    def _sweep_cancelled(self) -> list[Sequence]:
        """Finish the sequences whose callers went away (their pages are kept as a prefix entry)."""
        done = []
        for seq in [s for s in (*self.scheduler.waiting, *self.scheduler.running) if s.cancelled]:
            seq.finish("cancelled")
            self.scheduler.remove(seq, keep_prefix=True, version=self._version)
            done.append(seq)
        return done

    def _sample(self, sampling: list[Sequence], hidden: torch.Tensor) -> HostTokens:
        """LM head over every sampling row in one GEMM (its weight read once per step), then the sampler on
        the device in chunks of rows (see logit_rows_per_chunk; the same bits as chunked GEMMs: rows do not
        depend on the batch); the tokens and log-probs then go to the host in one copy (HostTokens)."""
        tokens: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        step = self.runner.logit_rows_per_chunk()
        logits = self.runner.logits(hidden)
        for i in range(0, len(sampling), step):
            part = sampling[i : i + step]
            got = sample_on_device(
                logits[i : i + step],
                [s.params for s in part],
                [s.generator for s in part],
                self._generator,
            )
            tokens.append(got[0])
            values.append(got[1])
        if not tokens:  # a step of prefill chunks only
            return HostTokens(torch.zeros(0, dtype=torch.long), torch.zeros(0))
        if len(tokens) == 1:
            return HostTokens(tokens[0], values[0])
        return HostTokens(torch.cat(tokens), torch.cat(values))

    def _stop(self, seq: Sequence):
        return check_stop(seq, self.eos_token_ids, self.config.max_len, self.decode)
