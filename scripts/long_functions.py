"""List the functions longer than N lines (default 60) under the given paths, longest first.

python3 scripts/long_functions.py rz_agents --over 60
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path


def long_functions(paths: list[str], over: int) -> list[tuple[int, str]]:
    """(line count, "file:line name") of every function or method longer than ``over`` lines."""
    found = []
    for root in paths:
        files = [Path(root)] if Path(root).is_file() else sorted(Path(root).rglob("*.py"))
        for path in files:
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > over:
                        found.append((n, f"{path}:{node.lineno} {node.name}"))
    return sorted(found, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--over", type=int, default=60)
    args = parser.parse_args()
    rows = long_functions(args.paths, args.over)
    for n, where in rows:
        print(f"{n:5d}  {where}")
    print(f"{len(rows)} functions over {args.over} lines")


if __name__ == "__main__":
    main()
