"""The non-transformer baselines: TF-IDF + logistic regression (learns, selects C on dev only, pairs,
multiclass, unlabeled eval) and zero-shot scoring by a causal LM (sums of label-token log-probs,
truncation, padding invariance, refusals)."""
from __future__ import annotations

import json
import random

import pytest
import torch

from lib.config.params import SpecialTokens, TokenizerConfig
from lib.data.encoding import cut, pair_lengths
from lib.data.tokenizer import special_ids, train_tokenizer
from lib.evaluation.zero_shot import label_scores, zero_shot
from lib.metrics.baselines import tfidf_baseline
from lib.models.architectures import Transformer, build_model
from lib.models.config import TransformerConfig
from lib.tasks.classification import Row

FILLER = "the a of to in movie film plot actor scene story music ending first last very quite".split()
CUES = (["great", "love", "best", "funny"], ["awful", "boring", "worst", "hate"], ["long", "short", "odd", "new"])


def sentence(rng: random.Random, words: list[str] = FILLER, lo: int = 4, hi: int = 12) -> str:
    return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))


def cue_rows(n: int, n_classes: int = 2, seed: int = 0, noise: float = 0.0) -> list[Row]:
    """Filler words plus one cue word of the row's class; with `noise`, that share of labels is random."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = i % n_classes
        words = sentence(rng).split()
        words.insert(rng.randrange(len(words) + 1), rng.choice(CUES[label]))
        rows.append(Row(" ".join(words), None, rng.randrange(n_classes) if rng.random() < noise else label))
    return rows


def task(train: list[Row], dev: list[Row], evaluation: list[Row] | None, n_classes: int = 2) -> tuple:
    """tfidf_baseline's first arguments."""
    return train, dev, evaluation, n_classes


def flipped(rows: list[Row]) -> list[Row]:
    return [row._replace(label=1 - row.label) for row in rows]


# TF-IDF ------------------------------------------------------------------------------------------

def test_tfidf_learns_a_separable_task_and_reports_json():
    rows = task(cue_rows(300), cue_rows(60, seed=1), cue_rows(80, seed=2))
    result = tfidf_baseline(*rows, ["accuracy", "f1"])
    json.dumps(result)  # goes into metrics JSON as is
    assert result["dev"]["accuracy"] >= 0.95 and result["eval"]["accuracy"] >= 0.95
    assert set(result["eval"]) == {"accuracy", "f1"} and result["c"] in (0.25, 1.0, 4.0, 16.0)
    confusion = result["confusion"]
    assert len(confusion) == 2 and sum(map(sum, confusion)) == 80
    assert (confusion[0][0] + confusion[1][1]) / 80 == pytest.approx(result["eval"]["accuracy"])
    assert result["features"] > 0 and result["seconds"] > 0


def test_c_is_chosen_on_dev_and_never_on_eval():
    """A tiny C predicts one class (dev accuracy ~0.5); flipping dev's labels makes it the better
    choice, while flipping eval's labels changes only the eval figures."""
    train, dev, evaluation = cue_rows(300, noise=0.1), cue_rows(60, seed=1), cue_rows(80, seed=2)
    grid = (1e-4, 10.0)
    base = tfidf_baseline(*task(train, dev, evaluation), ["accuracy"], c_grid=grid)
    assert base["c"] == 10.0 and base["dev"]["accuracy"] > 0.9
    eval_flipped = tfidf_baseline(*task(train, dev, flipped(evaluation)), ["accuracy"], c_grid=grid)
    assert eval_flipped["c"] == base["c"] and eval_flipped["dev"] == base["dev"]
    assert eval_flipped["eval"]["accuracy"] == pytest.approx(1 - base["eval"]["accuracy"])
    dev_flipped = tfidf_baseline(*task(train, flipped(dev), evaluation), ["accuracy"], c_grid=grid)
    assert dev_flipped["c"] == 1e-4


def test_pair_task_sees_word_overlap():
    """Label 1 when b reuses a's words: separate bags of words can not tell, the overlap features can."""
    rng = random.Random(0)
    vocabulary = [f"w{i}" for i in range(200)]

    def pair(label: int) -> Row:
        a = rng.sample(vocabulary, 8)
        b = rng.sample(a, 4) if label else rng.sample([w for w in vocabulary if w not in a], 4)
        return Row(" ".join(a), " ".join(b), label)

    rows = task(*([pair(i % 2) for i in range(n)] for n in (300, 60, 80)))
    result = tfidf_baseline(*rows, ["f1", "accuracy"], min_df=1)
    assert result["dev"]["accuracy"] >= 0.95 and result["eval"]["f1"] >= 0.95


def test_multiclass_with_char_ngrams_and_unlabeled_eval():
    rows = task(cue_rows(300, n_classes=3), cue_rows(60, n_classes=3, seed=1), None, n_classes=3)
    words = tfidf_baseline(*rows, ["accuracy", "mcc"])
    chars = tfidf_baseline(*rows, ["accuracy", "mcc"], char_ngrams=(2, 4))
    assert words["eval"] is None and words["confusion"] is None
    assert words["dev"]["mcc"] >= 0.9 and chars["dev"]["mcc"] >= 0.9
    assert chars["features"] > words["features"]


# Zero-shot ---------------------------------------------------------------------------------------

