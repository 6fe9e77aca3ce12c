"""Published models read into lib.models.architectures' models exactly (lib/models/hf.py): for each family a tiny random model
built with transformers, saved, imported and compared with transformers on real sentences; and the
real MiniLM in ../shared/models."""
import json
from pathlib import Path

import pytest
import torch

from lib.config.errors import UserError
from lib.config.params import load_params
from lib.models.architectures import build_model
from lib.models.config import TransformerConfig
from lib.models.folder import load_model, save_model
from lib.models.hf import export_family, import_model, import_tokenizer, resolve
from lib.objectives.electra import Electra

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders, processors  # noqa: E402

from tests.helpers import ROOT  # noqa: E402

MINILM = ROOT.parent / "shared" / "models" / "all-MiniLM-L6-v2"
SENTENCES = ["A gripping, beautifully shot film that never lets go.",
             "The plot is thin and the dialogue is worse; I left halfway through.",
             "It's not a masterpiece, but the lead performance carries it."]
TOL = 1e-4


def bpe_tokenizer(folder: Path, specials: dict[str, str], roberta: bool) -> int:
    """A byte-level BPE trained on the sentences, saved as transformers saves one; returns its size."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(SENTENCES * 5, trainers.BpeTrainer(
        vocab_size=400, special_tokens=list(dict.fromkeys(specials.values())),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    if roberta:
        tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **{f"{k}_token": v for k, v in specials.items()})
    fast.save_pretrained(folder)
    return tok.get_vocab_size()


def build(family: str, folder: Path):
    """A tiny random model of `family` with a tokenizer, saved to `folder`; (task model class)."""
    torch.manual_seed(0)
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    if family in ("bert", "electra", "distilbert"):
        transformers.AutoTokenizer.from_pretrained(MINILM).save_pretrained(folder)
        vocab = 30522
    elif family in ("roberta", "roberta-prelayernorm", "esm"):
        vocab = bpe_tokenizer(folder, dict(bos="<s>", eos="</s>", sep="</s>", cls="<s>", unk="<unk>", pad="<pad>",
                                           mask="<mask>"), roberta=True)
        ids = {t["content"]: t["id"] for t in json.loads((folder / "tokenizer.json").read_text())["added_tokens"]}
    else:
        vocab = bpe_tokenizer(folder, dict(bos="<|endoftext|>", eos="<|endoftext|>", unk="<|endoftext|>"), roberta=False)
    if family == "bert":
        config, head = transformers.BertConfig(vocab_size=vocab, **small), transformers.BertForMaskedLM
    elif family in ("roberta", "roberta-prelayernorm"):
        config, head = ((transformers.RobertaConfig, transformers.RobertaForMaskedLM) if family == "roberta" else
                        (transformers.RobertaPreLayerNormConfig, transformers.RobertaPreLayerNormForMaskedLM))
        config = config(vocab_size=vocab, pad_token_id=ids["<pad>"], max_position_embeddings=66, type_vocab_size=1, **small)
    elif family == "esm":
        config = transformers.EsmConfig(vocab_size=vocab, pad_token_id=ids["<pad>"], mask_token_id=ids["<mask>"],
                                        position_embedding_type="rotary", emb_layer_norm_before=True, **small)
        head = transformers.EsmForMaskedLM
    elif family == "electra":
        config = transformers.ElectraConfig(vocab_size=vocab, embedding_size=16, **small)
        head = transformers.ElectraForMaskedLM  # the generator: discriminator weights + an MLM head
    elif family == "distilbert":
        config = transformers.DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4, hidden_dim=64)
        head = transformers.DistilBertForMaskedLM
    else:
        config = transformers.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, bos_token_id=0,
                                         eos_token_id=0)
        head = transformers.GPT2LMHeadModel
    model = head(config)
    with torch.no_grad():  # non-trivial LayerNorms and biases, so a mapping mistake shows
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name or "ln_" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder)
    return head


def compare(folder: Path, head_class=None) -> None:
    """Same ids as AutoTokenizer, same hidden states as AutoModel, same LM logits as the head class."""
    imported = import_model(folder)
    tokenizer, roles, _ = import_tokenizer(folder, imported.model.cfg.vocab_size)
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    pairs = [(SENTENCES[0], None), (SENTENCES[1], SENTENCES[2])]
    for a, b in pairs:
        expected = reference(a, b)["input_ids"]
        assert tokenizer.encode(a, b).ids == expected
    reference.pad_token = reference.pad_token or reference.eos_token  # GPT-2 has none; padding is masked anyway
    batch = reference(SENTENCES, padding=True, return_tensors="pt")
    mask = batch["attention_mask"].bool()
    segments = batch.get("token_type_ids")
    auto = transformers.AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = auto(**batch).last_hidden_state
        ours = imported.model(batch["input_ids"], segments if imported.model.cfg.segment_vocab else None, mask)
        assert (expected - ours)[mask].abs().max() < TOL  # padding positions are masked out of everything
        if head_class is not None:
            logits = head_class.from_pretrained(folder).eval()(**batch).logits
            assert (logits - imported.model.lm_logits(ours))[mask].abs().max() < TOL
    # lib.models.folder.load_model, the README's one-call loader, takes the folder as it is
    assert torch.equal(load_model(folder).embeddings.token.weight, imported.model.embeddings.token.weight)


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert", "electra", "roberta-prelayernorm", "gpt2", "esm"])
def test_family_imports_exactly(family, tmp_path):
    head = build(family, tmp_path)
    compare(tmp_path, head)
    assert not import_model(tmp_path).fresh


def test_electra_discriminator_keeps_encoder_and_its_detection_head(tmp_path):
    transformers.AutoTokenizer.from_pretrained(MINILM).save_pretrained(tmp_path)
    torch.manual_seed(0)
    discriminator = transformers.ElectraForPreTraining(transformers.ElectraConfig(
        embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64))
    with torch.no_grad():  # transformers starts biases at zero; a swapped bias would not show
        for name, p in discriminator.named_parameters():
            if name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    discriminator.save_pretrained(tmp_path)
    compare(tmp_path)
    imported = import_model(tmp_path)
    assert {k.rsplit(".", 1)[0] for k in imported.fresh} == {"head.dense", "head.norm", "head.decoder"}
    assert all(k.startswith("discriminator_predictions") for k in imported.unused)
    # the replaced-token head goes into the electra objective and gives transformers' logits
    cfg = imported.model.cfg
    objective = Electra(load_params(ROOT / "params.yaml"), cfg.vocab_size, {"pad": 0, "mask": 103}, cfg)
    objective.start_from(imported)
    objective.eval()
    batch = transformers.AutoTokenizer.from_pretrained(tmp_path)(SENTENCES, padding=True, return_tensors="pt")
    mask = batch["attention_mask"].bool()
    with torch.no_grad():
        expected = transformers.ElectraForPreTraining.from_pretrained(tmp_path).eval()(**batch).logits
        ours = objective.disc_head(objective.discriminator(batch["input_ids"], batch["token_type_ids"], mask))
    assert (expected - ours)[mask].abs().max() < TOL


@pytest.mark.skipif(not MINILM.is_dir(), reason="needs ../shared/models/all-MiniLM-L6-v2")
def test_minilm_imports_exactly():
    compare(MINILM)
    imported = import_model(MINILM)
    assert imported.family == "bert" and imported.model.cfg.pooler
    assert {k.rsplit(".", 1)[0] for k in imported.fresh} == {"head.dense", "head.norm", "head.decoder"}
    _, roles, lowercase = import_tokenizer(MINILM, 30522)
    assert roles == {"pad": "[PAD]", "unk": "[UNK]", "bos": "[CLS]", "eos": "[SEP]", "mask": "[MASK]"} and lowercase


def test_bad_published_models_say_what_is_wrong_in_one_line(tmp_path):
    def error(folder) -> str:
        with pytest.raises(UserError) as info:
            import_model(folder)
        assert "\n" not in str(info.value)
        return str(info.value)

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    assert "model_type 'mamba' is not supported; supported: bert, roberta, electra, distilbert, roberta-prelayernorm, gpt2" in error(tmp_path)
    (tmp_path / "config.json").unlink()
    assert "not a Hugging Face model config" in error(tmp_path)
    build("bert", tmp_path)
    (tmp_path / "model.safetensors").unlink()
    assert "no model.safetensors or pytorch_model.bin" in error(tmp_path)
    torch.save({"state": {"nested": torch.zeros(1)}}, tmp_path / "pytorch_model.bin")
    assert "not a plain state dict of tensors" in error(tmp_path)
    torch.save(transformers.BertModel(transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    )).state_dict(), tmp_path / "pytorch_model.bin")
    assert import_model(tmp_path).fresh  # a plain pickled state dict loads (a bare BertModel: no LM head)
    (tmp_path / "tokenizer.json").write_text(Tokenizer(models.WordLevel({"a": 0}, unk_token="a")).to_str())
    tokenizer_json = json.loads((tmp_path / "tokenizer.json").read_text())
    tokenizer_json["model"]["vocab"] = {f"t{i}": i for i in range(40000)}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    with pytest.raises(UserError, match="40000 tokens, but the model has 30522 embeddings"):
        import_tokenizer(tmp_path, 30522)


def test_hub_id_offline_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(UserError) as info:
        resolve("hf:someone/not-cached@main", tmp_path, mirror=None)
    assert str(info.value).startswith("init: cannot download someone/not-cached@main from the Hugging Face hub")
    assert "set init to that local folder" in str(info.value) and "\n" not in str(info.value)
    mirror = tmp_path / "mirror" / "all-MiniLM-L6-v2"
    mirror.mkdir(parents=True)
    assert resolve("hf:sentence-transformers/all-MiniLM-L6-v2", tmp_path, mirror="mirror") == mirror


# Export: what save_model writes loads in transformers and computes the same.
SPECIAL = {"pad": 0, "unk": 1, "bos": 2, "eos": 3, "mask": 4}
EXPORTABLE = {
    "pre-LN causal (the default clm model)": dict(norm="pre", causal=True),
    "pre-LN bidirectional": dict(norm="pre"),
    "post-LN bidirectional (BERT)": dict(norm="post"),
    "post-LN causal": dict(norm="post", causal=True),
    "post-LN, factorised embeddings (ELECTRA)": dict(norm="post", embedding_size=16),
    "GPT-2": dict(causal=True, embedding_norm=False, lm_head="linear", segment_vocab=0, activation="gelu_tanh"),
    "no token types, untied (DistilBERT-like)": dict(norm="post", segment_vocab=0, norm_eps=1e-12,
                                                    tie_embeddings=False),
    "pre-LN rope (ESM)": dict(position="rope", segment_vocab=0),
    "pre-LN rope causal": dict(position="rope", segment_vocab=0, causal=True),
    "pre-LN rope, no embedding LayerNorm": dict(position="rope", segment_vocab=0, embedding_norm=False),
}


@pytest.mark.parametrize("shape", EXPORTABLE, ids=list(EXPORTABLE))
def test_saved_models_load_in_transformers(shape, tmp_path):
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=100, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_positions=64,
                            **EXPORTABLE[shape])
    model = build_model(cfg).eval()
    with torch.no_grad():  # non-default norms and biases, so a tensor mapped wrong shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_model(model, tmp_path, SPECIAL)
    back = load_model(tmp_path)
    family, _ = export_family(cfg)
    assert back.cfg == cfg and json.loads((tmp_path / "config.json").read_text())["model_type"] == family.name
    ids = torch.randint(5, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    head = getattr(transformers, family.lm_classes[cfg.causal])
    with torch.no_grad():
        ours = model(ids, None, mask)
        assert torch.equal(back(ids, None, mask), ours)
        hidden = transformers.AutoModel.from_pretrained(tmp_path).eval()(input_ids=ids, attention_mask=mask.long())
        logits = head.from_pretrained(tmp_path).eval()(input_ids=ids, attention_mask=mask.long()).logits
    assert (hidden.last_hidden_state - ours)[mask].abs().max() < TOL
    assert (logits - model.lm_logits(ours))[mask].abs().max() < TOL


def test_greedy_decoding_is_transformers_generate(tmp_path):
    """The decoder's greedy continuation of a GPT-2-shaped model is GPT2LMHeadModel.generate's without sampling."""
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=100, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_positions=64,
                            **EXPORTABLE["GPT-2"])
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_model(model, tmp_path, {"pad": SPECIAL["pad"]})  # no eos: generate would stop there, greedy runs on
    prompt = torch.randint(5, 100, (2, 5), generator=torch.Generator().manual_seed(1))
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval().generate(
        prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=6, pad_token_id=SPECIAL["pad"])
    assert torch.equal(model.greedy(prompt, steps=6), theirs)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_a_model_with_languages_exports_as_xlm(causal, tmp_path):
    """XLM's shape (post-LN, learned positions, the decoder alone, FFN 4x) with language embeddings loads
    as XLMWithLMHeadModel: the same logits with language ids (a translation pair, positions restarting at
    its second sentence) and without them (ours read the first language; XLM adds none)."""
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=100, d_model=32, n_layers=2, n_heads=4, d_ff=128, max_positions=64,
                            norm="post", lm_head="linear", segment_vocab=0, languages=["en", "de", "fr"],
                            causal=causal)
    family, reason = export_family(cfg)
    assert family.name == "xlm" and reason == ""
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_model(model, tmp_path, SPECIAL)
    ids = torch.randint(5, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    languages = torch.tensor([[0] * 5 + [1] * 4, [2] * 9])
    positions = torch.tensor([[*range(5), *range(4)], [*range(9)]])
    theirs = transformers.XLMWithLMHeadModel.from_pretrained(tmp_path).eval()
    back, imported = load_model(tmp_path), import_model(tmp_path).model  # as lib wrote it; as init reads it
    assert imported.cfg.languages == cfg.languages
    with torch.no_grad():
        for extra, hf_extra in (({}, {}), ({"language_ids": languages, "position_ids": positions},
                                          {"langs": languages, "position_ids": positions})):
            ours = model(ids, None, mask, **extra)
            logits = theirs(input_ids=ids, attention_mask=mask.long(), **hf_extra).logits
            assert (logits - model.lm_logits(ours))[mask].abs().max() < TOL
            for again in (back, imported):
                assert (again(ids, None, mask, **extra) - ours)[mask].abs().max() < TOL
        assert (model(ids, None, mask, language_ids=languages) - model(ids, None, mask))[mask].abs().max() > 0.01


@pytest.mark.parametrize("shape", [*EXPORTABLE.values(), dict(norm="pre", embedding_size=16),
                                   dict(norm="post", embedding_size=16, causal=True),
                                   dict(norm="post", lm_head="linear", segment_vocab=0, languages=["en", "de"]),
                                   dict(position="rope", norm="post"), dict(position="alibi")])
def test_at_most_one_family_covers_a_config(shape):
    """export_family asks the one family that covers a config whether it computes it: two would make the
    answer depend on the registry's order."""
    from lib.models.families import FAMILIES

    cfg = TransformerConfig(vocab_size=100, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_positions=64, **shape)
    assert len([name for name, family in FAMILIES.items() if family.covers(cfg)]) <= 1


