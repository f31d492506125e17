"""Kimi Linear through the policy contract: ``build_policy`` makes the family from ``model_type: kimi_linear``
or a checkpoint, the learner's packed forward starts each packed sequence's KDA state afresh, a learner step
on engine-sampled trajectories sees lag-0 |dlogp| 0.0 (fp32 and bf16), and ``rz align-check --arch
kimi_linear`` passes with its standard op set differing."""

from __future__ import annotations

import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams, generate_batch
from rz_agents.model.checkpoint import save_hf_checkpoint
from rz_agents.model.kimi_linear import KimiLinearForCausalLM
from rz_agents.model.logprobs import packed_token_logprobs
from rz_agents.model.lora import LoraConfig
from rz_agents.model.policy import PolicySpec, build_policy
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.optim import OptimConfig
from rz_agents.trajectory import Trajectory

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB = 64


def _policy(**kw) -> KimiLinearForCausalLM:
    model = build_policy(PolicySpec(model_type="kimi_linear", vocab_size=VOCAB, **kw))
    model.reset_parameters(std=0.3, seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(3)  # sharp logits
        for name, p in model.named_parameters():
            if name.endswith("A_log"):  # slow decay: the state carries across chunks
                p.fill_(-3.0)
    return model


def test_build_policy_makes_the_family_from_model_type_and_from_a_checkpoint(tmp_path):
    model = _policy(dtype="bfloat16")
    assert isinstance(model, KimiLinearForCausalLM) and model.lm_head.weight.dtype == torch.bfloat16
    assert model.config.layer_types.count("linear_attention") == 3
    save_hf_checkpoint(model, tmp_path / "ckpt")
    again = build_policy(PolicySpec(checkpoint=str(tmp_path / "ckpt")))
    assert isinstance(again, KimiLinearForCausalLM) and again.config == model.config
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    skeleton = build_policy(PolicySpec(checkpoint=str(tmp_path / "ckpt")), "meta")
    assert skeleton.lm_head.weight.is_meta and skeleton.lm_head.weight.dtype == torch.bfloat16


def test_lora_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="LoRA adapters are not supported for kimi_linear"):
        build_policy(PolicySpec(model_type="kimi_linear", vocab_size=VOCAB, lora=LoraConfig(rank=4)))


def test_the_packed_forward_starts_each_sequence_state_afresh():
    model = _policy()
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randint(0, VOCAB, (n,), generator=gen) for n in (100, 70))
    with torch.no_grad():
        packed = packed_token_logprobs(model, [a, b])
        alone = [packed_token_logprobs(model, [s])[0] for s in (a, b)]
        joined = packed_token_logprobs(model, [torch.cat([a, b])])[0]
    assert torch.equal(packed[0], alone[0]) and torch.equal(packed[1], alone[1])
    # control: run as one sequence, b's tokens see a's state (and keys): other values
    assert (joined[100:] - alone[1]).abs().max() > 0.1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_learner_step_on_engine_samples_has_lag0_dlogp_zero_and_updates_weights(dtype):
    model = _policy(dtype=dtype)
    engine_model = _policy(dtype=dtype)
    engine = RZEngine(engine_model, EngineConfig(max_len=160, max_batch_tokens=40, num_threads=1))
    prompts = [[1 + g, 5, 7] * (10 + 20 * g) for g in range(2)]  # 30 and 90 tokens
    params = [SamplingParams(temperature=1.0, max_tokens=10, seed=i) for i in range(8)]
    outs = generate_batch(engine, [prompts[i // 4] for i in range(8)], params)
    trajs = []
    for i, out in enumerate(outs):
        p = prompts[i // 4]
        reward = float(sum(t % 2 == 0 for t in out.tokens))
        trajs.append(Trajectory(p + out.tokens, [False] * len(p) + [True] * len(out.tokens),
                                [0.0] * len(p) + out.logprobs.tolist(), [-1] * len(p) + out.versions,
                                reward, i // 4))  # fmt: skip
    learner = Learner(
        model, LearnerConfig(optim=OptimConfig(lr=1e-2, max_grad_norm=1.0), assert_lag0_exact=True)
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    m = learner.step(trajs)
    assert m["lag0_abs_dlogp_max"] == 0.0 and m["lag0_abs_dlogp_mean"] == 0.0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    for name in ("model.layers.0.self_attn.f_b_proj.weight", "model.layers.1.self_attn.q_conv1d.weight"):
        assert not torch.equal(before[name], model.state_dict()[name]), name  # gradients reached KDA


def test_align_check_accepts_kimi_linear_and_its_standard_op_set_differs():
    import argparse

    from rz_agents.cli.align_check import add_parser
    from rz_agents.model.alignment import check_random_models

    sub = argparse.ArgumentParser().add_subparsers()
    add_parser(sub)
    assert sub.choices["align-check"].parse_args(["--arch", "kimi_linear"]).arch == ["kimi_linear"]
    aligned, standard = check_random_models(
        archs=("kimi_linear",), dtypes=("float32",), batch_sizes=(1, 3), max_len=140, threads=1
    )
    assert aligned.kernels == "aligned" and aligned.bit_identical and aligned.tokens_checked > 500
    assert standard.kernels == "standard" and standard.mismatched_tokens > 0
