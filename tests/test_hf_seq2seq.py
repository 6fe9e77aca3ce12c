"""Encoder-decoder checkpoints in and out (lib/models/hf.py; lib/models/families/t5.py and bart.py): tiny random
T5 and BART models built with transformers, saved, imported and compared with transformers (the encoder's and
the decoder's hidden states, the logits, greedy generation); our own encoder-decoders written as their folders,
loaded by transformers with the same outputs and read back identical; and what is refused."""
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from lib.config.errors import UserError
from lib.config.params import ModelConfig
from lib.core.io import read_safetensors, write_safetensors
from lib.models.architectures import build_model
from lib.models.architectures.encoder_decoder import EncoderDecoder, seq2seq_config
from lib.models.folder import load_model, save_model
from lib.models.generation import Decoding, generate, until
from lib.models.hf import CONFIG_FILE, SAFETENSORS_FILE, export_family, import_model

transformers = pytest.importorskip("transformers")

VOCAB, TOL, STEPS = 100, 1e-4, 12
T5_SIZES = dict(vocab_size=VOCAB, d_model=32, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0,
                decoder_start_token_id=0)
BART_SIZES = dict(vocab_size=VOCAB, d_model=32, encoder_attention_heads=4, decoder_attention_heads=4,
                  encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=40, dropout=0.0)
# name -> (its config, whether its LM head is the token table, the scale of its matrices: one where greedy
# decoding writes more than one token)
PUBLISHED = {
    "t5-v1.0": (lambda: transformers.T5Config(**T5_SIZES, d_kv=8), True, 0.5),  # ReLU; d_kv x heads = d_model
    # gated GELU, untied; 6 heads of 8 (Flan-T5-small's 6 of 64 on 512): d_model does not split into its heads
    "t5-v1.1": (lambda: transformers.T5Config(**{**T5_SIZES, "num_heads": 6}, d_kv=8, num_decoder_layers=3,
                                              feed_forward_proj="gated-gelu", tie_word_embeddings=False), False, 0.5),
    "bart": (lambda: transformers.BartConfig(**BART_SIZES, encoder_layers=2, decoder_layers=3), True, 1.0),
    "bart-scaled": (lambda: transformers.BartConfig(**BART_SIZES, encoder_layers=3, decoder_layers=2,
                                                    scale_embedding=True, tie_word_embeddings=False), False, 0.1),
}
OURS = {"t5": {"pad": 0, "eos": 1}, "bart": {"bos": 0, "pad": 1, "eos": 2}}  # special ids, as each family numbers them


def perturb(model: torch.nn.Module, scale: float) -> None:
    """Matrices N(0, scale), norms and biases moved off their init, so that outputs are not trivial and a
    mapping mistake shows."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, scale)
            else:
                p.add_(torch.randn_like(p) * 0.1)


def published(name: str, folder: Path) -> None:
    """A tiny random transformers model `name` (PUBLISHED), saved to `folder` as save_pretrained saves it."""
    torch.manual_seed(0)
    config, tied, scale = PUBLISHED[name]
    model = transformers.AutoModelForSeq2SeqLM.from_config(config())
    if not tied:  # a head of its own: transformers 5's T5 ties it whatever tie_word_embeddings says
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight))
    perturb(model, scale)
    if isinstance(model, transformers.BartForConditionalGeneration) and not tied:
        with torch.no_grad():  # untied, it keeps a table per stack: one for both, as its published models have
            for stack in (model.model.encoder, model.model.decoder):
                stack.embed_tokens.weight.copy_(model.model.shared.weight)
    model.save_pretrained(folder)


def source(pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A padded batch: row 1's last three tokens are padding."""
    ids = torch.randint(5, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:], ids[1, 6:] = 0, pad
    return ids, mask


def same_outputs(ours: EncoderDecoder, theirs, pad: int) -> None:
    """The encoder's hidden states (at real tokens), the decoder's and the logits are transformers'."""
    ids, mask = source(pad)
    target = torch.randint(5, VOCAB, (2, 7), generator=torch.Generator().manual_seed(2))
    target[:, 0] = ours.cfg.decoder_start
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask, decoder_input_ids=target, output_hidden_states=True)
        memory = ours.encoder(ids, attention_mask=mask.bool())
        hidden = ours(ids, target, attention_mask=mask.bool())
        logits = ours.lm_logits(hidden)
    assert (memory - expected.encoder_last_hidden_state)[mask.bool()].abs().max() < TOL
    assert (hidden - expected.decoder_hidden_states[-1]).abs().max() < TOL
    assert (logits - expected.logits).abs().max() < TOL
    assert expected.logits.std() > 0.1  # outputs worth comparing


