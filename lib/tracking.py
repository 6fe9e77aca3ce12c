"""The one module that talks to MLflow.

Each stage is a run, nested under one parent run per pipeline execution (a `dvc repro` or a
`dvc exp run`). DVC starts every stage as its own process and says nothing of the execution, so a
stage joins the newest parent of its pipeline key (DVC experiment name + git commit) when that
parent has no run of this stage yet, no run still going, and its last run ended moments ago;
otherwise it opens a new parent. Each stage run is tagged with the host and process id that own it:
a stage killed outright (SIGKILL) ends nothing, so the next stage to open marks the runs of this
host whose process is gone KILLED. The store is `<project root>/mlflow.db` (absolute, so queued
experiments that run in a temp copy log to the same store) unless MLFLOW_TRACKING_URI is set.
If MLflow fails at any point, the stage warns once and goes on without tracking.
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from lib.config import TrackingConfig, flatten
from lib.errors import describe, redact
from lib.io import process_alive, project_root

# No telemetry or network calls from a tool that must work offline.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
# A tracking server that is down should cost seconds, not MLflow's default minutes of retries.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
# Logging a model re-reads its artifacts with a progress bar per file: noise in a stage's log.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

JOIN_WINDOW_S = 600  # a stage starting later than this after the previous one ended opens a new parent
MAX_PARAM_CHARS = 500  # MLflow rejects values over 6000 chars; long lists are unreadable in the UI anyway
PARENT_ROLE, STAGE_ROLE = "pipeline", "stage"
OWNER_HOST, OWNER_PID = "process.host", "process.pid"  # tags: the process a stage run (and its children) lives in


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{project_root() / 'mlflow.db'}"


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def run_tags(stage: str) -> dict[str, str]:
    commit = _git("rev-parse", "--verify", "--quiet", "HEAD") or "unknown"  # "unknown" before a first commit
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    exp = os.environ.get("DVC_EXP_NAME", "")
    return {"git.commit": commit, "git.dirty": str(dirty).lower(), "dvc.exp_name": exp or "workspace",
            "pipeline.key": f"{exp or 'workspace'}@{commit}", "stage": stage}


def _clip(value: Any) -> str:
    text = str(value)
    return text if len(text) <= MAX_PARAM_CHARS else text[: MAX_PARAM_CHARS - 3] + "..."


class StageRun:
    """A stage's MLflow run. Every call is safe: the first failure warns once and turns tracking off."""

    def __init__(self, client: Any = None, run_id: str | None = None, parent_id: str | None = None):
        self.client, self.run_id, self.parent_id = client, run_id, parent_id

    @property
    def active(self) -> bool:
        return self.client is not None

    def _call(self, what: str, method: str, *args: Any, **kwargs: Any) -> None:
        """self.client.<method>(*args, **kwargs), unless tracking is off or has failed."""
        if not self.active:
            return
        try:
            getattr(self.client, method)(*args, **kwargs)
        except Exception as err:
            warn(f"MLflow could not {what} ({describe(err)}); the stage goes on without tracking")
            self.client = None

    def log_params(self, params: dict[str, Any]) -> None:
        if not self.active:  # also when mlflow is not installed: nothing of it may be imported then
            return
        from mlflow.entities import Param

        items = [Param(k, _clip(v)) for k, v in sorted(flatten(params).items())]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self._call("log params", "log_batch", self.run_id, params=items[i:i + 100])

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if not self.active:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step or 0) for k, v in sorted(flatten(metrics).items())
                 if isinstance(v, (int, float)) and not isinstance(v, bool)]
        for i in range(0, len(items), 1000):
            self._call("log metrics", "log_batch", self.run_id, metrics=items[i:i + 1000])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        method = "log_artifacts" if Path(path).is_dir() else "log_artifact"
        self._call(f"log artifact {path}", method, self.run_id, str(path), artifact_path)

    def on_log(self, step: int, row: dict[str, Any]) -> None:
        """Trainer callback: a row of training metrics at `step`."""
        self.log_metrics({k: v for k, v in row.items() if k != "step"}, step=step)

    on_eval = on_log  # validation rows are logged the same way

    def child(self, name: str, params: dict[str, Any], tags: dict[str, str]) -> StageRun:
        """A run nested under this one (a finetune stage's task x variant x seed), with its params logged."""
        child = StageRun()
        if self.active:
            try:
                parent = self.client.get_run(self.run_id)
                tags = {**{k: v for k, v in parent.data.tags.items() if k in CHILD_TAGS}, **tags,
                        "mlflow.parentRunId": self.run_id}
                run = self.client.create_run(parent.info.experiment_id, run_name=name, tags=tags)
                child = StageRun(self.client, run.info.run_id)
            except Exception as err:
                warn(f"MLflow could not open run {name} ({describe(err)}); the stage goes on without tracking")
                self.client = None
        child.log_params(params)
        return child

    def parent(self) -> StageRun:
        """The pipeline's parent run (inactive when there is none), for what sums up the whole chain."""
        return StageRun(self.client if self.parent_id else None, self.parent_id)

    def log_model(self, log: Callable[[], str], name: str) -> str | None:
        """Run `log` (e.g. lib.predict.log_pyfunc of a folder, which logs an MLflow model into the active
        run) inside this run; returns its URI, or None when tracking is off or logging failed (warned once).
        The caller passes the logging code, so a stage that logs no model never imports it."""
        if not self.active:
            return None
        import mlflow

        try:
            mlflow.set_tracking_uri(tracking_uri())
            with mlflow.start_run(run_id=self.run_id):
                return log()
        except Exception as err:
            warn(f"MLflow could not log model {name} ({describe(err)}); the stage goes on without tracking")
            self.client = None
            return None

    def finish(self, status: str) -> None:
        self._call("end the run", "set_terminated", self.run_id, status)
        if self.parent_id:
            self._call("end the parent run", "set_terminated", self.parent_id, status)


