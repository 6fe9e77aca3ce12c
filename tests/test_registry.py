"""The model registry: evaluate's teachers and students as versions of named models, alias `best` on the
highest dev score; and `mlflow models serve` answering for a registered student."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


from lib.config.params import TrackingConfig
from lib.core import tracking
from lib.serving.predict import TextClassifier, log_pyfunc
from tests.helpers import TINY_TEXTS, save_tiny_classifier, tiny_tokenizer
from tests.test_tracking import store  # noqa: F401 (the fixture)

CFG = TrackingConfig(experiment="bob's runs")  # a quote: the registered name must still search and serve


def evaluate_run(all_params=None):
    return tracking.stage_run("evaluate", CFG, all_params or {"objective": "clm"}, {})


def register(run, dev: dict[str, float], uri: str | None = None) -> str:
    """A version of imdb-student with `dev`, of a logged model `uri` (an empty one where None)."""
    if uri is None:
        experiment = run.client.get_run(run.run_id).info.experiment_id
        uri = f"models:/{run.client.create_logged_model(experiment, source_run_id=run.run_id).model_id}"
    name = tracking.registered_name(CFG.experiment, "imdb-student")
    run.register_model(uri, name, dev, "accuracy")
    return name


def test_alias_best_names_the_version_with_the_highest_dev_score(store):
    for dev in ({"accuracy": 0.7}, {"accuracy": 0.9, "f1": 0.1}, {"accuracy": 0.8}, {"f1": 0.95}):
        with evaluate_run({"objective": "electra" if dev.get("accuracy") == 0.9 else "clm"}) as run:
            name = register(run, dev)
    assert name == "bob-s-runs.imdb-student"
    best = store.get_model_version_by_alias(name, tracking.BEST_ALIAS)
    assert int(best.version) == 2 and best.tags["dev.accuracy"] == "0.9" and best.tags["pipeline.objective"] == "electra"
    assert best.run_id and best.tags["git.commit"]
    # a tie goes to the newer version; a version scored on another metric never takes the alias
    with evaluate_run() as run:
        register(run, {"accuracy": 0.9})
    assert store.get_model_version_by_alias(name, tracking.BEST_ALIAS).version == 5
    assert len(store.search_model_versions(f"name = '{name}'")) == 5


def test_nothing_is_registered_with_tracking_off(store):
    run = tracking.StageRun()
    run.register_model("models:/m-0", "x.imdb-student", {"accuracy": 1.0}, "accuracy")
    assert store.search_registered_models() == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mlflow_serves_the_registered_student_by_its_alias(store, tmp_path):
    folder = save_tiny_classifier(tmp_path / "student", tiny_tokenizer(tmp_path / "tok"))
    with evaluate_run() as run:
        name = register(run, {"accuracy": 0.6}, run.log_model(log_pyfunc, folder, "imdb-student"))
    port = free_port()
    # serve execs `uvicorn` by name: the environment's scripts must be on PATH, activated or not
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    # from the store's folder, where its relative artifact paths start (as `mlflow ui`)
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m", f"models:/{name}@best",
                               "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port)],
                              cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              start_new_session=True)
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations", headers={"Content-Type": "application/json"},
            data=json.dumps({"dataframe_split": {"columns": ["text"], "data": [[t] for t in TINY_TEXTS]}}).encode())
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    predictions = json.loads(response.read())["predictions"]
                break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode()[-3000:]
                assert time.monotonic() < deadline, "mlflow models serve did not answer in 180 s"
                time.sleep(1)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    assert [row["label"] for row in predictions] == TextClassifier.load(folder).predict(TINY_TEXTS)
