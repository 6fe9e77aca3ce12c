"""Labeled tasks: encoding and truncation, loading (labels, skipped rows, dev carve, subsets), batching."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from lib.config.errors import UserError
from lib.config.params import SpecialTokens, TaskConfig, TokenizerConfig
from lib.data.encoding import batch_indices, encode, pair_lengths
from lib.data.tokenizer import load_tokenizer, special_ids, train_tokenizer
from lib.tasks.base import UNLABELED
from lib.tasks.base import text_hash
from lib.tasks.classification import TYPE, Example, Row, collate, hash_text, read_unlabeled
from tests.helpers import ROOT, SHARED_DATA, write_jsonl_gz

BOS, EOS, PAD = 2, 3, 0
WORDS = ("the a of to in good bad movie film plot actor scene great awful boring funny love hate story "
         "music ending first last best worst not very quite").split()


def sentence(rng: random.Random, lo: int = 3, hi: int = 12) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    rng = random.Random(0)
    out = tmp_path_factory.mktemp("tasks") / "tokenizer"
    return train_tokenizer((sentence(rng) for _ in range(300)),
                           TokenizerConfig(algorithm="bpe", vocab_size=400, min_frequency=1), out)


def raw(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def long_text(n_words: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


# encode ---------------------------------------------------------------------------------------------

def test_single_layout(tokenizer):
    texts = ["good movie", "the worst plot of the film"]
    ids, segments, truncated = encode(tokenizer, texts, None, 64, "head", BOS, EOS)
    assert ids == [[BOS, *raw(tokenizer, t), EOS] for t in texts]
    assert segments == [[0] * len(i) for i in ids] and truncated == 0


def test_pair_layout(tokenizer):
    a, b = "a good movie", "the plot is boring"
    ids, segments, truncated = encode(tokenizer, [a], [b], 64, "head", BOS, EOS)
    ra, rb = raw(tokenizer, a), raw(tokenizer, b)
    assert ids == [[BOS, *ra, EOS, *rb, EOS]]
    assert segments == [[0] * (len(ra) + 2) + [1] * (len(rb) + 1)] and truncated == 0


@pytest.mark.parametrize("max_len, mode, head, tail", [
    (20, "head", 18, 0), (20, "tail", 0, 18), (20, "head_tail", 5, 13),  # 18 text tokens: ceil(18/4) = 5 head
    (512, "head_tail", 128, 382),  # Sun et al. 2019: head 128 + tail 382 of 512
])
def test_truncation_keeps_the_right_tokens(tokenizer, max_len, mode, head, tail):
    text = long_text(1000)
    full = raw(tokenizer, text)
    assert len(full) > max_len + 100
    ids, segments, truncated = encode(tokenizer, [text], None, max_len, mode, BOS, EOS)
    assert ids[0] == [BOS, *full[:head], *full[len(full) - tail:], EOS]
    assert len(ids[0]) == len(segments[0]) == max_len and truncated == 1


def brute_force_lengths(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Longest-first as usually written: one token at a time from the longer side (b on a tie)."""
    while len_a + len_b > budget:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    return len_a, len_b


def test_pair_lengths_match_token_by_token_longest_first():
    for budget in range(0, 25):
        for len_a in range(0, 30):
            for len_b in range(0, 30):
                assert pair_lengths(len_a, len_b, budget) == brute_force_lengths(len_a, len_b, budget)


def test_pair_truncation_longest_first(tokenizer):
    long_a, short_b = long_text(60, seed=2), "good film"
    ra, rb = raw(tokenizer, long_a), raw(tokenizer, short_b)
    ids, segments, truncated = encode(tokenizer, [long_a], [short_b], 20, "tail", BOS, EOS)
    keep = 20 - 3 - len(rb)  # only the longer side is cut, from its start ('tail' keeps the end)
    assert ids[0] == [BOS, *ra[len(ra) - keep:], EOS, *rb, EOS] and truncated == 1
    assert segments[0] == [0] * (keep + 2) + [1] * (len(rb) + 1)
    # both long: each cut to half of the 17 text tokens, the first side keeps the odd one; 'head' keeps starts
    long_b = long_text(50, seed=3)
    ids, segments, _ = encode(tokenizer, [long_a], [long_b], 20, "head", BOS, EOS)
    assert ids[0] == [BOS, *ra[:9], EOS, *raw(tokenizer, long_b)[:8], EOS]
    assert len(ids[0]) == len(segments[0]) == 20 and segments[0].count(1) == 9


