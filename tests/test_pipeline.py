"""End to end as a user runs it: `dvc repro` in a copy of the repo on tiny slices of the real data, with
the default `impl` settings (precision, compile, threads), the tiny copy standing in for the mirror."""
import copy
import gzip
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from mlflow.tracking import MlflowClient

from lib.training.checkpoint import checkpoints
from tests.helpers import ROOT, SHARED_DATA, write_jsonl_gz

# rows per split of each dataset in the tiny copy; wikipedia articles are also cut to 4k chars
TINY = {"wikipedia_en": {"train": 40, "validation": 6}, "imdb": {"train": 150, "unsup": 150, "test": 60},
        "sst2": {"train": 150, "validation": 60, "test": 60},
        "cola": {"train": 80, "validation": 40, "test_unlabeled": 40}, "mrpc": {"train": 80, "validation": 40, "test": 40},
        "rte": {"train": 80, "validation": 30, "test_unlabeled": 30},
        "conll2003": {"train": 120, "validation": 40, "test": 40}, "squad": {"train": 60, "validation": 30},
        "squad_v2": {"train": 120, "validation": 40}, "stsb": {"train": 120, "validation": 40, "test": 40},
        "codah": {"train": 120, "validation": 40, "test": 40},
        **{f"stsb_multi_{language}": {"train": 40, "validation": 40, "test": 40} for language in ("de", "fr", "ru")},
        "xquad": {"en": 30, "de": 30, "ru": 30}, "multi30k_en_de": {"train": 120, "validation": 40, "test": 40},
        "samsum": {"train": 60, "validation": 20, "test": 20}}


def head(path: Path, n: int) -> list[dict]:
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line, _ in zip(f, range(n)):
            rows.append(json.loads(line))
    return rows


def make_tiny_data(shared: Path) -> str:
    """Tiny slices of ../shared/data, plus one duplicate and one contaminated article; returns the
    evaluation sentence planted in the pretraining text."""
    for name, splits in TINY.items():
        for split, n in splits.items():
            if name == "imdb" and split in ("train", "test"):  # sorted by label: take n around the middle
                rows = head(SHARED_DATA / name / f"{split}.jsonl.gz", 12500 + n // 2)[-n:]
            else:
                rows = head(SHARED_DATA / name / f"{split}.jsonl.gz", n)
            if name == "wikipedia_en":
                rows = [{**r, "text": r["text"][:4000]} for r in rows]
            write_jsonl_gz(shared / name / f"{split}.jsonl.gz", rows)
    planted = next(r["text"] for r in head(SHARED_DATA / "sst2" / "validation.jsonl.gz", 60)
                   if len(r["text"].split()) >= 12)
    wiki = shared / "wikipedia_en" / "train.jsonl.gz"
    rows = head(wiki, 10**6)
    rows.append(dict(rows[0]))  # an exact duplicate article
    rows.append({**rows[1], "text": rows[1]["text"] + "\n\nAs a critic wrote: " + planted.upper()})
    write_jsonl_gz(wiki, rows)
    return planted


def copy_repo(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)


def tiny_params(repo: Path) -> None:
    path = repo / "params.yaml"
    params = yaml.safe_load(path.read_text())
    params["clean"].update(min_chars=20, workers=2, batch_docs=8)
    params["corpora"]["domain"]["valid_fraction"] = 0.1
    params["tokenizer"].update(vocab_size=500, train_chars=None, batch_docs=16)
    params["model"].update(d_model=32, n_layers=2, n_heads=2, d_ff=64, max_positions=64)
    params["pretrain"].update(seq_len=32, batch_size=8, warmup_steps=5, budget_tokens=32 * 8 * 30,
                              budget_minutes=None, eval_every=10, eval_batches=2, log_every=5, checkpoint_every=10)
    params["adapt"].update(seq_len=32, batch_size=8, budget_tokens=32 * 8 * 20, budget_minutes=None, eval_every=10,
                           eval_batches=2, log_every=5, checkpoint_every=10)
    params["tasks"]["imdb"]["max_len"] = 64
    params["tasks"]["sst2"]["max_len"] = 32
    params["finetune"].update(seeds=1, epochs=1, batch_size=8, max_train_examples={"imdb": 100}, max_eval_examples=None,
                              dev_fraction=0.2, dev_max=40, head_hidden=16)
    params["finetune"]["ulmfit"]["unfreeze_every"] = 8
    params["distill"].update(layers=1, epochs=1, batch_size=8, max_unlabeled=40)
    params["evaluate"].update(latency_seq_len=32, latency_repeats=5, throughput_batch=4)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def run(repo: Path, *args: str) -> str:
    done = command(repo, *args)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def run_failing(repo: Path, *args: str) -> str:
    """The output of a command that must fail (and so not run to the end)."""
    done = command(repo, *args)
    assert done.returncode != 0, f"{' '.join(args)} did not fail:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def command(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=900)


def tiny_repo(base: Path) -> tuple[Path, str]:
    """A committed copy of the project with tiny params, its mirror (base/shared/data) beside it."""
    repo = base / "repo"
    planted = make_tiny_data(base / "shared" / "data")
    copy_repo(repo)
    tiny_params(repo)
    run(repo, "git", "init", "-q")
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "tiny")
    return repo, planted


