"""Model cards: every part the hub and a reader look for, for a classifier finetuned from scratch and for a
chain started from a published model; the folders still load in transformers and in lib; and every
model folder of the tiny `dvc repro` carries its card, with the scores the stages measured."""
import json
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard

from lib.config.params import load_params
from lib.core import tracking
from lib.data.tokenizer import saved_special_ids
from lib.models.folder import load_model, model_folder
from lib.objectives import build_objective
from lib.serving.model_card import CARD_FILE, write_model_card
from lib.serving.predict import TextClassifier
from lib.tasks import saved_type
from lib.tasks.model import card_facts, load_task_model, plain_head, write_task_model
from lib.training.lm import save_model_folder
from tests.helpers import (ROOT, TINY_LABELS, TINY_MAX_LEN, TINY_TEXTS, save_tiny_classifier, tiny_tokenizer,
                           write_params)

SECTIONS = ["Model", "Training", "Evaluation", "How to use", "Intended use and limits", "Provenance"]
IMDB = "stanfordnlp/imdb"
IMDB_REVISION = "e6281661ce1c48d982bc483cf8a173c1bbeb5d31"
CHECKPOINT = "sentence-transformers/all-MiniLM-L6-v2"


def read_card(folder: Path) -> tuple[dict, str, dict[str, str]]:
    """(front matter, title and summary, markdown section title -> its text) of the folder's card."""
    text = (folder / CARD_FILE).read_text(encoding="utf-8")
    _, front, body = text.split("---\n", 2)
    head, *parts = body.split("\n## ")
    return yaml.safe_load(front), head.strip(), {p.split("\n", 1)[0]: p.split("\n", 1)[1].strip() for p in parts}


def training_stages(section: str) -> list[str]:
    return [line.split(" | ")[0].strip("| ") for line in section.splitlines()[2:]]


def classifier_meta(variant: str, task: str = "imdb") -> dict:
    """classifier.json's entries as finetune keeps them, with the scores it measured."""
    return {"task": task, "type": "classification", "info": {}, "label_names": TINY_LABELS, "variant": variant,
            "seed": 1337, "dev": {"accuracy": 0.625}, "eval_split": "test", "eval": {"accuracy": 0.5875},
            "encoding": {"max_len": TINY_MAX_LEN, "truncation": "head_tail", "text_field": "text",
                         "text_pair_field": None}}


def keep_finetuned(model, out: Path, tokenizer_dir: Path, params, meta: dict, upstream: Path | None) -> None:
    """What lib.training.finetune_runs does with a task's best model: folder and card in one atomic write."""
    with model_folder(out, tokenizer_dir) as tmp:
        line = write_task_model(model, tmp, meta)
        write_model_card(tmp, "finetune", params, {**meta, "transformers": line, **card_facts(saved_type(meta)), "params": 1234,
                                                   "best_epoch": 2, "examples": {"train": 90, "dev": 10, "eval": 40}},
                         upstream)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return tiny_tokenizer(tmp_path_factory.mktemp("card") / "tok")


def test_a_classifier_finetuned_from_scratch_has_a_full_card_and_still_loads(tokenizer, tmp_path):
    from transformers import AutoModelForSequenceClassification, pipeline

    params = load_params(ROOT / "params.yaml")
    source = save_tiny_classifier(tmp_path / "source", tokenizer, head=lambda cfg: plain_head(cfg, 3, 0.0),
                                  position="rope", segment_vocab=0)  # the default shape: an ESM
    model, _ = load_task_model(source)
    folder = tmp_path / "best"
    keep_finetuned(model, folder, tokenizer, params, classifier_meta("from_scratch"), upstream=None)
    written = (folder / CARD_FILE).read_bytes()

    front, head, sections = read_card(folder)
    assert front["license"] == "apache-2.0" and "base_model" not in front  # random weights: no base model
    assert front["library_name"] == "transformers" and front["pipeline_tag"] == "text-classification"
    assert front["datasets"] == [IMDB] and "transfer-pipeline" in front["tags"]
    [result] = front["model-index"][0]["results"]
    assert result["dataset"] == {"name": "imdb", "type": IMDB, "split": "test", "revision": IMDB_REVISION}
    assert result["metrics"] == [{"type": "accuracy", "value": 0.5875}]
    assert ModelCard(written.decode()).data.eval_results[0].metric_value == 0.5875  # as the hub's library reads it
    assert head.startswith("# imdb teacher (classification)")
    assert list(sections) == SECTIONS
    assert training_stages(sections["Training"]) == ["finetune"]
    assert "from random weights" in sections["Training"] and f"revision `{IMDB_REVISION}`" in sections["Training"]
    assert "| test | this model | 40 | 0.5875 |" in sections["Evaluation"]
    assert "| dev (hashed out of train) | this model | 10 | 0.6250 |" in sections["Evaluation"]
    assert "TextClassifier.load" in sections["How to use"] and "EsmForSequenceClassification" in sections["How to use"]
    assert "Not for production" in sections["Intended use and limits"]
    tags = tracking.run_tags("finetune", params)
    assert f"commit `{tags['git.commit'][:12]}`" in sections["Provenance"]
    assert f"`{tags['pipeline.key']}`" in sections["Provenance"]

    keep_finetuned(model, folder, tokenizer, params, classifier_meta("from_scratch"), upstream=None)
    assert (folder / CARD_FILE).read_bytes() == written  # no date: the same run writes the same card

    clf = TextClassifier.load(folder, device="cpu", precision="fp32")
    assert clf.predict(TINY_TEXTS) == TextClassifier.load(source, device="cpu", precision="fp32").predict(TINY_TEXTS)
    assert AutoModelForSequenceClassification.from_pretrained(folder).config.id2label == dict(enumerate(TINY_LABELS))
    classify = pipeline("text-classification", model=str(folder), top_k=None)
    assert {row["label"] for row in classify(["I loved it"])[0]} == set(TINY_LABELS)


