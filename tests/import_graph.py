"""The package's import graph, read from the source with ast: imports at the top and inside functions alike.

A room is a top-level module or sub-package of eaglechat (`fit`, `engine`, `loader`); each room stands on a
floor of the house plan below, and a room may import only rooms on its own floor or under it. An import of a
room on a higher floor is an upward arrow; a circle is a set of modules that import each other round a loop
(a strongly connected component of the module graph). tests/test_layout.py keeps both at zero.

    python tests/import_graph.py [PACKAGE_DIR]   prints rooms, floors, arrows, upward arrows and circles
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

# bottom first; a room imports only its own floor and those under it
FLOORS: list[tuple[str, set[str]]] = [
    ("leaves", {"__init__", "errors", "units", "validate", "paths", "quiet", "hub_kernels", "lean_transformers",
                "threads", "looping", "datasets", "output", "userfiles", "startup_gc"}),
    ("engine", {"engine"}),  # the algorithm: heads, tree, draft, verify, decode
    ("fit", {"fit"}),  # what fits this machine
    ("models", {"models"}),  # where a model comes from
    ("loader", {"loader", "resident"}),  # the composition root: a name -> a running engine
    ("work", {"bench", "train", "chat"}),  # what runs on a loaded engine, and the conversation store
    ("faces", {"tui", "server"}),  # the terminal chat, the HTTP API
    ("commands", {"commands"}),
    ("entry", {"cli", "__main__"}),
]
FLOOR_OF = {room: i for i, (_, rooms) in enumerate(FLOORS) for room in rooms}


def modules(package: Path) -> dict[str, Path]:
    """eaglechat.fit.memory -> its file; a package by its __init__.py."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _known(dotted: str, known: dict) -> str:
    """The deepest module of `dotted` that exists: eaglechat.fit.memory.ModelShape -> eaglechat.fit.memory."""
    while dotted not in known and "." in dotted:
        dotted = dotted.rpartition(".")[0]
    return dotted


def imports_of(path: Path, known: dict) -> set[str]:
    """The eaglechat modules one file imports, wherever in the file (lazy imports inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(_known(a.name, known) for a in node.names if a.name.split(".")[0] == "eaglechat")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "eaglechat":
            # from eaglechat.models import catalog: the module catalog, not the package
            found.update(_known(f"{node.module}.{a.name}", known) for a in node.names)
    return found


def graph(package: Path) -> dict[str, set[str]]:
    known = modules(package)
    return {name: imports_of(path, known) - {name} for name, path in known.items()}


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other round a loop (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges) + 100))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def unplaced(edges: dict[str, set[str]]) -> set[str]:
    """Rooms the house plan does not place on a floor (a new sub-package must be given one)."""
    return {room(m) for m in edges} - set(FLOOR_OF)


def upward_arrows(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a room into a room on a higher floor."""
    return sorted((a, b) for a, bs in edges.items() for b in bs
                  if FLOOR_OF.get(room(b), -1) > FLOOR_OF.get(room(a), len(FLOORS)))


def room_arrows(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(room(a), room(b)) for a, bs in edges.items() for b in bs if room(a) != room(b)}


def figures(edges: dict[str, set[str]]) -> dict:
    return {
        "modules": len(edges),
        "rooms": len({room(m) for m in edges}),
        "floors": len(FLOORS),
        "arrows between rooms": len(room_arrows(edges)),
        "upward arrows": len(upward_arrows(edges)),
        "circles": len(circles(edges)),
    }


def main(argv: list[str]) -> int:
    package = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "eaglechat"
    edges = graph(package)
    for i, (name, rooms) in reversed(list(enumerate(FLOORS))):
        present = sorted(r for r in rooms if any(room(m) == r for m in edges))
        print(f"floor {i} {name:9} {' '.join(present)}")
    for key, value in figures(edges).items():
        print(f"{key}: {value}")
    for a, b in upward_arrows(edges):
        print(f"  up: {a} -> {b}")
    for circle in circles(edges):
        print(f"  circle: {' <-> '.join(circle)}")
    for name in sorted(unplaced(edges)):
        print(f"  not on any floor: {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
