"""Two copies of the project run `dvc exp run` at the same time, both logging to one MLflow store
(MLFLOW_TRACKING_URI), new to both: no run is lost or filed under the other's experiment, and each model is
registered once."""
import os
import subprocess
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient

from tests.test_pipeline import copy_reproduced, run

# evaluate alone reads it: of the stages, only evaluate runs again (and data, which always runs and finds
# nothing to do)
CHANGES = {"exp-a": "evaluate.latency_repeats=4", "exp-b": "evaluate.latency_repeats=6"}


def test_two_projects_run_experiments_at_once_into_one_store(reproduced, tmp_path):
    store = tmp_path / "store" / "mlflow.db"
    store.parent.mkdir()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
           "MLFLOW_TRACKING_URI": f"sqlite:///{store}"}
    repos = {name: copy_reproduced(reproduced, tmp_path / name) for name in CHANGES}
    started = {name: subprocess.Popen(["dvc", "exp", "run", "-n", name, "-S", "tracking.enabled=true", "-S", change],
                                      cwd=repos[name], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)
               for name, change in CHANGES.items()}
    try:
        logs = {name: dvc.communicate(timeout=600)[0] for name, dvc in started.items()}
    finally:
        for dvc in started.values():
            dvc.kill()
    for name, dvc in started.items():
        assert dvc.returncode == 0, f"{name}:\n{logs[name][-3000:]}"
        assert "Running stage 'evaluate'" in logs[name] and "Running stage 'distill'" not in logs[name]
        assert not [line for line in logs[name].splitlines() if line.startswith("warning:")], logs[name][-3000:]

    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    runs = client.search_runs([client.get_experiment_by_name("transfer-pipeline").experiment_id])
    assert {r.info.status for r in runs} == {"FINISHED"}
    parents = {r.data.tags["dvc.exp_name"]: r for r in runs if r.data.tags["pipeline.role"] == "pipeline"}
    assert sorted(parents) == sorted(CHANGES) and len(runs) == 2 * len(CHANGES)  # a parent and evaluate's run each
    evaluate_runs = {}
    for name, parent in parents.items():
        [stage] = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        evaluate_runs[name] = stage
        commit = run(repos[name], "git", "rev-parse", "HEAD").strip()
        assert parent.data.tags["process.pid"] == str(started[name].pid)  # the DVC that ran this experiment
        assert stage.data.tags["stage"] == "evaluate"
        for logged in (parent, stage):
            assert (logged.data.tags["dvc.exp_name"], logged.data.tags["git.commit"]) == (name, commit)
            assert f"evaluate.latency_repeats={logged.data.params['evaluate.latency_repeats']}" == CHANGES[name]
    assert evaluate_runs["exp-a"].data.tags["process.pid"] != evaluate_runs["exp-b"].data.tags["process.pid"]

    # both evaluated the same model folders (copies of one project): a version each, which both runs name
    registered = {m.name: client.search_model_versions(f"name = '{m.name}'") for m in client.search_registered_models()}
    assert sorted(registered) == [f"transfer-pipeline.{task}-{role}" for task in ("imdb", "sst2")
                                  for role in ("student", "teacher")]
    for name, versions in registered.items():
        [version] = versions
        assert version.run_id in {r.info.run_id for r in evaluate_runs.values()}
        assert str(client.get_model_version_by_alias(name, "best").version) == str(version.version)
        artifact = name.removeprefix("transfer-pipeline.")
        assert {r.data.tags[f"summary.registered.{artifact}"] for r in evaluate_runs.values()} == {
            f"models:/{name}/{version.version}"}
