"""Math benchmark evaluation: k samples per problem through the engine, avg@k and pass@k.

Without the tool each sample is one direct answer to the Qwen3-format prompt (question + "put your
final answer within \\boxed{}"); with the tool each sample is a multi-turn `PythonToolEnv` episode run
by the rollout agent loop (the same code that produces training trajectories). A sample that fails
(engine refusal, env error) is recorded with its error and scored wrong; the evaluation goes on.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any

from rz_agents.data import load_dataset
from rz_agents.engine import Engine, EngineConfig, RZEngine, SamplingParams
from rz_agents.eval.checkpoint_policy import CheckpointPolicy
from rz_agents.eval.math_config import MathEvalConfig
from rz_agents.eval.math_scoring import (
    ProblemResult,
    SampleResult,
    final_answer,
    score_completion,
    summarize,
)
from rz_agents.rewards import MathVerifier, default_verifier

# Tokens allowed per tool result when the tool episode budget is derived (max_context: null).
TOOL_RESULT_ALLOWANCE = 1024
PROMPT_MARGIN = 64  # slack in case the env words its prompt slightly longer than our estimate

OnSample = Callable[[int, SampleResult], None]


def direct_messages(question: str, config: MathEvalConfig) -> list[dict[str, str]]:
    """The no-tool prompt: an optional system message, then the question and the answer instruction."""
    messages = [{"role": "user", "content": f"{question}\n{config.instruction}"}]
    if config.system_prompt:
        messages.insert(0, {"role": "system", "content": config.system_prompt})
    return messages


def decode_text(tokenizer, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """Text of sampled ids; ids past the tokenizer's vocabulary (a padded embedding's unused rows,
    which an untrained model can sample) have no text and are dropped."""
    size = tokenizer.vocab_size
    return tokenizer.decode([t for t in ids if 0 <= t < size], skip_special_tokens=skip_special_tokens)


def sample_seed(seed: int, problem: int, member: int) -> int:
    """A distinct, reproducible seed per (run seed, problem, sample)."""
    return (seed * 1_000_003 + problem * 4099 + member) % (2**31 - 1)


@dataclass(frozen=True)
class _TemplateWithThinking:
    """Passes ``enable_thinking`` to a ChatTemplate for callers (the agent loop) that do not."""

    template: Any
    enable_thinking: bool

    def encode_prompt(self, tokenizer, messages, tools=None):
        return self.template.encode_prompt(
            tokenizer, messages, tools=tools, enable_thinking=self.enable_thinking
        )

    def encode_continuation(self, tokenizer, new_messages, **kwargs):
        return self.template.encode_continuation(
            tokenizer, new_messages, enable_thinking=self.enable_thinking, **kwargs
        )

    def stop_token_ids(self, tokenizer):
        return self.template.stop_token_ids(tokenizer)


def run_math_eval(
    config: MathEvalConfig,
    policy: CheckpointPolicy,
    on_sample: OnSample | None = None,
    verifier: MathVerifier | None = None,
    engine: Engine | None = None,
) -> dict[str, Any]:
    """Evaluate ``policy`` on ``config.benchmark``; returns the results dict (summary + per-problem rows).

    ``on_sample(problem_index, sample)`` is called as each sample finishes (for a progress bar).
    ``engine``: generate with this engine instead of an RZEngine over ``policy.model`` sized from the
    prompts (e.g. a vLLM engine, or a scripted one in tests). Synchronous: it runs its own event loop.
    """
    config.validate()
    tasks = load_dataset(config.benchmark, limit=config.limit)
    if not tasks:
        raise ValueError(f"benchmark {config.benchmark!r} has no problem (limit={config.limit})")
    verifier = verifier or default_verifier()
    start = time.perf_counter()
    if config.tool:
        problems, engine = asyncio.run(_run_with_tool(config, policy, tasks, on_sample, verifier, engine))
    else:
        problems, engine = asyncio.run(_run_direct(config, policy, tasks, on_sample, verifier, engine))
    wall = time.perf_counter() - start
    summary = summarize(problems, config.k)
    generated = sum(s.tokens for p in problems for s in p.samples)
    return {
        "benchmark": config.benchmark,
        "checkpoint": config.checkpoint,
        "policy": policy.name,
        "tool": config.tool,
        "k": config.k,
        "sampling": {
            "temperature": config.temperature,
            "top_p": config.top_p,
            "top_k": config.top_k,
            "max_tokens": config.max_tokens,
            "seed": config.seed,
        },
        **summary,
        "wall_s": wall,
        "generated_tokens_per_s": generated / wall if wall > 0 else 0.0,
        "engine": _engine_stats(engine),
        "config": asdict(config),
        "problems": [p.to_dict() for p in problems],
    }


class PromptTooLong(ValueError):
    """A problem's prompt does not fit the model's positions: nothing could be measured."""


async def run_problems(
    config: MathEvalConfig,
    policy: CheckpointPolicy,
    tasks: Sequence[dict[str, str]],
    verifier: MathVerifier,
    engine: Engine,
) -> list[ProblemResult]:
    """The k samples of every task on ``engine`` (direct answers, or tool episodes with ``config.tool``), from
    inside a running event loop (the training loop's in-loop evaluation, rz_agents/eval/in_loop.py)."""
    run = _run_with_tool if config.tool else _run_direct
    problems, _ = await run(config, policy, tasks, None, verifier, engine)
    return problems


def _engine_stats(engine: Engine) -> dict[str, Any]:
    stats = getattr(engine, "stats", None)  # not part of the Engine protocol: RZEngine has it
    return dict(stats()) if callable(stats) else {}


def _sampling(config: MathEvalConfig) -> SamplingParams:
    return SamplingParams(
        temperature=config.temperature, top_p=config.top_p, top_k=config.top_k, max_tokens=config.max_tokens
    )


def _engine(config: MathEvalConfig, policy: CheckpointPolicy, max_len: int) -> RZEngine:
    engine_config = EngineConfig(
        max_running=config.max_running,
        max_len=max_len,
        num_threads=config.num_threads,
        seed=config.seed,
        eos_token_ids=tuple(policy.template.stop_token_ids(policy.tokenizer)),
        kv_cache_bytes=None if config.kv_cache_gb is None else int(config.kv_cache_gb * 2**30),
    )
    return RZEngine(policy.model, engine_config)


async def _run_direct(
    config: MathEvalConfig,
    policy: CheckpointPolicy,
    tasks: Sequence[dict[str, str]],
    on_sample: OnSample | None,
    verifier: MathVerifier,
    engine: Engine | None,
) -> tuple[list[ProblemResult], Engine]:
    tok, tpl = policy.tokenizer, policy.template
    prompts = [
        tpl.encode_prompt(tok, direct_messages(t["question"], config), enable_thinking=config.thinking)
        for t in tasks
    ]
    positions = policy.model.config.max_position_embeddings if engine is None else None
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
    if positions is not None and len(prompts[longest]) >= positions:
        raise PromptTooLong(
            f"{config.benchmark}: problem {tasks[longest]['id']}'s prompt has {len(prompts[longest])} tokens "
            f"but the model reads at most {positions} (max_position_embeddings): no sample could be scored; "
            "evaluate a model with more positions, or a benchmark of shorter problems"
        )
    # answers stop at the model's last position (finish "length") rather than failing past it
    max_len = len(prompts[longest]) + config.max_tokens + 1
    engine = engine or _engine(config, policy, min(max_len, positions or max_len))
    stops = tuple(tpl.stop_token_ids(tok))
    base = replace(_sampling(config), stop_token_ids=stops)

    async def sample(index: int, member: int) -> SampleResult:
        params = replace(base, seed=sample_seed(config.seed, index, member))
        return await _direct_sample(
            engine, prompts[index], params, tasks[index]["answer"], policy, verifier, config.save_text
        )

    problems = await _collect(tasks, config.k, sample, on_sample)
    return problems, engine


async def _collect(
    tasks: Sequence[dict[str, str]],
    k: int,
    sample: Callable[[int, int], Awaitable[SampleResult]],
    on_sample: OnSample | None,
) -> list[ProblemResult]:
    """Run ``sample(problem, member)`` for k members of every problem, all in flight at once.

    A sample that raises is recorded as failed (scored wrong, with its error); the others go on.
    """
    problems = [ProblemResult(id=t["id"], answer=t["answer"]) for t in tasks]

    async def one(index: int, member: int) -> tuple[int, SampleResult]:
        try:
            result = await sample(index, member)
        except Exception as exc:  # noqa: BLE001 - one broken sample must not end the evaluation
            result = SampleResult(answer=None, correct=False, finish="error", error=repr(exc))
        if on_sample is not None:
            on_sample(index, result)
        return index, result

    jobs = [one(i, m) for i in range(len(tasks)) for m in range(k)]
    for index, result in await asyncio.gather(*jobs):  # gather keeps submission order per problem
        problems[index].samples.append(result)
    return problems


async def _direct_sample(
    engine: Engine,
    prompt: list[int],
    params: SamplingParams,
    gold: str,
    policy: CheckpointPolicy,
    verifier: MathVerifier,
    save_text: bool = False,
) -> SampleResult:
    try:
        completion = await engine.generate(list(prompt), params)
    except ValueError as exc:
        return SampleResult(answer=None, correct=False, finish="error", error=f"engine refused: {exc}")
    if completion.finish_reason in ("error", "cancelled"):
        return SampleResult(
            answer=None,
            correct=False,
            finish="error",
            error=f"engine {completion.finish_reason}: {completion.error}",
        )
    ids = list(completion.tokens)
    if ids and ids[-1] in params.stop_token_ids:
        ids = ids[:-1]
    text = decode_text(policy.tokenizer, ids)
    # the verifier may wait on its worker process: keep the event loop (and the engine) running
    sample = await asyncio.to_thread(score_completion, text, gold, verifier)
    sample.tokens = len(completion.tokens)
    sample.finish = completion.finish_reason
    if save_text:
        sample.text = text
    return sample


async def _run_with_tool(
    config: MathEvalConfig,
    policy: CheckpointPolicy,
    tasks: Sequence[dict[str, str]],
    on_sample: OnSample | None,
    verifier: MathVerifier,
    engine: Engine | None,
) -> tuple[list[ProblemResult], Engine]:
    from rz_agents.envs.python_tool import PythonToolEnv
    from rz_agents.envs.python_tool.env import DEFAULT_SYSTEM_PROMPT
    from rz_agents.rollout.agent_loop import EpisodeError, EpisodeLimits, EpisodeSpec, run_episode

    tok = policy.tokenizer
    template = policy.template
    if "enable_thinking" in inspect.signature(template.encode_prompt).parameters:  # not the byte template
        template = _TemplateWithThinking(template, config.thinking)
    compact = config.prompt_style == "compact"
    system_prompt = config.system_prompt or (None if compact else DEFAULT_SYSTEM_PROMPT)

    def make_env(prewarm: bool = True) -> PythonToolEnv:
        # compact: the question alone and no tool schema, as compact-trained policies saw it
        return PythonToolEnv(
            max_turns=config.max_turns,
            system_prompt=system_prompt,
            verifier=verifier,
            prompt_style=config.prompt_style,
            advertise_tools=not compact,
            prewarm=prewarm,
        )

    # the longest prompt, rendered by the env itself (no sandbox starts), sets the episode budget when
    # max_context is not given
    prompt_env = make_env(prewarm=False)
    try:
        longest = 0
        for t in tasks:
            messages, info = prompt_env.reset(options={"task": t})
            longest = max(longest, len(template.encode_prompt(tok, messages, tools=info["tools"] or None)))
    finally:
        prompt_env.close()
    budget = config.max_context or (
        longest + PROMPT_MARGIN + config.max_tokens + (config.max_turns - 1) * TOOL_RESULT_ALLOWANCE
    )
    limits = EpisodeLimits(
        max_turns=config.max_turns, max_tokens_per_turn=config.max_tokens, max_episode_tokens=budget
    )
    engine = engine or _engine(config, policy, budget + 1)
    sampling = _sampling(config)
    concurrency = config.max_running
    envs: asyncio.Queue = asyncio.Queue()
    created: list[PythonToolEnv] = []
    executor = ThreadPoolExecutor(max_workers=min(32, concurrency), thread_name_prefix="rz-eval-env")
    stops = tuple(policy.template.stop_token_ids(tok))

    async def sample(index: int, member: int) -> SampleResult:
        if envs.empty() and len(created) < concurrency:
            created.append(make_env())
            envs.put_nowait(created[-1])
        env = await envs.get()
        spec = EpisodeSpec(
            task=tasks[index], group_id=index, member=member, seed=sample_seed(config.seed, index, member)
        )
        try:
            traj = await run_episode(engine, env, template, tok, spec, sampling, limits, executor)
        except EpisodeError as exc:
            return SampleResult(answer=None, correct=False, finish="error", error=str(exc))
        finally:
            envs.put_nowait(env)
        return _tool_sample(traj, tok, stops, config.save_text)

    try:
        problems = await _collect(tasks, config.k, sample, on_sample)
    finally:
        for env in created:
            await asyncio.get_running_loop().run_in_executor(executor, env.close)
        executor.shutdown(wait=False)
    return problems, engine


def _tool_sample(traj, tokenizer, stops: Sequence[int], save_text: bool = False) -> SampleResult:
    """Score a finished tool episode: the env's reward decides; the answer is the final turn's box."""
    finish = str(traj.info.get("finish", "terminated"))
    answer = None
    if finish == "terminated":
        # the loop ends right after the answering turn: the trajectory ends with its sampled tokens
        start = len(traj.tokens)
        while start > 0 and traj.loss_mask[start - 1]:
            start -= 1
        ids = traj.tokens[start:]
        if ids and ids[-1] in stops:
            ids = ids[:-1]
        else:
            finish = "length"  # the env ended a turn the token limit cut off: it never said it was done
        answer = final_answer(decode_text(tokenizer, ids))
    # the episode after the prompt, turn markers kept so tool calls and results stay readable
    text = decode_text(tokenizer, traj.tokens[traj.loss_mask.index(True) :], False) if save_text else None
    return SampleResult(
        answer=answer,
        correct=traj.reward == 1.0,
        tokens=sum(traj.loss_mask),
        finish=finish,
        tool_turns=max(0, int(traj.info.get("turns", 1)) - 1),
        text=text,
    )


def format_math_table(result: dict[str, Any], max_rows: int | None = None) -> str:
    """The per-problem table (id, gold answer, #correct/k, most frequent answer) and the summary lines."""
    rows = result["problems"][:max_rows] if max_rows else result["problems"]

    def cell(value: Any, width: int) -> str:
        text = "-" if value is None else " ".join(str(value).split())
        return text if len(text) <= width else text[: width - 1] + "…"

    id_w = max([len("id"), *(len(cell(p["id"], 28)) for p in rows)])
    lines = [f"{'id':<{id_w}}  {'answer':<16}  {'correct':>8}  top answer", "-" * (id_w + 48)]
    for p in rows:
        frac = f"{p['num_correct']}/{p['num_samples']}"
        lines.append(
            f"{cell(p['id'], 28):<{id_w}}  {cell(p['answer'], 16):<16}  {frac:>8}  "
            f"{cell(p['top_answer'], 24)}"
        )
    if max_rows and len(result["problems"]) > max_rows:
        lines.append(f"... {len(result['problems']) - max_rows} more problems")
    mode = "python tool" if result["tool"] else "no tool"
    s = result["sampling"]
    lines += [
        "",
        f"{result['benchmark']} ({result['num_problems']} problems, k={result['k']}, {mode}, "
        f"T={s['temperature']}, top_p={s['top_p']}, max_tokens={s['max_tokens']})",
        f"avg@{result['k']} (pass@1): {100 * result['avg_at_k']:.2f}%   "
        f"pass@{result['k']}: {100 * result['pass_at_k']:.2f}%",
        f"no answer: {100 * result['no_answer_rate']:.1f}%   truncated: "
        f"{100 * result['truncated_rate']:.1f}%   failed samples: {result['num_failed']}   mean tokens: "
        f"{result['mean_tokens']:.1f}",
        f"wall: {result['wall_s']:.1f} s   ({result['generated_tokens_per_s']:.1f} generated tokens/s)",
    ]
    return "\n".join(lines)
