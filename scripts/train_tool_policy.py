"""Train the packaged tool-calling policy ``smollm2-135m-tools``: SmolLM2-135M-Instruct with a LoRA adapter.

The adapter (rz_agents/data/policies/smollm2-135m-tools/) is taught, by supervised steps on synthetic
conversations, to call a tool the request lists (``--base smollm2-135m-instruct``; scripts/tool_policy_lora.py
has that mode).

Each conversation lists 1-2 tools (the OpenAI tool schemas a client sends), asks for something one of them
does, and has the assistant write a ``<tool_call>`` to that tool with the arguments taken from the request,
then, after the tool's result, answer in text. Twelve kinds of tool, told apart by their descriptions and
arguments. Training tools get names drawn from thousands (made-up ones, stdlib identifiers, compounds of
words; never a real tool's name) and argument values are made-up or English words and random integers, so
remembering a name or a value never pays and copying it from the tool list / the request does. The held-out
requests use the tools' real names (``get_weather``, ``add``, ...: none of them is ever a training name) and
values from pools (and integers) that no training conversation contains, so the held-out figures measure
what carries over to new tool names and values, not recall. In the ``--base`` mode 5% of the conversations
are chat without a tool, half of them listing tools anyway, and every conversation is rendered as the token
ids ``rz serve`` builds for its requests (the checkpoint's own template, tools included).

    python scripts/train_tool_policy.py --base smollm2-135m-instruct --base-figures   # the package's adapter
        # and its report.json: 40 steps of 4, ~30 min on a shared 2-core CPU; on 40 held-out requests every
        # reply a well-formed call, right tool 0.60, right tool with exact arguments 0.525, a text answer
        # after the result 1.0
    python scripts/train_tool_policy.py --base smollm2-135m-instruct --out /tmp/tools   # elsewhere
    python scripts/train_tool_policy.py --base smollm2-135m-instruct --eval-only        # re-measure OUT

Output (``--base``): OUT/adapter_config.json + adapter_model.safetensors (a PEFT directory, bf16, rewritten
every ``--save-every`` steps, so a stopped run leaves a usable policy: progress.json says which step) and
OUT/report.json: the held-out figures of the adapter merged into the base (``merged_checkpoint``, what
``rz serve smollm2-135m-tools`` serves), measured through the aligned engine with greedy decoding, and with
``--base-figures`` the base model's own figures on the same requests (the control).

Without ``--base`` the script trains the byte-level ``tool-tiny`` (a small Qwen3-shaped model from scratch;
OUT/config.yaml + OUT/final_model/), which is retired: it is not packaged, and the flags --hidden --layers
--heads --full-share --copy-share --init are its own. Every attempt learned the format and which kind of tool
a request wants, never copying (right tool and exact arguments 0.0 on held-out requests): 2 x 64 for 900
steps and 3 x 96 for 2,000 (experiments/results/tool_policy_2l64_900, tool_policy_3l96_2000), and 2 x 64 with
real identifiers and words in training and dense copy exercises (experiments/results/
tool_policy_2l64_realwords_copy). experiments/copy_check.py isolates why: such a model learns content-based
copying (an induction head, what a name or a value at a varying distance needs) only slowly, and within a
tool conversation the copy signal is a few bytes of ~300. A pretrained model copies names and values from
the start; its adapter only has to learn the format and when to call, which is why the packaged policy is
the LoRA one.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import random
import re
import sys
import time
import warnings
from collections.abc import Callable
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling module, however this file is loaded
import tool_policy_lora  # noqa: E402 - the --base (LoRA) mode

POLICIES = Path(__file__).resolve().parent.parent / "rz_agents" / "data" / "policies"
OUT = POLICIES / "tool-tiny"
LORA_OUT = POLICIES / "smollm2-135m-tools"
LORA_CHAT_TOOLS = 0.5  # --base: share of the chat conversations (5%) that list tools they do not need
# a policy's replies to conversations' two requests: (first replies, replies after the tool's result)
Answers = Callable[[list[dict[str, Any]]], tuple[list[str], list[str]]]


def shape(hidden: int, layers: int, heads: int = 4) -> dict[str, int]:
    """The model's shape: ``layers`` Qwen3 blocks ``hidden`` wide (``heads`` query heads, half as many KV
    heads)."""
    return dict(hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=hidden // heads,
                max_position_embeddings=2048)  # fmt: skip


# Held-out values: real words (none is ever a training value) and 100 of the integers 0-999
CITIES = "Paris Tokyo Lima Oslo Cairo Delhi Rome Quito Madrid Nairobi Lisbon Havana Dublin Manila".split()
WORDS = "cats jazz tea rust chess bees tides maps salt owls comets tulips lemurs glaciers violins".split()
NAMES = "ana bob cy dee eli fay gus hal oli pam quin ray sue".split()
ZONES = "UTC EST PST CET JST IST CST HST WAT".split()
LANGS = "French Spanish German Italian Turkish Greek Czech".split()
SYMBOLS = "AAPL MSFT IBM TSLA SONY ADBE".split()
PATHS = "notes.txt todo.md main.py data.csv a.json run.sh".split()
MONTHS = "Jan Feb Mar Apr May June July Aug Sep Oct Nov Dec".split()
DATES = "May 3|June 9|July 14|Aug 2|Jan 8|Feb 17|Mar 25".split("|")
HELD_OUT_INTS = frozenset(random.Random(1234).sample(range(1000), 100))
POOLS = {"city": CITIES, "query": WORDS, "to": NAMES, "subject": WORDS, "timezone": ZONES,
         "language": LANGS, "symbol": SYMBOLS, "path": PATHS, "date": DATES, "title": WORDS}  # fmt: skip
HELD_OUT_STRINGS = frozenset(v.lower() for pool in POOLS.values() for v in pool)
CONSONANTS, VOWELS = "bcdfghjklmnprstvwz", "aeiou"
NAME_PARTS = "get set find run do make check lookup fetch query call api tool info data item my".split()
# Real identifiers and English words for training names and values (so the held-out ones, real too, are in
# distribution): the lowercase function/attribute names of these stdlib modules and the words of their
# docstrings, minus every held-out name and value. The pools follow the Python version's stdlib.
POOL_MODULES = """os os.path string math json re collections itertools functools random statistics textwrap
shutil pathlib datetime time socket email.message http.client urllib.parse urllib.request csv zipfile tarfile
sqlite3 logging argparse subprocess threading decimal fractions calendar heapq bisect operator inspect ast
tokenize difflib hashlib base64 binascii struct copy pprint unicodedata locale gettext glob fnmatch tempfile
filecmp gzip bz2 lzma pickle shelve io codecs html xml.etree.ElementTree uuid ipaddress secrets platform
sysconfig types weakref enum dataclasses contextlib abc numbers cmath array queue sched select signal mmap
ssl ftplib smtplib poplib imaplib mimetypes wave colorsys asyncio concurrent.futures multiprocessing
configparser plistlib netrc zlib hmac getpass shlex traceback warnings unittest doctest timeit trace
tracemalloc gc site importlib.util pkgutil zipimport""".split()


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


def _stdlib_pools() -> tuple[list[str], list[str]]:
    """(identifiers, words) of POOL_MODULES, sorted, without any held-out tool name or value."""
    held_names = {name for kind in KINDS for name in kind.names}
    names: set[str] = set()
    words: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated attributes are read like the rest
        for module in map(importlib.import_module, POOL_MODULES):
            members = (getattr(module, a, None) for a in dir(module))
            for doc in [module.__doc__, *(getattr(m, "__doc__", None) for m in members)]:
                if isinstance(doc, str):
                    words.update(re.findall(r"\b[a-z]{2,10}\b", doc))
            snake = (a for a in dir(module) if re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", a))
            names.update(a for a in snake if len(a) <= 18)
    names = {n for n in names if len(n) > 2 and n not in held_names and n not in HELD_OUT_STRINGS}
    return sorted(names), sorted(words - HELD_OUT_STRINGS - held_names)


IDENTIFIERS, ENGLISH = _stdlib_pools()


def _pseudo_word(rng: random.Random, syllables: tuple[int, int] = (1, 3)) -> str:
    """A made-up lowercase word (consonant-vowel syllables): nothing to remember, only to copy."""
    n = rng.randint(*syllables)
    word = "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(n))
    return word + (rng.choice(CONSONANTS) if rng.random() < 0.5 else "")


def _training_word(rng: random.Random) -> str:
    """A training value's word: half real English (the stdlib's docstrings), half made up; never held out."""
    if rng.random() < 0.5:
        return rng.choice(ENGLISH)
    while (word := _pseudo_word(rng)) in HELD_OUT_STRINGS:
        pass
    return word


def tool_name(rng: random.Random) -> str:
    """A training tool's name, never a held-out (real tool's) one: a stdlib identifier (``getcwd``), a
    compound of words (``fetch_packages``) or made up (``fetch_kovi``, ``tamero``), a third each."""
    held_out = {name for kind in KINDS for name in kind.names}
    while True:
        style = rng.random()
        if style < 1 / 3:
            name = rng.choice(IDENTIFIERS)
        else:
            pick = (lambda: rng.choice(ENGLISH)) if style < 2 / 3 else (lambda: _pseudo_word(rng))
            parts = range(rng.randint(1, 3))
            name = "_".join(pick() if rng.random() < 0.6 else rng.choice(NAME_PARTS) for _ in parts)
        if name not in held_out and len(name) > 2:
            return name


def _styled(word: str, arg: str) -> str:
    """A made-up training value written the way the argument's real values are."""
    if arg in ("city", "language"):
        return word.capitalize()
    if arg in ("symbol", "timezone"):
        return word.upper()[:5]
    if arg == "path":
        return word + "." + ("txt", "md", "py", "csv", "json", "sh")[len(word) % 6]
    return word


