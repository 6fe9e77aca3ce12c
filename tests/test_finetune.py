"""TaskModel features and heads, ULMFiT's optimisation (groups, LRs, unfreezing), the variants on a
tiny learnable task, and the saved classifier."""
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from lib.config.params import (ElmoConfig, FinetuneConfig, FromScratchConfig, FrozenConfig, ImplConfig, PlainConfig,
                               UlmfitConfig)
from lib.models.architectures import Transformer, build_model
from lib.models.config import TransformerConfig
from lib.tasks.base import TaskData
from lib.tasks.classification import Example, collate
from lib.tasks.model import HeadConfig, ScalarMix, TaskModel, load_task_model, save_task_model
from lib.training.finetune import FullTrainer, RunResult
from lib.training.finetune_runs import numbered, summarise
from lib.training.variants import VARIANTS, run_variant
from lib.training.variants.frozen import ProbeTrainer
from tests.helpers import skip_unless_cpu_bf16, stub_tokenizer_dir

VOCAB, PAD, BOS, EOS = 40, 0, 2, 3
CFG = FinetuneConfig(tasks=["toy"], seeds=1, epochs=4, batch_size=16, ulmfit=UlmfitConfig(lr=3e-3),
                     plain=PlainConfig(lr=1e-3), from_scratch=FromScratchConfig(lr=3e-3), elmo=ElmoConfig(lr=3e-3),
                     head_hidden=16, head_dropout=0.0, patience=4)
IMPL = ImplConfig(precision="fp32", compile="off")


def backbone(causal: bool = False, **overrides) -> Transformer:
    torch.manual_seed(0)
    cfg = dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=2, d_ff=64, dropout=0.0, max_positions=32,
               causal=causal)
    return build_model(TransformerConfig(**{**cfg, **overrides}))


def example(tokens: list[int], label: int) -> Example:
    ids = [BOS, *tokens, EOS]
    return Example(ids, [0] * len(ids), label)


def toy_task(n: int = 240, seed: int = 0) -> TaskData:
    """Label 1 when token 7 occurs in the sequence: learnable by any of the variants."""
    g = torch.Generator().manual_seed(seed)
    examples = []
    for i in range(n):
        tokens = torch.randint(8, VOCAB, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()
        label = i % 2
        if label:
            tokens[int(torch.randint(0, len(tokens), (1,), generator=g))] = 7
        examples.append(example(tokens, label))
    return TaskData("toy", ["no", "yes"], examples[:160], examples[160:200], examples[200:], "test", {}, {})


@pytest.mark.parametrize("causal", [False, True])
def test_concat_pooling_ignores_padding(causal):
    model = TaskModel(backbone(causal), HeadConfig(2, "concat")).eval()
    short, long = example([9, 10, 11], 0), example([12, 13, 14, 15, 16, 17, 18], 1)
    alone = collate([short], PAD)
    padded = collate([short, long], PAD)
    with torch.no_grad():
        hidden = model.encode(alone.input_ids, alone.segment_ids, alone.attention_mask)
        features = model.features(hidden, alone.attention_mask)
        hidden_padded = model.encode(padded.input_ids, padded.segment_ids, padded.attention_mask)
        features_padded = model.features(hidden_padded, padded.attention_mask)
    assert padded.input_ids.shape[1] > alone.input_ids.shape[1]
    torch.testing.assert_close(features_padded[0], features[0], atol=1e-5, rtol=1e-5)
    token = hidden[0, -1] if causal else hidden[0, 0]  # the [eos] (last real) token for causal models, else [CLS]
    torch.testing.assert_close(features[0, :32], token)


def test_layer_groups_put_the_head_on_top_and_leave_the_lm_head_out():
    model = TaskModel(backbone(), HeadConfig(2, "concat"))
    groups = model.layer_groups()
    assert len(groups) == 2 + 2  # embeddings, 2 blocks, final norm + classifier head
    ids = [{id(p) for p in g} for g in groups]
    assert {id(p) for p in model.head.parameters()} <= ids[-1]
    assert not {id(p) for p in model.backbone.head.dense.parameters()} & set().union(*ids)
    with_lm = model.layer_groups(with_lm_head=True)
    assert {id(p) for p in model.backbone.head.dense.parameters()} <= {id(p) for p in with_lm[-1]}


def test_ulmfit_lrs_and_gradual_unfreezing(tmp_path):
    task = toy_task()
    cfg = dataclasses.replace(CFG, ulmfit=dataclasses.replace(CFG.ulmfit, unfreeze_every=2, lr_decay=2.6))
    plan = VARIANTS["ulmfit"].setup(backbone(), 2, cfg)
    trainer = FullTrainer(plan.model, plan, task, cfg, IMPL, torch.device("cpu"), PAD, 0, tmp_path, "fp", "accuracy")
    group_lr, lr = {}, cfg.ulmfit.lr
    for group in trainer.loop.optimizer.param_groups:
        group_lr[group["layer"]] = group["initial_lr"]
    assert [group_lr[i] for i in range(4)] == pytest.approx([lr / 2.6 ** 3, lr / 2.6 ** 2, lr / 2.6, lr])

    def trainable() -> list[bool]:
        return [all(p.requires_grad for p in g) for g in trainer.groups]

    assert trainable() == [False, False, False, True]  # the head's group first
    before = [p.detach().clone() for p in trainer.groups[0]]
    batches_seen = []
    for expected in ([False, False, False, True], [False, False, True, True], [False, True, True, True],
                     [True, True, True, True]):
        assert trainable() == expected
        batches_seen.append(trainer.loop.state.steps)
        for _ in range(2):  # unfreeze_every steps
            trainer.loop.state.steps += 1
            trainer._set_trainable()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.groups[0]))  # nothing trained yet here


