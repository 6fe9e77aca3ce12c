"""The one module that talks to MLflow.

Runs. Every stage is a run named after the stage, nested under one parent run per pipeline execution
(a `dvc repro` or a `dvc exp run`) named `<DVC experiment name or "repro"> <short commit> <local start
time>`, e.g. `repro 226dfab 2026-11-24 14:30`; finetune and distill add a run per trained model under
their stage's run.

Same execution. DVC starts every stage as its own process and tells it nothing of the execution, so a
stage finds the parent of its pipeline key (git commit and a digest of the DVC experiment name and all
params) that its DVC process holds, else the newest of that key that no DVC holds, and joins it when
  - no run under it is RUNNING (those of dead processes were ended first, see below),
  - it has not got past this stage: no run of this stage or of one after it in dvc.yaml has FINISHED
    under it, and
  - it is still going: it is RUNNING under the DVC process that runs this stage (the previous stage
    handing over), or it was interrupted (its latest stage run FAILED or was KILLED, or DVC stopped
    between stages: the next `dvc repro`, whenever it comes, resumes it, the restarted stage beside its
    failed attempt), or its latest stage ended less than JOIN_WINDOW_S ago (stages run by hand).
Otherwise it opens a new parent. So a completed execution is never joined, nor one at other params.
The parent belongs to the DVC process that drives the execution: the stage's nearest ancestor that is
`dvc repro`, `dvc exp run` or `dvc exp exec-run` (how DVC's queue runs an experiment). A stage that
finishes leaves it RUNNING for the next one, unless it is the last stage DVC was asked to run
(`pipeline.until`: the furthest of the targets in dvc.yaml's order, else the last stage), which ends it
FINISHED; a stage that fails ends it FAILED. Outside DVC (a stage run by hand) the stage's own process
holds the parent and ends it as the stage ended.

Dead processes. A stage run carries the host and process id of its stage, a parent those of the process
that holds it. A stage killed outright (SIGKILL) ends nothing, nor does DVC stopped between stages, so the
next stage to open on this host marks KILLED every RUNNING stage (and child) run of this host whose process
is gone, and settles each parent whose process is gone and which has no run going: as its last stage when
that FAILED or was KILLED (KILLED when it has none); else FINISHED if the execution completed, KILLED if
not; why in `pipeline.ended`. Completed means: for a DVC experiment, that DVC wrote its git ref
(`dvc.exp_ref`, written only for an experiment that ran to the end) after the parent started; for a `dvc
repro`, that its last stage reached `pipeline.until` (one whose later stages DVC skipped as up to date
reads KILLED too: they leave no trace). Until then, a parent whose DVC was stopped reads RUNNING.

Store. `<project root>/mlflow.db`, absolute (from DVC_ROOT), so queued experiments that DVC runs in a
temp copy log to the same store, unless MLFLOW_TRACKING_URI is set. MLflow saves artifact locations as
absolute paths (its default for a SQLite store is `mlruns/` under the working directory of the process
that creates the experiment): a copied or moved store would point into the old folder, and a queued
experiment could write into its throw-away copy. So in a SQLite store the experiment's artifact
location is the relative `mlruns/<experiment id>`, and every run's artifacts lie in `mlruns/` beside
mlflow.db: this module writes them there from any working directory, and `mlflow ui` started in that
folder (where its default store is that mlflow.db) reads them, wherever the folder was copied or
moved; a reader started elsewhere finds none. Other stores (a tracking server) keep their own artifact
locations.

The experiment is tagged `mlflow.experimentKind: custom_model_development`, MLflow 3's mark of a model
training experiment. The 3.17 UI also has a switch per browser (GenAI / Machine learning, GenAI until
changed) that decides where `#/experiments/<id>` opens, so the stage that creates the experiment
prints the address of its runs table, `#/experiments/<id>/runs`, which opens there either way.

What is logged where. The settings a stage reads: params. Facts it reports (sizes, counts, durations,
throughputs, names): `log_summary`, as `summary.<key>` tags, columns of the runs table rather than
one-point charts. Curves (per step or epoch): metrics at their step. Final evaluation scores (losses,
accuracies): metrics at the step they were measured, since they are what runs are compared on.

If MLflow fails at any point, the stage warns once and goes on without tracking.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

from lib.config.params import TrackingConfig, flatten
from lib.core.errors import describe, redact, stop_if_interrupted
from lib.core.io import file_sha256, process_alive, project_root
# No telemetry or network calls from a tool that must work offline.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
# A tracking server that is down should cost seconds, not MLflow's default minutes of retries.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
# Logging a model re-reads its artifacts with a progress bar per file: noise in a stage's log.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

PIPELINE_OUTPUTS = ("dvc.lock", "metrics", "plots", "reports")  # committed to git, rewritten by the stages
JOIN_WINDOW_S = 600  # a stage starting later than this after the previous one finished opens a new parent
MAX_PARAM_CHARS = 500  # MLflow rejects values over 6000 chars; long lists are unreadable in the UI anyway
PARENT_ROLE, STAGE_ROLE = "pipeline", "stage"
OWNER_HOST, OWNER_PID = "process.host", "process.pid"  # tags: the process a run (and its children) lives in
# parent tags: the last stage, in dvc.yaml's order, that DVC was asked to run; the git ref DVC writes for an
# experiment that ran to the end; why the parent ended
UNTIL, EXP_REF, ENDED = "pipeline.until", "dvc.exp_ref", "pipeline.ended"
EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"
SUMMARY = "summary."  # prefix of the tags that hold a run's facts
ARTIFACTS = "mlruns"  # beside the SQLite store
# The model registry: evaluate registers each served task's teacher and student as a version of
# `<experiment>.<task>-<role>`; the alias points at the best of them by dev score
BEST_ALIAS, DEV = "best", "dev."  # DEV: prefix of a version's dev-score tags (dev.accuracy)
VERSION_TAGS = ("git.commit", "git.dirty", "dvc.exp_name", "pipeline.key", "pipeline.recipe", "pipeline.objective",
                "pipeline.init")
REGISTERED_DESCRIPTION = (f"Registered by the pipeline's evaluate stage, a version per distinct model (version tag "
                          f"model.sha256, of its files); alias '{BEST_ALIAS}' is the version with the highest dev "
                          "score (version tags dev.<metric>).")


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{project_root() / 'mlflow.db'}"


def _sqlite_store() -> Path | None:
    """The SQLite file of the store, None for other stores."""
    uri = tracking_uri()
    return Path(uri[len("sqlite:///"):]).resolve() if uri.startswith("sqlite:///") else None


def _absolute_artifact_uri(artifact_uri: str) -> str:
    """`artifact_uri` as found from any working directory (a queued experiment runs in a temp copy): a
    relative one is in the store's folder."""
    store, uri = _sqlite_store(), urllib.parse.urlparse(artifact_uri)
    relative = store is not None and not uri.scheme and not os.path.isabs(uri.path)
    return str(store.parent / artifact_uri) if relative else artifact_uri


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def run_tags(stage: str, all_params: Any) -> dict[str, str]:
    commit = _git("rev-parse", "--verify", "--quiet", "HEAD") or "unknown"  # "unknown" before a first commit
    # dirty = code or params differ from the commit; the outputs the pipeline itself rewrites (and
    # commits) do not count, or every stage after the first of a `dvc repro` would read dirty
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".",
                      *(f":(exclude){path}" for path in PIPELINE_OUTPUTS)))
    exp = os.environ.get("DVC_EXP_NAME", "")
    flat = flatten(all_params)
    params = json.dumps({k: str(v) for k, v in flat.items()}, sort_keys=True)
    # hex digits only: the key goes into MLflow filter strings, which an experiment name (bob's-exp) would break
    digest = hashlib.sha256(f"{exp}\n{params}".encode()).hexdigest()[:16]
    tags = {"git.commit": commit, "git.dirty": str(dirty).lower(), "dvc.exp_name": exp or "workspace",
            "pipeline.key": f"{commit}/{digest}", "stage": stage}
    # what experiments are compared by: a column and a filter in `mlflow ui` (tags.pipeline.objective = 'electra')
    return tags | {f"pipeline.{key}": str(flat[key]) for key in ("recipe", "objective", "init")
                   if flat.get(key) is not None}


