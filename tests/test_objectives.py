"""Objectives: the registry, the trainer contract, gradients, and overfitting one batch with a tiny model."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from lib.config.errors import UserError
from lib.config.params import CorpusConfig, Corpora, ElectraConfig, MLMConfig, ModelConfig, Params, load_params
from lib.data.packed import PackedWriter
from lib.data.windows import TaggedWindows
from lib.models.architectures import EncoderDecoder, Transformer
from lib.models.folder import load_model
from lib.objectives import (OBJECTIVES, BatchPlan, Objective, build_objective, load_objective, objective_extras,
                            save_objective)
from lib.objectives import electra as electra_module
from lib.objectives.electra import Electra, roc_auc
from lib.objectives.sentence import sentence_pairs
from tests.helpers import ROOT, TOY_SPECIAL, TOY_VOCAB, counting_batch, counting_rows

DEFAULT_POSITION = load_params(ROOT / "params.yaml").model.position  # the default chain's
METRICS = {
    "clm": {"loss", "accuracy"},
    "mlm": {"loss", "accuracy"},
    "electra": {"loss", "gen_loss", "disc_loss", "gen_accuracy", "disc_accuracy", "replaced_recall", "disc_auc"},
    "bilm": {"loss", "accuracy", "forward_loss", "backward_loss", "forward_accuracy", "backward_accuracy"},
}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from threads, and two threads on a busy 2-core machine run 100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_params(**sections) -> Params:
    corpus = CorpusConfig(source="unused")
    model = ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, dropout=0.0, max_positions=64)
    params = Params(corpora=Corpora(pretrain=corpus, domain=corpus), tasks={}, model=model)
    return dataclasses.replace(params, **sections)


def build(name: str, seed: int = 0, **sections) -> Objective:
    torch.manual_seed(seed)
    return build_objective(name, tiny_params(**sections), TOY_VOCAB, TOY_SPECIAL)


def test_registry_builds_every_objective():
    assert set(OBJECTIVES) >= {"clm", "mlm", "electra", "plm", "bilm"}
    rope = dataclasses.replace(tiny_params().model, position="rope")  # relative positions, which plm needs
    for name, cls in OBJECTIVES.items():
        objective = build(name, model=rope)
        assert type(objective) is cls and objective.name == name
        assert isinstance(objective.backbone(), EncoderDecoder if cls.encoder_decoder else Transformer)
        assert objective.backbone().cfg.causal is cls.causal


def test_unknown_objective_names_the_key_and_the_choices():
    assert {"clm", "electra", "mlm"} <= set(OBJECTIVES)
    with pytest.raises(UserError, match=f"objective: 'bert' is not one of {', '.join(sorted(OBJECTIVES))}$"):
        build_objective("bert", tiny_params(), TOY_VOCAB, TOY_SPECIAL)


@pytest.mark.parametrize("name", ["clm", "mlm", "electra", "bilm"])
def test_forward_contract(name):
    objective = build(name)
    tokens, word_starts = counting_rows()
    loss, metrics = objective(TaggedWindows(tokens, word_starts))
    assert loss.dim() == 0 and torch.isfinite(loss) and loss.requires_grad
    assert set(metrics) == METRICS[name]
    for value in metrics.values():
        assert value.dim() == 0 and not value.requires_grad and torch.isfinite(value)
    assert metrics["loss"] == loss.detach()
    loss.backward()


@pytest.mark.parametrize("name", ["clm", "mlm", "electra", "bilm"])
def test_seeded_validation_is_reproducible(name):
    """The trainer validates under a fixed seed: the same seed gives the same loss."""
    objective = build(name).eval()
    tokens, word_starts = counting_rows()
    with torch.no_grad():
        torch.manual_seed(7)
        first, _ = objective(TaggedWindows(tokens, word_starts))
        torch.manual_seed(7)
        again, _ = objective(TaggedWindows(tokens, word_starts))
        other, _ = objective(TaggedWindows(tokens, word_starts))
    assert first == again
    assert name in ("clm", "bilm") or other != first  # masking objectives draw new masks


def test_clm_loss_is_next_token_cross_entropy():
    objective = build("clm").eval()
    tokens, word_starts = counting_rows()
    loss, metrics = objective(TaggedWindows(tokens, word_starts))
    logits = objective.model.lm_logits(objective.model(tokens[:, :-1]))
    expected = F.cross_entropy(logits.reshape(-1, TOY_VOCAB), tokens[:, 1:].reshape(-1))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert metrics["accuracy"] == (logits.argmax(-1) == tokens[:, 1:]).float().mean()


def test_clm_is_causal():
    """Changing a later token does not change the loss terms of earlier positions' predictions."""
    objective = build("clm").eval()
    tokens, _ = counting_rows(rows=1)
    changed = tokens.clone()
    changed[0, 20] = 7
    before = objective.model(tokens[:, :-1])[0, :20]
    after = objective.model(changed[:, :-1])[0, :20]
    assert torch.allclose(before, after, atol=1e-5)


