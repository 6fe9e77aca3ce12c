"""Zero-shot cross-lingual transfer (XLM): a task names its language and the task whose models score it
(`transfer_from`); the classifier reads every token as the task's language; finetune scores every run of
the source on the transfer task, distill leaves it out, and the report sets the languages side by side."""
import gzip
import json

import pytest
import torch

from lib.config.params import ImplConfig, ParamsError, load_params
from lib.evaluation.report import markdown
from lib.evaluation.result import TaskEvaluation
from lib.models.architectures import build_model
from lib.models.config import TransformerConfig
from lib.tasks import check_tasks
from lib.tasks.base import TaskData
from lib.tasks.classification import Example
from lib.tasks.model import HeadConfig, TaskModel, language_row
from lib.tasks.scoring import predict_all
from lib.training.variants import VARIANTS
from tests.helpers import write_params
from tests.test_pipeline import copy_reproduced, head, run


def load(tmp_path, params):
    return load_params(write_params(tmp_path / "params.yaml", params), [check_tasks])


def error_of(tmp_path, params) -> str:
    with pytest.raises(ParamsError) as info:
        load(tmp_path, params)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_a_transfer_task_takes_its_sources_metrics_and_is_not_distilled(chdir_root, tmp_path, default_params):
    default_params["finetune"]["tasks"] = ["stsb", "stsb_de"]
    params = load(tmp_path, default_params)
    assert params.tasks["stsb_de"].transfer_from == "stsb" and params.tasks["stsb_de"].language == "de"
    assert params.tasks["stsb_de"].metrics == params.tasks["stsb"].metrics == ["spearman", "pearson"]
    assert params.distill.tasks == ["stsb"]  # null: every finetuned task that trains


@pytest.mark.parametrize("change, message", [
    (lambda p: p["tasks"]["stsb_de"].update(transfer_from="stbs"),
     "tasks.stsb_de.transfer_from: 'stbs' is not a task in `tasks`; did you mean 'stsb'?"),
    (lambda p: p["tasks"]["stsb_de"].update(transfer_from="stsb_fr"),
     "tasks.stsb_de.transfer_from: 'stsb_fr' is a transfer task itself; name the task whose finetuned models"),
    (lambda p: p["tasks"]["stsb_de"].update(transfer_from="stsb_de"),
     "tasks.stsb_de.transfer_from: 'stsb_de' is this task itself"),
    (lambda p: p["finetune"].update(tasks=["sst2", "stsb_de"]),
     "finetune.tasks: has 'stsb_de' but not 'stsb', whose models it is scored with (tasks.stsb_de.transfer_from); "
     "add 'stsb'"),
    (lambda p: p["tasks"]["stsb_de"].update(metrics=["pearson"]),
     "tasks.stsb_de.metrics: ['pearson'], but a transfer task is reported in the metrics of tasks.stsb"),
    (lambda p: p["tasks"]["stsb_de"].update(transfer_from="sst2"),
     "tasks.stsb_de.type: regression, but its transfer_from task 'sst2' is classification"),
    (lambda p: p["tasks"].update(sst2_de={"source": "../sst2_de", "transfer_from": "sst2", "label_names": ["neg", "pos"]}),
     "tasks.sst2_de.label_names: ['neg', 'pos'] differ from tasks.sst2.label_names (['negative', 'positive'])"),
    (lambda p: (p["finetune"].update(tasks=["stsb", "stsb_de"]), p["distill"].update(tasks=["stsb", "stsb_de"])),
     "distill.tasks[1]: 'stsb_de' is a transfer task (tasks.stsb_de.transfer_from: stsb), which has no teacher"),
    (lambda p: p["tasks"]["stsb_de"].update(language=" "), "tasks.stsb_de.language: empty"),
])
def test_bad_transfer_params_fail_in_one_line_naming_the_key(chdir_root, tmp_path, default_params, change, message):
    change(default_params)
    assert message in error_of(tmp_path, default_params)


def test_a_transfer_task_needs_no_train_split(chdir_root, tmp_path, default_params):
    default_params["tasks"]["stsb_de"]["train_split"] = "test"  # never read: not a clash with eval_splits
    assert load(tmp_path, default_params).tasks["stsb_de"].eval_splits[0] == "test"


def classifier(**model) -> TaskModel:
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=2, d_ff=64, dropout=0.0, max_positions=32,
                            **model)
    return TaskModel(build_model(cfg), HeadConfig(2, "concat", hidden=16, dropout=0.0)).eval()


def toy(language: str | None) -> TaskData:
    examples = [Example([2, 9 + i, 10 + i, 3], [0] * 4, i % 2) for i in range(6)]
    return TaskData("toy", ["no", "yes"], [], [], examples, "test", {}, {}, language=language)


def outputs(model: TaskModel, language: str | None) -> torch.Tensor:
    read = lambda logits, part: logits.tolist()  # noqa: E731
    return torch.tensor(predict_all(model, toy(language), toy(language).eval, 4, 0, torch.device("cpu"),
                                    ImplConfig(precision="fp32", compile="off"), read=read))


def test_the_classifier_reads_every_token_as_the_tasks_language():
    """Scored as German, a backbone with [en, de] embeddings gives other outputs than as English (the
    first language, what a task without a language reads); a language it has no row for reads English's,
    and says so; a backbone without languages reads any task the same."""
    model = classifier(languages=["en", "de"])
    english, german = outputs(model, "en"), outputs(model, "de")
    assert not torch.allclose(english, german)
    assert torch.allclose(outputs(model, None), english)
    assert model.read_as("de") is None and model.language == 1
    note = model.read_as("ru")
    assert model.language == 0 and note.startswith("language_embedding: en (the text is ru")
    assert torch.allclose(outputs(model, "ru"), english)
    plain = classifier()
    assert plain.read_as("de") is None and plain.language is None
    assert torch.allclose(outputs(plain, "de"), outputs(plain, None))
    assert language_row(plain.backbone.cfg, "de") == (None, None)


