"""The docs name what the project offers: every server route in the README (a user's page), every
measurement script in the README or docs/ARCHITECTURE.md (the maintainer's map)."""

from __future__ import annotations

from pathlib import Path

from fake_engine import FakeEngine

from eaglechat.server.app import create_app

REPO = Path(__file__).resolve().parent.parent


def route_paths(routes) -> set[str]:
    """The paths of an app's routes, descending into mounts."""
    paths = set()
    for route in routes:
        sub = getattr(route, "routes", None)
        if sub:
            prefix = route.path
            paths.update(prefix + p for p in route_paths(sub))
        else:
            paths.add(route.path)
    return paths


def test_every_server_route_is_named_in_the_readme():
    app = create_app(FakeEngine())
    paths = route_paths(app.routes)
    assert "/v1/chat/completions" in paths  # the check sees the routes at all
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    missing = sorted(p for p in paths if p not in readme)
    assert not missing, f"routes not named in README.md: {missing}"


def test_every_script_is_named_in_the_docs():
    scripts = sorted(p.name for p in (REPO / "scripts").glob("*.py"))
    assert len(scripts) > 3
    docs = (REPO / "README.md").read_text(encoding="utf-8") + (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    missing = [name for name in scripts if name not in docs and name.removesuffix(".py") not in docs]
    assert not missing, f"scripts not named in README.md or docs/ARCHITECTURE.md: {missing}"


def test_the_readme_has_a_table_of_contents():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    headings = [line.lstrip("#").strip() for line in readme.splitlines() if line.startswith("## ")]
    toc_start = readme.index("## Contents")
    toc = readme[toc_start:readme.index("\n## ", toc_start + 1)]
    missing = [h for h in headings if h != "Contents" and f"[{h}]" not in toc]
    assert not missing, f"README headings missing from its contents: {missing}"