def _value(kind: Kind, arg: str, rng: random.Random, held_out: bool) -> Any:
    """An argument value: held-out ones from the pools and HELD_OUT_INTS, training ones made up."""
    if kind.params[arg] == "integer":
        if held_out:
            return rng.choice(sorted(HELD_OUT_INTS))
        while (n := rng.randint(0, 999)) in HELD_OUT_INTS:
            pass
        return n
    if arg == "text":
        pick = (lambda: rng.choice(WORDS)) if held_out else (lambda: _training_word(rng))
        return " ".join(pick() for _ in range(rng.randint(1, 3)))
    if held_out:
        return rng.choice(POOLS[arg])
    if arg == "date":
        while (date := f"{rng.choice(MONTHS)} {rng.randint(1, 28)}") in DATES:
            pass
        return date
    while (value := _styled(_training_word(rng), arg)).lower() in HELD_OUT_STRINGS:
        pass
    return value


def _result(kind: Kind, args: dict[str, Any], rng: random.Random) -> str:
    """What the tool answers (the policy copies it into its reply)."""
    if "a" in args:
        return str(args["a"] + args["b"] if kind.names[0] == "add" else args["a"] * args["b"])
    if kind.names[0] == "word_count":
        return str(len(args["text"].split()))
    results = ("ok", "done", f"{rng.randint(1, 40)}C sunny", f"{rng.randint(10, 999)}.{rng.randint(0, 9)}",
               f"{rng.randint(0, 23)}:{rng.randint(10, 59)}", _pseudo_word(rng), "yes")  # fmt: skip
    return rng.choice(results)


