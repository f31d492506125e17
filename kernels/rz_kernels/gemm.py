"""Matrix multiplication whose per-row result does not depend on how many rows share the call.

Stock `F.linear` picks a different kernel (and so a different reduction order) depending on the
number of rows M, so a token's result changes with the batch it sits in. Two aligned forms:

- `tiled_linear` zero-pads the rows to a multiple of a fixed tile and runs every tile as a GEMM of
  one fixed shape [tile, K] x [K, N]: invariant by construction, but a 1-row decode pays a whole
  tile (64 rows in fp32).
- The *bucketed* form pads the rows only up to the next row bucket (a short fixed ladder), cuts more
  than `CHUNK_ROWS` rows into chunks of that size, and cuts very wide weights (the LM head) into
  fixed-width column slices, so every GEMM it issues has one of a few known shapes. Its GEMM is
  oneDNN's inner product on a pre-packed weight ("packed": the kernel PyTorch's compiler uses for
  frozen CPU linears; measured row-invariant from 1 row up here, in fp32 and bf16, and faster than
  `F.linear` at small M: 27 vs 63 ms for a 4-row 151k-wide LM head), or a plain `torch.mm` ("mm":
  MKL, row-invariant from 4 rows up here) where oneDNN is missing.

That a BLAS computes a row the same way at every bucket is empirical, so the bucketed form is
*guarded*: before a weight shape is first used, `verify_shape` runs it at every bucket and compares
each row with the 16-row result bit for bit (every row position, via a replicated probe), for the
packed form and then the mm form; a shape that passes neither uses `tiled_linear` for good, logged.
Buckets under 16 rows are used only where they pass.

Fused projections (q/k/v, gate/up: one GEMM over weights stacked row-wise) are guarded the same way:
`fusion_verified` runs the stacked weight and each part at 16 rows and compares the columns bit for bit
(the bucket guard has already made a row's bits the same at every bucket, so one bucket decides); a
stack whose forms differ from its parts' or whose columns differ is not fused.

The guard's decisions are cached per (N, K, dtype, threads); they are deterministic, so an engine
and a learner in different processes on one machine reach the same ones. `set_gemm_guard("off")`
skips the check and trusts the first available form from 16 rows up; `"tiled"` forces the tiled form.
Engine and learner must use the same mode, since the forms round differently.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

# Rows per tile of the tiled form, per dtype. Chosen per dtype, never per batch size (a table keyed
# on M is the trap that breaks invariance). fp32 runs all tiles in one bmm; bf16 bmm has no fast
# path on CPU, so bf16 loops over mm calls of larger tiles.
TILE_ROWS = {torch.float32: 64, torch.bfloat16: 128, torch.float16: 128}

# The bucketed form's row ladder: a call with M rows is padded to the smallest bucket >= M (more
# than CHUNK_ROWS rows: chunks of CHUNK_ROWS, the rest padded). Steps grow with the size so that
# padding wastes at most ~1/8 above 64 rows, and the guard's cost (one GEMM per bucket) stays small.
ROW_BUCKETS = (16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)
CHUNK_ROWS = ROW_BUCKETS[-1]
# Buckets under 16 rows: used only where the guard verifies them (MKL's 1-3 row paths sum in
# another order; oneDNN's packed kernel passed from 1 row on, except one shape at 1 row).
SMALL_BUCKETS = (1, 2, 4, 8)
# Weights wider than this are multiplied in column slices of this width: the LM head's GEMMs then
# have the shapes (COLUMN_SLICE, K) and (remainder, K), which the guard checks in a fraction of the
# time the full 150k-wide matrix would take.
COLUMN_SLICE = 16384

GUARD_MODES = ("on", "off", "tiled")
FORMS = ("packed", "mm")  # the bucketed GEMMs, in the order the guard tries them


def _packed_available(dtype: torch.dtype = torch.float32) -> bool:
    try:
        w = torch.zeros(8, 8, dtype=dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        torch.ops.mkldnn._linear_pointwise(torch.zeros(2, 8, dtype=dtype), packed, None, "none", [], "")
        return True
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


FORMS_AVAILABLE = tuple(f for f in FORMS if f != "packed" or _packed_available())
_forms_by_dtype: dict[torch.dtype, tuple[str, ...]] = {}


def forms_available(dtype: torch.dtype) -> tuple[str, ...]:
    """The bucketed forms this machine runs for ``dtype``: oneDNN's packed bf16 kernel needs AVX-512 (or
    AVX-NE-CONVERT); on an AVX2-only CPU it raises, and bf16 weights use the mm form (or tiled)."""
    forms = _forms_by_dtype.get(dtype)
    if forms is None:
        forms = tuple(f for f in FORMS_AVAILABLE if f != "packed" or _packed_available(dtype))
        _forms_by_dtype[dtype] = forms
    return forms


def _operand(form: str, weight: torch.Tensor, a: int, b: int):
    """The right-hand operand of weight rows a:b in the given form (packed weights are cached)."""
    if form == "mm":
        return weight[a:b].t()
    if weight.is_inference() or not _packed_cache:
        # Pack for this call only: an inference tensor has no version counter to key a cache on, and a
        # process whose weights are refilled without a version bump turns the cache off (FSDP2 learner
        # ranks: every all-gather writes the same unsharded parameter's storage through another tensor,
        # so a cache keyed on (data_ptr, version) would hand back the previous step's weights).
        return torch.ops.mkldnn._reorder_linear_weight(weight[a:b].detach().contiguous(), None)
    # Packed copies live on the weight tensor, keyed by its storage and version counter: an in-place
    # update through the parameter (optimizer step, engine weight load) makes them stale, and they are
    # rebuilt.
    stamp = (weight.data_ptr(), weight._version)
    cache = getattr(weight, "_rz_packed", None)
    if cache is None or cache[0] != stamp:
        cache = (stamp, {})
        weight._rz_packed = cache
    packed = cache[1].get((a, b))
    if packed is None:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight[a:b].detach().contiguous(), None)
        cache[1][(a, b)] = packed
    return packed


_packed_cache = True


def set_packed_cache(enabled: bool) -> None:
    """Turn the per-weight cache of packed operands on or off for this process (see `_operand`)."""
    global _packed_cache
    _packed_cache = enabled


def _run(form: str, xs: torch.Tensor, operand) -> torch.Tensor:
    """One GEMM of the bucketed form: xs [bucket, k] against a weight slice's operand."""
    if form == "mm":
        return torch.mm(xs, operand)
    return torch.ops.mkldnn._linear_pointwise(xs, operand, None, "none", [], "")


