"""Tracking into a temp MLflow store: one parent per pipeline execution, stage runs under it."""
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from lib.config.params import TrackingConfig
from lib.core import tracking
from lib.core.io import read_safetensors, write_safetensors
from lib.serving.predict import log_pyfunc
from tests.helpers import ROOT, save_tiny_classifier, tiny_tokenizer


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A project at tmp_path (its dvc.yaml gives the stages' order), its store empty."""
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.setattr(tracking, "_warned", False)
    return MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")


def runs(client, experiment="transfer-pipeline"):
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    return client.search_runs([experiment_id], order_by=["attributes.start_time ASC"])


def tree(client) -> list[list[tuple[str, str]]]:
    """Per parent, oldest first: its stage runs as (stage, status), oldest first."""
    parents = [r for r in runs(client) if r.data.tags["pipeline.role"] == "pipeline"]
    return [[(r.data.tags["stage"], r.info.status) for r in runs(client)
             if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id] for parent in parents]


def stage(name, all_params=None, fail=False):
    """Run stage `name` (tracking only); with fail, it fails as a killed or broken stage would."""
    with contextlib.suppress(RuntimeError):
        with tracking.stage_run(name, TrackingConfig(), all_params or {}, {}):
            if fail:
                raise RuntimeError("boom")


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
        run.log_summary({"pretrain": {"docs_in": 4}, "algorithm": "bpe", "stopped_early": None})
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
    assert {k: v for k, v in clean.data.tags.items() if k.startswith("summary.")} == {
        "summary.pretrain.docs_in": "4", "summary.algorithm": "bpe"}
    assert re.fullmatch(r"repro [0-9a-f]{7} \d{4}-\d\d-\d\d \d\d:\d\d", parents[0].info.run_name)
    assert len(parents[0].data.params["clean.list"]) <= tracking.MAX_PARAM_CHARS  # long values clipped
    for tag in ("git.commit", "git.dirty", "dvc.exp_name"):
        assert tag in clean.data.tags
    assert all(r.info.status == "FINISHED" for r in runs(store))


def test_a_stage_run_again_after_it_or_a_later_stage_finished_opens_a_new_parent(store):
    stage("clean")
    stage("tokenizer")
    stage("tokenizer")
    stage("clean")
    assert tree(store) == [[("clean", "FINISHED"), ("tokenizer", "FINISHED")], [("tokenizer", "FINISHED")],
                           [("clean", "FINISHED")]]


def test_stale_parent_is_not_joined(store, monkeypatch):
    stage("clean")
    later = time.time() + tracking.JOIN_WINDOW_S + 1
    monkeypatch.setattr(time, "time", lambda: later)
    stage("tokenizer")
    assert len(tree(store)) == 2


def test_other_params_are_another_execution(store):
    stage("clean", {"seed": 1})
    stage("tokenizer", {"seed": 2})
    assert len(tree(store)) == 2


def test_a_restarted_stage_rejoins_its_interrupted_execution_whenever_it_comes(store, monkeypatch):
    """A stage that failed (or was killed) and runs again, even a day later, goes on in the same parent,
    beside its failed attempts, and so do the stages after it."""
    stage("clean")
    stage("tokenizer", fail=True)
    now = time.time
    monkeypatch.setattr(time, "time", lambda: now() + 86400)
    stage("tokenizer", fail=True)
    stage("tokenizer")
    stage("pretrain")
    assert tree(store) == [[("clean", "FINISHED"), ("tokenizer", "FAILED"), ("tokenizer", "FAILED"),
                            ("tokenizer", "FINISHED"), ("pretrain", "FINISHED")]]
    assert all(r.info.status == "FINISHED" for r in runs(store) if r.data.tags["pipeline.role"] == "pipeline")


def test_experiments_group_separately(store, monkeypatch):
    for name in ("exp-a", "exp-b"):
        monkeypatch.setenv("DVC_EXP_NAME", name)
        with tracking.stage_run("clean", TrackingConfig(), {}, {}):
            pass
    parents = [r for r in runs(store) if r.data.tags["pipeline.role"] == "pipeline"]
    assert sorted(r.data.tags["dvc.exp_name"] for r in parents) == ["exp-a", "exp-b"]


def test_an_experiment_name_with_quotes_still_finds_its_parent(store, monkeypatch, capsys):
    """Git and DVC allow quotes in experiment names; the stages must still find their parent run."""
    monkeypatch.setenv("DVC_EXP_NAME", """bob's "best" exp""")
    stage("clean")
    stage("tokenizer")
    assert tree(store) == [[("clean", "FINISHED"), ("tokenizer", "FINISHED")]]
    assert "warning" not in capsys.readouterr().err.lower()


def test_runs_are_tagged_with_the_objective_and_init_they_compare(store):
    stage("clean", {"objective": "electra", "init": None})
    stage("clean", {"objective": "mlm", "init": "hf:org/model"})
    with tracking.stage_run("finetune", TrackingConfig(), {"objective": "mlm", "init": "hf:org/model"}, {}) as run:
        run.child("imdb/plain/seed1", {}, {"pipeline.role": "finetune-run"})
    tagged = sorted((r.data.tags["pipeline.role"], r.data.tags["pipeline.objective"], r.data.tags.get("pipeline.init", ""))
                    for r in runs(store))
    assert tagged == [("finetune-run", "mlm", "hf:org/model"), ("pipeline", "electra", ""),
                      ("pipeline", "mlm", "hf:org/model"), ("stage", "electra", ""), ("stage", "mlm", "hf:org/model"),
                      ("stage", "mlm", "hf:org/model")]


def test_failed_stage_marks_runs_failed(store):
    with pytest.raises(RuntimeError):
        with tracking.stage_run("clean", TrackingConfig(), {}, {}):
            raise RuntimeError("boom")
    assert {r.info.status for r in runs(store)} == {"FAILED"}


TRAINING_STAGE = """
import time
from lib.config.params import TrackingConfig
from lib.core import tracking
with tracking.stage_run("finetune", TrackingConfig(), {}, {}) as run:
    run.child("imdb/ulmfit/seed1", {}, {"pipeline.role": "finetune-run"})
    print("training", flush=True)
    time.sleep(120)
"""


def test_runs_of_a_killed_stage_end_as_killed_when_the_next_stage_opens(store, monkeypatch):
    """SIGKILL ends a stage without a word to MLflow; a run whose process still lives is left alone."""
    stage = subprocess.Popen([sys.executable, "-c", TRAINING_STAGE], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert "training\n" in stage.stdout  # after the line that says the experiment was created
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


def exited_pid() -> int:
    """The id of a process that has exited, as a stopped DVC's."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


def test_a_parent_whose_process_died_before_any_stage_opened_is_ended(store):
    stage("clean")
    experiment_id = store.get_experiment_by_name("transfer-pipeline").experiment_id
    orphan = store.create_run(experiment_id, tags={"pipeline.role": "pipeline", "pipeline.key": "another",
                                                   "process.host": socket.gethostname(),
                                                   "process.pid": str(exited_pid())})
    stage("tokenizer")
    assert store.get_run(orphan.info.run_id).info.status == "KILLED"


DVC = ["/project/.venv/bin/python3", "/project/.venv/bin/dvc"]  # how a DVC process's command line starts


def under_dvc(monkeypatch, *arguments, pid=None):
    """Stages opened from now on run under `dvc <arguments>`, as process `pid` (by default this process's
    parent, which lives as long as the test)."""
    pid = pid or os.getppid()
    monkeypatch.setattr(tracking, "_ancestors", lambda: [(pid, [*DVC, *arguments]), (1, ["/sbin/init"])])
    return pid


def parents(client) -> list:
    return [r for r in runs(client) if r.data.tags["pipeline.role"] == "pipeline"]


def test_under_dvc_a_finished_stage_hands_the_parent_on_and_the_last_stage_ends_it(store, monkeypatch):
    """Between two stages of one `dvc repro` the parent is RUNNING, held by DVC; the next stage joins it
    however long DVC took in between."""
    driver = under_dvc(monkeypatch, "repro")
    stage("finetune")
    [parent] = parents(store)
    assert parent.info.status == "RUNNING" and parent.data.tags["process.pid"] == str(driver)
    now = time.time
    monkeypatch.setattr(time, "time", lambda: now() + tracking.JOIN_WINDOW_S + 1)
    stage("distill")
    assert parents(store)[0].info.status == "RUNNING"
    stage("evaluate")
    assert tree(store) == [[("finetune", "FINISHED"), ("distill", "FINISHED"), ("evaluate", "FINISHED")]]
    [parent] = parents(store)
    assert (parent.info.status, parent.data.tags["pipeline.ended"]) == ("FINISHED", "complete")


def test_a_parent_whose_dvc_stopped_between_stages_is_killed_and_resumed_by_the_next_repro(store, monkeypatch):
    """Ctrl-C stops `dvc repro` after finetune: the next stage to open, of any execution, ends its parent
    KILLED, saying where it stopped, and the next `dvc repro` resumes it whenever it comes."""
    under_dvc(monkeypatch, "repro", pid=exited_pid())
    stage("finetune")
    under_dvc(monkeypatch, "repro")
    stage("clean", {"seed": 2})  # another execution
    stopped = parents(store)[0]
    assert (stopped.info.status, stopped.data.tags["pipeline.ended"]) == (
        "KILLED", "after finetune: DVC stopped before distill")
    now = time.time
    monkeypatch.setattr(time, "time", lambda: now() + 86400)
    stage("distill")
    stage("evaluate")
    assert tree(store) == [[("finetune", "FINISHED"), ("distill", "FINISHED"), ("evaluate", "FINISHED")],
                           [("clean", "FINISHED")]]
    resumed = parents(store)[0]
    assert (resumed.info.status, resumed.data.tags["pipeline.ended"]) == ("FINISHED", "complete")


def test_a_stopped_experiment_is_finished_when_dvc_wrote_its_ref(store, tmp_path, monkeypatch):
    """Queued experiments whose `dvc exp exec-run` is gone after finetune: DVC writes an experiment's git ref
    only once it ran to the end (here, say, the later stages were up to date), so the ref decides; a ref older
    than the run is an earlier run's (`dvc exp run -f` replaces it only at the end)."""
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    an_hour_ago = {**os.environ, "GIT_COMMITTER_DATE": f"@{int(time.time()) - 3600} +0000"}  # git's time is in s
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "baseline"], check=True, env=an_hour_ago)
    baseline = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    in_an_hour = {**os.environ, "GIT_COMMITTER_DATE": f"@{int(time.time()) + 3600} +0000"}
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "dvc: commit experiment"], check=True, env=in_an_hour)
    ref = f"refs/exps/{baseline[:2]}/{baseline[2:]}/"
    subprocess.run([*git, "update-ref", ref + "done", "HEAD"], check=True)
    subprocess.run([*git, "update-ref", ref + "done-before", baseline], check=True)
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", baseline)
    gone = exited_pid()
    for name in ("done", "done-before", "stopped"):
        monkeypatch.setenv("DVC_EXP_NAME", name)
        under_dvc(monkeypatch, "exp", "exec-run", "--infofile", f"/project/.dvc/tmp/exps/run/{name}/{name}.run",
                  pid=gone)
        stage("finetune")
    monkeypatch.delenv("DVC_EXP_NAME")
    under_dvc(monkeypatch, "repro")
    stage("clean")
    ended = {p.data.tags["dvc.exp_name"]: (p.data.tags["dvc.exp_ref"], p.info.status,
                                           p.data.tags["pipeline.ended"])
             for p in parents(store) if p.data.tags["dvc.exp_name"] != "workspace"}
    assert ended == {"done": (ref + "done", "FINISHED", "complete"),
                     "done-before": (ref + "done-before", "KILLED", "after finetune: DVC stopped before distill"),
                     "stopped": (ref + "stopped", "KILLED", "after finetune: DVC stopped before distill")}


