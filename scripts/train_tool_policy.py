"""Train the packaged tool-calling policy ``tool-tiny`` (rz_agents/data/policies/tool-tiny/): a small
byte-level Qwen3-shaped model taught, by supervised steps on synthetic conversations, to call a tool the
request lists.

Each conversation lists 1-2 tools in the system prompt the way the byte chat template advertises them
(``tools: [...]``, the OpenAI tool schemas a client sends), asks for something one of them does, and has the
assistant write a ``<tool_call>`` to that tool with the arguments taken from the request, then, after the
tool's result, answer in text. Twelve kinds of tool, each under a few names; one name per kind and every
argument value in the held-out set are never seen in training, so the held-out figures measure what carries
over to new tool names and values, not recall.

    python scripts/train_tool_policy.py                   # writes the package's policy and its report
    python scripts/train_tool_policy.py --out /tmp/tt     # elsewhere (seeded: same weights, same torch build)

Output: OUT/config.yaml (tokenizer and shape, what ``rz serve tool-tiny`` reads), OUT/final_model/
(config.json + model.safetensors) and OUT/report.json (the held-out figures, measured through the aligned
engine with greedy decoding). The name ``tool-tiny`` goes into rz_agents/model/packaged.py's PACKAGED_MODELS
once a run's report shows usable calls: the defaults here (260 steps of 8 conversations, a 64-wide model,
what this machine's shared CPUs allowed) do not get there yet: greedy calls have the format but not the
right names or values, and the turn does not stop after ``</tool_call>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rz_agents.engine import EngineConfig, RZEngine
from rz_agents.engine.params import SamplingParams
from rz_agents.envs.tool_calls import parse_tool_calls
from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.checkpoint import load_hf_checkpoint, save_hf_checkpoint
from rz_agents.rollout.byte_chat import ByteChatTemplate, ByteTokenizer
from rz_agents.warmstart.episodes import render_episode
from rz_agents.warmstart.sft import WarmStartConfig, supervised_warm_start

OUT = Path(__file__).resolve().parent.parent / "rz_agents" / "data" / "policies" / "tool-tiny"
SHAPE = dict(
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
)

# Value pools: the first part trains, the rest is held out (never in a training conversation)
CITIES = "Paris Tokyo Lima Oslo Cairo Delhi Rome Quito Dakar Hanoi Perth Kyiv Seoul Bern Accra Riga".split()
CITIES += "Madrid Nairobi Lisbon Havana Dublin Manila Sofia Tunis".split()
WORDS = "cats jazz tea rust chess bees tides maps salt owls kites moss opals figs yaks".split()
WORDS += "comets tulips lemurs glaciers violins".split()
NAMES = "ana bo cy dee eli fay gus hal ivy jon kim lu max ned".split() + "oli pam quin ray sue".split()
ZONES = "UTC EST PST CET JST IST AEST MSK GMT EET".split() + "CST HST WAT".split()
LANGS = "French Spanish German Italian Dutch Polish Swedish".split() + "Turkish Greek Czech".split()
SYMBOLS = "AAPL MSFT IBM ORCL SAP INTC AMD NVDA".split() + "TSLA SONY ADBE".split()
PATHS = "notes.txt todo.md main.py data.csv README log.txt setup.cfg".split() + "a.json run.sh".split()
DATES = "May 3|June 9|July 14|Aug 2|Sep 21|Oct 5|Nov 30|Dec 12".split("|") + "Jan 8|Feb 17|Mar 25".split("|")
HELD_OUT_SHARE = 0.25


@dataclass(frozen=True)
class Kind:
    """One kind of tool: its names (the last is held out), description, arguments and conversation."""

    names: tuple[str, ...]
    description: str
    params: dict[str, str]  # argument -> JSON type
    asks: tuple[str, ...]  # request phrasings, formatted with the arguments
    answer: str  # the reply after the result, formatted with the arguments and {result}


KINDS = (
    Kind(("get_weather", "weather", "fetch_weather"), "Current weather for a city.", {"city": "string"},
         ("What's the weather in {city}?", "Is it warm in {city} today?", "Weather for {city}, please."),
         "In {city} it is {result}."),
    Kind(("add", "sum_numbers", "plus"), "Add two integers.", {"a": "integer", "b": "integer"},
         ("What is {a} plus {b}?", "Add {a} and {b}.", "{a}+{b}?"), "{a} + {b} = {result}."),
    Kind(("multiply", "times", "mul"), "Multiply two integers.", {"a": "integer", "b": "integer"},
         ("What is {a} times {b}?", "Multiply {a} by {b}.", "{a}*{b}?"), "{a} * {b} = {result}."),
    Kind(("search_web", "web_search", "search"), "Search the web.", {"query": "string"},
         ("Search the web for {query}.", "Look up {query} online.", "Find pages about {query}."),
         "Top result: {result}."),
    Kind(("send_email", "email", "mail_to"), "Send an email.", {"to": "string", "subject": "string"},
         ("Email {to} about {subject}.", "Send {to} a mail with subject {subject}."),
         "Sent to {to}: {result}."),
    Kind(("get_time", "current_time", "clock"), "The time in a timezone.", {"timezone": "string"},
         ("What time is it in {timezone}?", "Current time in {timezone}?"), "It is {result} {timezone}."),
    Kind(("translate", "translate_text", "to_language"), "Translate text.",
         {"text": "string", "language": "string"},
         ("Translate {text} to {language}.", "How do you say {text} in {language}?"),
         "In {language}: {result}."),
    Kind(("get_stock_price", "stock_price", "quote"), "A stock's price.", {"symbol": "string"},
         ("What is {symbol} trading at?", "Price of {symbol} stock?"), "{symbol} is at {result}."),
    Kind(("set_timer", "timer", "start_timer"), "Set a timer in minutes.", {"minutes": "integer"},
         ("Set a timer for {minutes} minutes.", "Timer: {minutes} min."), "Timer set: {result}."),
    Kind(("read_file", "cat_file", "open_file"), "Read a file.", {"path": "string"},
         ("Show me {path}.", "What is in {path}?", "Read the file {path}."), "{path} says: {result}"),
    Kind(("create_event", "add_event", "schedule"), "Add a calendar event.",
         {"title": "string", "date": "string"},
         ("Schedule {title} on {date}.", "Put {title} in my calendar for {date}."),
         "{title} is booked for {date} ({result})."),
    Kind(("word_count", "count_words", "wc"), "Count the words of a text.", {"text": "string"},
         ("How many words in: {text}", "Count the words of {text}"), "{result} words."),
)  # fmt: skip

CHATS = (("Hi", "Hello! How can I help?"), ("Say hi.", "Hi!"), ("Thanks!", "You are welcome."))


def _split(pool: list[str], held_out: bool) -> list[str]:
    cut = len(pool) - max(1, round(len(pool) * HELD_OUT_SHARE))
    return pool[cut:] if held_out else pool[:cut]


def _value(kind: Kind, arg: str, rng: random.Random, held_out: bool) -> Any:
    """An argument value: integers from disjoint ranges, strings from disjoint pools."""
    if kind.params[arg] == "integer":
        return rng.randint(70, 99) if held_out else rng.randint(0, 69)
    pools = {"city": CITIES, "query": WORDS, "to": NAMES, "subject": WORDS, "timezone": ZONES,
             "language": LANGS, "symbol": SYMBOLS, "path": PATHS, "date": DATES, "title": WORDS}  # fmt: skip
    if arg == "text":
        return " ".join(rng.choice(_split(WORDS, held_out)) for _ in range(rng.randint(1, 3)))
    return rng.choice(_split(pools[arg], held_out))


def _result(kind: Kind, args: dict[str, Any], rng: random.Random) -> str:
    """What the tool answers (the policy copies it into its reply)."""
    if "a" in args:
        return str(args["a"] + args["b"] if kind.names[0] == "add" else args["a"] * args["b"])
    if kind.names[0] == "word_count":
        return str(len(args["text"].split()))
    results = ("ok", "done", f"{rng.randint(1, 40)}C sunny", f"{rng.randint(10, 99)}.5", "yes", "12:30")
    return rng.choice(results)


def schema(name: str, kind: Kind) -> dict[str, Any]:
    """The OpenAI tool schema a client lists for a tool of ``kind`` named ``name``."""
    props = {arg: {"type": typ} for arg, typ in kind.params.items()}
    parameters = {"type": "object", "properties": props}
    function = {"name": name, "description": kind.description, "parameters": parameters}
    return {"type": "function", "function": function}


def conversation(rng: random.Random, held_out: bool) -> dict[str, Any]:
    """One tool-use conversation: tools listed, the request, the call, the result, the reply."""
    kinds = rng.sample(range(len(KINDS)), rng.randint(1, 2))
    names = {k: (KINDS[k].names[-1] if held_out else rng.choice(KINDS[k].names[:-1])) for k in kinds}
    target = KINDS[kinds[0]]
    rng.shuffle(kinds)
    tools = [schema(names[k], KINDS[k]) for k in kinds]
    args = {arg: _value(target, arg, rng, held_out) for arg in target.params}
    result = _result(target, args, rng)
    name = names[KINDS.index(target)]
    call = {"id": "call_0", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    messages = [
        {"role": "user", "content": rng.choice(target.asks).format(**args)},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": result},
        {"role": "assistant", "content": target.answer.format(**args, result=result)},
    ]
    return {"messages": messages, "tools": tools, "name": name, "arguments": args, "result": result}


def chat(rng: random.Random) -> dict[str, Any]:
    """A conversation without tools: a short text reply."""
    prompt, reply = rng.choice(CHATS)
    return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]}


def training_set(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [chat(rng) if rng.random() < 0.05 else conversation(rng, held_out=False) for _ in range(n)]


def _byte_text(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message with calls as the text the byte template renders (what the policy writes)."""
    if message["role"] != "assistant" or not message.get("tool_calls"):
        return message
    rendered = ByteChatTemplate()._message(ByteTokenizer(), message)  # noqa: SLF001 - the exact bytes
    return {"role": "assistant", "content": bytes(rendered[1:-2]).decode()[len("assistant\n") :]}


