"""The learner step on a real tiny model: lag-0 exactness, the non-finite guard, lag bound, micro-batches,
bitwise resume from a checkpoint."""

import math

import pytest
import torch

from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.kv_cache import sequence_cache
from rz_agents.model.logprobs import sampling_logprobs
from rz_agents.trainer.checkpoint import load_checkpoint, save_checkpoint
from rz_agents.trainer.learner import Learner, LearnerConfig, micro_batches
from rz_agents.trainer.loss import LossConfig
from rz_agents.trainer.metrics import Lag0MismatchError
from rz_agents.trainer.optim import OptimConfig
from rz_agents.trajectory import Trajectory


def _model(seed: int = 0, kernels: str = "aligned") -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig.tiny("qwen3", vocab_size=64), kernels=kernels)


@torch.no_grad()
def _sample(model, prompt, n_new, version, seed, group_id, reward=None):
    """Sample through the KV-cache path (prefill + one-token decodes), recording the sampling logprobs."""
    cache = sequence_cache(model.config, 1, len(prompt) + n_new + 1)
    gen = torch.Generator().manual_seed(seed)
    tokens = list(prompt)
    hidden = model(
        torch.tensor(tokens), torch.arange(len(tokens)), torch.zeros(len(tokens), dtype=torch.long), cache
    )
    last = hidden[-1:]
    blp, vers = [0.0] * len(prompt), [-1] * len(prompt)
    for _ in range(n_new):
        lp = sampling_logprobs(model.logits(last), 1.0, 0, 1.0)[0]
        tok = int(torch.multinomial(lp.exp(), 1, generator=gen))
        tokens.append(tok)
        blp.append(float(lp[tok]))
        vers.append(version)
        pos = len(tokens) - 1
        last = model(torch.tensor([tok]), torch.tensor([pos]), torch.zeros(1, dtype=torch.long), cache)
    if reward is None:
        reward = float(sum(1 for t in tokens[len(prompt) :] if t % 2 == 0))  # even tokens are "good"
    mask = [False] * len(prompt) + [True] * n_new
    return Trajectory(tokens, mask, blp, vers, reward, group_id)


def _batch(model, version=0, groups=2, g=4, n_new=6, seed=0):
    out = []
    for gi in range(groups):
        prompt = [1 + gi, 5, 7]
        for j in range(g):
            out.append(_sample(model, prompt, n_new, version, seed * 1000 + gi * 10 + j, gi))
    return out


def _cfg(**kw) -> LearnerConfig:
    base = dict(optim=OptimConfig(lr=1e-2, max_grad_norm=1.0), assert_lag0_exact=True)
    base.update(kw)
    return LearnerConfig(**base)


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_lag0_tokens_match_behavior_logprobs_exactly_and_the_step_updates_weights():
    model = _model()
    learner = Learner(model, _cfg())
    before = _weights(model)
    m = learner.step(_batch(model))
    assert m["lag0_abs_dlogp_max"] == 0.0 and m["lag0_abs_dlogp_mean"] == 0.0
    assert m["is_weight_max"] == 1.0 and m["kl_k1_behavior_to_learner"] == 0.0
    assert m["step_skipped_nonfinite"] == 0 and learner.version == 1
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_lag0_assertion_fires_on_a_mismatch():
    model = _model()
    batch = _batch(model, groups=1, g=2)
    batch[0].behavior_logprobs[-1] -= 1e-3  # as if the engine had computed it differently
    learner = Learner(model, _cfg())
    before = _weights(model)
    with pytest.raises(Lag0MismatchError):
        learner.step(batch)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_stale_tokens_get_importance_weights_and_metrics():
    model = _model()
    learner = Learner(model, _cfg())
    old = _batch(model, version=0, seed=1)
    learner.step(_batch(model, version=0))
    m = learner.step(old)  # sampled at version 0, trained at version 1
    assert m["lag_min"] == 1 and m["lag_max"] == 1 and m["lag0_token_count"] == 0
    assert m["is_weight_max"] != 1.0 and m["kl_k3_behavior_to_learner"] > 0.0
    assert 0.0 < m["is_weight_ess_fraction"] <= 1.0


