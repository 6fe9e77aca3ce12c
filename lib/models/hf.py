"""Published checkpoints in Hugging Face layout, read exactly into lib/models/transformer.py's Transformer.

A checkpoint is a folder with `config.json` (its `model_type` names the family), `model.safetensors`
or `pytorch_model.bin` (read with torch's weights-only unpickler: tensors, never code) and the fast
tokenizer's `tokenizer.json`; or `hf:<repo id>[@revision]`, downloaded once through huggingface_hub
into its cache (or taken from `data.models_mirror/<name>` when that folder exists, the way datasets
come from `data.mirror`).

Each family maps onto the Transformer's fields and tensor names:
- bert (MiniLM is a BERT), roberta, electra: post-LN, learned positions (RoBERTa's start at
  padding_idx + 1), token types, q/k/v concatenated into one projection; ELECTRA's smaller embeddings
  are projected up (`embedding_size`); BERT's pooler is kept; the masked-LM head (BERT's
  `cls.predictions`, RoBERTa's `lm_head`, ELECTRA generator's `generator_predictions`) when present;
- distilbert: the same without token types or pooler, its own tensor names;
- roberta-prelayernorm: RoBERTa with pre-LN layers and a final LayerNorm;
- gpt2: pre-LN, no embedding LayerNorm, tanh GELU, Conv1D weights transposed, the tied decoder alone;
- xlm: post-LN, learned positions, language embeddings, the FFN 4x wide, the decoder alone (with a
  bias, zero in what we export); read back from folders this pipeline exported (XLM's own checkpoints
  have no fast tokenizer);
- esm: pre-LN with rotary positions (rotate-half, base 10000), an optional embedding LayerNorm, a final
  LayerNorm, no token types, exact GELU, RoBERTa's LM head; causal with `is_decoder`. ESM-2's
  token_dropout (masked embeddings zeroed and the rest rescaled) is refused.
The vocabulary rows the Transformer pads to a multiple of 64 are zeros. Tensors the checkpoint lacks
(an encoder saved without its LM head) are initialised fresh and named in `ImportedModel.fresh`.

The same tables export: lib.models.folder.save_model writes a model as the family that computes exactly what
it does (export_family), so the folders the pipeline writes load in transformers too; a classifier's
head joins them where the family's sequence-classification head is the same (lib.models.classifier).
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from tokenizers import Tokenizer

from lib.config.params import HUB_PREFIX, Params
from lib.core.errors import UserError, describe
from lib.core.io import atomic_dir, project_root, read_safetensors
from lib.data.tokenizer import write_folder
from lib.models.transformer import ROPE_BASE, Transformer, TransformerConfig

CONFIG_FILE, SAFETENSORS_FILE, PICKLE_FILE, TOKENIZER_FILE = (
    "config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json")
# what a download fetches: the config, the weights (both files where a repo has both), the tokenizer's files
HUB_FILES = [CONFIG_FILE, SAFETENSORS_FILE, PICKLE_FILE, TOKENIZER_FILE, "tokenizer_config.json",
             "special_tokens_map.json"]
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
ELECTRA_DISCRIMINATOR_HEAD = "discriminator_predictions."  # ElectraForPreTraining's head: dense, act, dense_prediction
EXPORT_KEY = "transfer_pipeline"  # our config inside a transformers config.json (export_layout)
REPO_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")


@dataclass
class ImportedModel:
    model: Transformer
    family: str
    fresh: list[str]  # our tensor names the checkpoint did not have (initialised fresh)
    unused: dict[str, torch.Tensor]  # checkpoint tensors not mapped into the model (heads of other tasks), by name

    def discriminator_head(self) -> dict[str, torch.Tensor]:
        """An ELECTRA discriminator checkpoint's replaced-token detection head, under the names of
        lib.objectives.electra.DiscriminatorHead (the same as transformers'); {} if it has none."""
        return {k.removeprefix(ELECTRA_DISCRIMINATOR_HEAD): v for k, v in self.unused.items()
                if k.startswith(ELECTRA_DISCRIMINATOR_HEAD)}


def resolve(spec: str, root: Path, mirror: str | None, key: str = "init") -> Path:
    """The local folder of `spec`: a path (relative to the project `root`), the mirror's copy of a
    hub id, or the hub id downloaded into huggingface_hub's cache."""
    if not spec.startswith(HUB_PREFIX):
        folder = root / spec
        if not folder.is_dir():
            raise UserError(f"{key}: '{spec}' is not a folder (from {root}); name a checkpoint folder in Hugging Face "
                            "layout or a hub model as hf:<repo id>[@revision]")
        return folder
    repo, _, revision = spec[len(HUB_PREFIX):].partition("@")
    if not REPO_ID.fullmatch(repo):
        raise UserError(f"{key}: '{spec}' is not a hub model id; write hf:<org>/<name>[@revision]")
    if mirror and (root / mirror / repo.split("/")[-1]).is_dir():
        return root / mirror / repo.split("/")[-1]
    from huggingface_hub import snapshot_download  # only a hub id needs it

    try:
        return Path(snapshot_download(repo, revision=revision or None, allow_patterns=HUB_FILES))
    except Exception as err:  # offline, unknown repo or revision, HTTP errors: huggingface_hub has many kinds
        raise UserError(f"{key}: cannot download {repo}{'@' + revision if revision else ''} from the Hugging Face "
                        f"hub ({describe(err)}); with no network, download it elsewhere "
                        "(huggingface-cli download) and set init to that local folder") from None


def read_config(folder: Path) -> tuple[TransformerConfig, str]:
    """(the Transformer's config, the family) from a checkpoint's config.json."""
    path = Path(folder) / CONFIG_FILE
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
        family = hf["model_type"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"{path}: not a Hugging Face model config ({describe(err)}); point at a checkpoint folder "
                        "with config.json, model.safetensors (or pytorch_model.bin) and tokenizer.json") from None
    if family not in FAMILIES:
        raise UserError(f"{path}: model_type '{family}' is not supported; supported: {', '.join(FAMILIES)}")
    try:
        return FAMILIES[family].config(hf), family
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"{path}: cannot map this {family} config ({describe(err)})") from None


