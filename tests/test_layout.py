"""The shape of lib/: role packages, and no module that imports, directly or through others, itself."""
import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.helpers import ROOT
from tests.stage_deps import code_deps, imports_of

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


def package_imports() -> dict[str, dict[str, list[str]]]:
    """Per role package, the other packages its modules import (function-level imports too), each with the
    modules that do."""
    found: dict[str, dict[str, list[str]]] = {}
    for path in sorted(LIB.rglob("*.py")):
        source = path.relative_to(ROOT)
        if len(source.parts) < 3:
            continue
        for target in lib_imports(source):
            if len(target.parts) > 2 and target.parts[1] != source.parts[1]:
                found.setdefault(source.parts[1], {}).setdefault(target.parts[1], []).append(str(source))
    return found


def test_no_two_packages_import_each_other():
    """The packages are floors and imports point down: a package never imports one that imports it."""
    imports = package_imports()
    both_ways = [f"{a} <-> {b} ({imports[a][b][0]}; {imports[b][a][0]})"
                 for a in sorted(imports) for b in sorted(imports[a]) if a < b and a in imports.get(b, {})]
    assert both_ways == []


def test_config_and_core_are_the_lowest_floors():
    """config (params and the error a user can fix) imports no other package of lib, and core imports
    config alone: everything else builds on them."""
    imports = package_imports()
    assert imports.get("config", {}) == {}
    assert set(imports.get("core", {})) <= {"config"}, imports["core"]


