"""The import graph of rz_agents and rz_kernels, drawn from the code's own imports (AST, nothing imported).

    python scripts/import_graph.py                 # cycles, imports up the layering, longest function
    python scripts/import_graph.py --json          # the same as one JSON object
    python scripts/import_graph.py --check         # exit 1 when any package or file cycle is found
    python scripts/import_graph.py --edges module  # only imports that run when a module is imported

An edge is an ``import`` / ``from ... import`` of one of our modules. Imports at module level (a class body
and an ``if`` / ``try`` at module level included) and imports inside a function both count as edges by
default (a function-level import only defers the cycle to a call); imports under ``if TYPE_CHECKING:`` never
run and are not edges. Each edge says which kind it is: ``module`` when any of its import sites runs at
import time, else ``function``.

Nodes: a file is its module (``rz_agents.envs.osworld.getters``); a package is its first two name components
(``rz_agents.envs``, ``rz_kernels.triton_ops``; a module directly under a root, ``rz_agents.images``, is its
own package). A package cycle is a strongly connected group of packages; a file cycle the same for files.

The intended layering (DESIGN.md): kernels <- model <- engine / trainer <- rollout <- runtime <- cli, envs
depending on nothing of ours but their own folder and the small shared helpers. ``LAYERS`` gives every
package we have its place; an import from a lower layer into a higher one is reported as running up.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROOTS = (REPO / "rz_agents", REPO / "kernels" / "rz_kernels")

# Layer of each package (its name under the root; the rz_kernels root is all "kernels"). Lower may not
# import higher. Same layer, different package: allowed (engine and trainer share model, not each other, but
# that is a review question, not a graph rule).
LAYERS: dict[str, int] = {
    "kernels": 0,
    "helpers": 0,  # rz_agents' own top-level modules (images, trajectory, sampling, deprecation, config_io)
    "envs": 1,
    "rewards": 1,
    "data": 1,
    "model": 1,
    "engine": 2,
    "trainer": 2,
    "compile_check": 2,
    "rollout": 3,
    "serve": 4,
    "agents": 5,
    "warmstart": 5,
    "eval": 6,
    "report": 6,
    "runtime": 7,
    "configs": 7,
    "cli": 8,
    "__main__": 9,  # python -m rz_agents
    "root": 9,  # the package's own __init__ (it registers the envs); every module imports it implicitly
}
# What an env may import: its own folder, the shared helpers, rewards and packaged data.
ENV_ALLOWED = ("envs", "helpers", "rewards", "data")


@dataclass
class Site:
    """One import statement of one module by another."""

    line: int
    kind: str  # "module" (runs when the importer is imported) or "function"


@dataclass
class Graph:
    """Modules, and for each importer -> imported pair the statements that make the edge."""

    files: dict[str, Path] = field(default_factory=dict)  # module name -> file
    roots: dict[str, str] = field(default_factory=dict)  # module name -> its root package's name
    sites: dict[tuple[str, str], list[Site]] = field(default_factory=lambda: defaultdict(list))

    def edge_kind(self, a: str, b: str) -> str:
        """``module`` when any import of ``b`` by ``a`` runs at import time, else ``function``."""
        return "module" if any(s.kind == "module" for s in self.sites[(a, b)]) else "function"

    def edges(self, kinds: Sequence[str]) -> dict[str, set[str]]:
        """importer -> imported, over the edges whose kind is in ``kinds``."""
        out: dict[str, set[str]] = defaultdict(set)
        for (a, b), sites in self.sites.items():
            if any(s.kind in kinds for s in sites):
                out[a].add(b)
        return out


def module_name(path: Path, root: Path) -> str:
    """``root/x/y.py`` -> ``root.x.y`` (``__init__.py`` is its package)."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_sites(tree: ast.Module) -> Iterable[tuple[ast.stmt, str]]:
    """Every import statement with its kind: ``module`` or ``function`` (TYPE_CHECKING blocks skipped)."""

    def walk(nodes: Sequence[ast.stmt], kind: str) -> Iterable[tuple[ast.stmt, str]]:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node, kind
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from walk(node.body, "function")
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                yield from walk(node.orelse, kind)
            else:
                for name in ("body", "orelse", "finalbody", "handlers", "cases"):
                    children = getattr(node, name, None)
                    if isinstance(children, list):
                        yield from walk([c for c in children if isinstance(c, ast.AST)], kind)

    yield from walk(tree.body, "module")


