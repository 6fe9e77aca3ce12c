"""TaskModel folders in transformers' layout: where the backbone and head have an equivalent,
AutoModelForSequenceClassification and pipeline("text-classification") give TextClassifier's
probabilities, single texts and pairs; the rest is saved in lib's layout with the reason; both load
back into lib."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from lib.data.encoding import encode
from lib.data.tokenizer import load_tokenizer, saved_special_ids
from lib.serving.predict import TextClassifier
from lib.tasks.model import HEAD_FILE, HeadConfig, load_task_model, plain_head, save_task_model
from tests.helpers import TINY_LABELS, TINY_MAX_LEN, TINY_TEXTS, save_tiny_classifier, tiny_tokenizer

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()  # tensors a class does not use (the LM head) are expected

SHORT = [text for text in TINY_TEXTS if len(text.split()) <= 5]  # within TINY_MAX_LEN: the pipeline does not cut
# no empty second text: the pipeline reads {"text_pair": ""} as no pair (a falsy check), lib as an empty one
PAIRED = [text or "a dull plot" for text in reversed(SHORT)]
POST = {"norm": "post"}
# name: (TransformerConfig fields, transformers class)
SHAPES = {
    "bert": (POST, "BertForSequenceClassification"),
    "bert_pooler": ({**POST, "pooler": True}, "BertForSequenceClassification"),  # an imported BERT's pooler
    "roberta": ({**POST, "position_offset": 1, "max_positions": TINY_MAX_LEN + 1}, "RobertaForSequenceClassification"),
    "prelayernorm": ({}, "RobertaPreLayerNormForSequenceClassification"),
    "electra": ({**POST, "embedding_size": 16}, "ElectraForSequenceClassification"),
    "gpt2": ({"causal": True, "embedding_norm": False, "lm_head": "linear", "segment_vocab": 0},
             "GPT2ForSequenceClassification"),
    "esm": ({"position": "rope", "segment_vocab": 0}, "EsmForSequenceClassification"),
    # a German task of a model with languages: XLM without language ids reads German as the classifier does
    "xlm": ({**POST, "lm_head": "linear", "segment_vocab": 0, "d_ff": 128, "languages": ["en", "de"], "language": "de"},
            "XLMForSequenceClassification"),
}


def plain(cfg) -> HeadConfig:
    return plain_head(cfg, len(TINY_LABELS), dropout=0.0)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf_classifier")
    tok = tiny_tokenizer(root / "tok")
    made = {"tok": tok, "concat": save_tiny_classifier(root / "concat", tok, norm="post")}
    for name, (fields, _) in SHAPES.items():
        for pairs in (False, True):
            made[f"{name}{'_pair' * pairs}"] = save_tiny_classifier(root / f"{name}{'_pair' * pairs}", tok, pairs,
                                                                    head=plain, **fields)
    return made


def by_label(rows: list[list[dict]]) -> np.ndarray:
    """The pipeline's top_k=None output (each row sorted by score) as probabilities in TINY_LABELS order."""
    return np.array([[{r["label"]: r["score"] for r in row}[label] for label in TINY_LABELS] for row in rows])


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("pairs", [False, True], ids=["single", "pair"])
def test_transformers_gives_text_classifiers_probabilities(folders, name, pairs):
    folder = folders[f"{name}{'_pair' * pairs}"]
    seconds = PAIRED if pairs else None
    ids, _, cut = encode(load_tokenizer(folder), SHORT, seconds, TINY_MAX_LEN, "head_tail",
                         *(saved_special_ids(folder)[role] for role in ("bos", "eos")))
    assert cut == 0
    expected = TextClassifier.load(folder, device="cpu", precision="fp32").predict_proba(SHORT, seconds)
    assert np.ptp(expected, axis=0).max() > 0.1  # texts get different probabilities: a constant would not pass

    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder)
    assert type(model).__name__ == SHAPES[name][1] and model.config.id2label[2] == TINY_LABELS[2]
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    inputs = tokenizer(SHORT, seconds, padding=True, return_tensors="pt")
    assert [row[row != tokenizer.pad_token_id].tolist() for row in inputs["input_ids"]] == ids  # as lib encodes
    with torch.no_grad():
        logits = model(**inputs).logits
    np.testing.assert_allclose(torch.softmax(logits, -1).numpy(), expected, atol=1e-5)

    classify = transformers.pipeline("text-classification", model=str(folder), top_k=None, device="cpu")
    texts = [{"text": a, "text_pair": b} for a, b in zip(SHORT, PAIRED)] if pairs else SHORT
    np.testing.assert_allclose(by_label(classify(texts)), expected, atol=1e-5)
    np.testing.assert_allclose(by_label(classify(texts, batch_size=4)), expected, atol=1e-5)  # padded batches


