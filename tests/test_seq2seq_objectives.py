"""The encoder-decoder objectives t5 and bart (lib/objectives/t5.py, bart.py, seq2seq.py) on a toy vocabulary:
their batches, loss, FLOPs, the sentinels they need, which models they fit, and exact resume in the trainer.
The corruption itself is tested in tests/test_noising.py."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, models

from lib.config.errors import UserError
from lib.config.params import (Corpora, CorpusConfig, EncoderDecoderConfig, ImplConfig, ModelConfig, Params,
                               TrainConfig)
from lib.data.packed import PackedWriter
from lib.models.architectures import EncoderDecoder
from lib.models.config import TransformerConfig
from lib.objectives import BatchPlan, build_objective
from lib.objectives.base import fitting_objective
from lib.objectives.masking import IGNORE_INDEX
from lib.objectives.noising import span_corruption_lengths
from lib.training.budget_loop import Trainer

SPECIAL = {"pad": 0, "unk": 1, "bos": 2, "eos": 3, "mask": 4}
WORDS = 55  # ids 5..59; every 7th word ends a sentence ("w12." ...)
SENTINELS = 20  # ids 60..79
VOCAB = 5 + WORDS + SENTINELS
SEQ_LEN = 32


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models gain nothing from threads on a busy machine
    yield
    torch.set_num_threads(threads)


def write_tokenizer(folder, sentinels: int = SENTINELS):
    words = [f"w{i}." if i % 7 == 5 else f"w{i}" for i in range(5, 5 + WORDS)]
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *(f"<extra_id_{i}>" for i in range(sentinels))]
    folder.mkdir(parents=True, exist_ok=True)
    Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="[UNK]")).save(
        str(folder / "tokenizer.json"))
    return folder


@pytest.fixture
def plan(tmp_path):
    rng = np.random.default_rng(0)
    for split, n_docs in (("train", 200), ("valid", 30)):
        with PackedWriter(tmp_path / "tokens" / split, VOCAB, eos_id=SPECIAL["eos"]) as writer:
            docs = [[5 + (start + i) % WORDS for i in range(rng.integers(10, 60))]
                    for start in rng.integers(0, WORDS, size=n_docs)]  # counting: learnable
            writer.add(docs, [[int(i % 2 == 0) for i in range(len(d))] for d in docs])
    return BatchPlan(tmp_path / "tokens", tmp_path / "none", seq_len=SEQ_LEN, batch_size=4, eval_batches=2, seed=1,
                     batch_key="pretrain.batch_size", share=lambda n, key: slice(None),
                     tokenizer=write_tokenizer(tmp_path / "tokenizer"))


def params(shape: str = "auto") -> Params:
    corpus = CorpusConfig(source="unused")
    model = ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, dropout=0.1, max_positions=64)
    return Params(corpora=Corpora(pretrain=corpus, domain=corpus), tasks={}, model=model,
                  encoder_decoder=EncoderDecoderConfig(shape=shape, decoder_layers=1))


def build(name: str, shape: str = "auto"):
    torch.manual_seed(0)
    return build_objective(name, params(shape), VOCAB, SPECIAL)


@pytest.mark.parametrize("name, shape", [("t5", "t5"), ("bart", "bart")])
def test_each_builds_its_own_shape_unless_told(name, shape):
    objective = build(name)
    assert isinstance(objective.backbone(), EncoderDecoder) and objective.backbone().cfg.decoder_layers == 1
    assert (objective.backbone().cfg.position == "t5") == (shape == "t5")
    other = "bart" if shape == "t5" else "t5"
    assert (build(name, other).backbone().cfg.position == "t5") == (other == "t5")  # the noising table's way


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_the_loss_is_the_decoder_s_cross_entropy_on_the_targets(name, plan):
    objective = build(name).eval()
    batches = objective.batches(plan)
    batch = batches.valid[0]
    torch.manual_seed(5)
    loss, metrics = objective(batch)
    torch.manual_seed(5)
    noised = objective.noise(batch.tokens[:, :-1], batch.word_starts[:, :-1])
    model = objective.backbone()
    logits = model.lm_logits(model(noised.inputs, noised.decoder_inputs, attention_mask=noised.input_mask))
    expected = F.cross_entropy(logits.flatten(0, 1), noised.targets.flatten(), ignore_index=IGNORE_INDEX)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert set(metrics) == {"loss", "accuracy"} and metrics["loss"] == loss.detach()
    if name == "bart":  # the decoder writes the whole original window
        assert torch.equal(noised.targets[:, :SEQ_LEN], batch.tokens[:, :SEQ_LEN])


def test_t5_s_flops_count_the_lengths_its_corruption_makes(plan):
    objective = build("t5")
    with pytest.raises(RuntimeError, match="batches"):
        objective.flops_per_token(SEQ_LEN)
    objective.batches(plan)
    source, target = span_corruption_lengths(SEQ_LEN, objective.corruption)
    assert source <= objective.lengths[0] <= source + 1 and target <= objective.lengths[1] <= target + 1
    model = objective.backbone()
    assert objective.flops_per_token(SEQ_LEN) == model.flops_per_sequence(*objective.lengths) / SEQ_LEN
    # a shorter source than the window: cheaper per window token than reading and writing it whole
    assert objective.flops_per_token(SEQ_LEN) < model.flops_per_token(SEQ_LEN)


def test_t5_needs_the_sentinels_in_the_vocabulary(plan):
    write_tokenizer(plan.tokenizer, sentinels=2)
    with pytest.raises(UserError, match=r"^objective: t5 cuts windows of 32 tokens into up to \d+ spans, and the "
                                        r"tokenizer in .* has 2 sentinel tokens .*rerun the tokenizer stage"):
        build("t5").batches(plan)


def test_the_objective_that_fits_a_model():
    seq2seq = build("bart").backbone().cfg
    t5 = build("t5").backbone().cfg
    encoder = TransformerConfig.from_params(params().model, VOCAB, causal=False)
    assert fitting_objective("mlm", t5) == "t5" and fitting_objective("clm", seq2seq) == "bart"
    assert fitting_objective("bart", t5) == "bart"  # any encoder-decoder objective trains any encoder-decoder
    assert fitting_objective("t5", encoder) == "mlm"
    with pytest.raises(UserError, match="^objective: t5 needs an encoder-decoder; use mlm$"):
        build_objective("t5", params(), VOCAB, SPECIAL, encoder)


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_a_killed_run_resumes_exactly_and_learns(name, plan, tmp_path):
    cfg = TrainConfig(seq_len=SEQ_LEN, batch_size=4, lr=1e-2, warmup_steps=3, budget_tokens=SEQ_LEN * 4 * 24,
                      eval_every=8, eval_batches=2, log_every=1, checkpoint_every=5)

    def trainer(folder, callbacks=()):
        objective = build(name)
        batches = objective.batches(plan)
        return Trainer(objective, cfg, ImplConfig(precision="fp32", compile="off"), torch.device("cpu"),
                       batches.train, batches.valid, folder, "a", seed=1, callbacks=callbacks)

    class KillAt:
        def on_log(self, step, row):
            if step == 13:
                raise KeyboardInterrupt

        def on_eval(self, step, row):
            pass

    def curve(state):
        return [(r["step"], round(r.get("train_loss", r.get("val_loss")), 6)) for r in state.history]

    uninterrupted = trainer(tmp_path / "a").fit()
    with pytest.raises(KeyboardInterrupt):
        trainer(tmp_path / "b", (KillAt(),)).fit()
    assert curve(trainer(tmp_path / "b").fit()) == curve(uninterrupted)
    valid = [r["val_loss"] for r in uninterrupted.history if "val_loss" in r]
    assert valid[-1] < valid[0]
