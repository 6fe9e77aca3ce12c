"""TextClassifier on raw strings: the same predictions as the in-pipeline forward, pairs, input errors,
importable without MLflow; and the pyfunc model through `mlflow models predict`."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lib.config.errors import UserError
from lib.config.params import SpecialTokens
from lib.core import runtime
from lib.data.encoding import encode
from lib.data.tokenizer import load_tokenizer, special_ids
from lib.serving.predict import PROBABILITY_PREFIX, TextClassifier, log_pyfunc, predict_frame
from lib.tasks.classification import Example, collate
from lib.tasks.model import HEAD_FILE, load_task_model, save_task_model
from tests.helpers import ROOT, TINY_LABELS, TINY_MAX_LEN, TINY_TEXTS, save_tiny_classifier, tiny_tokenizer

LABELS, MAX_LEN, TEXTS = TINY_LABELS, TINY_MAX_LEN, TINY_TEXTS
BAD = json.loads('"bad \\ud800 film"')  # an unpaired surrogate, as JSON can carry one


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("predict")
    tok = tiny_tokenizer(root / "tok")
    return {"tok": tok, "single": save_tiny_classifier(root / "single", tok),
            "pair": save_tiny_classifier(root / "pair", tok, pairs=True)}


def forward_labels(model_dir: Path, texts: list[str], pairs: list[str] | None) -> tuple[list[str], np.ndarray]:
    """Labels and probabilities as the finetune stage computes them: encode, one padded batch, argmax."""
    model, info = load_task_model(model_dir)
    tokenizer = load_tokenizer(model_dir)
    special = special_ids(tokenizer, SpecialTokens())
    ids, segments, truncated = encode(tokenizer, texts, pairs, MAX_LEN, "head_tail", special["bos"], special["eos"])
    assert truncated >= 1
    batch = collate([Example(i, s, 0) for i, s in zip(ids, segments)], special["pad"])
    with torch.no_grad():
        logits, _ = model(batch.input_ids, batch.segment_ids, batch.attention_mask)
    return [info["label_names"][i] for i in logits.argmax(-1)], torch.softmax(logits, -1).numpy()


def test_predictions_equal_the_classifier_forward_in_input_order(folders):
    clf = TextClassifier.load(folders["single"], device="cpu", precision="fp32")  # as forward_labels computes
    expected, probabilities = forward_labels(folders["single"], TEXTS, None)
    assert len(set(expected)) > 1  # else order and argmax would go untested
    assert clf.predict(TEXTS, batch_size=3) == expected  # batches sorted by length, then put back in order
    proba = clf.predict_proba(TEXTS, batch_size=3)
    assert proba.shape == (len(TEXTS), len(LABELS)) and proba.dtype == np.float32
    np.testing.assert_allclose(proba, probabilities, atol=1e-5)
    np.testing.assert_allclose(proba.sum(1), 1, atol=1e-6)
    assert clf.predict([]) == [] and clf.predict_proba([]).shape == (0, len(LABELS))


def test_pair_classifier_reads_text_pairs(folders):
    clf = TextClassifier.load(folders["pair"], device="cpu", precision="fp32")  # as forward_labels computes
    seconds = list(reversed(TEXTS))
    expected, _ = forward_labels(folders["pair"], TEXTS, seconds)
    assert clf.pairs and clf.predict(TEXTS, seconds, batch_size=2) == expected


@pytest.mark.parametrize("outcome, auto", [("crash", "fp32"), ("slower", "fp32"), ("faster", "bf16")])
def test_cpu_precision_follows_the_bf16_probe(folders, monkeypatch, outcome, auto):
    probe = runtime.Probe(outcome, *((None, None, "SIGILL") if outcome == "crash" else (200.0, 100.0, None)), 1.0)
    monkeypatch.setattr(runtime, "cpu_bf16_probe", lambda: probe)
    assert TextClassifier.load(folders["single"], device="cpu").precision == auto
    assert TextClassifier.load(folders["single"], device="cpu", precision="fp32").precision == "fp32"
    if outcome == "crash":
        with pytest.raises(UserError, match="^precision: bf16 crashes on this CPU .*; set precision: auto or fp32"):
            TextClassifier.load(folders["single"], device="cpu", precision="bf16")


def test_any_iterable_of_strings_is_read_once(folders):
    clf = TextClassifier.load(folders["pair"], device="cpu")
    seconds = list(reversed(TEXTS))
    expected = clf.predict(TEXTS, seconds)
    assert clf.predict((text for text in TEXTS), iter(seconds)) == expected  # generators: used up by one reading
    np.testing.assert_array_equal(clf.predict_proba(iter(TEXTS), tuple(seconds)), clf.predict_proba(TEXTS, seconds))


@pytest.mark.parametrize("folder, call, message", [
    ("tok", lambda clf: None, "not a classifier folder"),
    ("pair", lambda clf: clf.predict(["a premise"]), "pass the second texts as text_pairs="),
    ("single", lambda clf: clf.predict(["a"], text_pairs=["b"]), "leave text_pairs out"),
    ("single", lambda clf: clf.predict(["fine", None]), "texts[1] is a missing value (None), not str"),
    ("single", lambda clf: clf.predict(["fine", float("nan")]), "texts[1] is a missing value (nan), not str"),
    ("single", lambda clf: clf.predict(["fine", 3]), "texts[1] is int, not str"),
    ("single", lambda clf: clf.predict("one text"), "wrap a single text in a list"),
    ("pair", lambda clf: clf.predict(["a", "b"], ["c"]), "2 texts but 1 text_pairs"),
    ("single", lambda clf: clf.predict(["fine", BAD]), r"texts[1] has an unpaired surrogate ('\ud800' at character 4)"),
    ("pair", lambda clf: clf.predict(["a", "b"], ["c", BAD]), "text_pairs[1] has an unpaired surrogate"),
    ("single", lambda clf: clf.predict_proba(["a"], batch_size=0), "batch_size is 0; pass a whole number"),
    ("single", lambda clf: clf.predict(["a"], batch_size=2.5), "batch_size is 2.5; pass a whole number"),
])
def test_bad_input_is_one_user_error_line(folders, folder, call, message):
    with pytest.raises(UserError) as err:
        call(TextClassifier.load(folders[folder]))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_pyfunc_model_names_the_column_and_row_of_a_string_utf8_cannot_encode(folders):
    import pandas as pd

    # object dtype: a pyarrow-backed string column cannot hold the surrogate at all
    frame = pd.DataFrame({"text": pd.Series(["fine", BAD], index=[10, 11], dtype=object)})
    with pytest.raises(UserError, match=r"^model_input\['text'\]\[1\] has an unpaired surrogate"):
        predict_frame(TextClassifier.load(folders["single"]), frame)


def test_a_folder_without_encoding_is_refused(folders, tmp_path):
    model, _ = load_task_model(folders["single"])
    save_task_model(model, tmp_path / "old", folders["tok"], {"label_names": LABELS})
    with pytest.raises(UserError, match="re-run the finetune stage"):
        TextClassifier.load(tmp_path / "old")


@pytest.mark.parametrize("load", [load_task_model, TextClassifier.load], ids=["load_task_model", "TextClassifier.load"])
def test_a_truncated_head_is_one_line_naming_the_file(folders, tmp_path, load):
    broken = tmp_path / "broken"
    shutil.copytree(folders["single"], broken)
    head = broken / HEAD_FILE
    head.write_bytes(head.read_bytes()[:100])
    with pytest.raises(UserError) as err:
        load(broken)
    assert str(err.value).startswith(f"{head}: not a readable safetensors file (SafetensorError")
    assert "\n" not in str(err.value)


def test_predict_imports_and_runs_without_mlflow_or_pandas(folders):
    code = ("import sys; sys.modules['mlflow'] = sys.modules['pandas'] = None\n"  # None: any import fails
            "from lib.serving.predict import TextClassifier\n"
            f"print(TextClassifier.load({str(folders['single'])!r}).predict(['I loved it']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() in {str([label]) for label in LABELS}


def logged(folder: Path, tmp_path: Path, monkeypatch) -> str:
    """The URI of `folder` logged as a pyfunc model into a fresh store in tmp_path."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    experiment = mlflow.create_experiment("predict", artifact_location=(tmp_path / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment):
        return log_pyfunc(folder, "classifier")


