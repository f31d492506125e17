"""The aligned linear: row buckets, the start-up guard and its fallback to the tiled form."""

import logging

import pytest
import torch

from rz_kernels import gemm


@pytest.fixture(autouse=True)
def _fresh_verdicts():
    gemm.clear_gemm_verdicts()
    before = gemm.gemm_guard()
    yield
    gemm.set_gemm_guard(before)
    gemm.clear_gemm_verdicts()


ROW_COUNTS = (1, 2, 3, 4, 5, 8, 9, 15, 16, 17, 63, 64, 65, 100, 511, 512, 513, 1100)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["on", "off"])
def test_aligned_linear_row_independent_of_row_count_and_position(dtype, mode):
    gemm.set_gemm_guard(mode)
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 80, generator=gen).to(dtype)
    x = torch.randn(1100, 80, generator=gen).to(dtype)
    alone = torch.cat([gemm.aligned_linear(x[i : i + 1], w) for i in (0, 1, 700)])
    for m in ROW_COUNTS:
        out = gemm.aligned_linear(x[:m], w)
        assert torch.equal(out[0], alone[0]), m
        if m > 700:  # a row in a later chunk and at another position in its bucket
            assert torch.equal(out[700], alone[2]), m
    # a bucket shifted by one row: each row still gets its own bits
    assert torch.equal(gemm.aligned_linear(x[1:18], w)[0], alone[1])
    torch.testing.assert_close(gemm.aligned_linear(x, w), x @ w.t(), rtol=2e-2, atol=2e-2)


def test_wide_weights_are_cut_in_column_slices_with_the_same_rows():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(gemm.COLUMN_SLICE + 300, 32, generator=gen)  # two slice widths, like an LM head
    x = torch.randn(40, 32, generator=gen)
    out = gemm.aligned_linear(x, w)
    assert out.shape == (40, w.shape[0])
    assert torch.equal(out[3], gemm.aligned_linear(x[3:4], w)[0])
    torch.testing.assert_close(out, x @ w.t(), rtol=1e-4, atol=1e-4)


def _rows_sensitive(threshold: int, below: bool = False):
    """A stand-in GEMM whose rounding changes from `threshold` rows on (or below it): what the guard
    must catch, in every bucketed form."""
    real = gemm._run

    def run(form, xs, operand):
        out = real(form, xs, operand)
        hit = xs.shape[0] < threshold if below else xs.shape[0] >= threshold
        return out * (1 + 2**-20) if hit else out

    return run


def test_guard_falls_back_to_tiled_for_a_shape_that_fails_and_logs_it(monkeypatch, caplog):
    monkeypatch.setattr(gemm, "_run", _rows_sensitive(100))
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(48, 40, generator=gen)
    x = torch.randn(300, 40, generator=gen)
    with caplog.at_level(logging.WARNING, logger="rz_kernels.gemm"):
        verdict = gemm.verify_shape(48, 40, torch.float32)
    assert verdict.tiled  # every form failed, first at the first bucket >= 100 rows
    assert [f.split("@")[1].split(",")[0] for f in verdict.failed] == ["112"] * len(gemm.FORMS_AVAILABLE)
    assert "[48, 40]" in caplog.text and "tiled" in caplog.text
    out = gemm.aligned_linear(x, w)
    assert torch.equal(out, gemm.tiled_linear(x, w))  # every row computed by the tiled form
    assert torch.equal(gemm.aligned_linear(x[:1], w)[0], out[0])
    # Negative control: without the guard, the same stand-in BLAS breaks row invariance.
    gemm.set_gemm_guard("off")
    unguarded = gemm.aligned_linear(x, w)
    assert not torch.equal(unguarded[0], gemm.aligned_linear(x[:1], w)[0])


def test_guard_uses_small_buckets_only_where_they_pass(monkeypatch):
    monkeypatch.setattr(gemm, "_run", _rows_sensitive(4, below=True))  # like MKL's 1-3 row paths
    verdict = gemm.verify_shape(24, 16, torch.float32)
    assert verdict.form == gemm.FORMS_AVAILABLE[0]
    assert verdict.buckets[:2] == (4, 8) and 1 not in verdict.buckets and 2 not in verdict.buckets
    gen = torch.Generator().manual_seed(3)
    w, x = torch.randn(24, 16, generator=gen), torch.randn(20, 16, generator=gen)
    assert torch.equal(gemm.aligned_linear(x[:1], w)[0], gemm.aligned_linear(x, w)[0])


def test_verify_weights_reports_each_shape_once_and_nothing_when_the_guard_is_off():
    ws = [torch.zeros(16, 8), torch.zeros(16, 8), torch.zeros(8, 16)]
    assert set(gemm.verify_weights(ws)) == {(16, 8), (8, 16)}
    gemm.set_gemm_guard("off")
    assert gemm.verify_weights(ws) == {}
    with pytest.raises(ValueError, match="gemm guard"):
        gemm.set_gemm_guard("sometimes")


@pytest.mark.parametrize("form", ["packed", "mm"])
def test_each_bucketed_form_passes_the_guard_on_this_machine(form):
    if form not in gemm.FORMS_AVAILABLE:
        pytest.skip(f"{form} form unavailable here")
    bad, small = gemm._check(form, 1000, 64, torch.float32)
    assert bad == [] and 4 in small