def test_ulmfit_ablation_switches(tmp_path):
    task = toy_task()
    cfg = dataclasses.replace(CFG, ulmfit=dataclasses.replace(CFG.ulmfit, gradual_unfreezing=False, stlr=False,
                                                                warmup_frac=0.5))
    plan = VARIANTS["ulmfit"].setup(backbone(), 2, cfg)
    trainer = FullTrainer(plan.model, plan, task, cfg, IMPL, torch.device("cpu"), PAD, 0, tmp_path, "fp", "accuracy")
    assert all(p.requires_grad for g in trainer.groups for p in g)  # every group trains from the first step
    total = trainer.steps_per_epoch * cfg.epochs
    # warmup from near 0, not STLR's 1/32
    assert plan.schedule.multiplier(total)(0) == pytest.approx(1 / round(total * 0.5))
    stlr = VARIANTS["ulmfit"].setup(backbone(), 2, CFG).schedule.multiplier(total)
    assert stlr(0) == pytest.approx(1 / CFG.ulmfit.stlr_ratio)


@pytest.mark.parametrize("variant", ["ulmfit", "plain", "from_scratch", "frozen", "elmo"])
def test_every_variant_learns_the_toy_task(variant, tmp_path):
    # elmo's head reads a random backbone's frozen features: it needs more steps than a model that moves them
    cfg = dataclasses.replace(CFG, elmo=ElmoConfig(lr=1e-2), epochs=8, patience=8) if variant == "elmo" else CFG
    result, model = run_variant(variant, toy_task(), ["accuracy", "f1"], backbone(), cfg, IMPL,
                                torch.device("cpu"), 1, PAD, tmp_path, "fp")
    assert result.variant == variant and len(result.dev_curve) >= 1 and 1 <= result.best_epoch <= len(result.dev_curve)
    assert result.eval["accuracy"] > 0.7, result
    assert sum(map(sum, result.confusion)) == 40
    assert result.dev_curve[result.best_epoch - 1] == max(result.dev_curve)


def test_frozen_variant_leaves_the_backbone_untouched_and_saves_a_raw_feature_probe(tmp_path):
    adapted, task = backbone(), toy_task()
    result, model = run_variant("frozen", task, ["accuracy"], adapted, CFG, IMPL, torch.device("cpu"), 1, PAD,
                                tmp_path, "fp")
    for (name, p), q in zip(model.backbone.state_dict().items(), adapted.state_dict().values()):
        assert torch.equal(p, q), name
    batch = collate(task.eval, PAD)  # the returned model reads raw features: the standardisation is folded in
    with torch.no_grad():
        logits, _ = model.eval()(batch.input_ids, batch.segment_ids, batch.attention_mask)
    accuracy = (logits.argmax(-1) == batch.labels).float().mean().item()
    assert accuracy == pytest.approx(result.eval["accuracy"]) and result.eval["accuracy"] > 0.7


