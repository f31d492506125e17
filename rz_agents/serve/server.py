"""The OpenAI API over the engine, without HTTP: checked requests in, response objects (dicts) out.

``OpenAIServer.chat`` renders the messages with the model's chat template (or takes a session's token
history, sessions.py), asks the engine for ``n`` completions at once (they batch continuously with every
other request in flight), and turns each completion into an assistant message with the tool-call parser
the envs use, in the format the chat template names (tool_formats.py). Every token and log-prob it
reports is the engine's own; ``return_token_ids`` adds the prompt and sampled token ids and the policy
version of each sampled token.

All of it runs on the event loop that drives the engine: the engine's steps, weight updates and the
optional top-logprobs forward are never concurrent with each other.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import torch

from rz_agents.engine import Completion, SamplingParams
from rz_agents.images import has_images
from rz_agents.rollout.agent_loop import image_request, message_pngs, turn_seed
from rz_agents.serve.openai_schema import ChatRequest, CompletionRequest, OpenAIError, Sampling
from rz_agents.serve.sessions import Session, SessionStore
from rz_agents.serve.tool_formats import THINK_CLOSE, format_of

FINISH = {"stop": "stop", "length": "length", "cancelled": "abort"}
STREAM_POLL_S = 0.002  # how often a stream looks for new tokens (the engine yields between steps)


@dataclass
class Choice:
    """One finished completion, decoded."""

    completion: Completion
    text: str
    tool_calls: list[dict[str, Any]]
    content: str | None
    top: list[list[tuple[int, float]]] | None = None


class OpenAIServer:
    """Chat and text completions over ``engine`` with ``tokenizer`` and ``template``.

    Args:
        engine: an engine with ``async generate(prompt, params)`` (``RZEngine``) and ``version``.
        tokenizer, template: the run's tokenizer and chat template (``runtime.factories.build_tokenizer``).
        model_name: the id ``/v1/models`` lists; requests naming another model get a 404.
        model: the engine's model, for ``top_logprobs`` (None: top_logprobs are refused).
    """

    def __init__(self, engine, tokenizer, template, model_name: str = "rz", model=None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.template = template
        self.model_name = model_name
        self.model = model if model is not None else getattr(engine, "model", None)
        self.sessions = SessionStore(tokenizer, template)
        self.tool_format = format_of(template)  # the template names how its model writes tool calls
        # the format's special tokens the parser reads: kept when a reply is decoded (others are dropped)
        self.kept_ids = {
            i: token
            for token in self.tool_format.kept_tokens
            if (i := tokenizer.token_to_id(token)) is not None
        }
        self.stops = tuple(template.stop_token_ids(tokenizer))
        self.max_len = int(getattr(getattr(engine, "config", None), "max_len", 0) or 1 << 30)
        self.created = int(time.time())
        self.counters = {"chat_requests": 0, "completion_requests": 0, "disconnects": 0}

    # ---- listing ------------------------------------------------------------------------------------
    def models(self) -> dict[str, Any]:
        """The ``/v1/models`` body."""
        card = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "rz"}
        return {"object": "list", "data": [card]}

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise OpenAIError(
                f"The model `{name}` does not exist; this server serves `{self.model_name}`",
                "model",
                status=404,
                code="model_not_found",
            )

    # ---- chat -----------------------------------------------------------------------------------------
    async def chat(self, req: ChatRequest) -> dict[str, Any]:
        """The ``/v1/chat/completions`` body for a non-streaming request."""
        rid, choices, prompt = await self._chat_choices(req, None)
        return self._chat_body(req, rid, prompt, choices)

    async def chat_stream(self, req: ChatRequest) -> AsyncIterator[dict[str, Any]]:
        """The chunks of a streaming chat request (``chat.completion.chunk`` objects)."""
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        seqs: list = []
        task = asyncio.ensure_future(self._chat_choices(req, seqs.append, rid))
        try:
            # A request the engine refuses (a prompt too long, a spent session budget) fails here, before the
            # first chunk: the client gets its 4xx instead of an error event in a 200 stream.
            while len(seqs) < req.sampling.n and not task.done():
                await asyncio.sleep(STREAM_POLL_S)
            if task.done() and task.exception() is not None:
                raise task.exception()
            head = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": self.model_name,
            }
            for i in range(req.sampling.n):
                yield {
                    **head,
                    "choices": [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
            live = not req.sampling.top_logprobs  # top logprobs come from a forward after sampling
            sent = [0] * req.sampling.n
            texts = [""] * req.sampling.n
            streams = bool(req.tools and req.parse_tools and self.tool_format.stream)
            calls = [self.tool_format.stream(req.tools) if streams else None for _ in range(req.sampling.n)]
            while not task.done():
                await asyncio.sleep(STREAM_POLL_S)
                if live:
                    for i, seq in enumerate(seqs):
                        tokens = list(seq.output)
                        for chunk in self._content_deltas(
                            req, head, i, tokens, list(seq.logprobs), sent, texts, final=False
                        ):
                            yield chunk
                        if streams:
                            for chunk in self._call_deltas(head, i, calls[i], req.forced, tokens):
                                yield chunk
            _, choices, prompt = task.result()
            for i, choice in enumerate(choices):
                tokens, logprobs = choice.completion.tokens, choice.completion.logprobs.tolist()
                for chunk in self._content_deltas(
                    req, head, i, tokens, logprobs, sent, texts, final=True, top=choice.top
                ):
                    yield chunk
                if streams:
                    for chunk in self._call_deltas(head, i, calls[i], req.forced, tokens):
                        yield chunk
                delta: dict[str, Any] = {}
                streamed = [c.name for c in calls[i].calls] if streams else []
                rest = [
                    {"index": k, **c}
                    for k, c in enumerate(choice.tool_calls)
                    if k >= len(streamed) or streamed[k] != c["function"]["name"]
                ]  # the calls not streamed piece by piece
                if rest:
                    delta["tool_calls"] = rest
                last = {"index": i, "delta": delta, "logprobs": None, "finish_reason": self._finish(choice)}
                if req.sampling.return_token_ids:
                    last["token_ids"] = choice.completion.tokens
                    last["versions"] = choice.completion.versions
                yield {**head, "choices": [last]}
            if req.sampling.include_usage:
                yield {**head, "choices": [], "usage": self._usage(prompt, choices)}
        finally:
            if not task.done():
                task.cancel()  # the client went away: its sequences are cancelled, their pages freed
                await asyncio.gather(task, return_exceptions=True)

    def _call_deltas(self, head, i, calls, forced: str, tokens: list[int]):
        """A chunk with choice ``i``'s tool-call pieces written since the last one (the format's stream:
        tool_stream.py, xml_tool_stream.py)."""
        deltas = calls.update(forced + self._visible_text(tokens))
        if deltas:
            choice = {"index": i, "delta": {"tool_calls": deltas}, "logprobs": None, "finish_reason": None}
            yield {**head, "choices": [choice]}

    def _content_deltas(self, req, head, i, tokens, logprobs, sent, texts, final, top=None):
        """Chunks for choice ``i``'s tokens not sent yet (text held back while it may be a tool call)."""
        n = min(len(tokens), len(logprobs))
        if n <= sent[i] and not final:
            return
        text = req.forced + self._visible_text(tokens[:n])
        if req.tools and req.parse_tools:
            opening = self.tool_format.opening
            reasoning_end = text.rfind(THINK_CLOSE)
            cut = text.find(opening, reasoning_end + len(THINK_CLOSE) if reasoning_end >= 0 else 0)
            if cut >= 0:
                text = text[:cut].rstrip()
            elif not final:
                text = text[: max(len(texts[i]), len(text) - len(opening))]  # a "<tool_c" may be starting
        if not final and text.endswith("\ufffd"):
            text = text[:-1]  # half a UTF-8 character: wait for the rest
        delta_text = text[len(texts[i]) :] if text.startswith(texts[i]) else ""
        entries = None
        if req.sampling.logprobs and n > sent[i]:
            entries = self._logprob_entries(
                tokens[sent[i] :], logprobs[sent[i] :], top[sent[i] :] if top else None
            )
        sent[i] = n
        texts[i] += delta_text
        if delta_text or entries:
            yield {
                **head,
                "choices": [
                    {
                        "index": i,
                        "delta": {"content": delta_text},
                        "logprobs": {"content": entries} if entries else None,
                        "finish_reason": None,
                    }
                ],
            }

    async def _chat_choices(
        self, req: ChatRequest, on_start: Callable | None, rid: str | None = None
    ) -> tuple[str, list[Choice], list[int]]:
        self.check_model(req.model)
        self.counters["chat_requests"] += 1
        if req.forced_tool and not req.forced:  # the forced call's opening, in the policy's format
            req.forced = self.tool_format.forced_start(
                req.forced_tool if isinstance(req.forced_tool, str) else None,
                sum(len(m.get("tool_calls") or ()) for m in req.messages),
                self.template.opens_think(req.enable_thinking),
            )
        if req.sampling.top_logprobs and self.model is None:
            raise OpenAIError("'top_logprobs' needs the engine's model in this process", "top_logprobs")
        rid = rid or f"chatcmpl-{uuid.uuid4().hex}"
        self._check_images(req)
        forced = list(self.tokenizer.encode(req.forced)) if req.forced else []
        if req.session is None:
            prompt = self._render(req) + forced
            images = image_request(self.template, message_pngs(req.messages))
            choices = await self._generate(prompt, req.sampling, None, req, on_start, images)
            return rid, choices, prompt
        session = self.sessions.get(req.session)
        async with session.lock:  # one request of a session at a time: each extends the one before
            before = session.snapshot()
            try:
                prompt = self._session_prompt(session, req)
                session.add_context(forced)  # a forced tool-call opening: context, never trained on
                prompt += forced
                images = image_request(self.template, session.current_images)
                choices = await self._generate(prompt, req.sampling, session, req, on_start, images)
            except BaseException:  # refused, failed or cancelled (client gone): the history stays as it was
                session.restore(before)
                raise
            self.sessions.record(session, choices[0].completion, self._assistant_message(choices[0]))
        return rid, choices, prompt

    def _check_images(self, req: ChatRequest) -> None:
        """Image parts only for a policy that takes them (its template renders images)."""
        if not has_images(req.messages):
            return
        if not getattr(self.template, "renders_images", False):
            raise OpenAIError(
                f"the model `{self.model_name}` takes no images (not a vision-language policy): send text",
                "messages",
                code="images_not_supported",
            )
        if req.sampling.top_logprobs:
            raise OpenAIError("'top_logprobs' is not served with images", "top_logprobs")

    def _render(self, req: ChatRequest) -> list[int]:
        try:
            return self.template.encode_prompt(
                self.tokenizer, req.messages, tools=req.tools, enable_thinking=req.enable_thinking
            )
        except (TypeError, ValueError, KeyError) as e:
            raise OpenAIError(
                f"the messages cannot be rendered with the chat template: {e}", "messages"
            ) from e

    def _session_prompt(self, session: Session, req: ChatRequest) -> list[int]:
        try:
            return self.sessions.prompt(session, req.messages, req.tools, req.enable_thinking)
        except (TypeError, ValueError, KeyError) as e:
            raise OpenAIError(
                f"the messages cannot be rendered with the chat template: {e}", "messages"
            ) from e

    def _params(
        self, s: Sampling, prompt: list[int], session: Session | None, index: int, chat: bool
    ) -> SamplingParams:
        room = self.max_len - len(prompt)
        if room < 1:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_len} tokens; the prompt has {len(prompt)}",
                "messages" if chat else "prompt",
                code="context_length_exceeded",
            )
        temperature, top_k, top_p = s.temperature, s.top_k, s.top_p
        max_tokens = min(s.max_tokens or room, room)
        seed = None if s.seed is None else s.seed + index
        policy = session.policy if session is not None else None
        if policy is not None:  # a training session: the run's distribution, seeds and budget
            temperature, top_k, top_p = policy.temperature, policy.top_k, policy.top_p
            budget = min(policy.max_tokens_per_turn, policy.max_session_tokens - len(prompt))
            if budget < 1:
                session.limit_reached = "max_episode_tokens"
                raise OpenAIError(
                    f"session {session.id!r} has used its {policy.max_session_tokens}-token budget",
                    "messages",
                    code="session_budget_exhausted",
                )
            if policy.max_turns is not None and session.turns >= policy.max_turns:
                session.limit_reached = "max_turns"
                raise OpenAIError(
                    f"session {session.id!r} has had its {policy.max_turns} turns",
                    "messages",
                    code="session_turn_limit",
                )
            max_tokens = min(max_tokens, budget)
            seed = turn_seed(policy.seed, session.turns)
        return SamplingParams(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            max_tokens=max_tokens,
            seed=seed,
            stop_token_ids=self.stops if chat else (),
            stop=s.stop,
        )

    async def _generate(
        self,
        prompt: list[int],
        s: Sampling,
        session: Session | None,
        req: ChatRequest | None,
        on_start,
        images: dict[str, Any] | None = None,
    ) -> list[Choice]:
        """``images``: the engine's image keyword (``image_request``) for the prompt's image runs."""
        chat = req is not None
        params = [self._params(s, prompt, session, i, chat) for i in range(s.n)]
        kwargs = {"on_start": on_start} if on_start is not None else {}
        kwargs.update(images or {})
        try:
            completions = await asyncio.gather(*(self.engine.generate(prompt, p, **kwargs) for p in params))
        except ValueError as e:
            raise OpenAIError(str(e), "messages" if chat else "prompt") from e
        for c in completions:
            if c.finish_reason == "error":
                raise OpenAIError(f"the engine failed: {c.error}", None, status=500, type="server_error")
        choices = [self._choice(c, req) for c in completions]
        if s.top_logprobs:
            for choice, p in zip(choices, params, strict=True):
                choice.top = self._top_logprobs(prompt, choice.completion.tokens, p, s.top_logprobs)
        return choices

    def _visible_text(self, tokens: list[int]) -> str:
        """The text a client sees: without the stop token that ended the turn, ids past the tokenizer and
        special tokens, except those the tool-call format is written in (Kimi's call markers)."""
        ids = tokens[:-1] if tokens and tokens[-1] in self.stops else tokens
        known = int(getattr(self.tokenizer, "vocab_size", 0) or 0)
        if known:
            ids = [t for t in ids if t < known]
        if not self.kept_ids:
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        parts, run = [], []
        for t in ids:
            if t in self.kept_ids:
                parts += [self.tokenizer.decode(run, skip_special_tokens=True), self.kept_ids[t]]
                run = []
            else:
                run.append(t)
        return "".join(parts) + self.tokenizer.decode(run, skip_special_tokens=True)

    def _choice(self, completion: Completion, req: ChatRequest | None) -> Choice:
        text = (req.forced if req is not None else "") + self._visible_text(completion.tokens)
        calls: list[dict[str, Any]] = []
        content: str | None = text
        if req is not None and req.tools and req.parse_tools:
            content, calls = self.tool_format.reply(text, req.tools)
        return Choice(completion, text, calls, content)

    @staticmethod
    def _assistant_message(choice: Choice) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": choice.content}
        if choice.tool_calls:
            message["tool_calls"] = [dict(c) for c in choice.tool_calls]
        return message

    def _finish(self, choice: Choice) -> str:
        if choice.tool_calls and choice.completion.finish_reason == "stop":
            return "tool_calls"
        return FINISH.get(choice.completion.finish_reason, choice.completion.finish_reason)

    def _token_text(self, t: int) -> str:
        known = int(getattr(self.tokenizer, "vocab_size", 0) or 0)
        if known and t >= known:
            return ""
        return self.tokenizer.decode([t])

    def _logprob_entries(self, tokens, logprobs, top) -> list[dict[str, Any]]:
        out = []
        for k, (t, lp) in enumerate(zip(tokens, logprobs, strict=True)):
            text = self._token_text(t)
            entry = {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8")), "top_logprobs": []}
            if top:
                entry["top_logprobs"] = [
                    {"token": self._token_text(a), "logprob": v, "bytes": list(self._token_text(a).encode())}
                    for a, v in top[k]
                ]
            out.append(entry)
        return out

    @torch.no_grad()
    def _top_logprobs(self, prompt, tokens, params: SamplingParams, k: int) -> list[list[tuple[int, float]]]:
        """The k most likely tokens at each sampled position, under the distribution sampled from: one packed
        forward of prompt + completion (the aligned forward gives the engine's log-probs bit for bit)."""
        from rz_agents.model.logprobs import pack, sampling_logprobs

        if not tokens:
            return []
        model = self.model
        full = list(prompt) + list(tokens)
        ids, positions, seq_ids = (x.to(model.device) for x in pack([full]))
        hidden = model(ids, positions, seq_ids)[len(prompt) - 1 : len(full) - 1]
        logp = sampling_logprobs(
            model.logits(hidden),
            temperature=params.logprob_temperature,
            top_k=params.top_k,
            top_p=params.top_p,
        )
        values, indices = logp.topk(min(k, logp.shape[-1]), dim=-1)
        return [
            list(zip(i, v, strict=True))
            for i, v in zip(indices.tolist(), values.float().tolist(), strict=True)
        ]

    def _usage(self, prompt: list[int], choices: list[Choice]) -> dict[str, int]:
        generated = sum(len(c.completion.tokens) for c in choices)
        return {
            "prompt_tokens": len(prompt),
            "completion_tokens": generated,
            "total_tokens": len(prompt) + generated,
        }

    def _chat_body(
        self, req: ChatRequest, rid: str, prompt: list[int], choices: list[Choice]
    ) -> dict[str, Any]:
        out = []
        for i, choice in enumerate(choices):
            body: dict[str, Any] = {
                "index": i,
                "message": self._assistant_message(choice),
                "logprobs": None,
                "finish_reason": self._finish(choice),
            }
            if req.sampling.logprobs:
                c = choice.completion
                body["logprobs"] = {
                    "content": self._logprob_entries(c.tokens, c.logprobs.tolist(), choice.top)
                }
            if req.sampling.return_token_ids:
                body["token_ids"] = choice.completion.tokens
                body["versions"] = choice.completion.versions
            out.append(body)
        response = {
            "id": rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": out,
            "usage": self._usage(prompt, choices),
        }
        if req.sampling.return_token_ids:
            response["prompt_token_ids"] = prompt
        return response

    # ---- text completions -----------------------------------------------------------------------------
    async def complete(self, req: CompletionRequest) -> dict[str, Any]:
        """The ``/v1/completions`` body (every prompt's ``n`` completions, all in flight at once)."""
        self.check_model(req.model)
        self.counters["completion_requests"] += 1
        if req.sampling.top_logprobs and self.model is None:
            raise OpenAIError("'logprobs' > 0 needs the engine's model in this process", "logprobs")
        prompts = [self._encode_prompt(p) for p in req.prompts]
        groups = await asyncio.gather(*(self._generate(p, req.sampling, None, None, None) for p in prompts))
        choices, usage = [], {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        for prompt, group in zip(prompts, groups, strict=True):
            for key, value in self._usage(prompt, group).items():
                usage[key] += value
            for choice in group:
                c = choice.completion
                body: dict[str, Any] = {
                    "index": len(choices),
                    "text": choice.text,
                    "logprobs": None,
                    "finish_reason": FINISH.get(c.finish_reason, c.finish_reason),
                }
                if req.sampling.logprobs:
                    texts = [self._token_text(t) for t in c.tokens]
                    offsets = [sum(len(x) for x in texts[:k]) for k in range(len(texts))]
                    body["logprobs"] = {
                        "tokens": texts,
                        "token_logprobs": c.logprobs.tolist(),
                        "top_logprobs": [{self._token_text(a): v for a, v in row} for row in choice.top]
                        if choice.top
                        else None,
                        "text_offset": offsets,
                    }
                if req.sampling.return_token_ids:
                    body["prompt_token_ids"] = prompt
                    body["token_ids"] = c.tokens
                    body["versions"] = c.versions
                choices.append(body)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": usage,
        }

    def _encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt))
        vocab = int(getattr(self.engine, "vocab_size", 0) or 0)
        bad = [t for t in prompt if t < 0 or (vocab and t >= vocab)]
        if bad:
            raise OpenAIError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})", "prompt")
        return list(prompt)

    # ---- sessions -------------------------------------------------------------------------------------
    def session_record(self, session_id: str) -> dict[str, Any]:
        """A session's token history (``GET /v1/sessions/ID``); 404 if unknown."""
        session = self.sessions.sessions.get(session_id)
        if session is None:
            raise OpenAIError(f"no session {session_id!r}", "session", status=404, code="session_not_found")
        return {
            "id": session.id,
            "tokens": session.tokens,
            "loss_mask": session.mask,
            "behavior_logprobs": session.behavior,
            "versions": session.versions,
            "turns": session.turns,
            "segments": session.segments,
            "segment_starts": session.segment_starts,
            "prefix_mismatches": session.prefix_mismatches,
            "sampled_tokens_dropped": session.sampled_tokens_dropped,
        }

    def metrics(self) -> dict[str, Any]:
        """Request, session and engine counters (``GET /metrics``)."""
        stats = self.engine.stats() if hasattr(self.engine, "stats") else {}
        return {
            **self.counters,
            **{
                f"session_{k}" if not k.startswith("session") else k: v
                for k, v in self.sessions.counters.items()
            },
            "sessions_open": len(self.sessions.sessions),
            "engine": {k: v for k, v in stats.items() if isinstance(v, (int, float, bool, str)) or v is None},
        }
