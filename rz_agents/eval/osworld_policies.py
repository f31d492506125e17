"""Model policies for OSWorld: our engine over a checkpoint, or any OpenAI-compatible chat endpoint.

Both act as OSWorld's agent (on the tree, the screenshot or both): they see the system message and the last
``history_turns`` exchanges (``prompts.window_messages``) and return a ``Reply`` with the text and
its token counts. The engine policy also fits the prompt to the model's context: it drops older
turns first, then cuts the current observation's tree.

``--policy openai:URL/MODEL``: URL is the API base (``http://host:8000/v1``); MODEL may contain
``/`` (``openai:http://gpu:8000/v1/Qwen/Qwen3-4B``). The key, if the server wants one, comes from
``$OPENAI_API_KEY``. Screenshot observations go to it as OpenAI ``image_url`` parts holding a
``data:image/png;base64,...`` URL (what OSWorld's agent and vLLM's vision models take). The engine
policy sends them to a vision-language (Qwen3-VL) checkpoint as training's rollouts do: the template
training gives the policy renders each as its image run, and the request carries the images
(``rollout.agent_loop.image_request``, the checkpoint's preprocessing). A text-only checkpoint with a
screenshot observation is refused (``model_policy``: ValueError; a PolicyError per turn otherwise),
never evaluated blind; a vision-language checkpoint on ``a11y_tree`` sees text only.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from typing import Any

from rz_agents.envs.osworld.a11y import TRUNCATED
from rz_agents.envs.osworld.prompts import window_messages
from rz_agents.images import has_images, to_png


class PolicyError(RuntimeError):
    """The model could not answer (endpoint error, prompt larger than the context); the message says why."""


@dataclass
class Reply:
    """A policy's turn: the reply text and what it cost in tokens."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class Sampling:
    """How model policies sample each reply."""

    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    history_turns: int = 3


def parse_openai_spec(spec: str) -> tuple[str, str]:
    """``openai:URL/MODEL`` -> (base URL, model); the split is after ``/v1`` when present, else at the
    last ``/``."""
    body = spec.removeprefix("openai:")
    if "/v1/" in body:
        base, model = body.split("/v1/", 1)
        base += "/v1"
    else:
        base, _, model = body.rpartition("/")
    if not base.startswith(("http://", "https://")) or not model:
        raise ValueError(
            f"--policy {spec!r}: expected openai:URL/MODEL, e.g. openai:http://localhost:8000/v1/my-model"
        )
    return base.rstrip("/"), model


class OpenAIPolicy:
    """Calls ``POST {base_url}/chat/completions`` once per turn (retrying 429/5xx answers briefly)."""

    def __init__(self, base_url: str, model: str, sampling: Sampling | None = None,
                 api_key: str | None = None, timeout_s: float = 300.0, retries: int = 2) -> None:  # fmt: skip
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.sampling = sampling or Sampling()
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout_s = timeout_s
        self.retries = retries

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode()
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")[:300]
                if (exc.code == 429 or exc.code >= 500) and attempt < self.retries:
                    time.sleep(1.0 * (attempt + 1))
                    continue
                raise PolicyError(f"{self.url}: HTTP {exc.code}: {detail}") from None
            except (urllib.error.URLError, OSError, ValueError) as exc:
                if attempt < self.retries:
                    time.sleep(1.0 * (attempt + 1))
                    continue
                raise PolicyError(f"{self.url}: {exc}") from None
        raise PolicyError(f"{self.url}: no answer")  # unreachable: the loop returns or raises

    def __call__(self, messages: list[dict[str, str]], task: dict[str, Any]) -> Reply:
        s = self.sampling
        body = {
            "model": self.model,
            "messages": [openai_message(m) for m in window_messages(messages, s.history_turns)],
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "seed": s.seed,
        }
        answer = self._post(body)
        try:
            text = answer["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise PolicyError(f"{self.url}: unexpected answer {str(answer)[:200]}") from None
        usage = answer.get("usage") or {}
        return Reply(text, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))