def test_two_executions_of_one_key_side_by_side_each_keep_one_parent(store, monkeypatch):
    """Two clones at one commit and params, logging to one store, `dvc repro` at once: the same pipeline key,
    their stages interleaved. Each DVC's stages stay under its own parent, none under the other's."""
    drivers = (os.getpid(), os.getppid())  # two live processes, standing for the two DVCs
    for name in ("data", "clean", "tokenizer"):
        for driver in drivers:
            under_dvc(monkeypatch, "repro", pid=driver)
            stage(name)
    assert tree(store) == [[("data", "FINISHED"), ("clean", "FINISHED"), ("tokenizer", "FINISHED")]] * 2
    assert sorted(p.data.tags["process.pid"] for p in parents(store)) == sorted(map(str, drivers))
    for parent in parents(store):
        assert {r.data.tags["process.pid"] for r in runs(store)
                if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id} == {str(os.getpid())}
        assert parent.info.status == "RUNNING"  # each DVC goes on to its later stages


@pytest.mark.parametrize("commands, driver, until", [
    ([[*DVC, "exp", "exec-run", "--infofile", "/project/.dvc/tmp/exps/run/1a/1a.run"],  # a queued experiment
      [*DVC, "exp", "queue-worker", "dvc-exp-cde9b5-1@localhost", "--clean"], [*DVC, "exp", "run", "--run-all"]],
     0, "evaluate"),
    ([["/bin/sh", "-c", "python -m dvc repro adapt"], ["python3", "-m", "dvc", "repro", "adapt"]], 1, "adapt"),
    ([["/usr/local/bin/dvc", "-q", "repro", "dvc.yaml:adapt", "pretrain"]], 0, "adapt"),
    ([[*DVC, "repro", "--downstream", "adapt"]], 0, "evaluate"),
    ([[*DVC, "repro", "--glob", "ad*"]], 0, "adapt"),
    ([[*DVC, "repro", "dvc.yaml"]], 0, "evaluate"),
    ([[*DVC, "exp", "run", "-S", "seed=2", "adapt"]], 0, "adapt"),
    ([[*DVC, "exp", "show"], ["vim", "dvc"], ["python", "-m", "pytest"]], None, None),
])
def test_the_driver_is_the_nearest_dvc_that_runs_stages_and_its_targets_say_until_which(monkeypatch, commands,
                                                                                        driver, until):
    monkeypatch.setenv("DVC_ROOT", str(ROOT))
    monkeypatch.setattr(tracking, "_ancestors", lambda: [(100 + i, command) for i, command in enumerate(commands)])
    found = tracking._dvc_driver()
    assert (found and found[0]) == (driver if driver is None else 100 + driver)
    assert (found and tracking._last_stage_asked(found[1], tracking._pipeline_order())) == until