def schema(name: str, kind: Kind, required: bool = False) -> dict[str, Any]:
    """The OpenAI tool schema a client lists for a tool of ``kind`` named ``name``."""
    props = {arg: {"type": typ} for arg, typ in kind.params.items()}
    parameters = {"type": "object", "properties": props}
    if required:  # many clients list the required arguments; the policy sees both forms
        parameters["required"] = list(kind.params)
    function = {"name": name, "description": kind.description, "parameters": parameters}
    return {"type": "function", "function": function}


def conversation(rng: random.Random, held_out: bool, full: bool = True) -> dict[str, Any]:
    """One tool-use conversation: tools listed, the request, the call, and (``full``) the result and the
    reply; without them the conversation is the copy task alone, and short."""
    kinds = rng.sample(range(len(KINDS)), rng.randint(1, 2))
    names = {k: (rng.choice(KINDS[k].names) if held_out else tool_name(rng)) for k in kinds}
    target = KINDS[kinds[0]]
    rng.shuffle(kinds)
    required = rng.random() < 0.5
    tools = [schema(names[k], KINDS[k], required) for k in kinds]
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
    if not full:
        messages = messages[:2]
    return {"messages": messages, "tools": tools, "name": name, "arguments": args, "result": result}


def chat(rng: random.Random, tools_share: float = 0.0) -> dict[str, Any]:
    """A conversation that needs no tool: a short text reply; ``tools_share`` of them list 1-2 tools anyway
    (training names), so a listed tool is called only when the request asks for what it does."""
    prompt, reply = rng.choice(CHATS)
    chat = {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]}
    if tools_share and rng.random() < tools_share:
        kinds = rng.sample(KINDS, rng.randint(1, 2))
        chat["tools"] = [schema(tool_name(rng), kind, rng.random() < 0.5) for kind in kinds]
    return chat