_warned = False
CHILD_TAGS = ("git.commit", "git.dirty", "dvc.exp_name", "pipeline.key", "stage",
              OWNER_HOST, OWNER_PID)  # copied from the stage's run


def warn(message: str) -> None:
    global _warned
    if not _warned:
        print(f"warning: {redact(message)}", file=sys.stderr)
        _warned = True


def _experiment_id(client: Any, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    # Artifacts beside the store, absolute: a relative default would follow the working directory.
    return client.create_experiment(name, artifact_location=(project_root() / "mlruns").as_uri())


def _find_parent(client: Any, experiment_id: str, tags: dict[str, str]) -> str | None:
    parents = client.search_runs([experiment_id], max_results=1, order_by=["attributes.start_time DESC"],
                                 filter_string=f"tags.`pipeline.key` = '{tags['pipeline.key']}' "
                                               f"and tags.`pipeline.role` = '{PARENT_ROLE}'")
    if not parents:
        return None
    parent = parents[0].info.run_id
    children = client.search_runs([experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")
    if any(c.data.tags.get("stage") == tags["stage"] or c.info.status == "RUNNING" for c in children):
        return None  # this stage already ran in that execution, or a run there is still going
    last_end = max((c.info.end_time or 0 for c in children), default=parents[0].info.start_time)
    return parent if time.time() * 1000 - last_end < JOIN_WINDOW_S * 1000 else None


def _end_dead_runs(client: Any, experiment_id: str) -> None:
    """Mark KILLED the runs left RUNNING by a process of this host that is gone (a stage, or a child
    run of one, killed outright), and settle their parents."""
    running = client.search_runs([experiment_id], filter_string=f"attributes.status = 'RUNNING' and "
                                                              f"tags.`{OWNER_HOST}` = '{socket.gethostname()}'")
    dead = [r for r in running if not process_alive(int(r.data.tags[OWNER_PID]))]
    for run in dead:
        client.set_terminated(run.info.run_id, "KILLED")
    for parent_id in {r.data.tags["mlflow.parentRunId"] for r in dead if r.data.tags.get("pipeline.role") == STAGE_ROLE}:
        _settle_parent(client, experiment_id, parent_id)


def _settle_parent(client: Any, experiment_id: str, parent_id: str) -> None:
    """A parent still RUNNING with no stage running ends as its last stage did, as StageRun.finish
    would have ended it."""
    stages = client.search_runs([experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'",
                                order_by=["attributes.start_time DESC"])
    if all(s.info.status != "RUNNING" for s in stages) and client.get_run(parent_id).info.status == "RUNNING":
        client.set_terminated(parent_id, stages[0].info.status)


def _open_run(stage: str, cfg: TrackingConfig, all_params: Any) -> StageRun:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri())
    experiment_id = _experiment_id(client, cfg.experiment)
    _end_dead_runs(client, experiment_id)
    tags = run_tags(stage)
    parent_id = _find_parent(client, experiment_id, tags)
    if parent_id is None:
        parent_tags = {**tags, "pipeline.role": PARENT_ROLE}
        del parent_tags["stage"]
        name = f"{tags['dvc.exp_name']} {tags['git.commit'][:7]}"
        parent_id = client.create_run(experiment_id, tags=parent_tags, run_name=name).info.run_id
        StageRun(client, parent_id).log_params(all_params)
    owner = {OWNER_HOST: socket.gethostname(), OWNER_PID: str(os.getpid())}
    run = client.create_run(experiment_id, run_name=stage,
                            tags={**tags, **owner, "pipeline.role": STAGE_ROLE, "mlflow.parentRunId": parent_id})
    client.update_run(parent_id, status="RUNNING")
    return StageRun(client, run.info.run_id, parent_id)


@contextlib.contextmanager
def stage_run(stage: str, cfg: TrackingConfig, all_params: Any, stage_params: dict[str, Any]) -> Iterator[StageRun]:
    """Open this stage's run (under its pipeline's parent), log its params, and end it with the
    stage's status. `all_params` go on the parent, `stage_params` (what the stage reads) on the run."""
    run = StageRun()
    if cfg.enabled and os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 alone logs
        try:
            run = _open_run(stage, cfg, all_params)
        except Exception as err:
            warn(f"MLflow tracking is off for this stage ({describe(err)}); "
                 f"check MLFLOW_TRACKING_URI or {project_root() / 'mlflow.db'}")
    run.log_params(stage_params)
    try:
        yield run
    except BaseException:
        run.finish("FAILED")
        raise
    run.finish("FINISHED")