@dataclass(frozen=True)
class GemmVerdict:
    """What the guard decided for one weight shape: a bucketed form and its buckets, or tiled."""

    form: str  # "packed", "mm" or "tiled"
    buckets: tuple[int, ...] = ()
    failed: tuple[str, ...] = ()  # what failed on the way, e.g. "packed@112"

    @property
    def tiled(self) -> bool:
        return self.form == "tiled"


_guard_mode = os.environ.get("RZ_GEMM_GUARD", "on")
_verdicts: dict[tuple, GemmVerdict] = {}
_call_cache: dict[tuple, GemmVerdict] = {}  # (shape, dtype, threads, mode) -> verdict, for aligned_linear
_fusion_verdicts: dict[tuple, bool] = {}  # (sizes, k, dtype, threads, mode) -> fusable
_verdict_lock = threading.Lock()


def set_gemm_guard(mode: str) -> None:
    """Choose how `aligned_linear` treats unverified shapes: "on" (default), "off" or "tiled".

    on: verify every weight shape before first use; failing shapes run tiled. off: trust the first
    available bucketed form from 16 rows up without checking. tiled: the tiled form everywhere.
    Engine and trainer must run with the same mode (the forms round differently).
    """
    global _guard_mode
    if mode not in GUARD_MODES:
        raise ValueError(f"gemm guard must be one of {GUARD_MODES}, got {mode!r}")
    _guard_mode = mode


def gemm_guard() -> str:
    """The current guard mode (see `set_gemm_guard`)."""
    if _guard_mode not in GUARD_MODES:
        raise ValueError(f"RZ_GEMM_GUARD must be one of {GUARD_MODES}, got {_guard_mode!r}")
    return _guard_mode