@pytest.mark.parametrize("bad_logprob", [-1e4, -float("inf")])
def test_non_finite_loss_skips_the_step_and_keeps_weights(bad_logprob):
    model = _model()
    learner = Learner(model, _cfg(assert_lag0_exact=False))
    batch = _batch(model)
    # behavior logprob -1e4 (or -inf): w = exp(logp + 1e4) is inf; the ratio is not clipped, the step is
    # skipped.
    batch[0].behavior_logprobs[-1] = bad_logprob
    before = _weights(model)
    m = learner.step(batch)
    assert m["step_skipped_nonfinite"] == 1 and learner.version == 0 and learner.skipped_steps == 1
    assert m["is_weight_nonfinite_count"] >= 1
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    # The next good batch trains normally.
    m = learner.step(_batch(model, seed=3))
    assert m["step_skipped_nonfinite"] == 0 and learner.version == 1


def test_non_finite_gradient_skips_the_step():
    model = _model()
    learner = Learner(model, _cfg(assert_lag0_exact=False))
    batch = _batch(model)
    before = _weights(model)

    def poison(grad):
        return grad * float("nan")

    handle = model.lm_head.weight.register_hook(poison)
    try:
        m = learner.step(batch)
    finally:
        handle.remove()
    assert m["step_skipped_nonfinite"] == 1 and not math.isfinite(m["grad_norm"])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_trajectories_beyond_max_lag_are_dropped_and_counted():
    model = _model()
    learner = Learner(model, _cfg(), version=5, max_lag=2)
    fresh = _batch(model, version=5, groups=1)
    stale = _batch(model, version=2, groups=1, seed=7)  # lag 3 > 2
    for t in stale:
        t.group_id = "stale"
    m = learner.step(fresh + stale)
    assert m["dropped_over_lag"] == len(stale) and m["batch_trajectories"] == len(fresh)
    assert m["lag_max"] == 0


def test_invalid_trajectory_is_dropped_not_fatal():
    model = _model()
    learner = Learner(model, _cfg())
    batch = _batch(model, groups=1)
    batch[1].versions = batch[1].versions[:-1]  # length mismatch
    m = learner.step(batch)
    assert m["dropped_invalid"] == 1 and learner.version == 1


def test_micro_batches_respect_the_token_budget():
    assert micro_batches([3, 3, 3, 10, 1], 6) == [[0, 1], [2], [3], [4]]
    assert micro_batches([], 6) == []