def _copy_word(rng: random.Random) -> str:
    """A training string of any style a tool call carries: identifier, word, Capitalized, UPPER, integer."""
    style = rng.randrange(6)
    if style == 0:
        return rng.choice(IDENTIFIERS)
    if style == 1:
        while (n := rng.randint(0, 999)) in HELD_OUT_INTS:
            pass
        return str(n)
    word = _training_word(rng)
    return word.capitalize() if style == 2 else word.upper()[:5] if style == 3 else word


def repeat_task(rng: random.Random) -> dict[str, Any]:
    """A dense copy exercise: the user lists 4-12 training strings, the assistant repeats them exactly.
    Every reply byte after the first is predictable only by copying, so these teach the induction heads
    (find the current bytes earlier in the context, emit what followed) that names and values need."""
    text = " ".join(_copy_word(rng) for _ in range(rng.randint(4, 12)))
    user = {"role": "user", "content": f"Repeat: {text}"}
    return {"messages": [user, {"role": "assistant", "content": text}]}


def training_set(
    n: int, seed: int, full_share: float = 1.0, copy_share: float = 0.0, chat_tools: float = 0.0
) -> list[dict[str, Any]]:
    """``n`` training conversations: ``copy_share`` repeat exercises, 5% of the rest chat (``chat_tools`` of
    those listing tools), the others tool use (``full_share`` of them with the second turn)."""
    rng = random.Random(seed)

    def one() -> dict[str, Any]:
        if rng.random() < copy_share:
            return repeat_task(rng)
        if rng.random() < 0.05:
            return chat(rng, chat_tools)
        return conversation(rng, False, full=rng.random() < full_share)

    return [one() for _ in range(n)]


