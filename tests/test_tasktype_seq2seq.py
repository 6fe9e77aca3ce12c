"""The seq2seq task type (lib/tasks/seq2seq.py): its rows (texts, translation records, SQuAD's answers), the
encoding and teacher forcing, that a tiny encoder-decoder trained through it learns to write its targets,
its model's folder, and what params may not ask of it."""
import dataclasses
import random

import pytest
import torch

import yaml

from lib.config.errors import UserError
from lib.config.params import FinetuneConfig, ModelConfig, ParamsError, TaskConfig, load_params
from lib.data.corpus import eval_texts
from lib.data.tokenizer import saved_special_ids
from lib.metrics.generation import generation_scores
from lib.models.architectures import build_model
from lib.models.architectures.encoder_decoder import seq2seq_config
from lib.models.folder import model_folder
from lib.tasks import TYPES
from lib.tasks.base import TaskData
from lib.tasks.model import load_task_model
from lib.tasks.seq2seq import IGNORE, Example, Seq2SeqModel, collate, decoder_inputs, encode, read_rows
from lib.training.variants import VARIANTS, check_variants
from tests.helpers import ROOT, write_jsonl_gz, write_params
from tests.tasktype_helpers import bpe_on, one_thread  # noqa: F401 (a fixture)

KIND = TYPES["seq2seq"]
WORDS = "red blue green cat dog bird runs sleeps eats small big old".split()


def task_config(**fields) -> TaskConfig:
    return TaskConfig(source="unused", type="seq2seq", **fields)


@pytest.fixture(scope="module")
def words(tmp_path_factory):
    """(a BPE tokenizer of WORDS, its special ids, its folder)."""
    folder = tmp_path_factory.mktemp("tokenizer")
    tokenizer = bpe_on(WORDS, folder)
    return tokenizer, saved_special_ids(folder), folder


def test_a_translation_record_gives_the_source_and_target_languages():
    rows = [{"source": {"en": "a cat", "de": "eine Katze"}, "target": {"en": "a cat", "de": "eine Katze"}}]
    cfg = task_config(text_field="translation", label_field="translation", language="en", target_language="de",
                      prefix="translate English to German: ")
    pairs, skipped = read_rows(rows, cfg, "tasks.t")
    assert [(p.source, p.target, p.references) for p in pairs] == [
        ("translate English to German: a cat", "eine Katze", ["eine Katze"])]
    with pytest.raises(UserError, match=r"tasks\.t\.target_language: field 'translation' holds records of "
                                        r"languages en, de; name the one to read \(fr is not one\)"):
        read_rows(rows, dataclasses.replace(cfg, target_language="fr"), "tasks.t")


def test_squad_s_answers_are_references_and_the_question_and_context_are_named():
    rows = [{"source": "Who?", "context": "Rollo ruled.", "target": {"text": ["Rollo", "Rollo the Viking"],
                                                                   "answer_start": [0, 0]}},
            {"source": "Where?", "context": "Paris.", "target": {"text": [], "answer_start": []}},
            {"source": "", "context": "Paris.", "target": "x"}]
    cfg = task_config(text_field="question", text_pair_field="context", label_field="answers")
    pairs, skipped = read_rows(rows, cfg, "tasks.q")
    assert [(p.source, p.target, p.references) for p in pairs] == [
        ("question: Who? context: Rollo ruled.", "Rollo", ["Rollo", "Rollo the Viking"])]
    assert skipped == {"empty_target": 1, "empty_source": 1}


def test_a_class_index_is_written_as_its_label_word():
    cfg = task_config(label_names=["negative", "positive"], prefix="sst2 sentence: ")
    pairs, skipped = read_rows([{"source": "a dull film", "target": 0}, {"source": "a gem", "target": 1},
                                {"source": "unlabeled", "target": -1}], cfg, "tasks.s")
    assert [(p.source, p.target) for p in pairs] == [("sst2 sentence: a dull film", "negative"),
                                                      ("sst2 sentence: a gem", "positive")]
    assert skipped == {"empty_target": 1}
    with pytest.raises(UserError, match=r"tasks\.s\.label_names: field 'label' holds class indices; name the word"):
        read_rows([{"source": "a gem", "target": 1}], task_config(), "tasks.s")


