"""The compile check's cost model and identity table on hand-made launch records (no compiler needed)."""

from rz_kernels.compile_check import cost_model
from rz_kernels.compile_check.identity import identity_table
from rz_kernels.compile_check.recorder import Launch


def _gemm(m: int, n: int, k: int, programs: int, side: str = "engine", split: bool = False) -> Launch:
    args = {"M": m, "N": n, "K": k, "a_ptr": {"shape": [m, k], "dtype": "bfloat16"},
            "b_ptr": {"shape": [n, k], "dtype": "bfloat16"},
            "c_ptr": {"shape": [m, n], "dtype": "bfloat16"}}  # fmt: skip
    return Launch("rz_kernels.triton_ops.gemm._matmul_kernel", {"M": "i32"}, {"SPLIT": split}, {}, 4, 4,
                  (programs, 1, 1), "src", {"side": side, "model": "m"}, args)  # fmt: skip


def test_a_memory_bound_gemm_costs_its_bytes_over_hbm_and_idle_sms_slow_it_down():
    full = cost_model.launch_cost(_gemm(48, 2560, 4096, 132))
    weight = 2560 * 4096 * 2
    assert full.bytes > weight and full.flops == 2.0 * 48 * 2560 * 4096
    assert abs(full.seconds - (full.bytes / cost_model.HBM_BYTES_PER_S + cost_model.LAUNCH_S)) < 1e-12
    twenty = cost_model.launch_cost(_gemm(48, 2560, 4096, 20))  # the unsplit grid: 20 of 132 SMs
    assert (
        abs((twenty.seconds - cost_model.LAUNCH_S) / (full.seconds - cost_model.LAUNCH_S) - 132 / 20) < 1e-9
    )


def test_decode_roofline_of_qwen3_4b_at_b48_2k_is_weights_plus_kv():
    fields = dict(hidden_size=2560, num_hidden_layers=36, head_dim=128, num_attention_heads=32,
                  num_key_value_heads=8, intermediate_size=9728, vocab_size=151936)  # fmt: skip
    gb = cost_model.decode_roofline_bytes(fields, 48, 2048) / 1e9
    assert 22.0 < gb < 23.0  # ~8.0 GB of bf16 weights + 48 x 2049 positions x 147 KB of K/V


def test_identity_verdicts_identical_different_with_reason_and_the_backward_left_out():
    eng, trn = _gemm(1, 64, 64, 1, "engine"), _gemm(512, 64, 64, 8, "trainer")
    bwd = _gemm(512, 64, 64, 8, "trainer")
    bwd.constexprs = {"SPLIT": True}
    bwd.tags = {**bwd.tags, "in_backward": True}
    same = {
        (eng.key(), 90): {"ok": True, "cubin_sha256": "a"},
        (bwd.key(), 90): {"ok": True, "cubin_sha256": "b"},
    }
    (row,) = identity_table([eng, trn, bwd], same, 90)
    assert eng.key() == trn.key() and row["verdict"] == "identical"
    other = _gemm(512, 64, 64, 8, "trainer", split=True)  # a trainer-only variant: a different binary
    results = {**same, (other.key(), 90): {"ok": True, "cubin_sha256": "c"}}
    (row,) = identity_table([eng, other], results, 90)
    assert row["verdict"] == "different"
    assert row["differences"][0]["difference"]["constexprs"] == {"SPLIT": [False, True]}
    assert row["why_the_bits_agree"].endswith("a defect.")  # the script fails on this
