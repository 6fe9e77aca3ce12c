"""The shape of lib/: role packages, and no module that imports, directly or through others, itself."""
import ast
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
    assert roles == {"config", "core", "data", "metrics", "models", "objectives", "tasks", "training", "evaluation",
                     "serving"}


def code_files() -> list[Path]:
    """The code a name's knowledge could hide in: lib/, stages/, bench/."""
    return sorted(p for folder in ("lib", "stages", "bench") for p in (ROOT / folder).rglob("*.py"))


def string_constants(tree: ast.AST) -> list[ast.Constant]:
    """The string constants of a parsed file, without docstrings (which may name anything)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_task_type_is_named_outside_its_package():
    """A task type owns everything about itself (lib/tasks): its name as a string anywhere else in the code
    means knowledge of it sits outside its file. Docstrings and comments may name it."""
    from lib.tasks import TYPES

    found = []
    for path in code_files():
        if (ROOT / "lib" / "tasks") in path.parents:
            continue
        found += [f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}"
                  for node in string_constants(ast.parse(path.read_text(encoding="utf-8"))) if node.value in TYPES]
    assert found == []


def test_no_checkpoint_family_is_named_outside_its_module():
    """A checkpoint family owns everything about itself (its module in lib/models/families/): its name as
    a string anywhere else in the code, its own package's other modules included, means knowledge of it
    sits outside its file. Only the exact string counts: docstrings, comments, hub ids ("hf:org/bert-x")
    and words that contain a name may name it. A name that is also an objective's (ELECTRA's) may name
    the objective in lib/objectives/ and as what build_objective builds."""
    import sys

    from lib.models.families import FAMILIES
    from lib.objectives import OBJECTIVES

    home = {name: Path(sys.modules[type(family).__module__].__file__).resolve() for name, family in FAMILIES.items()}
    found = []
    for path in code_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        built = {id(call.args[0]) for call in ast.walk(tree) if isinstance(call, ast.Call) and call.args
                 and getattr(call.func, "id", getattr(call.func, "attr", None)) == "build_objective"}
        objective_code = (ROOT / "lib" / "objectives") in path.parents
        found += [f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}" for node in string_constants(tree)
                  if node.value in home and path.resolve() != home[node.value]
                  and not (node.value in OBJECTIVES and (objective_code or id(node) in built))]
    assert found == []
