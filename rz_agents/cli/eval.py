"""``rz eval``: math benchmarks (avg@k, pass@k) and OSWorld.

* ``rz eval [CONFIG] --checkpoint DIR --benchmark aime24 [--k 16] [--tool] ...``: sample k answers per
  problem and print the per-problem table and the metrics (``--json`` prints the results JSON,
  ``--out FILE`` writes it). CONFIG is a YAML file whose ``eval:`` section sets the same fields;
  flags given on the command line override it.
* ``rz eval RUN/config.yaml --checkpoint DIR [--tasks FILE] [--k 4] [--threshold 1.0]``: a training config
  (it has ``env:``) and no benchmark (``--benchmark`` or ``eval.benchmark``): the run's own env on its eval
  tasks (``env.eval_tasks`` or ``--tasks``), with the env's prompt, tools and reward
  (rz_agents.eval.env_eval).
* ``rz eval RUN`` (or ``RUN/final_model``, or ``RUN/config.yaml``): the run's config and its final_model
  (rz_agents/cli/run_dir.py).
* ``rz eval osworld --tasks DIR|FILE ...``: the OSWorld success table (the same command as
  ``rz osworld eval``; its options are defined once, in ``rz_agents.cli.osworld``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rz_agents.cli.flags import add_renamed_flag
from rz_agents.eval.math_config import BENCHMARKS

PRODUCTION_NOTE = (
    "Production settings (AIME): --k 16..64 --temperature 0.6 --top-p 0.95, --max-tokens large enough "
    "for the model's reasoning (e.g. 32768 for Qwen3-4B with thinking; the KV cache then needs "
    "--kv-cache-gb or fewer --max-running). Report avg@k (the mean of "
    "the 0/1 reward over the k samples of each problem, then over problems) with its k."
)

# flags whose values map onto MathEvalConfig fields of the same name
_CONFIG_FLAGS = (
    "checkpoint",
    "benchmark",
    "k",
    "tool",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "max_turns",
    "max_context",
    "limit",
    "seed",
    "max_running",
    "kv_cache_gb",
    "num_threads",
    "kernels",
    "dtype",
    "thinking",
    "save_text",
    "prompt_style",
)


def add_parser(subparsers: Any) -> None:
    """Register ``eval`` (math benchmarks, and ``rz eval osworld``)."""
    parser = subparsers.add_parser(
        "eval",
        help="evaluate a checkpoint: math avg@k / pass@k (aime24, ..., gsm8k) or OSWorld",
        description="Evaluate a checkpoint on a math benchmark (avg@k, pass@k, per-problem table), "
        "or run `rz eval osworld --tasks DIR --policy ...`.",
        epilog=PRODUCTION_NOTE,
    )
    parser.add_argument(
        "config",
        nargs="?",
        help="a run directory or its final_model (the run's config.yaml and weights), or a YAML file (or a "
        "packaged config's name) whose eval: section gives the settings below (flags override it) and whose "
        "tokenizer: is the one the checkpoint was trained with; or the word 'osworld' for the OSWorld "
        "evaluation",
    )
    m = parser.add_argument_group("math benchmarks")
    _add_benchmark_arguments(m)
    _add_generation_arguments(m)
    _add_env_eval_arguments(parser)

    from rz_agents.cli.osworld import add_eval_arguments

    add_eval_arguments(
        parser.add_argument_group("osworld (rz eval osworld ...; the same options as rz osworld eval)")
    )

    if "--json" not in parser._option_string_actions:
        parser.add_argument(
            "--json", action="store_true", help="print the results as JSON instead of the table"
        )
    parser.add_argument("--out", help="also write the results JSON to this file")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def _add_benchmark_arguments(m: Any) -> None:
    """What is evaluated: the checkpoint (and adapter), the benchmark, samples per problem, the tool."""
    m.add_argument(
        "--checkpoint",
        help="HF checkpoint directory (tokenizer.json there, else Qwen3's), or a packaged model's name "
        "(smollm2-135m-instruct)",
    )
    m.add_argument(
        "--adapter",
        metavar="DIR",
        help="a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) to load on "
        "--checkpoint: base + adapter, unmerged (also for a training config's env)",
    )
    m.add_argument(
        "--benchmark",
        help=f"{' | '.join(BENCHMARKS)} (word_problems: 200 generated GSM8K-style problems held out from "
        "training), or a JSONL/JSON file of question/answer records",
    )
    m.add_argument("--k", type=int, help="samples per problem (default 16; production AIME: 16..64)")
    m.add_argument(
        "--tool",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="offer the sandboxed Python tool (multi-turn episodes); default: no tool, "
        "direct \\boxed{} answer",
    )


def _add_generation_arguments(m: Any) -> None:
    """How the answers are generated (sampling, limits, engine) and what the results keep."""
    m.add_argument("--temperature", type=float, help="sampling temperature (default 0.6; 0 = greedy)")
    m.add_argument("--top-p", type=float, help="nucleus sampling (default 0.95)")
    m.add_argument("--top-k", type=int, help="top-k sampling (default 0 = off)")
    m.add_argument("--max-tokens", type=int, help="tokens per answer, per turn with the tool (default 4096)")
    m.add_argument("--max-turns", type=int, help="turns per tool episode (default 4)")
    m.add_argument("--max-context", type=int, help="token budget of a tool episode (default: derived)")
    m.add_argument("--limit", type=int, help="evaluate only the first N problems")
    m.add_argument("--seed", type=int, help="sampling seed (default 0)")
    m.add_argument("--max-running", type=int, help="sequences generated at once (default 32)")
    add_renamed_flag(m, "--num-slots", "--max-running", type=int)
    m.add_argument(
        "--kv-cache-gb",
        type=float,
        help="KV-cache memory budget (the pages; --max-running caps the sequences)",
    )
    m.add_argument("--num-threads", type=int, help="torch threads for the engine (default: torch's)")
    m.add_argument("--kernels", choices=("aligned", "standard"), help="op set (default aligned)")
    m.add_argument("--dtype", choices=("float32", "bfloat16"), help="model dtype (default: the checkpoint's)")
    m.add_argument(
        "--thinking",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Qwen3 thinking mode (default on; --no-thinking puts an empty think block in the prompt)",
    )
    m.add_argument(
        "--save-text",
        action="store_true",
        default=None,
        help="keep each sample's text in the results JSON (math benchmarks and env evals)",
    )
    m.add_argument(
        "--prompt-style",
        choices=("default", "compact"),
        help="tool episodes' prompt: default (system prompt + tool schema + answer instruction) or "
        "compact (the question alone; for policies trained on compact prompts, e.g. smollm2-gsm8k)",
    )
    m.add_argument("--rows", type=int, default=None, help="print at most N table rows")


def _add_env_eval_arguments(parser: Any) -> None:
    """The run's own env (CONFIG is a training config and no benchmark is named)."""
    e = parser.add_argument_group(
        "the run's own env (CONFIG is a training config, e.g. RUN/config.yaml, and no benchmark is named); "
        "--tasks FILE (JSONL/JSON/Parquet or a packaged name) replaces env.eval_tasks, and --k, "
        "--temperature, --top-p, --top-k, --seed, --limit, --max-running, --num-threads, --kernels, "
        "--dtype apply; sampling defaults to the run's rollout settings, turn and token limits are the run's"
    )
    e.add_argument("--threshold", type=float, default=None, help="success means reward >= this (default 1.0)")
    e.add_argument(
        "--num-tasks",
        type=int,
        default=None,
        help="with no task list, evaluate N tasks the env draws itself (seeded)",
    )


