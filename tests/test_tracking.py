"""Tracking into a temp MLflow store: one parent per pipeline execution, stage runs under it."""
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from lib import tracking
from lib.config import TrackingConfig
from tests.helpers import ROOT


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.setattr(tracking, "_warned", False)
    return MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")


def runs(client, experiment="transfer-pipeline"):
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    return client.search_runs([experiment_id], order_by=["attributes.start_time ASC"])


def test_store_is_absolute_at_project_root(store, tmp_path):
    assert tracking.tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_env_tracking_uri_wins(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://example.invalid:5000")
    assert tracking.tracking_uri() == "http://example.invalid:5000"


def test_stages_nest_under_one_parent(store):
    cfg = TrackingConfig()
    all_params = {"clean": {"min_chars": 5, "list": list(range(1000))}, "seed": 1}
    with tracking.stage_run("clean", cfg, all_params, {"clean": {"min_chars": 5}}) as run:
        run.log_metrics({"pretrain": {"docs_out": 3, "dropped": {"junk": 1}}, "note": "skipped"})
        run.log_metrics({"loss": 2.5}, step=10)
    with tracking.stage_run("tokenizer", cfg, all_params, {"tokenizer": {"vocab_size": 300}}):
        pass
    parents = [r for r in runs(store) if r.data.tags["pipeline.role"] == "pipeline"]
    stages = [r for r in runs(store) if r.data.tags["pipeline.role"] == "stage"]
    assert len(parents) == 1 and [r.data.tags["stage"] for r in stages] == ["clean", "tokenizer"]
    assert {r.data.tags["mlflow.parentRunId"] for r in stages} == {parents[0].info.run_id}
    clean = stages[0]
    assert clean.data.params["clean.min_chars"] == "5"
    assert clean.data.metrics["pretrain.dropped.junk"] == 1 and "note" not in clean.data.metrics
    assert [m.step for m in store.get_metric_history(clean.info.run_id, "loss")] == [10]
    assert len(parents[0].data.params["clean.list"]) <= tracking.MAX_PARAM_CHARS  # long values clipped
    for tag in ("git.commit", "git.dirty", "dvc.exp_name"):
        assert tag in clean.data.tags
    assert all(r.info.status == "FINISHED" for r in runs(store))


def test_rerun_of_a_stage_opens_a_new_parent(store):
    for _ in range(2):
        with tracking.stage_run("clean", TrackingConfig(), {}, {}):
            pass
    assert sum(r.data.tags["pipeline.role"] == "pipeline" for r in runs(store)) == 2


def test_stale_parent_is_not_joined(store, monkeypatch):
    with tracking.stage_run("clean", TrackingConfig(), {}, {}):
        pass
    monkeypatch.setattr(time, "time", lambda: 10**10)  # long after the last stage ended
    with tracking.stage_run("tokenizer", TrackingConfig(), {}, {}):
        pass
    assert sum(r.data.tags["pipeline.role"] == "pipeline" for r in runs(store)) == 2


def test_experiments_group_separately(store, monkeypatch):
    for name in ("exp-a", "exp-b"):
        monkeypatch.setenv("DVC_EXP_NAME", name)
        with tracking.stage_run("clean", TrackingConfig(), {}, {}):
            pass
    parents = [r for r in runs(store) if r.data.tags["pipeline.role"] == "pipeline"]
    assert sorted(r.data.tags["dvc.exp_name"] for r in parents) == ["exp-a", "exp-b"]


def test_failed_stage_marks_runs_failed(store):
    with pytest.raises(RuntimeError):
        with tracking.stage_run("clean", TrackingConfig(), {}, {}):
            raise RuntimeError("boom")
    assert {r.info.status for r in runs(store)} == {"FAILED"}


TRAINING_STAGE = """
import time
from lib import tracking
from lib.config import TrackingConfig
with tracking.stage_run("finetune", TrackingConfig(), {}, {}) as run:
    run.child("imdb/ulmfit/seed1", {}, {"pipeline.role": "finetune-run"})
    print("training", flush=True)
    time.sleep(120)
"""


def test_runs_of_a_killed_stage_end_as_killed_when_the_next_stage_opens(store, monkeypatch):
    """SIGKILL ends a stage without a word to MLflow; a run whose process still lives is left alone."""
    stage = subprocess.Popen([sys.executable, "-c", TRAINING_STAGE], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert stage.stdout.readline() == "training\n"
    finally:
        stage.kill()
        stage.wait()
    monkeypatch.setenv("DVC_EXP_NAME", "another")  # another pipeline: it does not join the killed one's parent
    with tracking.stage_run("clean", TrackingConfig(), {}, {}) as live:  # this process's: alive
        with tracking.stage_run("tokenizer", TrackingConfig(), {}, {}):
            status = {r.info.run_id: r.info.status for r in runs(store)}
            by_name = {r.info.run_name: r for r in runs(store)}
            killed, child = by_name["finetune"], by_name["imdb/ulmfit/seed1"]
            assert killed.data.tags["process.pid"] == child.data.tags["process.pid"] == str(stage.pid)
            assert status[killed.info.run_id] == status[child.info.run_id] == "KILLED"
            assert status[killed.data.tags["mlflow.parentRunId"]] == "KILLED"  # its only stage run was killed
            assert status[live.run_id] == status[live.parent_id] == "RUNNING"


def test_artifacts_land_beside_the_store(store, tmp_path):
    metrics = tmp_path / "m.json"
    metrics.write_text("{}")
    with tracking.stage_run("clean", TrackingConfig(), {}, {}) as run:
        run.log_artifact(metrics)
    stage = next(r for r in runs(store) if r.data.tags["pipeline.role"] == "stage")
    assert stage.info.artifact_uri.startswith((tmp_path / "mlruns").as_uri())
    assert [f.path for f in store.list_artifacts(stage.info.run_id)] == ["m.json"]


def test_unreachable_store_warns_once_and_stage_finishes(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tracking, "_warned", False)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{blocker}/mlflow.db")
    with tracking.stage_run("clean", TrackingConfig(), {}, {"a": 1}) as run:
        run.log_metrics({"x": 1.0})
        run.log_artifact(__file__)
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "MLflow tracking is off" in err


def test_the_warning_for_an_unreachable_server_hides_its_password(tmp_path, monkeypatch, capsys):
    """MLflow's error quotes the tracking URI whole, credentials included (port 9: nothing listens)."""
    monkeypatch.setattr(tracking, "_warned", False)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://user:secret@127.0.0.1:9/")
    with tracking.stage_run("clean", TrackingConfig(), {}, {"a": 1}) as run:
        run.log_metrics({"x": 1.0})
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "http://user:***@127.0.0.1:9/" in err and "secret" not in err


def test_disabled_tracking_touches_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    with tracking.stage_run("clean", TrackingConfig(enabled=False), {}, {"a": 1}) as run:
        run.log_metrics({"x": 1.0})
    assert not (tmp_path / "mlflow.db").exists()


def test_missing_mlflow_warns_once_and_stage_finishes(tmp_path, monkeypatch, capsys):
    """The GPU image of a user (or ours) may lack mlflow: the stage must still run."""
    monkeypatch.setattr(tracking, "_warned", False)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    for name in [m for m in sys.modules if m == "mlflow" or m.startswith("mlflow.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [BlockMlflow(), *sys.meta_path])
    with tracking.stage_run("pretrain", TrackingConfig(), {"seed": 1}, {"a": 1}) as run:
        run.on_log(1, {"step": 1, "loss": 2.0})
        run.log_artifact(__file__)
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "No module named 'mlflow'" in err


class BlockMlflow:
    """An import hook that makes `import mlflow` fail as if it were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "mlflow" or name.startswith("mlflow."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


def test_locked_store_warns_once_and_stage_finishes(store, tmp_path, capsys):
    """Another process holds the SQLite store's write lock for the whole stage: it warns and finishes."""
    import sqlite3

    with tracking.stage_run("clean", TrackingConfig(), {}, {"a": 1}):
        pass  # the store exists, with its tables
    capsys.readouterr()
    lock = sqlite3.connect(tmp_path / "mlflow.db", timeout=0)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        with tracking.stage_run("tokenizer", TrackingConfig(), {}, {"a": 1}) as run:
            run.log_metrics({"x": 1.0})
        seconds = time.monotonic() - started
    finally:
        lock.rollback()
        lock.close()
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "locked" in err, err
    assert seconds < 120