def test_truncated_count(tokenizer):
    texts = ["good", long_text(100), "bad movie", long_text(80, seed=5)]
    ids, _, truncated = encode(tokenizer, texts, None, 16, "head", BOS, EOS)
    assert truncated == 2 and [len(i) for i in ids][1::2] == [16, 16]
    _, _, truncated = encode(tokenizer, texts, texts, 16, "head", BOS, EOS)
    assert truncated == 2  # "good"+"good" and "bad movie" twice fit in 13 tokens


def test_unknown_truncation_mode(tokenizer):
    with pytest.raises(ValueError, match="truncation"):
        encode(tokenizer, ["good"], None, 16, "middle", BOS, EOS)


# loading ------------------------------------------------------------------------------------------

def make_task(tmp_path: Path, train: list[dict], evaluation: list[dict], **overrides) -> TaskConfig:
    write_jsonl_gz(tmp_path / "toy" / "train.jsonl.gz", train)
    write_jsonl_gz(tmp_path / "toy" / "validation.jsonl.gz", evaluation)
    return TaskConfig(source=str(tmp_path / "toy"), **overrides)


def example_hash(row: Row) -> int:
    """The hash that carves dev out of train."""
    return text_hash(hash_text(row))


def labeled(n: int, labels: list, seed: int = 0) -> list[dict]:
    """n rows with distinct texts, labels cycling through `labels`."""
    rng = random.Random(seed)
    return [{"text": f"{sentence(rng)} number {i}", "label": labels[i % len(labels)]} for i in range(n)]


def load(tokenizer, cfg: TaskConfig, **kwargs):
    options = {"dev_fraction": 0.2, "dev_max": 1000, **kwargs}
    return TYPE.load("toy", cfg, tokenizer, special_ids(tokenizer, SpecialTokens()), **options)


def decoded(tokenizer, examples: list[Example]) -> list[str]:
    return [tokenizer.decode(e.ids) for e in examples]


def text_labels(tokenizer, data) -> dict[str, int]:
    examples = data.train + data.dev + (data.eval or [])
    return dict(zip(decoded(tokenizer, examples), (e.label for e in examples)))


def test_int_labels_map_to_sorted_positions(tokenizer, tmp_path):
    train, evaluation = labeled(40, [7, 3, 5]), labeled(9, [5, 7, 3], seed=1)
    data = load(tokenizer, make_task(tmp_path, train, evaluation))
    assert data.label_names == ["3", "5", "7"] and data.eval_split == "validation"
    assert len(data.train) + len(data.dev) == 40 and len(data.eval) == 9
    index = {3: 0, 5: 1, 7: 2}
    assert text_labels(tokenizer, data) == {row["text"]: index[row["label"]] for row in train + evaluation}
    assert data.skipped == {"train.empty_text": 0, "eval.empty_text": 0}
    assert data.truncated == {"train": 0, "eval": 0}


def test_str_labels_map_to_sorted_positions(tokenizer, tmp_path):
    train, evaluation = labeled(30, ["pos", "neg"]), labeled(6, ["neg", "pos"], seed=1)
    data = load(tokenizer, make_task(tmp_path, train, evaluation))
    assert data.label_names == ["neg", "pos"]
    assert text_labels(tokenizer, data) == {r["text"]: int(r["label"] == "pos") for r in train + evaluation}


def test_str_labels_are_stripped_and_case_variants_refused(tokenizer, tmp_path):
    """'pos ' beside 'pos' is one class (it once made a 2-class task a 4-class one); 'Pos' beside 'pos' is a
    typo the task can not guess the class of: one line naming both spellings."""
    train, evaluation = labeled(40, ["pos", "neg", "pos ", " neg\t"]), labeled(6, ["neg", " pos"], seed=1)
    data = load(tokenizer, make_task(tmp_path, train, evaluation))
    assert data.label_names == ["neg", "pos"]
    assert text_labels(tokenizer, data) == {r["text"]: int(r["label"].strip() == "pos") for r in train + evaluation}
    with pytest.raises(UserError, match=r"^tasks\.toy\.label_field: split 'train' has labels 'Pos' and 'pos', which "
                                        r"differ only by case; write each class one way$"):
        load(tokenizer, make_task(tmp_path, labeled(40, ["pos", "neg", "Pos"]), evaluation))


