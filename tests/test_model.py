"""The transformer: its architectures by name, shapes, what attention may see, relative positions, ALBERT/ELECTRA sharing,
layer groups, save/load, and that it can learn at all."""
import json

import pytest
import torch
import torch.nn.functional as F

from lib.config.errors import UserError
from lib.config.params import ModelConfig
from lib.models.architectures import ARCHITECTURES, EncoderDecoder, Transformer, build_model
from lib.models.architectures.decoder import Decoder
from lib.models.architectures.encoder import Encoder
from lib.models.blocks import alibi_slopes, apply_rope, rope_cache
from lib.models.config import TransformerConfig
from lib.models.folder import EXPORT_KEY, load_model, save_model
from tests.helpers import skip_unless_cpu_bf16

POSITIONS = ["learned", "sinusoidal", "rope", "alibi", "t5"]
VOCAB = 50


def tiny(**overrides) -> TransformerConfig:
    cfg = dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=2, d_ff=64, dropout=0.0, max_positions=16)
    return TransformerConfig(**{**cfg, **overrides})


def build(**overrides) -> Transformer:
    torch.manual_seed(0)
    return build_model(tiny(**overrides)).eval()


def tokens(B=2, T=12, seed=1) -> torch.Tensor:
    return torch.randint(5, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def test_a_config_names_its_architecture():
    """One-stack configs name theirs by `causal` alone: config.json holds no name, so old folders still load;
    an encoder-decoder's names it (its tests: tests/test_encoder_decoder.py)."""
    assert type(build()) is Encoder and type(build(causal=True)) is Decoder
    assert ARCHITECTURES == {"encoder": Encoder, "decoder": Decoder, "encoder_decoder": EncoderDecoder}
    with pytest.raises(ValueError, match="causal"):
        Encoder(tiny(causal=True))


def test_the_decoder_decodes_greedily():
    model = build(causal=True)
    prompt = tokens(T=4)
    decoded = model.greedy(prompt, steps=3)
    assert decoded.shape == (2, 7) and torch.equal(decoded[:, :4], prompt)
    for t in range(4, 7):  # each token the argmax after all before it
        assert torch.equal(decoded[:, t], model.lm_logits(model(decoded[:, :t])[:, -1]).argmax(-1))
    assert torch.equal(model.greedy(prompt[1:], steps=3), decoded[1:])  # a row decodes as it does alone


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("position", POSITIONS)
def test_shapes(position, norm):
    model = build(position=position, norm=norm)
    ids = tokens()
    hidden, states = model(ids, segment_ids=torch.zeros_like(ids), attention_mask=ids > 0, output_hidden_states=True)
    assert hidden.shape == (2, 12, 32)
    assert len(states) == 3 and all(s.shape == (2, 12, 32) for s in states)
    assert model.lm_logits(hidden).shape == (2, 12, VOCAB)
    assert torch.isfinite(hidden).all()


def test_from_params_copies_every_model_key():
    params = ModelConfig(d_model=64, n_heads=8, position="rope", norm="post", segment_vocab=0)
    cfg = TransformerConfig.from_params(params, vocab_size=1000, causal=True)
    assert (cfg.vocab_size, cfg.causal, cfg.d_model, cfg.n_heads, cfg.position, cfg.norm, cfg.segment_vocab) == \
        (1000, True, 64, 8, "rope", "post", 0)


def test_bad_config_raises():
    with pytest.raises(ValueError, match="n_heads"):
        tiny(n_heads=3)
    with pytest.raises(ValueError, match="position"):
        tiny(position="relative")


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("with_mask", [False, True])  # SDPA's is_causal path and the explicit-mask path
def test_causal_attention_sees_no_future(position, with_mask):
    ids = tokens(T=10)
    changed = ids.clone()
    changed[:, 6:] = torch.randint(5, VOCAB, (2, 4))
    for causal in (True, False):
        model = build(position=position, causal=causal)
        mask = torch.ones_like(ids, dtype=torch.bool) if with_mask else None
        a, b = model(ids, attention_mask=mask), model(changed, attention_mask=mask)
        assert not torch.allclose(a[:, 6:], b[:, 6:])  # the changed tokens themselves do change
        past_same = torch.allclose(a[:, :6], b[:, :6], atol=1e-6)
        assert past_same == causal  # bidirectional models do see the changed tokens


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("position", POSITIONS)
def test_padding_does_not_leak_into_real_tokens(position, causal):
    model = build(position=position, causal=causal)
    ids = tokens(T=10)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, 7:] = False  # first row: 7 real tokens then padding
    other = ids.clone()
    other[0, 7:] = torch.tensor([0, 9, 33])
    a, b = model(ids, attention_mask=mask), model(other, attention_mask=mask)
    assert torch.allclose(a[0, :7], b[0, :7], atol=1e-6)
    assert torch.allclose(a[1], b[1], atol=1e-6)
    assert torch.isfinite(a).all()  # padding queries never get an all-masked (NaN) row
    unmasked = model(other)  # without the mask the padding is attended to
    assert causal or not torch.allclose(a[0, :7], unmasked[0, :7], atol=1e-4)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("position", POSITIONS)