@pytest.mark.parametrize(("estimator", "stale"), [("reinforce_zero", False), ("m2po", True), ("snis", True)])
def test_gradient_accumulation_over_micro_batches_matches_one_batch(estimator, stale):
    # m2po and snis take a statistic of the whole batch: split into micro-batches, the step must not change.
    # Their batch is stale (sampled by other weights, lag 1) so that the statistic is not trivial.
    batch = _batch(_model(seed=1 if stale else 0), groups=2, g=3)
    grads = []
    for budget in (10_000, 12):  # one packed forward vs. one sequence per micro-batch
        model = _model()
        loss = LossConfig(estimator, m2po_tau=0.002)
        learner = Learner(
            model,
            _cfg(micro_batch_tokens=budget, optim=OptimConfig(lr=1e-2, max_grad_norm=0.0), loss=loss),
            version=int(stale),
        )
        seen = {}
        learner.optimizer.register_step_pre_hook(
            lambda opt, args, kwargs, seen=seen, model=model: seen.update(
                {n: p.grad.clone() for n, p in model.named_parameters()}
            )
        )
        m = learner.step(batch)
        if estimator == "m2po":
            assert 0.0 < m["estimator_clipfrac"] < 1.0  # the bound masked some tokens, not all
        grads.append(seen)
    for k in grads[0]:
        torch.testing.assert_close(grads[0][k], grads[1][k], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(
    "estimator",
    [
        "reinforce_zero",
        "on_policy",
        "sequence_gate",
        "token_gate",
        "icepop",
        "truncated_is",
        "ppo_clip",
        "m2po",
        "snis",
        "decoupled_ppo",
    ],
)
def test_every_estimator_trains_through_the_same_learner(estimator):
    model = _model()
    learner = Learner(model, _cfg(loss=LossConfig(estimator=estimator)))
    learner.step(_batch(model))
    m = learner.step(_batch(model, version=0, seed=5))  # stale by one step: the estimators differ here
    assert m["step_skipped_nonfinite"] == 0 and learner.version == 2 and math.isfinite(m["loss"])


def test_resume_from_checkpoint_is_bitwise_identical(tmp_path):
    batches = [_batch(_model(), seed=s) for s in range(3)]
    # Uninterrupted: three steps.
    model_a = _model()
    learner_a = Learner(
        model_a, _cfg(optim=OptimConfig(lr=1e-2, schedule="cosine", total_steps=3, warmup_steps=1))
    )
    for b in batches:
        learner_a.step(b)
    # Interrupted after one step: checkpoint (with the queued batches), fresh objects, resume.
    model_b = _model()
    cfg_b = _cfg(optim=OptimConfig(lr=1e-2, schedule="cosine", total_steps=3, warmup_steps=1))
    learner_b = Learner(model_b, cfg_b)
    learner_b.step(batches[0])
    queued = [[t.to_dict() for t in b] for b in batches[1:]]
    path = save_checkpoint(tmp_path / "ckpt.pt", learner_b.save_state, {"queued": queued, "data_position": 1})
    assert not list(tmp_path.glob("*.tmp"))
    model_c = _model(seed=123)  # different init: everything must come from the checkpoint
    learner_c = Learner(model_c, cfg_b)
    payload = load_checkpoint(path)
    learner_c.load_state(payload["learner"], payload["learner_folder"])
    assert payload["runtime"]["data_position"] == 1
    for b in payload["runtime"]["queued"]:
        learner_c.step([Trajectory.from_dict(d) for d in b])
    assert learner_c.version == learner_a.version == 3
    for k, v in model_a.state_dict().items():
        assert torch.equal(v, model_c.state_dict()[k]), k


def test_lr_schedule_warms_up_then_decays():
    from rz_agents.trainer.optim import lr_factor

    cfg = OptimConfig(lr=1.0, schedule="cosine", warmup_steps=2, total_steps=6)
    f = [lr_factor(s, cfg) for s in range(7)]
    assert f[:2] == [0.5, 1.0] and f[2] == 1.0
    assert f[2] > f[3] > f[4] > f[5] and f[6] == pytest.approx(0.0, abs=1e-12)
    lin = OptimConfig(lr=1.0, schedule="linear", total_steps=4, min_lr_ratio=0.1)
    assert [lr_factor(s, lin) for s in range(5)] == pytest.approx([1.0, 0.775, 0.55, 0.325, 0.1])
    model = _model()
    learner = Learner(
        model, _cfg(optim=OptimConfig(lr=0.1, schedule="linear", total_steps=2, warmup_steps=0))
    )
    lrs = [learner.step(_batch(model, version=learner.version, seed=s))["lr"] for s in range(2)]
    assert lrs == pytest.approx([0.1, 0.05])


def _bf16_model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig.tiny("qwen3", vocab_size=64, dtype="bfloat16"))


def test_bf16_model_trains_through_fp32_masters_and_lag0_stays_exact():
    model = _bf16_model()
    learner = Learner(model, _cfg(optim=OptimConfig(lr=1e-3)))
    assert learner.masters is not None and all(m.dtype == torch.float32 for m in learner.masters)
    m = learner.step(_batch(model))  # assert_lag0_exact: a bf16 forward scores lag-0 tokens bitwise
    assert m["lag0_abs_dlogp_max"] == 0.0 and learner.version == 1
    state = learner.optimizer.state[learner.masters[0]]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    for p, master in zip(learner.params, learner.masters, strict=True):
        assert p.dtype == torch.bfloat16 and torch.equal(p, master.to(torch.bfloat16))
    # The masters hold what bf16 cannot: some of them are not representable in bf16.
    assert any(not torch.equal(master, master.to(torch.bfloat16).float()) for master in learner.masters)
    # Sampled with the new bf16 weights, the next batch is again exact at lag 0.
    assert learner.step(_batch(model, version=1, seed=2))["lag0_abs_dlogp_max"] == 0.0