def test_the_report_has_a_column_per_language_with_the_drop():
    split = {"examples": 4, "train_examples": 10, "full_train_examples": 10}

    def result(language, scores, source=None):
        return TaskEvaluation.from_json({"type": "regression", "metric": "spearman", "metrics": ["spearman"],
                                         "language": language, "splits": {"test": {**split, "scores": scores}},
                                         "efficiency": {}, **({"transfer_from": source} if source else {})})

    results = {"stsb": result("en", {"teacher": {"spearman": 0.8}, "plain": {"spearman": 0.7},
                                     "tfidf_similarity": {"spearman": 0.5}}),
               "stsb_de": result("de", {"plain": {"spearman": 0.4, "spearman_std": 0.1},
                                        "tfidf_similarity": {"spearman": 0.2}}, "stsb")}
    text = markdown(results, [], VARIANTS)
    assert "## Zero-shot cross-lingual transfer" in text and "### From stsb: spearman" in text
    assert "| model | stsb (en) | stsb_de (de) |" in text
    assert "| plain finetune | 70.0 | 40.0 ± 10.0 (-30.0) |" in text
    assert "| TF-IDF cosine (all 10 train) | 50.0 | 20.0 (-30.0) |" in text
    assert "teacher" not in text.split("### From stsb")[1].split("##")[0]  # not scored on the transfer task


def translated(rows: list[dict]) -> list[dict]:
    """STS-B rows in a made-up language: each word reversed (the gold scores unchanged)."""
    def words(text: str) -> str:
        return " ".join(word[::-1] for word in text.split())
    return [{"sentence1": words(r["sentence1"]), "sentence2": words(r["sentence2"]), "label": r["label"]} for r in rows]


def test_zero_shot_transfer_through_finetune_distill_and_evaluate(reproduced, tmp_path):
    """One `dvc exp run` selects stsb and two transfer tasks from local JSON Lines copies of its test split:
    German (stsb_multi_de of the tiny mirror) and a made-up language the model has no embedding for. The
    model gets language embeddings [en, de]. Finetune scores every variant and seed of stsb on both, in
    stsb's metrics; distill leaves them out; the report has the table of languages."""
    repo = copy_reproduced(reproduced, tmp_path)
    mirror = repo.parent / "shared" / "data"
    for name, rows in (("stsb_de", head(mirror / "stsb_multi_de" / "test.jsonl.gz", 40)),
                       ("stsb_xx", translated(head(mirror / "stsb" / "test.jsonl.gz", 40)))):
        (repo.parent / name).mkdir()
        with gzip.open(repo.parent / name / "test.jsonl.gz", "wt", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    pair = "type: regression, transfer_from: stsb, text_field: sentence1, text_pair_field: sentence2, max_len: 64"
    out = run(repo, "dvc", "exp", "run", "-S", "model.languages=[en,de]", "-S", "tasks.stsb.max_len=64",
              "-S", f"tasks.stsb_de={{source: ../stsb_de, language: de, eval_splits: [test], {pair}}}",
              "-S", f"+tasks.stsb_xx={{source: ../stsb_xx, language: xx, eval_splits: [test], {pair}}}",
              "-S", "finetune.tasks=[stsb,stsb_de,stsb_xx]", "-S", "finetune.variants=[plain,frozen]",
              "-S", "finetune.seeds=2", "-S", "finetune.max_train_examples=60", "-n", "xlm")
    assert all(f"Running stage '{stage}'" in out for stage in ("finetune", "distill", "evaluate"))
    assert "stsb_xx: language_embedding: en (the text is xx" in out
    finetune = json.loads((repo / "metrics/finetune.json").read_text())
    assert set(finetune) == {"stsb", "stsb_de", "stsb_xx"}
    for task, language in (("stsb_de", "de"), ("stsb_xx", "xx")):
        summary = finetune[task]
        assert summary["transfer_from"] == "stsb" and summary["eval_split"] == "test" and summary["eval_examples"] == 40
        assert summary["language"] == language and set(summary["variants"]) == {"plain", "frozen"}
        for variant in summary["variants"].values():
            assert set(variant["eval"]) == {"spearman", "pearson"} and len(variant["eval"]["spearman"]["seeds"]) == 2
    assert finetune["stsb_de"]["language_embedding"] == "de" and finetune["stsb_xx"]["language_embedding"] == "en"
    assert finetune["stsb"]["language_embedding"] == "en"
    # the same models on other texts: the scores differ from stsb's own
    assert finetune["stsb_xx"]["variants"]["plain"]["eval"] != finetune["stsb"]["variants"]["plain"]["eval"]
    assert not (repo / "models/finetune/stsb_de").exists()
    assert list(json.loads((repo / "metrics/distill.json").read_text())) == ["stsb"]
    evaluate = json.loads((repo / "metrics/evaluate.json").read_text())
    assert evaluate["stsb_de"]["transfer_from"] == "stsb"
    assert set(evaluate["stsb_de"]["splits"]["test"]["scores"]) >= {"plain", "frozen", "tfidf_similarity"}
    summary = (repo / "reports/summary.md").read_text()
    assert "### From stsb: spearman" in summary and "| model | stsb (en) | stsb_de (de) | stsb_xx (xx) |" in summary