def _byte_text(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message with calls as the text the byte template renders (what the policy writes)."""
    if message["role"] != "assistant" or not message.get("tool_calls"):
        return message
    rendered = ByteChatTemplate()._message(ByteTokenizer(), message)  # noqa: SLF001 - the exact bytes
    return {"role": "assistant", "content": bytes(rendered[1:-2]).decode()[len("assistant\n") :]}


def train(demos: list[dict[str, Any]], args: argparse.Namespace) -> tuple[Transformer, dict]:
    """Supervised steps (cosine LR, loss on the assistant's tokens, each turn's <|im_end|> included), the
    weights saved to OUT every ``args.save_every`` steps."""
    tok, tpl = ByteTokenizer(), ByteChatTemplate()
    rendered = [
        render_episode(tok, tpl, [_byte_text(m) for m in d["messages"]], d.get("tools")) for d in demos
    ]
    torch.manual_seed(args.seed)
    if args.init:  # continue from saved weights (their shape, not --hidden/--layers/--heads)
        model = load_hf_checkpoint(args.init, kernels="standard").train().requires_grad_(True)
    else:
        config = ModelConfig.tiny("qwen3", **shape(args.hidden, args.layers, args.heads))
        model = Transformer(config, kernels="standard")
        model.reset_parameters(std=0.02, seed=args.seed)
    torch.set_num_threads(args.threads)
    cfg = WarmStartConfig(epochs=1, batch_size=args.batch, lr=args.lr, warmup_steps=50, seed=args.seed)
    t0 = time.perf_counter()

    def on_step(step: int, total: int, loss: float) -> None:
        if step % 10 == 0:
            print(f"step {step}/{total} loss {loss:.4f} {time.perf_counter() - t0:.0f}s", flush=True)
        if step % args.save_every == 0 and step < total:
            save_hf_checkpoint(model, args.out / "final_model")
            saved = {"saved_step": step, "steps": total, "loss": loss, "wall_s": time.perf_counter() - t0}
            args.out.joinpath("progress.json").write_text(json.dumps(saved) + "\n")

    stats = supervised_warm_start(model, rendered[: args.steps * args.batch], cfg, on_step=on_step)
    return model, stats


async def _answers(engine: RZEngine, prompts: list[list[int]]) -> list[str]:
    tok, tpl = ByteTokenizer(), ByteChatTemplate()
    # the turn ends at <|im_end|> as `rz serve` ends it (without the stop ids the engine decoded past it,
    # and skip_special_tokens hid where the model had stopped: the earlier "does not stop" reading)
    stops = tuple(tpl.stop_token_ids(tok))
    params = SamplingParams(temperature=0.0, max_tokens=100, stop_token_ids=stops)  # a call is <= ~90 bytes
    outs = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    return [tok.decode(o.tokens, skip_special_tokens=True) for o in outs]


def _written_call(text: str) -> dict[str, Any] | None:
    """The call ``text`` writes when it is one ``<tool_call>`` block of JSON with a name and arguments."""
    body = text.strip().removeprefix("<tool_call>").removesuffix("</tool_call>")
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    named = isinstance(call, dict) and isinstance(call.get("name"), str)
    return call if named and isinstance(call.get("arguments"), dict) else None


def unseen_training_style(n: int, seed: int, training: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``n`` conversations drawn as training ones are, whose tool names and string values no conversation of
    ``training`` contains: the in-distribution copy test (does the model copy at all?)."""
    seen = {t["function"]["name"] for c in training for t in c.get("tools", ())}
    seen |= {v for c in training for v in c.get("arguments", {}).values() if isinstance(v, str)}
    rng, out = random.Random(seed + 2), []
    while len(out) < n:
        c = conversation(rng, held_out=False)
        strings = {v for v in c["arguments"].values() if isinstance(v, str)}
        if not ({t["function"]["name"] for t in c["tools"]} | strings) & seen:
            out.append(c)
    return out


def byte_answers(directory: Path, held: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(first replies, replies after the tool's result) of the byte-level model at ``directory`` to ``held``,
    through the aligned engine (greedy)."""
    tok, tpl = ByteTokenizer(), ByteChatTemplate()
    model = load_hf_checkpoint(directory, kernels="aligned").eval().requires_grad_(False)
    n = len(held)
    config = EngineConfig(max_running=n, max_len=2048, max_batch_tokens=8192)  # one wave per turn
    engine = RZEngine(model, config, decode=tok.decode)
    first = [tpl.encode_prompt(tok, c["messages"][:1], tools=c["tools"]) for c in held]
    second = [tpl.encode_prompt(tok, c["messages"][:3], tools=c["tools"]) for c in held]
    return asyncio.run(_answers(engine, first)), asyncio.run(_answers(engine, second))


def score(held: list[dict[str, Any]], calls: list[str], replies: list[str]) -> dict[str, Any]:
    """The figures of the replies to ``held``'s requests: ``calls`` to the first request (the tools and the
    question), ``replies`` to the second (the history with the right call and the tool's result)."""
    n = len(held)
    formed = keys = valid = right = exact = answered = quoted = 0
    for c, text, reply in zip(held, calls, replies, strict=True):
        written = _written_call(text)
        formed += written is not None
        keys += written is not None and written["arguments"].keys() == c["arguments"].keys()
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
        "well_formed_call_share": formed / n,  # the format, whatever the name (a listed tool or not)
        "right_argument_names_share": keys / n,  # the target tool's argument names, whatever the values
        "valid_call_share": valid / n,  # a call of a listed tool that parses
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


def write_config(out: Path, model_shape: dict[str, int]) -> None:
    """The run-shaped config beside final_model: the tokenizer and model shape ``rz serve`` builds."""
    shape = "\n".join(f"    {k}: {v}" for k, v in model_shape.items())
    out.joinpath("config.yaml").write_text(
        "# The packaged tool-calling policy (scripts/train_tool_policy.py wrote this and final_model/):\n"
        "# `rz serve tool-tiny`. The byte tokenizer has no files: this config names it.\n"
        'description: "tool-tiny: a small byte-level policy that calls the tools a request lists"\n'
        "tokenizer: byte\nnum_threads: 1\nmodel:\n  model_type: qwen3\n  kernels: aligned\n  dtype: float32\n"
        f"  tiny_overrides:\n{shape}\nengine:\n  max_running: 32\n  max_len: 2048\n  max_batch_tokens: 4096\n"
    )


def measure(
    out: Path,
    answer: Answers,
    args: argparse.Namespace,
    extra: dict[str, Any],
    training: list[dict[str, Any]],
) -> dict[str, Any]:
    """Held-out figures of ``answer`` (a policy's replies) into OUT/report.json (beside what ``extra`` says of
    training), and the same figures on unseen training-style conversations (``in_distribution``)."""
    rng = random.Random(args.seed + 1)
    held = [conversation(rng, held_out=True) for _ in range(args.held_out)]
    report = {**extra, **score(held, *answer(held))}
    unseen = unseen_training_style(args.held_out, args.seed, training)
    inside = score(unseen, *answer(unseen))
    report["in_distribution"] = {k: v for k, v in inside.items() if k != "examples"}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "examples"}, indent=2))
    return report