def names_outside(names, allowed) -> list[str]:
    """`file:line 'name'` of each string constant in lib/, stages/ and bench/ that is one of `names`, but
    for docstrings and the constants (AST nodes) `allowed(path, tree)` returns."""
    found = []
    for path in sorted(p for folder in ("lib", "stages", "bench") for p in (ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {node.body[0].value for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        skipped = docstrings | allowed(path, tree)
        found += [f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
                  and node not in skipped]
    return found


def test_no_task_type_is_named_outside_its_package():
    """A task type owns everything about itself (lib/tasks): its name as a string anywhere else in the code
    means knowledge of it sits outside its file. Docstrings and comments may name it."""
    from lib.tasks import TYPES

    def allowed(path: Path, tree: ast.Module) -> set:
        return set(ast.walk(tree)) if LIB / "tasks" in path.parents else set()

    assert names_outside(TYPES, allowed) == []


def test_no_model_family_is_named_outside_its_module():
    """A model family owns everything about itself (its module in lib/models/families/): its name as
    a string anywhere else in the code, its own package's other modules included, means knowledge of it
    sits outside its file. Only the exact string counts: docstrings, comments, hub ids ("hf:org/bert-x")
    and words that contain a name may name it. A name that is also an objective's (ELECTRA's) may name
    the objective in lib/objectives/ and as what build_objective builds; one that is also a position kind
    (T5's bias) or an encoder-decoder shape (T5's, BART's) may name those where the model's config and
    architectures define and read them."""
    import sys

    from lib.models.architectures.encoder_decoder import SHAPES
    from lib.models.config import POSITIONS
    from lib.models.families import FAMILIES
    from lib.objectives import OBJECTIVES

    home = {name: Path(sys.modules[type(family).__module__].__file__).resolve() for name, family in FAMILIES.items()}
    model_code = {LIB / "config" / "params.py", LIB / "models" / "config.py",
                  *(LIB / "models" / "architectures").glob("*.py")}

    def allowed(path: Path, tree: ast.Module) -> set:
        built = {call.args[0] for call in ast.walk(tree) if isinstance(call, ast.Call) and call.args
                 and getattr(call.func, "id", getattr(call.func, "attr", None)) == "build_objective"}
        objective_code = LIB / "objectives" in path.parents
        return {node for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
                and (path.resolve() == home.get(node.value)
                     or (node.value in OBJECTIVES and (objective_code or node in built))
                     or (node.value in (*POSITIONS, *SHAPES) and path in model_code))}

    assert names_outside(home, allowed) == []


def test_no_finetune_variant_is_named_outside_its_file():
    """A finetune variant owns everything about itself (lib/training/variants/<name>.py): its name as a string
    anywhere else in the code (another variant's file too) means knowledge of it sits outside its file.
    Its settings are a section of lib/config/params.py's FinetuneConfig, a field of the variant's name, not
    a string; the one place params.py may write names is finetune.variants' default list."""
    from lib.training.variants import VARIANTS

    def allowed(path: Path, tree: ast.Module) -> set:
        if path.parent == LIB / "training" / "variants":
            return {node for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value == path.stem}
        if path == LIB / "config" / "params.py":
            config = next(node for node in tree.body
                          if isinstance(node, ast.ClassDef) and node.name == "FinetuneConfig")
            default = next(node for node in config.body
                           if isinstance(node, ast.AnnAssign) and node.target.id == "variants")
            return set(ast.walk(default.value))
        return set()

    assert names_outside(VARIANTS, allowed) == []


def test_no_architecture_is_named_outside_its_module():
    """An architecture owns everything about itself (its module in lib/models/architectures/): its name as a
    string anywhere else in the code means knowledge of it sits outside its file. A config names its
    architecture through the registry (lib.models.architectures.architecture_of), never by a string."""
    import sys

    from lib.models.architectures import ARCHITECTURES

    home = {name: Path(sys.modules[cls.__module__].__file__).resolve() for name, cls in ARCHITECTURES.items()}

    def allowed(path: Path, tree: ast.Module) -> set:
        return {node for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
                and path.resolve() == home.get(node.value)}

    assert names_outside(home, allowed) == []



def test_no_optimizer_is_named_outside_optim():
    """An optimizer is one entry in lib/training/optim.py's OPTIMIZERS: its name as a string anywhere else in
    the code means knowledge of it sits outside that file. params.py's default `optimizer` value is the one
    exception (schedules are named by the variants that pick them, through `Schedule`, and are not checked)."""
    from lib.training.optim import OPTIMIZERS

    def allowed(path: Path, tree: ast.Module) -> set:
        if path == LIB / "training" / "optim.py":
            return set(ast.walk(tree))
        if path == LIB / "config" / "params.py":
            defaults = [node.value for node in ast.walk(tree)
                        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "optimizer"]
            return {constant for default in defaults for constant in ast.walk(default)}
        return set()

    assert names_outside(OPTIMIZERS, allowed) == []

NEW_MODULES = {  # a module each that subclasses an existing concept under a new name, and nothing else
    "lib/objectives/toy_lm.py": "from lib.objectives.base import register\nfrom lib.objectives.clm import CausalLM\n\n"
                                "@register\nclass ToyLM(CausalLM):\n    name = 'toy_lm'\n",
    "lib/training/variants/toy_finetune.py": "from lib.training.variants.base import register\n"
                                             "from lib.training.variants.plain import Plain\n\n"
                                             "@register\nclass ToyFinetune(Plain):\n    name = 'toy_finetune'\n",
}
REGISTERED = """
from lib.config.params import load_params
from lib.objectives import OBJECTIVES, check_objective
from lib.training.variants import VARIANTS, check_variants

params = load_params('params.yaml', checks=[check_objective, check_variants])
print(sorted(set(OBJECTIVES) | set(VARIANTS)))
"""


def test_a_new_objective_or_variant_is_its_module_alone(tmp_path):
    """What docs/extending.md says adding one takes, done: a module dropped into its package is found by
    name, accepted by params.yaml's checks and run by the stages (dvc.yaml lists the package's folder),
    with no other file edited (a new objective or variant with settings adds its section to params.py)."""
    shutil.copytree(LIB, tmp_path / "lib", ignore=shutil.ignore_patterns("__pycache__"))
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["objective"], params["finetune"]["variants"] = "toy_lm", ["plain", "toy_finetune"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for path, code in NEW_MODULES.items():
        (tmp_path / path).write_text(code)
    done = subprocess.run([sys.executable, "-c", REGISTERED], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert {"toy_lm", "toy_finetune"} <= set(ast.literal_eval(done.stdout.strip().splitlines()[-1]))
    assert {"lib/objectives", "lib/training/variants"} <= set(code_deps("pretrain") + code_deps("finetune"))