def _targets(node: ast.stmt, importer: str, is_package: bool, known: set[str]) -> list[str]:
    """The modules of ours that ``node`` imports (a name imported from a package may be a submodule)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        base = node.module or ""
        if node.level:  # relative: from the importer's package, up level - 1 more
            package = importer.split(".") if is_package else importer.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join([*package, base] if base else package)
        names = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known] or [base]
    out = []
    for name in names:
        while name and name not in known:  # `import a.b.c` of an attribute path: its module
            name = name.rpartition(".")[0]
        if name and name != importer:
            out.append(name)
    return out


def build_graph(roots: Sequence[Path]) -> Graph:
    """Parse every ``.py`` file under ``roots`` (package directories) into the import graph."""
    graph = Graph()
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            name = module_name(path, root)
            graph.files[name] = path
            graph.roots[name] = root.name
    known = set(graph.files)
    # Python runs a root package's __init__ before any of its modules, so an explicit ``import rz_agents``
    # (for its path) adds no dependency: edges into a root's __init__ are left out.
    root_names = {root.name for root in roots}
    for name, path in graph.files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, kind in import_sites(tree):
            for target in _targets(node, name, path.name == "__init__.py", known):
                if target not in root_names:
                    graph.sites[(name, target)].append(Site(node.lineno, kind))
    return graph


def package_of(module: str) -> str:
    """The first two components of a module's name (``rz_agents.envs``, ``rz_agents.images``)."""
    return ".".join(module.split(".")[:2])


def layer_name(package: str, root_names: Sequence[str] = ("rz_kernels",)) -> str:
    """The LAYERS key of a package: ``kernels`` for the kernels root, ``helpers`` for a top-level module."""
    head, _, sub = package.partition(".")
    if head in root_names:
        return "kernels"
    if not sub:
        return "root"
    return sub if sub in LAYERS else "helpers"