FAKE_DVC = """
import os, subprocess, sys
print(os.getpid(), flush=True)
subprocess.run([sys.executable, "-c", "from lib.core import tracking; print(tracking._dvc_driver()[0])"], check=True)
"""


def test_a_stage_finds_the_dvc_process_above_it(tmp_path):
    """A real process tree: a `dvc` script run by Python, as DVC's entry point is, runs a stage-like child."""
    (tmp_path / "dvc").write_text(FAKE_DVC)
    done = subprocess.run([sys.executable, str(tmp_path / "dvc"), "exp", "exec-run", "--infofile", "x.run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    driver, *found = done.stdout.split()
    assert found == [driver], done.stderr[-2000:]


FIRST_STAGE = """
import sys, time
from pathlib import Path
from lib.config.params import TrackingConfig
from lib.core import tracking
print("ready", flush=True)
while not Path(sys.argv[1]).exists():
    time.sleep(0.001)
with tracking.stage_run("evaluate", TrackingConfig(), {}, {}):
    pass
"""


def test_stages_that_start_at_once_on_a_new_store_are_all_tracked(tmp_path, monkeypatch):
    """Three projects' first stages open a new shared store at the same moment: MLflow creates its tables on first
    contact, and two processes doing so at once lose their runs or leave it half-migrated."""
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))  # the store fixture's client would create the store's tables
    go = tmp_path / "go"
    processes = [subprocess.Popen([sys.executable, "-c", FIRST_STAGE, str(go)], cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        assert all(process.stdout.readline() == "ready\n" for process in processes)  # mlflow imported
        go.touch()
        errors = [process.communicate(timeout=120)[1] for process in processes]
    finally:
        for process in processes:
            process.kill()
    assert [process.returncode for process in processes] == [0, 0, 0]
    assert not [line for err in errors for line in err.splitlines() if line.startswith("warning:")]
    store = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert sorted((r.data.tags["pipeline.role"], r.info.status) for r in runs(store)) == [
        ("pipeline", "FINISHED")] * 3 + [("stage", "FINISHED")] * 3


def test_artifacts_land_beside_the_store_by_a_relative_path_so_a_copied_store_works(store, tmp_path, monkeypatch):
    """Logged from another working directory (a queued experiment's temp copy), read from a copy of the
    project folder after the original is gone."""
    (tmp_path / "m.json").write_text("{}")
    monkeypatch.chdir(tmp_path.parent)
    with tracking.stage_run("clean", TrackingConfig(), {}, {}) as run:
        run.log_artifact(tmp_path / "m.json")
    clean = next(r for r in runs(store) if r.data.tags["pipeline.role"] == "stage")
    assert clean.info.artifact_uri == f"mlruns/{clean.info.experiment_id}/{clean.info.run_id}/artifacts"
    assert (tmp_path / clean.info.artifact_uri / "m.json").is_file()
    copy = tmp_path.parent / f"{tmp_path.name}-copy"
    shutil.copytree(tmp_path, copy)
    shutil.rmtree(tmp_path / "mlruns")
    monkeypatch.chdir(copy)  # where `mlflow ui` runs, so the relative artifact paths resolve in the copy
    # an absolute URI: MLflow caches stores by URI, and a relative one may name another test's mlflow.db
    moved = MlflowClient(tracking_uri=f"sqlite:///{copy / 'mlflow.db'}")
    assert [f.path for f in moved.list_artifacts(clean.info.run_id)] == ["m.json"]


def test_an_absolute_artifact_location_is_made_relative(store, tmp_path):
    """An experiment made by an earlier version, or by MLflow's defaults: new runs go beside the store."""
    store.create_experiment("transfer-pipeline", artifact_location=str(tmp_path / "elsewhere"))
    with tracking.stage_run("clean", TrackingConfig(), {}, {}):
        pass
    experiment = store.get_experiment_by_name("transfer-pipeline")
    assert experiment.artifact_location == f"mlruns/{experiment.experiment_id}"


def test_the_experiment_is_tagged_as_model_training(store, capsys):
    with tracking.stage_run("clean", TrackingConfig(), {}, {}):
        pass
    experiment = store.get_experiment_by_name("transfer-pipeline")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert f"its runs table is #/experiments/{experiment.experiment_id}/runs" in capsys.readouterr().out
    store.create_experiment("untagged")
    with tracking.stage_run("clean", TrackingConfig(experiment="untagged"), {}, {}):
        pass
    assert store.get_experiment_by_name("untagged").tags["mlflow.experimentKind"] == "custom_model_development"


def test_a_stage_that_finds_the_experiment_missing_while_another_creates_it_joins_that_one(store, monkeypatch):
    """Two projects' first stages on a shared server: both ask for the experiment before either made it."""
    made_by_the_other = store.create_experiment("transfer-pipeline",
                                                tags={"mlflow.experimentKind": "custom_model_development"})
    lookup, asked = MlflowClient.get_experiment_by_name, []

    def missing_at_first(client, name):
        asked.append(name)
        return None if len(asked) == 1 else lookup(client, name)

    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", missing_at_first)
    with tracking.stage_run("clean", TrackingConfig(), {}, {}) as run:
        assert run.active
    monkeypatch.undo()
    runs = store.search_runs([made_by_the_other])
    assert [r.info.run_name for r in runs if r.data.tags.get("pipeline.role") == "stage"] == ["clean"]


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


def test_dirty_means_code_or_params_not_the_outputs_the_stages_rewrite(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    (tmp_path / "metrics").mkdir()
    for name in ("params.yaml", "dvc.lock", "metrics/m.json"):
        (tmp_path / name).write_text("1")
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    for name in ("dvc.lock", "metrics/m.json"):
        (tmp_path / name).write_text("2")
    assert tracking.run_tags("evaluate", {})["git.dirty"] == "false"
    (tmp_path / "params.yaml").write_text("2")
    assert tracking.run_tags("evaluate", {})["git.dirty"] == "true"


REGISTERED = tracking.registered_name("transfer-pipeline", "imdb-student")


def evaluate_registers(folder, dev: float) -> str:
    """An evaluate run that logs and registers the student in `folder`, of dev accuracy `dev`: its run id."""
    with tracking.stage_run("evaluate", TrackingConfig(), {}, {}) as run:
        run.register_folder(log_pyfunc, folder, "imdb-student", REGISTERED, {"accuracy": dev}, "accuracy")
    return run.run_id


def versions(client) -> list[str]:
    return sorted(str(v.version) for v in client.search_model_versions(f"name = '{REGISTERED}'"))


def best(client) -> str:
    return str(client.get_model_version_by_alias(REGISTERED, tracking.BEST_ALIAS).version)


def test_evaluate_run_again_on_the_same_model_adds_no_version(store, tmp_path, capsys):
    """A version per distinct model: evaluate run again on an unchanged folder links its run to the version
    that holds it and logs no second copy; a changed weight is a new version; `best` follows the dev score."""
    folder = save_tiny_classifier(tmp_path / "student", tiny_tokenizer(tmp_path / "tokenizer"))
    first = evaluate_registers(folder, 0.8)
    again = evaluate_registers(folder, 0.8)
    assert versions(store) == ["1"] and best(store) == "1"
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"MLflow: {folder} is version 1 of {REGISTERED} already (the same files); not registered again")
    for run_id in (first, again):
        assert store.get_run(run_id).data.tags["summary.registered.imdb-student"] == f"models:/{REGISTERED}/1"
    experiment_id = store.get_run(first).info.experiment_id
    assert [m.source_run_id for m in store.search_logged_models([experiment_id])] == [first]

    weights = next(folder.glob("*.safetensors"))
    tensors = read_safetensors(weights)
    changed = next(name for name, tensor in tensors.items() if tensor.is_floating_point())
    tensors[changed] = tensors[changed] + 1.0
    write_safetensors(weights, tensors)
    worse = evaluate_registers(folder, 0.7)
    evaluate_registers(folder, 0.7)
    assert versions(store) == ["1", "2"] and best(store) == "1"  # the higher dev score keeps the alias
    assert store.get_model_version(REGISTERED, "2").run_id == worse
    assert store.get_model_version(REGISTERED, "2").tags[tracking.MODEL_DIGEST] == tracking.folder_sha256(folder)
    tensors[changed] = tensors[changed] + 1.0
    write_safetensors(weights, tensors)
    evaluate_registers(folder, 0.9)
    assert versions(store) == ["1", "2", "3"] and best(store) == "3"


def test_the_same_model_registered_by_two_evaluates_at_once_is_one_version(store, tmp_path, capsys):
    """Both looked it up before either had registered it: the later version is removed again, and never
    held `best`, although its dev score is the same and a tie goes to the newer version."""
    folder = save_tiny_classifier(tmp_path / "student", tiny_tokenizer(tmp_path / "tokenizer"))
    digest = tracking.folder_sha256(folder)
    registered = []
    for _ in range(2):
        with tracking.stage_run("evaluate", TrackingConfig(), {}, {}) as run:
            uri = run.log_model(log_pyfunc, folder, "imdb-student")
            registered.append(run.register_model(uri, REGISTERED, {"accuracy": 0.8}, "accuracy", digest))
    assert registered == ["1", "1"] and versions(store) == ["1"] and best(store) == "1"
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"MLflow: another evaluate registered the same model as version 1 of {REGISTERED} meanwhile; "
        "version 2 removed again")


def test_the_digest_of_a_model_folder_is_of_its_files_alone(tmp_path):
    for copy in ("a", "b"):
        (tmp_path / copy / "tokenizer").mkdir(parents=True)
        (tmp_path / copy / "model.safetensors").write_bytes(b"weights")
        (tmp_path / copy / "tokenizer" / "vocab.txt").write_text("a\nb\n")
    assert tracking.folder_sha256(tmp_path / "a") == tracking.folder_sha256(tmp_path / "b")
    (tmp_path / "b" / "tokenizer" / "vocab.txt").write_text("a\nc\n")
    assert tracking.folder_sha256(tmp_path / "a") != tracking.folder_sha256(tmp_path / "b")
    (tmp_path / "b" / "tokenizer" / "vocab.txt").rename(tmp_path / "b" / "vocab.txt")  # a file moved is another model
    (tmp_path / "b" / "vocab.txt").write_text("a\nb\n")
    assert tracking.folder_sha256(tmp_path / "a") != tracking.folder_sha256(tmp_path / "b")