def test_relative_positions_ignore_where_the_text_starts(position, causal):
    """The same 6 tokens right-padded and left-padded: with RoPE/ALiBi/T5's bias each real token sees the same
    tokens at the same distances, so its output is identical; absolute positions change it."""
    model = build(position=position, causal=causal)
    text, pad = tokens(B=1, T=6), torch.zeros(1, 4, dtype=torch.long)
    right, left = torch.cat([text, pad], 1), torch.cat([pad, text], 1)
    out_right = model(right, attention_mask=right > 0)[0, :6]
    out_left = model(left, attention_mask=left > 0)[0, 4:]
    relative = position in ("rope", "alibi", "t5")
    assert torch.allclose(out_right, out_left, atol=1e-5) == relative


def test_rope_scores_depend_only_on_distance():
    torch.manual_seed(0)
    T, d = 16, 8
    q, k = torch.randn(d), torch.randn(d)
    cos, sin = rope_cache(T, d)
    rq, rk = apply_rope(q.expand(T, d), cos, sin), apply_rope(k.expand(T, d), cos, sin)
    scores = rq @ rk.T  # scores[m, n] = q at position m . k at position n
    assert torch.allclose(scores[:-3, :-3], scores[3:, 3:], atol=1e-5)  # shift both: unchanged
    assert not torch.allclose(scores[:, :-1], scores[:, 1:], atol=1e-3)  # change the distance: changed
    assert torch.allclose(rq.norm(dim=-1), q.norm().expand(T))  # a rotation


def test_alibi_slopes_are_geometric():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -i for i in range(1, 9)]))
    six = alibi_slopes(6)  # not a power of 2: the 4-head slopes + every other 8-head slope
    assert torch.allclose(six, torch.tensor([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]))


@pytest.mark.parametrize("position", POSITIONS)
def test_max_positions(position):
    model = build(position=position)
    assert model(tokens(T=16)).shape == (2, 16, 32)
    if position in ("alibi", "t5"):  # no table to run out of: they extrapolate
        assert model(tokens(T=20)).shape == (2, 20, 32)
    else:
        with pytest.raises(ValueError, match="model.max_positions"):
            model(tokens(T=17))


def test_segments():
    model = build()
    ids = tokens()
    assert not torch.allclose(model(ids), model(ids, segment_ids=torch.ones_like(ids)))
    assert torch.allclose(model(ids), model(ids, segment_ids=torch.zeros_like(ids)))
    with pytest.raises(ValueError, match="segment_vocab"):
        build(segment_vocab=0)(ids, segment_ids=torch.zeros_like(ids))


def test_languages():
    """XLM's language embeddings: no ids = the first language; another language changes every output."""
    model = build(languages=["en", "de"])
    ids = tokens()
    assert torch.allclose(model(ids), model(ids, language_ids=torch.zeros_like(ids)))
    assert not torch.allclose(model(ids), model(ids, language_ids=torch.ones_like(ids)))
    with pytest.raises(ValueError, match="languages"):
        build()(ids, language_ids=torch.zeros_like(ids))
    with pytest.raises(ValueError, match="languages"):
        tiny(languages=["en", "en"])


@pytest.mark.parametrize("position", POSITIONS)
def test_restarting_positions_see_a_pair_like_two_texts(position):
    """XLM's translation pairs: positions restart at the second text. A token of the second text then
    gets the embeddings (learned, sinusoidal) or the distances (rope, alibi) it would have at the
    start; counting positions on from 0 (no position_ids) gives the same as 0..T-1 given."""
    model = build(position=position)
    ids = tokens(B=1, T=12)
    counted = torch.arange(12)[None]
    assert torch.allclose(model(ids), model(ids, position_ids=counted), atol=1e-6)
    restarted = torch.cat([torch.arange(6), torch.arange(6)])[None]
    first = model(ids[:, 6:], attention_mask=torch.ones(1, 6, dtype=torch.bool))
    # the second half alone, attending only to itself: as if it were the start of a text
    only_second = torch.zeros(1, 12, dtype=torch.bool)
    only_second[:, 6:] = True
    pair = model(ids, attention_mask=only_second, position_ids=restarted)
    assert torch.allclose(pair[:, 6:], first, atol=1e-5)
    assert not torch.equal(model(ids, position_ids=restarted), model(ids))  # the first text sees it restarted