def test_bilm_directions_never_see_the_tokens_they_predict():
    """The forward stack's state at t reads tokens ..t only, the backward one's tokens t.. only; each
    does change with the side it reads, so a stack that sees both ways, or one that is not reversed, fails."""
    objective = build("bilm").eval()
    tokens, _ = counting_rows(rows=1)
    t = 20
    later, earlier = tokens.clone(), tokens.clone()
    later[0, t + 1:] = 7
    earlier[0, :t] = 7
    with torch.no_grad():
        forward = {name: objective.forward_stack(x)[0] for name, x in [("base", tokens), ("later", later),
                                                                          ("earlier", earlier)]}
        backward = {name: objective.backward_states(x)[0] for name, x in [("base", tokens), ("later", later),
                                                                             ("earlier", earlier)]}
    torch.testing.assert_close(forward["later"][:t + 1], forward["base"][:t + 1], atol=1e-5, rtol=0)
    assert not torch.allclose(forward["earlier"][t], forward["base"][t], atol=1e-3)
    torch.testing.assert_close(backward["earlier"][t:], backward["base"][t:], atol=1e-5, rtol=0)
    assert not torch.allclose(backward["later"][t], backward["base"][t], atol=1e-3)


@pytest.mark.parametrize("tie", [True, False])
def test_bilm_shares_the_embeddings_and_the_softmax_and_nothing_else(tie):
    objective = build("bilm", model=dataclasses.replace(tiny_params().model, tie_embeddings=tie))
    forward, backward = objective.forward_stack, objective.backward_stack
    assert backward.embeddings is forward.embeddings and backward.head is forward.head
    backward_own = {id(p) for p in backward.parameters()} - {id(p) for p in forward.parameters()}
    blocks_and_norm = {id(p) for m in (backward.blocks, backward.norm) for p in m.parameters()}
    assert backward_own == blocks_and_norm
    # what a model folder keeps beside the backbone, so that adapt continues both directions
    extras = objective_extras(objective)
    assert extras and all(name.startswith(("backward_stack.blocks.", "backward_stack.norm.")) for name in extras)
    loss, _ = objective(counting_batch())
    loss.backward()
    assert forward.embeddings.token.weight.grad is not None and all(p.grad is not None for p in backward.blocks.parameters())


def test_bilm_folder_round_trip_keeps_both_directions(tmp_path):
    """The model folder is the forward stack (a causal model); objective.safetensors holds the backward one."""
    saved = build("bilm", seed=0)
    save_objective(saved, tmp_path)
    loaded = build("bilm", seed=1)
    assert load_objective(loaded, tmp_path)
    batch = counting_batch()
    with torch.no_grad():
        expected, got = saved.eval()(batch)[1], loaded.eval()(batch)[1]
    assert got["forward_loss"] == expected["forward_loss"] and got["backward_loss"] == expected["backward_loss"]
    assert load_model(tmp_path).cfg.causal


