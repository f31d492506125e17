"""DeepSeek-V4 through the policy contract: build_policy makes it (family deepseek_v4, a tiny random model or
a checkpoint), and the learner trains it on packed sequences with lag-0 tokens bit-identical to the sampler's
log-probs (sampled here through the model's standalone cached path: the engine's caches are not built
yet), and a tiny run learns."""

import pytest
import torch

from rz_agents.model.checkpoint import save_hf_checkpoint
from rz_agents.model.deepseek_v4_attention import SequenceState
from rz_agents.model.logprobs import sampling_logprobs
from rz_agents.model.policy import PolicySpec, build_policy
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.optim import OptimConfig
from rz_agents.trajectory import Trajectory

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 64
SMALL = {"hidden_size": 32, "moe_intermediate_size": 16, "head_dim": 16, "q_lora_rank": 16, "hc_mult": 2,
         "num_attention_heads": 2, "index_head_dim": 16, "qk_rope_head_dim": 8, "o_lora_rank": 8,
         "csa_rate": 4, "hca_rate": 8, "sliding_window": 8, "index_topk": 2}  # fmt: skip


def _policy(dtype="float32"):
    return build_policy(
        PolicySpec(model_type="deepseek_v4", vocab_size=VOCAB, dtype=dtype, tiny_overrides=SMALL)
    )


@torch.no_grad()
def _sample(model, prompt, n_new, seed, group_id, version):
    """Sample n_new tokens through the standalone cached path (prefill, then one-token decodes on a
    SequenceState); reward: the share of even tokens."""
    gen = torch.Generator().manual_seed(seed)
    tokens, blp, vers = list(prompt), [0.0] * len(prompt), [-1] * len(prompt)
    state = SequenceState()
    new = tokens
    for _ in range(n_new):
        n = len(new)
        positions = torch.arange(state.position, state.position + n)
        hidden = model(torch.tensor(new), positions, torch.zeros(n, dtype=torch.long), states=[state])
        lp = sampling_logprobs(model.logits(hidden[-1:]), 1.0, 0, 1.0)[0]
        tok = int(torch.multinomial(lp.exp(), 1, generator=gen))
        tokens.append(tok)
        blp.append(float(lp[tok]))
        vers.append(version)
        new = [tok]
    reward = sum(t % 2 == 0 for t in tokens[len(prompt) :]) / n_new
    return Trajectory(tokens, [False] * len(prompt) + [True] * n_new, blp, vers, reward, group_id)


def _batch(model, seed=0, version=0):
    # prompts long enough that the sampled tokens see compressed entries of both rates and the indexer chooses
    return [
        _sample(model, [1 + g, 5, 7] + list(range(10, 22)), 6, seed * 100 + g * 10 + j, g, version)
        for g in range(2)
        for j in range(3)
    ]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_learner_trains_deepseek_v4_with_lag0_tokens_bit_identical(dtype):
    model = _policy(dtype)
    assert model.config.layer_types[1:3] == ("compressed_sparse_attention", "heavily_compressed_attention")
    learner = Learner(
        model, LearnerConfig(optim=OptimConfig(lr=1e-2, max_grad_norm=1.0), assert_lag0_exact=True)
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = learner.step(_batch(model))
    assert metrics["lag0_abs_dlogp_max"] == 0.0 and metrics["step_skipped_nonfinite"] == 0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    # the next version's samples are again exact under the learner (the update reached every weight it uses)
    assert learner.step(_batch(model, seed=1, version=1))["lag0_abs_dlogp_max"] == 0.0


@pytest.mark.slow
def test_a_tiny_deepseek_v4_run_learns_with_lag0_tokens_exact():
    """Rewarding even tokens: 12 steps raise the batch's mean reward (measured 0.48 -> 0.88 over the first and
    last three steps), every step's lag-0 tokens exact."""
    model = _policy()
    learner = Learner(
        model, LearnerConfig(optim=OptimConfig(lr=3e-2, max_grad_norm=1.0), assert_lag0_exact=True)
    )
    rewards = []
    for step in range(12):
        batch = _batch(model, seed=step, version=learner.version)
        rewards.append(sum(t.reward for t in batch) / len(batch))
        assert learner.step(batch)["lag0_abs_dlogp_max"] == 0.0
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2


def test_build_policy_loads_a_deepseek_v4_checkpoint(tmp_path):
    model = _policy()
    save_hf_checkpoint(model, tmp_path / "ckpt")
    loaded = build_policy(PolicySpec(checkpoint=tmp_path / "ckpt"))
    mine, theirs = model.state_dict(), loaded.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    skeleton = build_policy(PolicySpec(checkpoint=tmp_path / "ckpt"), device="meta")
    assert next(skeleton.parameters()).is_meta
    with pytest.raises(ValueError, match="no LoRA adapters"):
        from rz_agents.model.lora import LoraConfig

        build_policy(PolicySpec(checkpoint=tmp_path / "ckpt", lora=LoraConfig(rank=4)))