def bert_config(hf: dict) -> TransformerConfig:
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"position_embedding_type {hf['position_embedding_type']} (only absolute is supported)")
    embedding = hf.get("embedding_size", hf["hidden_size"])
    return TransformerConfig(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"], dropout=hf.get("hidden_dropout_prob", 0.1),
        max_positions=hf["max_position_embeddings"], position="learned", norm="post",
        tie_embeddings=hf.get("tie_word_embeddings", True),
        embedding_size=embedding if embedding != hf["hidden_size"] else None,
        segment_vocab=hf.get("type_vocab_size", 2),
        activation=activation(hf.get("hidden_act", "gelu")), norm_eps=hf.get("layer_norm_eps", 1e-12),
        position_offset=hf["pad_token_id"] + 1 if hf["model_type"] == "roberta" else 0)


def prelayernorm_config(hf: dict) -> TransformerConfig:
    """RoBERTa-PreLayerNorm: RoBERTa's embeddings and positions, pre-LN layers, a final LayerNorm."""
    return dataclasses.replace(bert_config({**hf, "model_type": "roberta"}), norm="pre")


def distilbert_config(hf: dict) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=hf["vocab_size"], d_model=hf["dim"], n_layers=hf["n_layers"], n_heads=hf["n_heads"],
        d_ff=hf["hidden_dim"], dropout=hf.get("dropout", 0.1), max_positions=hf["max_position_embeddings"],
        position="learned", norm="post", tie_embeddings=hf.get("tie_word_embeddings", True), segment_vocab=0,
        activation=activation(hf.get("activation", "gelu")), norm_eps=1e-12)  # DistilBERT's eps is fixed in code


def gpt2_config(hf: dict) -> TransformerConfig:
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if hf.get(flag):
            raise ValueError(f"{flag} is set (not supported)")
    return TransformerConfig(
        vocab_size=hf["vocab_size"], d_model=hf["n_embd"], n_layers=hf["n_layer"], n_heads=hf["n_head"],
        d_ff=hf.get("n_inner") or 4 * hf["n_embd"], dropout=hf.get("resid_pdrop", 0.1), max_positions=hf["n_positions"],
        position="learned", norm="pre", tie_embeddings=hf.get("tie_word_embeddings", True), segment_vocab=0,
        causal=True, activation=activation(hf.get("activation_function", "gelu_new")),
        norm_eps=hf.get("layer_norm_epsilon", 1e-5), embedding_norm=False, lm_head="linear")


def esm_config(hf: dict) -> TransformerConfig:
    if hf.get("position_embedding_type") != "rotary":
        raise ValueError(f"position_embedding_type {hf.get('position_embedding_type')} (only rotary is supported)")
    if hf.get("token_dropout"):
        raise ValueError("token_dropout is set (ESM-2's rescaled mask embeddings are not supported)")
    if hf.get("rope_theta", ROPE_BASE) != ROPE_BASE:
        raise ValueError(f"rope_theta {hf['rope_theta']} (only {ROPE_BASE:g} is supported)")
    return TransformerConfig(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"], dropout=hf.get("hidden_dropout_prob", 0.1),
        max_positions=hf["max_position_embeddings"], position="rope", norm="pre",
        tie_embeddings=hf.get("tie_word_embeddings", True), segment_vocab=0, causal=bool(hf.get("is_decoder")),
        activation="gelu",  # ESM's GELU is the exact one, whatever hidden_act says
        norm_eps=hf.get("layer_norm_eps", 1e-12), embedding_norm=bool(hf.get("emb_layer_norm_before")))