def _log(step: int, total: int, loss: float) -> None:
    if step % 10 == 0:
        print(f"step {step}/{total} loss {loss:.4f}", flush=True)


def train(demos: list[dict[str, Any]], steps_cap: int, seed: int, threads: int) -> tuple[Transformer, dict]:
    tok, tpl = ByteTokenizer(), ByteChatTemplate()
    rendered = [
        render_episode(tok, tpl, [_byte_text(m) for m in d["messages"]], d.get("tools")) for d in demos
    ]
    torch.manual_seed(seed)
    model = Transformer(ModelConfig.tiny("qwen3", **SHAPE), kernels="standard")
    model.reset_parameters(std=0.02, seed=seed)
    torch.set_num_threads(threads)
    cfg = WarmStartConfig(epochs=1, batch_size=8, lr=8e-3, warmup_steps=20, seed=seed)
    stats = supervised_warm_start(model, rendered[: steps_cap * cfg.batch_size], cfg, on_step=_log)
    return model, stats


async def _answers(engine: RZEngine, prompts: list[list[int]]) -> list[str]:
    tok = ByteTokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=120)
    outs = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    return [tok.decode(o.tokens, skip_special_tokens=True) for o in outs]


def evaluate(directory: Path, n: int, seed: int) -> dict[str, Any]:
    """Held-out figures through the aligned engine (greedy): the call, then the reply after the result."""
    tok, tpl = ByteTokenizer(), ByteChatTemplate()
    model = load_hf_checkpoint(directory, kernels="aligned").eval().requires_grad_(False)
    config = EngineConfig(max_running=32, max_len=2048, max_batch_tokens=4096)
    engine = RZEngine(model, config, decode=tok.decode)
    rng = random.Random(seed + 1)
    held = [conversation(rng, held_out=True) for _ in range(n)]
    first = [tpl.encode_prompt(tok, c["messages"][:1], tools=c["tools"]) for c in held]
    second = [tpl.encode_prompt(tok, c["messages"][:3], tools=c["tools"]) for c in held]
    calls, replies = asyncio.run(_answers(engine, first)), asyncio.run(_answers(engine, second))
    valid = right = exact = answered = quoted = 0
    for c, text, reply in zip(held, calls, replies, strict=True):
        turn = parse_tool_calls(text, c["tools"])  # the OpenAI schemas are the env's ToolSpec
        if turn.calls and not turn.errors:
            valid += 1
            right += turn.calls[0].name == c["name"]
            exact += turn.calls[0].name == c["name"] and turn.calls[0].arguments == c["arguments"]
        if reply.strip() and "<tool_call>" not in reply:
            answered += 1
            quoted += c["result"] in reply
    return {
        "held_out_requests": n,
        "valid_call_share": valid / n,
        "right_tool_share": right / n,
        "exact_arguments_share": exact / n,
        "text_reply_after_result_share": answered / n,
        "reply_quotes_result_share": quoted / n,
        "examples": [
            {"tools": [t["function"]["name"] for t in c["tools"]], "request": c["messages"][0]["content"],
             "call": text, "reply_after_result": reply}
            for c, text, reply in zip(held[:5], calls, replies, strict=False)
        ],
    }  # fmt: skip