def test_scalar_mix_is_elmo_eq_1_by_hand():
    """gamma * sum_j softmax(s)_j * h_j, each h_j layer-normalised; equal weights at the start: the mean."""
    torch.manual_seed(0)
    states = [torch.randn(2, 5, 8) * scale + shift for scale, shift in ((1.0, 0.0), (3.0, 1.0), (10.0, -2.0))]
    normed = [(h - h.mean(-1, keepdim=True)) / (h.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt() for h in states]
    mix = ScalarMix(3)
    torch.testing.assert_close(mix(states), sum(normed) / 3)
    with torch.no_grad():
        mix.scalars.copy_(torch.tensor([0.5, -1.0, 2.0]))
        mix.gamma.fill_(1.7)
    e = torch.tensor([0.5, -1.0, 2.0]).exp()
    expected = 1.7 * sum(w * h for w, h in zip(e / e.sum(), normed))
    torch.testing.assert_close(mix(states), expected)
    assert mix.learned() == {"layer_weights": pytest.approx((e / e.sum()).tolist()), "gamma": pytest.approx(1.7)}


@pytest.mark.parametrize("causal", [False, True])
def test_elmo_trains_the_mix_and_the_head_and_never_the_backbone(causal, tmp_path):
    adapted, task = backbone(causal), toy_task()
    plan = VARIANTS["elmo"].setup(adapted, 2, CFG)
    model = plan.model
    assert model.mix is not None and len(model.mix.scalars) == adapted.cfg.n_layers + 1
    trainer = FullTrainer(model, plan, task, CFG, IMPL, torch.device("cpu"), PAD, 0, tmp_path, "fp", "accuracy")
    trained = {id(p) for group in trainer.groups for p in group}
    assert trained == {id(p) for m in (model.mix, model.head) for p in m.parameters()}
    before = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    batch = collate(task.train[:16], PAD)
    logits, _ = model(batch.input_ids, batch.segment_ids, batch.attention_mask)
    torch.nn.functional.cross_entropy(logits, batch.labels).backward()
    assert model.mix.scalars.grad.abs().sum() > 0 and model.mix.gamma.grad is not None
    assert all(p.grad is None for p in model.backbone.parameters())
    model.zero_grad()
    trainer.train_epoch(1)
    assert not model.backbone.training  # its features without dropout, as frozen reads them
    assert all(torch.equal(v, before[k]) for k, v in model.backbone.state_dict().items())
    assert not torch.equal(model.mix.scalars.detach(), torch.zeros(3))


def test_elmo_without_the_mix_trains_the_same_head_on_the_last_layer(tmp_path):
    adapted, task = backbone(), toy_task()
    cfg = dataclasses.replace(CFG, elmo=dataclasses.replace(CFG.elmo, mix=False))
    plan = VARIANTS["elmo"].setup(adapted, 2, cfg)
    model = plan.model
    with_mix = VARIANTS["elmo"].setup(adapted, 2, CFG).model.head_cfg
    assert model.mix is None and plan.frozen_backbone and model.head_cfg == dataclasses.replace(with_mix, mix=False)
    trainer = FullTrainer(model, plan, task, cfg, IMPL, torch.device("cpu"), PAD, 0, tmp_path, "fp", "accuracy")
    assert {id(p) for group in trainer.groups for p in group} == {id(p) for p in model.head.parameters()}


def test_elmo_reports_its_layer_weights_and_saves_its_mix(tmp_path):
    stub_tokenizer_dir(tmp_path / "tok")
    adapted, task = backbone(), toy_task()
    result, model = run_variant("elmo", task, ["accuracy"], adapted, dataclasses.replace(CFG, epochs=1), IMPL,
                                torch.device("cpu"), 1, PAD, tmp_path / "epochs", "fp")
    weights = result.learned["layer_weights"]
    assert len(weights) == 3 and sum(weights) == pytest.approx(1.0) and weights == model.mix.learned()["layer_weights"]
    assert isinstance(result.learned["gamma"], float)
    line = save_task_model(model, tmp_path / "clf", tmp_path / "tok", {"label_names": ["no", "yes"]})
    assert "scalar mix" in line
    loaded, _ = load_task_model(tmp_path / "clf")
    torch.testing.assert_close(loaded.mix.scalars, model.mix.scalars)
    batch = collate(task.eval, PAD)
    with torch.no_grad():
        torch.testing.assert_close(loaded(batch.input_ids, batch.segment_ids, batch.attention_mask)[0],
                                   model.eval()(batch.input_ids, batch.segment_ids, batch.attention_mask)[0])


def test_the_metrics_give_elmo_layer_weights_per_seed_and_mlflow_gets_them_flat():
    task = toy_task()

    def result(variant: str, seed: int, learned: dict) -> RunResult:
        return RunResult("toy", variant, seed, [0.5], 1, {"accuracy": 0.5}, {"accuracy": 0.5}, 1, 1.0, learned=learned)

    runs = [result("elmo", 1, {"layer_weights": [0.2, 0.8], "gamma": 1.5}),
            result("elmo", 2, {"layer_weights": [0.6, 0.4], "gamma": 0.5}), result("frozen", 1, {})]
    variants = summarise(task, ["accuracy"], runs)["variants"]
    assert variants["elmo"]["layer_weights"] == [[0.2, 0.8], [0.6, 0.4]] and variants["elmo"]["gamma"] == [1.5, 0.5]
    assert "layer_weights" not in variants["frozen"]
    assert numbered(runs[0].learned) == {"layer_weights_0": 0.2, "layer_weights_1": 0.8, "gamma": 1.5}


def test_a_folded_probe_predicts_the_same_under_bf16_autocast(tmp_path):
    """The frozen probe's head reads raw features through W / std and a bias that cancels W / std · mean.
    Features far from zero with a small spread (as max-pooled states are) make that cancellation
    large: in bf16 the logits were noise (an IMDb teacher scored 56.7% in finetune, 48.3% served in
    bf16). The head runs in fp32 whatever the autocast, so the served model predicts what finetune scored."""
    skip_unless_cpu_bf16()
    task = toy_task()
    adapted = backbone()
    with torch.no_grad():  # features of mean ~40 and std ~0.1: far from zero, narrowly spread
        adapted.norm.weight.mul_(0.1)  # the final LayerNorm of a pre-LN model
        adapted.norm.bias.fill_(40.0)
    result, model = run_variant("frozen", task, ["accuracy"], adapted, CFG, IMPL, torch.device("cpu"), 1, PAD,
                                tmp_path, "fp")
    assert result.eval["accuracy"] > 0.7
    batch = collate(task.eval, PAD)
    with torch.no_grad():
        fp32, _ = model.eval()(batch.input_ids, batch.segment_ids, batch.attention_mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16, _ = model(batch.input_ids, batch.segment_ids, batch.attention_mask)
    assert bf16.dtype == torch.float32
    assert (bf16.argmax(-1) == fp32.argmax(-1)).float().mean() >= 0.95


@pytest.mark.parametrize("n_classes", [2, 3])
def test_probe_head_predicts_what_the_logistic_regression_predicts(n_classes):
    """The fit goes into the head's linear layer: binary fits have one row, a class missing from train
    is never predicted."""
    g = np.random.default_rng(0)
    x = g.normal(size=(300, 8))
    y = (x[:, :n_classes - 1] > 0).sum(1) if n_classes == 3 else (x[:, 0] + 0.3 * x[:, 1] > 0).astype(int)
    fit = LogisticRegression(C=1.0).fit(x, y)
    head = torch.nn.Sequential(torch.nn.Linear(8, n_classes + 1))  # one more class than train has
    weight, bias = ProbeTrainer._linear(SimpleNamespace(model=SimpleNamespace(head=head)), fit)
    logits = torch.as_tensor(x, dtype=torch.float32) @ weight.T + bias
    assert logits.argmax(-1).tolist() == fit.predict(x).tolist()
    torch.testing.assert_close(logits[:, :n_classes].softmax(-1), torch.as_tensor(fit.predict_proba(x)).float())


def test_frozen_variant_picks_the_regularisation_on_dev(tmp_path):
    task = toy_task()
    cfg = dataclasses.replace(CFG, frozen=FrozenConfig(probe_c=[1e-4, 1.0]))
    result, _ = run_variant("frozen", task, ["accuracy"], backbone(), cfg, IMPL, torch.device("cpu"), 1, PAD, tmp_path,
                            "fp")
    assert result.history[0]["probe_c"] == 1.0 and result.best_epoch == 1  # 1e-4 leaves the probe near chance
    assert result.dev["accuracy"] == result.dev_curve[0] > 0.7


def test_aux_lm_loss_trains_the_lm_head_of_causal_models(tmp_path):
    cfg = dataclasses.replace(CFG, aux_lm_weight=0.5, epochs=1)
    plan = VARIANTS["plain"].setup(backbone(causal=True), 2, cfg)
    trainer = FullTrainer(plan.model, plan, toy_task(), cfg, IMPL, torch.device("cpu"), PAD, 0, tmp_path, "fp",
                          "accuracy")
    dense = plan.model.backbone.head.dense.weight.detach().clone()
    trainer.train_epoch(1)
    assert not torch.equal(dense, plan.model.backbone.head.dense.weight)


def test_saved_classifier_loads_and_predicts_the_same(tmp_path):
    stub_tokenizer_dir(tmp_path / "tok")
    _, model = run_variant("ulmfit", toy_task(), ["accuracy"], backbone(), dataclasses.replace(CFG, epochs=1), IMPL,
                           torch.device("cpu"), 1, PAD, tmp_path / "epochs", "fp")
    save_task_model(model, tmp_path / "clf", tmp_path / "tok", {"label_names": ["no", "yes"]})
    loaded, info = load_task_model(tmp_path / "clf")
    assert info["label_names"] == ["no", "yes"] and info["head"]["features"] == "concat"
    assert (tmp_path / "clf" / "tokenizer.json").is_file()
    batch = collate(toy_task().eval, PAD)
    model.eval()
    with torch.no_grad():
        expected, _ = model(batch.input_ids, batch.segment_ids, batch.attention_mask)
        got, _ = loaded(batch.input_ids, batch.segment_ids, batch.attention_mask)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("shape", ["bert", "electra", "gpt2"])
def test_the_plain_head_is_transformers_sequence_classification_head(shape):
    """BERT/RoBERTa: dense + tanh + linear on [CLS]; ELECTRA: GELU for tanh; causal: a linear layer
    without bias on the last token."""
    overrides = {"bert": {}, "electra": {"norm": "post", "embedding_size": 16},
                 "gpt2": {"causal": True, "norm": "pre", "embedding_norm": False, "lm_head": "linear",
                          "segment_vocab": 0}}[shape]
    head = VARIANTS["plain"].setup(backbone(**overrides), 3, CFG).model.head
    kinds = [type(m).__name__ for m in head]
    if shape == "gpt2":
        assert kinds == ["Dropout", "Linear"] and head[-1].bias is None
    else:
        assert kinds == ["Dropout", "Linear", "Tanh" if shape == "bert" else "GELU", "Dropout", "Linear"]
        assert head[-1].bias is not None


def test_a_pretrained_pooler_moves_into_the_plain_head():
    adapted = backbone(pooler=True)
    pooler = adapted.pooler.dense.weight.detach().clone()
    for variant in ("plain", "from_scratch"):
        model = VARIANTS[variant].setup(adapted, 2, CFG).model
        assert model.backbone.pooler is None and not model.backbone.cfg.pooler
        assert torch.equal(model.head[1].weight, pooler) == (variant == "plain")  # from_scratch: a fresh one
    assert adapted.pooler is not None  # setup works on a copy


def test_every_variant_has_its_settings_section_and_a_label():
    """A variant is its file and its section of FinetuneConfig, named alike (lib/training/variants)."""
    settings = FinetuneConfig()
    for name, variant in VARIANTS.items():
        assert dataclasses.is_dataclass(getattr(settings, name)), name
        assert variant.name == name and variant.label
    assert [name for name, v in VARIANTS.items() if v.random_init] == ["from_scratch"]
