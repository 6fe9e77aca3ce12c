"""dvc.yaml against the code: every stage depends on every project file it runs (its import closure),
so editing one reruns exactly the stages whose results it can change; outputs persist (a failed stage
leaves the last good ones); and each stage script keys its saved progress on dvc.yaml's params list."""
import ast
import functools
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT

DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
RECIPES = Path("lib/config/recipes")  # data the params loader reads, not code
REGISTRIES = ("objectives", "variants")  # packages whose __init__.py imports each of their modules by name


def module_file(module: str) -> Path | None:
    """The project file of a dotted module name (lib.x, lib.objectives.y, stages.z), None for others."""
    if module.split(".")[0] not in ("lib", "stages"):
        return None
    path = ROOT.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate.relative_to(ROOT)
    return None


@functools.cache
def imports_of(path: Path) -> frozenset[Path]:
    """Project files that `path` imports anywhere in it (function-level imports too): `from lib import x`
    names the module lib.x, `from lib.x import y` the module lib.x (or lib.x.y when that is a module),
    and every package above a module (its __init__.py runs first)."""
    found = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        # importing lib.a.b runs lib/a/__init__.py first
        names += [".".join(name.split(".")[:n]) for name in names for n in range(2, name.count(".") + 1)]
        found |= {f for f in map(module_file, names) if f is not None}
    if path.name == "__init__.py" and path.parent.name in REGISTRIES:  # it imports every module beside it
        found |= {p.relative_to(ROOT) for p in (ROOT / path.parent).glob("*.py")}
    return frozenset(found)


def docstring_only(path: Path) -> bool:
    """A file that holds nothing but its docstring (lib/__init__.py) runs no code: no stage depends on it."""
    body = ast.parse((ROOT / path).read_text()).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def closure(script: Path) -> set[Path]:
    """The project files `script` runs: its package's __init__.py (`python -m stages.x` runs it first), its
    imports, theirs, and so on."""
    seen, todo = set(), [script, *[init for init in [script.parent / "__init__.py"] if (ROOT / init).is_file()]]
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            todo += imports_of(path)
    return {path for path in seen if not docstring_only(path)}


def test_the_closure_follows_imports():
    files = closure(Path("stages/pretrain.py"))
    assert {Path("lib/training/budget_loop.py"), Path("lib/core/distributed.py"), Path("lib/objectives/electra.py")} <= files
    assert Path("lib/__init__.py") not in files and docstring_only(Path("lib/__init__.py"))


@pytest.mark.parametrize("stage", DVC)
def test_a_stage_depends_on_every_file_it_runs(stage):
    deps = [Path(d) for d in DVC[stage]["deps"]]
    missing = [str(f) for f in sorted(closure(Path(f"stages/{stage}.py")))
               if not any(f == d or d in f.parents for d in deps)]
    assert not missing, f"dvc.yaml: stage {stage} runs {missing} but does not list it in deps"
    code = [d for d in deps if d.parts[0] in ("lib", "stages") and d != RECIPES]
    unused = [str(d) for d in code if not any(f == d or d in f.parents for f in closure(Path(f"stages/{stage}.py")))]
    assert not unused, f"dvc.yaml: stage {stage} lists {unused} in deps but never runs it"


@pytest.mark.parametrize("stage", DVC)
def test_a_stage_reruns_for_its_recipe(stage):
    """Every stage reads its params through the recipe (lib.config.params.apply_recipe): it reruns when
    `recipe` names another one or a recipe's file changes."""
    assert "recipe" in DVC[stage]["params"] and str(RECIPES) in DVC[stage]["deps"]


@pytest.mark.parametrize("stage", DVC)
def test_outputs_persist(stage):
    """DVC deletes a stage's outputs before running it unless they persist; ours are replaced whole
    by the stage when it succeeds, so a failure keeps the last good ones."""
    for kind in ("outs", "metrics", "plots"):
        for entry in DVC[stage].get(kind, []):
            path, options = next(iter(entry.items())) if isinstance(entry, dict) else (entry, {})
            assert options.get("persist") is True, f"dvc.yaml: {stage} {kind} {path} does not persist"


@pytest.mark.parametrize("stage", DVC)
def test_stage_scripts_key_their_params_on_dvc_yaml(stage):
    """The script opens as its stage (lib.core.stage.open_stage), which reads the params list from
    dvc.yaml (lib.config.params.stage_params): no second list."""
    assert f'open_stage("{stage}", __doc__' in (ROOT / f"stages/{stage}.py").read_text()