def write_config(out: Path) -> None:
    """The run-shaped config beside final_model: the tokenizer and model shape ``rz serve`` builds."""
    shape = "\n".join(f"    {k}: {v}" for k, v in SHAPE.items())
    out.joinpath("config.yaml").write_text(
        "# The packaged tool-calling policy (scripts/train_tool_policy.py wrote this and final_model/):\n"
        "# `rz serve tool-tiny`. The byte tokenizer has no files: this config names it.\n"
        'description: "tool-tiny: a small byte-level policy that calls the tools a request lists"\n'
        "tokenizer: byte\nnum_threads: 1\nmodel:\n  model_type: qwen3\n  kernels: aligned\n  dtype: float32\n"
        f"  tiny_overrides:\n{shape}\nengine:\n  max_running: 32\n  max_len: 2048\n  max_batch_tokens: 4096\n"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--demos", type=int, default=2080)
    p.add_argument("--steps", type=int, default=260, help="at most this many SFT steps (8 conversations)")
    p.add_argument("--held-out", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    t0 = time.perf_counter()
    model, stats = train(training_set(args.demos, args.seed), args.steps, args.seed, args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    write_config(args.out)
    save_hf_checkpoint(model, args.out / "final_model")
    report = {"train": {**stats, "seed": args.seed, "shape": SHAPE}}
    report.update(evaluate(args.out / "final_model", args.held_out, args.seed))
    report["size_bytes"] = sum(f.stat().st_size for f in (args.out / "final_model").iterdir())
    report["wall_s"] = time.perf_counter() - t0
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "examples"}, indent=2))


if __name__ == "__main__":
    main()
