"""Encoder-decoder corruption: T5's span corruption reassembles the row, BART's noises keep what they promise."""
from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from lib.config.params import DenoisingConfig, ParamsError, SpanCorruptionConfig
from lib.objectives.masking import IGNORE_INDEX
from lib.objectives.noising import denoise, sentence_end_table, span_corruption, span_corruption_lengths, span_counts

# id 0 is an ordinary token here, so that a function that drops 0s as "removed" fails
SPECIAL = {"pad": 1, "unk": 2, "bos": 3, "eos": 4, "mask": 5}
VOCAB = 100
SENTINELS = torch.arange(VOCAB - 1, VOCAB - 33, -1)  # as T5's: <extra_id_0> is the vocab's last id
FULL_STOP, BANG = 6, 7
START = 3  # the decoder's start id


def t5_rows(rows: int, length: int, seed: int) -> torch.Tensor:
    """Random rows of ordinary and special ids (0 included), no sentinels."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, int(SENTINELS.min()), (rows, length), generator=g)


def parse(noised, row: int) -> tuple[list[int], list[int], dict[int, list[int]]]:
    """A row's inputs and targets without padding and eos, and the targets' span of each sentinel."""
    inputs = noised.inputs[row][noised.input_mask[row]].tolist()
    targets = noised.targets[row][noised.targets[row] != IGNORE_INDEX].tolist()
    assert inputs[-1] == SPECIAL["eos"] and targets[-1] == SPECIAL["eos"]
    spans: dict[int, list[int]] = {}
    for token in targets[:-1]:
        if token in SENTINELS.tolist():
            spans[token] = []
            current = token
        else:
            spans[current].append(token)
    return inputs[:-1], targets[:-1], spans


def reassemble(inputs: list[int], spans: dict[int, list[int]]) -> list[int]:
    return [t for token in inputs for t in (spans[token] if token in spans else [token])]


def corrupt(tokens: torch.Tensor, cfg: SpanCorruptionConfig | None = None, sentinels=SENTINELS):
    return span_corruption(tokens, sentinels, SPECIAL["eos"], SPECIAL["pad"], START, cfg or SpanCorruptionConfig())


@pytest.mark.parametrize("length", [2, 3, 5, 17, 64])
def test_span_corruption_reassembles_the_row(length):
    cfg = SpanCorruptionConfig(noise_density=0.3)
    num_noise, num_spans = span_counts(length, cfg)
    for seed in range(100):
        tokens = t5_rows(4, length, seed)
        torch.manual_seed(seed)
        noised = corrupt(tokens, cfg)
        for row in range(4):
            inputs, targets, spans = parse(noised, row)
            assert reassemble(inputs, spans) == tokens[row].tolist()
            in_order = SENTINELS[:len(spans)].tolist()
            assert [t for t in inputs if t in spans] == in_order == [t for t in targets if t in spans]
            assert all(spans.values())  # no empty span
            assert sum(map(len, spans.values())) == num_noise
            assert len(spans) in (num_spans, num_spans + 1)


def test_lengths_match_span_corruption_lengths():
    cfg = SpanCorruptionConfig()
    length = 50
    expected_in, expected_out = span_corruption_lengths(length, cfg)
    torch.manual_seed(0)
    noised = corrupt(t5_rows(2000, length, 0), cfg)
    in_lengths = noised.input_mask.sum(1)
    out_lengths = (noised.targets != IGNORE_INDEX).sum(1)
    extra = in_lengths - expected_in
    assert set(extra.tolist()) == {0, 1}  # both kinds occur: a wrapped span adds a sentinel
    assert torch.equal(out_lengths - expected_out, extra)  # ... to the inputs and to the targets
    assert (expected_in, expected_out) == (50 - 8 + 3 + 1, 8 + 3 + 1)  # 8 noise tokens in 3 spans


@pytest.mark.parametrize("length,density", [(100, 0.15), (512, 0.15), (40, 0.5)])
def test_noise_share_is_the_density(length, density):
    torch.manual_seed(1)
    noised = corrupt(t5_rows(8, length, 1), SpanCorruptionConfig(noise_density=density))
    for row in range(8):
        spans = parse(noised, row)[2]
        assert sum(map(len, spans.values())) == round(length * density)


def test_first_and_last_tokens_are_noise_at_the_density():
    """Without seqio's roll the last token is always noise and the first never."""
    torch.manual_seed(2)
    length = 20
    noised = corrupt(t5_rows(4000, length, 2))  # 3 noise tokens in each row: 15%
    sentinels = torch.isin(noised.inputs, SENTINELS)
    first = sentinels[:, 0].float().mean()
    last = sentinels.gather(1, noised.input_mask.sum(1, keepdim=True) - 2).float().mean()  # before eos
    assert first == pytest.approx(0.15, abs=0.03)
    assert last == pytest.approx(0.15, abs=0.03)


