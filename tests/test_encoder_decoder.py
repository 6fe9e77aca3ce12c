"""The encoder-decoder (lib/models/architectures/encoder_decoder.py): T5's and BART's shapes, what its decoder
may see, its key/value cache, T5's relative position buckets, save/load and its FLOPs."""
import pytest
import torch

from lib.config.params import ModelConfig
from lib.models.architectures import build_model, text_encoder
from lib.models.architectures.encoder import Encoder
from lib.models.architectures.encoder_decoder import EncoderDecoder, seq2seq_config
from lib.models.blocks import relative_buckets
from lib.models.folder import load_model, save_model
from lib.models.generation import Decoding, generate

VOCAB, SPECIAL = 100, {"pad": 0, "eos": 3}
SHAPES = ["t5", "bart"]


def build(shape: str, scale: float = 0.0) -> EncoderDecoder:
    """A tiny model; `scale`: its matrices drawn N(0, scale) so that greedy decoding does not repeat one token."""
    torch.manual_seed(0)
    sizes = ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64, dropout=0.0, max_positions=32)
    model = build_model(seq2seq_config(sizes, shape, 3, VOCAB, SPECIAL)).eval()
    if scale:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0, scale)
    return model


def source() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    return ids, mask


@pytest.mark.parametrize("shape", SHAPES)
def test_the_shapes_are_t5_s_and_bart_s(shape):
    model = build(shape)
    cfg = model.cfg
    assert (cfg.n_layers, cfg.decoder_layers, len(model.decoder.blocks)) == (2, 3, 3)
    assert model.decoder.embeddings.token is model.encoder.embeddings.token  # one token table
    assert model.decoder.head.decoder.weight is model.encoder.embeddings.token.weight  # tied
    block = model.decoder.blocks[0]
    if shape == "t5":
        assert cfg.rms_norm and not cfg.bias and cfg.position == "t5" and cfg.decoder_start == SPECIAL["pad"]
        assert isinstance(block.ln1, torch.nn.RMSNorm) and block.attn.qkv.bias is None
        assert model.encoder.relative_bias.bidirectional and not model.decoder.relative_bias.bidirectional
    else:
        assert cfg.norm == "post" and cfg.position_offset == 2 and cfg.decoder_start == SPECIAL["eos"]
        assert model.encoder.embeddings.position is not model.decoder.embeddings.position  # positions per stack


@pytest.mark.parametrize("shape", SHAPES)
def test_the_decoder_reads_no_future_and_no_source_padding(shape):
    model = build(shape, scale=0.3)
    ids, mask = source()
    target = torch.randint(5, VOCAB, (2, 7), generator=torch.Generator().manual_seed(2))
    changed = target.clone()
    changed[:, 5] = 7
    a, b = model(ids, target, attention_mask=mask), model(ids, changed, attention_mask=mask)
    assert torch.allclose(a[:, :5], b[:, :5], atol=1e-6)  # positions before the change see nothing of it
    assert not torch.allclose(a[:, 5:], b[:, 5:], atol=1e-4)
    padded = ids.clone()
    padded[1, 6:] = 1  # other tokens under the source's padding
    assert torch.allclose(model(padded, target, attention_mask=mask)[1], a[1], atol=1e-6)
    shorter = model(ids[1:, :6], target[1:])  # the same row without its padding
    assert torch.allclose(shorter[0], a[1], atol=1e-5)


@pytest.mark.parametrize("shape, scale", [("t5", 0.5), ("bart", 1.0)])  # scales where no row repeats one token
def test_generating_with_the_cache_is_decoding_without_it(shape, scale):
    model = build(shape, scale)
    ids, mask = source()
    cached = torch.tensor(generate(model, ids, mask, Decoding(max_new_tokens=12), eos=None))
    assert cached.shape == (2, 12) and all(len(set(row.tolist())) > 1 for row in cached)  # something to compare
    rerun = torch.full((2, 1), model.cfg.decoder_start)
    for _ in range(12):  # each step runs the decoder over the whole prefix again
        hidden = model(ids, rerun, attention_mask=mask)
        rerun = torch.cat([rerun, model.lm_logits(hidden[:, -1]).argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cached, rerun[:, 1:])


def test_t5_s_buckets_are_transformers():
    from transformers.models.t5.modeling_t5 import T5Attention

    distance = torch.arange(-300, 300)[None, :] - torch.arange(0, 3)[:, None]
    for bidirectional in (True, False):
        theirs = T5Attention._relative_position_bucket(distance, bidirectional=bidirectional, num_buckets=32,
                                                       max_distance=128)
        assert torch.equal(relative_buckets(distance, bidirectional, 32, 128), theirs)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_saved_encoder_decoder_loads_as_it_was(shape, tmp_path):
    model = build(shape, scale=0.3)
    ids, mask = source()
    target = torch.randint(5, VOCAB, (2, 7))
    save_model(model, tmp_path / "m", SPECIAL)
    loaded = load_model(tmp_path / "m")
    assert isinstance(loaded, EncoderDecoder) and loaded.cfg == model.cfg
    assert torch.equal(loaded(ids, target, attention_mask=mask), model(ids, target, attention_mask=mask))


def test_the_text_encoder_is_the_encoder_and_the_groups_cover_both_stacks():
    model = build("t5")
    assert text_encoder(model) is model.encoder and isinstance(model.encoder, Encoder)
    groups = model.layer_groups()
    assert len(groups) == 1 + 2 + 3 + 1
    flat = [id(p) for group in groups for p in group]
    assert len(flat) == len(set(flat)) == len(list(model.parameters()))


def test_flops_count_the_source_and_the_target_apart():
    model = build("t5")
    base = model.flops_per_sequence(64, 16)
    assert model.flops_per_sequence(64, 32) > base and model.flops_per_sequence(128, 16) > base
    # the same tokens through the encoder cost less than through the decoder (no cross-attention, no LM head)
    assert model.flops_per_sequence(64 + 16, 0) < model.flops_per_sequence(64, 16)
    assert model.flops_per_token(64) == model.flops_per_sequence(64, 64) / 64
