"""When a sequence stops: EOS, stop tokens, stop strings, max_tokens, the cache's max length."""

from __future__ import annotations

from collections.abc import Callable, Collection

from rz_agents.engine.params import FinishReason
from rz_agents.engine.sequence import Sequence


def stop_string_window(stops: tuple[str, ...]) -> int:
    """How many trailing tokens to decode to see any stop string completed by the newest token.

    A string of L characters spans at most L tokens that produce characters, plus up to 3 tokens
    per character that only carry partial UTF-8 bytes; 4 * L + 1 tokens always cover it.
    """
    return 4 * max(len(s) for s in stops) + 1


def check_stop(
    seq: Sequence,
    eos_token_ids: Collection[int],
    max_len: int,
    decode: Callable[[list[int]], str] | None,
) -> tuple[FinishReason, int | str | None] | None:
    """Decide whether ``seq`` stops after its newest token; returns (finish_reason, stop_reason).

    Checked in this order: EOS / stop token (stop_reason = the token id), stop string
    (stop_reason = the string), max_tokens or the cache length (stop_reason None).
    """
    params = seq.params
    token = seq.output[-1]
    if (not params.ignore_eos and token in eos_token_ids) or token in params.stop_token_ids:
        return "stop", token
    if params.stop:
        if decode is None:  # SamplingParams validation happens in the engine; this is a guard
            raise ValueError("stop strings need an engine constructed with a decode function")
        text = decode(seq.output[-stop_string_window(params.stop) :])
        for s in params.stop:
            if s in text:
                return "stop", s
    if len(seq.output) >= params.max_tokens or seq.num_tokens >= max_len:
        return "length", None
    return None
