"""params.yaml validation: every mistake stops at start with one line naming the key."""
import copy
import subprocess
import sys

import pytest

from lib.config import params as params_module
from lib.config.params import (ParamsError, flatten, load_params, read_recipe, recipe_keys, recipe_line,
                               recipe_names)
from lib.objectives import OBJECTIVES, check_objective
from lib.tasks import check_tasks, task_metrics
from lib.training.optim import check_optimizers
from lib.training.variants import check_variants
from tests.helpers import ROOT, write_params

# every registry check, as the stages together run them
CHECKS = [check_tasks, check_objective, check_variants, check_optimizers]


def load(tmp_path, params):
    return load_params(write_params(tmp_path / "params.yaml", params), CHECKS)


def error_of(tmp_path, params) -> str:
    with pytest.raises(ParamsError) as info:
        load(tmp_path, params)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_default_params_load(chdir_root):
    params = load_params("params.yaml", CHECKS)
    assert params.objective in ("clm", "mlm", "electra")
    assert params.corpora.pretrain.valid_split == "validation"
    assert set(params.tasks) == {"imdb", "sst2", "cola", "mrpc", "rte", "conll2003", "squad", "squad_v2", "stsb", "codah",
                                 "stsb_de", "stsb_fr", "stsb_ru", "xquad_en", "xquad_de", "xquad_ru", "multi30k_en_de",
                                 "squad_gen", "sst2_t2t", "samsum"}
    assert {name: task.type for name, task in params.tasks.items() if task.type is not None} == {
        "conll2003": "tagging", "squad": "span_qa", "squad_v2": "span_qa", "stsb": "regression",
        "codah": "multiple_choice", "stsb_de": "regression", "stsb_fr": "regression", "stsb_ru": "regression",
        "xquad_en": "span_qa", "xquad_de": "span_qa", "xquad_ru": "span_qa", "multi30k_en_de": "seq2seq",
        "squad_gen": "seq2seq", "sst2_t2t": "seq2seq", "samsum": "seq2seq"}
    assert {name: task.transfer_from for name, task in params.tasks.items() if task.transfer_from} == {
        "stsb_de": "stsb", "stsb_fr": "stsb", "stsb_ru": "stsb", "xquad_en": "squad", "xquad_de": "squad",
        "xquad_ru": "squad"}
    assert params.tasks["mrpc"].text_pair_field == "text_b"


def test_unknown_key_suggests_closest(chdir_root, tmp_path, default_params):
    default_params["clean"]["min_char"] = 10
    assert "clean.min_char: unknown key; did you mean 'clean.min_chars'?" in error_of(tmp_path, default_params)


def test_unknown_top_level_key(chdir_root, tmp_path, default_params):
    default_params["tokeniser"] = {}
    assert "tokeniser: unknown key; did you mean 'tokenizer'?" in error_of(tmp_path, default_params)


def test_wrong_type_names_key(chdir_root, tmp_path, default_params):
    default_params["tokenizer"]["vocab_size"] = "big"
    assert "tokenizer.vocab_size: expected an integer, got str 'big'" in error_of(tmp_path, default_params)


def test_bool_is_not_an_int(chdir_root, tmp_path, default_params):
    default_params["clean"]["min_chars"] = True
    assert "clean.min_chars: expected an integer" in error_of(tmp_path, default_params)


def test_bad_choice_suggests(chdir_root, tmp_path, default_params):
    default_params["objective"] = "electr"
    expected = f"objective: 'electr' is not one of {', '.join(OBJECTIVES)}; did you mean 'electra'?"
    assert expected in error_of(tmp_path, default_params)


def test_vocab_too_small_for_specials(chdir_root, tmp_path, default_params):
    default_params["tokenizer"]["vocab_size"] = 100
    message = error_of(tmp_path, default_params)
    assert "tokenizer.vocab_size: 100 is too small for bpe (needs >= 361: 105 special and sentinel tokens" in message


def test_seq_len_above_max_positions(chdir_root, tmp_path, default_params):
    default_params["pretrain"]["seq_len"] = 1024
    default_params["model"]["max_positions"] = 512
    assert "pretrain.seq_len: 1024 is above model.max_positions (512)" in error_of(tmp_path, default_params)