def test_logged_pyfunc_predicts_like_text_classifier_from_the_cli(folders, tmp_path, monkeypatch):
    import mlflow
    import pandas as pd

    uri = logged(folders["single"], tmp_path, monkeypatch)
    clf = TextClassifier.load(folders["single"])

    loaded = mlflow.pyfunc.load_model(uri)
    frame = loaded.predict(pd.DataFrame({"text": TEXTS}))
    assert list(frame.columns) == ["label"] + [f"{PROBABILITY_PREFIX}{label}" for label in LABELS]
    assert frame["label"].tolist() == clf.predict(TEXTS)
    np.testing.assert_allclose(frame.iloc[:, 1:].to_numpy(), clf.predict_proba(TEXTS), atol=1e-6)
    requirements = Path(mlflow.pyfunc.get_model_dependencies(uri)).read_text().split()
    assert f"torch=={torch.__version__.split('+')[0]}" in requirements

    # A fresh process, outside the project: `lib` comes from the model's own code_paths copy.
    (tmp_path / "input.json").write_text(json.dumps({"dataframe_split": {"columns": ["text"],
                                                                          "data": [[t] for t in TEXTS]}}))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-m", "mlflow", "models", "predict", "-m", uri, "-i", "input.json",
                             "-o", "output.json", "-t", "json", "--env-manager", "local"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    predictions = json.loads((tmp_path / "output.json").read_text())["predictions"]
    assert [row["label"] for row in predictions] == clf.predict(TEXTS)