LABEL_WORDS = [" great", " terrible", " greatest"]  # " greatest" shares " great"'s first token


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    rng = random.Random(0)
    texts = [sentence(rng, FILLER + ["great", "terrible", "yes", "no", "It", "was"]) for _ in range(300)]
    return train_tokenizer(texts, TokenizerConfig(algorithm="bpe", vocab_size=300, min_frequency=1),
                           tmp_path_factory.mktemp("baselines") / "tokenizer")


@pytest.fixture(scope="module")
def special(tokenizer):
    return special_ids(tokenizer, SpecialTokens())


def causal_lm(tokenizer, causal: bool = True, dropout: float = 0.0) -> Transformer:
    torch.manual_seed(0)
    return build_model(TransformerConfig(vocab_size=tokenizer.get_vocab_size(), d_model=32, n_layers=2, n_heads=2,
                                         d_ff=64, dropout=dropout, max_positions=40, causal=causal)).eval()


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def direct_score(lm: Transformer, bos: int, prompt: list[int], label: list[int]) -> float:
    """log P(label | [bos] prompt), one unpadded sequence, token by token."""
    sequence = torch.tensor([[bos, *prompt, *label]])
    with torch.no_grad():
        logp = torch.log_softmax(lm.lm_logits(lm(sequence)), dim=-1)[0]
    return sum(logp[len(prompt) + k, token].item() for k, token in enumerate(label))


def test_scores_are_summed_label_token_log_probs_after_the_cut_prompt(tokenizer, special):
    lm = causal_lm(tokenizer)
    labels = [ids(tokenizer, word) for word in LABEL_WORDS]
    assert len(labels[1]) > 1 and len(labels[2]) > 1 and labels[2][0] == labels[0][0]  # multi-token, shared prefix
    rng = random.Random(1)
    rows = [Row(sentence(rng), None, 0), Row(sentence(rng, lo=60, hi=60), None, 0)]  # the second is cut
    max_len, template = 40, "{text} It was"
    scores = label_scores(lm, tokenizer, special, rows, template=template, label_words=LABEL_WORDS,
                          max_len=max_len, truncation="head_tail")
    suffix = ids(tokenizer, " It was")
    budget = max_len - 1 - len(suffix) - max(map(len, labels))
    for r, row in enumerate(rows):
        prompt = cut(ids(tokenizer, row.a), budget, "head_tail") + suffix
        for i, label in enumerate(labels):
            assert scores[r, i].item() == pytest.approx(direct_score(lm, special["bos"], prompt, label), abs=1e-4)
    assert len(ids(tokenizer, rows[1].a)) > budget


def test_pair_template(tokenizer, special):
    lm = causal_lm(tokenizer)
    rng = random.Random(2)
    rows = [Row(sentence(rng, lo=30, hi=30), sentence(rng, lo=3, hi=3), 0)]
    template, words = "{text} was{text_pair}?", [" yes", " no"]
    scores = label_scores(lm, tokenizer, special, rows, template=template, label_words=words, max_len=30,
                          truncation="tail")
    a, b = ids(tokenizer, rows[0].a), ids(tokenizer, rows[0].b)
    labels = [ids(tokenizer, word) for word in words]
    room = 30 - 1 - len(ids(tokenizer, " was")) - len(ids(tokenizer, "?")) - max(map(len, labels))
    len_a, len_b = pair_lengths(len(a), len(b), room)
    prompt = cut(a, len_a, "tail") + ids(tokenizer, " was") + cut(b, len_b, "tail") + ids(tokenizer, "?")
    for i, label in enumerate(labels):
        assert scores[0, i].item() == pytest.approx(direct_score(lm, special["bos"], prompt, label), abs=1e-4)


def test_scores_do_not_depend_on_batching_or_dropout(tokenizer, special):
    lm = causal_lm(tokenizer, dropout=0.3).train()  # scoring must switch dropout off, then restore the mode
    rng = random.Random(3)
    short = Row(sentence(rng, lo=3, hi=3), None, 0)
    rows = [Row(sentence(rng, lo=25, hi=25), None, 0), short, Row(sentence(rng, lo=15, hi=15), None, 0)]
    options = dict(template="{text} It was", label_words=LABEL_WORDS, max_len=40, truncation="head")
    together = label_scores(lm, tokenizer, special, rows, batch_size=8, **options)
    alone = label_scores(lm, tokenizer, special, [short], **options)
    one_by_one = label_scores(lm, tokenizer, special, rows, batch_size=1, **options)
    torch.testing.assert_close(together[1], alone[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(together, one_by_one, atol=1e-4, rtol=0)
    assert lm.training
    predictions = zero_shot(lm, tokenizer, special, rows, batch_size=2, **options)
    assert predictions == together.argmax(-1).tolist() and all(0 <= p < len(LABEL_WORDS) for p in predictions)


def test_refusals(tokenizer, special):
    rows = [Row("the movie", None, 0)]
    options = dict(label_words=[" great", " terrible"], max_len=40, truncation="head")
    with pytest.raises(ValueError, match="causal"):
        zero_shot(causal_lm(tokenizer, causal=False), tokenizer, special, rows, template="{text} It was", **options)
    lm = causal_lm(tokenizer)
    with pytest.raises(ValueError, match="text_pair"):
        zero_shot(lm, tokenizer, special, rows, template="{text} or {text_pair}", **options)
    with pytest.raises(ValueError, match="no room"):
        zero_shot(lm, tokenizer, special, rows, template="{text} It was", **{**options, "max_len": 4})