def test_label_names(tokenizer, tmp_path):
    cfg = make_task(tmp_path, labeled(30, [1, 0]), labeled(6, [0, 1], seed=1), label_names=["negative", "positive"])
    data = load(tokenizer, cfg)
    assert data.label_names == ["negative", "positive"]
    assert {e.label for e in data.train + data.dev} == {0, 1}  # the int is the index

    train = labeled(30, ["neg", "pos"])
    cfg = make_task(tmp_path, train, labeled(6, ["pos"], seed=1), label_names=["pos", "neg"])
    data = load(tokenizer, cfg)
    assert data.label_names == ["pos", "neg"]  # a string's index is its position in label_names
    assert text_labels(tokenizer, data)[train[0]["text"]] == 1 and {e.label for e in data.eval} == {0}


@pytest.mark.parametrize("labels, names, message", [
    ([0, 1, 2], ["a", "b"], r"tasks\.toy\.label_names: train label 2"),
    (["x", "y"], ["x", "z"], r"tasks\.toy\.label_names: train label 'y'"),
])
def test_labels_outside_label_names(tokenizer, tmp_path, labels, names, message):
    cfg = make_task(tmp_path, labeled(12, labels), labeled(3, labels), label_names=names)
    with pytest.raises(UserError, match=message):
        load(tokenizer, cfg)


@pytest.mark.parametrize("train_labels, message", [
    ([0, "pos"], r"tasks\.toy\.label_field: .*mixed types"),
    ([1, 1], r"tasks\.toy\.label_field: .*one class \(1\); a classifier needs at least 2"),
    ([0, 1, -1], r"tasks\.toy\.label_field: .*unlabeled row"),
    ([0, None, 1], r"tasks\.toy\.label_field: .*unlabeled row"),
    ([True, False], r"tasks\.toy\.label_field: 'label' holds bool values"),
    ([0.0, 1.0], r"tasks\.toy\.label_field: 'label' holds float values"),
])
def test_bad_train_labels(tokenizer, tmp_path, train_labels, message):
    cfg = make_task(tmp_path, labeled(12, train_labels), labeled(3, [0, 1]))
    with pytest.raises(UserError, match=message) as err:
        load(tokenizer, cfg)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("eval_labels, shown", [([0, 2, 1], "2"), ([0, "pos"], "'pos'"), ([0, -1], "-1"),
                                                 ([True, 0], "True")])
def test_eval_label_not_in_train(tokenizer, tmp_path, eval_labels, shown):
    cfg = make_task(tmp_path, labeled(12, [0, 1]), labeled(4, eval_labels))
    with pytest.raises(UserError, match=rf"tasks\.toy\.label_field: split 'validation' has label {shown},"):
        load(tokenizer, cfg)


@pytest.mark.parametrize("eval_labels", [[-1], [None], [-1, None]])
def test_unlabeled_eval_split_gives_no_eval(tokenizer, tmp_path, eval_labels):
    data = load(tokenizer, make_task(tmp_path, labeled(12, [0, 1]), labeled(5, eval_labels)))
    assert data.eval is None and data.truncated["eval"] == 0 and data.train


def test_eval_split_without_a_label_field_gives_no_eval(tokenizer, tmp_path):
    unlabeled = [{"idx": i, "text": row["text"]} for i, row in enumerate(labeled(5, [0, 1], seed=1))]
    data = load(tokenizer, make_task(tmp_path, labeled(12, [0, 1]), unlabeled))
    assert data.eval is None and data.train


@pytest.mark.parametrize("renamed", ["Label", "LABEL", "label_"])
def test_eval_split_with_the_label_field_spelled_otherwise_is_one_line(tokenizer, tmp_path, renamed):
    """Not an unlabeled split (which has no label field at all): finetune would report no evaluation."""
    evaluation = [{"text": row["text"], renamed: row["label"]} for row in labeled(5, [0, 1], seed=1)]
    with pytest.raises(UserError, match=rf"^tasks\.toy\.label_field: split 'validation' has no field 'label' but "
                                        rf"has '{renamed}'; name the label field 'label' in every split"):
        load(tokenizer, make_task(tmp_path, labeled(12, [0, 1]), evaluation))