def stop_token(free: list[list[int]]) -> tuple[int, int]:
    """(row, step) of a token that the row writes first after its first step and no other row writes by then: an
    end token that stops that row while the others go on."""
    for r, tokens in enumerate(free):
        for i in range(1, len(tokens)):
            others = {t for o, other in enumerate(free) if o != r for t in other[: i + 1]}
            if tokens[i] not in tokens[:i] and tokens[i] not in others:
                return r, i
    raise AssertionError(f"no row writes a token of its own after its first step: {free}")


def forcings_off(ours: EncoderDecoder, pad: int, eos: int, **decoding) -> "transformers.GenerationConfig":
    """transformers' generation config with every forcing off, so that generate() decodes as
    lib.models.generation.generate does: set explicitly, in place of the model's own, since generate() fills
    what its argument leaves unset from the model's (BART's forced_eos_token_id, a minimum length, n-gram bans,
    penalties would change what it picks). `decoding`: do_sample, num_beams, max_new_tokens and the like."""
    return transformers.GenerationConfig(
        **decoding, min_length=0, min_new_tokens=None, no_repeat_ngram_size=0, repetition_penalty=1.0,
        forced_bos_token_id=None, forced_eos_token_id=None, bad_words_ids=None, suppress_tokens=None,
        begin_suppress_tokens=None, eos_token_id=eos, pad_token_id=pad, decoder_start_token_id=ours.cfg.decoder_start,
        # transformers 5 sizes T5's key/value cache by the encoder's depth: uncached where the decoder's differs
        use_cache=ours.cfg.decoder_layers == ours.cfg.n_layers)


def same_greedy(ours: EncoderDecoder, theirs, pad: int) -> None:
    """Our greedy decoding is transformers' generate() with every forcing off, token for token. The end token is
    one a row writes first after its first step, so that a row stops while decoding goes on."""
    ids, mask = source(pad)
    free = generate(ours, ids, mask, Decoding(max_new_tokens=STEPS), eos=None)
    row, step = stop_token(free)
    eos = free[row][step]
    tokens = generate(ours, ids, mask, Decoding(max_new_tokens=STEPS), eos=eos)
    theirs.generation_config = forcings_off(ours, pad, eos, do_sample=False, num_beams=1, max_new_tokens=STEPS)
    with torch.no_grad():
        expected = theirs.generate(ids, attention_mask=mask)
    assert len(tokens[row]) == step and max(map(len, tokens)) > step + 1  # the row stops, decoding goes on
    assert tokens == [until(written, eos) for written in expected[:, 1:].tolist()]


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_encoder_decoders_import_exactly(name, tmp_path):
    published(name, tmp_path)
    imported = import_model(tmp_path)
    assert isinstance(imported.model, EncoderDecoder) and not imported.fresh and not imported.unused
    cfg = imported.model.cfg
    hf = json.loads((tmp_path / CONFIG_FILE).read_text())
    assert (cfg.n_layers, cfg.decoder_layers) == (hf.get("num_layers", hf.get("encoder_layers")),
                                                  hf.get("num_decoder_layers", hf.get("decoder_layers")))
    assert cfg.tie_embeddings == PUBLISHED[name][1]
    theirs = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    same_outputs(imported.model, theirs, hf["pad_token_id"])
    same_greedy(imported.model, theirs, hf["pad_token_id"])
    # lib.models.folder.load_model takes the folder as it is
    ids, mask = source(hf["pad_token_id"])
    assert torch.equal(load_model(tmp_path)(ids, ids, attention_mask=mask.bool()),
                       imported.model(ids, ids, attention_mask=mask.bool()))


def ours(shape: str, tied: bool) -> EncoderDecoder:
    """Our tiny encoder-decoder of T5's or BART's shape (seq2seq_config), its weights perturbed; the vocabulary's
    padding rows stay zeros (they are ours alone: an export leaves them out)."""
    torch.manual_seed(0)
    sizes = ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64, dropout=0.0, max_positions=32,
                        tie_embeddings=tied)
    model = build_model(seq2seq_config(sizes, shape, 3, VOCAB, OURS[shape])).eval()
    perturb(model, 0.5 if shape == "t5" else 1.0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("embeddings.token.weight", "head.decoder.weight")):
                p[VOCAB:] = 0
    return model