def test_the_baseline_copies_the_source_without_its_prefix():
    cfg = task_config(prefix="translate: ")
    pairs, _ = read_rows([{"source": "Paris 1066", "target": "Paris 1066"}, {"source": "a cat", "target": "Katze"}],
                         cfg, "tasks.t")
    task = TaskData("toy", [], [], [], [], "test", {}, {}, type="seq2seq", info={"prefix": cfg.prefix},
                    references={"eval": pairs})
    scores, _ = KIND.baseline_scores(task, [], ["exact_match"], None)
    assert scores == {"exact_match": 0.5}



def test_a_summary_s_baseline_is_its_dialogue_s_first_three_turns():
    dialogue = "Amanda: I baked cookies.\nJerry: Sure!\nAmanda: I'll bring you some.\nJerry: Thanks."
    pairs, _ = read_rows([{"source": dialogue, "target": "Amanda baked cookies for Jerry."}], task_config(), "t")
    task = TaskData("toy", [], [], [], [], "test", {}, {}, type="seq2seq", info={"prefix": None},
                    references={"eval": pairs})
    lead3 = "Amanda: I baked cookies.\nJerry: Sure!\nAmanda: I'll bring you some."
    assert KIND.baseline_scores(task, [], ["rouge1"], None)[0] == generation_scores(
        ["rouge1"], [lead3], ["Amanda baked cookies for Jerry."])[0]


def test_encoding_ends_both_sides_with_eos_and_counts_the_cut(words):
    tokenizer, special, _ = words
    pairs, _ = read_rows([{"source": "red cat", "target": "big dog"},
                          {"source": " ".join(["red cat"] * 20), "target": "bird"}], task_config(), "tasks.t")
    examples, cut = encode(pairs, tokenizer, special["eos"], max_len=8, max_target_len=8)
    assert cut == 1 and len(examples[1].ids) == 8
    assert all(e.ids[-1] == special["eos"] and e.target[-1] == special["eos"] for e in examples)
    assert tokenizer.decode(examples[0].target[:-1]) == "big dog"


def test_teacher_forcing_reads_the_start_token_then_the_target_shifted_right():
    batch = collate([Example([5, 6, 2], [7, 8, 2]), Example([5, 2], [9, 2])], pad_id=0)
    assert batch["labels"].tolist() == [[7, 8, 2], [9, 2, IGNORE]]
    assert batch["attention_mask"].tolist() == [[True, True, True], [True, True, False]]
    shifted = decoder_inputs(batch["labels"], start=1)
    assert shifted[:, :2].tolist() == [[1, 7], [1, 9]]  # what follows a target's end is never predicted from
    assert shifted[0].tolist() == [1, 7, 8]


def tiny(vocab_size: int, special: dict[str, int], shape: str = "t5"):
    torch.manual_seed(0)
    sizes = ModelConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, dropout=0.0, max_positions=64)
    return build_model(seq2seq_config(sizes, shape, None, vocab_size, special))


@pytest.mark.parametrize("shape", ["t5", "bart"])
def test_a_tiny_encoder_decoder_learns_to_write_its_targets(words, one_thread, shape):
    """Reversing three words: a model that reads no source, a decoder input that is not shifted, or a
    loss on the wrong positions can not learn it."""
    tokenizer, special, _ = words
    rng = random.Random(0)
    rows = []
    for _ in range(64):
        words = rng.sample(WORDS, 3)
        rows.append({"source": " ".join(words), "target": " ".join(reversed(words))})
    pairs, _ = read_rows(rows, task_config(), "tasks.t")
    examples, _ = encode(pairs, tokenizer, special["eos"], 16, 16)
    task = TaskData("toy", [], examples, [], examples, "test", {}, {}, type="seq2seq",
                    info={"num_beams": 1, "length_penalty": 1.0, "max_target_len": 16},
                    references={"eval": pairs}, tokenizer=tokenizer, special=special)
    model = VARIANTS["plain"].setup(tiny(tokenizer.get_vocab_size(), special, shape), 0,
                                    FinetuneConfig(tasks=[]), KIND).model
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = KIND.collate(examples, special["pad"], task)
    model.train()
    for _ in range(300):
        outputs, _ = KIND.forward(model, batch)
        loss = KIND.loss(outputs, batch, task)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    predictions = KIND.predict_batch(model, batch, examples, task)
    scores, extras = KIND.score(task, "eval", predictions, ["exact_match", "bleu"])
    assert scores["exact_match"] > 0.9, (loss.item(), scores)
    assert extras["decoding"] == {"num_beams": 1, "length_penalty": 1.0, "max_new_tokens": max(
        len(e.target) for e in examples)}


