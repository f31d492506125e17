"""Data-dependent host reads of one learner micro-batch on the Triton op set (the GPU learner's code, run here
by the Triton interpreter): the packed forward, the log-probs, the REINFORCE Zero loss and the backward, dense
and MoE, under the host-read recorder (rz_agents.engine.host_reads: item/int/bool/tolist/nonzero/unique/...).

Before issue 37 a micro-batch made four: ``int(positions.max())`` and ``torch.unique(seq_ids)`` in the model's
context, the attention plan's ``torch.unique`` of its query tiles, and a ``nonzero`` for the rows (on a host
tensor). Now the packed forward takes the highest position and the sequence count from the host; one is left,
stated in Transformer.forward: the attention plan's ``torch.unique`` (once per forward, not per layer).
``pytest -s`` prints the list."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from rz_agents.engine.host_reads import HostReads  # noqa: E402
from rz_agents.model import ModelConfig, Transformer  # noqa: E402
from rz_agents.model.logprobs import packed_token_logprobs  # noqa: E402
from rz_agents.trainer.loss import LossConfig, sequence_loss, token_scales  # noqa: E402

STATED = [("_unique2", "plan_attention")]  # (op, function): the one read a micro-batch still makes


def _micro_batch(model, sequences, masks, scales):
    logps = packed_token_logprobs(model, sequences)
    loss = sum(
        sequence_loss(lp, torch.full_like(lp, -2.0), m, 1.0 - 2.0 * (i % 2), s, LossConfig())
        for i, (lp, m, s) in enumerate(zip(logps, masks, scales, strict=True))
    )
    loss.backward()


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_moe"])
def test_a_learner_micro_batch_reads_back_only_the_stated_attention_plan(model_type):
    torch.manual_seed(0)
    model = Transformer(ModelConfig.tiny(model_type, num_hidden_layers=1, vocab_size=64), kernels="triton")
    sequences = [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15, 16]]
    masks = [torch.tensor([j >= 2 for j in range(len(s) - 1)]) for s in sequences]
    scales = token_scales(masks, "token")  # (per step, on the host masks: the learner's _prepare)
    _micro_batch(model, sequences, masks, scales)  # warm (lazy tables)
    model.zero_grad()
    with HostReads() as rec:
        _micro_batch(model, sequences, masks, scales)
    print(f"\n{model_type}: {len(rec.reads)} host reads in one micro-batch")
    for op, where in rec.reads:
        print(f"  {op} at {where}")
    assert [(op, where.split(" ")[1]) for op, where in rec.reads] == STATED
    assert all(p.grad is not None for p in model.parameters())
