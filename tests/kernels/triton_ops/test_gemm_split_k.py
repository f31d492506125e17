"""Split-K GEMM: the split count a function of K and N only, partials summed in fixed order, so a row's
result is the same alone or in any batch; close to torch.matmul; a stack fuses only when it splits alike."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from rz_kernels.triton_ops import gemm  # noqa: E402

ROWS = (1, 7, 16, 24, 64, 130)


@pytest.fixture
def small_splits(monkeypatch):
    # Interpreter-sized shapes: one K block per split is enough to split a 3-block K three ways.
    monkeypatch.setattr(gemm, "MIN_K_BLOCKS_PER_SPLIT", 1)


def _k(dtype, blocks: int) -> int:
    return gemm.GEMM_CONFIG[dtype].block_k * blocks - 5  # a partial last block: the mask path too


def test_split_count_depends_on_k_and_n_only_and_fills_the_sms_for_qwen3_4b_decode():
    cfg = gemm.GEMM_CONFIG[torch.bfloat16]
    # o_proj [2560, 4096] and down_proj [2560, 9728]: 20 column tiles alone; split-K makes it 120 programs
    for k in (4096, 9728):
        s, per = gemm.split_count(k, 2560, cfg)
        assert s * 20 >= 100 and s * 20 <= gemm.SPLIT_TARGET_PROGRAMS, (k, s)
        assert (s - 1) * per < -(-k // cfg.block_k) <= s * per  # no empty split
    assert gemm.split_count(2560, 151936, cfg) == (1, 40)  # the LM head fills the SMs by columns


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_k_row_alone_equals_the_row_in_batches_of_1_to_130(dtype, small_splits):
    gen = torch.Generator().manual_seed(11)
    k = _k(dtype, 3)
    w = torch.randn(40, k, generator=gen).to(dtype)
    x = torch.randn(max(ROWS), k, generator=gen).to(dtype)
    assert gemm.split_count(k, 40, gemm.GEMM_CONFIG[dtype])[0] == 3
    probes = (0, 6, 15, 23, 63, 129)
    alone = {i: gemm.matmul(x[i : i + 1], w)[0] for i in probes}
    for m in ROWS:
        out = gemm.matmul(x[:m], w)
        for i in probes:
            if i < m:
                assert torch.equal(out[i], alone[i]), (m, i)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), F.linear(x.float(), w.float()), rtol=tol, atol=tol)


def test_split_k_changes_the_sum_so_a_split_count_varying_with_m_would_break_invariance(small_splits):
    # Negative control: the same rows with S = 3 and S = 1 differ in some bits, which is why S may not
    # depend on M (the test above would catch it).
    gen = torch.Generator().manual_seed(12)
    k = _k(torch.float32, 3)
    w = torch.randn(40, k, generator=gen)
    x = torch.randn(24, k, generator=gen) * 100
    split = gemm.matmul(x, w)
    unsplit = gemm.matmul(x, w, table=gemm.GEMM_CONFIGS_BY_M)  # the measurement mode runs unsplit
    assert not torch.equal(split, unsplit)
    torch.testing.assert_close(split, unsplit, rtol=1e-5, atol=1e-3)


def test_split_k_row_chunks_give_the_same_bits(small_splits, monkeypatch):
    gen = torch.Generator().manual_seed(13)
    k = _k(torch.bfloat16, 3)
    w = torch.randn(40, k, generator=gen).to(torch.bfloat16)
    x = torch.randn(20, k, generator=gen).to(torch.bfloat16)
    whole = gemm.matmul(x, w)
    monkeypatch.setattr(gemm, "SPLIT_ROWS", 7)
    assert torch.equal(gemm.matmul(x, w), whole)


def test_a_stack_is_fusable_only_when_it_splits_as_its_parts(small_splits):
    gen = torch.Generator().manual_seed(14)
    dtype = torch.float32
    k = _k(dtype, 3)
    # parts of 1 column tile each and their 3-tile stack split alike only if the SM target allows it
    sizes = (64, 64, 64)
    assert not gemm.fusion_keeps_bits(sizes, k, dtype) or len({gemm.split_count(k, n, gemm.GEMM_CONFIG[dtype])
                                                               for n in (*sizes, sum(sizes))}) == 1  # fmt: skip
    parts = [torch.randn(n, k, generator=gen) for n in (48, 24, 24)]
    x = torch.randn(9, k, generator=gen)
    cfg = gemm.GEMM_CONFIG[dtype]
    same = len({gemm.split_count(k, n, cfg) for n in (48, 24, 24, 96)}) == 1
    assert gemm.fusion_keeps_bits((48, 24, 24), k, dtype) == same
    whole = gemm.matmul(x, torch.cat(parts))
    assert torch.equal(whole, torch.cat([gemm.matmul(x, p) for p in parts], 1)) or not same
    # Qwen3-4B at full size: q/k/v split differently (not fused), gate/up alike (fused)
    assert not gemm.fusion_keeps_bits((4096, 1024, 1024), 2560, torch.bfloat16)
    assert gemm.fusion_keeps_bits((9728, 9728), 2560, torch.bfloat16)


def test_engine_cached_inference_equals_the_training_forward_with_split_k_in_every_gemm(small_splits, monkeypatch):
    # The model through the Triton op set with K split in its GEMMs (tiny shapes: 2-3 K blocks per GEMM);
    # the engine's paths (prefill, chunked, decode) and the trainer's forward agree bit for bit.
    from rz_agents.model import ModelConfig, Transformer
    from rz_agents.model.alignment import check_model

    splits = []
    real = gemm._split_launch

    def spy(x, weight, out, cfg, stages, s, per):
        splits.append(s)
        return real(x, weight, out, cfg, stages, s, per)

    monkeypatch.setattr(gemm, "_split_launch", spy)
    cfg = ModelConfig.tiny("qwen3", dtype="float32", vocab_size=120, hidden_size=64, intermediate_size=96,
                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    model = Transformer(cfg, kernels="triton")
    model.reset_parameters(std=0.1, seed=0)
    report = check_model(model, seed=0, batch_sizes=(2,), max_len=8)
    assert splits and max(splits) >= 2
    assert report.tokens_checked > 10
    assert report.bit_identical, report.failures
