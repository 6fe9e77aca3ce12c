"""Token tagging: reading and skips, the tag set, first-subword alignment (our three tokenizer algorithms and
MiniLM's WordPiece), truncation, collate, head and loss, and decoding back to word tags scored by entity_scores."""
from __future__ import annotations

import gzip
import itertools
import json

import pytest
import torch
from tokenizers import Tokenizer

from lib.config.errors import UserError
from lib.metrics.scores import entity_scores
from lib.tasks.tagging import IGNORE, TYPE, Sentence, collate, decode, encode, loss, read_rows, tag_set
from tests.helpers import SHARED_DATA
from tests.tasktype_helpers import MINILM, bpe, fit_on_one_batch, minilm, one_thread, tokenizer, toy_task  # noqa: F401

CONLL = SHARED_DATA / "conll2003"
SENTENCES = [Sentence("EU rejects German call to boycott British lamb .".split(),
                      ["B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O"]),
             Sentence("Peter Blackburn said in Schwarzeneggerville on Monday".split(),
                      ["B-PER", "I-PER", "O", "O", "B-LOC", "O", "O"])]


def test_first_subword_carries_the_tag(tokenizer):
    tokenizer, special = tokenizer
    tags = tag_set(SENTENCES)
    features, counts = encode(SENTENCES, tokenizer, special, 64, tags)
    assert counts["truncated"] == counts["cut_words"] == 0 and counts["words"] == 16
    longest_word = 0
    for sentence, f in zip(SENTENCES, features):
        assert f.ids[0] == special["bos"] and f.ids[-1] == special["eos"] and len(f.labels) == len(f.ids)
        assert len(f.word_starts) == f.n_words == len(sentence.words)
        assert [f.labels[i] for i in f.word_starts] == [tags.index(t) for t in sentence.tags]
        assert all(label == IGNORE for i, label in enumerate(f.labels) if i not in f.word_starts)
        longest_word = max(longest_word, *(b - a for a, b in zip(f.word_starts, [*f.word_starts[1:], len(f.ids) - 1])))
        # words split as in running text (our byte-level BPE's non-first words get their leading space)
        assert f.ids[1:-1] == tokenizer.encode(" ".join(sentence.words), add_special_tokens=False).ids
    assert longest_word >= 3  # "Schwarzeneggerville" is several subwords in both tokenizers


def test_decoding_perfect_logits_scores_f1_one(tokenizer):
    tokenizer, special = tokenizer
    tags = tag_set(SENTENCES)
    features, _ = encode(SENTENCES, tokenizer, special, 64, tags)
    batch = collate(features, special["pad"])
    logits = perfect_logits(batch["labels"], len(tags))
    predicted = decode(list(logits), features, tags)
    assert predicted == [s.tags for s in SENTENCES]
    assert entity_scores([s.tags for s in SENTENCES], predicted)["f1"] == 1.0
    assert loss(logits, batch).item() < 1e-3


def perfect_logits(labels: torch.Tensor, n_tags: int) -> torch.Tensor:
    """(B, T, n_tags) logits whose argmax is the label where there is one (noise elsewhere)."""
    logits = torch.randn(*labels.shape, n_tags, generator=torch.Generator().manual_seed(0))
    tagged = labels != IGNORE
    logits[tagged] = -20.0
    logits[tagged, labels[tagged]] = 20.0
    return logits


def test_truncation_keeps_whole_words_and_decodes_cut_words_as_outside(bpe):
    tokenizer, special = bpe
    tags = tag_set(SENTENCES)
    sentence = SENTENCES[1]
    full, _ = encode([sentence], tokenizer, special, 64, tags)
    max_len = full[0].word_starts[3] + 1  # room for [bos], the first three words and [eos]
    features, counts = encode([sentence], tokenizer, special, max_len, tags)
    f = features[0]
    assert len(f.ids) <= max_len and f.ids[-1] == special["eos"] and f.word_starts == full[0].word_starts[:3]
    assert counts["truncated"] == 1 and counts["cut_words"] == len(sentence.words) - 3
    logits = perfect_logits(collate(features, special["pad"])["labels"], len(tags))
    assert decode(list(logits), features, tags) == [sentence.tags[:3] + ["O"] * (len(sentence.words) - 3)]


def test_a_word_without_subwords_gets_unk():
    tokenizer, special = minilm()
    sentence = Sentence(["Peter", "\u200b", "Blackburn"], ["B-PER", "O", "B-PER"])
    features, counts = encode([sentence], tokenizer, special, 16, tag_set([sentence]))
    assert counts["unk_words"] == 1 and features[0].ids[features[0].word_starts[1]] == special["unk"]


def test_bad_rows_are_counted_skips():
    rows = [{"tokens": ["EU", "rejects"], "ner_tags": ["B-ORG", "O"]},
            {"tokens": ["EU", "rejects"], "ner_tags": ["B-ORG"]},
            {"tokens": [], "ner_tags": []},
            {"tokens": ["EU"], "ner_tags": ["ORG"]},
            {"tokens": [None], "ner_tags": ["O"]}]
    sentences, skipped = read_rows(rows)
    assert sentences == [Sentence(["EU", "rejects"], ["B-ORG", "O"])]
    assert skipped == {"length_mismatch": 1, "empty": 1, "bad_tag": 1, "not_text": 1}


