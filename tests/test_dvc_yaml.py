"""dvc.yaml against the code: every stage depends on every project file it runs (its import closure),
so editing one reruns exactly the stages whose results it can change; outputs persist (a failed stage
leaves the last good ones); and each stage script keys its saved progress on dvc.yaml's params list."""
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT
from tests.stage_deps import DVC_YAML, RECIPES, closure, code_deps, docstring_only, with_derived_deps

DVC = yaml.safe_load(DVC_YAML.read_text())["stages"]


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


def test_dvc_yaml_lists_the_code_deps_derived_from_the_imports():
    """Adding a lib file means one command, not edits of several stages by hand."""
    text = DVC_YAML.read_text()
    code = {stage: [d for d in DVC[stage]["deps"] if Path(d).parts[0] in ("lib", "stages")] for stage in DVC}
    stale = [stage for stage in DVC if code[stage] != code_deps(stage)]
    assert not stale and with_derived_deps(text) == text, (
        f"dvc.yaml: the code deps of {', '.join(stale) or 'a stage'} are not what it runs; "
        "`python -m tests.stage_deps` writes them")


def test_a_registry_is_one_folder_dep():
    """A new objective, variant or family lands in every stage that reads its registry with no edit."""
    listed = set(code_deps("pretrain") + code_deps("finetune"))
    assert {"lib/objectives", "lib/training/variants", "lib/models/families"} <= listed
    assert not any(d.startswith("lib/objectives/") for d in code_deps("pretrain"))


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