def strongly_connected(nodes: Iterable[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def shortest_cycle(component: Sequence[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the component's first node: [a, b, ..., a]."""
    members = set(component)
    start = component[0]
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(edges.get(node, ())):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if child in members and child not in parent:
                parent[child] = node
                queue.append(child)
    raise AssertionError("a strongly connected component always has a cycle")


def _where(graph: Graph, a: str, b: str) -> str:
    sites = graph.sites[(a, b)]
    return f"{graph.files[a].name}:" + ",".join(str(s.line) for s in sites)


def file_cycles(graph: Graph, kinds: Sequence[str]) -> list[dict]:
    """Each file cycle: its members and one shortest cycle with the kind and lines of each import."""
    edges = graph.edges(kinds)
    out = []
    for component in strongly_connected(graph.files, edges):
        path = shortest_cycle(component, edges)
        steps = [
            {"from": a, "to": b, "kind": graph.edge_kind(a, b), "at": _where(graph, a, b)}
            for a, b in zip(path, path[1:], strict=False)
        ]
        out.append({"members": component, "cycle": steps})
    return out


def package_edges(graph: Graph, kinds: Sequence[str]) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """package -> package, with the file imports that make each edge."""
    out: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for a, targets in graph.edges(kinds).items():
        for b in targets:
            pa, pb = package_of(a), package_of(b)
            if pa != pb:
                out[(pa, pb)].append((a, b))
    return out


def package_cycles(graph: Graph, kinds: Sequence[str]) -> list[dict]:
    """Each package cycle: its members and one shortest cycle, each step with an import that makes it."""
    by_pair = package_edges(graph, kinds)
    edges: dict[str, set[str]] = defaultdict(set)
    for a, b in by_pair:
        edges[a].add(b)
    packages = {package_of(m) for m in graph.files}
    out = []
    for component in strongly_connected(packages, edges):
        path = shortest_cycle(component, edges)
        steps = []
        for a, b in zip(path, path[1:], strict=False):
            fa, fb = sorted(by_pair[(a, b)])[0]
            steps.append(
                {
                    "from": a,
                    "to": b,
                    "via": f"{fa} -> {fb}",
                    "kind": graph.edge_kind(fa, fb),
                    "imports": len(by_pair[(a, b)]),
                }
            )
        out.append({"members": component, "cycle": steps})
    return out


def upward_imports(graph: Graph, kinds: Sequence[str]) -> list[dict]:
    """Imports from a lower layer into a higher one, and env imports outside what an env may use."""
    kernel_roots = tuple(sorted({r for r in graph.roots.values() if r != "rz_agents"}))
    out = []
    for (pa, pb), pairs in sorted(package_edges(graph, kinds).items()):
        la, lb = layer_name(pa, kernel_roots), layer_name(pb, kernel_roots)
        if la == "envs" and lb not in ENV_ALLOWED:
            rule = "envs import only envs and shared helpers"
        elif LAYERS[la] < LAYERS[lb]:
            rule = f"{la} (layer {LAYERS[la]}) below {lb} (layer {LAYERS[lb]})"
        else:
            continue
        for a, b in sorted(pairs):
            out.append(
                {"from": a, "to": b, "kind": graph.edge_kind(a, b), "at": _where(graph, a, b), "rule": rule}
            )
    return out


def longest_functions(paths: Iterable[Path], top: int) -> list[dict]:
    """The ``top`` longest functions or methods (lines from ``def`` to the last line of the body)."""
    rows = []
    for path in paths:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                rows.append({"lines": n, "function": node.name, "at": f"{_rel(path)}:{node.lineno}"})
    return sorted(rows, key=lambda r: (-r["lines"], r["at"]))[:top]


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def report(roots: Sequence[Path], kinds: Sequence[str], top: int) -> dict:
    """Everything the script prints, as one mapping."""
    graph = build_graph(roots)
    agents = [p for m, p in graph.files.items() if graph.roots[m] == "rz_agents"]
    return {
        "edges_counted": list(kinds),
        "files": len(graph.files),
        "imports": sum(len(s) for s in graph.sites.values()),
        "package_cycles": package_cycles(graph, kinds),
        "file_cycles": file_cycles(graph, kinds),
        "upward_imports": upward_imports(graph, kinds),
        "longest_functions": longest_functions(agents or graph.files.values(), top),
    }


def print_report(result: dict) -> None:
    """The report as text."""
    kinds = " and ".join(f"{k}-level" for k in result["edges_counted"])
    print(f"{result['files']} files, {result['imports']} imports of our own modules; {kinds} imports count")
    for title, key in (("package cycles", "package_cycles"), ("file cycles", "file_cycles")):
        print(f"\n{title}: {len(result[key])}")
        for found in result[key]:
            print(f"  {' <-> '.join(found['members'])}")
            for step in found["cycle"]:
                where = step.get("at") or step["via"]
                print(f"      {step['from']} -> {step['to']}  [{step['kind']}]  {where}")
    print(f"\nimports running up the layering: {len(result['upward_imports'])}")
    for up in result["upward_imports"]:
        print(f"  {up['from']} -> {up['to']}  [{up['kind']}]  {up['at']}  ({up['rule']})")
    print("\nlongest functions:")
    for row in result["longest_functions"]:
        print(f"  {row['lines']:5d}  {row['at']} {row['function']}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "roots", nargs="*", type=Path, help="package directories (default: rz_agents, rz_kernels)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--check", action="store_true", help="exit 1 when there is a package or file cycle")
    parser.add_argument(
        "--edges",
        choices=("all", "module"),
        default="all",
        help="all: module- and function-level imports (default); module: module-level only",
    )
    parser.add_argument("--top", type=int, default=5, help="how many of the longest functions to list")
    args = parser.parse_args(argv)
    roots = args.roots or list(DEFAULT_ROOTS)
    for root in roots:
        if not (root / "__init__.py").is_file():
            print(f"import_graph: {root} is not a package directory (no __init__.py)", file=sys.stderr)
            return 2
    kinds = ("module", "function") if args.edges == "all" else ("module",)
    result = report(roots, kinds, args.top)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_report(result)
    cycles = len(result["package_cycles"]) + len(result["file_cycles"])
    return 1 if args.check and cycles else 0


if __name__ == "__main__":
    sys.exit(main())