def test_a_chain_from_a_published_model_carries_its_base_model_data_and_stages(tokenizer, tmp_path, default_params):
    from transformers import AutoModelForMaskedLM

    default_params.update(init=f"hf:{CHECKPOINT}", objective="mlm")
    default_params["finetune"]["tasks"] = ["sst2"]
    params = load_params(write_params(tmp_path / "params.yaml", default_params))
    objective = build_objective("mlm", params, 120, saved_special_ids(tokenizer))
    kept = {"init": params.init, "family": "bert", "kept": True, "steps": 0, "objective": "mlm",
            "params": objective.backbone().num_params(), "fresh": []}
    save_model_folder(objective, tokenizer, tmp_path / "pretrain", "pretrain", params, kept)
    adapted = {"before_val_loss": 4.5, "val_loss": 4.25, "objective": "mlm", "tokens_seen": 20480, "steps": 5,
               "params": objective.backbone().num_params()}
    save_model_folder(objective, tmp_path / "pretrain", tmp_path / "adapt", "adapt", params, adapted)

    front, head, sections = read_card(tmp_path / "pretrain")
    assert front["base_model"] == CHECKPOINT and "license" not in front and "datasets" not in front  # its own data
    assert front["library_name"] == "transformers" and front["pipeline_tag"] == "fill-mask" and "mlm" in front["tags"]
    assert "model-index" not in front and list(sections) == SECTIONS
    assert f"took the published model `hf:{CHECKPOINT}`" in sections["Training"]
    front, head, sections = read_card(tmp_path / "adapt")
    assert front["base_model"] == CHECKPOINT and front["datasets"] == [IMDB]
    assert training_stages(sections["Training"]) == ["pretrain", "adapt"]
    assert "| validation (held out of train by hash), before adapting | 4.5000 |" in sections["Evaluation"]
    assert "20,480 tokens in 5 steps" in sections["Training"]
    assert AutoModelForMaskedLM.from_pretrained(tmp_path / "adapt").config.model_type == "esm"
    assert load_model(tmp_path / "adapt").cfg == objective.backbone().cfg

    # a ULMFiT head has no transformers equivalent: the folder is lib's, and its card says so
    model, _ = load_task_model(save_tiny_classifier(tmp_path / "source", tokenizer))
    keep_finetuned(model, tmp_path / "sst2", tokenizer, params, classifier_meta("ulmfit", "sst2"),
                   upstream=tmp_path / "adapt")
    front, head, sections = read_card(tmp_path / "sst2")
    assert front["base_model"] == CHECKPOINT and front["datasets"] == [IMDB, "nyu-mll/glue"]
    assert "library_name" not in front and "pipeline_tag" not in front and "model-index" not in front
    assert training_stages(sections["Training"]) == ["pretrain", "adapt", "finetune"]
    assert "`sst2`, revision `bcdcba79d07bc864c1c254ccfcedcce55bcc9a8c`" in sections["Training"]
    assert "lib layout only: ULMFiT's concat pooling" in sections["Model"]
    assert f"License: that of the published model it started from, [{CHECKPOINT}]" in sections["Intended use and limits"]
    assert "from transformers" not in sections["How to use"]
    assert TextClassifier.load(tmp_path / "sst2").predict(["I loved it"])[0] in TINY_LABELS

    # a local model folder is no hub model: no base_model, and still not the project's license
    default_params["init"] = "../shared/models/all-MiniLM-L6-v2"
    local = load_params(write_params(tmp_path / "local.yaml", default_params))
    save_model_folder(objective, tokenizer, tmp_path / "local", "pretrain", local, {**kept, "init": local.init})
    front, _, sections = read_card(tmp_path / "local")
    assert "base_model" not in front and "license" not in front
    assert "that of the published model it started from, `../shared/models/all-MiniLM-L6-v2`" in sections[
        "Intended use and limits"]


def test_every_model_folder_of_the_tiny_repro_carries_its_card(reproduced):
    base, _, _ = reproduced
    repo = base / "repo"
    stages = {"models/pretrain": ["pretrain"], "models/adapt": ["pretrain", "adapt"]}
    for kind, stage in (("finetune", "finetune"), ("distill", "distill")):
        for folder in sorted((repo / "models" / kind).iterdir()):
            info = json.loads((folder / "classifier.json").read_text())
            chain = ["finetune"] if info.get("variant") == "from_scratch" else ["pretrain", "adapt", "finetune"]
            if stage == "distill":
                teacher = json.loads((repo / "models/finetune" / folder.name / "classifier.json").read_text())
                chain = (["finetune"] if teacher["variant"] == "from_scratch" else chain) + ["distill"]
            stages[str(folder.relative_to(repo))] = chain
            front, _, sections = read_card(folder)
            assert f"| {info['eval_split']} | this model |" in sections["Evaluation"], folder
            main = next(iter(info["dev"]))
            assert f"{info['dev'][main]:.4f}" in sections["Evaluation"], folder
    metrics = json.loads((repo / "metrics/pretrain.json").read_text())
    assert f"{metrics['tokens_seen']:,} tokens" in read_card(repo / "models/pretrain")[2]["Training"]
    for folder, chain in stages.items():
        front, _, sections = read_card(repo / folder)
        assert list(sections) == SECTIONS and training_stages(sections["Training"]) == chain, folder
