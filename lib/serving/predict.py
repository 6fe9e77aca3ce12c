"""Classify raw text with a classifier folder the finetune stage wrote, in Python or as an MLflow model.

A prediction must see exactly the inputs training saw, so `TextClassifier` reads everything from the
folder itself: the tokenizer (tokenizer.json), the layout and truncation (classifier.json's
"encoding"), the special token ids (tokenizer_meta.json); it encodes as the model's task type does (a
type lib/serving serves: lib.tasks.capabilities.Served) and predicts through lib.tasks.scoring, the path
finetune and evaluate score with. Texts are batched by length (little padding) and returned in input order.

    from lib.serving.predict import TextClassifier
    clf = TextClassifier.load("models/finetune/imdb")
    clf.predict(["A wonderful film.", "Dull and far too long."])

`log_pyfunc` logs the folder as an MLflow pyfunc model, so `mlflow models predict/serve` and
`mlflow.pyfunc.load_model` classify a DataFrame with the task's text column(s) (a list of records
works too; a bare list of strings does not pass MLflow's check of the named column). MLflow and pandas
are imported only there and in the pyfunc wrapper: the GPU image has no MLflow, and `import lib.serving.predict`
must work on it. The wrapper class is built by a function rather than defined at module level, as a
module-level subclass would need mlflow at import; cloudpickle stores such a class by value, with its
references to this module by name, which the logged copy of `lib` (code_paths) resolves at load time.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tokenizers import Tokenizer

from lib.config.errors import UserError
from lib.config.params import ImplConfig
from lib.core import runtime
from lib.data.tokenizer import TOKENIZER_FILE, saved_special_ids
from lib.tasks import TYPES, saved_type
from lib.tasks.base import TaskData
from lib.tasks.capabilities import Served
from lib.tasks.model import META_FILE, TaskModel, load_task_model
from lib.tasks.scoring import predict_all

if TYPE_CHECKING:
    import pandas as pd

ARTIFACT = "classifier"  # the key of the folder among the pyfunc model's artifacts
PROBABILITY_PREFIX = "p_"  # pyfunc output: a p_<label> column per class beside "label"
# What the logged model imports, pinned to the versions it was logged with. cloudpickle unpickles the
# wrapper class; a different version may fail to read it.
PIP_PACKAGES = ("torch", "tokenizers", "safetensors", "numpy", "pandas", "pyyaml", "cloudpickle", "mlflow")


@dataclass(frozen=True)
class Encoding:
    """How the classifier's inputs were encoded in training (classifier.json's "encoding")."""
    max_len: int
    truncation: str
    text_field: str
    text_pair_field: str | None  # None: single texts

    @property
    def fields(self) -> list[str]:
        return [self.text_field] if self.text_pair_field is None else [self.text_field, self.text_pair_field]


class TextClassifier:
    """A saved classifier that takes raw strings: `predict` gives label names, `predict_proba` class
    probabilities (columns in the order of `label_names`)."""

    def __init__(self, kind: Served, model: TaskModel, tokenizer: Tokenizer, label_names: list[str],
                 encoding: Encoding, special: dict[str, int], device: torch.device,
                 precision: runtime.Precision = "fp32"):
        self.kind, self.model, self.tokenizer, self.label_names = kind, model, tokenizer, label_names
        self.encoding, self.special, self.device, self.precision = encoding, special, device, precision
        # the task as the saved model knows it: what lib.tasks.scoring reads to batch and run it
        self.task = TaskData("", label_names, [], [], None, "", {}, {}, type=kind.name,
                             language=None if model.language is None else model.backbone.cfg.languages[model.language])

    @classmethod
    def load(cls, model_dir: str | Path, device: str = "auto", precision: str = "auto") -> TextClassifier:
        """The classifier in `model_dir` (written by the finetune stage) on `device`: auto, cpu or cuda
        (auto: cuda when a GPU is visible), predicting in `precision`: auto, bf16 or fp32 (auto: bf16
        on CUDA, and on a CPU where bf16 matmuls proved faster than fp32; see lib/core/runtime.py)."""
        model_dir = Path(model_dir)
        if not (model_dir / META_FILE).is_file():
            raise UserError(f"{model_dir}: not a classifier folder (no {META_FILE}); point at a folder written "
                            "by the finetune stage, e.g. models/finetune/<task>")
        torch_device = runtime.resolve_device(device)
        resolved = runtime.resolve_precision(precision, torch_device, key="precision")
        model, info = load_task_model(model_dir, torch_device)
        kind = saved_type(info)
        if not isinstance(kind, Served):
            served = " or ".join(other.name for other in TYPES.values() if isinstance(other, Served))
            raise UserError(f"{model_dir}: a {kind.name} model; TextClassifier classifies texts with a {served} model")
        try:
            encoding = Encoding(**info["encoding"])
            label_names = [str(name) for name in info["label_names"]]
        except (KeyError, TypeError) as err:
            raise UserError(f"{model_dir / META_FILE}: no usable label_names and encoding ({err!r}); "
                            "re-run the finetune stage to write a complete classifier folder") from None
        if len(label_names) != model.head_cfg.n_classes:
            raise UserError(f"{model_dir / META_FILE}: {len(label_names)} label_names for a "
                            f"{model.head_cfg.n_classes}-class head; re-run the finetune stage")
        try:
            tokenizer = Tokenizer.from_file(str(model_dir / TOKENIZER_FILE))
        except Exception as err:  # tokenizers raises a bare Exception for a missing or corrupt file
            raise UserError(f"{model_dir / TOKENIZER_FILE}: cannot read the tokenizer ({type(err).__name__}: {err}); "
                            "copy it from the tokenizer the classifier was trained with") from None
        return cls(kind, model, tokenizer, label_names, encoding, saved_special_ids(model_dir), torch_device, resolved)

    @property
    def pairs(self) -> bool:
        """Whether the classifier reads text pairs (e.g. premise and hypothesis)."""
        return self.encoding.text_pair_field is not None

    def predict(self, texts: Iterable[str], text_pairs: Iterable[str] | None = None,
                batch_size: int = 32) -> list[str]:
        """The predicted label name of each text (of each pair, with `text_pairs`)."""
        probabilities = self.predict_proba(texts, text_pairs, batch_size)
        return [self.label_names[i] for i in probabilities.argmax(axis=1)]

    def predict_proba(self, texts: Iterable[str], text_pairs: Iterable[str] | None = None,
                      batch_size: int = 32) -> np.ndarray:
        """(len(texts), n_classes) float32 class probabilities, rows in the order of `texts` (any
        iterable of strings: a list, a pandas Series, a generator)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UserError(f"batch_size is {batch_size!r}; pass a whole number of texts per batch, at least 1")
        texts, text_pairs = self._checked_inputs(texts, text_pairs)
        examples = self.kind.encode_texts(texts, text_pairs, self.encoding, self.tokenizer, self.special)
        probabilities = predict_all(self.model, self.task, examples, batch_size, self.special["pad"], self.device,
                                    ImplConfig(precision=self.precision),
                                    read=lambda outputs, part: list(torch.softmax(outputs.float(), dim=-1).numpy()))
        return np.array(probabilities, dtype=np.float32).reshape(len(texts), len(self.label_names))

    def _checked_inputs(self, texts: Iterable[str],
                        text_pairs: Iterable[str] | None) -> tuple[list[str], list[str] | None]:
        """The inputs as lists, read once (reading an iterator uses it up), after checking them."""
        fields = " and ".join(f"'{field}'" for field in self.encoding.fields)
        if self.pairs and text_pairs is None:
            raise UserError(f"this classifier reads text pairs ({fields}); pass the second texts as text_pairs=")
        if not self.pairs and text_pairs is not None:
            raise UserError(f"this classifier reads single texts ({fields}); leave text_pairs out")
        texts = strings("texts", texts)
        text_pairs = None if text_pairs is None else strings("text_pairs", text_pairs)
        if text_pairs is not None and len(text_pairs) != len(texts):
            raise UserError(f"{len(texts)} texts but {len(text_pairs)} text_pairs; pass one second text per text")
        return texts, text_pairs