def test_heads_must_divide_width(chdir_root, tmp_path, default_params):
    default_params["model"]["n_heads"] = 5
    default_params["model"]["d_model"] = 256
    assert "model.n_heads: 5 must divide model.d_model (256)" in error_of(tmp_path, default_params)


def test_masking_shares_must_fit(chdir_root, tmp_path, default_params):
    default_params["mlm"]["random_token"] = 0.5
    assert "mlm.mask_token + mlm.random_token" in error_of(tmp_path, default_params)


def test_budget_below_one_step(chdir_root, tmp_path, default_params):
    default_params["pretrain"]["budget_tokens"] = 100
    assert "pretrain.budget_tokens: 100 is less than one step" in error_of(tmp_path, default_params)


def test_duplicate_special_tokens(chdir_root, tmp_path, default_params):
    default_params["tokenizer"]["special_tokens"]["mask"] = "[PAD]"
    assert "tokenizer.special_tokens: special tokens must be distinct" in error_of(tmp_path, default_params)


def test_sources_are_not_read_when_params_load(chdir_root, tmp_path, default_params):
    """Only the data stage reads sources (and says in one line what is wrong with one): a stage that
    runs in a queued experiment's temporary copy must not stop on a path it never reads."""
    default_params["tasks"]["sst2"]["source"] = "../shared/data/sst3"
    default_params["corpora"]["pretrain"]["source"] = "hf:wikitext/wikitext-103-raw-v1"
    params = load(tmp_path, default_params)
    assert params.tasks["sst2"].source == "../shared/data/sst3" and params.corpora.pretrain.source.startswith("hf:")


def test_empty_source(chdir_root, tmp_path, default_params):
    default_params["tasks"]["sst2"]["source"] = " "
    assert "tasks.sst2.source: empty; name a local file or folder" in error_of(tmp_path, default_params)


def test_empty_hub_name(chdir_root, tmp_path, default_params):
    default_params["corpora"]["pretrain"]["source"] = "hf:"
    assert "corpora.pretrain.source: 'hf:' names no dataset" in error_of(tmp_path, default_params)


def test_missing_required_section(chdir_root, tmp_path, default_params):
    del default_params["corpora"]["domain"]
    assert "corpora.domain: required key is missing" in error_of(tmp_path, default_params)


def test_impossible_values(chdir_root, tmp_path, default_params):
    default_params["clean"]["near_dedup"]["bands"] = 7
    assert "clean.near_dedup.bands: 7 must divide clean.near_dedup.num_perm (128)" in error_of(tmp_path, default_params)
    default_params["clean"]["near_dedup"]["bands"] = 16
    default_params["corpora"]["pretrain"]["splits"] = ["train", "validation"]
    assert "corpora.pretrain.valid_split: 'validation' is also in corpora.pretrain.splits" in error_of(tmp_path, default_params)


def test_finetune_task_must_be_a_task(chdir_root, tmp_path, default_params):
    default_params["finetune"]["tasks"] = ["imdb", "sst"]
    assert "finetune.tasks[1]: 'sst' is not a task in `tasks`; did you mean 'sst2'?" in error_of(tmp_path, default_params)


@pytest.mark.parametrize("section, key, value, message", [
    ("finetune", "variants", ["ulmfit", "ulmfit"], "finetune.variants: ['ulmfit', 'ulmfit'] must be a non-empty list"),
    ("finetune", "variants", ["ulmfit", "fancy"], "finetune.variants[1]: 'fancy' is not one of"),
    ("finetune", "variants", ["ulmfit", "plian"], "finetune.variants[1]: 'plian' is not one of elmo, from_scratch, "
                                                  "frozen, plain, ulmfit; did you mean 'plain'?"),
    ("finetune", "ulmfit.lr_decay", 0.5, "finetune.ulmfit.lr_decay: 0.5 must be >= 1"),
    ("finetune", "ulmfit.lrr", 0.5, "finetune.ulmfit.lrr: unknown key; did you mean 'finetune.ulmfit.lr'?"),
    ("finetune", "plain.lr", 0, "finetune.plain.lr: 0.0 must be > 0"),
    ("finetune", "from_scratch.warmup_frac", 1.0, "finetune.from_scratch.warmup_frac: 1.0 must be in [0, 1)"),
    ("finetune", "elmo.mix", "yes", "finetune.elmo.mix: expected true or false, got str 'yes'"),
    ("finetune", "frozen.probe_c", [], "finetune.frozen.probe_c: [] must be a non-empty list of positive numbers"),
    ("finetune", "optimizer", "adam", "finetune.optimizer: 'adam' is not one of adamw; did you mean 'adamw'?"),
    ("distill", "optimizer", "sgd", "distill.optimizer: 'sgd' is not one of adamw"),
    ("adapt", "cut_frac", 1.5, "adapt.cut_frac/stlr_ratio: need 0 < cut_frac < 1"),
    ("adapt", "schedule", "stlr2", "adapt.schedule: 'stlr2' is not one of linear, cosine, stlr"),
    ("finetune", "aux_lm_weight", 0.5, None),  # fine with the default objective, clm
])
def test_ulmfit_params(chdir_root, tmp_path, default_params, section, key, value, message):
    *parents, name = key.split(".")
    target = default_params[section]
    for parent in parents:
        target = target[parent]
    target[name] = value
    if message is None:
        load(tmp_path, default_params)
        default_params["objective"] = "mlm"
        message = "finetune.aux_lm_weight: the auxiliary LM loss needs a causal model"
    assert message in error_of(tmp_path, default_params)


