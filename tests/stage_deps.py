"""The project files each stage of dvc.yaml runs, derived from the code, and the command that writes
them into dvc.yaml's deps: `python -m tests.stage_deps` after adding, moving or removing a lib file
(tests/test_dvc_yaml.py fails until dvc.yaml says what this derives).

A stage runs its script, stages/__init__.py (`python -m stages.x` runs it first) and the import closure
of both; a registry package (one whose __init__.py imports every module beside it) is listed as its
folder, so a new objective or family is in every stage that reads the registry without an edit.
lib/config/recipes is data the params loader reads: every stage lists it, as every stage reads params.
"""
import ast
import functools
import re
from pathlib import Path

import yaml

from tests.helpers import ROOT

DVC_YAML = ROOT / "dvc.yaml"
RECIPES = Path("lib/config/recipes")
# packages whose __init__.py imports its modules by a name the AST does not show (a loop over the folder)
IMPORTED_BY_NAME = ("lib/objectives", "lib/training/variants")
CODE_ROOTS = ("lib", "stages")


def module_file(module: str) -> Path | None:
    """The project file of a dotted module name (lib.x, lib.objectives.y, stages.z), None for others."""
    if module.split(".")[0] not in CODE_ROOTS:
        return None
    path = ROOT.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate.relative_to(ROOT)
    return None


@functools.cache
def imports_of(path: Path) -> frozenset[Path]:
    """Project files that `path` imports anywhere in it (function-level imports too, annotation-only ones
    under `if TYPE_CHECKING:` not, as they never run): `from lib import x`
    names the module lib.x, `from lib.x import y` the module lib.x (or lib.x.y when that is a module),
    and every package above a module (its __init__.py runs first)."""
    found = set()
    for node in ast.walk(_without_type_checking(ast.parse((ROOT / path).read_text()))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        # importing lib.a.b runs lib/a/__init__.py first
        names += [".".join(name.split(".")[:n]) for name in names for n in range(2, name.count(".") + 1)]
        found |= {f for f in map(module_file, names) if f is not None}
    if path.name == "__init__.py" and str(path.parent) in IMPORTED_BY_NAME:
        found |= {p.relative_to(ROOT) for p in (ROOT / path.parent).glob("*.py")}
    return frozenset(found)


def _without_type_checking(tree: ast.Module) -> ast.Module:
    """The module without its `if TYPE_CHECKING:` blocks: imports for annotations only, which never run."""
    for node in ast.walk(tree):
        for name in ("body", "orelse"):
            block = getattr(node, name, None)
            if isinstance(block, list):
                setattr(node, name, [child for child in block if not (
                    isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING")])
    return tree


def docstring_only(path: Path) -> bool:
    """A file that holds nothing but its docstring (lib/__init__.py) runs no code: no stage depends on it."""
    body = ast.parse((ROOT / path).read_text()).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def closure(script: Path) -> set[Path]:
    """The project files `script` runs: its package's __init__.py, its imports, theirs, and so on."""
    seen, todo = set(), [script, *[init for init in [script.parent / "__init__.py"] if (ROOT / init).is_file()]]
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            todo += imports_of(path)
    return {path for path in seen if not docstring_only(path)}


def registry(package: Path) -> bool:
    """Whether running the package's __init__.py runs every module in it."""
    init = package / "__init__.py"
    modules = {p.relative_to(ROOT) for p in (ROOT / package).glob("*.py")}
    return (ROOT / init).is_file() and modules <= closure(init) | {init}


def code_deps(stage: str) -> list[str]:
    """What dvc.yaml lists as the code stage `stage` runs: its script, stages/__init__.py, then the lib
    files and registry folders, sorted."""
    script = Path(f"stages/{stage}.py")
    files = closure(script) - {script, Path("stages/__init__.py")}
    folders = {file.parent for file in files if file.parent.parent != Path() and registry(file.parent)}
    listed = {folder for folder in folders if not any(outer in folder.parents for outer in folders)}
    kept = {file for file in files if not any(folder in file.parents for folder in listed)}
    return [str(script), "stages/__init__.py", *sorted(map(str, kept | listed | {RECIPES}))]


STAGE = re.compile(r"^  ([\w-]+):\s*(#.*)?$")
DEPS = re.compile(r"^    deps:\s*$")
ENTRY = re.compile(r"^      - (\S+)\s*$")


def with_derived_deps(text: str) -> str:
    """dvc.yaml's text with each stage's code deps (its entries under lib/ and stages/) replaced by
    code_deps, first in the list; its other deps (data) stay as they are, after them."""
    stages = yaml.safe_load(text)["stages"]
    out, lines, i = [], text.splitlines(keepends=True), 0
    stage = None
    while i < len(lines):
        line = lines[i]
        if match := STAGE.match(line):
            stage = match.group(1)
        out.append(line)
        i += 1
        if stage in stages and "cmd" in stages[stage] and DEPS.match(line):
            entries = []
            while i < len(lines) and ENTRY.match(lines[i]):
                entries.append(ENTRY.match(lines[i]).group(1))
                i += 1
            data = [entry for entry in entries if Path(entry).parts[0] not in CODE_ROOTS]
            out += [f"      - {entry}\n" for entry in code_deps(stage) + data]
    return "".join(out)


def main() -> None:
    text = DVC_YAML.read_text()
    derived = with_derived_deps(text)
    if derived == text:
        print("dvc.yaml: every stage's code deps are what it runs")
        return
    DVC_YAML.write_text(derived)
    print("dvc.yaml: code deps written from the stages' imports (git diff dvc.yaml shows them)")


if __name__ == "__main__":
    main()