def test_bf16_updates_smaller_than_a_bf16_ulp_accumulate_in_the_masters():
    """The final norm's weights are 1.0, where bf16's spacing is 2**-7: an AdamW step of ~lr = 5e-4 rounds
    back to 1.0 in bf16, so a bf16-only optimizer would never move them; the fp32 masters sum the steps
    until the rounded weights change."""
    model = _bf16_model()
    learner = Learner(model, _cfg(assert_lag0_exact=False, optim=OptimConfig(lr=5e-4, max_grad_norm=0.0)))
    batch = _batch(model)
    norm = model.model.norm.weight
    master = learner.masters[[id(p) for p in learner.params].index(id(norm))]
    learner.step(batch)
    assert torch.equal(norm, torch.ones_like(norm))  # one step: below half a bf16 ulp
    assert not torch.equal(master, torch.ones_like(master))  # but the master moved
    for _ in range(30):
        learner.step(batch)
    assert not torch.equal(norm, torch.ones_like(norm))


def test_bf16_resume_restores_the_masters_bitwise(tmp_path):
    batches = [_batch(_bf16_model(), seed=s) for s in range(3)]
    cfg = _cfg(assert_lag0_exact=False, optim=OptimConfig(lr=1e-3))
    learner_a = Learner(_bf16_model(), cfg)
    for b in batches:
        learner_a.step(b)
    learner_b = Learner(_bf16_model(), cfg)
    learner_b.step(batches[0])
    path = save_checkpoint(tmp_path / "ckpt.pt", learner_b.save_state, {})
    learner_c = Learner(_bf16_model(seed=9), cfg)
    payload = load_checkpoint(path)
    learner_c.load_state(payload["learner"], payload["learner_folder"])
    for b in batches[1:]:
        learner_c.step(b)
    for ma, mc in zip(learner_a.masters, learner_c.masters, strict=True):
        assert torch.equal(ma, mc)
    for k, v in learner_a.model.state_dict().items():
        assert torch.equal(v, learner_c.model.state_dict()[k]), k


def test_replace_weights_replaces_weights_and_fp32_masters_and_keeps_the_version():
    """A warm start changes the policy outside the learner: the masters must follow, or the next step
    would round the old masters back into the model."""
    learner = Learner(_bf16_model(), _cfg(assert_lag0_exact=False, optim=OptimConfig(lr=1e-3)))
    learner.step(_batch(learner.model))
    new = {k: v.clone() for k, v in _bf16_model(seed=4).state_dict().items()}
    learner.replace_weights(new)
    assert learner.version == 1
    for k, v in learner.model.state_dict().items():
        assert torch.equal(v, new[k]), k
    for p, master in zip(learner.params, learner.masters, strict=True):
        assert torch.equal(master, p.float())
    assert learner.step(_batch(learner.model, version=1, seed=5))["step_skipped_nonfinite"] == 0


def test_the_old_load_weights_name_warns_and_still_replaces_the_weights():
    learner = Learner(_bf16_model(), _cfg(assert_lag0_exact=False))
    new = {k: v.clone() for k, v in _bf16_model(seed=4).state_dict().items()}
    with pytest.warns(DeprecationWarning, match="call Learner.replace_weights"):
        learner.load_weights(new)
    assert all(torch.equal(v, new[k]) for k, v in learner.model.state_dict().items())


def test_decoupled_ppo_proximal_snapshot_is_refreshed_every_k_versions():
    model = _model()
    learner = Learner(
        model, _cfg(loss=LossConfig("decoupled_ppo", proximal_every=2), assert_lag0_exact=False)
    )
    lags, at_version_2 = [], None
    for s in range(4):
        if learner.version == 2:
            at_version_2 = {k: v.clone() for k, v in model.state_dict().items()}
        lags.append(learner.step(_batch(model, version=learner.version, seed=s))["proximal_lag"])
    assert lags == [0, 1, 0, 1] and learner.proximal_version == 2
    # The snapshot is a copy of the version-2 weights, not a view of the live model (which moved on).
    prox = learner.proximal.state_dict()
    assert all(torch.equal(prox[k], v) for k, v in at_version_2.items())
    assert any(not torch.equal(prox[k], v) for k, v in model.state_dict().items())