def test_two_token_rows():
    torch.manual_seed(3)
    tokens = torch.tensor([[0, 9]] * 50)
    noised = corrupt(tokens)
    assert noised.inputs.shape == (50, 3) and noised.targets.shape == (50, 3)  # one kept, one noise
    for row in range(50):
        inputs, _, spans = parse(noised, row)
        assert reassemble(inputs, spans) == [0, 9]


def test_too_few_sentinels():
    tokens = t5_rows(2, 100, 4)  # 15 noise tokens in 5 spans, 6 when one wraps
    with pytest.raises(ValueError, match="needs up to 6 sentinels"):
        corrupt(tokens, sentinels=SENTINELS[:5])
    corrupt(tokens, sentinels=SENTINELS[:6])


def check_padding(noised, pad: int):
    """Padding where the masks say, and decoder inputs = start + targets shifted right."""
    assert (noised.inputs[~noised.input_mask] == pad).all()
    lengths = noised.input_mask.sum(1)
    assert torch.equal(noised.input_mask, torch.arange(noised.inputs.shape[1]) < lengths[:, None])
    assert noised.input_mask[:, -1].any()  # padded to the longest row, no further
    target_pad = noised.targets == IGNORE_INDEX
    assert torch.equal(noised.decoder_inputs[:, 0], torch.full_like(lengths, START))
    shifted = noised.targets.masked_fill(target_pad, pad)[:, :-1]
    assert torch.equal(noised.decoder_inputs[:, 1:], shifted)


def test_span_corruption_padding_and_decoder_inputs():
    torch.manual_seed(5)
    noised = corrupt(t5_rows(64, 30, 5))
    assert len(set(noised.input_mask.sum(1).tolist())) == 2  # rows with and without a wrapped span
    check_padding(noised, SPECIAL["pad"])