def test_bilm_loss_is_the_mean_of_next_and_previous_token_cross_entropy():
    """By hand, in the original order: the forward state at t predicts token t+1, the backward one token t-1."""
    objective = build("bilm").eval()
    tokens, word_starts = counting_rows()
    loss, metrics = objective(TaggedWindows(tokens, word_starts))
    with torch.no_grad():
        forward_logits = objective.forward_stack.lm_logits(objective.forward_stack(tokens[:, :-1]))
        backward_logits = objective.forward_stack.lm_logits(objective.backward_states(tokens[:, 1:]))
    forward = F.cross_entropy(forward_logits.reshape(-1, TOY_VOCAB), tokens[:, 1:].reshape(-1))
    backward = F.cross_entropy(backward_logits.reshape(-1, TOY_VOCAB), tokens[:, :-1].reshape(-1))
    assert metrics["forward_loss"].item() == pytest.approx(forward.item(), rel=1e-5)
    assert metrics["backward_loss"].item() == pytest.approx(backward.item(), rel=1e-5)
    assert loss.item() == pytest.approx((forward + backward).item() / 2, rel=1e-5)


def test_bilm_learns_both_directions():
    history = train(build("bilm"), 150, 3e-3)
    for direction in ("forward", "backward"):
        assert mean(history[-10:], f"{direction}_loss") < 0.25 * mean(history[:10], f"{direction}_loss")


@pytest.mark.parametrize("mode", [{}, {"whole_word": True}, {"span": True}])
def test_mlm_logits_only_at_selected_positions(monkeypatch, mode):
    objective = build("mlm", mlm=MLMConfig(**mode))
    seen = []
    real = objective.model.lm_logits
    monkeypatch.setattr(objective.model, "lm_logits", lambda h: seen.append(h.shape) or real(h))
    tokens, word_starts = counting_rows(rows=16)
    torch.manual_seed(3)
    loss, metrics = objective(TaggedWindows(tokens, word_starts))
    n_real = (tokens[:, :-1] != TOY_SPECIAL["eos"]).sum().item()
    (n, d), = seen
    assert d == 32 and 0 < n and abs(n - 0.15 * n_real) < 0.05 * n_real
    assert 0.0 <= metrics["accuracy"] <= 1.0


def train(objective: Objective, steps: int, lr: float = 3e-3) -> list[dict[str, float]]:
    """Adam on one fixed batch; per-step metrics."""
    tokens, word_starts = counting_rows()
    optimizer = torch.optim.Adam(objective.parameters(), lr=lr)
    history = []
    for _ in range(steps):
        loss, metrics = objective(TaggedWindows(tokens, word_starts))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        history.append({k: v.item() for k, v in metrics.items()})
    return history


def mean(history: list[dict[str, float]], key: str) -> float:
    return sum(h[key] for h in history) / len(history)


@pytest.mark.parametrize("name, steps, lr", [("clm", 150, 3e-3), ("mlm", 300, 1e-2), ("bilm", 150, 3e-3)])
def test_overfits_one_batch(name, steps, lr):
    """(Fresh masks every step: mlm learns to fill them in from context, not to memorise them.)"""
    history = train(build(name), steps, lr)
    first, last = history[:10], history[-10:]
    assert mean(first, "loss") > 0.75 * math.log(TOY_VOCAB)
    assert mean(last, "loss") < 0.25 * mean(first, "loss")
    assert mean(last, "accuracy") > 0.7


def test_electra_learns_one_batch():
    """The discriminator learns to spot replacements; the (8-wide) generator improves more slowly."""
    history = train(build("electra"), 300, 3e-3)
    first, last = history[:10], history[-10:]
    assert mean(last, "loss") < 0.6 * mean(first, "loss")
    assert mean(last, "disc_loss") < 0.6 * mean(first, "disc_loss")
    assert mean(last, "disc_accuracy") > mean(first, "disc_accuracy") + 0.05
    assert mean(last, "replaced_recall") > 0.4 > mean(first, "replaced_recall")
    assert mean(last, "disc_auc") > max(0.8, mean(first, "disc_auc") + 0.2)
    assert mean(last, "gen_loss") < mean(first, "gen_loss") - 0.5
    assert mean(last, "gen_accuracy") > max(0.06, 3 * mean(first, "gen_accuracy"))  # chance is 1/55


