"""Engine settings (a plain dataclass; YAML configs map onto it field by field)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

KV_ON_UPDATE = ("keep", "recompute")


@dataclass
class EngineConfig:
    """How the rz engine batches, caches and updates.

    max_running: the most sequences running at once (the decode batch; vLLM's max_num_seqs; called
      num_slots before, a name still read with a deprecation warning). The KV cache is paged (pages
      of 64 positions, held in proportion to each sequence's real length, prompt pages shared within
      a group); requests beyond what the pages hold wait, and when running sequences outgrow the
      pages the newest is preempted and later recomputes its K/V (never an error).
    kv_cache_bytes: the KV cache's size in bytes (as many pages as fit, one kept as the scratch page
      of padding rows). None gives max_running x max_len positions (the memory a slot cache would
      reserve) plus the scratch page.
    image_cache_bytes: the byte budget of encoded images (a vision-language model: engine/images.py), held
      on the engine's device beside the KV cache and counted with it by the memory estimate. Per image:
      merged tokens x text hidden x (1 + deepstack layers) x the dtype's bytes (~19 MB for a 1280x720
      screenshot on Qwen3-VL-4B in bf16). Over it, the least recently used encodings no live sequence needs
      go first (an evicted one is encoded again when needed: the same bits); a request with an image larger
      than the whole budget is refused. Image placeholder tokens take KV pages like any token.
    static_decode: run decode-only steps through the static decode step (rz_agents.engine.decode_step):
      the batch padded to a bucket over preallocated buffers, the CUDA-graph-capturable form. The
      aligned kernels make padding change no bit of the real rows (tested).
    cuda_graphs: on a CUDA device, capture that static decode step as one CUDA graph per batch bucket
      (on the bucket's first use) and replay it (rz_agents.engine.cuda_graphs): one launch per decode
      step instead of one per kernel, the same bits as eager (the captured function is the one the CPU
      engine runs). Needs static_decode. Ignored on CPU: the engine then reports
      ``stats()["cuda_graphs"] == False`` and says why in ``stats()["cuda_graphs_off"]``; a capture
      that fails turns graphs off the same way (logged), and decode runs eagerly.
    max_len: positions per sequence (prompt + completion); longer prompts are refused with ValueError
      and a completion that reaches it finishes with "length".
    max_batch_tokens: the most tokens in one forward (decodes first, then prefill chunks).
    min_prefill_chunk: tokens of prefill every step keeps room for when prefills are waiting, even
      when decodes alone would fill max_batch_tokens (the decodes then take turns).
    kv_on_update: what a weight update does to running sequences' K/V. "recompute" (default) prefills
      each running sequence's whole history again with the new weights, so every later token equals
      the trainer's forward with the new weights; "keep" leaves the K/V as they are (cheaper; later
      tokens then attend to keys/values the old weights computed). bench/kv_on_update.py measures
      both: keep is ~1.8x the tokens per CPU-second with an update every 20 steps, but its lag-0
      IS weights are no longer exactly 1; recompute stays the default for that guarantee.
    prefix_cache / prefix_cache_ttl_s: keep a finished sequence's pages keyed by its tokens so the next
      turn reuses the matching prefix (bit-identical to a cold prefill in aligned mode).
    share_prefix_min_tokens: a request whose prompt shares at least this many leading tokens with a
      running sequence copies that sequence's K/V instead of prefilling them (it waits until they are
      computed); groups of samples of one prompt then prefill it once. 0 turns this off.
    free_behind_window: give back, while a sequence runs, the pages a cache kind says no later token reads
      (DeepSeek-V4's sliding window: the compressed entries of those pages are kept in an archive page per
      ``archive_span`` pages; engine/window_release.py). Same bits either way; a cache whose every position
      stays readable (plain K/V, recurrent state) ignores it. ``stats()`` counts the pages given back.
    num_threads: torch intra-op threads, pinned before every step (results can differ with the
      thread count; engine and trainer must use the same). None leaves torch's setting alone.
    step_in_thread: run each model step in a worker thread so the event loop (environments, tools)
      keeps running during the forward; otherwise steps run inline and yield between steps.
    seed: seeds the generator of requests that bring no seed of their own.
    eos_token_ids: default stop tokens; None takes the model config's eos_token_id.
    """

    RENAMED_FIELDS: ClassVar[dict[str, str]] = {"num_slots": "max_running"}  # config_io: old names

    max_running: int = 16
    max_len: int = 2048
    max_batch_tokens: int = 512
    min_prefill_chunk: int = 16
    kv_on_update: Literal["keep", "recompute"] = "recompute"
    prefix_cache: bool = True
    prefix_cache_ttl_s: float = 300.0
    share_prefix_min_tokens: int = 32
    num_threads: int | None = None
    step_in_thread: bool = False
    seed: int = 0
    eos_token_ids: tuple[int, ...] | None = None
    kv_cache_bytes: int | None = None
    image_cache_bytes: int = 1 << 30
    static_decode: bool = True
    cuda_graphs: bool = True
    free_behind_window: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def num_kv_pages(self, bytes_per_page: int) -> int:
        """Pages of 64 positions the KV cache allocates (see kv_cache_bytes), one of them the scratch
        page that padding rows of a static decode step write to."""
        if self.kv_cache_bytes is not None:
            return self.kv_cache_bytes // bytes_per_page
        return self.max_running * -(-self.max_len // 64) + 1

    def validate(self) -> None:
        if self.kv_on_update not in KV_ON_UPDATE:
            raise ValueError(
                f"EngineConfig.kv_on_update must be one of {KV_ON_UPDATE}, got {self.kv_on_update!r}"
            )
        for name in ("max_running", "max_len", "max_batch_tokens", "min_prefill_chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"EngineConfig.{name} must be an int >= 1, got {value!r}")
        for name in ("static_decode", "cuda_graphs", "free_behind_window"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"EngineConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"EngineConfig.num_threads must be >= 1 or None, got {self.num_threads}")
        if not isinstance(self.image_cache_bytes, int) or self.image_cache_bytes < 1:
            raise ValueError(
                f"EngineConfig.image_cache_bytes must be an int > 0, got {self.image_cache_bytes!r}"
            )
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < 1:
            raise ValueError(f"EngineConfig.kv_cache_bytes must be > 0, got {self.kv_cache_bytes}")
        if self.share_prefix_min_tokens < 0:
            raise ValueError(
                f"EngineConfig.share_prefix_min_tokens must be >= 0, got {self.share_prefix_min_tokens}"
            )
        if self.prefix_cache_ttl_s < 0:
            raise ValueError(f"EngineConfig.prefix_cache_ttl_s must be >= 0, got {self.prefix_cache_ttl_s}")
