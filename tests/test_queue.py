"""Two queued experiments run at once (`dvc exp run --run-all -j 2`) on a tiny project with the default
(relative) sources: both finish, each with its own MLflow parent run in the one shared store, and the
workspace is left as it was."""
import json

from mlflow.tracking import MlflowClient

from tests.test_pipeline import copy_reproduced, run


def test_two_queued_experiments_run_side_by_side(reproduced, tmp_path):
    # the tiny project after `dvc repro`, with the default sources: hub ids, read from the mirror beside the
    # project (a relative path)
    repo = copy_reproduced(reproduced, tmp_path)
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "baseline")
    for name, lr in (("lr-low", "0.004"), ("lr-high", "0.006")):
        # finetune.ulmfit.lr is the ulmfit variant's: the other variants, which it would not change, are left out
        run(repo, "dvc", "exp", "run", "--queue", "-n", name, "-S", f"finetune.ulmfit.lr={lr}", "-S",
            "finetune.variants=[ulmfit]")
    out = run(repo, "dvc", "exp", "run", "--run-all", "-j", "2")
    assert out.count("Running stage 'finetune'") == 2 and "Running stage 'pretrain'" not in out
    assert out.count("shared by 2 queue workers") >= 2  # torch's threads divided between the two (lib/core/runtime.py)
    assert run(repo, "git", "status", "--porcelain").strip() == ""  # the workspace is untouched
    shown = json.loads(run(repo, "dvc", "exp", "show", "--json"))
    experiments = {e["name"]: e for baseline in shown for e in (baseline.get("experiments") or [])}
    for name in ("lr-low", "lr-high"):
        assert experiments[name]["revs"][0]["data"]["metrics"]["metrics/evaluate.json"]["data"], name
    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("transfer-pipeline")
    for name, lr in (("lr-low", "0.004"), ("lr-high", "0.006")):
        runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`dvc.exp_name` = '{name}'")
        parents = [r for r in runs if r.data.tags.get("pipeline.role") == "pipeline"]
        stages = [r for r in runs if r.data.tags.get("pipeline.role") == "stage"]
        assert len(parents) == 1 and parents[0].data.params["finetune.ulmfit.lr"] == lr
        assert sorted(r.data.tags["stage"] for r in stages) == ["distill", "evaluate", "finetune"]
        assert all(r.info.status == "FINISHED" and r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
                   for r in stages)
        assert all(any((repo / r.info.artifact_uri).iterdir()) for r in stages)  # in the project, not the temp copy
