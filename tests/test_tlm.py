"""XLM's translation LM: pair rows as XLM builds them (positions restarting at the translation, each
side's language), windows that carry languages, and a masked word read from its translation, which
masked LM on the same sentences unpaired cannot do."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from lib.config.errors import UserError
from lib.config.params import ParallelCorpusConfig, ParamsError, TLMConfig
from lib.data.packed import PackedTokens, PackedWriter
from lib.data.pairs import PairBatches
from lib.data.windows import TaggedWindows, WindowBatches, Windows
from lib.objectives import BatchPlan, check_objective
from lib.objectives.masking import mask_tokens
from lib.objectives.tlm import WindowAndPairBatches, WindowsAndPairs
from tests.helpers import TOY_SPECIAL, TOY_VOCAB
from tests.test_objectives import build, one_thread, tiny_params  # noqa: F401 (the fixture applies here too)

EOS, PAD = TOY_SPECIAL["eos"], TOY_SPECIAL["pad"]
FIRST = len(TOY_SPECIAL)
WORDS = 10  # "English" ids FIRST..FIRST+9; "German" translates each to id + WORDS


def write_pairs(prefix, pairs: list[tuple[list[int], list[int]]], languages=("en", "de")) -> PackedTokens:
    """Pairs packed as the tokenizer stage packs them: side a as document 2i, side b as 2i + 1."""
    with PackedWriter(prefix, TOY_VOCAB, EOS, languages=languages) as writer:
        docs = [side for pair in pairs for side in pair]
        writer.add(docs, [[1] * len(doc) for doc in docs], languages=[code for _ in pairs for code in languages])
    return PackedTokens(prefix)


def translated(rows: int, length: int, rng: np.random.Generator) -> list[tuple[list[int], list[int]]]:
    english = rng.integers(FIRST, FIRST + WORDS, (rows, length))
    return [(list(map(int, sentence)), list(map(int, sentence + WORDS))) for sentence in english]


def test_a_pair_row_is_both_sides_with_positions_restarting_and_their_languages(tmp_path):
    packed = write_pairs(tmp_path / "p", [([5, 6, 7], [30, 31]), ([8], [33, 34, 35, 36, 37, 38])])
    # the model lists the languages in another order than the file: rows follow the model's
    pairs = PairBatches(packed, ["de", "en"], batch_size=2, max_len=8, seed=0, pad_id=PAD)
    rows = pairs.rows_of(np.array([0, 1]))
    tokens, starts, languages, positions, mask = (rows.tokens, rows.word_starts, rows.language_ids, rows.position_ids,
                                                  rows.attention_mask)
    assert tokens.tolist() == [[5, 6, 7, EOS, 30, 31, EOS],
                               [8, EOS, 33, 34, 35, EOS, PAD]]  # side b cut to max_len / 2, its eos kept
    assert positions.tolist() == [[0, 1, 2, 3, 0, 1, 2], [0, 1, 0, 1, 2, 3, 0]]
    assert languages.tolist() == [[1, 1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0]]
    assert mask.tolist() == [[True] * 7, [True] * 6 + [False]]
    assert starts.dtype == torch.bool and starts[mask].all()
    assert pairs.mean_tokens() == (7 + 6) / 2
    again = PairBatches(packed, ["de", "en"], batch_size=2, max_len=8, seed=0, pad_id=PAD)
    assert torch.equal(pairs.batch(7).tokens, again.batch(7).tokens)  # a step's pairs: fixed


def test_windows_carry_each_tokens_language_in_the_models_order(tmp_path):
    with PackedWriter(tmp_path / "w", TOY_VOCAB, EOS, languages=["en", "de"]) as writer:
        writer.add([[5, 6, 7], [30, 31, 32]], [[1, 1, 1], [1, 1, 1]], languages=["en", "de"])
    packed = PackedTokens(tmp_path / "w")
    rows = WindowBatches(packed, 8, 1, seed=0, languages=["de", "en"])
    batch = rows.batch(0)
    assert batch.tokens[0].tolist() == [5, 6, 7, EOS, 30, 31, 32, EOS]
    assert batch.language_ids[0].tolist() == [1] * 4 + [0] * 4
    assert type(WindowBatches(packed, 8, 1, seed=0).batch(0)) is Windows  # no languages asked: none carried


def test_a_language_the_model_lacks_stops_in_one_line(tmp_path):
    packed = write_pairs(tmp_path / "p", [([5], [30])])
    with pytest.raises(UserError, match=r"p.json: languages \['en', 'de'\], but model.languages is \['en'\]"):
        PairBatches(packed, ["en"], batch_size=1, max_len=8, seed=0, pad_id=PAD)


def bilingual(position: str = "rope"):
    return dataclasses.replace(tiny_params().model, languages=["en", "de"], position=position)


def tlm(pair_batch: int = 16):
    return build("tlm", model=bilingual(), tlm=TLMConfig(pair_batch=pair_batch))


class UnlearnableWindows:
    """Training windows of random tokens, all of the first language."""

    def __init__(self, rng: np.random.Generator, rows: int = 2, length: int = 17):
        self.rng, self.rows, self.length = rng, rows, length

    def batch(self, step: int, micro: int = 0) -> TaggedWindows:
        tokens = torch.from_numpy(self.rng.integers(FIRST, TOY_VOCAB, (self.rows, self.length)))
        return TaggedWindows(tokens, torch.ones_like(tokens, dtype=torch.bool), torch.zeros_like(tokens))


def test_tlm_reads_a_masked_word_from_its_translation_and_mlm_cannot(tmp_path):
    """Sentences of independent words, each with a word-for-word translation. TLM learns to fill a
    word masked on one side from the other side (above 80%); MLM trained on the same sentences as
    unpaired text stays near chance (1/10) on the same test, for nothing in a sentence tells a word."""
    rng = np.random.default_rng(0)
    packed = write_pairs(tmp_path / "p", translated(512, 4, rng))
    pairs = PairBatches(packed, ["en", "de"], batch_size=32, max_len=16, seed=0, pad_id=PAD)
    torch.manual_seed(0)
    objective = tlm(pair_batch=32)
    objective.read_pairs(pairs.mean_tokens(), 32 / (2 * 17))
    batches = WindowAndPairBatches(UnlearnableWindows(rng), pairs)
    control = build("mlm", model=bilingual())
    for model in (objective, control):
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        for step in range(500):
            batch = batches.batch(step)
            if model is objective:
                loss, _ = model(batch)
            else:  # the same sentences, one side at a time, with their languages
                tokens, languages, mask = batch.pairs.tokens, batch.pairs.language_ids, batch.pairs.attention_mask
                side = torch.rand(()) < 0.5
                seen = mask & ((languages == 1) == side)
                loss, _ = model(TaggedWindows(torch.where(seen, tokens, PAD), seen, languages))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    test = PairBatches(write_pairs(tmp_path / "test", translated(256, 4, np.random.default_rng(1))), ["en", "de"],
                       batch_size=256, max_len=16, seed=0, pad_id=PAD).batch(0)
    tokens, starts, languages, positions, mask = (test.tokens, test.word_starts, test.language_ids, test.position_ids,
                                                  test.attention_mask)
    torch.manual_seed(1)
    masked = mask_tokens(tokens, starts, TOY_SPECIAL, TOY_VOCAB, tiny_params().mlm)
    accuracy = {}
    for name, model in (("tlm", objective), ("mlm", control)):
        backbone = model.eval().backbone()
        with torch.no_grad():
            hidden = backbone(masked.inputs, attention_mask=mask, language_ids=languages, position_ids=positions)
            predicted = backbone.lm_logits(hidden).argmax(-1)
        accuracy[name] = (predicted == tokens)[masked.selected].float().mean().item()
    assert accuracy["tlm"] > 0.8 and accuracy["mlm"] < 0.3, accuracy


def test_forward_contract_and_flops_count_the_pairs(tmp_path):
    packed = write_pairs(tmp_path / "p", translated(8, 5, np.random.default_rng(0)))
    pairs = PairBatches(packed, ["en", "de"], batch_size=4, max_len=16, seed=0, pad_id=PAD)
    objective = tlm(pair_batch=4)
    with pytest.raises(RuntimeError, match="batches"):
        objective.flops_per_token(16)
    windows = 2 * 16  # a micro-batch of 2 windows of 16 tokens, and 4 pairs of (5 + eos) x 2 tokens
    objective.read_pairs(pairs.mean_tokens(), 4 / windows)
    backbone = objective.backbone()
    spent = windows * backbone.flops_per_token(16, predicted=0.15) + 4 * 12 * backbone.flops_per_token(12, predicted=0.15)
    assert objective.flops_per_token(16) * windows == pytest.approx(spent)
    loss, metrics = objective(WindowsAndPairs.of(UnlearnableWindows(np.random.default_rng(0)).batch(0), pairs.batch(0)))
    assert set(metrics) == {"loss", "accuracy", "mlm_loss", "tlm_loss", "tlm_accuracy"}
    assert metrics["loss"] == pytest.approx(float(metrics["mlm_loss"] + metrics["tlm_loss"]))
    loss.backward()
    assert objective.backbone().embeddings.language.weight.grad.abs().sum() > 0


def test_tlm_batches_are_tagged_windows_with_pairs_beside_them(tmp_path):
    """tlm builds its batches itself: mlm's windows with their languages, tlm.pair_batch pairs beside
    each, the pairs' files listed after the windows' (what the run's fingerprint counts), and it
    learns what the pairs cost."""
    rng = np.random.default_rng(0)
    for split in ("train", "valid"):
        (tmp_path / "tokens").mkdir(exist_ok=True), (tmp_path / "parallel").mkdir(exist_ok=True)
        write_pairs(tmp_path / "parallel" / split, translated(8, 5, rng))
        with PackedWriter(tmp_path / "tokens" / split, TOY_VOCAB, EOS, languages=["en", "de"]) as writer:
            writer.add([[5, 6, 7, 8] * 5, [30, 31, 32] * 5], [[1] * 20, [1] * 15], languages=["en", "de"])
    objective = tlm(pair_batch=4)
    plan = BatchPlan(tokens=tmp_path / "tokens", parallel=tmp_path / "parallel", seq_len=8, batch_size=2,
                     eval_batches=2, seed=0, batch_key="pretrain.batch_size", share=lambda n, key: slice(None),
                     tokenizer=tmp_path / "none")
    batches = objective.batches(plan)
    for batch in [batches.train.batch(3), *batches.valid]:
        assert isinstance(batch, WindowsAndPairs) and batch.tokens.shape == (2, 9) and len(batch.pairs) == 4
        german, english = batch.tokens >= 30, (batch.tokens >= FIRST) & (batch.tokens < 30)
        assert (batch.language_ids[german] == 1).all() and (batch.language_ids[english] == 0).all()
    assert len(batches.valid) == 2
    assert [split.prefix for split in batches.splits] == [tmp_path / folder / split for folder in ("tokens", "parallel")
                                                          for split in ("train", "valid")]
    assert objective.flops_per_token(8) > objective.backbone().flops_per_token(8, predicted=0.15)


def test_languages_and_pairs_stop_at_start_without_each_other():
    with pytest.raises(ParamsError, match=r"^objective: tlm trains on translation pairs"):
        check_objective(dataclasses.replace(tiny_params(), objective="tlm"))
    parallel = dataclasses.replace(tiny_params().corpora, parallel={"en_de": ParallelCorpusConfig(
        source="unused", languages=["en", "de"])})
    with pytest.raises(ParamsError, match=r"^corpora.parallel: its text of several languages trains with objective: "
                                          r"mlm, tlm, bart, t5 \(which read each token's language, or each side as "
                                          r"text\), not clm"):
        check_objective(dataclasses.replace(tiny_params(), objective="clm", model=bilingual(), corpora=parallel))
    for objective in ("t5", "bart"):  # each side a text of its own, as mBART denoises every language it translates
        check_objective(dataclasses.replace(tiny_params(), objective=objective, model=bilingual(), corpora=parallel))
    check_objective(dataclasses.replace(tiny_params(), objective="clm", model=bilingual()))  # no pairs: fine
    with pytest.raises(ParamsError, match=r"^tlm.pair_batch: 0 must be >= 1"):
        TLMConfig(pair_batch=0).validate("tlm")
