"""The seq2seq task type (lib/tasks/seq2seq.py): its rows (texts, translation records, SQuAD's answers), the
encoding and teacher forcing, that a tiny encoder-decoder trained through it learns to write its targets,
its model's folder, and what params may not ask of it."""
import dataclasses
import random
from typing import Callable

import pytest
import torch

import yaml

from lib.config.errors import UserError
from lib.config.params import DistillConfig, FinetuneConfig, ImplConfig, ModelConfig, ParamsError, TaskConfig, load_params
from lib.data.corpus import eval_texts
from lib.data.tokenizer import saved_special_ids
from lib.metrics.generation import generation_scores
from lib.models.architectures import build_model
from lib.models.architectures.encoder_decoder import seq2seq_config
from lib.models.folder import model_folder
from lib.tasks import TYPES, check_tasks
from lib.tasks.base import TaskData
from lib.tasks.capabilities import soft_loss
from lib.tasks.model import load_task_model
from lib.tasks.seq2seq import IGNORE, Example, Seq2SeqModel, collate, decoder_inputs, encode, read_rows
from lib.training.distill import build_student, distill_task, student_layout
from lib.training.variants import VARIANTS, check_variants
from tests.helpers import ROOT, write_jsonl_gz, write_params
from tests.tasktype_helpers import bpe_on, one_thread  # noqa: F401 (a fixture)

KIND = TYPES["seq2seq"]
IMPL = ImplConfig(precision="fp32", compile="off")
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


def three_words(tokenizer, special, target: Callable[[list[str]], list[str]]) -> tuple[TaskData, list]:
    """(a task of 64 sources of three words and their targets, train = dev = eval, decoded greedily; its
    examples)."""
    rng = random.Random(0)
    rows = []
    for _ in range(64):
        words = rng.sample(WORDS, 3)
        rows.append({"source": " ".join(words), "target": " ".join(target(words))})
    pairs, _ = read_rows(rows, task_config(), "tasks.t")
    examples, _ = encode(pairs, tokenizer, special["eos"], 16, 16)
    task = TaskData("toy", [], examples, examples, examples, "test", {}, {}, type="seq2seq",
                    info={"num_beams": 1, "length_penalty": 1.0, "max_target_len": 16},
                    references={"dev": pairs, "eval": pairs}, tokenizer=tokenizer, special=special)
    return task, examples