@pytest.mark.parametrize("section, key, value, message", [
    ("finetune", "max_train_examples", {"imdb": 0}, "finetune.max_train_examples.imdb: 0 must be >= 1"),
    ("finetune", "max_train_examples", {"imbd": 10},
     "finetune.max_train_examples.imbd: 'imbd' is not a task in `tasks`; did you mean 'imdb'?"),
    ("finetune", "max_train_examples", "many", "finetune.max_train_examples: expected"),
    ("finetune", "max_eval_examples", {"sst2": 0}, "finetune.max_eval_examples.sst2: 0 must be >= 1"),
    ("finetune", "max_eval_examples", {"ssst2": 10},
     "finetune.max_eval_examples.ssst2: 'ssst2' is not a task in `tasks`; did you mean 'sst2'?"),
    ("distill", "tasks", ["imdb", "cola"], "distill.tasks[1]: 'cola' is not in finetune.tasks"),
    ("distill", "unlabeled", {"sst2": "unsup", "mrcp": "x"}, "distill.unlabeled.mrcp: 'mrcp' is not a task in `tasks`"),
    ("distill", "width", 0.5, "distill.init: a narrower student (width 0.5) cannot copy teacher blocks"),
    ("distill", "layer_map", [1, 2, 3], "distill.layer_map: 3 entries for 2 student layers"),
    ("distill", "pkd_weight", -1.0, "must be >= 0 and not all 0"),
    ("distill", "decoder_layers", 0, "distill.decoder_layers: 0 must be >= 1 (or null: as many as layers)"),
    ("distill", "top_k", 0, "distill.top_k: 0 must be >= 1"),
    ("distill", "targets", "beam", "distill.targets"),
    ("evaluate", "zero_shot", {"imdb": {"template": "It was", "label_words": [" bad", " good"]}},
     "evaluate.zero_shot.imdb.template: 'It was' has no {text} placeholder"),
    ("evaluate", "zero_shot", {"imdb": {"template": "{text} It was", "label_words": [" bad"]}},
     "evaluate.zero_shot.imdb.label_words: need a non-blank word per label"),
    ("evaluate", "zero_shot", {"imdb": {"template": "{text} It was", "label_words": [" a", " b", " c"]}},
     "evaluate.zero_shot.imdb.label_words: 3 words for 2 labels"),
    ("evaluate", "tfidf_c", [], "evaluate.tfidf_c: [] must be a non-empty list of positive numbers"),
    ("mlm", "sentence", "sop", "mlm.sentence: sop needs objective: mlm and model.segment_vocab >= 2 (they are clm"),
    ("mlm", "sentence", "nsp2", "mlm.sentence: 'nsp2' is not one of none, sop, nsp; did you mean 'nsp'?"),
    ("impl", "threads", -1, "impl.threads: -1 must be >= 0"),
])
def test_distill_and_evaluate_params(chdir_root, tmp_path, default_params, section, key, value, message):
    default_params[section][key] = value
    assert message in error_of(tmp_path, default_params)


