"""The house rules that code review alone would let slip: the engine imports nothing above it."""

from __future__ import annotations

import ast
from pathlib import Path

import eaglechat

PACKAGE = Path(eaglechat.__file__).resolve().parent
# the engine may use only itself and the leaf modules (errors, byte units, typed reads of user files);
# the loader assembles the rest
LEAVES = ("eaglechat.errors", "eaglechat.units", "eaglechat.validate")
ENGINE_MAY_IMPORT = ("eaglechat.engine", *LEAVES)


def is_module(dotted: str) -> bool:
    """eaglechat.models.catalog -> is there a module or package of that name in the package?"""
    rel = PACKAGE.parent.joinpath(*dotted.split("."))
    return rel.with_suffix(".py").is_file() or (rel / "__init__.py").is_file()


def imported_modules(path: Path) -> set[str]:
    """Every eaglechat module a file imports, at the top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # from eaglechat.models import catalog: the module catalog
                sub = f"{node.module}.{alias.name}"
                names.add(sub if is_module(sub) else node.module)
    return {n for n in names if n == "eaglechat" or n.startswith("eaglechat.")}


def test_engine_imports_nothing_above_it():
    files = sorted((PACKAGE / "engine").rglob("*.py"))
    assert len(files) > 10
    bad = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in files
        for name in imported_modules(path)
        if not name.startswith(ENGINE_MAY_IMPORT)
    }
    assert not bad, sorted(bad)


def test_the_check_sees_a_lazy_import_from_above(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from eaglechat.models import catalog\n    from eaglechat.fit.planner import Planner\n")
    assert imported_modules(sample) == {"eaglechat.models.catalog", "eaglechat.fit.planner"}


def test_the_leaves_import_no_other_eaglechat_module():
    for leaf in LEAVES:
        path = PACKAGE / (leaf.removeprefix("eaglechat.") + ".py")
        assert imported_modules(path) <= {leaf}, (leaf, imported_modules(path))