def clear_gemm_verdicts() -> None:
    """Forget every cached guard decision (tests; a changed BLAS configuration)."""
    with _verdict_lock:
        _verdicts.clear()
        _call_cache.clear()
        _fusion_verdicts.clear()


# -- the tiled form ---------------------------------------------------------------------------------
def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    m = x.shape[0]
    if rows == m:
        return x.contiguous()
    return torch.cat([x, x.new_zeros(rows - m, x.shape[1])])


def _tiled_matmul(x2: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[m, k] @ weight.T in fixed [tile, k] x [k, n] GEMMs (the batch-invariant forward)."""
    m, k = x2.shape
    n = weight.shape[0]
    if m == 0:
        return x2.new_zeros(0, n)
    tile = TILE_ROWS.get(x2.dtype, 64)
    xp = _pad_rows(x2, -(-m // tile) * tile)
    wt = weight.t()
    if x2.dtype == torch.float32:
        # the weight is broadcast over the tiles (a stride-0 view, no copy)
        out = torch.bmm(xp.view(-1, tile, k), wt.unsqueeze(0).expand(xp.shape[0] // tile, k, n))
        out = out.reshape(-1, n)
    else:
        out = torch.cat([torch.mm(xp[i : i + tile], wt) for i in range(0, xp.shape[0], tile)])
    return out[:m]


# -- the bucketed form ------------------------------------------------------------------------------
def _column_slices(n: int) -> list[tuple[int, int]]:
    if n <= COLUMN_SLICE:
        return [(0, n)]
    return [(a, min(a + COLUMN_SLICE, n)) for a in range(0, n, COLUMN_SLICE)]


def _bucket(rows: int, buckets: tuple[int, ...]) -> int:
    for b in buckets:
        if b >= rows:
            return b
    raise AssertionError(f"no bucket for {rows} rows")  # rows <= CHUNK_ROWS, the last bucket


def _bucketed_matmul(x2: torch.Tensor, weight: torch.Tensor, verdict: GemmVerdict) -> torch.Tensor:
    """[m, k] @ weight.T with every GEMM of shape [bucket, k] x [k, slice] (see module docstring)."""
    m = x2.shape[0]
    n = weight.shape[0]
    form, buckets = verdict.form, verdict.buckets
    if form == "mm":
        weight = weight.contiguous()  # the layout the guard checked (a no-op for nn.Linear weights)
    if m <= CHUNK_ROWS and n <= COLUMN_SLICE:  # one GEMM: most calls
        return _run(form, _pad_rows(x2, _bucket(m, buckets)), _operand(form, weight, 0, n))[:m]
    out = x2.new_empty(m, n)
    slices = [(a, b, _operand(form, weight, a, b)) for a, b in _column_slices(n)]
    for start in range(0, m, CHUNK_ROWS):
        rows = min(CHUNK_ROWS, m - start)
        xs = _pad_rows(x2[start : start + rows], _bucket(rows, buckets))
        for a, b, operand in slices:
            out[start : start + rows, a:b] = _run(form, xs, operand)[:rows]
    return out


class _AlignedLinear(torch.autograd.Function):
    """Forward in the aligned form; backward as two plain GEMMs.

    Autograd through the tiled bmm would build the weight gradient as one [k, n] matrix per tile
    and then sum them: for a 151,936-wide LM head and a 4,096-token micro-batch that is tens of GB
    and most of the backward's time. Gradients are not part of the bit-identity contract (only the
    forward log-probs are), so the backward uses `grad_out @ W` and `grad_out.T @ x`.
    """

    @staticmethod
    def forward(ctx, x2: torch.Tensor, weight: torch.Tensor, verdict: GemmVerdict) -> torch.Tensor:
        ctx.save_for_backward(x2, weight)
        return _forward(x2, weight, verdict)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x2, weight = ctx.saved_tensors
        grad_x = grad_out.mm(weight) if ctx.needs_input_grad[0] else None
        grad_w = grad_out.t().mm(x2) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None


def _forward(x2: torch.Tensor, weight: torch.Tensor, verdict: GemmVerdict) -> torch.Tensor:
    if x2.shape[0] == 0:
        return x2.new_zeros(0, weight.shape[0])
    if verdict.tiled:
        return _tiled_matmul(x2, weight)
    return _bucketed_matmul(x2, weight, verdict)


def _apply(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, verdict: GemmVerdict):
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if torch.is_grad_enabled() and (x2.requires_grad or weight.requires_grad):
        out = _AlignedLinear.apply(x2, weight, verdict)
    else:
        out = _forward(x2, weight, verdict)
    if bias is not None:
        out = out + bias
    if x.dim() == 2:  # (a same-shape reshape would return a view, which callers may then have to copy)
        return out
    return out.reshape(*lead, weight.shape[0])


_TILED = GemmVerdict("tiled")


def tiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T (+ bias)` computed in fixed-size row tiles (batch-invariant by construction)."""
    return _apply(x, weight, bias, _TILED)