def test_per_task_limits(chdir_root, tmp_path, default_params):
    default_params["finetune"]["max_train_examples"] = {"sst2": 20000}
    default_params["finetune"]["max_eval_examples"] = {"imdb": 500}
    finetune = load(tmp_path, default_params).finetune
    assert finetune.train_limit("sst2") == 20000 and finetune.train_limit("imdb") is None
    assert finetune.eval_limit("imdb") == 500 and finetune.eval_limit("sst2") is None
    default_params["finetune"]["max_eval_examples"] = 300  # one number: every task
    assert load(tmp_path, default_params).finetune.eval_limit("sst2") == 300


def test_task_fields(chdir_root, tmp_path, default_params):
    default_params["tasks"]["mrpc"]["metrics"] = ["f2"]
    assert "tasks.mrpc.metrics: 'f2' is not a classification metric; use accuracy, f1, mcc" in error_of(
        tmp_path, default_params)
    default_params["tasks"]["mrpc"]["metrics"] = ["spearman"]  # a regression metric
    assert "tasks.mrpc.metrics: 'spearman' is not a classification metric" in error_of(tmp_path, default_params)
    default_params["tasks"]["mrpc"].update(type="regression", label_names=["a", "b"])
    assert "tasks.mrpc.label_names: a regression task has no label names" in error_of(tmp_path, default_params)
    default_params["tasks"]["mrpc"].update(type="span_qa", label_names=None, text_pair_field=None, metrics=None)
    assert "tasks.mrpc.text_pair_field: a span_qa task needs the field of its context" in error_of(
        tmp_path, default_params)
    default_params["tasks"]["mrpc"].update(type="tagging", metrics=None)
    assert task_metrics(load(tmp_path, default_params).tasks["mrpc"]) == ["f1"]  # the type's default
    default_params["finetune"]["tasks"] = ["mrpc"]
    default_params["finetune"]["aux_lm_weight"] = 0.5
    assert "finetune.aux_lm_weight: the auxiliary LM loss is not for tagging tasks, and finetune.tasks has mrpc" \
           in error_of(tmp_path, default_params)
    default_params["finetune"].update(tasks=["imdb", "sst2"], aux_lm_weight=0.0)
    default_params["tasks"]["mrpc"].update(type="classification")
    default_params["tasks"]["mrpc"]["metrics"] = ["f1"]
    default_params["tasks"]["sst2"]["max_len"] = 1024  # checked for the tasks that finetune trains
    assert "tasks.sst2.max_len: 1024 is above model.max_positions (512)" in error_of(tmp_path, default_params)


def test_a_task_distill_trains_needs_a_distilled_type(chdir_root, tmp_path, default_params, monkeypatch):
    """A type without the Distilled capability (here a fake one, registered for this test only) has no soft loss:
    a distill.tasks entry of it fails at the start, naming the entry."""
    from lib import tasks
    from lib.tasks.base import TaskType

    class Undistilled(TaskType):
        name = "fake"
        metrics = default_metrics = ("accuracy",)

    monkeypatch.setitem(tasks.TYPES, Undistilled.name, Undistilled())
    default_params["tasks"]["mrpc"].update(type=Undistilled.name, label_names=None, metrics=None)
    default_params["finetune"]["tasks"] = ["sst2", "mrpc"]
    default_params["distill"]["tasks"] = ["sst2", "mrpc"]
    assert "distill.tasks[1]: 'mrpc' is a fake task, which has no distillation; list distill.tasks without it" \
           in error_of(tmp_path, default_params)
    default_params["distill"]["tasks"] = ["sst2"]
    load(tmp_path, default_params)


@pytest.mark.parametrize("name", ["../../x", "a/b", ".hidden", "x..y", "", "-rf", "two\nlines"])
def test_task_names_cannot_leave_their_folders(chdir_root, tmp_path, default_params, name):
    default_params["tasks"][name] = default_params["tasks"].pop("rte")
    message = error_of(tmp_path, default_params)  # one line, even for a name with a line break
    assert f"tasks.{repr(name)[1:-1]}: not a usable task name" in message


def test_task_names_may_have_dots_dashes_and_digits(chdir_root, tmp_path, default_params):
    default_params["tasks"]["glue.rte-v2_1"] = default_params["tasks"].pop("rte")
    assert "glue.rte-v2_1" in load(tmp_path, default_params).tasks