def bart_rows(rows: int = 64, length: int = 96, seed: int = 0, vocab: int = VOCAB):
    """Windows of text: words of 1-3 tokens, a sentence end every ~6 words, an eos now and then, id 0 often."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(8, vocab, (rows, length), generator=g)
    u = torch.rand(rows, length, generator=g)
    word_starts = torch.rand(rows, length, generator=g) < 0.5
    tokens[u < 0.05] = 0
    tokens[(u > 0.5) & (u < 0.55) & word_starts] = FULL_STOP
    tokens[(u > 0.6) & (u < 0.61) & word_starts] = BANG
    tokens[(u > 0.7) & (u < 0.71)] = SPECIAL["eos"]
    tokens[(u > 0.8) & (u < 0.805)] = SPECIAL["unk"]
    special = torch.isin(tokens, torch.tensor(list(SPECIAL.values())))
    word_starts |= special  # a special token is a word, and the token after it starts one, as a tokenizer has it
    word_starts[:, 1:] |= special[:, :-1]
    return tokens, word_starts


def sentence_ends(vocab: int = VOCAB) -> torch.Tensor:
    table = torch.zeros(vocab, dtype=torch.bool)
    table[[FULL_STOP, BANG]] = True
    return table


def noise(tokens, word_starts, vocab: int = VOCAB, ends=None, **settings):
    """denoise with every noise off but `settings`."""
    off = dict(mask_ratio=0.0, permute_sentences=0.0)
    cfg = DenoisingConfig(**{**off, **settings})
    return denoise(tokens, word_starts, sentence_ends(vocab) if ends is None else ends, SPECIAL, vocab, START, cfg)


def row_inputs(noised, row: int) -> list[int]:
    inputs = noised.inputs[row][noised.input_mask[row]].tolist()
    assert inputs[-1] == SPECIAL["eos"]
    return inputs[:-1]


def is_special(token: int) -> bool:
    return token in SPECIAL.values()


SETTINGS = {
    "bart paper": {"mask_ratio": 0.3, "permute_sentences": 1.0},
    "token masking": {"mask_ratio": 0.3, "mask_unit": "token", "replace_length": -1},
    "token deletion": {"mask_ratio": 0.3, "mask_unit": "token", "replace_length": 0},
    "everything": {"mask_ratio": 0.3, "random_ratio": 0.3, "insert_ratio": 0.1, "permute_sentences": 0.5,
                   "rotate": 0.5},
}


@pytest.mark.parametrize("name", SETTINGS)
def test_targets_are_the_original_row(name):
    tokens, word_starts = bart_rows()
    torch.manual_seed(0)
    noised = noise(tokens, word_starts, **SETTINGS[name])
    eos = torch.full((len(tokens), 1), SPECIAL["eos"])
    assert torch.equal(noised.targets, torch.cat([tokens, eos], 1))
    check_padding(noised, SPECIAL["pad"])


def test_without_noise_the_inputs_are_the_original():
    tokens, word_starts = bart_rows()
    noised = noise(tokens, word_starts)
    assert torch.equal(noised.inputs, noised.targets) and noised.input_mask.all()


def is_subsequence(short: list[int], long: list[int]) -> bool:
    rest = iter(long)
    return all(token in rest for token in short)


def test_token_deletion_removes_mask_ratio_of_the_tokens_in_order():
    tokens, word_starts = bart_rows()
    torch.manual_seed(1)
    noised = noise(tokens, word_starts, **SETTINGS["token deletion"])
    zeros_kept = 0
    for row, original in enumerate(tokens.tolist()):
        inputs = row_inputs(noised, row)
        assert is_subsequence(inputs, original)
        deleted = Counter(original) - Counter(inputs)
        assert sum(deleted.values()) == math.ceil(0.3 * sum(not is_special(t) for t in original))
        assert not any(is_special(token) for token in deleted)
        zeros_kept += inputs.count(0)
    assert zeros_kept > 0  # id 0 is text, kept unless picked


def test_token_masking_keeps_the_length():
    tokens, word_starts = bart_rows()
    torch.manual_seed(2)
    noised = noise(tokens, word_starts, **SETTINGS["token masking"])
    inputs = noised.inputs[:, :-1]
    assert inputs.shape == tokens.shape and noised.input_mask.all()
    changed = inputs != tokens
    assert (inputs[changed] == SPECIAL["mask"]).all()
    assert not torch.isin(tokens[changed], torch.tensor(list(SPECIAL.values()))).any()
    non_special = ~torch.isin(tokens, torch.tensor(list(SPECIAL.values())))
    assert torch.equal(changed.sum(1), (non_special.sum(1) * 0.3).ceil().long())


def words_of(word_starts: list[bool]) -> list[range]:
    bounds = [i for i, start in enumerate(word_starts) if start or i == 0] + [len(word_starts)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def test_word_masking_never_splits_a_word():
    tokens, word_starts = bart_rows()
    word_starts[:, 0] = False  # a window that begins mid-word
    torch.manual_seed(3)
    noised = noise(tokens, word_starts, mask_ratio=0.3, mask_unit="word", replace_length=-1)
    masked = noised.inputs[:, :-1] == SPECIAL["mask"]
    for row in range(len(tokens)):
        words = words_of(word_starts[row].tolist())
        whole = [bool(masked[row, list(w)].all()) for w in words]
        assert all(whole[i] or not masked[row, list(w)].any() for i, w in enumerate(words))
        candidates = sum(not is_special(int(tokens[row, w[0]])) for w in words)
        assert sum(whole) == math.ceil(0.3 * candidates)


def test_span_infilling_puts_one_mask_per_span_and_inserts():
    """Rows of distinct ids, so the kept tokens show where each removed stretch was."""
    vocab = 2000
    tokens, word_starts = bart_rows(rows=64, length=96, seed=4, vocab=vocab)
    tokens = torch.arange(8, 8 + tokens.numel()).view_as(tokens) % (vocab - 8) + 8
    torch.manual_seed(4)
    noised = noise(tokens, word_starts, vocab=vocab, ends=torch.zeros(vocab, dtype=torch.bool), mask_ratio=0.3)
    stretches = masks_in_stretches = insertions = removed_words = words = 0
    for row, original in enumerate(tokens.tolist()):
        where = {token: i for i, token in enumerate(original)}
        starts = word_starts[row].tolist()
        starts[0] = True
        inputs = row_inputs(noised, row) + [None]  # a sentinel for the row's end
        previous, masks = -1, 0
        for token in inputs:
            if token == SPECIAL["mask"]:
                masks += 1
                continue
            position = len(original) if token is None else where[token]
            gap = range(previous + 1, position)
            if gap:
                assert masks >= 1, f"row {row}: tokens {list(gap)} removed without a mask"
                assert starts[gap[0]] and (gap[-1] + 1 == len(original) or starts[gap[-1] + 1])  # whole words
                stretches += 1
                masks_in_stretches += masks
                removed_words += sum(starts[i] for i in gap)
            else:
                insertions += masks
            previous, masks = position, 0
        words += sum(starts)
    assert insertions > 0  # 0-length spans
    assert masks_in_stretches < 1.3 * stretches  # one mask per span, adjacent spans make more than one
    assert 0.2 < removed_words / words <= 0.3  # overlapping spans remove less than the budget


def split_sentences(row: list[int]) -> list[tuple[int, ...]]:
    sentences, current = [], []
    for i, token in enumerate(row):
        current.append(token)
        ends = token in (FULL_STOP, BANG, SPECIAL["eos"])
        if ends and (i + 1 == len(row) or row[i + 1] not in (FULL_STOP, BANG, SPECIAL["eos"])):
            sentences.append(tuple(current))
            current = []
    return sentences + [tuple(current)] if current else sentences


def test_permutation_keeps_the_sentences_and_changes_their_order():
    tokens, word_starts = bart_rows()
    # whole sentences only, so that splitting the output finds the same ones
    tokens[:, 0], tokens[:, -1] = 9, FULL_STOP
    torch.manual_seed(5)
    noised = noise(tokens, word_starts, permute_sentences=1.0)
    many = changed = 0
    for row, original in enumerate(tokens.tolist()):
        inputs = row_inputs(noised, row)
        before, after = split_sentences(original), split_sentences(inputs)
        assert Counter(before) == Counter(after)
        if len(before) >= 4:  # kept in order by 1 shuffle in 24 or fewer
            many += 1
            changed += before != after
    assert many > 20 and changed > 0.9 * many


def test_permutation_without_a_table_splits_at_eos_only():
    tokens = torch.tensor([[9, FULL_STOP, 10, SPECIAL["eos"], 11, 12, SPECIAL["eos"], 13]])
    seen = set()
    for seed in range(40):
        torch.manual_seed(seed)
        noised = denoise(tokens, torch.ones_like(tokens, dtype=torch.bool), None, SPECIAL, VOCAB, START,
                         DenoisingConfig(mask_ratio=0.0))
        seen.add(tuple(noised.inputs[0, :-1].tolist()))
    sentences = [(9, FULL_STOP, 10, SPECIAL["eos"]), (11, 12, SPECIAL["eos"]), (13,)]
    assert seen == {sum(order, ()) for order in itertools.permutations(sentences)}


def test_a_sentence_starts_a_word_wherever_it_lands():
    """Sentences that start mid-word (no flag) still start a word after the shuffle: 3 words, 2 masked."""
    tokens = torch.tensor([[10, FULL_STOP, 11, FULL_STOP, 12, FULL_STOP]])
    word_starts = torch.zeros_like(tokens, dtype=torch.bool)
    for seed in range(20):
        torch.manual_seed(seed)
        noised = noise(tokens, word_starts, permute_sentences=1.0, mask_ratio=0.5, mask_unit="word",
                       replace_length=-1)
        assert (noised.inputs == SPECIAL["mask"]).sum() == 4


def test_rotation_is_a_cyclic_shift():
    tokens, word_starts = bart_rows()
    torch.manual_seed(6)
    noised = noise(tokens, word_starts, rotate=1.0)
    offsets = set()
    for row, original in enumerate(tokens.tolist()):
        inputs = row_inputs(noised, row)
        shifts = [k for k in range(len(original)) if original[k:] + original[:k] == inputs]
        assert shifts, f"row {row} is not a rotation of the original"
        offsets.add(shifts[0])
    assert len(offsets) > 30


def test_random_replacements_and_insertions_are_never_special():
    tokens, word_starts = bart_rows()
    tokens[torch.isin(tokens, torch.tensor(list(SPECIAL.values())))] = 0  # rows of ordinary tokens only
    torch.manual_seed(7)
    noised = noise(tokens, word_starts, mask_ratio=0.3, mask_unit="token", replace_length=-1, random_ratio=1.0,
                   insert_ratio=0.1)
    inputs = noised.inputs[:, :-1]
    assert noised.input_mask.all() and inputs.shape[1] == 96 + math.ceil(96 * 0.1)
    assert not torch.isin(inputs, torch.tensor(list(SPECIAL.values()))).any()
    assert set(inputs.flatten().tolist()) == set(range(VOCAB)) - set(SPECIAL.values())


def test_insertion_adds_masks_and_keeps_the_row():
    tokens, word_starts = bart_rows()
    torch.manual_seed(8)
    noised = noise(tokens, word_starts, insert_ratio=0.2)
    for row, original in enumerate(tokens.tolist()):
        inputs = row_inputs(noised, row)
        assert len(inputs) == 96 + math.ceil(96 * 0.2)
        assert [t for t in inputs if t != SPECIAL["mask"]] == original


def test_sentence_end_table():
    vocab = {"[PAD]": 0, "hello": 1, ".": 2, "Ġ.": 3, "##!": 4, "e.g.": 5, "why?": 6, "Ġdot": 7, ".x": 8}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[PAD]"))
    table = sentence_end_table(tokenizer, 12)  # ids past the tokenizer's vocabulary end nothing
    assert table.nonzero().flatten().tolist() == [2, 3, 4, 5, 6]


@pytest.mark.parametrize("cfg,key", [
    (SpanCorruptionConfig(noise_density=1.0), "t5.noise_density"),
    (SpanCorruptionConfig(mean_span_length=0.5), "t5.mean_span_length"),
    (DenoisingConfig(mask_ratio=1.0), "bart.mask_ratio"),
    (DenoisingConfig(replace_length=2), "bart.replace_length"),
    (DenoisingConfig(poisson_lambda=0.0), "bart.poisson_lambda"),
    (DenoisingConfig(rotate=1.5), "bart.rotate"),
])
def test_bad_settings_name_their_key(cfg, key):
    with pytest.raises(ParamsError, match=key.replace(".", r"\.")):
        cfg.validate(key.split(".")[0])
