"""The package's shape in numbers, read from the code (no import runs).

    python tools/architecture_report.py            # this checkout's serving_opt/
    python tools/architecture_report.py --json     # the same, as JSON

Prints the modules and their layers, the imports between stages, the import cycles
(strongly connected components of the module graph; imports inside functions count, a
lazy import is still a dependency; ``if TYPE_CHECKING:`` imports do not), the longest
functions and the widest signatures. Used to compare the structure before and after a redesign.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from dataclasses import asdict, dataclass

PACKAGE = "serving_opt"


@dataclass(frozen=True)
class Function:
    name: str  # module:qualified.name
    lines: int
    params: int


def modules(root: str) -> dict[str, str]:
    """Module name -> path, for every .py file of the package under ``root``."""
    found = {}
    for folder, _, files in os.walk(os.path.join(root, PACKAGE)):
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(folder, file)
                name = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: str, known: dict[str, str]) -> set[str]:
    """The package modules ``name`` imports (``from a import b`` counts b when b is a module)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    targets = set()
    for block in ast.walk(tree):  # imports only type checkers read are not dependencies
        if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING"):
            block.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    resolved = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            resolved.add(target)
    return resolved


def functions(name: str, path: str) -> list[Function]:
    tree = ast.parse(open(path, encoding="utf-8").read())
    found = []

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = child.args
                params = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) \
                    + (args.vararg is not None) + (args.kwarg is not None)
                if args.args and args.args[0].arg in ("self", "cls"):
                    params -= 1
                qual = f"{prefix}{child.name}"
                found.append(Function(f"{name}:{qual}", child.end_lineno - child.lineno + 1,
                                      params))
                visit(child, qual + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, result, counter = {}, {}, [], set(), [], [0]

    def strongconnect(start: str) -> None:
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
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
                        result.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            strongconnect(node)
    return result


def layer(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else module


def report(root: str) -> dict:
    known = modules(root)
    graph = {name: imports(name, path, known) & set(known) for name, path in known.items()}
    funcs = [f for name, path in known.items() for f in functions(name, path)]
    stage_prefix = f"{PACKAGE}.stages."
    between_stages = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                            if a.startswith(stage_prefix) and b.startswith(stage_prefix))
    sizes = {name: sum(1 for _ in open(path, encoding="utf-8")) for name, path in known.items()}
    layers: dict[str, int] = {}
    for name in known:
        layers[layer(name)] = layers.get(layer(name), 0) + 1
    return {
        "modules": len(known),
        "lines": sum(sizes.values()),
        "layers": dict(sorted(layers.items())),
        "imports": sum(len(t) for t in graph.values()),
        "imports_between_stages": between_stages,
        "cycles": cycles(graph),
        "largest_modules": sorted(sizes.items(), key=lambda kv: -kv[1])[:5],
        "longest_functions": [asdict(f) for f in sorted(funcs, key=lambda f: -f.lines)[:5]],
        "widest_signatures": [asdict(f) for f in sorted(funcs, key=lambda f: -f.params)[:5]],
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), help="the checkout (default: this one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = report(args.root)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"modules: {result['modules']} ({result['lines']} lines), "
          f"imports between modules: {result['imports']}")
    print("layers: " + ", ".join(f"{k} ({v})" for k, v in result["layers"].items()))
    print(f"imports between stages: {len(result['imports_between_stages'])}")
    for line in result["imports_between_stages"]:
        print(f"  {line}")
    print(f"cycles: {len(result['cycles'])}")
    for cycle in result["cycles"]:
        print(f"  {' <-> '.join(cycle)}")
    print("largest modules: " + ", ".join(f"{m} {n}" for m, n in result["largest_modules"]))
    print("longest functions: " + ", ".join(f"{f['name']} {f['lines']} lines"
                                            for f in result["longest_functions"]))
    print("widest signatures: " + ", ".join(f"{f['name']} {f['params']} params"
                                            for f in result["widest_signatures"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
