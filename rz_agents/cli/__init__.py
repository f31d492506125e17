"""`rz` command line: one module per subcommand in this package.

Each subcommand module defines `add_parser(subparsers)`, which registers its parser and sets
`func=run` (a callable taking the parsed namespace and returning an exit code). An exception it raises
ends the command with one error line and exit status 1 (`rz_agents.cli.failure`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rz_agents.cli.failure import run_command

# Order shown in `rz --help`. A module listed here must exist; import errors are real errors.
SUBCOMMANDS = ["train", "eval", "serve", "align_check", "bench", "osworld", "harbor"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rz",
        description="Train and evaluate tool-using LLM agents with async REINFORCE Zero "
        "on bit-aligned kernels.",
        epilog="Start here: `rz train demo --run-dir runs/demo` (about 5 minutes on 2 cores), then "
        "`rz eval runs/demo` and `rz serve runs/demo`. Guides: docs/README.md (the index; "
        "docs/training.md first); every config field: docs/config.md.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"rz_agents.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"rz_agents.cli.{name}":
                continue  # subcommand not built in this checkout
            raise
        module.add_parser(sub)
    for subparser in sub.choices.values():
        subparser.add_argument(
            "--debug", action="store_true", help="on an error, show the traceback instead of one line"
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # --debug is accepted anywhere, also after a nested subcommand (rz osworld eval ... --debug)
    debug = "--debug" in argv
    args, extra = parser.parse_known_args([a for a in argv if a != "--debug"])
    args.debug = debug
    # `key=value` overrides may come after options (rz train CONFIG --run-dir D steps=10).
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = list(args.overrides or []) + extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
