"""The ``eval:`` section of a YAML config: what `rz eval` runs on a math benchmark, and how."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from rz_agents.config_io import ConfigError, from_dict, read_yaml_mapping, rename_fields

BENCHMARKS = ("aime24", "aime25", "aime26", "amc23", "math500", "gsm8k", "word_problems")

# Qwen's math evaluation instruction; the model answers in one turn.
DIRECT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass
class MathEvalConfig:
    """Settings of a math evaluation (every field can also be given as an `rz eval` flag).

    Production (AIME): k = 16..64 samples per problem, temperature 0.6, top_p 0.95, max_tokens large
    enough for the model's reasoning (e.g. 32768 for Qwen3-4B thinking).

    checkpoint: HF checkpoint directory (its tokenizer.json is used when present, else Qwen3's).
    benchmark: a packaged set (aime24, aime25, aime26, amc23, math500, gsm8k) or a JSONL/JSON file.
    k: samples per problem. tool: offer the sandboxed Python tool (multi-turn episodes) or not
    (one direct answer in ``\\boxed{}``). max_tokens: per answer (per turn with the tool).
    max_turns / max_context: tool episodes' turn limit and token budget (prompt + all turns; None
    derives it from the longest prompt). temperature 0 is greedy.
    max_running: sequences generated at once (was num_slots); kv_cache_gb sizes the engine's paged KV cache
    (the engine queues what its pages cannot hold; one sequence of the longest prompt + max_tokens, or a
    whole tool episode, must fit). kernels: "aligned" (bit-identical to the trainer) or
    "standard". thinking: Qwen3's thinking mode (False puts an empty think block in the prompt).
    system_prompt / instruction: the prompt's system message (None: the template's default) and the
    line after the question (no tool). save_text: keep each sample's generated text in the results.
    prompt_style (tool episodes): "default" writes the system prompt, the tool schema and the answer
    instruction; "compact" gives the question alone, for policies trained on compact prompts (they
    know their tool from training, like configs/smollm2-gsm8k.yaml's).
    """

    checkpoint: str | None = None
    benchmark: str = "aime24"
    k: int = 16
    tool: bool = False
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 0
    max_tokens: int = 4096
    max_turns: int = 4
    max_context: int | None = None
    limit: int | None = None
    seed: int = 0
    RENAMED_FIELDS: ClassVar[dict[str, str]] = {"num_slots": "max_running"}  # config_io: old names

    max_running: int = 32
    kv_cache_gb: float | None = None
    num_threads: int | None = None
    kernels: Literal["aligned", "standard"] = "aligned"
    dtype: str | None = None
    thinking: bool = True
    system_prompt: str | None = None
    instruction: str = DIRECT_INSTRUCTION
    save_text: bool = False
    prompt_style: Literal["default", "compact"] = "default"

    def validate(self) -> None:
        """Raise ConfigError naming the first bad field."""
        positive = {"k": self.k, "max_tokens": self.max_tokens, "max_turns": self.max_turns}
        positive["max_running"] = self.max_running
        for name, value in positive.items():
            if value < 1:
                raise ConfigError(f"eval.{name}: must be >= 1, got {value}")
        for name in ("limit", "max_context", "num_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"eval.{name}: must be >= 1 or null, got {value}")
        if self.kv_cache_gb is not None and self.kv_cache_gb <= 0:
            raise ConfigError(f"eval.kv_cache_gb: must be > 0 or null, got {self.kv_cache_gb}")
        if self.temperature < 0:
            raise ConfigError(f"eval.temperature: must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"eval.top_p: must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"eval.top_k: must be >= 0 (0 = off), got {self.top_k}")
        if self.prompt_style not in ("default", "compact"):
            raise ConfigError(f"eval.prompt_style: must be 'default' or 'compact', got {self.prompt_style!r}")
        if self.benchmark not in BENCHMARKS and not Path(self.benchmark).is_file():
            raise ConfigError(
                f"eval.benchmark: {self.benchmark!r} is neither a benchmark ({', '.join(BENCHMARKS)}) "
                "nor a dataset file"
            )


# Keys of the eval section that only the training loop reads (rz_agents/eval/in_loop.py): rz eval ignores
# them.
IN_LOOP_KEYS = ("every", "at_start")
# an env evaluation's own keys (EnvEvalConfig): a section without a benchmark is the run's env evaluation,
# and `rz eval RUN/config.yaml --benchmark NAME` reads the settings the two share from it (k, temperature...)
ENV_ONLY_KEYS = ("tasks", "num_tasks", "success_threshold")


def load_eval_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> MathEvalConfig:
    """The ``eval:`` section of the YAML file at ``path`` (defaults when None), then ``overrides``.

    Other top-level sections (a training config's ``model:``, ``engine:``...) are ignored, so one
    file can drive both training and evaluation; a training config without ``eval:`` gives the
    defaults. Raises ConfigError naming a bad field or type.
    """
    data: dict[str, Any] = {}
    if path is not None:
        doc = read_yaml_mapping(path)
        if "eval" not in doc and not {"model", "tokenizer"} & set(doc):
            raise ConfigError(f"{path}: no 'eval:' section (top-level keys: {', '.join(map(str, doc))})")
        data = doc.get("eval") or {}
        if not isinstance(data, dict):
            raise ConfigError(f"eval: expected a mapping, got {data!r}")
    skip = IN_LOOP_KEYS if data.get("benchmark") else (*IN_LOOP_KEYS, *ENV_ONLY_KEYS)
    data = rename_fields(MathEvalConfig, {k: v for k, v in data.items() if k not in skip}, "eval")
    data = {**data, **{k: v for k, v in (overrides or {}).items() if v is not None}}
    config = from_dict(MathEvalConfig, data, "eval")
    config.validate()
    return config