@pytest.mark.parametrize("name", ["bert_pooler", "roberta", "gpt2"])
def test_the_backbone_still_loads_as_a_base_and_language_model(folders, name):
    folder = folders[name]
    lib_model, _ = load_task_model(folder)
    tokens = transformers.AutoTokenizer.from_pretrained(folder)(SHORT[:1], return_tensors="pt")
    segments = tokens.get("token_type_ids", torch.zeros_like(tokens["input_ids"]))
    with torch.no_grad():
        ours = lib_model.encode(tokens["input_ids"], segments, tokens["attention_mask"].bool())
        theirs = transformers.AutoModel.from_pretrained(folder)(**tokens).last_hidden_state
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)
    lm = (transformers.AutoModelForCausalLM if name == "gpt2" else transformers.AutoModelForMaskedLM)
    assert lm.from_pretrained(folder).config.vocab_size == lib_model.backbone.cfg.vocab_size


def test_the_head_is_in_model_safetensors_and_loads_back_into_lib(folders, tmp_path):
    folder = folders["bert_pooler"]
    info = json.loads((folder / "classifier.json").read_text())
    assert info["transformers"] == "transformers: BertForSequenceClassification" and not (folder / HEAD_FILE).exists()
    model, _ = load_task_model(folder)
    assert model.backbone.pooler is None and model.head_cfg.pooler == "tanh"  # the pooler is the head's
    line = save_task_model(model, tmp_path / "again", folder, {"label_names": TINY_LABELS})
    assert line == info["transformers"]
    again, _ = load_task_model(tmp_path / "again")
    for (key, value), (key_again, value_again) in zip(model.state_dict().items(), again.state_dict().items()):
        assert key == key_again and torch.equal(value, value_again), key


@pytest.mark.parametrize("name, head, reason", [
    ("concat", None, "lib layout only: ULMFiT's concat pooling has no transformers equivalent"),
    ("alibi", plain, "lib layout only: the backbone has no transformers equivalent (alibi positions)"),
    ("bias", lambda cfg: HeadConfig(len(TINY_LABELS), "token", block=False, dropout=0.0),
     "BertForSequenceClassification's head is dense + tanh + linear with bias; this head is not"),
])
def test_no_equivalent_saves_lib_layout_with_the_reason(folders, tmp_path, name, head, reason):
    folder = folders["concat"] if name == "concat" else save_tiny_classifier(
        tmp_path / name, folders["tok"], head=head, **({"position": "alibi"} if name == "alibi" else POST))
    assert reason in json.loads((folder / "classifier.json").read_text())["transformers"]
    assert (folder / HEAD_FILE).is_file()
    model, _ = load_task_model(folder)
    TextClassifier.load(folder, device="cpu").predict_proba(SHORT)