def strings(name: str, values: Iterable[str]) -> list[str]:
    """`values` as a list, each checked to be a str that UTF-8 can encode (the tokenizer's input);
    `name` is the argument's, for the message."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise UserError(f"{name} is one {type(values).__name__}, not a list of strings; wrap a single text in a list")
    values = list(values)
    for i, value in enumerate(values):
        if not isinstance(value, str):
            # pandas reads a JSON null as None, or as NaN in a column that also holds strings: both are missing
            missing = value is None or (isinstance(value, float) and value != value)
            what = f"a missing value ({value!r})" if missing else type(value).__name__
            raise UserError(f"{name}[{i}] is {what}, not str; pass strings (convert or drop missing values first)")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:  # a lone surrogate, e.g. from JSON's "\ud800" or a bad decode
            raise UserError(f"{name}[{i}] has an unpaired surrogate ({value[err.start]!a} at character {err.start}), "
                            "which no Unicode text has; fix how it was decoded, or drop it") from None
    return values


def predict_frame(classifier: TextClassifier, frame: pd.DataFrame) -> pd.DataFrame:
    """The pyfunc model's predictions for a DataFrame with the classifier's text column(s): a DataFrame
    with "label" and a p_<label> column per class."""
    import pandas as pd

    # the signature has checked that the columns are there and hold strings; checked here again so that a
    # string UTF-8 cannot encode is named by its column and row
    columns = [strings(f"model_input[{field!r}]", frame[field]) for field in classifier.encoding.fields]
    probabilities = classifier.predict_proba(*columns)
    labels = [classifier.label_names[i] for i in probabilities.argmax(axis=1)]
    return pd.DataFrame({"label": labels, **{f"{PROBABILITY_PREFIX}{name}": probabilities[:, k].astype(np.float64)
                                             for k, name in enumerate(classifier.label_names)}})


def pyfunc_model_class() -> type:
    """The mlflow.pyfunc.PythonModel that wraps a TextClassifier (built here: mlflow is imported lazily)."""
    import mlflow.pyfunc
    import pandas as pd
    from mlflow.exceptions import MlflowException

    class TextClassifierModel(mlflow.pyfunc.PythonModel):
        def load_context(self, context) -> None:
            self.classifier = TextClassifier.load(context.artifacts[ARTIFACT])

        def predict(self, context, model_input, params: dict[str, Any] | None = None):
            try:
                return predict_frame(self.classifier, model_input)
            except UserError as err:
                # `mlflow models serve` answers an MlflowException with its message (INVALID_PARAMETER_VALUE:
                # HTTP 400), and any other exception with a generic message and the server's traceback
                raise MlflowException.invalid_parameter_value(str(err)) from None

        # MLflow reads predict's input hint when the class is created and warns when it cannot resolve
        # one; this module's hints are postponed strings, so give it the class itself. A DataFrame hint
        # leaves the checking of inputs to the signature.
        predict.__annotations__["model_input"] = pd.DataFrame

    return TextClassifierModel


def pinned_requirements() -> list[str]:
    """PIP_PACKAGES as name==installed version, without local labels (2.13.0+cpu -> 2.13.0), which no
    index but the one that built them serves."""
    return [f"{name}=={metadata.version(name).split('+')[0]}" for name in PIP_PACKAGES]


def log_pyfunc(model_dir: str | Path, name: str) -> str:
    """Log the classifier folder `model_dir` as a pyfunc model `name` into the active MLflow run, with
    the text column(s) -> label + probabilities signature; returns the model's URI (models:/...)."""
    import mlflow
    import pandas as pd
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    if mlflow.active_run() is None:
        raise UserError("log_pyfunc logs into the active MLflow run and there is none; "
                        "call it inside `with mlflow.start_run():`")
    model_dir = Path(model_dir).resolve()
    # checks the folder before anything is logged (fp32: nothing is predicted, no need to probe bf16)
    classifier = TextClassifier.load(model_dir, device="cpu", precision="fp32")
    example = {classifier.encoding.text_field: ["A short text to classify."]}
    if classifier.pairs:
        example[classifier.encoding.text_pair_field] = ["A second text."]
    signature = ModelSignature(
        inputs=Schema([ColSpec("string", field) for field in classifier.encoding.fields]),
        outputs=Schema([ColSpec("string", "label")] + [ColSpec("double", f"{PROBABILITY_PREFIX}{label}")
                                                      for label in classifier.label_names]))
    info = mlflow.pyfunc.log_model(
        name=name, python_model=pyfunc_model_class()(), artifacts={ARTIFACT: str(model_dir)},
        code_paths=[str(Path(__file__).resolve().parent)], signature=signature,
        input_example=pd.DataFrame(example), pip_requirements=pinned_requirements())
    return info.model_uri