def test_tied_weights_are_one_tensor():
    model = build()
    assert model.head.decoder.weight is model.embeddings.token.weight
    untied = build(tie_embeddings=False)
    assert untied.head.decoder.weight is not untied.embeddings.token.weight
    assert untied.num_params() == model.num_params() + model.cfg.padded_vocab * 32


def test_albert_factorised_embeddings():
    full, factorised = build(vocab_size=1000), build(vocab_size=1000, embedding_size=8)
    assert factorised.embeddings.token.weight.shape == (1024, 8)  # padded to a multiple of 64
    assert factorised.project.weight.shape == (32, 8)
    hidden = factorised(torch.randint(0, 1000, (2, 12)))
    assert hidden.shape == (2, 12, 32)
    assert factorised.lm_logits(hidden).shape == (2, 12, 1000)
    assert factorised.num_params() < full.num_params() - 1000 * 20


def test_vocab_padding_is_invisible():
    model = build()  # VOCAB 50 -> 64 rows
    assert model.cfg.padded_vocab == 64 and model.embeddings.token.weight.shape == (64, 32)
    logits = model.lm_logits(model(tokens()))
    assert logits.shape == (2, 12, VOCAB)
    F.cross_entropy(logits.flatten(0, 1), tokens().flatten()).backward()
    grad = model.embeddings.token.weight.grad
    assert grad[VOCAB:].abs().sum() == 0 and grad[5:VOCAB].abs().sum() > 0  # padding rows never learn
    assert build(vocab_size=128).embeddings.token.weight.shape == (128, 32)


def test_shared_layers_count_one_block():
    shared, one = build(n_layers=4, share_layers=True), build(n_layers=1)
    assert shared.num_params() == one.num_params()
    assert len(shared.blocks) == 1
    _, states = shared(tokens(), output_hidden_states=True)
    assert len(states) == 5  # the one block still runs 4 times
    assert shared.flops_per_token(16) > 3 * one.flops_per_token(16)


def test_lm_logits_on_gathered_positions():
    model = build()
    hidden = model(tokens())
    masked = torch.tensor([[0, 3], [1, 7], [1, 11]])
    gathered = hidden[masked[:, 0], masked[:, 1]]  # (N, d_model), as MLM does
    logits = model.lm_logits(gathered)
    assert logits.shape == (3, VOCAB)
    assert torch.allclose(logits, model.lm_logits(hidden)[masked[:, 0], masked[:, 1]], atol=1e-6)


@pytest.mark.parametrize("overrides, n_groups", [({}, 4), ({"share_layers": True, "n_layers": 3}, 3),
                                                 ({"tie_embeddings": False, "embedding_size": 8}, 4),
                                                 ({"norm": "post", "position": "sinusoidal"}, 4)])
def test_layer_groups_cover_every_parameter_once(overrides, n_groups):
    model = build(**overrides)
    groups = model.layer_groups()
    assert len(groups) == n_groups and all(groups)
    flat = [id(p) for group in groups for p in group]
    assert len(flat) == len(set(flat)) == len({id(p) for p in model.parameters()})
    assert model.embeddings.token.weight in groups[0]
    assert all(any(p is q for q in groups[i + 1]) for i, block in enumerate(model.blocks) for p in block.parameters())


def test_electra_generator_shares_embeddings():
    disc_cfg = tiny(d_model=64, n_heads=4, d_ff=256, embedding_size=32)
    disc = build_model(disc_cfg)
    gen_cfg = disc_cfg.scaled(0.25)
    assert (gen_cfg.d_model, gen_cfg.n_heads, gen_cfg.d_ff, gen_cfg.embedding_dim) == (16, 1, 64, 32)
    before = disc.embeddings.token.weight.detach().clone()
    gen = build_model(gen_cfg, embeddings=disc.embeddings)
    assert torch.equal(disc.embeddings.token.weight, before)  # not re-initialised by the generator
    assert gen.embeddings is disc.embeddings and gen.head.decoder.weight is disc.embeddings.token.weight
    assert gen(tokens()).shape == (2, 12, 16)
    with pytest.raises(ValueError, match="shared embeddings"):
        build_model(tiny(embedding_size=16), embeddings=disc.embeddings)


@pytest.mark.parametrize("d_model, n_heads, width, position", [(256, 4, 0.25, "learned"), (768, 12, 1 / 3, "learned"),
                                                               (256, 8, 0.25, "rope"), (96, 3, 0.3, "alibi")])