def test_a_model_with_languages_in_another_shape_names_what_xlm_needs():
    cfg = TransformerConfig(vocab_size=100, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_positions=64,
                            position="rope", languages=["en", "de"])
    family, reason = export_family(cfg)
    assert family is None and reason == ("language embeddings (XLM); transformers' XLM needs model.position: learned, "
                                         "model.norm: post, model.lm_head: linear, model.segment_vocab: 0, "
                                         "model.d_ff: 128 (4 x d_model)")


@pytest.mark.parametrize("shape", [dict(position="rope", segment_vocab=2), dict(position="rope", norm="post"),
                                   dict(position="alibi"), dict(share_layers=True)])
def test_a_model_with_no_transformers_equivalent_says_why_and_stays_loadable(shape, tmp_path):
    cfg = TransformerConfig(vocab_size=100, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_positions=64, **shape)
    family, reason = export_family(cfg)
    assert family is None and reason
    save_model(build_model(cfg), tmp_path, SPECIAL)
    assert "model_type" not in json.loads((tmp_path / "config.json").read_text()) and load_model(tmp_path).cfg == cfg


@pytest.mark.skipif(not MINILM.is_dir(), reason="needs ../shared/models/all-MiniLM-L6-v2")
def test_an_imported_model_saves_back_as_itself(tmp_path):
    """MiniLM in, through the pipeline's save_model, out: transformers reads the same encoder (and pooler)."""
    imported = import_model(MINILM).model
    save_model(imported, tmp_path, {"pad": 0, "unk": 100, "bos": 101, "eos": 102, "mask": 103})
    batch = transformers.AutoTokenizer.from_pretrained(MINILM)(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = transformers.AutoModel.from_pretrained(MINILM).eval()(**batch)
        saved = transformers.AutoModel.from_pretrained(tmp_path).eval()(**batch)
    assert (expected.last_hidden_state - saved.last_hidden_state).abs().max() < TOL
    assert (expected.pooler_output - saved.pooler_output).abs().max() < TOL