def registered_name(experiment: str, model: str) -> str:
    """The registered model of `model` (e.g. imdb-student) in `experiment`: letters, digits, '.', '_' and
    '-' only, so that it reads in a models:/ URI and in a registry search as it is."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"{experiment}.{model}")


def _clip(value: Any) -> str:
    text = str(value)
    return text if len(text) <= MAX_PARAM_CHARS else text[: MAX_PARAM_CHARS - 3] + "..."


class StageRun:
    """A stage's MLflow run. Every call is safe: the first failure warns once and turns tracking off."""

    def __init__(self, client: Any = None, run_id: str | None = None, parent_id: str | None = None, stage: str = "",
                 ends_pipeline: bool = True):
        self.client, self.run_id, self.parent_id, self.stage = client, run_id, parent_id, stage
        self.ends_pipeline = ends_pipeline  # whether its finishing ends the parent (module docstring)

    @property
    def active(self) -> bool:
        return self.client is not None

    @contextlib.contextmanager
    def _guarded(self, what: str) -> Iterator[None]:
        """Run the block; an error in it warns (once per process) and turns tracking off for this run."""
        try:
            yield
        except Exception as err:
            stop_if_interrupted()  # an error that a swallowed Ctrl-C caused ends the stage, not tracking
            warn(f"MLflow could not {what} ({describe(err)}); the stage goes on without tracking")
            self.client = None

    def _call(self, what: str, method: str, *args: Any, **kwargs: Any) -> None:
        """self.client.<method>(*args, **kwargs), unless tracking is off or has failed."""
        if self.active:
            with self._guarded(what):
                getattr(self.client, method)(*args, **kwargs)

    def _log_batch(self, what: str, kind: str, items: list, size: int) -> None:
        """`items` of one kind (params, metrics or tags) in batches of at most `size`, MLflow's limit."""
        for i in range(0, len(items), size):
            self._call(what, "log_batch", self.run_id, **{kind: items[i:i + size]})

    def log_params(self, params: dict[str, Any]) -> None:
        """Settings: what the run was asked to do."""
        if not self.active:  # also when mlflow is not installed: nothing of it may be imported then
            return
        from mlflow.entities import Param

        self._log_batch("log params", "params", [Param(k, _clip(v)) for k, v in sorted(flatten(params).items())], 100)

    def log_summary(self, facts: dict[str, Any]) -> None:
        """Facts the run reports (sizes, counts, durations, names), as `summary.<key>` tags."""
        if not self.active:
            return
        from mlflow.entities import RunTag

        self._log_batch("log the summary", "tags", [RunTag(SUMMARY + k, _clip(v))
                                                    for k, v in sorted(flatten(facts).items()) if v is not None], 100)

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Curves (a point at `step`) and final scores; values that are not numbers are left out."""
        if not self.active:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._log_batch("log metrics", "metrics", [Metric(k, float(v), now, step or 0)
                                                   for k, v in sorted(flatten(metrics).items())
                                                   if isinstance(v, (int, float)) and not isinstance(v, bool)], 1000)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """A file, or a folder's files, into the run's artifacts (under `artifact_path`)."""
        if not self.active:
            return
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        with self._guarded(f"log artifact {path}"):
            uri = self.client.get_run(self.run_id).info.artifact_uri
            repository = get_artifact_repository(_absolute_artifact_uri(uri))
            (repository.log_artifacts if Path(path).is_dir() else repository.log_artifact)(str(path), artifact_path)

    def on_log(self, step: int, row: dict[str, Any]) -> None:
        """Trainer callback: a row of training metrics at `step`."""
        self.log_metrics({k: v for k, v in row.items() if k != "step"}, step=step)

    on_eval = on_log  # validation rows are logged the same way

    def child(self, name: str, params: dict[str, Any], tags: dict[str, str]) -> StageRun:
        """A run nested under this one (a finetune stage's task x variant x seed), with its params logged."""
        child = StageRun()
        if self.active:
            with self._guarded(f"open run {name}"):
                parent = self.client.get_run(self.run_id)
                tags = {**{k: v for k, v in parent.data.tags.items() if k in CHILD_TAGS}, **tags,
                        "mlflow.parentRunId": self.run_id}
                run = self.client.create_run(parent.info.experiment_id, run_name=name, tags=tags)
                child = StageRun(self.client, run.info.run_id)
        child.log_params(params)
        return child

    def parent(self) -> StageRun:
        """The pipeline's parent run (inactive when there is none), for what sums up the whole chain."""
        return StageRun(self.client if self.parent_id else None, self.parent_id)

    def log_model(self, log: Callable[[Path, str], str], folder: Path, name: str) -> str | None:
        """Run `log(folder, name)` (e.g. lib.serving.predict.log_pyfunc, which logs the model in `folder` into the
        active run) inside this run; returns the model's URI, or None when tracking is off or logging failed
        (warned once). The caller passes the logging code, so a stage that logs no model never imports it."""
        if not self.active:
            return None
        import mlflow

        folder, store = Path(folder).resolve(), _sqlite_store()
        with self._guarded(f"log model {name}"), _fluent_store():
            # MLflow writes a model where its relative artifact location points from the working directory
            with contextlib.chdir(store.parent) if store else contextlib.nullcontext():
                with mlflow.start_run(run_id=self.run_id):
                    return log(folder, name)
        return None

    def register_folder(self, log: Callable[[Path, str], str], folder: Path, artifact: str, name: str,
                        dev: dict[str, float], metric: str) -> None:
        """The model in `folder` as a version of the registered model `name`: logged as `artifact` (log_model) and
        registered (register_model), unless a version of `name` holds the same files already (tag MODEL_DIGEST,
        folder_sha256): evaluate run again on unchanged models adds no version, and says which one it is. Either
        way the run names its version in the summary tag `registered.<artifact>`. Nothing when tracking is off."""
        if not self.active:
            return
        digest, version = folder_sha256(folder), None
        with self._guarded(f"look up model {name}"):
            version = self._version_holding(name, digest)
            if version is not None:
                print(f"MLflow: {folder} is version {version} of {name} already (the same files); not registered "
                      "again", flush=True)
                self._point_best(name, metric)  # as it would be after registering it
        if version is None:
            version = self.register_model(self.log_model(log, folder, artifact), name, dev, metric, digest)
        if version is not None:
            self.log_summary({"registered": {artifact: f"models:/{name}/{version}"}})

    def register_model(self, model_uri: str | None, name: str, dev: dict[str, float], metric: str,
                       digest: str | None = None) -> str | None:
        """Register `model_uri` (a model this run logged) as a new version of the registered model `name`,
        tagged with what made it (commit, DVC experiment, objective, init), its dev scores and `digest` (of its
        files, MODEL_DIGEST), and point the alias BEST_ALIAS (_point_best). A version whose `digest` an earlier
        version holds (another evaluate registered the same files meanwhile) is deleted again. Returns the
        version that holds the model; None when tracking is off or registering failed (warned once)."""
        if not self.active or model_uri is None:
            return None
        from mlflow.exceptions import MlflowException

        with self._guarded(f"register model {name}"), _fluent_store():  # where it looks a models:/ source up
            try:
                self.client.create_registered_model(name, description=REGISTERED_DESCRIPTION)
            except MlflowException as err:
                if err.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
            made_by = {k: v for k, v in self.client.get_run(self.run_id).data.tags.items() if k in VERSION_TAGS}
            version = str(self.client.create_model_version(
                name, model_uri, run_id=self.run_id, model_id=model_uri.removeprefix("models:/"),
                tags={**made_by, **{f"{DEV}{m}": str(v) for m, v in dev.items()},
                      **({MODEL_DIGEST: digest} if digest else {})}).version)
            # version numbers grow in the order versions are made: the lowest one of a digest is the one to keep
            first = self._version_holding(name, digest) if digest else None
            if first is not None and int(first) < int(version):
                self.client.delete_model_version(name, version)
                print(f"MLflow: another evaluate registered the same model as version {first} of {name} meanwhile; "
                      f"version {version} removed again", flush=True)
                version = first
            self._point_best(name, metric)
            return version
        return None

    def _version_holding(self, name: str, digest: str) -> str | None:
        """The first version of the registered model `name` whose files have `digest`, None if there is none."""
        held = [int(v.version) for v in self.client.search_model_versions(f"name = '{name}'")
                if v.tags.get(MODEL_DIGEST) == digest]
        return str(min(held)) if held else None

    def _point_best(self, name: str, metric: str) -> None:
        """Point the alias BEST_ALIAS of `name` at the version with the highest dev `metric` of all that have one,
        the newest on a tie (the dev split chose the kept model, never the reported one); a version whose files
        an earlier version holds never takes it, since its registering run is about to delete it."""
        first: dict[str, Any] = {}
        for v in sorted(self.client.search_model_versions(f"name = '{name}'"), key=lambda v: int(v.version)):
            first.setdefault(v.tags.get(MODEL_DIGEST, v.version), v)
        scored = [v for v in first.values() if DEV + metric in v.tags]
        if scored:
            best = max(scored, key=lambda v: (float(v.tags[DEV + metric]), int(v.version)))
            self.client.set_registered_model_alias(name, BEST_ALIAS, best.version)

    def finish(self, status: str) -> None:
        """End the run with `status`, and the parent with it unless the stage FINISHED and the execution goes on."""
        self._call("end the run", "set_terminated", self.run_id, status)
        if self.active and self.parent_id and (status != "FINISHED" or self.ends_pipeline):
            with self._guarded("end the parent run"):
                _end_parent(self.client, self.parent_id, status, _ending(self.stage, status))


@contextlib.contextmanager
def _fluent_store() -> Iterator[None]:
    """MLflow's global tracking URI on this store for the block, as MLflow's fluent API and parts of its
    client (the registry finding a models:/ source) use it; then unset, MLFLOW_TRACKING_URI as it was
    (set_tracking_uri sets that variable too, which tracking_uri() reads)."""
    import mlflow

    before = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(tracking_uri())
    try:
        yield
    finally:
        mlflow.set_tracking_uri(None)
        if before is not None:
            os.environ["MLFLOW_TRACKING_URI"] = before


MODEL_DIGEST = "model.sha256"  # a registered version's tag: folder_sha256 of the model folder it was logged from


def folder_sha256(folder: Path) -> str:
    """A SHA-256 of the files under `folder`: each one's path in it and its own SHA-256, in sorted order. The
    same files give the same digest, wherever the folder lies and whenever they were written."""
    folder, digest = Path(folder), hashlib.sha256()
    for name in sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{name}\0{file_sha256(folder / name)}\n".encode())
    return digest.hexdigest()


_warned = False
CHILD_TAGS = ("git.commit", "git.dirty", "dvc.exp_name", "pipeline.key", "pipeline.recipe", "pipeline.objective",
              "pipeline.init", "stage", OWNER_HOST, OWNER_PID)  # copied from the stage's run where it has them


def warn(message: str) -> None:
    global _warned
    if not _warned:
        print(f"warning: {redact(message)}", file=sys.stderr)
        _warned = True


def _experiment_id(client: Any, name: str) -> str:
    """The experiment `name`, created if need be, tagged as model training, its artifacts beside the store.
    Stages of two projects may find it missing at once on a shared server: the one whose creation comes
    second joins the experiment the first made."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            created = client.create_experiment(name, tags={EXPERIMENT_KIND: MODEL_TRAINING})
        except MlflowException as err:
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = client.get_experiment_by_name(name)
        else:
            experiment = client.get_experiment(created)
            print(redact(f"MLflow: created experiment {name} in {tracking_uri()}; in `mlflow ui` its runs table is "
                         f"#/experiments/{experiment.experiment_id}/runs"), flush=True)
    if EXPERIMENT_KIND not in experiment.tags:
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)
    _keep_artifacts_beside_the_store(experiment)
    return experiment.experiment_id


def _keep_artifacts_beside_the_store(experiment: Any) -> None:
    """In a SQLite store, replace an absolute local artifact location (MLflow's default, or the folder a
    copied store came from) by `mlruns/<id>`, relative to the store's folder. MLflow's API resolves every
    location it is given to an absolute one, hence SQL."""
    store, location = _sqlite_store(), urllib.parse.urlparse(experiment.artifact_location)
    if store is None or location.scheme not in ("", "file") or not os.path.isabs(location.path):
        return
    with contextlib.closing(sqlite3.connect(store, timeout=30)) as db, db:
        db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?",
                   (f"{ARTIFACTS}/{experiment.experiment_id}", int(experiment.experiment_id)))


def _pipeline_order() -> list[str]:
    """The stages in dvc.yaml's order, the order DVC runs them in (none outside a DVC project)."""
    try:
        return list(yaml.safe_load((project_root() / "dvc.yaml").read_text(encoding="utf-8"))["stages"])
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return []


def _children(client: Any, experiment_id: str, run_id: str) -> list:
    """The runs directly under `run_id`, newest first."""
    return client.search_runs([experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'",
                              order_by=["attributes.start_time DESC"])


def _ancestors() -> list[tuple[int, list[str]]]:
    """This process's ancestors, nearest first, as (process id, command line); those that cannot be read left out."""
    import psutil

    ancestors = []
    for process in psutil.Process().parents():
        with contextlib.suppress(psutil.Error):  # gone meanwhile, or another user's
            ancestors.append((process.pid, process.cmdline()))
    return ancestors


def _dvc_arguments(command: list[str]) -> list[str] | None:
    """The arguments `command` gives DVC when it runs DVC (`dvc ...`, `python .../dvc ...`, `python -m dvc
    ...`), else None."""
    if command and Path(command[0]).name == "dvc":
        return command[1:]
    if len(command) > 1 and Path(command[0]).name.startswith("python"):
        if Path(command[1]).name == "dvc":
            return command[2:]
        if command[1:3] == ["-m", "dvc"]:
            return command[3:]
    return None


def _dvc_driver() -> tuple[int, argparse.Namespace] | None:
    """The DVC process that runs this stage's execution, the nearest ancestor that is `dvc repro`, `dvc exp run`
    or `dvc exp exec-run` (how DVC's queue runs one experiment), as its process id and its arguments as DVC
    parses them; None outside DVC."""
    for pid, command in _ancestors():
        arguments = _dvc_arguments(command)
        if arguments is None:
            continue
        from dvc.cli import DvcParserError, parse_args
        from dvc.commands.experiments.exec_run import CmdExecutorRun
        from dvc.commands.experiments.run import CmdExperimentsRun
        from dvc.commands.repro import CmdRepro

        with contextlib.suppress(DvcParserError):  # another DVC version's command: not ours to read
            args = parse_args(arguments)
            if args.func in (CmdRepro, CmdExperimentsRun, CmdExecutorRun):
                return pid, args
    return None


def _last_stage_asked(args: argparse.Namespace, order: list[str]) -> str | None:
    """The furthest stage in dvc.yaml's `order` that a DVC command with `args` runs: its targets' furthest, or the
    last stage when it has no target (`dvc exp exec-run` keeps them in the queue), starts from them (--downstream)
    or names more than stages (a dvc.yaml file, a folder, --pipeline). None outside a DVC project."""
    targets = [target.rsplit(":", 1)[-1] for target in getattr(args, "targets", None) or []]  # dvc.yaml:stage
    named = [[s for s in order if (fnmatch.fnmatchcase(s, t) if getattr(args, "glob", False) else s == t)]
             for t in targets]
    whole = any(getattr(args, flag, False) for flag in ("downstream", "pipeline", "all_pipelines"))
    if not order or not named or not all(named) or whole:
        return order[-1] if order else None
    return max((s for stages in named for s in stages), key=order.index)


def _reached(stage: str, until: str | None, order: list[str]) -> bool:
    """Whether `stage` is `until` or after it in `order`; True where either is not in it (nothing to wait for)."""
    return stage not in order or until not in order or order.index(stage) >= order.index(until)


def _experiment_ref() -> str | None:
    """The git ref of this DVC experiment (refs/exps/<baseline commit, split after 2 digits>/<name>), which DVC
    writes when the experiment has run to the end; None outside an experiment."""
    name, baseline = os.environ.get("DVC_EXP_NAME"), os.environ.get("DVC_EXP_BASELINE_REV")
    if not (name and baseline):
        return None
    from dvc.repo.experiments.refs import ExpRefInfo

    return str(ExpRefInfo(baseline, name))


@contextlib.contextmanager
def _first_contact() -> Iterator[None]:
    """An exclusive lock on the SQLite store's folder for the block (other stores need none). MLflow creates and
    migrates a new SQLite store's tables on first contact, unguarded: two stages that start at once on a new
    store (two projects or queued experiments sharing it) both migrate it, and one or both lose their run,
    or leave it half-migrated, broken for every later stage. The block also creates the experiment, which two
    stages at once would both try, the second failing."""
    store = _sqlite_store()
    if store is None:
        yield
        return
    folder = os.open(store.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)  # and the lock with it


def _find_parent(client: Any, experiment_id: str, tags: dict[str, str], owner: dict[str, str]) -> Any:
    """The parent of this stage's pipeline execution, driven by `owner`; None when it needs a new one (module
    docstring): the parent of its key that `owner` holds RUNNING, else the newest one of its key that is not
    RUNNING. One that another live DVC holds is another execution's, e.g. of a clone at the same commit and
    params logging to the same store: joining it would split both executions."""
    key = f"tags.`pipeline.key` = '{tags['pipeline.key']}' and tags.`pipeline.role` = '{PARENT_ROLE}'"
    driven = " and ".join(f"tags.`{k}` = '{v}'" for k, v in owner.items())
    newest = {"max_results": 1, "order_by": ["attributes.start_time DESC"]}
    parents = (client.search_runs([experiment_id], f"{key} and attributes.status = 'RUNNING' and {driven}", **newest)
               or client.search_runs([experiment_id], f"{key} and attributes.status != 'RUNNING'", **newest))
    if not parents:
        return None
    parent = parents[0]
    stages = _children(client, experiment_id, parent.info.run_id)
    order = _pipeline_order()
    this_and_later = order[order.index(tags["stage"]):] if tags["stage"] in order else [tags["stage"]]
    if any(s.info.status == "RUNNING" or (s.info.status == "FINISHED" and s.data.tags.get("stage") in this_and_later)
           for s in stages):
        return None
    if parent.info.status == "RUNNING":  # ours: DVC hands it from stage to stage
        return parent
    if parent.info.status == "KILLED" or (stages and stages[0].info.status in ("FAILED", "KILLED")):
        return parent  # interrupted: resumed whenever it is run again
    last_end = stages[0].info.end_time if stages else parent.info.start_time
    return parent if time.time() * 1000 - (last_end or 0) < JOIN_WINDOW_S * 1000 else None


def _end_dead_runs(client: Any, experiment_id: str) -> None:
    """Mark KILLED the runs left RUNNING by a process of this host that is gone (a stage, a child run of
    one, killed outright), and settle the parents whose DVC process is gone."""
    running = client.search_runs([experiment_id], filter_string=f"attributes.status = 'RUNNING' and "
                                                              f"tags.`{OWNER_HOST}` = '{socket.gethostname()}'")
    dead = [r for r in running if not process_alive(int(r.data.tags[OWNER_PID]))]
    for run in dead:
        if run.data.tags.get("pipeline.role") != PARENT_ROLE:
            client.set_terminated(run.info.run_id, "KILLED")
    for run in dead:  # after their stages: a parent with a stage still running waits for it
        if run.data.tags.get("pipeline.role") == PARENT_ROLE:
            _settle_parent(client, experiment_id, run)


def _settle_parent(client: Any, experiment_id: str, parent: Any) -> None:
    """End a parent whose DVC process is gone, when no stage runs under it, as the module docstring says."""
    stages = _children(client, experiment_id, parent.info.run_id)
    if any(s.info.status == "RUNNING" for s in stages):
        return
    if not stages:
        _end_parent(client, parent.info.run_id, "KILLED", "stopped before any stage")
        return
    last, status = stages[0].data.tags.get("stage", ""), stages[0].info.status
    if status != "FINISHED" or _completed(parent, last):
        _end_parent(client, parent.info.run_id, status, _ending(last, status))
    else:
        order = _pipeline_order()
        following = order[order.index(last) + 1:] if last in order else []
        _end_parent(client, parent.info.run_id, "KILLED",
                    f"after {last}: DVC stopped" + (f" before {following[0]}" if following else ""))


def _completed(parent: Any, last: str) -> bool:
    """Whether the execution of `parent`, whose DVC process is gone after its stage `last` FINISHED, ran to its end:
    DVC wrote the experiment's git ref after the parent started (not an earlier run's, replaced by `dvc exp run
    -f`), or outside an experiment `last` reached the stage DVC was asked to run until."""
    ref = parent.data.tags.get(EXP_REF)
    if ref:
        made = _git("-C", str(project_root()), "for-each-ref", "--format=%(committerdate:unix)", ref)
        return made.isdigit() and int(made) >= parent.info.start_time // 1000
    return _reached(last, parent.data.tags.get(UNTIL), _pipeline_order())


def _ending(stage: str, status: str) -> str:
    """Why a parent ended with `status`, its last stage `stage` having ended so (the ENDED tag)."""
    return {"FINISHED": "complete", "FAILED": f"{stage} failed"}.get(status, f"{stage} was killed")


def _end_parent(client: Any, parent_id: str, status: str, why: str) -> None:
    client.set_tag(parent_id, ENDED, why)
    client.set_terminated(parent_id, status)


def _open_run(stage: str, cfg: TrackingConfig, all_params: Any) -> StageRun:
    from mlflow.entities import RunTag
    from mlflow.tracking import MlflowClient

    with _first_contact():
        # the registry in the same store: MLflow's default registry is the default tracking URI, a mlflow.db in the
        # working directory (a queued experiment's throw-away copy)
        client = MlflowClient(tracking_uri=tracking_uri(), registry_uri=tracking_uri())
        experiment_id = _experiment_id(client, cfg.experiment)
    _end_dead_runs(client, experiment_id)
    tags = run_tags(stage, all_params)
    driver, order = _dvc_driver(), _pipeline_order()
    until = _last_stage_asked(driver[1], order) if driver else None
    owner = {OWNER_HOST: socket.gethostname(), OWNER_PID: str(driver[0] if driver else os.getpid())}
    execution = {**owner, **({UNTIL: until} if until else {}),
                 **({EXP_REF: ref} if (ref := _experiment_ref()) else {})}
    parent = _find_parent(client, experiment_id, tags, owner)
    if parent is None:
        parent_tags = {**tags, **execution, "pipeline.role": PARENT_ROLE}
        del parent_tags["stage"]
        name = f"{os.environ.get('DVC_EXP_NAME') or 'repro'} {tags['git.commit'][:7]} {time.strftime('%Y-%m-%d %H:%M')}"
        parent_id = client.create_run(experiment_id, tags=parent_tags, run_name=name).info.run_id
        StageRun(client, parent_id).log_params(all_params)
    else:
        parent_id = parent.info.run_id
        client.log_batch(parent_id, tags=[RunTag(k, v) for k, v in execution.items()])  # this DVC drives it now
        if ENDED in parent.data.tags:
            client.delete_tag(parent_id, ENDED)
        client.update_run(parent_id, status="RUNNING")
    run = client.create_run(experiment_id, run_name=stage, tags={
        **tags, OWNER_HOST: socket.gethostname(), OWNER_PID: str(os.getpid()), "pipeline.role": STAGE_ROLE,
        "mlflow.parentRunId": parent_id})
    ends_pipeline = driver is None or _reached(stage, until, order)
    return StageRun(client, run.info.run_id, parent_id, stage, ends_pipeline)


@contextlib.contextmanager
def stage_run(stage: str, cfg: TrackingConfig, all_params: Any, stage_params: dict[str, Any]) -> Iterator[StageRun]:
    """Open this stage's run (under its pipeline's parent), log its params, and end it with the
    stage's status. `all_params` go on the parent, `stage_params` (what the stage reads) on the run."""
    run = StageRun()
    if cfg.enabled and os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 alone logs
        try:
            run = _open_run(stage, cfg, all_params)
        except Exception as err:
            stop_if_interrupted()
            warn(f"MLflow tracking is off for this stage ({describe(err)}); "
                 f"check MLFLOW_TRACKING_URI or {project_root() / 'mlflow.db'}")
    run.log_params(stage_params)
    try:
        yield run
    except BaseException:
        run.finish("FAILED")
        raise
    run.finish("FINISHED")
