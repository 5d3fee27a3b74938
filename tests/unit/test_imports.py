"""The tiers' modules import one way: no module reaches back, even from inside a function or under TYPE_CHECKING."""
from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imports(root: Path, *packages: str) -> dict[str, set[str]]:
    """Each module of `packages` and the modules of `packages` it imports anywhere in its text."""
    files = {".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): f
             for package in packages for f in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        found = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:  # `from a.b import c`: the module a.b.c, else a.b
                    found.update([m for m in (f"{node.module}.{alias.name}", node.module) if m in files][:1])
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in files)
        found.discard(name)
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str]:
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        return list(exc.args[1])
    return []


def test_no_import_cycle() -> None:
    assert cycle(imports(ROOT, "api", "cli", "common", "workers")) == []


def test_an_import_inside_a_function_or_for_type_checking_counts(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    from pkg.b import g\n")
    (tmp_path / "pkg" / "b.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    from pkg import a\n")
    assert imports(tmp_path, "pkg") == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}
    assert sorted(cycle(imports(tmp_path, "pkg"))) == ["pkg.a", "pkg.a", "pkg.b"]
