"""The shape of lib/: role packages, and no module that imports, directly or through others, itself."""
from pathlib import Path

from tests.helpers import ROOT
from tests.test_dvc_yaml import imports_of

LIB = ROOT / "lib"


def lib_imports(path: Path) -> set[Path]:
    """The lib modules `path` names in its imports, without the packages above them: a package's
    __init__.py running before its modules is how Python loads them, not a cycle."""
    return {f for f in imports_of(path) if f.parts[0] == "lib" and not (f.name == "__init__.py" and f.parent in path.parents)}


def test_lib_has_no_import_cycle():
    graph = {p.relative_to(ROOT): lib_imports(p.relative_to(ROOT)) for p in LIB.rglob("*.py")}
    done, on_path = set(), []

    def visit(node: Path) -> None:
        if node in on_path:
            cycle = on_path[on_path.index(node):] + [node]
            raise AssertionError("import cycle: " + " -> ".join(map(str, cycle)))
        if node in done:
            return
        on_path.append(node)
        for target in sorted(graph.get(node, ())):
            visit(target)
        on_path.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)


def test_lib_is_role_packages_only():
    """Every module sits in a package that names its role; lib/ itself holds only its docstring."""
    assert [p.name for p in LIB.glob("*.py")] == ["__init__.py"]
    roles = {p.name for p in LIB.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert roles == {"config", "core", "data", "models", "objectives", "tasks", "training", "evaluation", "serving"}