def test_the_model_folder_reads_back_the_same_model(tmp_path, words):
    tokenizer, special, tokenizer_dir = words
    model = Seq2SeqModel(tiny(tokenizer.get_vocab_size(), special)).eval()
    meta = {"task": "t", "type": "seq2seq", "info": {}, "label_names": []}
    with model_folder(tmp_path / "saved", tokenizer_dir) as folder:
        line = KIND.write_model(model, folder, meta)
    assert line == "transformers: T5ForConditionalGeneration"
    loaded, info = load_task_model(tmp_path / "saved")
    ids = torch.tensor([[5, 6, 7, special["eos"]]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    labels = torch.tensor([[8, 9, special["eos"]]])
    predicted = labels != IGNORE
    start = model.backbone.cfg.decoder_start
    torch.testing.assert_close(loaded(ids, mask, decoder_inputs(labels, start), predicted),
                               model(ids, mask, decoder_inputs(labels, start), predicted), atol=1e-5, rtol=1e-5)
    assert info["type"] == "seq2seq"


def test_an_encoder_only_model_is_refused_by_name(words):
    tokenizer, special, _ = words
    encoder = build_model(tiny(tokenizer.get_vocab_size(), special).encoder.cfg)
    with pytest.raises(UserError, match=r"tasks\.t\.type: a seq2seq task needs an encoder-decoder"):
        KIND.backbone(encoder, "tasks.t")


@pytest.mark.parametrize("variant", ["frozen", "elmo"])
def test_a_variant_that_trains_a_head_is_refused_for_a_seq2seq_task(tmp_path, variant):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    raw["tasks"]["sst2"]["type"] = "seq2seq"
    raw["tasks"]["sst2"].pop("label_names")
    raw["finetune"].update(tasks=["sst2"], variants=["plain", variant])
    params = load_params(write_params(tmp_path / "params.yaml", raw))
    with pytest.raises(ParamsError, match=rf"finetune.variants\[1\]: {variant} trains a head .* sst2, a seq2seq"):
        check_variants(params)


def test_decontamination_reads_every_text_of_a_translation_record(tmp_path):
    write_jsonl_gz(tmp_path / "mt" / "test.jsonl.gz", [{"translation": {"en": "a red cat", "de": "eine rote Katze"}}])
    spec = {"mt": {"folder": "mt", "splits": ["test"], "fields": {"text_field": "translation",
                                                                   "label_field": "translation"},
                   "kinds": {"text_field": "texts", "label_field": "texts"}}}
    assert set(eval_texts(spec, tmp_path)) == {"a red cat", "eine rote Katze"}


def test_ulmfit_unfreezes_both_stacks_from_the_decoder_down(words):
    """ULMFiT's groups over the whole encoder-decoder: every parameter in one group, the decoder's blocks
    above the encoder's, so gradual unfreezing thaws the decoder first."""
    tokenizer, special, _ = words
    backbone = tiny(tokenizer.get_vocab_size(), special)
    model = VARIANTS["ulmfit"].setup(backbone, 0, FinetuneConfig(tasks=[]), KIND).model
    groups = model.layer_groups()
    assert sorted(id(p) for group in groups for p in group) == sorted(id(p) for p in model.parameters())
    owner = {id(p): name.split(".")[1] for name, p in model.named_parameters()}  # backbone.<stack>. ...
    stacks = [{owner[id(p)] for p in group} for group in groups[1:-1]]
    assert stacks == [{"encoder"}] * 2 + [{"decoder"}] * 2
