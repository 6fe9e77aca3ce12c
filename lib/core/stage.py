"""What every stage script does first: read its paths from the command line, check that its outputs can
be written, load and validate params.yaml, and open its tracked run, keyed on the params dvc.yaml
lists for it (lib.config.params.stage_params).

    stage = open_stage("clean", __doc__, inputs={"raw": "data/raw"},
                       outputs={"out": "data/clean", "metrics": "metrics/clean.json", "plots": "plots/clean"})
    with stage.run() as run:
        ...  # stage.args.raw, stage.args.out, ..., stage.params

A path argument is `--<name>` (underscores as dashes), its default the path dvc.yaml passes.
"""
from __future__ import annotations

import argparse
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

import yaml

from lib.config.errors import UserError
from lib.config.params import Params, TrainConfig, load_params, read_yaml, recipe_line, stage_params
from lib.core import distributed, tracking
from lib.core.io import check_writable


@dataclass
class Stage:
    name: str
    args: argparse.Namespace  # --params and one Path per input and output
    params: Params
    keyed_on: dict[str, Any]  # the params dvc.yaml lists for the stage: what its progress and run are keyed on

    def relaunch(self) -> bool:
        """Under impl.nproc > 1, start this stage again under torchrun and return True (the caller
        returns: the launched processes do the work); False where this process is to do it. The token
        budget stages (pretrain, adapt: a TrainConfig section) give each rank an even share of every
        batch's rows (lib.training.lm); finetune and distill split batches of any size."""
        section = getattr(self.params, self.name)
        split = {f"{self.name}.batch_size": section.batch_size} if isinstance(section, TrainConfig) else {}
        return distributed.relaunch(self.params.impl, f"stages.{self.name}", split)

    def run(self) -> ContextManager[tracking.StageRun]:
        """The stage's MLflow run (a no-op where tracking is off), ended with the stage's status."""
        return tracking.stage_run(self.name, self.params.tracking, self.params, self.keyed_on)


def check_experiment_name() -> None:
    """Refuse, before any work, an experiment name (DVC_EXP_NAME, set by `dvc exp run`) that DVC could not
    save. DVC saves an experiment only after its last stage, as the git ref refs/exps/<baseline>/<name>,
    written as the file <name>.lock and renamed: a name over the file system's limit on a file name (255
    bytes on ext4) less those 5 bytes fails there, the work done and lost. DVC itself refuses, before any
    stage, a name that breaks git's other rules for refs."""
    name = os.environ.get("DVC_EXP_NAME")
    if not name:
        return
    size, limit = len(os.fsencode(name)), os.pathconf(os.environ.get("DVC_ROOT", "."), "PC_NAME_MAX") - len(".lock")
    if size > limit:
        chars = f" in UTF-8 ({len(name)} characters)" if len(name) != size else ""
        raise UserError(f"experiment name '{name[:20]}...' is {size} bytes long{chars}; DVC can save an experiment "
                        f"only under a name of at most {limit} bytes (its git ref is a file of that name); run it "
                        "again with a shorter name: dvc exp run -n <name>")


def open_stage(name: str, doc: str, inputs: dict[str, str], outputs: dict[str, str],
               checks: Sequence[Callable[[Params], None]] = ()) -> Stage:
    """Refuse an experiment name DVC cannot save, parse the command line (`doc`'s first line is its help),
    check every output writable (one line naming the first that is not), and load params.yaml (one line
    naming a bad key, or a value this run changed that the recipe would replace), checked also by
    `checks`: those of the registries the stage uses (lib.tasks.check_tasks for the stages that read
    `tasks`, lib.objectives.check_objective for those that pretrain). Prints what the recipe changes."""
    check_experiment_name()
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    for option, default in {**inputs, **outputs}.items():
        parser.add_argument(f"--{option.replace('_', '-')}", type=Path, default=Path(default))
    args = parser.parse_args()
    check_writable(*(getattr(args, option) for option in outputs))
    params = load_params(args.params, checks, committed_params(args.params))
    line = recipe_line(read_yaml(args.params), args.params)
    if line and os.environ.get("RANK", "0") == "0":  # said once, not by every rank
        print(line, flush=True)
    return Stage(name, args, params, stage_params(params, name))


def committed_params(path: Path) -> dict[str, Any] | None:
    """The params file as the run's baseline commit has it (the experiment's under `dvc exp run`, else
    HEAD): what tells the values `-S` or a hand edit changed. None where git has no such file (a params
    file outside the checkout, no git) or it is not a mapping."""
    rev, path = os.environ.get("DVC_EXP_BASELINE_REV") or "HEAD", Path(path).resolve()
    try:
        shown = subprocess.run(["git", "-C", str(path.parent), "show", f"{rev}:./{path.name}"], capture_output=True,
                               text=True, timeout=30)
        committed = yaml.safe_load(shown.stdout) if shown.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, yaml.YAMLError):
        return None
    return committed if isinstance(committed, dict) else None