def test_unlabeled_texts_leave_out_held_out_ones(tokenizer, tmp_path):
    cfg = make_task(tmp_path, labeled(12, [0, 1]), labeled(5, [0, 1], seed=1))
    extra = labeled(10, [0], seed=2)
    write_jsonl_gz(Path(cfg.source) / "unsup.jsonl.gz",
                   [{"text": r["text"]} for r in extra] + [{"text": ""}])
    held_out = {example_hash(Row(extra[0]["text"], None, 0))}
    rows, skipped = read_unlabeled(cfg, "unsup", 5, held_out, "tasks.toy")
    assert len(rows) == 5 and all(row.label == UNLABELED for row in rows)
    assert extra[0]["text"] not in {row.a for row in rows}
    assert skipped == {"unlabeled.empty_text": 1, "unlabeled.overlap": 1}
    everything, _ = read_unlabeled(cfg, "unsup", None, set(), "tasks.toy")
    assert len(everything) == 10 and {r.a for r in rows} <= {r.a for r in everything}


def test_empty_texts_are_skipped_and_counted(tokenizer, tmp_path):
    empties = [{"text": "", "label": 0}, {"text": "   \n", "label": 1}, {"text": None, "label": 1}]
    train, evaluation = labeled(20, [0, 1]) + empties, [empties[0]] + labeled(4, [1, 0], seed=1)
    data = load(tokenizer, make_task(tmp_path, train, evaluation))
    assert data.skipped == {"train.empty_text": 3, "eval.empty_text": 1}
    assert len(data.train) + len(data.dev) == 20 and len(data.eval) == 4


def test_split_without_text_is_a_user_error(tokenizer, tmp_path):
    cfg = make_task(tmp_path, labeled(12, [0, 1]), [{"text": " ", "label": 0}])
    with pytest.raises(UserError, match=r"tasks\.toy\.text_field: split 'validation' has no row with text"):
        load(tokenizer, cfg)
    cfg = make_task(tmp_path, [{"text": 5, "label": 0}], labeled(2, [0]))
    with pytest.raises(UserError, match=r"tasks\.toy\.text_field: field 'text' .* holds int values"):
        load(tokenizer, cfg)


def test_pair_task(tokenizer, tmp_path):
    rng = random.Random(3)
    rows = [{"s1": f"{sentence(rng)} {i}", "s2": sentence(rng), "y": i % 2} for i in range(20)]
    rows.append({"s1": "good movie", "s2": "", "y": 1})  # an empty second text skips the row too
    cfg = make_task(tmp_path, rows, rows[:5], text_field="s1", text_pair_field="s2", label_field="y")
    data = load(tokenizer, cfg)
    assert data.skipped == {"train.empty_text": 1, "eval.empty_text": 0}
    by_text = {r["s1"]: r for r in rows}
    for example in data.train + data.dev + data.eval:
        first = example.ids[1:example.ids.index(EOS)]
        row = by_text[tokenizer.decode(first)]
        assert example.ids == [BOS, *raw(tokenizer, row["s1"]), EOS, *raw(tokenizer, row["s2"]), EOS]
        assert example.segments == [0] * (len(first) + 2) + [1] * (len(example.ids) - len(first) - 2)
        assert example.label == row["y"]


def test_dev_carve_is_by_hash_and_order_free(tokenizer, tmp_path):
    rows = labeled(200, [0, 1])
    rows += [dict(rows[i]) for i in range(0, 200, 10)]  # exact duplicates land on the same side
    first = load(tokenizer, make_task(tmp_path / "a", rows, labeled(4, [0, 1])))
    shuffled = random.Random(1).sample(rows, len(rows))
    second = load(tokenizer, make_task(tmp_path / "b", shuffled, labeled(4, [0, 1])))
    dev, train = decoded(tokenizer, first.dev), decoded(tokenizer, first.train)
    assert sorted(dev) == sorted(decoded(tokenizer, second.dev))
    assert sorted(train) == sorted(decoded(tokenizer, second.train))
    assert not set(dev) & set(train) and len(dev) + len(train) == len(rows)
    expected = [r["text"] for r in rows if example_hash(Row(r["text"], None, 0)) < 0.2 * 2**64]
    assert dev == expected and 20 < len(dev) < 70  # original row order kept
    assert train == [r["text"] for r in rows if r["text"] not in set(dev)]


