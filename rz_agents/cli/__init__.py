"""`rz` command line: one module per subcommand in this package.

Each subcommand module defines `add_parser(subparsers)`, which registers its parser and sets
`func=run` (a callable taking the parsed namespace and returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Order shown in `rz --help`. A module listed here must exist; import errors are real errors.
SUBCOMMANDS = ["train", "eval", "align_check", "bench", "osworld"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rz",
        description="Train and evaluate tool-using LLM agents with async REINFORCE Zero "
        "on bit-aligned kernels.",
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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # `key=value` overrides may come after options (rz train CONFIG --run-dir D steps=10).
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = list(args.overrides or []) + extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