def test_a_classifier_json_without_the_new_head_fields_loads(folders, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(folders["concat"], old)
    info = json.loads((old / "classifier.json").read_text())
    for key in ("pooler", "bias"):
        del info["head"][key]
    del info["transformers"]
    (old / "classifier.json").write_text(json.dumps(info))
    np.testing.assert_array_equal(TextClassifier.load(old, device="cpu").predict_proba(SHORT),
                                  TextClassifier.load(folders["concat"], device="cpu").predict_proba(SHORT))


def test_the_pipeline_cuts_long_texts_at_max_len_from_the_end(folders):
    """Not head_tail as lib may: a long text gets other probabilities, but it gets some."""
    long = max(TINY_TEXTS, key=len)
    classify = transformers.pipeline("text-classification", model=str(folders["bert"]), top_k=None, device="cpu")
    assert classify.tokenizer.model_max_length == TINY_MAX_LEN
    assert by_label(classify([long], truncation=True)).sum() == pytest.approx(1, abs=1e-5)


# task type: (transformers auto class, our outputs -> theirs to compare)
TYPE_EXPORTS = {
    "regression": "AutoModelForSequenceClassification",
    "multiple_choice": "AutoModelForMultipleChoice",
    "tagging": "AutoModelForTokenClassification",
    "span_qa": "AutoModelForQuestionAnswering",
}
TYPE_META = {"regression": {"info": {"mean": 2.5, "std": 1.5}}, "multiple_choice": {"info": {"n_choices": 3}},
             "tagging": {"label_names": ["O", "B-PER", "I-PER"]}, "span_qa": {"info": {}}}


@pytest.mark.parametrize("task_type, shape", [(t, "bert") for t in TYPE_EXPORTS] + [
    ("tagging", "gpt2"), ("span_qa", "gpt2"), ("multiple_choice", "roberta"), ("regression", "electra"),
    ("tagging", "esm"), ("regression", "esm"), ("tagging", "xlm"), ("span_qa", "xlm"), ("regression", "xlm")])
def test_each_task_type_exports_as_its_transformers_model(folders, tmp_path, task_type, shape):
    """The plain head of each type (lib/training/variants/plain.py) on a BERT/GPT-2/RoBERTa/ELECTRA shape: transformers'
    model for the type gives our outputs (a regression model the score in label units), and the folder
    loads back into lib with the same weights."""
    from lib.training.variants import VARIANTS
    from lib.models.architectures import build_model
    from lib.models.config import TransformerConfig
    from lib.config.params import FinetuneConfig
    from lib.tasks.base import TaskData
    from lib.tasks import TYPES

    fields = dict(SHAPES[shape][0])
    language = fields.pop("language", None)
    torch.manual_seed(0)
    cfg = TransformerConfig(**{"vocab_size": load_tokenizer(folders["tok"]).get_vocab_size(), "d_model": 32,
                               "n_layers": 2, "n_heads": 2, "d_ff": 64, "dropout": 0.0,
                               "max_positions": TINY_MAX_LEN, **fields})
    meta = {"type": task_type, "label_names": [], "language": language, **TYPE_META[task_type]}
    task = TaskData("toy", meta["label_names"], [], [], None, "", {}, {}, type=task_type, info=meta.get("info", {}))
    kind = TYPES[task_type]
    model = VARIANTS["plain"].setup(build_model(cfg), kind.n_outputs(task), FinetuneConfig(tasks=[], head_dropout=0.0),
                                    kind).model.eval()
    for weight in (p for p in model.parameters() if p.dim() > 1):
        torch.nn.init.normal_(weight, std=0.3)
    model.read_as(language)
    line = save_task_model(model, tmp_path / "model", folders["tok"], meta)
    assert line.startswith("transformers: ") and task_type != "classification"
    theirs = getattr(transformers, TYPE_EXPORTS[task_type]).from_pretrained(tmp_path / "model").eval()
    assert type(theirs).__name__ == line.removeprefix("transformers: ")

    special = saved_special_ids(folders["tok"])
    ids = torch.randint(len(special), cfg.vocab_size, (2, 3, 10) if task_type == "multiple_choice" else (2, 10))
    mask = torch.ones_like(ids, dtype=torch.bool)
    batch = {"input_ids": ids, "segment_ids": torch.zeros_like(ids), "attention_mask": mask}
    with torch.no_grad():
        ours, _ = kind.forward(model, batch)
        out = theirs(input_ids=ids, attention_mask=mask.long())
    if task_type == "regression":
        torch.testing.assert_close(out.logits[:, 0], torch.tensor(kind.predict(ours, [], task)), atol=1e-4, rtol=1e-4)
    elif task_type == "span_qa":
        torch.testing.assert_close(torch.stack([out.start_logits, out.end_logits], -1), ours, atol=1e-4, rtol=1e-4)
    else:
        torch.testing.assert_close(out.logits, ours, atol=1e-4, rtol=1e-4)

    loaded, info = load_task_model(tmp_path / "model")  # the embedding rows past the vocabulary are ours alone
    assert info["type"] == task_type
    for (key, value), (key_again, value_again) in zip(model.head.state_dict().items(), loaded.head.state_dict().items()):
        assert key == key_again
        torch.testing.assert_close(value, value_again, atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(kind.forward(loaded, batch)[0], ours, atol=1e-5, rtol=1e-5)


def test_a_ulmfit_block_of_a_new_type_saves_lib_layout_with_the_reason(folders, tmp_path):
    from lib.tasks.model import TaskModel
    from lib.models.architectures import build_model
    from lib.models.config import TransformerConfig
    cfg = TransformerConfig(vocab_size=load_tokenizer(folders["tok"]).get_vocab_size(), d_model=32, n_layers=1,
                            n_heads=2, d_ff=64, max_positions=TINY_MAX_LEN, norm="post")
    model = TaskModel(build_model(cfg), HeadConfig(3, "tokens", block=True, hidden=16))
    line = save_task_model(model, tmp_path / "m", folders["tok"], {"type": "tagging", "label_names": ["O", "B-X", "I-X"]})
    assert line == "lib layout only: ULMFiT's classifier block has no transformers equivalent"
    assert load_task_model(tmp_path / "m")[0].head_cfg.features == "tokens"


def test_a_type_that_is_not_exported_saves_lib_layout_with_the_reason(folders, tmp_path, monkeypatch):
    """A head transformers has (BERT's plain one) of a type without the Exported capability (a fake type,
    registered for this test only) is saved in lib's layout, and reads back through the type."""
    from lib import tasks
    from lib.tasks.base import TaskType

    class Unexported(TaskType):
        name = "fake"

    monkeypatch.setitem(tasks.TYPES, Unexported.name, Unexported())
    model, _ = load_task_model(folders["bert"])
    line = save_task_model(model, tmp_path / "m", folders["tok"], {"type": Unexported.name, "label_names": TINY_LABELS})
    assert line == "lib layout only: transformers has no task model for a fake task"
    assert (tmp_path / "m" / HEAD_FILE).is_file()
    assert json.loads((tmp_path / "m" / "classifier.json").read_text())["transformers"] == line
    loaded, _ = load_task_model(tmp_path / "m")
    ids = torch.tensor([[1, 5, 6, 2]])
    inputs = (ids, torch.zeros_like(ids), ids > 0)
    with torch.no_grad():
        torch.testing.assert_close(loaded(*inputs)[0], model(*inputs)[0])
