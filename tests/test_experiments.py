"""Experiments as a user runs them (`dvc exp run -S ...`) on the tiny project of tests/test_pipeline.py after
its `dvc repro`: another objective, a published model, a new task, the shipped task types, a name DVC cannot
save. Apart from test_pipeline.py so that pytest-xdist runs the two modules side by side."""
import csv
import json
import os

import pytest
import yaml

from tests.helpers import ROOT
from tests.test_pipeline import copy_reproduced, head, run, run_failing, stage_runs


@pytest.fixture(scope="module")
def repo(reproduced, tmp_path_factory):
    """A copy of the session's reproduced tiny project, which the objective and init experiments change in
    turn (each is applied to the workspace)."""
    return copy_reproduced(reproduced, tmp_path_factory.mktemp("experiments"))


def test_objective_experiment_reruns_only_what_follows_the_tokenizer(repo):
    """ELECTRA through the whole chain after it, on a budget of FLOPs (written `1e9`, which DVC keeps as
    YAML 1.2 writes it); finetune trains one variant (which ones do not change what reruns: every stage
    after pretrain does)."""
    out = run(repo, "dvc", "exp", "run", "-S", "objective=electra", "-S", "pretrain.budget_flops=1e9",
              "-S", "finetune.variants=[plain]", "-n", "electra")
    assert "Running stage 'pretrain'" in out and "Running stage 'tokenizer'" not in out
    metrics = json.loads((repo / "metrics/pretrain.json").read_text())
    assert metrics["objective"] == "electra" and 0.5 < metrics["val_disc_accuracy"] <= 1.0
    step = 32 * 8
    bought = int(1e9 // metrics["flops_per_token"])
    assert metrics["budget_flops"] == 1e9 and metrics["tokens_seen"] == -(-bought // step) * step
    assert metrics["train_flops"] == metrics["tokens_seen"] * metrics["flops_per_token"]
    assert f"pretrain: budget_flops 1e+09 buys electra {bought:,} tokens" in out
    assert (repo / "models/pretrain/objective.safetensors").is_file()  # the generator, for adapt
    adapt = json.loads((repo / "metrics/adapt.json").read_text())
    assert adapt["objective"] == "electra" and "val_replaced_recall" in adapt and "before_val_disc_loss" in adapt
    runs = [r for r in stage_runs(repo) if r.data.tags.get("dvc.exp_name") == "electra"]
    assert [r.data.tags.get("stage") for r in runs if r.data.tags["pipeline.role"] == "stage"] == \
        ["pretrain", "adapt", "finetune", "distill", "evaluate"]  # the data stage had nothing to do: untracked
    assert {r.data.tags["pipeline.objective"] for r in runs} == {"electra"}
    evaluate = json.loads((repo / "metrics/evaluate.json").read_text())
    assert "zero_shot" not in evaluate["imdb"]["splits"]["test"]["scores"]  # a bidirectional LM has no prompt scores


def test_init_experiment_starts_from_a_published_model(repo):
    """`dvc exp run -S init=hf:<org>/<name>`, the mirror standing in for the hub: the published model's
    tokenizer and weights go through the whole chain, adapted with the objective that fits them.
    After the objective experiment: both change the workspace."""
    transformers = pytest.importorskip("transformers")
    published = repo.parent / "shared" / "models" / "tiny-bert"
    transformers.AutoTokenizer.from_pretrained(ROOT.parent / "shared" / "models" / "all-MiniLM-L6-v2").save_pretrained(
        published)
    transformers.BertModel(transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                   intermediate_size=64)).save_pretrained(published)
    out = run(repo, "dvc", "exp", "run", "-S", "init=hf:someone/tiny-bert", "-S", "objective=clm",
              "-S", "finetune.variants=[ulmfit,plain,from_scratch,frozen]", "-S", "finetune.tasks=[sst2]",
              "-S", "distill.tasks=[sst2]", "-n", "init")  # one task: every variant, each on the published model
    assert "Running stage 'clean'" not in out and "Running stage 'tokenizer'" in out
    assert "a bert with" in out and "no head.decoder, head.dense, head.norm in the published model: initialised fresh" in out
    assert "objective: clm does not fit a bert model; training it with mlm" in out
    tokenizer = json.loads((repo / "data/tokens/tokenizer/tokenizer_meta.json").read_text())
    assert tokenizer["algorithm"] == "wordpiece" and tokenizer["vocab_size"] == 30522 and tokenizer["lowercase"]
    assert tokenizer["special_tokens"]["bos"] == {"token": "[CLS]", "id": 101}
    pretrain = json.loads((repo / "metrics/pretrain.json").read_text())
    assert pretrain["kept"] and pretrain["family"] == "bert" and pretrain["objective"] == "mlm"
    adapt = json.loads((repo / "metrics/adapt.json").read_text())
    assert adapt["objective"] == "mlm" and adapt["val_loss"] < adapt["before_val_loss"]
    adapted = json.loads((repo / "models/adapt/config.json").read_text())  # a transformers BERT, ours inside
    ours = adapted["transfer_pipeline"]
    assert adapted["model_type"] == "bert" and adapted["architectures"] == ["BertForMaskedLM"]
    assert (ours["d_model"], ours["norm"], ours["norm_eps"], ours["pooler"]) == (32, "post", 1e-12, True)
    finetune = json.loads((repo / "metrics/finetune.json").read_text())
    assert set(finetune) == {"sst2"} and set(finetune["sst2"]["variants"]) == {"ulmfit", "plain", "from_scratch", "frozen"}
    assert set(json.loads((repo / "metrics/distill.json").read_text())) == {"sst2"}
    assert "teacher" in json.loads((repo / "metrics/evaluate.json").read_text())["sst2"]["splits"]["validation"]["scores"]
    assert "started from: the published model `hf:someone/tiny-bert` (bert), kept as it is; adapted to the domain " \
           "with mlm" in (repo / "reports/summary.md").read_text()


def test_a_new_task_is_one_experiment(reproduced, tmp_path):
    """A user's own 3-class task from a local folder of CSV files, added and selected by one `dvc exp run` whose flags
    name only the task (its source, fields, a length the tiny model takes and a train limit; one variant
    to keep the test short): clean
    decontaminates against its evaluation split and, finding nothing new, reruns nothing after it; the
    stages that read tasks train, distill and report the new task alone. Its own copy of the project: the
    experiment is applied to the workspace."""
    repo = copy_reproduced(reproduced, tmp_path)
    topics = ["art", "science", "sport"]
    rows = [{"body": r["text"], "topic": topics[len(r["text"]) % 3]}
            for r in head(repo.parent / "shared" / "data" / "sst2" / "train.jsonl.gz", 150)]
    (repo.parent / "news").mkdir()
    for split, part in (("train", rows[:110]), ("validation", rows[110:])):  # a header row, quoted commas
        with open(repo.parent / "news" / f"{split}.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=["body", "topic"])
            writer.writeheader()
            writer.writerows(part)
    out = run(repo, "dvc", "exp", "run", "-S", "+tasks.news={source: ../news, text_field: body, label_field: topic, max_len: 48}",
              "-S", "finetune.tasks=[news]", "-S", "+finetune.max_train_examples.news=60",
              "-S", "finetune.variants=[plain]", "-n", "news")
    assert "Running stage 'clean'" in out and "Running stage 'tokenizer'" not in out
    assert all(f"Running stage '{stage}'" in out for stage in ("finetune", "distill", "evaluate"))
    finetune = json.loads((repo / "metrics/finetune.json").read_text())
    assert list(finetune) == ["news"] and finetune["news"]["train_examples"] == 60  # dev is hashed out before the limit
    assert list(json.loads((repo / "metrics/distill.json").read_text())) == ["news"]  # distill.tasks: null
    evaluate = json.loads((repo / "metrics/evaluate.json").read_text())
    assert list(evaluate) == ["news"] and set(evaluate["news"]["splits"]["validation"]["scores"]) >= {"teacher", "student"}
    assert json.loads((repo / "models/finetune/news/classifier.json").read_text())["label_names"] == topics
    # a setting of the task reruns what reads tasks, not clean: it reads data/raw/eval_texts.json instead
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["tasks"]["news"]["max_len"] = 32
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    status = json.loads(run(repo, "dvc", "status", "--json"))
    assert {"finetune", "distill", "evaluate"} <= set(status) and "clean" not in status, status


def test_the_shipped_task_types_run_through_the_chain(reproduced, tmp_path):
    """One `dvc exp run` selects the shipped tagging, span QA (SQuAD 2.0), regression and multiple-choice
    tasks (small subsets, lengths the tiny model takes): finetune, distill and evaluate train, distil
    and report each with its type's metrics; teacher and student say their type."""
    repo = copy_reproduced(reproduced, tmp_path)
    tasks = ["conll2003", "squad_v2", "stsb", "codah"]
    flags = ["-S", f"finetune.tasks=[{','.join(tasks)}]", "-S", "finetune.variants=[plain]",
             "-S", "finetune.max_train_examples=40", "-S", "finetune.max_eval_examples=30",
             "-S", "tasks.conll2003.max_len=64", "-S", "tasks.stsb.max_len=64",
             "-S", "tasks.squad_v2.max_len=64", "-S", "tasks.squad_v2.stride=16", "-S", "tasks.squad_v2.max_question_len=16"]
    out = run(repo, "dvc", "exp", "run", *flags, "-n", "types")
    assert "Running stage 'clean'" not in out  # the shipped tasks were decontaminated against from the start
    finetune = json.loads((repo / "metrics/finetune.json").read_text())
    metrics = {"conll2003": {"f1", "precision", "recall"}, "squad_v2": {"f1", "exact_match"},
               "stsb": {"spearman", "pearson"}, "codah": {"accuracy"}}
    for task in tasks:
        assert set(finetune[task]["variants"]["plain"]["eval"]) == metrics[task], task
    distill = json.loads((repo / "metrics/distill.json").read_text())
    assert set(distill) == set(tasks)
    evaluate = json.loads((repo / "metrics/evaluate.json").read_text())
    assert set(evaluate) == set(tasks)
    assert set(evaluate["conll2003"]["splits"]["test"]["scores"]) >= {"teacher", "student", "plain", "lexicon"}
    assert "article split" in evaluate["squad_v2"]["data"]["label"]
    summary = (repo / "reports/summary.md").read_text()
    assert "split by article" in summary and "codah" in summary
    for stage in ("finetune", "distill"):
        info = json.loads((repo / f"models/{stage}/conll2003/classifier.json").read_text())
        assert info["type"] == "tagging" and info["label_names"][0] == "O" and info["transformers"], stage


def test_a_recipe_is_one_flag_and_its_keys_change_in_its_file(reproduced, tmp_path):
    """`-S recipe=<name>` runs the chain with the recipe's keys (here: another objective and a budget), the
    stages say what it changes, MLflow tags the runs with it; a key the recipe sets is changed in the recipe's
    file with `-S <file>:<key>=<value>`, and `-S <key>=<value>` on it is refused at once: the recipe's value
    would run while `dvc exp show` recorded the other. Stopped after pretrain (target `pretrain`)."""
    repo = copy_reproduced(reproduced, tmp_path)
    recipe = "lib/config/recipes/tiny-mlm.yaml"
    (repo / recipe).write_text("# a test's recipe\nobjective: mlm\npretrain: {budget_tokens: 5120}\n")
    run(repo, "git", "add", recipe)
    run(repo, "git", "commit", "-qm", "a recipe")
    refused = run_failing(repo, "dvc", "exp", "run", "pretrain", "-S", "recipe=tiny-mlm", "-S", "objective=electra")
    assert [line for line in refused.splitlines() if line.startswith("error:")] == [
        f"error: params.yaml: recipe: this run changes objective=electra (the recipe: mlm), which recipe tiny-mlm sets, "
        f"and a recipe's keys replace params.yaml's; change them in the recipe's file instead: dvc exp run "
        f"-S {recipe}:objective=electra"]
    assert "Running stage 'clean'" not in refused  # refused by the first stage, before any work
    run(repo, "git", "checkout", "--", "params.yaml")
    out = run(repo, "dvc", "exp", "run", "pretrain", "-S", "recipe=tiny-mlm", "-S", f"{recipe}:pretrain.budget_tokens=2560",
              "-n", "tiny-mlm")
    assert f"recipe tiny-mlm ({recipe}) sets over params.yaml: objective=mlm (not clm), pretrain.budget_tokens=2560 (not " in out
    assert "Running stage 'clean'" in out and "Running stage 'pretrain'" in out  # every stage reads the recipe
    metrics = json.loads((repo / "metrics/pretrain.json").read_text())
    assert metrics["objective"] == "mlm" and metrics["tokens_seen"] == 2560
    assert yaml.safe_load((repo / "params.yaml").read_text())["objective"] == "clm"  # params.yaml's, replaced
    runs = [r for r in stage_runs(repo) if r.data.tags.get("dvc.exp_name") == "tiny-mlm"]
    assert runs and {r.data.tags["pipeline.recipe"] for r in runs} == {"tiny-mlm"}


def test_a_name_dvc_cannot_save_is_refused_before_any_work(reproduced, tmp_path):
    """DVC saves an experiment, after its last stage, as a git ref written through the file `<name>.lock`: a
    name over the file system's limit less 5 bytes (250 on ext4) failed there, the work lost and MLflow's run
    FINISHED. The first stage refuses it at once, counted in bytes (here 126 characters of 2 bytes), so no run
    is tracked, no output changes and nothing is saved; a name at the limit is saved. Target `data` (which DVC
    always runs) and a param it reads: the only work the name could cost here."""
    repo = copy_reproduced(reproduced, tmp_path)
    limit = os.pathconf(repo, "PC_NAME_MAX") - len(".lock")
    too_long, at_limit = "é" * (limit // 2 + 1), "é" * (limit // 2) + "e" * (limit % 2)
    outputs = ["dvc.lock", "metrics/data.json", "data/raw/wikipedia_en/.source.json"]
    before = {path: (repo / path).read_bytes() for path in outputs}
    out = run_failing(repo, "dvc", "exp", "run", "data", "-S", "corpora.pretrain.max_docs=30", "-n", too_long)
    assert [line for line in out.splitlines() if line.startswith("error:")] == [
        f"error: experiment name '{too_long[:20]}...' is {2 * len(too_long)} bytes long in UTF-8 ({len(too_long)} "
        f"characters); DVC can save an experiment only under a name of at most {limit} bytes (its git ref is a "
        "file of that name); run it again with a shorter name: dvc exp run -n <name>"]
    assert {path: (repo / path).read_bytes() for path in outputs} == before
    assert not [r for r in stage_runs(repo) if r.data.tags.get("dvc.exp_name") == too_long]
    run(repo, "git", "checkout", "--", "params.yaml")
    run(repo, "dvc", "exp", "run", "data", "-n", at_limit)
    saved = run(repo, "git", "for-each-ref", "--format=%(refname)", "refs/exps/").split()
    assert [ref.rsplit("/", 1)[1] for ref in saved if ref.count("/") == 4] == [at_limit]


def test_an_encoder_decoder_objective_runs_the_chain_and_travels_as_a_t5(reproduced, tmp_path):
    """`dvc exp run -S objective=t5`: the same tokenizer (its sentinels are in every vocabulary), an
    encoder-decoder pretrained and adapted by span corruption and written as a T5 that transformers loads
    with our logits; its encoder finetuned on SST-2, distilled and scored, and the whole model finetuned
    to translate (a seq2seq task), distilled by word-level and then by sequence-level KD, and scored by BLEU
    from its generations, to the report."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from lib.models.folder import load_model

    repo = copy_reproduced(reproduced, tmp_path)
    out = run(repo, "dvc", "exp", "run", "-S", "objective=t5", "-S", "finetune.variants=[plain]",
              "-S", "finetune.tasks=[sst2,multi30k_en_de,sst2_t2t]", "-S", "distill.tasks=[sst2,multi30k_en_de]",
              "-S", "distill.decoder_layers=1", "-S", "tasks.multi30k_en_de.max_target_len=24", "-n", "t5")
    assert "Running stage 'pretrain'" in out and "Running stage 'tokenizer'" not in out
    for stage in ("pretrain", "adapt"):
        metrics = json.loads((repo / f"metrics/{stage}.json").read_text())
        assert metrics["objective"] == "t5" and metrics["val_loss"] > 0
        config = json.loads((repo / f"models/{stage}/config.json").read_text())
        assert config["architectures"] == ["T5ForConditionalGeneration"]
    theirs = transformers.AutoModelForSeq2SeqLM.from_pretrained(repo / "models/adapt").eval()
    ours = load_model(repo / "models/adapt")
    source, target = torch.randint(110, 300, (2, 12)), torch.randint(110, 300, (2, 5))
    with torch.no_grad():
        expected = theirs(input_ids=source, decoder_input_ids=target).logits
        assert torch.allclose(ours.lm_logits(ours(source, target)), expected, atol=1e-4)
    finetune = json.loads((repo / "metrics/finetune.json").read_text())
    assert set(finetune["sst2"]["variants"]) == {"plain"}
    assert set(finetune["multi30k_en_de"]["variants"]["plain"]["eval"]) == {"bleu", "chrf"}
    evaluated = json.loads((repo / "metrics/evaluate.json").read_text())
    assert "sst2" in evaluated
    test = evaluated["multi30k_en_de"]["splits"]["test"]
    assert test["signatures"]["teacher"]["bleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert test["decoding"]["teacher"] == {"num_beams": 4, "length_penalty": 1.0, "max_new_tokens": 24}
    assert set(test["scores"]) == {"teacher", "plain", "student", "copy_source"}
    distilled = json.loads((repo / "metrics/distill.json").read_text())["multi30k_en_de"]
    assert distilled["metric"] == "bleu" and distilled["teacher_blocks"] == [0, 2]  # 1 + 1 of the 2 + 2 layers
    assert distilled["layer_map"] == [3]  # the decoder's first, numbered after the encoder's two
    assert "teacher_targets" not in distilled["transfer"]
    student = json.loads((repo / "models/distill/multi30k_en_de/config.json").read_text())
    assert student["architectures"] == ["T5ForConditionalGeneration"] and student["num_decoder_layers"] == 1
    assert set(evaluated["sst2_t2t"]["splits"]["validation"]["scores"]["teacher"]) == {"exact_match"}
    report = (repo / "reports/summary.md").read_text()
    assert "| teacher (best finetuned) | test | 4 beams, length penalty 1 | 24 |" in report
    assert "| copying the source (a summary: its first 3 sentences) | " in report  # learns nothing: no count
    timed = evaluated["multi30k_en_de"]["efficiency"]["student"]["cpu"]
    written = timed["tokens_per_s"] / timed["throughput"]  # the tokens each timed source writes
    assert written == pytest.approx(round(written)) and written >= 1 and "tokens written/s" in report
    # the translator travels as a T5 too: transformers writes what ours writes
    from lib.models.generation import Decoding, generate
    folder = repo / "models/finetune/multi30k_en_de"
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["T5ForConditionalGeneration"]
    theirs = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = theirs.generate(input_ids=source, attention_mask=torch.ones_like(source), do_sample=False,
                                   num_beams=1, max_new_tokens=8)
    written = generate(load_model(folder), source, None, Decoding(max_new_tokens=8), eos=theirs.config.eos_token_id)
    assert [row[:len(w)] for row, w in zip(expected[:, 1:].tolist(), written)] == written
    # sequence-level KD: only the students' stages run again
    out = run(repo, "dvc", "exp", "run", "-S", "distill.tasks=[multi30k_en_de]", "-S", "distill.targets=teacher",
              "-n", "t5-seqkd")
    assert "Running stage 'distill'" in out and "Running stage 'finetune'" not in out
    distilled = json.loads((repo / "metrics/distill.json").read_text())["multi30k_en_de"]
    assert distilled["transfer"]["teacher_targets"] == distilled["transfer"]["labeled"]
    assert "student" in json.loads((repo / "metrics/evaluate.json").read_text())["multi30k_en_de"]["splits"]["test"][
        "scores"]
