"""Write docs/config.md, the reference of every `rz train` config field, from the schema's dataclasses.

    python3 scripts/config_reference.py            # rewrite docs/config.md
    python3 scripts/config_reference.py --check    # exit 1 if it is stale or a field has no doc

tests/docs/test_config_reference.py runs the check: a field without a doc, or a reference not regenerated
after a schema change, fails the suite.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rz_agents.cli.train import RunConfig
from rz_agents.config_doc import reference_markdown, undocumented

OUT = Path(__file__).resolve().parents[1] / "docs" / "config.md"
INTRO = """Every field of a `rz train` YAML file (`rz_agents.cli.train.RunConfig`), with its type, default and
meaning, generated from the dataclasses by `python3 scripts/config_reference.py` (do not edit by hand; a
test fails when it is stale or a field has no doc). Override any field on the command line as
`key.path=value` (`rz train demo rollout.max_lag=8`). Types and unknown names are checked when the file
loads (`rollout.max_lagg: unknown field (did you mean max_lag?)`); `rz train CONFIG --dry-run` validates
the whole file and prints the memory estimate. Env-specific settings live in `env.kwargs`: see
[env_config.md](env_config.md)."""


def render() -> str:
    """The reference page as it should be now."""
    return reference_markdown(RunConfig, "Config reference", INTRO)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="fail if docs/config.md is stale or a field lacks a doc"
    )
    args = parser.parse_args(argv)
    missing = undocumented(RunConfig)
    if missing:
        print(
            "fields without a doc (a comment on the field, or an entry in its class docstring):",
            file=sys.stderr,
        )
        for path in missing:
            print(f"  {path}", file=sys.stderr)
        return 1
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python3 scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