def test_dev_max_keeps_the_smallest_hashes(tokenizer, tmp_path):
    rows = labeled(200, [0, 1])
    data = load(tokenizer, make_task(tmp_path, rows, labeled(4, [0, 1])), dev_max=5)
    by_hash = sorted(rows, key=lambda r: example_hash(Row(r["text"], None, 0)))
    assert sorted(decoded(tokenizer, data.dev)) == sorted(r["text"] for r in by_hash[:5])
    assert len(data.train) == 195  # the rest of the hashed-out rows went back to train


def test_no_dev_examples_is_a_user_error(tokenizer, tmp_path):
    cfg = make_task(tmp_path, labeled(4, [0, 1]), labeled(2, [0, 1]))
    with pytest.raises(UserError, match=r"tasks\.toy: no dev examples .*dev_fraction"):
        load(tokenizer, cfg, dev_fraction=1e-9)


def test_max_train_and_max_eval_are_fixed_subsets(tokenizer, tmp_path):
    rows, evaluation = labeled(200, [0, 1]), labeled(50, [1, 0], seed=1)
    full = load(tokenizer, make_task(tmp_path / "a", rows, evaluation))
    small = load(tokenizer, make_task(tmp_path / "a", rows, evaluation), max_train=30, max_eval=10)
    shuffled = load(tokenizer, make_task(tmp_path / "b", random.Random(2).sample(rows, 200),
                                         random.Random(3).sample(evaluation, 50)), max_train=30, max_eval=10)
    assert decoded(tokenizer, small.dev) == decoded(tokenizer, full.dev)  # dev does not depend on max_train
    train, evaluated = decoded(tokenizer, small.train), decoded(tokenizer, small.eval)
    assert len(train) == 30 and len(evaluated) == 10
    assert sorted(train) == sorted(decoded(tokenizer, shuffled.train))
    assert sorted(evaluated) == sorted(decoded(tokenizer, shuffled.eval))
    smallest = sorted(decoded(tokenizer, full.train), key=lambda t: example_hash(Row(t, None, 0)))[:30]
    assert set(train) == set(smallest)
    assert train == [t for t in decoded(tokenizer, full.train) if t in set(train)]  # row order kept


def test_truncation_counted_per_split(tokenizer, tmp_path):
    train = labeled(20, [0, 1]) + [{"text": long_text(50, seed=i), "label": i % 2} for i in range(3)]
    evaluation = labeled(3, [0, 1], seed=1) + [{"text": long_text(50), "label": 1}]
    data = load(tokenizer, make_task(tmp_path, train, evaluation, max_len=40, truncation="tail"))
    assert data.truncated == {"train": 3, "eval": 1}  # train counts train and dev: both come from split train
    assert max(len(e.ids) for e in data.train + data.dev + data.eval) == 40


# batches --------------------------------------------------------------------------------------------

def batches(examples: list[Example], batch_size: int, pad_id: int, seed: int | None = None):
    """The collated batches finetune's loop makes of `examples` (lib.data.encoding.batch_indices)."""
    return [collate([examples[i] for i in group], pad_id) for group in batch_indices(examples, batch_size, seed)]


def examples_of_lengths(lengths: list[int]) -> list[Example]:
    return [Example(list(range(10, 10 + n)), [0] * (n - 1) + [1], label) for label, n in enumerate(lengths)]