def copy_reproduced(reproduced: tuple[Path, str, str], dest: Path) -> Path:
    """A copy of the session's reproduced tiny project (conftest.reproduced) in `dest`, its mirror beside it
    as in the original: git history, DVC cache and lock, MLflow store (relative artifact paths) and all.
    Returns the copy's repo folder."""
    base, _, _ = reproduced
    shutil.copytree(base, dest, symlinks=True, dirs_exist_ok=True)
    return dest / "repo"


@pytest.fixture(scope="module")
def repo(reproduced, tmp_path_factory):
    """The tiny project after one `dvc repro`: what every test here starts from, whichever run alone (a copy
    of the session's, which the queue and bad-input tests start from too)."""
    _, planted, out = reproduced
    return copy_reproduced(reproduced, tmp_path_factory.mktemp("pipeline")), planted, out


STAGES = ["data", "clean", "tokenizer", "pretrain", "adapt", "finetune", "distill", "evaluate"]


def stage_runs(repo: Path) -> list:
    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("transfer-pipeline")
    return client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])


def test_repro_cleans_tokenizes_tracks_and_caches(repo, monkeypatch):
    repo, planted, out = repo
    assert all(f"Running stage '{stage}'" in out for stage in STAGES)

    data = json.loads((repo / "metrics/data.json").read_text())
    assert set(data) == set(TINY)  # the corpora and every task's source, selected or not
    assert data["imdb"]["used_by"] == ["corpora.domain", "tasks.imdb"] and data["imdb"]["origin"].startswith("mirror ")
    assert data["imdb"]["rows"] == {"test": 60, "train": 150, "unsup": 150}

    clean = json.loads((repo / "metrics/clean.json").read_text())
    assert clean["pretrain"]["dropped"]["exact_dup"] >= 1
    assert clean["pretrain"]["dropped"]["contaminated"] >= 1
    assert clean["domain"]["rewritten"]["strip_html"] > 0  # IMDb's <br /> tags
    texts = [json.loads(line)["text"] for line in gzip.open(repo / "data/clean/pretrain/train.jsonl.gz", "rt")]
    assert texts and not any(planted.lower() in t.lower() for t in texts)
    assert (repo / "data/clean/domain/valid.jsonl.gz").exists()

    tok = json.loads((repo / "metrics/tokenizer.json").read_text())
    assert tok["vocab_size"] <= 500 and tok["pretrain_train"]["tokens"] > 1000
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(repo / "data/tokens/tokenizer/tokenizer.json"))
    assert tokenizer.token_to_id("[MASK]") == 4
    for corpus in ("pretrain", "domain"):
        for split in ("train", "valid"):
            assert (repo / f"data/tokens/{corpus}/{split}.bin").stat().st_size > 0
    assert (repo / "plots/clean/rules.csv").read_text().startswith("rule,docs")

    pretrain = json.loads((repo / "metrics/pretrain.json").read_text())
    assert pretrain["objective"] == "clm" and pretrain["steps"] == 30 and pretrain["val_loss"] < pretrain["unigram_loss"] + 1
    assert pretrain["val_perplexity"] == pytest.approx(math.exp(pretrain["val_loss"]))
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {p.name for p in (repo / "models/pretrain").iterdir()}
    assert not (repo / "data/checkpoints/pretrain").exists()  # removed once the model is out

    adapt = json.loads((repo / "metrics/adapt.json").read_text())
    assert adapt["objective"] == "clm" and adapt["steps"] == 20 and adapt["val_loss"] < adapt["before_val_loss"]
    assert (repo / "models/adapt/tokenizer.json").is_file()

    finetune = json.loads((repo / "metrics/finetune.json").read_text())
    assert set(finetune) == {"imdb", "sst2"}
    for task, split in (("imdb", "test"), ("sst2", "validation")):
        assert finetune[task]["eval_split"] == split and finetune[task]["eval_examples"] == 60
        assert set(finetune[task]["variants"]) == {"ulmfit", "plain", "from_scratch", "frozen"}
        accuracy = finetune[task]["variants"]["ulmfit"]["eval"]["accuracy"]
        assert 0.0 <= accuracy["mean"] <= 1.0 and len(accuracy["seeds"]) == 1 and accuracy["std"] == 0.0
        header = (repo / f"plots/finetune/{task}.csv").read_text().splitlines()[0]
        assert header == "epoch,ulmfit,plain,from_scratch,frozen"
    from lib.tasks.model import load_task_model
    classifier, info = load_task_model(repo / "models/finetune/sst2")
    assert info["label_names"] == ["negative", "positive"] and info["task"] == "sst2"
    assert not (repo / "data/checkpoints/finetune").exists()

    distill = json.loads((repo / "metrics/distill.json").read_text())
    assert set(distill) == {"imdb", "sst2"}
    assert distill["imdb"]["transfer"] == {"labeled": finetune["imdb"]["train_examples"], "unlabeled": 40}
    assert distill["sst2"]["transfer"]["unlabeled"] == 0  # distill.unlabeled names imdb only
    for task in distill:
        assert distill[task]["student"]["params"] < distill[task]["teacher"]["params"]
        assert distill[task]["teacher_blocks"] == [0] and distill[task]["layer_map"] == [1]
    student, info = load_task_model(repo / "models/distill/imdb")
    assert info["variant"] == "student" and student.backbone.cfg.n_layers == 1
    assert not (repo / "data/checkpoints/distill").exists()

    evaluate = json.loads((repo / "metrics/evaluate.json").read_text())
    assert set(evaluate) == {"imdb", "sst2"}  # the finetuned tasks; cola, mrpc and rte wait their turn
    imdb = evaluate["imdb"]["splits"]["test"]["scores"]
    assert {"teacher", "student", "ulmfit", "plain", "from_scratch", "frozen", "tfidf", "tfidf_full_train",
            "zero_shot"} <= set(imdb)  # imdb finetunes on a subset of train: TF-IDF is shown on both
    assert "tfidf_full_train" not in evaluate["sst2"]["splits"]["validation"]["scores"]  # sst2 uses all of train
    teacher_variant = json.loads((repo / "models/finetune/imdb/classifier.json").read_text())["eval"]
    assert imdb["teacher"]["accuracy"] == pytest.approx(teacher_variant["accuracy"], abs=0.02)  # fp32 vs bf16
    assert set(evaluate["sst2"]["splits"]) == {"validation", "test"}  # both labeled
    cpu = evaluate["imdb"]["efficiency"]["student"]["cpu"]
    assert 0 < cpu["p50_ms"] <= cpu["p95_ms"] and cpu["throughput"] > 0
    assert evaluate["imdb"]["retained"] > 0 and evaluate["imdb"]["speedup"] > 0
    summary = (repo / "reports/summary.md").read_text()
    assert "## imdb" in summary and "![scores.png](scores.png)" in summary and (repo / "reports/scores.png").is_file()
    assert (repo / "plots/evaluate/confusion/imdb_student.csv").read_text().startswith("actual,predicted")

    runs = stage_runs(repo)
    parents = [r for r in runs if r.data.tags["pipeline.role"] == "pipeline"]
    stages = [r for r in runs if r.data.tags["pipeline.role"] == "stage"]
    assert len(parents) == 1 and [r.data.tags["stage"] for r in stages] == STAGES
    finetune_run, distill_run, evaluate_run = stages[-3:]
    trials = [r for r in runs if r.data.tags["pipeline.role"] == "finetune-run"]
    assert len(trials) == 2 * 4 and {r.data.tags["mlflow.parentRunId"] for r in trials} == {finetune_run.info.run_id}
    students = [r for r in runs if r.data.tags["pipeline.role"] == "distill-run"]
    assert len(students) == 2 and {r.data.tags["mlflow.parentRunId"] for r in students} == {distill_run.info.run_id}
    assert all(r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for r in stages)
    assert stages[1].data.tags["summary.pretrain.docs_out"] == str(clean["pretrain"]["docs_out"])
    assert stages[2].data.params["tokenizer.vocab_size"] == "500"
    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    monkeypatch.chdir(repo)  # artifact paths start from the store's folder, where `mlflow ui` runs
    assert "reports" in {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert parents[0].data.metrics["imdb.student.accuracy"] == imdb["student"]["accuracy"]
    models = client.search_logged_models([evaluate_run.info.experiment_id])
    assert {m.name for m in models if m.source_run_id == evaluate_run.info.run_id} == {
        f"{task}-{role}" for task in ("imdb", "sst2") for role in ("teacher", "student")}
    assert {m.name for m in client.search_registered_models()} == {
        f"transfer-pipeline.{task}-{role}" for task in ("imdb", "sst2") for role in ("teacher", "student")}
    best = client.get_model_version_by_alias("transfer-pipeline.imdb-student", "best")
    assert best.run_id == evaluate_run.info.run_id and float(best.tags["dev.accuracy"]) == distill["imdb"]["student"][
        "dev"]["accuracy"]

    # nothing changed: the data stage finds every source read already, nothing else runs, nothing is tracked
    out = run(repo, "dvc", "repro")
    assert out.count("Running stage") == 1 and "Running stage 'data'" in out and "nothing to do" in out
    assert len(stage_runs(repo)) == 1 + len(STAGES) + 8 + 2


def test_the_models_are_dvc_artifacts(reproduced, tmp_path):
    """dvc.yaml's artifacts name the model folders: with the run's dvc.lock committed and a version registered
    (GTO's git tag), `dvc artifacts get` fetches one from the repository (here a local path whose DVC cache
    holds it)."""
    repo = copy_reproduced(reproduced, tmp_path)
    run(repo, "git", "add", "dvc.lock")
    run(repo, "git", "commit", "-qm", "the repro's lock")
    assert "Created git tag 'students@v0.0.1'" in run(repo, "gto", "register", "students")
    run(tmp_path, "dvc", "artifacts", "get", str(repo), "students", "-o", "students")
    assert sorted(p.name for p in (tmp_path / "students").iterdir()) == ["imdb", "sst2"]
    assert (tmp_path / "students/imdb/model.safetensors").read_bytes() == (
        repo / "models/distill/imdb/model.safetensors").read_bytes()


def test_param_change_reruns_only_what_depends_on_it(repo):
    """The experiment stops at pretrain (`dvc exp run pretrain`): what reruns above it is the point; the
    stages after it rerun as the objective experiment's do. Their outputs in the workspace stay the objective
    experiment's until a test reruns them (the killed repro below reruns adapt)."""
    repo, _, _ = repo
    out = run(repo, "dvc", "exp", "run", "pretrain", "-S", "tokenizer.algorithm=wordpiece", "-n", "wordpiece")
    assert "Running stage 'tokenizer'" in out and "Running stage 'clean'" not in out
    assert "Running stage 'pretrain'" in out  # the tokenizer changed, so does everything after it
    tok = json.loads((repo / "metrics/tokenizer.json").read_text())
    assert tok["algorithm"] == "wordpiece"
    latest = [r for r in stage_runs(repo) if r.data.tags.get("stage") == "tokenizer"][-1]
    assert latest.data.tags["dvc.exp_name"] == "wordpiece"
    shown = json.loads(run(repo, "dvc", "exp", "show", "--json"))
    assert "wordpiece" in json.dumps(shown)


def test_bad_params_fail_in_one_line(repo):
    repo, _, _ = repo
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["clean"]["min_char"] = 5
    bad = repo / "bad-params.yaml"
    bad.write_text(yaml.safe_dump(params))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-m", "stages.clean", "--params", str(bad), "--out", "data/x"],
                          cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {bad}: clean.min_char: unknown key; did you mean 'clean.min_chars'?"
    assert not (repo / "data/x").exists()


def test_a_stage_that_fails_or_is_killed_under_dvc_repro_leaves_its_last_outputs(repo):
    """DVC deletes a stage's outputs before running it unless they persist. Ours persist and the
    stage replaces them whole when it succeeds: a stage that stops on bad params, or is killed as soon
    as DVC has started it, leaves the last good model, metrics and plots exactly as they were."""
    repo, _, _ = repo
    outputs = ["models/pretrain/model.safetensors", "models/pretrain/config.json", "metrics/pretrain.json",
               "plots/pretrain/train.csv", "plots/pretrain/val.csv"]
    before = {path: (repo / path).read_bytes() for path in outputs}
    params_text = (repo / "params.yaml").read_text()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    try:
        params = yaml.safe_load(params_text)
        params["pretrain"]["batch_size"] = str(params["pretrain"]["batch_size"])
        (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        done = subprocess.run(["dvc", "repro", "-s", "pretrain"], cwd=repo, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode != 0 and "error: params.yaml: pretrain.batch_size: expected an integer" in done.stderr
        assert {path: (repo / path).read_bytes() for path in outputs} == before
        (repo / "params.yaml").write_text(params_text)
        dvc = subprocess.Popen(["dvc", "repro", "-s", "-f", "pretrain"], cwd=repo, env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not any("stages.pretrain" in " ".join(c.cmdline()) for c in psutil.Process(dvc.pid).children(True)):
            assert time.monotonic() < deadline and dvc.poll() is None, "DVC never started the stage"
            time.sleep(0.01)
        os.killpg(dvc.pid, signal.SIGKILL)  # DVC and the stage it runs
        dvc.wait()
        assert {path: (repo / path).read_bytes() for path in outputs} == before
    finally:
        (repo / "params.yaml").write_text(params_text)
    run(repo, "dvc", "status")  # the killed run left no lock behind


def test_a_repro_killed_and_run_again_is_one_parent_in_mlflow(repo, tmp_path, monkeypatch):
    """`dvc repro` killed (DVC and the stage) while pretrain runs, then run again: one parent run holds the
    killed attempt, the restarted stage and the stage after it; nothing is left RUNNING; facts are tags,
    curves metrics; the experiment says it is model training, and a copy of the store finds its artifacts."""
    repo, _, _ = repo
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    earlier = {r.info.run_id for r in stage_runs(repo)}
    params_text = (repo / "params.yaml").read_text()
    try:
        params = yaml.safe_load(params_text)
        params["pretrain"]["lr"] /= 2  # pretrain and adapt are out of date
        (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        dvc = subprocess.Popen(["dvc", "repro", "adapt"], cwd=repo, env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while not any(r.data.tags.get("stage") == "pretrain" and r.info.status == "RUNNING" for r in stage_runs(repo)):
            assert time.monotonic() < deadline and dvc.poll() is None, "pretrain never opened its MLflow run"
            time.sleep(0.1)
        os.killpg(dvc.pid, signal.SIGKILL)
        dvc.wait()
        run(repo, "dvc", "repro", "adapt")
    finally:
        (repo / "params.yaml").write_text(params_text)
    runs = stage_runs(repo)
    new = [r for r in runs if r.info.run_id not in earlier]
    parents = [r for r in new if r.data.tags["pipeline.role"] == "pipeline"]
    assert len(parents) == 1 and re.fullmatch(r"repro [0-9a-f]{7} \d{4}-\d\d-\d\d \d\d:\d\d", parents[0].info.run_name)
    assert [(r.data.tags.get("stage"), r.data.tags["mlflow.parentRunId"], r.info.status) for r in new[1:]] == [
        ("pretrain", parents[0].info.run_id, "KILLED"), ("pretrain", parents[0].info.run_id, "FINISHED"),
        ("adapt", parents[0].info.run_id, "FINISHED")]
    assert [r.info.run_name for r in runs if r.info.status == "RUNNING"] == []
    pretrain, adapt = new[2], new[3]
    assert pretrain.data.tags["summary.steps"] == "30" and "steps" not in pretrain.data.metrics
    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    adapted = json.loads((repo / "metrics/adapt.json").read_text())
    start = min(client.get_metric_history(adapt.info.run_id, "val_loss"), key=lambda m: m.step)
    assert (start.step, start.value) == (0, adapted["before_val_loss"])  # where the pretrained model starts
    experiment = client.get_experiment(adapt.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert experiment.artifact_location == f"mlruns/{experiment.experiment_id}"
    shutil.copy(repo / "mlflow.db", tmp_path)
    shutil.copytree(repo / "mlruns", tmp_path / "mlruns")
    monkeypatch.chdir(tmp_path)  # where `mlflow ui` runs to find the copy as its default store
    copied = MlflowClient(tracking_uri="sqlite:///mlflow.db")
    assert "pretrain.json" in {f.path for f in copied.list_artifacts(pretrain.info.run_id)}


def test_a_time_limit_that_stops_a_run_says_so(repo, tmp_path):
    """Token budgets decide a run; the wall-clock limit is a safety stop, and when it does stop one,
    the metrics say in plain words how far it got, and so does the stage's log."""
    repo, _, _ = repo
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["tracking"]["enabled"] = False
    params["pretrain"].update(budget_tokens=32 * 8 * 10_000, budget_minutes=0.002)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    done = subprocess.run([sys.executable, *stage_args("pretrain", tmp_path / "params.yaml", KILLS["pretrain"][0],
                                                       tmp_path)], cwd=repo, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["tokens_planned"] == 32 * 8 * 10_000 > metrics["tokens_seen"]
    assert metrics["stopped_early"].startswith(f"pretrain.budget_minutes (0.002) stopped it after "
                                               f"{metrics['tokens_seen']:,} of 2,560,000 planned tokens")
    assert f"warning: pretrain: {metrics['stopped_early']}" in done.stdout


def checkpoint_steps(directory: Path) -> list[int]:
    """The steps of the checkpoints in `directory` (one being pruned as we look is passed over)."""
    steps = []
    for path in checkpoints(directory):
        try:
            steps.append(json.loads((path / "state.json").read_text())["step"])
        except (OSError, ValueError):
            pass
    return steps


def without_timings(value):
    """Metrics with every wall-clock figure taken out: what must repeat exactly."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if "seconds" not in k and "per_s" not in k}
    return value


def saved_epochs(directory: Path) -> int:
    return max((int(p.name.split("-")[1]) for p in directory.glob("*/epochs/ckpt-*")), default=0)


# stage -> its inputs, the params it trains with here, its saved progress, and the progress points to
# kill it after (all before its last save); finetune resumes run by run, of 2 tasks x 2 variants here (the
# trained and the probed kind)
KILLS = {
    "pretrain": (["--tokenizer", "data/tokens/tokenizer", "--tokens", "data/tokens/pretrain"],
                 {"objective": "mlm", "pretrain": dict(budget_tokens=32 * 8 * 120, checkpoint_every=20, eval_every=40)},
                 lambda ckpt: max(checkpoint_steps(ckpt), default=0), (20, 40, 60, 80)),
    "adapt": (["--model", "models/pretrain", "--tokens", "data/tokens/domain"],
              {"adapt": dict(budget_tokens=32 * 8 * 60, checkpoint_every=10, eval_every=20)},
              lambda ckpt: max(checkpoint_steps(ckpt), default=0), (10, 20, 30, 40)),
    "finetune": (["--model", "models/adapt"], {"finetune": dict(epochs=3, variants=["ulmfit", "frozen"])},
                 lambda ckpt: len(list(ckpt.glob("*/*-seed*.json"))), (1, 2, 3)),
    "distill": (["--teachers", "models/finetune"], {"distill": dict(epochs=4)}, saved_epochs, (1, 2)),
}


@pytest.mark.parametrize("stage", KILLS)
def test_a_stage_killed_and_rerun_ends_like_an_uninterrupted_run(repo, tmp_path, stage):
    """SIGKILL a training stage at a random point after it has saved progress, start it again: it
    resumes (never from zero) and its metrics equal those of a run that was never interrupted, as do
    two uninterrupted runs'. The point: right after a random one of the stage's saves (within the 20 ms
    the test polls at; a tiny stage trains dozens of steps in half a second, so waiting longer can
    land after its outputs); the seed is in the failure message."""
    repo, _, _ = repo
    inputs, changes, progress, points = KILLS[stage]
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["tracking"]["enabled"] = False
    for key, value in changes.items():
        if isinstance(value, dict):
            params[key].update(value)
        else:
            params[key] = value
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    outputs = ["--metrics", "metrics.json", "--plots", "plots", "--checkpoints", "ckpt",
               "--out", "out"]

    def command(name):
        return [sys.executable, "-m", f"stages.{stage}", "--params", str(params_file), *inputs,
                *[arg if arg.startswith("--") else str(tmp_path / name / arg) for arg in outputs]]

    for name in ("whole", "again"):
        done = subprocess.run(command(name), cwd=repo, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    seed = int(os.environ.get("KILL_SEED", random.randrange(10**6)))
    rng = random.Random(seed)
    for point in (rng.choice(points), points[0]):  # a run that ends first is killed sooner
        shutil.rmtree(tmp_path / "killed", ignore_errors=True)
        process = subprocess.Popen(command("killed"), cwd=repo, env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while progress(tmp_path / "killed" / "ckpt") < point and process.poll() is None:
            assert time.monotonic() < deadline, "nothing saved to resume from"
            time.sleep(0.02)
        if process.poll() is None:
            break
    process.send_signal(signal.SIGKILL)
    where = f"KILL_SEED={seed}: killed after save {point}"
    assert process.wait() == -signal.SIGKILL, f"the stage ended before it could be killed ({where})"
    assert not (tmp_path / "killed" / "metrics.json").exists() and not (tmp_path / "killed" / "out").exists()
    resumed = subprocess.run(command("killed"), cwd=repo, env=env, check=True, capture_output=True, text=True,
                             timeout=600)
    assert re.search(r"resuming from step|done in an earlier run, kept|resuming after epoch", resumed.stdout)
    whole, again, killed = (without_timings(json.loads((tmp_path / name / "metrics.json").read_text()))
                            for name in ("whole", "again", "killed"))
    assert killed == whole, where
    assert again == whole


def keys(value, prefix=""):
    return {prefix + k for k in value} | {x for k, v in value.items() if isinstance(v, dict)
                                          for x in keys(v, f"{prefix}{k}.")} if isinstance(value, dict) else set()


def distributable_params(repo: Path, stage: str) -> dict:
    """The repo's params, for pretrain with the clm objective and no dropout: it then draws no random
    numbers (dropout's differ per rank), so N ranks compute what 1 process does."""
    params = yaml.safe_load((repo / "params.yaml").read_text())
    if stage == "pretrain":
        params.update(objective="clm")
        params["model"]["dropout"] = 0.0
    return params


def stage_args(stage: str, params_file: Path, inputs: list[str], out: Path) -> list[str]:
    """`-m stages.<stage> ...` with its outputs under `out`."""
    return ["-m", f"stages.{stage}", "--params", str(params_file), *inputs, "--out", str(out / "model"),
            "--metrics", str(out / "metrics.json"), "--plots", str(out / "plots"), "--checkpoints", str(out / "ckpt")]


def start_distributable(repo: Path, stage: str, params: dict, nproc: int, strategy: str,
                        folder: Path) -> tuple[subprocess.Popen, Path]:
    """`stage` started with `params` on impl.nproc `nproc` processes, its params file in `folder` and its
    outputs and MLflow store (tracking on, torchrun on PATH) in folder/<nproc><strategy>/: the process and
    that folder. Each run has a store of its own, so runs side by side never race to create one."""
    inputs = KILLS[stage][0]
    params = copy.deepcopy(params)
    params["impl"].update(nproc=nproc, strategy=strategy)
    params_file = folder / f"params{nproc}{strategy}.yaml"
    params_file.write_text(yaml.safe_dump(params))
    out = folder / f"{nproc}{strategy}"
    out.mkdir()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{out / 'mlflow.db'}", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, *stage_args(stage, params_file, inputs, out)], cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), out


def finish_distributable(process: subprocess.Popen, out: Path) -> tuple[dict, str, Path]:
    """A run of start_distributable, once it has written its model and removed its checkpoints: its
    metrics, its stdout and its folder."""
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    assert any((out / "model").iterdir()) and not (out / "ckpt").exists()
    return json.loads((out / "metrics.json").read_text()), stdout, out


def distributable_runs(repo: Path, stage: str, params: dict, runs: list[tuple[int, str]],
                       folder: Path) -> dict[tuple[int, str], tuple[dict, str, Path]]:
    """The `runs` ((nproc, strategy) pairs) of `stage`, side by side (a tiny stage's time is mostly the
    start of its processes, which take a core each): finish_distributable of each."""
    started = {run: start_distributable(repo, stage, params, *run, folder) for run in runs}
    try:
        return {run: finish_distributable(*started[run]) for run in runs}
    finally:
        for process, _ in started.values():
            if process.poll() is None:
                process.kill()


@pytest.fixture(scope="module")
def pretrain_one_process(repo, tmp_path_factory) -> tuple[dict, str, Path]:
    """pretrain on one process (impl.nproc 1) with the distributable params: the reference that the
    two-node and the torchrun pretrain tests, which run next to each other on the workspace as it then is,
    compare with (run once for both). finish_distributable's metrics, stdout and folder."""
    repo, _, _ = repo
    return distributable_runs(repo, "pretrain", distributable_params(repo, "pretrain"), [(1, "ddp")],
                              tmp_path_factory.mktemp("pretrain_one_process"))[1, "ddp"]


def test_two_nodes_meet_at_a_rendezvous(repo, tmp_path, pretrain_one_process):
    """Multi-node as torchrun does it: two launchers of one process each (on this machine, standing in
    for two nodes that share a file system) meet at a c10d rendezvous, the stage runs as their two
    ranks and reaches the one-process validation loss, and one rank writes the outputs."""
    repo, _, _ = repo
    inputs = KILLS["pretrain"][0]
    params = distributable_params(repo, "pretrain")
    params["tracking"]["enabled"] = False
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
              "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=pipeline-test",
              *stage_args("pretrain", params_file, inputs, tmp_path / "two")]
    nodes = [subprocess.Popen(launch, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for node in nodes:
        _, err = node.communicate(timeout=600)
        assert node.returncode == 0, err[-3000:]
    one, two = pretrain_one_process[0], json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert two["tokens_seen"] == one["tokens_seen"] and two["steps"] == one["steps"]
    assert two["val_loss"] == pytest.approx(one["val_loss"], rel=1e-4)
    assert (tmp_path / "two" / "model" / "model.safetensors").is_file() and not (tmp_path / "two" / "ckpt").exists()


@pytest.mark.parametrize("stage", KILLS)
def test_a_training_stage_under_torchrun(repo, tmp_path, stage, request):
    """impl.nproc: 2 relaunches the stage under torchrun (gloo on CPU): two ranks, one MLflow run, one set
    of outputs, replicated (DDP) and sharded (FSDP2); pretraining (no dropout) reaches the one-process
    validation loss with the same global batch (its one-process run is the rendezvous test's too). The
    runs go side by side, each with its own outputs and MLflow store."""
    repo, _, _ = repo
    params = distributable_params(repo, stage)
    runs = [(1, "ddp"), (2, "ddp"), (2, "fsdp")]
    done = {(1, "ddp"): request.getfixturevalue("pretrain_one_process")} if stage == "pretrain" else {}
    done.update(distributable_runs(repo, stage, params, [run for run in runs if run not in done], tmp_path))
    one = done[1, "ddp"][0]
    for nproc, strategy in runs:
        this, stdout, out = done[nproc, strategy]
        assert nproc == 1 or f"running under torchrun with {strategy}" in stdout
        assert keys(this) == keys(one)
        if stage in ("pretrain", "adapt"):
            assert stdout.count("validation") == this["steps"] // params[stage]["eval_every"] + (stage == "adapt")
            assert this["tokens_seen"] == one["tokens_seen"]
        if stage == "pretrain":
            assert this["val_loss"] == pytest.approx(one["val_loss"], rel=1e-4)
        client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
        found = client.search_runs([client.get_experiment_by_name("transfer-pipeline").experiment_id],
                                   filter_string=f"tags.stage = '{stage}'")
        tracked = [r for r in found if r.data.tags.get("pipeline.role") == "stage"]
        assert len(tracked) == 1, (nproc, strategy)  # one per execution, none from rank 1