def _arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help=f"default: {OUT} ({LORA_OUT} with --base)")
    p.add_argument("--steps", type=int, default=None, help="SFT steps (default 900; 40 with --base)")
    p.add_argument("--batch", type=int, default=None, help="conversations per step (8; 4 with --base)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (6e-3; 2e-3 with --base)")
    p.add_argument("--held-out", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=64, help="model width")
    p.add_argument("--layers", type=int, default=2, help="model depth")
    p.add_argument("--heads", type=int, default=4, help="query heads (head_dim = hidden / heads)")
    p.add_argument(
        "--full-share",
        type=float,
        default=1.0,
        help="share of tool conversations with the second turn (the rest end at the call)",
    )
    p.add_argument("--copy-share", type=float, default=0.0, help="share of repeat (copy) exercises")
    p.add_argument("--init", type=Path, default=None, help="start from these saved weights (a final_model)")
    # one thread: on this machine's two shared cores a second thread made each step 2-3x slower
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--save-every", type=int, default=None, help="steps between saved weights (100; 10)")
    p.add_argument(
        "--eval-only",
        action="store_true",
        help="only measure what OUT holds (e.g. a stopped run's last save)",
    )
    tool_policy_lora.add_arguments(p)
    args = p.parse_args()
    lora = args.base is not None
    defaults = {"out": LORA_OUT if lora else OUT, "steps": 40 if lora else 900, "batch": 4 if lora else 8,
                "lr": 2e-3 if lora else 6e-3, "save_every": 10 if lora else 100}  # fmt: skip
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def byte_main(args: argparse.Namespace) -> None:
    """The byte-level ``tool-tiny`` run (retired: see the module docstring)."""
    t0 = time.perf_counter()
    run = {"seed": args.seed, "batch": args.batch, "lr": args.lr, "full_share": args.full_share,
           "copy_share": args.copy_share, "init": str(args.init) if args.init else None,
           "shape": shape(args.hidden, args.layers, args.heads)}  # fmt: skip
    training = training_set(args.steps * args.batch, args.seed, args.full_share, args.copy_share)
    answer: Answers = lambda held: byte_answers(args.out / "final_model", held)  # noqa: E731
    if args.eval_only:  # the weights of the last save: progress.json says which step
        progress = args.out / "progress.json"
        saved = json.loads(progress.read_text()) if progress.is_file() else {}
        measure(args.out, answer, args, {"train": {**run, **saved}}, training)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    write_config(args.out, run["shape"])
    model, stats = train(training, args)
    save_hf_checkpoint(model, args.out / "final_model")
    extra = {"train": {**run, **stats}, "wall_s": time.perf_counter() - t0}
    report = measure(args.out, answer, args, extra, training)
    report["size_bytes"] = sum(f.stat().st_size for f in (args.out / "final_model").iterdir())
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")