def test_tag_set_has_both_tags_of_each_train_type_and_refuses_unseen_types(bpe):
    assert tag_set(SENTENCES) == ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    tokenizer, special = bpe
    unseen = Sentence(["Reuters"], ["B-COMPANY"])
    with pytest.raises(UserError, match=r"tasks.ner: tag 'B-COMPANY' of sentence 0 is not in the tag set"):
        encode([unseen], tokenizer, special, 16, tag_set(SENTENCES), key="tasks.ner")


def test_collate_shapes(bpe):
    tokenizer, special = bpe
    features, _ = encode(SENTENCES, tokenizer, special, 64, tag_set(SENTENCES))
    batch = collate(features, special["pad"])
    longest = max(len(f.ids) for f in features)
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape == (2, longest)
    short = min(range(2), key=lambda i: len(features[i].ids))
    padding = ~batch["attention_mask"][short]
    assert padding.any() and (batch["input_ids"][short][padding] == special["pad"]).all()
    assert (batch["labels"][short][padding] == IGNORE).all() and not batch["segment_ids"].any()


@pytest.mark.skipif(not CONLL.is_dir(), reason="needs ../shared/data/conll2003")
def test_conll_first_200_sentences_align_with_minilm():
    tokenizer, special = minilm()
    with gzip.open(CONLL / "train.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in itertools.islice(f, 200)]
    sentences, skipped = read_rows(rows)
    assert len(sentences) == 200 and not skipped
    tags = tag_set(sentences)
    features, counts = encode(sentences, tokenizer, special, 128, tags)
    words = sum(len(s.words) for s in sentences)
    assert counts["words"] == words and counts["cut_words"] == 0
    assert sum(len(f.word_starts) for f in features) == words
    assert sum(label != IGNORE for f in features for label in f.labels) == words
    logits = [perfect_logits(torch.tensor(f.labels)[None], len(tags))[0] for f in features]
    assert entity_scores([s.tags for s in sentences], decode(logits, features, tags))["f1"] == 1.0


def test_a_tiny_backbone_with_the_head_learns_the_tags(bpe, one_thread):
    """The type's per-token head and loss on a real backbone: a few steps fit two sentences exactly."""
    tokenizer, special = bpe
    tags = tag_set(SENTENCES)
    features, _ = encode(SENTENCES, tokenizer, special, 64, tags)
    task = toy_task("tagging", features, tags)
    logits = fit_on_one_batch(tokenizer.get_vocab_size(), task, collate(features, special["pad"]), steps=60)
    assert TYPE.predict(logits, features, task) == [s.tags for s in SENTENCES]
    assert TYPE.units(features[0]) == len(SENTENCES[0].words)  # the loss's mean is over the tagged words


def test_a_batch_without_a_tagged_word_has_zero_loss():
    batch = {"labels": torch.full((2, 5), IGNORE)}
    logits = torch.randn(2, 5, 9, requires_grad=True)
    value = loss(logits, batch)
    value.backward()
    assert value.item() == 0.0 and not logits.grad.any()


def test_a_tokenizer_that_pads_on_its_own_is_refused():
    """MiniLM's tokenizer.json pads and truncates to 128 as saved; lib.models.hf.import_tokenizer turns that off."""
    special = minilm()[1]  # skips without MiniLM
    raw = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    with pytest.raises(ValueError, match="pads or truncates"):
        encode(SENTENCES, raw, special, 64, tag_set(SENTENCES))


def test_a_lone_space_piece_does_not_carry_the_tag(bpe):
    """A small byte-level BPE has no merge of the space with "Rollo": " Rollo" is "Ġ" + "Rollo". "Ġ" is
    the same piece for every word, so the tag goes on "Rollo"."""
    tokenizer, special = bpe
    sentence = Sentence(["founded", "Rollo"], ["O", "B-PER"])
    tags = tag_set([sentence])
    (feature,), _ = encode([sentence], tokenizer, special, 16, tags)
    pieces = [tokenizer.id_to_token(i) for i in feature.ids]
    assert "Ġ" in pieces  # the case under test: a lone space piece before the word
    assert [pieces[i] for i in feature.word_starts] == ["f", "Rollo"]
    assert [tags[feature.labels[i]] for i in feature.word_starts] == ["O", "B-PER"]
    assert sum(label != IGNORE for label in feature.labels) == 2


def test_a_causal_model_reads_each_tag_at_the_words_last_subword(bpe):
    """A causal model's state at "f" has not read "ounded": its tags sit on each word's last piece."""
    tokenizer, special = bpe
    sentence = Sentence(["founded", "Rollo"], ["O", "B-PER"])
    tags = tag_set([sentence])
    (both_ways,), _ = encode([sentence], tokenizer, special, 16, tags)
    (causal,), _ = encode([sentence], tokenizer, special, 16, tags, causal=True)
    assert causal.ids == both_ways.ids
    ends = [len(both_ways.ids) - 2, both_ways.word_starts[1] - 2]  # before [eos]; before "Ġ" + "Rollo"
    assert sorted(causal.word_starts) == sorted(ends) and both_ways.word_starts[0] not in causal.word_starts
    assert [tags[causal.labels[i]] for i in causal.word_starts] == ["O", "B-PER"]
    assert sum(label != IGNORE for label in causal.labels) == 2
