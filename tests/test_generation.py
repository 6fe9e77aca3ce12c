"""Generation (lib/models/generation.py) with our tiny T5 and BART: greedy decoding and beam search are
transformers' generate() on the same model exported to it, token for token; a padded batch decodes as its rows
alone; and beam search wide enough to keep every prefix finds the best of all sequences, scored by the model
without a cache."""
import itertools

import pytest
import torch

from lib.config.params import ModelConfig
from lib.models.architectures import build_model
from lib.models.architectures.encoder_decoder import EncoderDecoder, seq2seq_config
from lib.models.folder import save_model
from lib.models.generation import Decoding, generate, until
from tests.test_hf_seq2seq import OURS, VOCAB, forcings_off, ours, perturb

transformers = pytest.importorskip("transformers")

SHAPES, STEPS, LENGTHS = ["t5", "bart"], 10, [9, 5, 2, 7]
# each shape's end token: one its rows write at different steps, so that under every decoding below some rows end
# with it and others run to max_new_tokens (asserted)
EOS = {"t5": 11, "bart": 60}
FEW = 8  # the small vocabulary's tokens
DECODINGS = {"greedy": Decoding(max_new_tokens=STEPS), "beams": Decoding(3, 1.0, STEPS),
             "beams-short": Decoding(3, 0.6, STEPS), "beams-long": Decoding(3, 2.0, STEPS)}


def sources(pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of LENGTHS tokens, padded to the longest."""
    ids = torch.randint(5, VOCAB, (len(LENGTHS), max(LENGTHS)), generator=torch.Generator().manual_seed(4))
    mask = (torch.arange(max(LENGTHS))[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    return ids.masked_fill(mask == 0, pad), mask


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, tuple[EncoderDecoder, torch.nn.Module]]:
    """Per shape: our tiny model (tests/test_hf_seq2seq.py) and transformers' from its folder."""
    models = {}
    for shape in SHAPES:
        model, folder = ours(shape, tied=True), tmp_path_factory.mktemp(shape)
        save_model(model, folder, OURS[shape])
        models[shape] = model, transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    return models


@pytest.mark.parametrize("name", DECODINGS)
@pytest.mark.parametrize("shape", SHAPES)
def test_generation_is_transformers(shape, name, exported):
    model, theirs = exported[shape]
    decoding, pad, eos = DECODINGS[name], OURS[shape]["pad"], EOS[shape]
    ids, mask = sources(pad)
    tokens = generate(model, ids, mask, decoding, eos)
    beams = {} if decoding.num_beams == 1 else dict(length_penalty=decoding.length_penalty, early_stopping=True)
    theirs.generation_config = forcings_off(model, pad, eos, do_sample=False, num_beams=decoding.num_beams,
                                            max_new_tokens=STEPS, **beams)
    with torch.no_grad():
        expected = theirs.generate(ids, attention_mask=mask)
    lengths = [len(row) for row in tokens]
    assert min(lengths) < STEPS and max(lengths) == STEPS  # rows ended by the end token, rows ended by the limit
    assert tokens == [until(row, eos) for row in expected[:, 1:].tolist()]
    if decoding.num_beams > 1:  # the search finds what greedy decoding does not
        assert tokens != generate(model, ids, mask, DECODINGS["greedy"], eos)


@pytest.mark.parametrize("name", ["greedy", "beams"])
@pytest.mark.parametrize("shape", SHAPES)
def test_a_padded_batch_decodes_as_its_rows_alone(shape, name, exported):
    model, decoding, eos = exported[shape][0], DECODINGS[name], EOS[shape]
    ids, mask = sources(OURS[shape]["pad"])
    alone = [generate(model, ids[r:r + 1, :n], mask[r:r + 1, :n], decoding, eos)[0] for r, n in enumerate(LENGTHS)]
    assert generate(model, ids, mask, decoding, eos) == alone


def sequence_scores(model: EncoderDecoder, source: torch.Tensor, sequences: torch.Tensor) -> torch.Tensor:
    """The summed log-probabilities of `sequences` (N, T) after `source` (1, S), from one forward each (no cache)."""
    start = torch.full_like(sequences[:, :1], model.cfg.decoder_start)
    with torch.no_grad():
        hidden = model(source.expand(len(sequences), -1), torch.cat([start, sequences[:, :-1]], dim=1))
        log_probs = torch.log_softmax(model.lm_logits(hidden).float(), dim=-1)
    return log_probs.gather(2, sequences[:, :, None])[:, :, 0].sum(1)


def small_vocabulary(shape: str) -> EncoderDecoder:
    """Our model of `shape` over FEW tokens: its end token is often among a step's best, and every sequence of a
    few tokens can be counted."""
    torch.manual_seed(0)
    sizes = ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64, dropout=0.0, max_positions=32)
    model = build_model(seq2seq_config(sizes, shape, 2, FEW, OURS[shape])).eval()
    perturb(model, 0.5)
    return model


@pytest.mark.parametrize("shape", SHAPES)
def test_beam_search_over_few_tokens_is_transformers(shape, tmp_path):
    """With the end token often among a step's K best, the K beams that run on come from the 2K best continuations
    (transformers' rule): taking them from the K best alone decodes some of these 64 sources otherwise."""
    model, eos, pad = small_vocabulary(shape), OURS[shape]["eos"], OURS[shape]["pad"]
    save_model(model, tmp_path, OURS[shape])
    theirs = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(3, FEW, (64, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    for decoding in (Decoding(2, 2.0, 5), Decoding(3, 1.0, 5)):
        theirs.generation_config = forcings_off(model, pad, eos, do_sample=False, num_beams=decoding.num_beams,
                                                length_penalty=decoding.length_penalty, early_stopping=True,
                                                max_new_tokens=decoding.max_new_tokens)
        with torch.no_grad():
            expected = theirs.generate(ids, attention_mask=mask)
        assert generate(model, ids, mask, decoding, eos) == [until(row, eos) for row in expected[:, 1:].tolist()]


@pytest.mark.parametrize("shape", SHAPES)
def test_beam_search_keeping_every_prefix_finds_the_best_sequence(shape):
    """With FEW (8) tokens and 64 beams every prefix of up to 2 tokens runs on, so beam search over 3 steps is exact:
    its answer is the best-scoring of all sequences that end with eos or at the third token, whatever the length
    penalty. A cache read in the wrong order or a score counted wrong would answer another."""
    model, vocab, steps, eos = small_vocabulary(shape), FEW, 3, OURS[shape]["eos"]
    source = torch.randint(3, vocab, (1, 6), generator=torch.Generator().manual_seed(1))
    words = [t for t in range(vocab) if t != eos]
    every = [torch.tensor([[*prefix, last] for prefix in itertools.product(words, repeat=n) for last in lasts])
             for n, lasts in ((0, [eos]), (1, [eos]), (2, range(vocab)))]
    scores = [sequence_scores(model, source, sequences) for sequences in every]
    answers = set()
    for penalty in (0.0, 1.0, 2.0):
        scored = [(score / len(sequence) ** penalty, until(sequence, eos))
                  for sequences, of in zip(every, scores) for sequence, score in zip(sequences.tolist(), of.tolist())]
        best = max(scored)[1]
        found = generate(model, source, torch.ones_like(source), Decoding(vocab ** 2, penalty, steps), eos)[0]
        assert found == best
        answers.add(tuple(best))
    assert len(answers) > 1  # the penalty changes the answer: lengths are compared


def test_decodings_that_cannot_decode_are_refused():
    for field, value in (("num_beams", 0), ("max_new_tokens", 0)):
        with pytest.raises(ValueError, match=field):
            Decoding(**{field: value})