def test_padding_and_attention_mask():
    (batch,) = batches(examples_of_lengths([3, 5, 2]), batch_size=3, pad_id=PAD)
    assert batch.labels.tolist() == [1, 0, 2]  # longest first, labels travel with their examples
    assert batch.input_ids.tolist() == [[10, 11, 12, 13, 14], [10, 11, 12, PAD, PAD], [10, 11, PAD, PAD, PAD]]
    assert batch.segment_ids.tolist() == [[0, 0, 0, 0, 1], [0, 0, 1, 0, 0], [0, 1, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[True] * 5, [True] * 3 + [False] * 2, [True] * 2 + [False] * 3]
    assert batch.input_ids.dtype == batch.segment_ids.dtype == batch.labels.dtype == torch.long
    assert batch.attention_mask.dtype == torch.bool


def test_batches_cover_every_example_once_and_follow_the_seed():
    rng = random.Random(0)
    examples = examples_of_lengths([rng.randint(3, 40) for _ in range(1000)])

    def run(seed):
        return [b.labels.tolist() for b in batches(examples, batch_size=8, pad_id=PAD, seed=seed)]

    for seed in (None, 0):
        labels = [label for batch in run(seed) for label in batch]
        assert sorted(labels) == list(range(1000))
    assert run(0) == run(0) and run(0) != run(1)
    assert sorted(map(sorted, run(0))) != sorted(map(sorted, run(1)))  # different batches, not just reordered
    # within a chunk batches are sorted by length: far less padding than batches of random examples
    padding = sum((~b.attention_mask).sum().item() for b in batches(examples, 8, PAD, seed=0))
    assert padding < 0.2 * sum(len(e.ids) for e in examples)
    lengths = [b.attention_mask.sum(1).tolist() for b in batches(examples, 8, PAD)]
    assert [n for batch in lengths for n in batch] == sorted((len(e.ids) for e in examples), reverse=True)


# real data ------------------------------------------------------------------------------------------

@pytest.mark.skipif(not (SHARED_DATA / "sst2").is_dir(), reason="needs ../shared/data/sst2")
def test_sst2(tokenizer):
    trained = ROOT / "data" / "tokenizer"
    if (trained / "tokenizer.json").is_file():
        tokenizer = load_tokenizer(trained)
    cfg = TaskConfig(source=str(SHARED_DATA / "sst2"), eval_splits=["validation"], max_len=64)
    data = TYPE.load("sst2", cfg, tokenizer, special_ids(tokenizer, SpecialTokens()), dev_fraction=0.1,
                     dev_max=100, max_train=200, max_eval=100)
    assert data.label_names == ["0", "1"] and len(data.dev) == 100
    assert len(data.train) == 200 and len(data.eval) == 100
    for examples in (data.train, data.dev, data.eval):
        assert {e.label for e in examples} == {0, 1}
        assert all(e.ids[0] == BOS and e.ids[-1] == EOS and 3 <= len(e.ids) <= 64 for e in examples)
    lengths = [len(e.ids) for e in data.eval]  # full sentences: about 20 words
    assert 10 < sum(lengths) / len(lengths) < 64


def test_a_type_that_generates_predicts_through_the_one_scoring_path(monkeypatch):
    """predict_all runs a type's predict_batch on each collated batch (a fake type here, registered for this
    test only, that "generates" each example's length): batched by length, predictions back in input order."""
    from lib import tasks
    from lib.config.params import ImplConfig
    from lib.models.architectures import build_model
    from lib.models.config import TransformerConfig
    from lib.tasks.base import TaskData
    from lib.tasks.model import HeadConfig, TaskModel
    from lib.tasks.scoring import predict_all

    batches = []

    class Generating(type(TYPE)):
        name = "fake"

        def predict_batch(self, model, batch, examples, task):
            batches.append(batch["input_ids"].shape)
            return [f"{len(e.ids)} tokens" for e in examples]

    monkeypatch.setitem(tasks.TYPES, Generating.name, Generating())
    examples = [Example([1] + [5] * n + [2], [0] * (n + 2), 0) for n in (7, 1, 4, 1, 9, 3)]
    task = TaskData("toy", ["a", "b"], [], [], examples, "test", {}, {}, type=Generating.name)
    model = TaskModel(build_model(TransformerConfig(vocab_size=8, d_model=8, n_heads=2, n_layers=1, d_ff=16,
                                                    max_positions=16)), HeadConfig(2, hidden=4))
    predicted = predict_all(model, task, examples, 2, 0, torch.device("cpu"), ImplConfig(precision="fp32"))
    assert predicted == [f"{len(e.ids)} tokens" for e in examples]
    assert sorted(tuple(shape) for shape in batches) == [(2, 3), (2, 6), (2, 11)]  # the lengths 3 3, 5 6, 9 11