def test_scaled_keeps_heads_wide_and_dividing(d_model, n_heads, width, position):
    cfg = tiny(d_model=d_model, n_heads=n_heads, d_ff=4 * d_model, position=position).scaled(width)
    assert cfg.d_model % cfg.n_heads == 0 and cfg.head_size >= 16
    assert abs(cfg.d_model - d_model * width) <= 2 * cfg.n_heads
    assert cfg.d_ff == round(4 * d_model * width) and cfg.embedding_dim == d_model


def test_flops_per_token():
    for overrides in ({}, {"tie_embeddings": False}, {"embedding_size": 8}):
        model = build(**overrides)
        assert model.flops_per_token(16) > 6 * model.num_params(exclude_embeddings=True)
    model = build()
    d, ff, L = 32, 64, 2
    matmuls = L * (4 * d * d + 2 * d * ff) + d * d + d * VOCAB  # blocks + head dense + decoder
    assert model.flops_per_token(16) == 6 * matmuls + 12 * L * d * 16
    head = d * d + d * VOCAB
    assert model.flops_per_token(16, predicted=0.25) == 6 * (matmuls - 0.75 * head) + 12 * L * d * 16


@pytest.mark.parametrize("overrides", [{}, {"position": "rope", "causal": True, "embedding_size": 8},
                                       {"position": "sinusoidal", "share_layers": True, "norm": "post"}])
def test_save_load_round_trip(tmp_path, overrides):
    model = build(**overrides)
    with torch.no_grad():  # make the LM head's LayerNorm non-default, so a missed tensor would show
        model.head.norm.weight.mul_(1.5)
    save_model(model, tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    assert (EXPORT_KEY in json.loads((tmp_path / "m" / "config.json").read_text())) == (not overrides)
    loaded = load_model(tmp_path / "m")
    assert loaded.cfg == model.cfg and not loaded.training
    ids = tokens()
    assert torch.equal(loaded.lm_logits(loaded(ids)), model.lm_logits(model(ids)))
    assert loaded.head.decoder.weight is loaded.embeddings.token.weight


@pytest.mark.parametrize("exported", [True, False], ids=["transformers layout", "own layout"])
def test_load_errors_name_the_file(tmp_path, exported):
    save_model(build(**({} if exported else {"position": "rope"})), tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (EXPORT_KEY in saved) == exported

    def with_fields(**fields) -> None:
        config = {**saved, EXPORT_KEY: {**saved[EXPORT_KEY], **fields}} if exported else {**saved, **fields}
        (tmp_path / "m" / "config.json").write_text(json.dumps(config))

    with_fields(d_model=64, n_heads=4)
    with pytest.raises(UserError, match="model.safetensors|size mismatch|config.json implies") as info:
        load_model(tmp_path / "m")
    assert "\n" not in str(info.value)
    with_fields(n_layers=3)  # a missing block
    with pytest.raises(UserError, match="Missing key|lack 12 tensors this config needs"):
        load_model(tmp_path / "m")
    with_fields(d_modle=32)
    with pytest.raises(UserError, match="config.json"):
        load_model(tmp_path / "m")
    with_fields()
    (tmp_path / "m" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(UserError, match="model.safetensors: not a readable safetensors file"):
        load_model(tmp_path / "m")
    with pytest.raises(UserError, match="config.json"):
        load_model(tmp_path / "missing")


def test_tiny_model_overfits_one_batch():
    torch.manual_seed(0)
    model = build_model(tiny(causal=True)).train()
    ids = tokens(B=4, T=16)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(300):
        logits = model.lm_logits(model(ids[:, :-1]))
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.1:
            break
    assert loss.item() < 0.1, f"loss {loss.item():.3f} after {step + 1} steps"


def test_attention_bias_combines_alibi_causal_and_padding():
    T = 5
    distance = (torch.arange(T)[None, :] - torch.arange(T)[:, None]).abs()
    slopes = alibi_slopes(2)[:, None, None]
    bias = build(position="alibi").attention_bias(None, T)
    assert torch.equal(bias, (-slopes * distance)[None])  # symmetric |i - j| for bidirectional models
    padding = torch.tensor([[True, True, True, False, False]])
    causal = build(position="alibi", causal=True).attention_bias(padding, T)[0]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    masked = future | (~padding[0] & ~torch.eye(T, dtype=torch.bool))  # padding keys, except a query's own
    assert torch.isinf(causal[:, masked]).all() and torch.equal(causal[:, ~masked], (-slopes * distance)[:, ~masked])
    assert build(causal=True).attention_bias(None, T) is None  # SDPA's is_causal fast path


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_runs_under_bf16_autocast(position):
    """float32 RoPE tables and ALiBi biases meet bf16 activations; autocast casts them for SDPA."""
    skip_unless_cpu_bf16()
    model = build(position=position, causal=True)
    ids = tokens()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model.lm_logits(model(ids, attention_mask=ids > 0))
    logits.float().sum().backward()
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
