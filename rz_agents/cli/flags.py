"""Command-line flags that were renamed: the old spelling still works for one release, with a one-line
deprecation warning naming the new flag (the flag counterpart of config_io's ``RENAMED_FIELDS``)."""

from __future__ import annotations

import argparse
from typing import Any

from rz_agents.deprecation import warn_deprecated


def add_renamed_flag(parser: argparse.ArgumentParser, old: str, new: str, **kwargs: Any) -> None:
    """Accept ``old`` as a hidden alias of the flag ``new`` (same destination), warning when it is used."""

    class _Renamed(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None) -> None:
            warn_deprecated(f"{old} is renamed {new}; the old flag is accepted for one release")
            setattr(namespace, self.dest, values)

    dest = new.lstrip("-").replace("-", "_")
    parser.add_argument(old, dest=dest, action=_Renamed, help=argparse.SUPPRESS, default=None, **kwargs)