def run(args: argparse.Namespace) -> int:
    """Dispatch: OSWorld or a math benchmark. Exit 2 for a bad config, checkpoint or dataset."""
    if args.config == "osworld":
        return _run_osworld(args)
    if args.config:
        from rz_agents.cli.run_dir import NotARun, default_checkpoint, resolve_run_target

        try:
            run = resolve_run_target(args.config)  # RUN or RUN/final_model: the run's config and weights
        except NotARun as exc:
            print(f"rz eval: error: {exc}", file=sys.stderr)
            return 2
        if run is not None:
            args.config, args.checkpoint = str(run.config), args.checkpoint or run.checkpoint
        args.checkpoint = args.checkpoint or default_checkpoint(args.config)  # RUN/config.yaml's final_model
        if args.checkpoint is not None:
            args.checkpoint = str(args.checkpoint)
    if _is_env_eval(args):
        from rz_agents.cli.eval_env import run_env

        return run_env(args)
    return _run_math(args)


def _is_env_eval(args: argparse.Namespace) -> bool:
    """A training config (it has ``env:``) and no benchmark named: evaluate the run's own env."""
    from rz_agents.cli.configs import resolve_config
    from rz_agents.config_io import ConfigError, read_yaml_mapping

    if not args.config or args.benchmark:
        return False
    try:
        doc = read_yaml_mapping(resolve_config(args.config))
    except ConfigError:
        return False  # the math path reports it
    section = doc.get("eval")
    return "env" in doc and not (isinstance(section, dict) and section.get("benchmark"))


