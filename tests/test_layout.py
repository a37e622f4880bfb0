"""The house rules that code review alone would let slip: no import circles, no import from a higher floor,
the engine imports nothing above it, and the wings (fit/: what fits this machine; models/: where a model
comes from) stay under the loader, and no function outside train/ runs over 80 lines. The import graph and the
house plan: tests/import_graph.py."""

from __future__ import annotations

from pathlib import Path

import import_graph as g
import pytest

import eaglechat

PACKAGE = Path(eaglechat.__file__).resolve().parent
# the engine may use only itself and the leaf modules (errors, byte units, typed reads of user files);
# the loader assembles the rest
LEAVES = ("eaglechat.errors", "eaglechat.units", "eaglechat.validate")
ENGINE_MAY_IMPORT = ("eaglechat.engine", *LEAVES)
# a circle that is being taken apart elsewhere; the list must shrink to empty, never grow
KNOWN_CIRCLES: list[list[str]] = []
ABOVE_THE_WINGS = ("bench", "train", "chat", "tui", "server", "commands", "cli", "__main__")


@pytest.fixture(scope="module")
def edges() -> dict[str, set[str]]:
    return g.graph(PACKAGE)


def imports_of(edges, room: str) -> dict[str, set[str]]:
    return {m: targets for m, targets in edges.items() if g.room(m) == room}


def offending(edges, room: str, forbidden) -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in imports_of(edges, room).items() for t in targets
                  if g.room(t) in forbidden)


def test_no_import_circles(edges):
    found = g.circles(edges)
    assert found == KNOWN_CIRCLES, "import circles (lazy imports count too):\n" + "\n".join(map(" <-> ".join, found))


def test_no_import_from_a_higher_floor(edges):
    assert not g.unplaced(edges), f"rooms on no floor of tests/import_graph.py's FLOORS: {sorted(g.unplaced(edges))}"
    assert g.upward_arrows(edges) == []


def test_engine_imports_nothing_above_it(edges):
    engine = imports_of(edges, "engine")
    assert len(engine) > 10
    bad = sorted(f"{m} -> {t}" for m, targets in engine.items() for t in targets if not t.startswith(ENGINE_MAY_IMPORT))
    assert not bad, bad


def test_fit_knows_no_model_source_and_no_loader(edges):
    """What fits this machine is decided from numbers (a ModelShape, a device), never from a catalog entry."""
    assert len(imports_of(edges, "fit")) >= 7
    assert offending(edges, "fit", ("models", "loader")) == []


@pytest.mark.parametrize("wing", ["fit", "models"])
def test_the_wings_import_nothing_that_runs_a_model(edges, wing):
    assert offending(edges, wing, ("loader", *ABOVE_THE_WINGS)) == []


def test_the_leaves_import_no_other_eaglechat_module(edges):
    for leaf in LEAVES:
        assert edges[leaf] == set(), (leaf, edges[leaf])


def test_the_graph_sees_a_lazy_import_and_a_circle(tmp_path):
    pkg = tmp_path / "eaglechat"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("")
    (pkg / "models" / "catalog.py").write_text("from eaglechat.models.pairs import pair\n")
    (pkg / "models" / "pairs.py").write_text("def pair():\n    from eaglechat.models import catalog\n")
    (pkg / "fit.py").write_text("def f():\n    import eaglechat.loader\n")
    (pkg / "loader.py").write_text("from eaglechat.fit import f\n")
    edges = g.graph(pkg)
    assert edges["eaglechat.models.pairs"] == {"eaglechat.models.catalog"}  # the module, not the package
    assert g.circles(edges) == [["eaglechat.fit", "eaglechat.loader"], ["eaglechat.models.catalog", "eaglechat.models.pairs"]]
    assert g.upward_arrows(edges) == [("eaglechat.fit", "eaglechat.loader")]


# ------------------------------------------------------------------------------------- function length

MAX_FUNCTION_LINES = 80  # from `def` to the last line, docstring and comments included; train/ is exempt


def long_functions(package: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """'path:line name (N lines)' for each function or method (nested ones too) longer than `limit` lines,
    outside the package's train/."""
    import ast

    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package.parent)
        if relative.parts[1] == "train":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{relative.as_posix()}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_over_80_lines_outside_train():
    found = long_functions(PACKAGE)
    assert not found, (f"over {MAX_FUNCTION_LINES} lines (split each into functions named for what they do):\n"
                       + "\n".join(found))


def test_the_length_check_names_a_long_function_and_spares_train(tmp_path):
    import textwrap

    pkg = tmp_path / "eaglechat"
    (pkg / "train").mkdir(parents=True)
    body = "".join(f"x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))  # a def line and this: one line too many
    (pkg / "long.py").write_text("class C:\n    async def step(self):\n" + textwrap.indent(body, " " * 8)
                                 + "\n\ndef short():\n    pass\n")
    (pkg / "train" / "loop.py").write_text("def fit():\n" + textwrap.indent(body, " " * 4))
    assert long_functions(pkg) == [f"eaglechat/long.py:2 step ({MAX_FUNCTION_LINES + 1} lines)"]