@pytest.mark.parametrize("shape, tied", [("t5", True), ("t5", False), ("bart", True), ("bart", False)])
def test_our_encoder_decoders_load_in_transformers(shape, tied, tmp_path):
    model = ours(shape, tied)
    family, why = export_family(model.cfg)
    assert family is not None and family.name == shape, why
    save_model(model, tmp_path, OURS[shape])
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    theirs = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(theirs).__name__ == config["architectures"][0] and config["model_type"] == shape
    assert config["decoder_start_token_id"] == model.cfg.decoder_start and config["eos_token_id"] == OURS[shape]["eos"]
    same_outputs(model, theirs, OURS[shape]["pad"])
    same_greedy(model, theirs, OURS[shape]["pad"])
    loaded = load_model(tmp_path)
    assert loaded.cfg == model.cfg
    assert loaded.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())


def test_what_transformers_does_not_compute_is_written_in_our_layout(tmp_path):
    model = ours("t5", tied=True)
    model.cfg = dataclasses.replace(model.cfg, rescale_output=False)  # tied but unscaled: T5 scales a tied head's input
    family, why = export_family(model.cfg)
    assert family is None and "scaled exactly when the LM head is tied" in why
    bart = ours("bart", tied=True).cfg  # with an MLP head, RoBERTa's shape: but an encoder-decoder is BART's to judge
    assert export_family(dataclasses.replace(bart, lm_head="mlp")) == (
        None, "BART needs the LM head's decoder alone (lm_head: linear)")
    save_model(model, tmp_path, OURS["t5"])
    assert "model_type" not in json.loads((tmp_path / CONFIG_FILE).read_text())
    assert load_model(tmp_path).cfg == model.cfg


def refused(folder: Path, *words: str) -> None:
    with pytest.raises(UserError) as err:
        import_model(folder)
    assert "\n" not in str(err.value) and all(word in str(err.value) for word in words)


def test_what_we_cannot_compute_is_refused_in_one_line(tmp_path):
    published("bart", tmp_path)
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**config, "normalize_before": True}))  # mBART's pre-LN layers
    refused(tmp_path, "normalize_before")
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**config, "decoder_attention_heads": 2}))
    refused(tmp_path, "encoder_attention_heads 4 != decoder_attention_heads 2")
    (tmp_path / CONFIG_FILE).write_text(json.dumps(config))
    tensors = read_safetensors(tmp_path / SAFETENSORS_FILE)
    write_safetensors(tmp_path / SAFETENSORS_FILE, {**tensors, "final_logits_bias": torch.ones(1, VOCAB)})
    refused(tmp_path, "final_logits_bias")
    encoder_table = {"model.encoder.embed_tokens.weight": torch.randn(VOCAB, 32)}  # a table per stack
    write_safetensors(tmp_path / SAFETENSORS_FILE, {**tensors, **encoder_table})
    refused(tmp_path, "model.encoder.embed_tokens.weight")
    published("t5-v1.0", tmp_path / "t5")
    config = json.loads((tmp_path / "t5" / CONFIG_FILE).read_text())
    (tmp_path / "t5" / CONFIG_FILE).write_text(json.dumps({**config, "feed_forward_proj": "gated-silu"}))
    refused(tmp_path / "t5", "feed_forward_proj gated-silu")


@pytest.mark.parametrize("name", ["t5-v1.0", "t5-v1.1"])
def test_a_t5_saved_by_transformers_4_imports_as_transformers_5_reads_it(name, tmp_path):
    """transformers 4 stored every name of the token table and the tied head too, and its config.json said
    tie_word_embeddings (false for v1.1: no scaling, a head of its own) with no scale_decoder_outputs."""
    published(name, tmp_path)
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    tied = config.pop("scale_decoder_outputs")
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**config, "tie_word_embeddings": tied}))
    tensors = read_safetensors(tmp_path / SAFETENSORS_FILE)
    table = tensors["shared.weight"]
    names = ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight", *(["lm_head.weight"] if tied else [])]
    write_safetensors(tmp_path / SAFETENSORS_FILE, {**tensors, **{name: table.clone() for name in names}})
    imported = import_model(tmp_path)
    assert imported.model.cfg.tie_embeddings == imported.model.cfg.rescale_output == tied and not imported.unused
    theirs = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    same_outputs(imported.model, theirs, config["pad_token_id"])