def trained_to_write(model: Seq2SeqModel, task: TaskData, steps: int = 300) -> tuple[Seq2SeqModel, torch.Tensor]:
    """`model` trained on the whole of task.train for `steps` steps, in eval mode; the last loss."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = KIND.collate(task.train, task.special["pad"], task)
    model.train()
    for _ in range(steps):
        outputs, _ = KIND.forward(model, batch)
        loss = KIND.loss(outputs, batch, task)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval(), loss


@pytest.mark.parametrize("shape", ["t5", "bart"])
def test_a_tiny_encoder_decoder_learns_to_write_its_targets(words, one_thread, shape):
    """Reversing three words: a model that reads no source, a decoder input that is not shifted, or a
    loss on the wrong positions can not learn it."""
    tokenizer, special, _ = words
    task, examples = three_words(tokenizer, special, lambda w: w[::-1])
    model = VARIANTS["plain"].setup(tiny(tokenizer.get_vocab_size(), special, shape), 0,
                                    FinetuneConfig(tasks=[]), KIND).model
    model, loss = trained_to_write(model, task)
    batch = KIND.collate(examples, special["pad"], task)
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


# distillation ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reverser(words):
    """A tiny T5 trained to write its three words reversed, and that task."""
    tokenizer, special, _ = words
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    task, _ = three_words(tokenizer, special, lambda w: w[::-1])
    model, _ = trained_to_write(Seq2SeqModel(tiny(tokenizer.get_vocab_size(), special)), task)
    torch.set_num_threads(threads)
    return model, task


def test_word_level_soft_loss_is_the_kl_over_the_teachers_likeliest_tokens():
    torch.manual_seed(0)
    teacher, student, T = torch.randn(5, 12), torch.randn(5, 12), 2.0
    examples = [Example([1], [1, 2, 3]), Example([1], [1, 2])]  # 5 target tokens in all
    every = KIND.kept_outputs(teacher, examples, top_k=12)
    assert [tuple(k.shape) for k in every] == [(3, 24), (2, 24)]
    full = KIND.soft_loss(student, KIND.batch_targets(every, 0), {}, T)
    torch.testing.assert_close(full, soft_loss(student, teacher, T))  # all kept: the whole vocabulary's KL
    kept = KIND.batch_targets(KIND.kept_outputs(teacher, examples, top_k=3), 0)
    expected = 0.0
    for t, s in zip(teacher, student):
        top = t.topk(3).indices
        p = torch.softmax(t[top] / T, -1)
        q = torch.log_softmax(s / T, -1)[top]
        expected += float((p * (p.log() - q)).sum()) / 5 * T * T
    assert KIND.soft_loss(student, kept, {}, T).item() == pytest.approx(expected, rel=1e-5)


def test_a_seq2seq_student_copies_blocks_of_both_stacks(words):
    tokenizer, special, _ = words
    teacher = Seq2SeqModel(tiny(tokenizer.get_vocab_size(), special))  # 2 + 2 layers
    cfg = DistillConfig(layers=1, decoder_layers=2)
    blocks, layer_map, below = student_layout(cfg, teacher.backbone.cfg)
    assert (blocks, layer_map, below) == ([0, 2, 3], [1, 2], 2)  # numbered through the encoder, then the decoder
    student = build_student(teacher, cfg, blocks, KIND)
    assert (student.backbone.cfg.n_layers, student.backbone.cfg.decoder_layers) == (1, 2)
    t, s = teacher.state_dict(), student.state_dict()
    for name in s:
        torch.testing.assert_close(s[name], t[name], rtol=0, atol=0)  # encoder block 0, decoder blocks 0 and 1
    bottom = build_student(teacher, dataclasses.replace(cfg, layers=2, decoder_layers=1), [0, 1, 2], KIND)
    assert bottom.backbone.cfg.decoder_layers == 1
    head = bottom.backbone.decoder.head.decoder.weight
    assert head is bottom.backbone.encoder.embeddings.token.weight or not bottom.backbone.cfg.tie_embeddings


def test_word_level_kd_alone_teaches_a_random_student_to_write(tmp_path, reverser, one_thread):
    """No gold loss and no copied blocks: only the teacher's per-token distributions (and its decoder's
    states) teach the student to reverse the words."""
    teacher, task = reverser
    cfg = DistillConfig(tasks=["toy"], layers=1, init="random", hard_weight=0.0, epochs=120, batch_size=16,
                        lr=3e-3, patience=120)
    result, student = distill_task(teacher, task, [], ["exact_match"], cfg, IMPL, torch.device("cpu"), 0,
                                   task.special["pad"], tmp_path, "fp")
    assert result.teacher["eval"]["exact_match"] > 0.9
    assert result.student["eval"]["exact_match"] > 0.6, result.history[-1]
    assert {"soft_loss", "hidden_loss"} <= set(result.history[0]) and "hard_loss" not in result.history[0]
    assert result.history[-1]["soft_loss"] < result.history[0]["soft_loss"] / 3
    assert result.transfer == {"labeled": 64, "unlabeled": 0} and result.teacher_blocks == []


def test_sequence_level_kd_learns_the_teachers_outputs_not_the_train_targets(tmp_path, words, reverser, one_thread):
    """The train targets copy the source, and the teacher reverses it, as the references do: a student
    trained on the teacher's generations reverses, one trained on the train targets could only copy."""
    tokenizer, special, _ = words
    teacher, reversing = reverser
    copying, _ = three_words(tokenizer, special, lambda w: w)
    task = dataclasses.replace(reversing, train=copying.train)
    cfg = DistillConfig(tasks=["toy"], layers=1, init="random", targets="teacher", soft_weight=0.0,
                        hidden_weight=0.0, hard_weight=1.0, epochs=120, batch_size=16, lr=3e-3, patience=120)
    result, student = distill_task(teacher, task, [], ["exact_match"], cfg, IMPL, torch.device("cpu"), 0,
                                   special["pad"], tmp_path, "fp")
    assert result.transfer["teacher_targets"] == 64
    assert result.student["eval"]["exact_match"] > 0.6, result.history[-1]


@pytest.mark.parametrize(("section", "expected"), [
    ({"pkd_weight": 1.0}, r"distill.pkd_weight: Patient-KD .* seq2seq task \(multi30k_en_de\)"),
    ({"layer_map": [2, 2]}, r"distill.layer_map: a seq2seq student \(multi30k_en_de\)"),
    ({"targets": "teacher", "tasks": ["sst2", "multi30k_en_de"]}, r"distill.targets: teacher .* sst2 is a classification"),
])
def test_distill_asks_of_a_seq2seq_task_only_what_it_has(tmp_path, section, expected):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    raw["finetune"]["tasks"] = ["sst2", "multi30k_en_de"]
    raw["distill"]["tasks"] = ["multi30k_en_de"]
    check_tasks(load_params(write_params(tmp_path / "params.yaml", raw)))  # the defaults ask nothing it lacks
    raw["distill"].update(section)
    with pytest.raises(ParamsError, match=expected):
        check_tasks(load_params(write_params(tmp_path / "params.yaml", raw)))