def lora_main(args: argparse.Namespace) -> None:
    """The ``--base`` run: a LoRA adapter on a pretrained chat model (scripts/tool_policy_lora.py)."""
    t0 = time.perf_counter()
    run = {"base": args.base, "seed": args.seed, "steps": args.steps, "batch": args.batch, "lr": args.lr,
           "warmup": args.warmup, "lora_rank": args.lora_rank, "lora_alpha": args.lora_alpha,
           "full_share": args.full_share, "chat_tools_share": LORA_CHAT_TOOLS}  # fmt: skip
    training = training_set(args.steps * args.batch, args.seed, args.full_share, chat_tools=LORA_CHAT_TOOLS)
    stats: dict[str, Any] = {}
    if args.eval_only:  # the adapter of the last save: progress.json says which step
        progress = args.out / "progress.json"
        stats = json.loads(progress.read_text()) if progress.is_file() else {}
    else:
        _, stats = tool_policy_lora.train_lora(training, args)
    merged = tool_policy_lora.merged(args)
    answer: Answers = lambda held: tool_policy_lora.answers(merged, held)  # noqa: E731
    extra = {"train": {**run, **stats}, "train_wall_s": stats.get("wall_s"),
             "adapter_bytes": (args.out / tool_policy_lora.WEIGHTS_NAME).stat().st_size}  # fmt: skip
    report = measure(args.out, answer, args, extra, training)
    if args.base_figures:  # the negative control: the base model on the same held-out requests
        rng = random.Random(args.seed + 1)
        held = [conversation(rng, held_out=True) for _ in range(args.held_out)]
        base = score(held, *tool_policy_lora.answers(tool_policy_lora.resolve_checkpoint(args.base), held))
        report["base_model"] = {k: v for k, v in base.items() if k != "examples"}
        report["base_model"]["examples"] = base["examples"][:2]
        (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps({"base_model": report["base_model"]}, indent=2))
    print(f"total wall {time.perf_counter() - t0:.0f}s")


def main() -> None:
    args = _arguments()
    torch.set_num_threads(args.threads)
    (lora_main if args.base is not None else byte_main)(args)


if __name__ == "__main__":
    main()