def test_yaml_syntax_error_names_line(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("seed: 1\nclean: {min_chars: 3\n")
    with pytest.raises(ParamsError, match=r"params.yaml: line \d+: not valid YAML"):
        load_params(path)


@pytest.mark.parametrize("text, message", [
    ("seed: 1\nfinetune:\n  seeds: 3\n  epochs: 2\n  seeds: 5\n",
     "line 5: finetune.seeds is set twice (lines 3 and 5); keep one"),
    ("seed: 1\nobjective: mlm\nseed: 2\n", "line 3: seed is set twice (lines 1 and 3); keep one"),
], ids=["nested", "top-level"])
def test_a_key_set_twice_is_refused_as_dvc_refuses_it(tmp_path, monkeypatch, text, message):
    """PyYAML alone keeps the last value; DVC refuses the file. So does load_params, in params.yaml and in
    a recipe (the same loader), naming the file, the line and the dotted key."""
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(ParamsError) as info:
        load_params(path)
    assert str(info.value) == f"{path} {message}"
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "mine.yaml").write_text(text)
    monkeypatch.setattr(params_module, "RECIPES", recipes)
    with pytest.raises(ParamsError) as info:
        read_recipe("mine")
    assert str(info.value) == f"{recipes / 'mine.yaml'} {message}"


def test_a_merge_key_may_set_a_key_again(tmp_path, monkeypatch):
    """`<<` merges an anchored mapping whose keys the mapping then overrides: YAML's way, as DVC reads it too."""
    (tmp_path / "mine.yaml").write_text("pretrain: &p {lr: 0.001, warmup_steps: 5}\nadapt:\n  <<: *p\n  lr: 0.0005\n")
    monkeypatch.setattr(params_module, "RECIPES", tmp_path)
    assert read_recipe("mine")[0]["adapt"] == {"lr": 0.0005, "warmup_steps": 5}