def test_packed_weights_are_rebuilt_after_an_in_place_update():
    if "packed" not in gemm.FORMS_AVAILABLE:
        pytest.skip("no oneDNN")
    gen = torch.Generator().manual_seed(6)
    w, x = torch.randn(32, 16, generator=gen), torch.randn(5, 16, generator=gen)
    before = gemm.bucketed_linear(x, w, form="packed")
    with torch.no_grad():
        w.mul_(2)  # what an optimizer step or an engine weight load does
    torch.testing.assert_close(gemm.bucketed_linear(x, w, form="packed"), 2 * before)


def test_first_use_inside_inference_mode_runs_the_guard_and_packs_inference_weights():
    gen = torch.Generator().manual_seed(7)
    w, x = torch.randn(24, 16, generator=gen), torch.randn(3, 16, generator=gen)
    with torch.inference_mode():
        got = gemm.aligned_linear(x, w)  # the guard runs here, inside the engine's inference mode
        w_inf = w.clone()  # an inference tensor (no version counter)
        assert torch.equal(gemm.aligned_linear(x, w_inf), got)
    assert torch.equal(gemm.aligned_linear(x, w), got)


def test_tiled_mode_reproduces_the_tiled_form_exactly():
    gemm.set_gemm_guard("tiled")
    gen = torch.Generator().manual_seed(4)
    w, x = torch.randn(32, 24, generator=gen), torch.randn(70, 24, generator=gen)
    assert torch.equal(gemm.aligned_linear(x, w), gemm.tiled_linear(x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_aligned_linear_gradients_match_f_linear(dtype):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(150, 48, generator=gen).to(dtype)
    w = torch.randn(40, 48, generator=gen).to(dtype)
    with torch.no_grad():
        ref = gemm.aligned_linear(x, w)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = gemm.aligned_linear(xg, wg)
    assert torch.equal(out.detach(), ref)  # the autograd path computes the same (aligned) forward
    g = torch.randn(out.shape, generator=gen).to(dtype)
    out.backward(g)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    torch.nn.functional.linear(xs, ws).backward(g)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(xg.grad, xs.grad, rtol=tol, atol=tol)
    torch.testing.assert_close(wg.grad, ws.grad, rtol=tol, atol=tol * 10)


@pytest.mark.skipif("packed" not in gemm.FORMS_AVAILABLE, reason="no oneDNN packed linear in this build")
def test_packed_form_never_uses_stale_weights_refilled_without_a_version_bump():
    # FSDP2 all-gathers each step into the same unsharded parameter, writing its storage through another
    # tensor: the parameter's (data_ptr, version) stays the same while its values change. A process
    # sharded with FSDP2 turns the packed cache off (ShardedRanks.shard); elsewhere an in-place load
    # through the parameter (copy_, a version bump) invalidates the cached copy.
    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(64, 48, generator=gen))
    x = torch.randn(8, 48, generator=gen)
    new = torch.randn(64, 48, generator=gen)
    reference = gemm.bucketed_linear(x, new.clone(), form="packed")

    def refill_without_version_bump():
        alias = torch.empty(0).set_(w.untyped_storage(), 0, w.shape, w.stride())  # own version counter
        version = w._version
        alias.copy_(new)
        assert w._version == version and torch.equal(w, new)

    with torch.no_grad():
        old = gemm.bucketed_linear(x, w, form="packed")
        refill_without_version_bump()
        # the negative control: with the cache on, the stale packed copy is what the GEMM uses
        assert torch.equal(gemm.bucketed_linear(x, w, form="packed"), old)
        w.copy_(torch.randn(64, 48, generator=gen))
        gemm.bucketed_linear(x, w, form="packed")
        gemm.set_packed_cache(False)
        try:
            refill_without_version_bump()
            assert torch.equal(gemm.bucketed_linear(x, w, form="packed"), reference)
        finally:
            gemm.set_packed_cache(True)
    engine_w = torch.randn(64, 48, generator=gen)
    with torch.inference_mode():
        gemm.bucketed_linear(x, engine_w, form="packed")
        engine_w.copy_(new)  # the engine's weight load
        assert torch.equal(gemm.bucketed_linear(x, engine_w, form="packed"), reference)


def test_bf16_uses_only_forms_this_cpu_runs():
    # oneDNN's packed bf16 linear needs AVX-512 or AVX-NE-CONVERT: on an AVX2-only CPU it raises, and the
    # guard must then choose among the forms that run (mm, else tiled) instead of failing the first GEMM
    forms = gemm.forms_available(torch.bfloat16)
    assert set(forms) <= set(gemm.FORMS_AVAILABLE) and "mm" in forms
    assert ("packed" in forms) == gemm._packed_available(torch.bfloat16)
    gen = torch.Generator().manual_seed(8)
    w = torch.randn(40, 32, generator=gen).to(torch.bfloat16)
    x = torch.randn(30, 32, generator=gen).to(torch.bfloat16)
    out = gemm.aligned_linear(x, w)
    assert torch.equal(gemm.aligned_linear(x[:3], w), out[:3])
    gemm.set_gemm_guard("off")
    assert torch.equal(gemm.aligned_linear(x[:20], w), gemm.aligned_linear(x, w)[:20])