def post(app, path: str, payload: dict) -> tuple[int, dict]:
    """POST `payload` as JSON to the ASGI `app` in this process, as a client of its server would: the
    response's status and JSON body."""
    import asyncio

    request = [{"type": "http.request", "body": json.dumps(payload).encode(), "more_body": False}]
    sent = []

    async def receive() -> dict:
        if request:
            return request.pop()
        await asyncio.Event().wait()  # the client stays connected until it has the response

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 80)}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), timeout=60))
    status = next(message["status"] for message in sent if message["type"] == "http.response.start")
    return status, json.loads(b"".join(message.get("body", b"") for message in sent
                                       if message["type"] == "http.response.body"))


def test_the_served_model_answers_a_null_or_non_string_text_with_the_one_line(folders, tmp_path, monkeypatch):
    import mlflow
    from mlflow.pyfunc import scoring_server

    # the app `mlflow models serve` runs, without a port
    app = scoring_server.init(mlflow.pyfunc.load_model(logged(folders["single"], tmp_path, monkeypatch)))
    status, body = post(app, "/invocations", {"dataframe_split": {"columns": ["text"], "data": [["fine"]]}})
    assert status == 200
    assert [row["label"] for row in body["predictions"]] == TextClassifier.load(folders["single"]).predict(["fine"])
    hint = "not str; pass strings (convert or drop missing values first)"
    # a null alone stays None; beside a string, pandas reads it as NaN
    for data, line in (([[None]], f"model_input['text'][0] is a missing value (None), {hint}"),
                       ([["fine"], [None]], f"model_input['text'][1] is a missing value (nan), {hint}"),
                       ([["fine"], [3]], f"model_input['text'][1] is int, {hint}")):
        status, body = post(app, "/invocations", {"dataframe_split": {"columns": ["text"], "data": data}})
        assert status == 400 and body["error_code"] == "INVALID_PARAMETER_VALUE" and "stack_trace" not in body
        # MLflow puts the input before the model's message: "Failed to predict data '<frame>'. \nError: <message>"
        assert body["message"].startswith("Failed to predict data '") and body["message"].endswith(f"\nError: {line}")
        assert not any(leak in json.dumps(body) for leak in ("Traceback", str(ROOT), "site-packages", ".py"))


def test_log_pyfunc_needs_an_active_run(folders):
    with pytest.raises(UserError, match="start_run"):
        log_pyfunc(folders["single"], "classifier")