def test_a_stage_run_by_hand_refuses_a_key_set_twice(tmp_path):
    """`python -m stages.data --params ...`, as docs/pipeline.md shows: one `error:` line, exit code 2, nothing
    written."""
    path = tmp_path / "params.yaml"
    path.write_text("finetune:\n  seeds: 1\n  epochs: 2\n  seeds: 3\n")
    done = subprocess.run([sys.executable, "-m", "stages.data", "--params", str(path), "--out", str(tmp_path / "raw"),
                           "--metrics", str(tmp_path / "m.json")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {path} line 4: finetune.seeds is set twice (lines 2 and 4); keep one"
    assert [p.name for p in tmp_path.iterdir()] == ["params.yaml"]


def test_missing_params_file(tmp_path):
    with pytest.raises(ParamsError, match="not found"):
        load_params(tmp_path / "nope.yaml")


def test_flatten_nested(chdir_root):
    flat = flatten(load_params("params.yaml").clean)
    assert flat["near_dedup.num_perm"] == 128
    assert flat["decontaminate.enabled"] is True


def test_with_init_replaces_finetune_settings_only_from_a_published_model(chdir_root, tmp_path, default_params):
    default_params["finetune"]["with_init"] = {"plain": {"lr": 3e-5}, "ulmfit": {"unfreeze_every": 5,
                                                                                 "gradual_unfreezing": False},
                                               "patience": 4}
    scratch = load(tmp_path, default_params).finetune
    assert (scratch.plain.lr, scratch.ulmfit.unfreeze_every, scratch.patience) == (
        default_params["finetune"]["plain"]["lr"], default_params["finetune"]["ulmfit"]["unfreeze_every"],
        default_params["finetune"]["patience"])
    default_params["init"] = "hf:org/model"
    with_init = load(tmp_path, default_params).finetune
    assert (with_init.plain.lr, with_init.ulmfit.unfreeze_every, with_init.ulmfit.gradual_unfreezing,
            with_init.patience) == (3e-5, 5, False, 4)
    # a key with_init leaves out keeps its value, in a section it sets too
    assert (with_init.ulmfit.lr, with_init.plain.warmup_frac) == (scratch.ulmfit.lr, scratch.plain.warmup_frac)


@pytest.mark.parametrize("with_init, message", [
    ({"plain_lrr": 1e-4}, "finetune.with_init.plain_lrr: not a training setting; one of"),
    ({"tasks": ["sst2"]}, "finetune.with_init.tasks: not a training setting"),
    ({"plain": {"lr": "fast"}}, "finetune.with_init.plain.lr: expected a number, got str 'fast'"),
    ({"plain": {"lrr": 1e-4}},
     "finetune.with_init.plain.lrr: unknown key; did you mean 'finetune.with_init.plain.lr'?"),
    ({"plain": 1e-4}, "finetune.with_init.plain: expected a mapping of finetune.plain's keys, got float 0.0001"),
    ({"ulmfit": {"lr_decay": 0.5}}, "finetune.with_init.ulmfit.lr_decay: 0.5 must be >= 1"),
    ({"patience": 0}, "finetune.with_init.patience: 0 must be >= 1"),
])
def test_with_init_is_checked_without_init(chdir_root, tmp_path, default_params, with_init, message):
    default_params["finetune"]["with_init"] = with_init
    assert message in error_of(tmp_path, default_params)


def test_per_task_settings_of_unselected_tasks_are_ignored(chdir_root, tmp_path, default_params):
    # selecting another task is one -S flag: the shipped per-task settings for imdb do not stop it
    default_params["finetune"]["tasks"] = ["cola"]
    params = load(tmp_path, default_params)
    assert params.finetune.train_limit("cola") is None and "imdb" in params.distill.unlabeled
    assert params.distill.tasks == ["cola"]  # null: every finetuned task, so selecting a task is one flag


def test_distill_can_take_some_of_the_finetuned_tasks(chdir_root, tmp_path, default_params):
    default_params["distill"]["tasks"] = ["sst2"]
    assert load(tmp_path, default_params).distill.tasks == ["sst2"]
    default_params["distill"]["tasks"] = []  # no students: a task type without distillation is finetuned alone
    assert load(tmp_path, default_params).distill.tasks == []
    default_params["distill"]["tasks"] = ["sst2", "sst2"]
    assert "distill.tasks: ['sst2', 'sst2'] must be a list without repeats ([]: no students" in error_of(
        tmp_path, default_params)


def test_floats_as_dvc_writes_them_are_numbers(chdir_root, tmp_path, default_params):
    """`dvc exp run -S finetune.with_init.plain.lr=2e-5` writes `2e-05` back (YAML 1.2), which PyYAML
    reads as a string; so does a hand-typed `1e14`. Float fields take them; other strings still fail."""
    default_params["pretrain"]["budget_flops"] = 1
    default_params["finetune"]["plain"]["lr"] = 0.123
    path = write_params(tmp_path / "params.yaml", default_params)
    text = path.read_text().replace("budget_flops: 1\n", "budget_flops: 1e14\n", 1)
    path.write_text(text.replace("lr: 0.123\n", "lr: 2e-05\n", 1))
    params = load_params(path, CHECKS)
    assert params.pretrain.budget_flops == 1e14 and params.finetune.plain.lr == 2e-5
    default_params["pretrain"]["budget_flops"] = "1e14 FLOPs"
    assert "pretrain.budget_flops: expected a number, got str '1e14 FLOPs'" in error_of(tmp_path, default_params)


@pytest.mark.parametrize("recipe", recipe_names())
def test_every_recipe_loads_over_the_default_params(chdir_root, tmp_path, default_params, recipe):
    params = load(tmp_path, {**default_params, "recipe": recipe})
    assert params.recipe == recipe
    replaced_with_init = {f"finetune.{k}" for k in default_params["finetune"]["with_init"]} if params.init else ()
    for key, value in flatten(read_recipe(recipe)[0]).items():  # each key it sets is the value used
        assert flatten(params)[key] == value or key in replaced_with_init


def test_the_default_recipe_sets_nothing(chdir_root):
    assert recipe_names() == ["cpu-demo", "cpu-minilm", "gpu-minilm", "gpu-small"]
    assert load_params("params.yaml", CHECKS).recipe == "cpu-demo" and recipe_keys("cpu-demo") == []


def test_a_recipe_merges_mappings_and_replaces_the_rest(chdir_root, tmp_path, default_params):
    """cpu-minilm sets tasks' limits and lists: its mappings merge into params.yaml's key by key, its
    lists and numbers replace params.yaml's whole, whatever params.yaml holds there."""
    default_params["finetune"].update(variants=["ulmfit", "frozen"], seeds=5)
    default_params["corpora"]["domain"]["valid_fraction"] = 0.05  # a key the recipe leaves alone
    params = load(tmp_path, {**default_params, "recipe": "cpu-minilm"})
    assert params.finetune.variants == ["plain"] and params.finetune.seeds == 1
    assert params.corpora.domain.max_docs == 2000 and params.corpora.domain.valid_fraction == 0.05
    assert params.init == "hf:sentence-transformers/all-MiniLM-L6-v2"
    assert "finetune.seeds" in recipe_keys("cpu-minilm") and "corpora.domain.valid_fraction" not in recipe_keys(
        "cpu-minilm")


def test_a_value_this_run_changed_where_the_recipe_sets_the_key_is_refused(chdir_root, tmp_path, default_params):
    """`dvc exp run -S recipe=cpu-minilm -S finetune.seeds=3` once ran 1 seed while `dvc exp show` said 3. A value
    changed since the baseline commit (`committed`) that the recipe replaces is refused in one line that says
    how to set it; one equal to the recipe's, or where the recipe sets nothing, is not."""
    committed = copy.deepcopy(default_params)
    default_params["recipe"] = "cpu-minilm"
    default_params["finetune"].update(seeds=3, epochs=2)  # epochs: the recipe's own value
    default_params["finetune"]["ulmfit"]["cut_frac"] = 0.2  # a key the recipe leaves alone
    default_params["tasks"]["imdb"]["max_len"] = 256
    path = write_params(tmp_path / "params.yaml", default_params)
    with pytest.raises(ParamsError) as info:
        load_params(path, CHECKS, committed)
    assert str(info.value) == (
        f"{path}: recipe: this run changes tasks.imdb.max_len=256 (the recipe: 384), finetune.seeds=3 (the recipe: 1), "
        "which recipe cpu-minilm sets, and a recipe's keys replace params.yaml's; change them in the recipe's file "
        "instead: dvc exp run -S lib/config/recipes/cpu-minilm.yaml:tasks.imdb.max_len=256 "
        "-S lib/config/recipes/cpu-minilm.yaml:finetune.seeds=3")
    default_params["finetune"]["seeds"] = 1
    default_params["tasks"]["imdb"]["max_len"] = 192  # as committed: the recipe's value replaces it, as it always did
    params = load_params(write_params(tmp_path / "params.yaml", default_params), CHECKS, committed)
    assert params.finetune.seeds == 1 and params.tasks["imdb"].max_len == 384 and params.finetune.ulmfit.cut_frac == 0.2


def test_a_stage_says_what_its_recipe_changes_and_from_what(chdir_root, default_params):
    default_params["recipe"] = "cpu-minilm"
    default_params["finetune"]["seeds"] = 1
    line = recipe_line(default_params, "params.yaml")
    assert line.startswith("recipe cpu-minilm (lib/config/recipes/cpu-minilm.yaml) sets over params.yaml: "
                           "init=hf:sentence-transformers/all-MiniLM-L6-v2 (not null), ")
    assert "finetune.variants=[plain] (not [ulmfit, plain, from_scratch, frozen])" in line
    assert "finetune.seeds" not in line  # params.yaml holds the recipe's value already
    assert recipe_line({**default_params, "recipe": "cpu-demo"}, "params.yaml") is None


def test_an_unknown_recipe_suggests_the_closest(chdir_root, tmp_path, default_params):
    message = error_of(tmp_path, {**default_params, "recipe": "cpu-minlm"})
    assert message.endswith("recipe: 'cpu-minlm' is not one of cpu-demo, cpu-minilm, gpu-minilm, gpu-small; "
                            "did you mean 'cpu-minilm'?")


def test_a_bad_key_under_a_recipe_names_both_files(chdir_root, tmp_path, default_params, monkeypatch):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "mine.yaml").write_text("model: {d_modl: 64}\n")
    monkeypatch.setattr(params_module, "RECIPES", recipes)
    message = error_of(tmp_path, {**default_params, "recipe": "mine"})
    assert message == (f"{tmp_path / 'params.yaml'} with {recipes / 'mine.yaml'}: model.d_modl: unknown key; "
                       "did you mean 'model.d_model'?")


@pytest.mark.parametrize("mlm, message", [
    ({"knowledge": "phrase", "span": True}, "mlm.knowledge: phrase masks whole phrases or entities, not SpanBERT spans"),
    ({"knowledge": "entities"}, "mlm.knowledge: 'entities' is not one of none, phrase, entity, both"),
])
def test_bad_knowledge_masking_stops_in_one_line(tmp_path, default_params, mlm, message):
    default_params["mlm"].update(mlm)
    assert message in error_of(tmp_path, default_params)