def openai_message(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` in OpenAI's chat format: image parts become ``image_url`` parts with PNG data URLs."""
    content = message["content"]
    if isinstance(content, str):
        return message
    parts = []
    for p in content:
        if p["type"] == "image":
            url = "data:image/png;base64," + base64.b64encode(to_png(p["image"])).decode()
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            parts.append(p)
    return {**message, "content": parts}


class EnginePolicy:
    """Our engine (``RZEngine``) over a loaded checkpoint, sampling one reply per turn."""

    def __init__(self, checkpoint: Any, sampling: Sampling | None = None, max_len: int | None = None,
                 num_threads: int | None = None) -> None:  # fmt: skip
        from rz_agents.engine import EngineConfig, RZEngine

        self.policy = checkpoint  # an eval.checkpoint_policy.CheckpointPolicy
        self.sampling = sampling or Sampling()
        model_len = int(getattr(checkpoint.model.config, "max_position_embeddings", 0) or 8192)
        self.max_len = min(max_len or model_len, model_len)
        if self.sampling.max_tokens >= self.max_len:
            raise ValueError(
                f"max_tokens {self.sampling.max_tokens} leaves no room for a prompt in {self.max_len} "
                "positions"
            )
        stops = tuple(checkpoint.template.stop_token_ids(checkpoint.tokenizer))
        self.stops = stops
        self.engine = RZEngine(
            checkpoint.model,
            EngineConfig(max_running=1, max_len=self.max_len, max_batch_tokens=512, eos_token_ids=stops,
                         num_threads=num_threads, prefix_cache=True),
        )  # fmt: skip
        self.turn = 0

    @property
    def sees_images(self) -> bool:
        """Whether the checkpoint takes screenshots (``sees_images``)."""
        return sees_images(self.policy)

    def _encode(self, messages: list[dict[str, Any]]) -> list[int]:
        return list(self.policy.template.encode_prompt(self.policy.tokenizer, messages))

    def fit(self, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt tokens of the windowed chat, shrunk to leave ``max_tokens`` of room
        (``fit_messages``)."""
        return self.fit_messages(messages)[0]

    def fit_messages(self, messages: list[dict[str, Any]]) -> tuple[list[int], list[dict[str, Any]]]:
        """The prompt tokens of the windowed chat, shrunk to leave ``max_tokens`` of room, and the messages
        they render (their images are the prompt's, in order).

        Older turns go first; with no history left, the current observation's text is cut at a line (its
        screenshot stays). Message lengths are measured once each (plus a margin for the template's
        markers), so only the final candidates are rendered in full.
        """
        budget = self.max_len - self.sampling.max_tokens
        template, tokenizer = self.policy.template, self.policy.tokenizer
        sizes: dict[int, int] = {}

        def estimate(msgs: list[dict[str, Any]]) -> int:
            for m in msgs:
                if id(m) not in sizes:
                    content = m["content"]
                    sizes[id(m)] = 8 + len(  # role markers and separators
                        tokenizer.encode(content) if isinstance(content, str)
                        else template.encode_continuation(tokenizer, [m])  # text and image runs
                    )  # fmt: skip
            return sum(sizes[id(m)] for m in msgs)

        msgs = messages
        for turns in range(max(self.sampling.history_turns, 0), -1, -1):
            msgs = window_messages(messages, turns)
            if turns and estimate(msgs) > budget:
                continue
            tokens = self._encode(msgs)
            if len(tokens) <= budget:
                return tokens, msgs
        # Still too long with no history: cut the current observation's text at a line boundary.
        head, current = msgs[:-1], msgs[-1]
        lines = _text_of(current).split("\n")
        room = budget - len(self._encode([*head, _with_text(current, TRUNCATED)]))
        lo, hi = 0, len(lines)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(tokenizer.encode("\n".join(lines[:mid]) + "\n")) <= room:
                lo = mid
            else:
                hi = mid - 1
        while True:
            msgs = [*head, _with_text(current, "\n".join(lines[:lo] + [TRUNCATED]))]
            tokens = self._encode(msgs)
            if len(tokens) <= budget or lo == 0:
                break
            lo -= 1  # tokens merge across the cut: step back until the render fits
        if len(tokens) > budget:
            raise PolicyError(
                f"the system prompt and the current observation's images alone ({len(tokens)} tokens) do not "
                f"fit {budget} positions"
            )
        return tokens, msgs

    def __call__(self, messages: list[dict[str, Any]], task: dict[str, Any]) -> Reply:
        from rz_agents.engine import SamplingParams
        from rz_agents.rollout.agent_loop import image_request, message_pngs

        if has_images(messages) and not self.sees_images:
            raise PolicyError(text_only_error(self.policy))
        prompt, shown = self.fit_messages(messages)
        s = self.sampling
        params = SamplingParams(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens,
                                seed=s.seed * 100_003 + self.turn, stop_token_ids=self.stops)  # fmt: skip
        self.turn += 1
        # the screenshots of the prompt go to the engine as the rollout loop sends them in training
        images = image_request(self.policy.template, message_pngs(shown))
        completion = asyncio.run(self.engine.generate(prompt, params, **images))
        if completion.finish_reason in ("error", "cancelled"):
            raise PolicyError(f"engine {completion.finish_reason}: {completion.error}")
        ids = [t for t in completion.tokens if t not in self.stops]
        known = int(getattr(self.policy.tokenizer, "vocab_size", 0) or 0)
        ids = [t for t in ids if t < known] if known else ids
        text = self.policy.tokenizer.decode(ids, skip_special_tokens=True)
        return Reply(text, len(prompt), len(completion.tokens))


def sees_images(policy: Any) -> bool:
    """Whether a loaded checkpoint policy takes screenshots: a vision-language model, whose template renders
    them."""
    return bool(getattr(policy.template, "renders_images", False))


def text_only_error(policy: Any) -> str:
    """Why a text-only checkpoint cannot take screenshot observations, and what to do instead."""
    return (
        f"checkpoint {policy.name} is a text-only model (its chat template "
        f"{type(policy.template).__name__} renders no images), so it cannot see the screenshots of "
        "--observation screenshot / screenshot_a11y_tree: evaluate it with --observation a11y_tree, or "
        "evaluate a vision-language (Qwen3-VL) checkpoint"
    )


def _text_of(message: dict[str, Any]) -> str:
    """A message's text to cut: its content, or its longest text part (an observation's prompt and tree)."""
    content = message["content"]
    if isinstance(content, str):
        return content
    return max((p["text"] for p in content if p.get("type") == "text"), key=len, default="")


def _with_text(message: dict[str, Any], text: str) -> dict[str, Any]:
    """``message`` with ``_text_of`` replaced by ``text`` (its other parts, images too, kept in place)."""
    content = message["content"]
    if isinstance(content, str):
        return {**message, "content": text}
    parts = list(content)
    texts = [i for i, p in enumerate(parts) if p.get("type") == "text"]
    if not texts:
        return {**message, "content": [*parts, {"type": "text", "text": text}]}
    longest = max(texts, key=lambda i: len(parts[i]["text"]))
    parts[longest] = {**parts[longest], "text": text}
    return {**message, "content": parts}


def model_policy(
    policy: str | None,
    checkpoint: str | None,
    sampling: Sampling,
    observation: str = "a11y_tree",
    tokenizer: str | None = None,
    **engine: Any,
) -> Any | None:
    """An ``EnginePolicy`` for ``checkpoint``, an ``OpenAIPolicy`` for ``openai:...``, else None.

    ``tokenizer``: the one the checkpoint was trained with (a training config's ``tokenizer:``; None: its
    tokenizer.json, else Qwen3's). ValueError when a text-only checkpoint is asked to see screenshots
    (``observation`` screenshot / screenshot_a11y_tree): it would be evaluated blind, so it is refused
    before any desktop starts.
    """
    if checkpoint:
        if policy and policy != "checkpoint":
            raise ValueError("give either --checkpoint or --policy, not both")
        from rz_agents.eval.checkpoint_policy import load_checkpoint_policy

        loaded = load_checkpoint_policy(
            checkpoint, kernels=engine.pop("kernels", "aligned"), dtype=engine.pop("dtype", None),
            tokenizer=tokenizer,
        )  # fmt: skip
        if observation != "a11y_tree" and not sees_images(loaded):  # refused before the engine is built
            raise ValueError(text_only_error(loaded))
        return EnginePolicy(loaded, sampling, **engine)
    if policy and policy.startswith("openai:"):
        base, model = parse_openai_spec(policy)
        return OpenAIPolicy(base, model, replace(sampling))
    return None