def _run_osworld(args: argparse.Namespace) -> int:
    from rz_agents.cli.osworld import run_eval

    return run_eval(args)


def _run_math(args: argparse.Namespace) -> int:
    from rz_agents.cli.configs import resolve_config
    from rz_agents.config_io import ConfigError, read_yaml_mapping
    from rz_agents.data import DatasetError
    from rz_agents.eval.math_config import load_eval_config

    overrides = {name: getattr(args, name) for name in _CONFIG_FLAGS}
    tokenizer = None  # a training config's tokenizer: the one its checkpoints were trained with
    try:
        path = resolve_config(args.config) if args.config else None
        config = load_eval_config(path, overrides)
        if path is not None:
            tokenizer = read_yaml_mapping(path).get("tokenizer")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not config.checkpoint:
        print("error: no checkpoint: pass --checkpoint DIR or set eval.checkpoint in CONFIG", file=sys.stderr)
        return 2
    if args.out:
        out_dir = Path(args.out).resolve().parent
        if not out_dir.is_dir():
            print(f"error: --out {args.out}: folder {out_dir} does not exist", file=sys.stderr)
            return 2

    from rz_agents.eval.checkpoint_policy import load_checkpoint_policy
    from rz_agents.eval.math import PromptTooLong, format_math_table, run_math_eval
    from rz_agents.model.checkpoint import CheckpointError

    try:
        policy = load_checkpoint_policy(
            config.checkpoint, kernels=config.kernels, dtype=config.dtype, tokenizer=tokenizer,
            adapter=args.adapter,
        )  # fmt: skip
    except (FileNotFoundError, CheckpointError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        result = _with_progress(config, policy, quiet=args.quiet, run_math_eval=run_math_eval)
    except DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except PromptTooLong as exc:
        print(f"rz eval: error: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text if args.json else format_math_table(result, max_rows=args.rows))
    samples = [s for p in result["problems"] for s in p["samples"]]
    failed = [s for s in samples if s.get("error")]
    if samples and len(failed) == len(samples):
        # nothing was measured: an avg@k of 0 would read as a score
        print(f"rz eval: error: all {len(samples)} samples failed; the first: {failed[0]['error']}",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _with_progress(config, policy, quiet: bool, run_math_eval) -> dict[str, Any]:
    """Run the evaluation under a rich progress bar on stderr (samples done / total, running accuracy)."""
    if quiet:
        return run_math_eval(config, policy)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rz_agents.data import load_dataset

    total = len(load_dataset(config.benchmark, limit=config.limit)) * config.k
    correct = 0
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("acc {task.fields[acc]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
    ) as progress:
        task = progress.add_task(f"{config.benchmark} k={config.k}", total=total, acc="-")

        def on_sample(_: int, sample) -> None:
            nonlocal correct
            correct += sample.correct
            done = progress.tasks[0].completed + 1
            progress.update(task, advance=1, acc=f"{100 * correct / done:.1f}%")

        return run_math_eval(config, policy, on_sample=on_sample)