def xlm_config(hf: dict) -> TransformerConfig:
    for flag, supported in (("asm", False), ("sinusoidal_embeddings", False), ("gelu_activation", True),
                            ("use_lang_emb", True)):
        if hf.get(flag, supported) != supported:
            raise ValueError(f"{flag} is {hf[flag]} (only {supported} is supported)")
    id2lang = hf.get("id2lang") or {}
    return TransformerConfig(
        vocab_size=hf["vocab_size"], d_model=hf["emb_dim"], n_layers=hf["n_layers"], n_heads=hf["n_heads"],
        d_ff=4 * hf["emb_dim"], dropout=hf.get("dropout", 0.1), max_positions=hf["max_position_embeddings"],
        position="learned", norm="post", tie_embeddings=hf.get("tie_word_embeddings", True), segment_vocab=0,
        causal=bool(hf.get("causal")), activation="gelu", norm_eps=hf.get("layer_norm_eps", 1e-12),
        lm_head="linear", languages=[id2lang[str(i)] for i in range(hf["n_langs"])] if hf["n_langs"] > 1 else [])


def activation(name: str) -> str:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation {name} (supported: {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


# Tensor names: ours <- theirs, `{i}` a layer; a tuple of theirs is concatenated along dim 0 (q, k, v).
BERT_LAYER = {
    "attn.qkv": ("attention.self.query", "attention.self.key", "attention.self.value"),
    "attn.proj": "attention.output.dense", "ln1": "attention.output.LayerNorm",
    "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense", "ln2": "output.LayerNorm"}
DISTILBERT_LAYER = {
    "attn.qkv": ("attention.q_lin", "attention.k_lin", "attention.v_lin"), "attn.proj": "attention.out_lin",
    "ln1": "sa_layer_norm", "mlp.fc1": "ffn.lin1", "mlp.fc2": "ffn.lin2", "ln2": "output_layer_norm"}
PRELAYERNORM_LAYER = {
    "ln1": "attention.LayerNorm", "attn.qkv": BERT_LAYER["attn.qkv"], "attn.proj": "attention.output.dense",
    "ln2": "intermediate.LayerNorm", "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}
ESM_LAYER = {"ln1": "attention.LayerNorm", "attn.qkv": BERT_LAYER["attn.qkv"], "attn.proj": "attention.output.dense",
             "ln2": "LayerNorm", "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}
XLM_LAYER = {"attn.qkv": ("attentions.{i}.q_lin", "attentions.{i}.k_lin", "attentions.{i}.v_lin"),
             "attn.proj": "attentions.{i}.out_lin", "ln1": "layer_norm1.{i}", "mlp.fc1": "ffns.{i}.lin1",
             "mlp.fc2": "ffns.{i}.lin2", "ln2": "layer_norm2.{i}"}
GPT2_LAYER = {"ln1": "ln_1", "attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj", "ln2": "ln_2",
              "mlp.fc1": "mlp.c_fc", "mlp.fc2": "mlp.c_proj"}
EMBEDDINGS = {"embeddings.token": "embeddings.word_embeddings", "embeddings.position": "embeddings.position_embeddings",
              "embeddings.segment": "embeddings.token_type_embeddings", "embeddings.norm": "embeddings.LayerNorm",
              "project": "embeddings_project", "pooler.dense": "pooler.dense"}
# the masked-LM head's four spellings (outside the base model's prefix): dense, LayerNorm, decoder
MLM_HEADS = [{"head.dense": "cls.predictions.transform.dense", "head.norm": "cls.predictions.transform.LayerNorm",
              "head.decoder": "cls.predictions.decoder", "head.decoder.bias": "cls.predictions.bias"},
             {"head.dense": "lm_head.dense", "head.norm": "lm_head.layer_norm", "head.decoder": "lm_head.decoder",
              "head.decoder.bias": "lm_head.bias"},
             {"head.dense": "generator_predictions.dense", "head.norm": "generator_predictions.LayerNorm",
              "head.decoder": "generator_lm_head", "head.decoder.bias": "generator_lm_head.bias"},
             {"head.dense": "vocab_transform", "head.norm": "vocab_layer_norm", "head.decoder": "vocab_projector",
              "head.decoder.bias": "vocab_projector.bias"}]


@dataclass
class Family:
    config: Callable[[dict], TransformerConfig]
    base: str  # the base model's prefix in task checkpoints (BertForMaskedLM's "bert."); absent in a bare model
    layers: str  # the blocks' prefix, before the layer index ("": the names place the index, `{i}`)
    layer: dict[str, Any]
    top: dict[str, str]  # embeddings, projection, pooler and final norm, relative to the base prefix
    heads: list[dict[str, str]]  # the LM head's spellings, outside the base prefix: the first found is read
    conv1d: bool = False  # GPT-2's Conv1D stores weights (in, out): transposed
    decoder_bias: bool = True  # the LM decoder has a bias of its own beside the head's (ESM's has none)


BERT_LIKE = dict(config=bert_config, layers="encoder.layer", layer=BERT_LAYER, top=EMBEDDINGS)


def preferring(i: int) -> list[dict[str, str]]:
    """The LM head spellings with the i-th first: the one an export of that family writes."""
    return [MLM_HEADS[i], *MLM_HEADS[:i], *MLM_HEADS[i + 1:]]


FAMILIES: dict[str, Family] = {
    "bert": Family(base="bert.", heads=preferring(0), **BERT_LIKE),
    "roberta": Family(base="roberta.", heads=preferring(1), **BERT_LIKE),
    "electra": Family(base="electra.", heads=preferring(2), **BERT_LIKE),
    "distilbert": Family(distilbert_config, "distilbert.", "transformer.layer", DISTILBERT_LAYER, EMBEDDINGS,
                         MLM_HEADS),
    "roberta-prelayernorm": Family(prelayernorm_config, "roberta_prelayernorm.", "encoder.layer", PRELAYERNORM_LAYER,
                                   {**EMBEDDINGS, "norm": "LayerNorm"}, [MLM_HEADS[1]]),
    "gpt2": Family(gpt2_config, "transformer.", "h", GPT2_LAYER,
                   {"embeddings.token": "wte", "embeddings.position": "wpe", "norm": "ln_f"},
                   [{"head.decoder": "lm_head"}], conv1d=True),
    "esm": Family(esm_config, "esm.", "encoder.layer", ESM_LAYER,
                  {"embeddings.token": "embeddings.word_embeddings", "embeddings.norm": "embeddings.layer_norm",
                   "norm": "encoder.emb_layer_norm_after"}, [MLM_HEADS[1]], decoder_bias=False),
    "xlm": Family(xlm_config, "transformer.", "", XLM_LAYER,
                  {"embeddings.token": "embeddings", "embeddings.position": "position_embeddings",
                   "embeddings.language": "lang_embeddings", "embeddings.norm": "layer_norm_emb"},
                  [{"head.decoder": "pred_layer.proj"}]),
}


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors: model.safetensors, else pytorch_model.bin as a plain state dict."""
    folder = Path(folder)
    if (folder / SAFETENSORS_FILE).is_file():
        return read_safetensors(folder / SAFETENSORS_FILE)
    if (folder / PICKLE_FILE).is_file():
        try:
            state = torch.load(folder / PICKLE_FILE, map_location="cpu", weights_only=True)
        except Exception as err:  # the weights-only unpickler refuses code objects; a torn file fails to unzip
            raise UserError(f"{folder / PICKLE_FILE}: not a plain state dict of tensors ({describe(err)}); "
                            "convert it to model.safetensors with the code that wrote it") from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise UserError(f"{folder / PICKLE_FILE}: not a plain state dict of tensors; "
                            "convert it to model.safetensors with the code that wrote it")
        return state
    raise UserError(f"{folder}: no {SAFETENSORS_FILE} or {PICKLE_FILE}; a sharded checkpoint is not supported")


def import_model(folder: Path) -> ImportedModel:
    """The checkpoint in `folder` as a Transformer in eval mode, its hidden states those of
    transformers' AutoModel on the same folder."""
    cfg, family = read_config(folder)
    theirs = read_weights(folder)
    cfg = dataclasses.replace(cfg, pooler=any(k.endswith("pooler.dense.weight") for k in theirs))
    if cfg.embedding_size is not None and family != "electra":
        raise UserError(f"{Path(folder) / CONFIG_FILE}: embedding_size {cfg.embedding_size} != hidden size "
                        f"for a {family} (only ELECTRA projects its embeddings)")
    return load_tensors(Transformer(cfg), family, theirs, folder)


def load_tensors(model: Transformer, family: str, theirs: dict[str, torch.Tensor], folder: Path) -> ImportedModel:
    """Load a `family` checkpoint's tensors into `model` (its LM head fresh where they have none)."""
    spec, cfg = FAMILIES[family], model.cfg
    theirs = {modern_name(k): v for k, v in theirs.items()}
    base = spec.base if any(k.startswith(spec.base) for k in theirs) else ""
    head = next((h for h in spec.heads if any(k.startswith(tuple(h.values())) for k in theirs)), {})
    ours = model.state_dict()
    loaded, used = {}, set()
    for target, keys in tensor_keys(cfg, family, base, head, ours).items():
        if not all(k in theirs for k in keys):
            continue
        tensors = [theirs[k].t() if conv1d_weight(spec, target, theirs[k]) else theirs[k] for k in keys]
        tensor = torch.cat(tensors) if len(tensors) > 1 else tensors[0]
        if target == "embeddings.position.weight":  # rows an export put before the table (see export_layout)
            tensor = tensor[len(tensor) - cfg.max_positions:]
        loaded[target] = fit_rows(tensor, ours[target], target, folder)
        used.update(keys)
    tied = cfg.tie_embeddings and "head.decoder.weight" not in loaded
    if tied:  # one tensor under two names: loading the stale one second would undo the embeddings
        loaded["head.decoder.weight"] = loaded["embeddings.token.weight"]
    fresh = [k for k in ours if k not in loaded and not (tied and k == "head.decoder.weight")]
    if any(not k.startswith("head.") for k in fresh):
        missing = [k for k in fresh if not k.startswith("head.")]
        raise UserError(f"{folder}: the {family} weights lack {len(missing)} tensors this config needs "
                        f"(e.g. {missing[0]}); is the weights file from another model?")
    model.load_state_dict({**ours, **loaded})
    unused = {k: theirs[k] for k in sorted(theirs) if k not in used and not k.endswith(("position_ids", "inv_freq"))}
    return ImportedModel(model.eval(), family, fresh, unused)


def modern_name(key: str) -> str:
    """LayerNorm.gamma/beta, TF-era names that transformers renames on every load and still writes for
    ESM, as LayerNorm.weight/bias."""
    for legacy, name in (("LayerNorm.gamma", "LayerNorm.weight"), ("LayerNorm.beta", "LayerNorm.bias")):
        if key.endswith(legacy):
            return key[: -len(legacy)] + name
    return key


def tensor_keys(cfg: TransformerConfig, family: str, base: str, head: dict[str, str],
                ours: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """Each of our tensors -> its checkpoint tensors (several: q, k and v, concatenated along dim 0)."""
    spec = FAMILIES[family]
    names: dict[str, Any] = {k: f"{base}{v}" for k, v in spec.top.items()}

    def layer_name(i: int, name: str) -> str:
        return f"{base}{spec.layers}.{i}.{name}" if spec.layers else f"{base}{name.format(i=i)}"

    for i in range(cfg.n_layers):
        for k, v in spec.layer.items():
            names[f"blocks.{i}.{k}"] = (tuple(layer_name(i, n) for n in v) if isinstance(v, tuple)
                                        else layer_name(i, v))
    names.update(head)
    keys = {}
    for target in ours:
        module, _, leaf = target.rpartition(".")
        source = names.get(target) or names.get(module)
        if source is not None:
            keys[target] = [source] if target in names else [
                f"{s}.{leaf}" for s in (source if isinstance(source, tuple) else [source])]
    return keys


def conv1d_weight(spec: Family, target: str, tensor: torch.Tensor) -> bool:
    """GPT-2's Conv1D blocks store weights (in, out), transposed from nn.Linear's."""
    return spec.conv1d and target.startswith("blocks.") and target.endswith(".weight") and tensor.dim() == 2


# Export: a model folder the pipeline writes is in a transformers architecture's layout where one
# computes exactly what ours does, so transformers loads it too. Its config.json keeps our config under
# EXPORT_KEY, so that lib.models.transformer reads the folder back to the identical Transformer.


def export_family(cfg: TransformerConfig) -> tuple[str | None, str]:
    """(the transformers family that computes exactly what `cfg` does, "") or (None, why there is none)."""
    if cfg.share_layers:
        return None, "layers shared across depth (ALBERT)"
    if cfg.languages:
        return xlm_family(cfg)
    if cfg.position == "rope":
        return rope_family(cfg)
    if cfg.position != "learned":
        return None, f"{cfg.position} positions"
    if cfg.embedding_norm and cfg.lm_head == "mlp":
        if cfg.norm == "post" and cfg.embedding_size is not None:
            return ("electra", "") if not cfg.causal and not cfg.position_offset else (None, "a causal ELECTRA")
        if cfg.embedding_size is not None:
            return None, "factorised embeddings with pre-LN layers"
        if cfg.norm == "post":
            return ("roberta" if cfg.position_offset else "bert"), ""
        return "roberta-prelayernorm", ""
    if (cfg.norm, cfg.embedding_norm, cfg.lm_head, cfg.causal) == ("pre", False, "linear", True) \
            and not cfg.segment_vocab and cfg.embedding_size is None and not cfg.position_offset:
        return "gpt2", ""
    return None, "this mix of LayerNorm placement, embedding LayerNorm and LM head"


def rope_family(cfg: TransformerConfig) -> tuple[str | None, str]:
    """ESM is transformers' one rotary family with BERT's embedding LayerNorm and LM head (pre-LN)."""
    if cfg.norm != "pre":
        return None, "rope positions with post-LN layers"
    if cfg.segment_vocab:
        return None, "rope positions with segment embeddings (ESM, the pre-LN rotary family, has no token types; " \
                     "model.segment_vocab: 0 exports)"
    if cfg.embedding_size is not None or cfg.lm_head != "mlp" or cfg.activation != "gelu":
        return None, "rope positions with factorised embeddings, GPT-2's LM head or tanh GELU"
    return "esm", ""


def xlm_family(cfg: TransformerConfig) -> tuple[str | None, str]:
    """XLM is transformers' one family with language embeddings; it has one shape of its own."""
    needs = {"model.position: learned": cfg.position == "learned", "model.norm: post": cfg.norm == "post",
             "model.lm_head: linear": cfg.lm_head == "linear", "model.segment_vocab: 0": not cfg.segment_vocab,
             f"model.d_ff: {4 * cfg.d_model} (4 x d_model)": cfg.d_ff == 4 * cfg.d_model,
             "model.embedding_size: null": cfg.embedding_size is None,
             "exact GELU, an embedding LayerNorm, positions from 0": (cfg.activation, cfg.embedding_norm,
                                                                     cfg.position_offset) == ("gelu", True, 0)}
    missing = [need for need, met in needs.items() if not met]
    if missing:
        return None, f"language embeddings (XLM); transformers' XLM needs {', '.join(missing)}"
    return "xlm", ""


def export_layout(model: Transformer, family: str, special_ids: dict[str, int],
                  language: int | None = None) -> tuple[dict, dict]:
    """(config.json, tensors) of `model` in `family`'s layout. Positions: RoBERTa-style families
    number real tokens from padding_idx + 1, so a model whose table starts at 0 gets that many zero
    rows in front; token types: a model with none gets one zero row where the family needs them.
    Languages: where ours reads a row when given no language ids (`language`, else the first), XLM adds
    none, so that row moves into every position's (and out of every language's): the same sums with
    language ids, and without them XLM reads that language as ours does."""
    cfg, spec = model.cfg, FAMILIES[family]
    pad = special_ids.get("pad", 0)
    shift = pad + 1 - cfg.position_offset if family in ("roberta", "roberta-prelayernorm") else 0
    if shift < 0:
        raise ValueError(f"position_offset {cfg.position_offset} does not fit pad id {pad}")
    ours = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if family == "xlm":
        row = ours["embeddings.language.weight"][language or 0]
        ours["embeddings.position.weight"] = ours["embeddings.position.weight"] + row
        ours["embeddings.language.weight"] = ours["embeddings.language.weight"] - row
    tensors = {}
    for target, keys in tensor_keys(cfg, family, spec.base, spec.heads[0], ours).items():
        if target == "head.decoder.weight" and cfg.tie_embeddings:
            continue  # transformers ties it to the embeddings itself
        tensor = ours[target]
        if target in ("embeddings.token.weight", "head.decoder.weight", "head.decoder.bias"):
            tensor = tensor[: cfg.vocab_size]  # the padding rows are ours alone
        if target == "embeddings.position.weight" and shift:
            tensor = torch.cat([tensor.new_zeros(shift, tensor.shape[1]), tensor])
        for key, part in zip(keys, tensor.chunk(len(keys))):
            tensors[key] = (part.t() if conv1d_weight(spec, target, part) else part).contiguous()
    head = spec.heads[0]
    if spec.decoder_bias and "head.decoder.bias" in head and head["head.decoder.bias"] != f"{head['head.decoder']}.bias":
        # transformers ties the decoder's bias to the head's only while it ties the decoder to the embeddings
        tensors[f"{head['head.decoder']}.bias"] = tensors[head["head.decoder.bias"]].clone()
    if "embeddings.segment" in spec.top and not cfg.segment_vocab:  # the family has token types: one zero row
        tensors[f"{spec.base}embeddings.token_type_embeddings.weight"] = torch.zeros(1, cfg.embedding_dim)
    if family == "xlm":  # its decoder has a bias; GPT-2's, which ours is, has none
        tensors["pred_layer.proj.bias"] = torch.zeros(cfg.vocab_size)
    return export_config(cfg, family, special_ids, shift), tensors


def export_config(cfg: TransformerConfig, family: str, special_ids: dict[str, int], shift: int) -> dict:
    act = {"gelu": "gelu", "gelu_tanh": "gelu_new"}[cfg.activation]
    ids = {f"{role}_token_id": special_ids[role] for role in ("pad", "bos", "eos") if role in special_ids}
    if family == "esm":
        hf = dict(hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                  intermediate_size=cfg.d_ff, hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout,
                  max_position_embeddings=cfg.max_positions, layer_norm_eps=cfg.norm_eps, is_decoder=cfg.causal,
                  position_embedding_type="rotary", rope_theta=ROPE_BASE, emb_layer_norm_before=cfg.embedding_norm,
                  token_dropout=False, mask_token_id=special_ids.get("mask"))
    elif family == "xlm":
        index = {f"{role}_index": special_ids[role] for role in ("pad", "bos", "eos", "unk", "mask") if role in special_ids}
        hf = dict(emb_dim=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, dropout=cfg.dropout,
                  attention_dropout=cfg.dropout, gelu_activation=True, sinusoidal_embeddings=False, causal=cfg.causal,
                  asm=False, n_langs=len(cfg.languages), use_lang_emb=True, max_position_embeddings=cfg.max_positions,
                  layer_norm_eps=cfg.norm_eps, lang2id={code: i for i, code in enumerate(cfg.languages)},
                  id2lang=dict(enumerate(cfg.languages)), mask_token_id=special_ids.get("mask", 0), **index)
    elif family == "gpt2":
        hf = dict(n_embd=cfg.d_model, n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.d_ff,
                  activation_function=act, resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout,
                  n_positions=cfg.max_positions, layer_norm_epsilon=cfg.norm_eps)
    else:
        hf = dict(hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                  intermediate_size=cfg.d_ff, hidden_act=act, hidden_dropout_prob=cfg.dropout,
                  attention_probs_dropout_prob=cfg.dropout, max_position_embeddings=cfg.max_positions + shift,
                  type_vocab_size=max(cfg.segment_vocab, 1), layer_norm_eps=cfg.norm_eps, is_decoder=cfg.causal,
                  position_embedding_type="absolute")
        if cfg.embedding_size is not None:
            hf["embedding_size"] = cfg.embedding_size
    architecture = ARCHITECTURES[family][cfg.causal]
    return {"model_type": family, "architectures": [architecture], "vocab_size": cfg.vocab_size, "tie_word_embeddings": cfg.tie_embeddings,
            **hf, **ids, EXPORT_KEY: dataclasses.asdict(cfg)}


# family -> (bidirectional, causal) transformers class with the LM head
ARCHITECTURES = {"bert": ("BertForMaskedLM", "BertLMHeadModel"), "roberta": ("RobertaForMaskedLM", "RobertaForCausalLM"),
                 "electra": ("ElectraForMaskedLM", None),
                 "roberta-prelayernorm": ("RobertaPreLayerNormForMaskedLM", "RobertaPreLayerNormForCausalLM"),
                 "gpt2": (None, "GPT2LMHeadModel"),
                 # transformers has no causal ESM class: a causal model's EsmForMaskedLM (is_decoder) gives
                 # next-token logits, without generate()
                 "esm": ("EsmForMaskedLM", "EsmForMaskedLM"),
                 "xlm": ("XLMWithLMHeadModel", "XLMWithLMHeadModel")}

# Task models: the sequence classifier of each family, (class, the names there of the plain head's layers:
# its dense layer (None: it has none), its output layer), and the prefix of its other task classes (each
# task type (lib/tasks) names the ones of its own)
SEQUENCE_CLASSIFIERS = {
    "bert": ("BertForSequenceClassification", "bert.pooler.dense", "classifier"),
    "roberta": ("RobertaForSequenceClassification", "classifier.dense", "classifier.out_proj"),
    "roberta-prelayernorm": ("RobertaPreLayerNormForSequenceClassification", "classifier.dense",
                             "classifier.out_proj"),
    "electra": ("ElectraForSequenceClassification", "classifier.dense", "classifier.out_proj"),
    "gpt2": ("GPT2ForSequenceClassification", None, "score"),
    "esm": ("EsmForSequenceClassification", "classifier.dense", "classifier.out_proj"),
    "xlm": ("XLMForSequenceClassification", None, "sequence_summary.summary"),  # on the first token, no dense
}
CLASS_PREFIXES = {"bert": "Bert", "roberta": "Roberta", "roberta-prelayernorm": "RobertaPreLayerNorm",
                  "electra": "Electra", "gpt2": "GPT2", "esm": "Esm", "xlm": "XLM"}


def load_exported(folder: Path, cfg: TransformerConfig,
                  tensors: dict[str, torch.Tensor] | None = None) -> Transformer:
    """A folder save_model wrote in a transformers layout, back into the identical Transformer;
    `tensors`: its read_weights, where the caller has them already (a task head's are among them)."""
    family, _ = export_family(cfg)
    return load_tensors(Transformer(cfg), family, read_weights(folder) if tensors is None else tensors, folder).model


def fit_rows(tensor: torch.Tensor, like: torch.Tensor, name: str, folder: Path) -> torch.Tensor:
    """`tensor` in `like`'s shape: the vocabulary's padding rows (embeddings, decoder) added as zeros."""
    if tensor.shape == like.shape:
        return tensor.to(like.dtype)
    if tensor.shape[1:] == like.shape[1:] and tensor.shape[0] < like.shape[0] and name.endswith(
            ("embeddings.token.weight", "head.decoder.weight", "head.decoder.bias")):
        padded = torch.zeros_like(like)
        padded[: len(tensor)] = tensor
        return padded
    raise UserError(f"{folder}: tensor for {name} is {tuple(tensor.shape)}, its config.json implies {tuple(like.shape)}")


def import_tokenizer(folder: Path, vocab_size: int) -> tuple[Tokenizer, dict[str, str], bool]:
    """(the checkpoint's fast tokenizer without padding or truncation, role -> special token for
    pad/unk/bos/eos/mask, lowercase). GPT-2-style tokenizers with one special token use it for every role."""
    folder = Path(folder)
    path = folder / TOKENIZER_FILE
    if not path.is_file():
        raise UserError(f"{folder}: no {TOKENIZER_FILE}; save the fast tokenizer there "
                        "(AutoTokenizer.from_pretrained(folder).save_pretrained(folder))")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises plain Exceptions on malformed files
        raise UserError(f"{path}: not a tokenizers file ({describe(err)})") from None
    tokenizer.no_padding()  # a checkpoint's own (sentence-transformers pads to 128) would miscount every length
    tokenizer.no_truncation()
    if tokenizer.get_vocab_size() > vocab_size:
        raise UserError(f"{path}: {tokenizer.get_vocab_size()} tokens, but the model has {vocab_size} embeddings; "
                        "the tokenizer belongs to another model")
    named = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        try:
            named = {**json.loads((folder / name).read_text(encoding="utf-8")), **named}
        except (OSError, ValueError):
            continue
    content = {k: v["content"] if isinstance(v, dict) else v for k, v in named.items() if k.endswith("_token")}
    roles = {"pad": content.get("pad_token"), "unk": content.get("unk_token"),
             "bos": content.get("cls_token") or content.get("bos_token"),
             "eos": content.get("sep_token") or content.get("eos_token"), "mask": content.get("mask_token")}
    fallback = roles["eos"] or roles["bos"]
    roles = {role: token or fallback for role, token in roles.items()}
    missing = [role for role, token in roles.items() if token is None or tokenizer.token_to_id(token) is None]
    if missing:
        raise UserError(f"{folder}: special tokens for {', '.join(missing)} not found in {TOKENIZER_FILE} "
                        "(special_tokens_map.json names them)")
    return tokenizer, roles, bool(named.get("do_lower_case")) or lowercases(json.loads(tokenizer.to_str())["normalizer"])


def lowercases(normalizer: Any) -> bool:
    """Whether a tokenizer.json normalizer (possibly a Sequence) lowercases."""
    if isinstance(normalizer, dict):
        return normalizer.get("type") == "Lowercase" or bool(normalizer.get("lowercase")) or any(
            lowercases(n) for n in normalizer.get("normalizers", []))
    return False


def describe_import(imported: ImportedModel, spec: str) -> str:
    """One line for the log: what was loaded, and what was not."""
    line = (f"init: {spec}: a {imported.family} with {imported.model.num_params():,} parameters "
            f"({imported.model.cfg.n_layers} layers, width {imported.model.cfg.d_model})")
    if imported.fresh:
        line += f"; no {', '.join(sorted({k.rsplit('.', 1)[0] for k in imported.fresh}))} in the checkpoint: initialised fresh"
    if imported.unused:
        line += f"; {len(imported.unused)} tensors not used (e.g. {next(iter(imported.unused))})"
    return line


def init_folder(params: Params) -> Path:
    """The local folder of the published checkpoint params.init names (downloaded, or taken from the mirror,
    when it is a hub id)."""
    return resolve(params.init, project_root(), params.data.models_mirror)


def save_tokenizer(folder: Path, spec: str, out_dir: Path) -> Tokenizer:
    """The checkpoint's tokenizer as a tokenizer folder of this pipeline (lib.data.tokenizer.write_folder),
    written whole or not at all; returns it."""
    cfg, family = read_config(folder)
    tokenizer, roles, lowercase = import_tokenizer(folder, cfg.vocab_size)
    algorithm = json.loads(tokenizer.to_str())["model"]["type"].lower()
    with atomic_dir(out_dir) as tmp:
        write_folder(tokenizer, roles, tmp, {"algorithm": algorithm, "lowercase": lowercase, "init": spec,
                                             "family": family})
    return tokenizer


if __name__ == "__main__":  # python -m lib.models.hf <folder>: what an import would do
    print(describe_import(import_model(Path(sys.argv[1])), sys.argv[1]))