def own(module: torch.nn.Module, shared: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Parameters of `module` that are not parameters of `shared`."""
    exclude = {id(p) for p in shared.parameters()}
    return [p for p in module.parameters() if id(p) not in exclude]


def fresh_losses(objective: Electra) -> tuple[torch.Tensor, torch.Tensor]:
    objective.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    gen_loss, disc_loss, _ = objective.losses(counting_batch())
    return gen_loss, disc_loss


@pytest.mark.parametrize("tie", [True, False])
def test_electra_gradients_flow_as_designed(tie):
    objective = build("electra", model=dataclasses.replace(tiny_params().model, tie_embeddings=tie))
    disc, gen, embeddings = objective.discriminator, objective.generator, objective.discriminator.embeddings
    assert objective.backbone() is disc and gen.embeddings is embeddings
    assert gen.cfg.d_model == 8 and disc.cfg.d_model == 32  # generator_width 0.25
    gen_own, disc_own = own(gen, embeddings), own(disc, embeddings)

    gen_loss, _ = fresh_losses(objective)
    gen_loss.backward()
    assert all(p.grad is not None for p in gen_own)  # the generator learns from its MLM loss
    assert embeddings.token.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in disc_own + list(objective.disc_head.parameters()))

    _, disc_loss = fresh_losses(objective)
    disc_loss.backward()
    assert all(p.grad is None for p in gen_own)  # no gradient through sampling into the generator
    assert embeddings.token.weight.grad.abs().sum() > 0
    assert embeddings.position.weight.grad.abs().sum() > 0
    assert all(p.grad is not None for p in disc.blocks.parameters())
    assert all(p.grad.abs().sum() > 0 for p in objective.disc_head.parameters())


def test_electra_unused_parameters_are_only_the_discriminator_lm_head():
    """The discriminator's LM head takes no part in the loss: its grads stay None (optimizers skip them)."""
    objective = build("electra", model=dataclasses.replace(tiny_params().model, tie_embeddings=False))
    loss, _ = objective(counting_batch())
    loss.backward()
    unused = {name for name, p in objective.named_parameters() if p.grad is None}
    assert unused == {f"discriminator.head.{n}" for n, _ in objective.discriminator.head.named_parameters()}


def test_electra_replacements_come_from_the_generator(monkeypatch):
    """Selected positions get generator samples, never special ids; the rest is the original text."""
    objective = build("electra", mlm=MLMConfig(mask_rate=0.5))
    tokens, word_starts = counting_rows(rows=16)
    seen = {}
    real = objective.discriminator.forward

    def spy(x):
        seen["x"] = x
        return real(x)

    monkeypatch.setattr(objective.discriminator, "forward", spy)
    torch.manual_seed(0)
    _, _, metrics = objective.losses(TaggedWindows(tokens, word_starts))
    corrupted, original = seen["x"], tokens[:, :-1]
    changed = corrupted != original
    assert changed.float().mean() > 0.3  # an untrained generator rarely guesses right
    assert not (corrupted[changed] < 5).any()
    assert (original[changed] != TOY_SPECIAL["eos"]).all()


def test_roc_auc_agrees_with_scikit_learn():
    from sklearn.metrics import roc_auc_score

    g = torch.Generator().manual_seed(0)
    positive = torch.rand(4000, generator=g) < 0.1
    scores = torch.randn(4000, generator=g) + positive * 0.7
    assert roc_auc(scores, positive).item() == pytest.approx(roc_auc_score(positive.numpy(), scores.numpy()), abs=1e-6)
    assert roc_auc(scores, torch.zeros(4000, dtype=torch.bool)).item() == 0.5


def test_electra_generator_width_follows_params():
    objective = build("electra", electra=ElectraConfig(generator_width=0.5))
    assert objective.generator.cfg.d_model == 16 and objective.generator.cfg.d_ff == 32


@pytest.mark.parametrize("variant", [{"position": "rope"}, {"position": "alibi", "norm": "post"},
                                     {"embedding_size": 16, "share_layers": True}])
def test_electra_builds_on_model_variants(variant):
    """The generator shares the discriminator's embeddings whatever their size or position scheme."""
    objective = build("electra", model=dataclasses.replace(tiny_params().model, **variant))
    loss, _ = objective(counting_batch())
    loss.backward()
    assert torch.isfinite(loss) and objective.generator.embeddings is objective.discriminator.embeddings


# Sentence-level tasks (SOP, NSP) on top of mlm ---------------------------------------------------

def pair_parts(ids: list[int]) -> tuple[list[int], list[int]]:
    """(A, B) of one row laid out as [bos] A [eos] B [eos] pad..."""
    assert ids[0] == TOY_SPECIAL["bos"]
    first = ids.index(TOY_SPECIAL["eos"])
    second = ids.index(TOY_SPECIAL["eos"], first + 1)
    assert all(t == TOY_SPECIAL["pad"] for t in ids[second + 1:])
    return ids[1:first], ids[first + 1:second]


@pytest.mark.parametrize("task", ["sop", "nsp"])
def test_sentence_pairs_cut_one_document_and_label_the_flips(task):
    torch.manual_seed(0)
    tokens, word_starts = counting_rows(rows=64)  # eos at 13: the longest stretch is 14..32
    pairs = sentence_pairs(tokens, word_starts, task, TOY_SPECIAL, 32)
    assert pairs.tokens.shape == (64, 32) and set(pairs.labels.tolist()) == {0, 1}
    for r in range(64):
        ids = pairs.tokens[r].tolist()
        a, b = pair_parts(ids)
        stretch = tokens[r, 14:14 + 29].tolist()  # 32 - 3 tokens of room for text
        n = 1 + len(a) + 1 + len(b) + 1
        assert pairs.attention_mask[r].tolist() == [True] * n + [False] * (32 - n)
        assert pairs.segments[r, :n].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        assert a and b
        if pairs.labels[r] == 0:
            assert a + b == stretch  # in order, cut once, never across the eos at 13
        elif task == "sop":
            assert b + a == stretch
        else:
            assert a == stretch[: len(a)] and b == tokens[(r + 1) % 64, 14:14 + len(b)].tolist()


def test_sentence_pairs_skip_windows_without_room_to_cut():
    row = torch.tensor([[7, TOY_SPECIAL["eos"], 8, TOY_SPECIAL["eos"], 9, TOY_SPECIAL["eos"]]])
    pairs = sentence_pairs(row, torch.ones_like(row, dtype=torch.bool), "sop", TOY_SPECIAL, 5)
    assert pairs.labels.tolist() == [-100]
    assert pairs.tokens[0].tolist() == [TOY_SPECIAL["bos"], 7, TOY_SPECIAL["eos"], TOY_SPECIAL["pad"], TOY_SPECIAL["pad"]]


@pytest.mark.parametrize("task", ["sop", "nsp"])
def test_mlm_with_a_sentence_task_trains_its_head_outside_the_backbone(task):
    objective = build("mlm", mlm=MLMConfig(sentence=task))
    tokens, word_starts = counting_rows()
    loss, metrics = objective(TaggedWindows(tokens, word_starts))
    assert set(metrics) == {"loss", "accuracy", "mlm_loss", f"{task}_loss", f"{task}_accuracy"}
    assert metrics["loss"].item() == pytest.approx((metrics["mlm_loss"] + metrics[f"{task}_loss"]).item(), rel=1e-5)
    loss.backward()
    assert all(p.grad is not None for p in objective.sentence_head.parameters())
    backbone = {id(p) for p in objective.backbone().parameters()}
    assert not backbone & {id(p) for p in objective.sentence_head.parameters()}
    assert any(name.startswith("sentence_head") for name in objective_extras(objective))


def test_sop_is_learnable():
    """Rows count up, so the order of two pieces is visible: SOP accuracy must rise well above chance."""
    objective = build("mlm", mlm=MLMConfig(sentence="sop", mask_rate=0.05))
    history = train(objective, 400, 3e-3)
    assert mean(history[:40], "sop_accuracy") < 0.7 and mean(history[-40:], "sop_accuracy") > 0.85


def test_flops_per_token_counts_what_each_objective_computes():
    """CLM runs its LM head at every position, MLM at the masked share only; ELECTRA adds its generator
    (head at the masked share) and replaced-token head to a discriminator that runs no LM head; bilm is
    two CLMs."""
    clm, mlm, electra = build("clm"), build("mlm"), build("electra")
    T, rate = 32, mlm.masking.mask_rate
    backbone = mlm.backbone()
    head = backbone.flops_per_token(T) - backbone.flops_per_token(T, predicted=0.0)
    assert head == 6 * (32 * 32 + 32 * TOY_VOCAB) and clm.flops_per_token(T) == clm.backbone().flops_per_token(T)
    assert mlm.flops_per_token(T) == pytest.approx(backbone.flops_per_token(T) - (1 - rate) * head)
    generator = electra.generator.flops_per_token(T, predicted=rate)
    assert 0 < generator < electra.discriminator.flops_per_token(T, predicted=0.0)
    assert electra.flops_per_token(T) == pytest.approx(generator + electra.discriminator.flops_per_token(T, predicted=0.0)
                                                       + 6 * (32 * 32 + 32))
    assert build("bilm").flops_per_token(T) == 2 * clm.flops_per_token(T)  # two stacks, the shared head run by each
    sop = build("mlm", mlm=MLMConfig(sentence="sop"))
    assert sop.flops_per_token(T) == pytest.approx(mlm.flops_per_token(T) + 6 * (32 * 32 + 32 * 2) / T)


@pytest.mark.parametrize("position", [DEFAULT_POSITION, pytest.param("learned", marks=pytest.mark.xfail(
    strict=True, reason="with learned absolute positions the discriminator reads no context yet after 500 steps "
    "(bench/electra_context.py: not within 3,000 in 3 seeds, rope within 300); strict, so a fix that shortens "
    "that plateau must drop this mark"))])
def test_electra_discriminator_learns_from_context(monkeypatch, position):
    """With replacements drawn from the text's own token distribution (uniform over ids 5..59 here, as
    in `counting_rows`), a token's identity says nothing: only its neighbours tell a replaced one
    (it breaks the row's count). Trained on fresh batches, the discriminator must rank unseen rows'
    replacements far above their originals; one that reads no context stays at AUC 0.5."""
    model = ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, dropout=0.0, max_positions=64, position=position)
    objective = build("electra", model=model)
    uniform = torch.zeros(TOY_VOCAB)
    uniform[:5] = float("-inf")
    monkeypatch.setattr(electra_module, "sample", lambda logits: torch.distributions.Categorical(
        logits=uniform.expand(len(logits), -1)).sample())
    optimizer = torch.optim.Adam(objective.parameters(), lr=3e-3)
    for step in range(500):
        loss, _ = objective(counting_batch(rows=32, seed=step + 1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    objective.eval()
    with torch.no_grad():
        aucs = [float(objective(counting_batch(rows=32, seed=10_000 + i))[1]["disc_auc"]) for i in range(4)]
    assert min(aucs) > 0.8, aucs


@pytest.mark.parametrize("knowledge, units", [("none", ()), ("phrase", ("phrase",)), ("entity", ("entity",)),
                                              ("both", ("phrase", "entity"))])
def test_masking_objectives_ask_for_their_knowledge_units(tmp_path, knowledge, units):
    """The batches of mlm and electra carry, as word starts, where a unit of each kind mlm.knowledge
    names starts; clm masks nothing and reads the word starts."""
    flags = {"word": [1, 0, 1, 0, 1, 1, 0, 1], "phrase": [1, 1, 0, 0, 1, 1, 1, 0], "entity": [1, 1, 1, 0, 0, 1, 0, 1]}
    for split in ("train", "valid"):
        with PackedWriter(tmp_path / split, TOY_VOCAB, TOY_SPECIAL["eos"], units=("phrase", "entity")) as writer:
            writer.add([list(range(10, 18))], [flags["word"]], {unit: [flags[unit]] for unit in ("phrase", "entity")})
    plan = BatchPlan(tmp_path, tmp_path / "none", seq_len=8, batch_size=1, eval_batches=1, seed=0,
                     batch_key="pretrain.batch_size", share=lambda n, key: slice(None), tokenizer=tmp_path / "none")
    for name in ("mlm", "electra", "clm"):
        batches = build(name, mlm=MLMConfig(knowledge=knowledge)).batches(plan)
        read = units if name != "clm" else ()
        expected = [all(flags[kind][i] for kind in read or ("word",)) for i in range(8)] + [True]  # then the eos
        assert batches.valid[0].word_starts[0].tolist() == expected
        assert batches.train.batch(0).word_starts[0].tolist() == expected  # the one window there is
