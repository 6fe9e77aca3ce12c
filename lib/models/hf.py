"""Published models in Hugging Face layout, read exactly into the models of lib/models/architectures/.

A published model is a folder with `config.json` (its `model_type` names the family), `model.safetensors`
or `pytorch_model.bin` (read with torch's weights-only unpickler: tensors, never code) and the fast
tokenizer's `tokenizer.json`; or `hf:<repo id>[@revision]`, downloaded once through huggingface_hub
into its cache (or taken from `data.models_mirror/<name>` when that folder exists, the way datasets
come from `data.mirror`).

Each family (lib/models/families/, one module each) maps its config onto the Transformer's fields and
its tensor names onto ours (an encoder-decoder's, T5's or BART's, those of its two stacks: Family.stacks);
this module reads and writes published models from those descriptions alone.
The vocabulary rows the Transformer pads to a multiple of 64 are zeros. Tensors the published model lacks
(an encoder saved without its LM head) are initialised fresh and named in `ImportedModel.fresh`.

The same tables export: lib.models.folder.write_model writes a model as the family that computes exactly what
it does (export_family), so the folders the pipeline writes load in transformers too; a classifier's
head joins them where the family's task model has the same head (lib.tasks.model).
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from lib.config.errors import UserError
from lib.config.params import HUB_PREFIX, Params
from lib.core.errors import describe
from lib.core.io import atomic_dir, project_root, read_safetensors
from lib.data.tokenizer import write_folder
from lib.models.architectures import Seq2SeqConfig, Transformer, build_model
from lib.models.config import TransformerConfig
from lib.models.families import FAMILIES
from lib.models.families.base import Family

CONFIG_FILE, SAFETENSORS_FILE, PICKLE_FILE, TOKENIZER_FILE = (
    "config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json")
# what a download fetches: the config, the weights (both files where a repo has both), the tokenizer's files
HUB_FILES = [CONFIG_FILE, SAFETENSORS_FILE, PICKLE_FILE, TOKENIZER_FILE, "tokenizer_config.json",
             "special_tokens_map.json"]
EXPORT_KEY = "transfer_pipeline"  # our config inside a transformers config.json (export_layout)
REPO_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")


@dataclass
class ImportedModel:
    model: Transformer
    family: str  # its name
    fresh: list[str]  # our tensor names the published model did not have (initialised fresh)
    unused: dict[str, torch.Tensor]  # the published model's tensors not mapped into the model (heads of other tasks), by name

    def discriminator_head(self) -> dict[str, torch.Tensor]:
        """The published model's replaced-token detection head (an ELECTRA discriminator's), under the names of
        lib.objectives.electra.DiscriminatorHead (the same as transformers'); {} if it has none."""
        prefix = FAMILIES[self.family].detector_head
        return {k.removeprefix(prefix): v for k, v in self.unused.items() if prefix and k.startswith(prefix)}


def resolve(spec: str, root: Path, mirror: str | None, key: str = "init") -> Path:
    """The local folder of `spec`: a path (relative to the project `root`), the mirror's copy of a
    hub id, or the hub id downloaded into huggingface_hub's cache."""
    if not spec.startswith(HUB_PREFIX):
        folder = root / spec
        if not folder.is_dir():
            raise UserError(f"{key}: '{spec}' is not a folder (from {root}); name a model folder in Hugging Face "
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


def read_config(folder: Path) -> tuple[TransformerConfig, Family]:
    """(the Transformer's config, the family) from a published model's config.json."""
    path = Path(folder) / CONFIG_FILE
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
        name = hf["model_type"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"{path}: not a Hugging Face model config ({describe(err)}); point at a model folder "
                        "with config.json, model.safetensors (or pytorch_model.bin) and tokenizer.json") from None
    if name not in FAMILIES:
        raise UserError(f"{path}: model_type '{name}' is not supported; supported: {', '.join(FAMILIES)}")
    try:
        return FAMILIES[name].config(hf), FAMILIES[name]
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"{path}: cannot map this {name} config ({describe(err)})") from None


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The published model's tensors: model.safetensors, else pytorch_model.bin as a plain state dict."""
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
    raise UserError(f"{folder}: no {SAFETENSORS_FILE} or {PICKLE_FILE}; a sharded model is not supported")


def import_model(folder: Path) -> ImportedModel:
    """The published model in `folder` as a Transformer (an EncoderDecoder for an encoder-decoder family) in
    eval mode, its hidden states those of transformers' AutoModel on the same folder."""
    cfg, family = read_config(folder)
    theirs = read_weights(folder)
    cfg = family.weights_config(dataclasses.replace(cfg, pooler=any(k.endswith("pooler.dense.weight") for k in theirs)),
                                theirs)
    if cfg.embedding_size is not None and not family.projects_embeddings:
        projecting = " or ".join(f.title for f in FAMILIES.values() if f.projects_embeddings)
        raise UserError(f"{Path(folder) / CONFIG_FILE}: embedding_size {cfg.embedding_size} != hidden size "
                        f"for a {family.name} (only {projecting} projects its embeddings)")
    return load_tensors(build_model(cfg), family, theirs, folder)


def load_tensors(model: Transformer, family: Family, theirs: dict[str, torch.Tensor], folder: Path) -> ImportedModel:
    """Load a `family` model's tensors into `model` (its LM head fresh where they have none)."""
    cfg = model.cfg
    theirs = {modern_name(k): v for k, v in theirs.items()}
    base = family.base if any(k.startswith(family.base) for k in theirs) else ""
    head = next((h for h in family.heads if any(k.startswith(tuple(h.values())) for k in theirs)), {})
    ours = model.state_dict()
    loaded, used = {}, fold_aliases(family, base, theirs, folder)
    for name in family.zero_tensors(cfg):
        if name in theirs:
            if theirs[name].any():
                raise UserError(f"{folder}: {name} is not all zeros; the models here compute it as zeros only")
            used.add(name)
    for target, keys in tensor_keys(cfg, family, base, head, ours).items():
        if not all(k in theirs for k in keys):
            continue
        tensors = [theirs[k].t() if conv1d_weight(family, target, theirs[k]) else theirs[k] for k in keys]
        tensor = torch.cat(tensors) if len(tensors) > 1 else tensors[0]
        if target == "embeddings.position.weight":  # rows an export put before the table (see export_layout)
            tensor = tensor[len(tensor) - cfg.max_positions:]
        loaded[target] = fit_rows(tensor, ours[target], target, folder)
        used.update(keys)
    stacks = [stack.ours for stack in family.stacks(cfg)]
    for stack in stacks:  # one tensor under two names: loading the stale one second would undo the embeddings
        table = f"{stack}embeddings.token.weight"
        if cfg.tie_embeddings and f"{stack}head.decoder.weight" not in loaded and table in loaded:
            loaded[f"{stack}head.decoder.weight"] = loaded[table]
    fresh = [k for k in ours if k not in loaded]
    missing = [k for k in fresh if not in_stack(k, stacks).startswith("head.")]
    if missing:
        raise UserError(f"{folder}: the {family.name} weights lack {len(missing)} tensors this config needs "
                        f"(e.g. {missing[0]}); is the weights file from another model?")
    model.load_state_dict({**ours, **loaded})
    unused = {k: theirs[k] for k in sorted(theirs) if k not in used and not k.endswith(("position_ids", "inv_freq"))}
    return ImportedModel(model.eval(), family.name, fresh, unused)


def fold_aliases(family: Family, base: str, theirs: dict[str, torch.Tensor], folder: Path) -> set[str]:
    """Their tensors stored under several names (Family.aliases) read under the first name, once checked equal
    (one tensor of ours holds them); returns the other names."""
    folded = set()
    for first, others in family.aliases.items():
        names = [f"{base}{name}" for name in (first, *others) if f"{base}{name}" in theirs]
        for name in names[1:]:
            if not torch.equal(theirs[name], theirs[names[0]]):
                raise UserError(f"{folder}: {name} differs from {names[0]}; the models here hold one tensor for both")
        if names:
            theirs[f"{base}{first}"] = theirs[names[0]]
            folded.update(name for name in names if name != f"{base}{first}")
    return folded


def in_stack(name: str, stacks: list[str]) -> str:
    """Our tensor `name` without its stack's prefix (Family.stacks: "" but in an encoder-decoder)."""
    return name.removeprefix(next(stack for stack in stacks if name.startswith(stack)))


def modern_name(key: str) -> str:
    """LayerNorm.gamma/beta, TF-era names that transformers renames on every load and still writes for
    ESM, as LayerNorm.weight/bias."""
    for legacy, name in (("LayerNorm.gamma", "LayerNorm.weight"), ("LayerNorm.beta", "LayerNorm.bias")):
        if key.endswith(legacy):
            return key[: -len(legacy)] + name
    return key


def tensor_keys(cfg: TransformerConfig, family: Family, base: str, head: dict[str, str],
                ours: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """Each of our tensors -> its tensors in the published model (several: q, k and v, concatenated along dim 0)."""
    names: dict[str, Any] = {}

    def layer_name(layers: str, i: int, name: str) -> str:
        return f"{base}{layers}.{i}.{name}" if layers else f"{base}{name.format(i=i)}"

    for stack in family.stacks(cfg):
        names.update({f"{stack.ours}{k}": f"{base}{v}" for k, v in stack.top.items()})
        for i in range(stack.depth):
            for k, v in stack.layer.items():
                names[f"{stack.ours}blocks.{i}.{k}"] = (tuple(layer_name(stack.layers, i, n) for n in v)
                                                        if isinstance(v, tuple) else layer_name(stack.layers, i, v))
        names.update({f"{stack.ours}{k}": v for k, v in head.items()})
    keys = {}
    for target in ours:
        module, _, leaf = target.rpartition(".")
        source = names.get(target) or names.get(module)
        if source is not None:
            keys[target] = [source] if target in names else [
                f"{s}.{leaf}" for s in (source if isinstance(source, tuple) else [source])]
    return keys


def conv1d_weight(family: Family, target: str, tensor: torch.Tensor) -> bool:
    """Conv1D blocks (GPT-2's) store weights (in, out), transposed from nn.Linear's."""
    return family.conv1d and target.startswith("blocks.") and target.endswith(".weight") and tensor.dim() == 2


# Export: a model folder the pipeline writes is in a transformers architecture's layout where one
# computes exactly what ours does, so transformers loads it too. Its config.json keeps our config under
# EXPORT_KEY, so that lib.models.folder reads the folder back to the identical model.


def export_family(cfg: TransformerConfig) -> tuple[Family | None, str]:
    """(the transformers family that computes exactly what `cfg` does, "") or (None, why there is none)."""
    if cfg.share_layers:
        return None, "layers shared across depth (ALBERT)"
    family = next((f for f in FAMILIES.values()
                   if f.encoder_decoder == isinstance(cfg, Seq2SeqConfig) and f.covers(cfg)), None)
    if family is None:
        return None, (f"{cfg.position} positions" if cfg.position != "learned"
                      else "this mix of LayerNorm placement, embedding LayerNorm and LM head")
    why = family.mismatch(cfg)
    return (None, why) if why else (family, "")


def export_layout(model: Transformer, family: Family, special_ids: dict[str, int],
                  language: int | None = None) -> tuple[dict, dict]:
    """(config.json, tensors) of `model` in `family`'s layout. Positions: where the family numbers real
    tokens from padding_idx + 1, a model whose table starts at 0 gets that many zero rows in front; token
    types: a model with none gets one zero row where the family needs them; `language`: the row of the
    language embeddings read without language ids (Family.fold_for_export)."""
    cfg = model.cfg
    pad = special_ids.get("pad", 0)
    shift = pad + 1 - cfg.position_offset if family.positions_after_padding else 0
    if shift < 0:
        raise ValueError(f"position_offset {cfg.position_offset} does not fit pad id {pad}")
    ours = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    family.fold_for_export(ours, language)
    tensors = {}
    head = family.heads[0]
    stacks = [stack.ours for stack in family.stacks(cfg)]
    for target, keys in tensor_keys(cfg, family, family.base, head, ours).items():
        if in_stack(target, stacks) == "head.decoder.weight" and cfg.tie_embeddings:
            continue  # transformers ties it to the embeddings itself
        tensor = ours[target]
        if in_stack(target, stacks) in ("embeddings.token.weight", "head.decoder.weight", "head.decoder.bias"):
            tensor = tensor[: cfg.vocab_size]  # the padding rows are ours alone
        if target == "embeddings.position.weight" and shift:
            tensor = torch.cat([tensor.new_zeros(shift, tensor.shape[1]), tensor])
        for key, part in zip(keys, tensor.chunk(len(keys))):
            tensors[key] = (part.t() if conv1d_weight(family, target, part) else part).contiguous()
    decoder_bias = f"{head['head.decoder']}.bias"
    if family.decoder_bias and decoder_bias not in tensors:
        # transformers ties the decoder's bias to the head's only while it ties the decoder to the
        # embeddings; a decoder of ours without a bias (GPT-2's kind) has a zero one
        tensors[decoder_bias] = (tensors[head["head.decoder.bias"]].clone() if "head.decoder.bias" in head
                                 else torch.zeros(cfg.vocab_size))
    if not cfg.tie_embeddings:  # transformers may tie these to the first only while the LM head is tied too (BART)
        for first, others in family.aliases.items():
            tensors.update({f"{family.base}{name}": tensors[f"{family.base}{first}"].clone() for name in others})
    tensors.update(family.zero_tensors(cfg))
    if "embeddings.segment" in family.top and not cfg.segment_vocab:  # the family has token types: one zero row
        tensors[f"{family.base}embeddings.token_type_embeddings.weight"] = torch.zeros(1, cfg.embedding_dim)
    ids = {f"{role}_token_id": special_ids[role] for role in ("pad", "bos", "eos") if role in special_ids}
    config = {"model_type": family.name, "architectures": [family.lm_classes[cfg.causal]],
              "vocab_size": cfg.vocab_size, "tie_word_embeddings": cfg.tie_embeddings,
              **family.export_config(cfg, special_ids, shift), **ids, EXPORT_KEY: dataclasses.asdict(cfg)}
    return config, tensors


def load_exported(folder: Path, cfg: TransformerConfig,
                  tensors: dict[str, torch.Tensor] | None = None) -> Transformer:
    """A folder write_model wrote in a transformers layout, back into the identical Transformer;
    `tensors`: its read_weights, where the caller has them already (a task head's are among them)."""
    family, _ = export_family(cfg)
    return load_tensors(build_model(cfg), family, read_weights(folder) if tensors is None else tensors, folder).model


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
    """(the published model's fast tokenizer without padding or truncation, role -> special token for
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
    tokenizer.no_padding()  # a published model's own (sentence-transformers pads to 128) would miscount every length
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
        line += f"; no {', '.join(sorted({k.rsplit('.', 1)[0] for k in imported.fresh}))} in the published model: initialised fresh"
    if imported.unused:
        line += f"; {len(imported.unused)} tensors not used (e.g. {next(iter(imported.unused))})"
    return line


def init_folder(params: Params) -> Path:
    """The local folder of the published model params.init names (downloaded, or taken from the mirror,
    when it is a hub id)."""
    return resolve(params.init, project_root(), params.data.models_mirror)


def save_tokenizer(folder: Path, spec: str, out_dir: Path) -> Tokenizer:
    """The published model's tokenizer as a tokenizer folder of this pipeline (lib.data.tokenizer.write_folder),
    written whole or not at all; returns it."""
    cfg, family = read_config(folder)
    tokenizer, roles, lowercase = import_tokenizer(folder, cfg.vocab_size)
    algorithm = json.loads(tokenizer.to_str())["model"]["type"].lower()
    with atomic_dir(out_dir) as tmp:
        write_folder(tokenizer, roles, tmp, {"algorithm": algorithm, "lowercase": lowercase, "init": spec,
                                             "family": family.name})
    return tokenizer