def bucketed_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    form: str | None = None,
    small_buckets: tuple[int, ...] = (),
) -> torch.Tensor:
    """`x @ weight.T (+ bias)` in row buckets, unguarded (see module docstring; `aligned_linear` guards)."""
    buckets = tuple(sorted(set(small_buckets))) + ROW_BUCKETS
    return _apply(x, weight, bias, GemmVerdict(form or forms_available(weight.dtype)[0], buckets))


def aligned_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The aligned op set's linear: bucketed where the guard verified the shape, tiled otherwise."""
    # one dict lookup per call on the hot path (decode runs hundreds of small linears per step)
    key = (weight.shape, weight.dtype, torch.get_num_threads(), _guard_mode)
    verdict = _call_cache.get(key)
    if verdict is None:
        verdict = gemm_verdict(weight.shape[0], weight.shape[1], weight.dtype)
        _call_cache[key] = verdict
    return _apply(x, weight, bias, verdict)


def standard_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Stock `F.linear` (not batch-invariant; the negative control)."""
    return F.linear(x, weight, bias)


# -- the guard --------------------------------------------------------------------------------------
def gemm_verdict(n: int, k: int, dtype: torch.dtype) -> GemmVerdict:
    """The form `aligned_linear` uses for an [n, k] weight now (verifying the shape on first use)."""
    mode = gemm_guard()
    if mode == "tiled":
        return _TILED
    if mode == "off":
        return GemmVerdict(forms_available(dtype)[0], ROW_BUCKETS)
    return verify_shape(n, k, dtype)


def verify_shape(n: int, k: int, dtype: torch.dtype) -> GemmVerdict:
    """Check (once per process and thread count) that an [n, k] weight gives bucket-invariant rows."""
    key = (n, k, dtype, torch.get_num_threads())
    verdict = _verdicts.get(key)
    if verdict is not None:
        return verdict
    with _verdict_lock:
        verdict = _verdicts.get(key)
        if verdict is None:
            with torch.inference_mode(False), torch.no_grad():  # first use may be inside the engine's step
                verdict = _choose(n, k, dtype)
            _verdicts[key] = verdict
            if verdict.tiled:
                log.warning(
                    "aligned GEMM guard: weight [%d, %d] %s at %d threads: rows differ between buckets "
                    "(%s); this shape uses the tiled path",
                    n,
                    k,
                    dtype,
                    key[3],
                    ", ".join(verdict.failed),
                )
            else:
                log.info(
                    "aligned GEMM guard: weight [%d, %d] %s at %d threads: %s form verified at %d row "
                    "buckets (smallest %d)%s",
                    n,
                    k,
                    dtype,
                    key[3],
                    verdict.form,
                    len(verdict.buckets),
                    verdict.buckets[0],
                    f"; failed before: {', '.join(verdict.failed)}" if verdict.failed else "",
                )
    return verdict


def _choose(n: int, k: int, dtype: torch.dtype) -> GemmVerdict:
    failed: list[str] = []
    for form in forms_available(dtype):
        bad, small = _check(form, n, k, dtype)
        if not bad:
            return GemmVerdict(form, small + ROW_BUCKETS, tuple(failed))
        failed.append(f"{form}@{','.join(map(str, bad))}")
    return GemmVerdict("tiled", (), tuple(failed))


def _check(form: str, n: int, k: int, dtype: torch.dtype) -> tuple[list[int], tuple[int, ...]]:
    """Run every GEMM shape of an [n, k] weight at every bucket; compare each row with the 16-row call.

    The probe is 16 random rows, repeated to fill a bucket, so every row position of every bucket is
    compared with the same row computed in a 16-row call (a GEMM's reduction order does not depend on
    the values, only on the shapes and positions). Small buckets compare their rows with the first
    rows of the 16-row call. Returns (failing ladder buckets, passing small buckets).
    """
    gen = torch.Generator().manual_seed(n * 1_000_003 + k)
    failed: list[int] = []
    small_ok = set(SMALL_BUCKETS)
    for width in sorted({b - a for a, b in _column_slices(n)}):  # each distinct slice width once
        w = torch.randn(width, k, generator=gen).to(dtype)
        operand = _operand(form, w, 0, width)
        probe = torch.randn(16, k, generator=gen).to(dtype)
        ref = _run(form, probe, operand)
        for rows in ROW_BUCKETS:
            reps = -(-rows // 16)
            got = _run(form, probe.repeat(reps, 1)[:rows].contiguous(), operand)
            if not torch.equal(got, ref.repeat(reps, 1)[:rows]):
                failed.append(rows)
        for rows in SMALL_BUCKETS:
            if not torch.equal(_run(form, probe[:rows].contiguous(), operand), ref[:rows]):
                small_ok.discard(rows)
    return sorted(set(failed)), tuple(sorted(small_ok))


def fusion_verified(sizes: tuple[int, ...], k: int, dtype: torch.dtype) -> bool:
    """Whether `aligned_linear` over weights of `sizes` rows stacked into one [sum(sizes), k] weight gives
    each part's columns bit for bit (checked once per process, thread count and guard mode; "off" trusts it).
    """
    mode = gemm_guard()
    key = (tuple(sizes), k, dtype, torch.get_num_threads(), mode)
    ok = _fusion_verdicts.get(key)
    if ok is None:
        ok = True if mode == "off" else _check_fusion(tuple(sizes), k, dtype)
        _fusion_verdicts[key] = ok
        if not ok:
            log.warning(
                "aligned GEMM guard: weights %s x %d %s at %d threads: the stacked GEMM's columns differ "
                "from the parts'; these projections stay separate GEMMs",
                list(sizes),
                k,
                dtype,
                key[3],
            )
    return ok


def _check_fusion(sizes: tuple[int, ...], k: int, dtype: torch.dtype) -> bool:
    stacked = gemm_verdict(sum(sizes), k, dtype)
    parts = [gemm_verdict(n, k, dtype) for n in sizes]
    if any(v.form != stacked.form for v in parts):
        return False  # the forms round differently
    gen = torch.Generator().manual_seed(sum(sizes) * 1_000_003 + k)
    with torch.inference_mode(False), torch.no_grad():
        ws = [torch.randn(n, k, generator=gen).to(dtype) for n in sizes]
        probe = torch.randn(16, k, generator=gen).to(dtype)
        whole = _forward(probe, torch.cat(ws), stacked)
        return torch.equal(
            whole, torch.cat([_forward(probe, w, v) for w, v in zip(ws, parts, strict=True)], 1)
        )


def verify_weights(weights, log_summary: bool = True) -> dict[tuple[int, int], GemmVerdict]:
    """Run the guard now for every weight in `weights` (2-D tensors); returns {(n, k): verdict}.

    Called at engine and learner start so that the check's cost (a few GEMMs per bucket) is paid
    up front and the decisions are logged before any token is computed. Does nothing unless the
    guard is on.
    """
    out: dict[tuple[int, int], GemmVerdict] = {}
    if gemm_guard() != "on":
        return out
    for w in weights:
        shape = (int(w.shape[0]), int(w.shape[1]))
        if shape not in out:
            out[shape] = verify_shape(*shape, w.dtype)
    if log_summary and out:
        tiled = sorted(s for s, v in out.items() if v.tiled)
        log.info(
            "aligned GEMM guard: %d weight shapes, %d bucketed, %d tiled%s",
            len(out),
            len(out) - len(tiled),
            len(tiled),
            f" {tiled}" if tiled else "",
        )
    return out
