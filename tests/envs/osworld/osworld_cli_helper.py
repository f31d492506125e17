"""Run ``rz osworld ...`` in-process (the full ``rz`` parser imports every subcommand; slow)."""

from __future__ import annotations

import argparse

from rz_agents.cli import osworld as cli_osworld


def rz_osworld(*args: str) -> int:
    """Parse ``rz osworld <args>`` with only the osworld subcommand registered and run it."""
    parser = argparse.ArgumentParser(prog="rz")
    cli_osworld.add_parser(parser.add_subparsers(dest="command"))
    ns = parser.parse_args(["osworld", *args])
    return int(ns.func(ns) or 0)
