"""Print which metrics and getters OSWorld task files use and which are implemented here.

    python scripts/osworld_coverage.py ../shared/data/osworld/examples [more dirs or files] [--json]

The README's counts in ``rz_agents/envs/osworld/README.md`` come from this (examples plus the
``multi_apps`` JSONs of OSWorld commit 8942695, when given).
"""

from __future__ import annotations

import argparse
import json

from rz_agents.envs.osworld.coverage import evaluator_inventory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="task folders or files")
    parser.add_argument("--json", action="store_true", help="the whole inventory as JSON")
    args = parser.parse_args()
    inv = evaluator_inventory(args.paths)
    if args.json:
        print(json.dumps(inv, indent=2))
        return
    named = [m for m in inv["metrics"] if m]
    print(f"tasks with an evaluator: {inv['tasks']}")
    print(
        f"metrics: {len(named)} named (+ placeholder: {inv['metrics'].get('', 0)} tasks); "
        f"implemented {len(inv['metrics_implemented'])}, missing {len(inv['metrics_missing'])}, "
        f"blocked here {len(inv['metrics_blocked'])}"
    )
    for name in inv["metrics_missing"]:
        print(f"  missing metric: {name} ({inv['metrics'][name]} tasks)")
    for name, why in inv["metrics_blocked"].items():
        print(f"  blocked metric: {name} ({inv['metrics'][name]} tasks): {why}")
    print(
        f"getters: {len(inv['getters'])}; implemented {len(inv['getters_implemented'])}, "
        f"unavailable here {len(inv['getters_unavailable'])}, missing {len(inv['getters_missing'])}"
    )
    for name, why in inv["getters_unavailable"].items():
        print(f"  unavailable getter: {name} ({inv['getters'][name]} tasks): {why}")
    for name in inv["getters_missing"]:
        print(f"  missing getter: {name} ({inv['getters'][name]} tasks)")


if __name__ == "__main__":
    main()
