"""Model cards: the README.md of every model folder the pipeline writes, in the form the Hugging Face hub
reads (YAML front matter, then markdown), so that a folder explains itself wherever it goes (uploaded with
lib/serving/hub_upload.py, logged to MLflow, copied).

A card says what the model is; how it came to be, a row per stage of its chain (what the stage did, on
which data at which pinned revision); its scores on named splits; which code and params made it; how to
load it; and what it is not for. A stage writes the card into the folder before the folder is renamed
into place (lib.core.io.atomic_dir), and takes the rows of the stages before it from the card of the
folder its model started from (`upstream`), so a student's card tells its whole chain.

huggingface_hub's ModelCardData writes the front matter in the hub's schema: license, library_name
(where the folder loads in transformers), base_model (the published model params `init` named),
datasets (the chain's hub datasets), tags, pipeline_tag, and model-index (scores on the evaluation split).

A card holds no date: a stage run again with the same code, params and results writes the same bytes,
and DVC sees its output unchanged.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from lib.config.params import HUB_PREFIX, CorpusConfig, Params
from lib.core import tracking
from lib.data.sources import parse_hub
from lib.models.architectures import Seq2SeqConfig
from lib.models.config import TransformerConfig
from lib.models.folder import read_config, read_config_json

CARD_FILE = "README.md"
PIPELINE = "transfer-pipeline"  # the project: every card's tag
LICENSE = "apache-2.0"  # the project's
# the hub's task (pipeline_tag) of a language model's transformers class, by how the class name ends (a task
# model's is its type's, lib.tasks.model.card_facts)
LM_CLASSES = {"ForMaskedLM": "fill-mask", "ForCausalLM": "text-generation", "LMHeadModel": "text-generation",
              "ForConditionalGeneration": "text2text-generation"}  # the last: T5, BART
STAGE_TAGS = {"pretrain": "pretraining", "adapt": "domain-adaptation", "finetune": "finetuned",
              "distill": "distillation"}
TRAINING_HEADER = ["stage", "what it did", "data"]
MODEL = "MODEL"  # in the card's code: the folder's path (or, for transformers, its hub repo id)
KEPT = {"head": "its start", "tail": "its end", "head_tail": "its start and its end"}  # by tasks.<name>.truncation


def write_model_card(folder: Path, stage: str, params: Params, measured: dict[str, Any],
                     upstream: Path | None = None) -> None:
    """folder/README.md: the card of the model `stage` has just written into `folder`, from params and
    what the stage measured:
    - pretrain, adapt: the metrics the stage writes (metrics/<stage>.json);
    - finetune, distill: the classifier.json entries of the model (task, type, label_names, variant, seed,
      dev, eval_split, eval, encoding; distill's teacher) plus "transformers" (save_task_model's line),
      lib.tasks.model.card_facts ("served": whether lib.serving.predict classifies raw text with it;
      "task_model" and "pipeline_tag" of its transformers task model), "params" (its parameter
      count), "examples" ({train, dev, eval}: how many), "best_epoch", and distill's "teacher_scores"
      ({dev, eval}) and "transfer" ({labeled, unlabeled}).
    `upstream`: the folder the model's weights started from (the stage's input model), whose card's
    chain and datasets this one carries on; None where they started random."""
    before = ModelCard.load(upstream / CARD_FILE) if upstream and (upstream / CARD_FILE).is_file() else None
    # where the chain's weights started: random (the project's license) or the published model params `init` names
    # (its license, None here; base_model where it is a published one), as the upstream card says
    from_init = stage == "pretrain" and params.init is not None
    base_model = before.data.base_model if before else _published_base(params) if from_init else None
    license = before.data.license if before else None if from_init else LICENSE
    task = measured.get("task")
    cfg, cls = read_config(folder), transformers_class(folder)
    hub_task = _hub_task(cls, measured)
    loads = cls is not None and (task is None or hub_task is not None)  # as the model it is
    if cfg.causal and hub_task == "fill-mask":  # an ESM (which has no causal class) that predicts the next token
        hub_task = None
    if not cfg.causal and hub_task == "text-generation":  # XLMWithLMHeadModel, a masked LM where bidirectional
        hub_task = "fill-mask"
    datasets = list(dict.fromkeys([*(before.data.datasets or [] if before else []), *_datasets(stage, params, task)]))
    scores = _eval_results(params, measured, hub_task) if task else None
    data = ModelCardData(
        license=license, library_name="transformers" if loads else None,
        base_model=base_model, datasets=datasets or None, pipeline_tag=hub_task, language=cfg.languages or None,
        tags=[PIPELINE, STAGE_TAGS[stage], *([] if task else [measured["objective"]])],
        model_name=f"{PIPELINE}-{task}-{_role(stage)}" if scores else None, eval_results=scores)
    rows = [*(_training_rows(before.text) if before else []), _training_row(stage, params, measured, upstream)]
    sections = [_title(stage, params, measured), _model_section(cfg, measured, cls, loads, hub_task),
                "## Training\n\n" + _table(TRAINING_HEADER, rows),
                "## Evaluation\n\n" + _evaluation(stage, params, measured),
                "## How to use\n\n" + _how_to_use(measured, cls if loads else None),
                "## Intended use and limits\n\n" + _limits(params, measured, base_model, license is None, cfg.languages),
                "## Provenance\n\n" + _provenance(stage, params)]
    (folder / CARD_FILE).write_text(f"---\n{data.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n", encoding="utf-8")


def transformers_class(folder: Path) -> str | None:
    """The transformers class whose layout the folder's config.json has (its `architectures`), None for a
    folder in lib's own layout. A classifier in lib's layout keeps its backbone's class here: a language
    model's, not a task model's."""
    config = read_config_json(folder)
    return config["architectures"][0] if "model_type" in config and config.get("architectures") else None


def _hub_task(cls: str | None, m: dict[str, Any]) -> str | None:
    """The hub's pipeline_tag of the model whose transformers class is `cls`: a task model's (`m` names its
    task) where `cls` is its type's transformers task model (lib.tasks.model.card_facts), a language
    model's by how `cls` ends; None where the class is not one (a task model in lib's layout has its
    backbone's class)."""
    if m.get("task") is None:
        return next((tag for end, tag in LM_CLASSES.items() if cls and cls.endswith(end)), None)
    return m.get("pipeline_tag") if cls and m.get("task_model") and cls.endswith(m["task_model"]) else None


def _role(stage: str) -> str:
    return "student" if stage == "distill" else "teacher"


def _published_base(params: Params) -> str | None:
    """The hub repo of the published model params `init` names (a local folder is none)."""
    return parse_hub(params.init, "init").repo if params.init and params.init.startswith(HUB_PREFIX) else None


def _datasets(stage: str, params: Params, task: str | None) -> list[str]:
    """The hub datasets `stage` read (a local source is none)."""
    if task:
        source = params.tasks[task].source
    elif stage == "adapt":
        source = params.corpora.domain.source
    else:  # a published model pretrain keeps as it is read none
        source = None if params.init and params.pretrain.with_init == "keep" else params.corpora.pretrain.source
    return [parse_hub(source, "source").repo] if source and source.startswith(HUB_PREFIX) else []


def _source(source: str, splits: str) -> str:
    """A source with its revision, for a table cell: a hub dataset as a link."""
    if not source.startswith(HUB_PREFIX):
        return f"`{source}` ({splits})"
    hub = parse_hub(source, "source")
    name = f"[{hub.repo}](https://huggingface.co/datasets/{hub.repo})" + (f" `{hub.config}`" if hub.config else "")
    revision = f"revision `{hub.revision}`" if hub.revision else "no pinned revision"
    return f"{name}, {revision} ({splits})"


def _corpus(corpus: CorpusConfig) -> str:
    limit = f", at most {corpus.max_docs:,} documents each" if corpus.max_docs else ""
    return _source(corpus.source, f"{', '.join(corpus.splits)}{limit}")


def _training_row(stage: str, params: Params, m: dict[str, Any], upstream: Path | None) -> list[str]:
    """What `stage` did to make this model, and on which data."""
    if m.get("kept"):
        return [stage, f"took the published model `{m['init']}` ({m['family']}) as it is",
                "its own (see its card)"]
    if stage in ("pretrain", "adapt"):
        corpus, cfg = ((params.corpora.pretrain, params.pretrain) if stage == "pretrain" else
                       (params.corpora.domain, params.adapt))
        start = ("random weights" if stage == "pretrain" and not params.init else
                 f"`{params.init}`" if stage == "pretrain" else "the pretrained model")
        how = (f", discriminative LRs (÷{cfg.lr_decay} per layer group), {cfg.schedule} schedule"
               if stage == "adapt" else "")
        loss = (f"{m['before_val_loss']:.4f} → " if "before_val_loss" in m else "") + f"{m['val_loss']:.4f}"
        stopped = f"; {m['stopped_early']}" if m.get("stopped_early") else ""
        return [stage, f"{m['objective']} from {start}{how}: {m['tokens_seen']:,} tokens in {m['steps']:,} steps of "
                       f"{cfg.batch_size} × {cfg.seq_len}; validation loss {loss}{stopped}", _corpus(corpus)]
    task, examples = params.tasks[m["task"]], m["examples"]
    eval_split = f"; scored on {m['eval_split']}" if m.get("eval") else ""
    if stage == "finetune":
        start = "the adapted model" if upstream else "random weights"
        return [stage, f"variant `{m['variant']}` from {start}, seed {m['seed']}: the epoch with the best dev "
                       f"score kept ({m['best_epoch']} of at most {params.finetune.epochs})",
                _source(task.source, f"{examples['train']:,} {task.train_split} examples; dev: {examples['dev']:,} "
                                     f"more hashed out of {task.train_split}{eval_split}")]
    teacher, transfer = m["teacher"], m["transfer"]
    blocks = [str(b + 1) for b in teacher["blocks"]]
    copied = f"copies of its {_noun(len(blocks), 'layer')} {', '.join(blocks)}" if blocks else "random weights"
    imitated = f"{_noun(len(teacher['layer_map']), 'layer')} {', '.join(map(str, teacher['layer_map']))}"
    unlabeled = (f" + {transfer['unlabeled']:,} {params.distill.unlabeled[m['task']]} texts it labeled"
                 if transfer.get("unlabeled") else "")
    stacks = m["student_layers"]  # an encoder-decoder's blocks and layers are numbered through both stacks
    depth = (_count(stacks[0], "layer") if len(stacks) == 1 else
             f"{' + '.join(map(str, stacks))} layers (encoder + decoder)")
    return [stage, f"student of the `{teacher['variant']}` teacher (seed {teacher['seed']}), "
                   f"{depth} from {copied}, imitating its {imitated}: the epoch "
                   f"with the best dev score kept ({m['best_epoch']} of at most {params.distill.epochs})",
            _source(task.source, f"{transfer['labeled']:,} {task.train_split} examples{unlabeled}{eval_split}")]


def _training_rows(card_text: str) -> list[list[str]]:
    """The chain's rows in the Training table of an upstream card."""
    lines = card_text.splitlines()
    header = "| " + " | ".join(TRAINING_HEADER) + " |"
    if header not in lines:
        return []
    rows = []
    for line in lines[lines.index(header) + 2:]:
        if not line.startswith("| "):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def _noun(n: int, noun: str) -> str:
    return noun if n == 1 else f"{noun}s"


def _count(n: int, noun: str) -> str:
    return f"{n} {_noun(n, noun)}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join("| " + " | ".join(row) + " |" for row in [header, ["---"] * len(header), *rows])


def _title(stage: str, params: Params, m: dict[str, Any]) -> str:
    if m.get("task"):
        task = params.tasks[m["task"]]
        what = task.data_label or m["task"]
        labels = f" Its labels: {', '.join(m['label_names'])}." if m.get("label_names") else ""
        made = ("finetuned by" if stage == "finetune" else f"distilled from the `{m['teacher']['variant']}` teacher by")
        return (f"# {m['task']} {_role(stage)} ({m['type']})\n\nA {m['type']} model for {what}, {made} {PIPELINE} "
                f"(a DVC pipeline; see Provenance).{labels}")
    start = f"the published model `{params.init}`" if params.init else "random weights"
    what = "pretrained" if stage == "pretrain" else "adapted to the domain"
    return (f"# {m['objective']} language model, {what}\n\nA language model {what} by {PIPELINE} (a DVC pipeline; "
            f"see Provenance) from {start}, for its later stages to finetune.")


def _model_section(cfg: TransformerConfig, m: dict[str, Any], cls: str | None, loads: bool,
                   hub_task: str | None) -> str:
    kind = "causal (left-to-right)" if cfg.causal else "bidirectional"
    depth = _count(cfg.n_layers, 'layer')
    if isinstance(cfg, Seq2SeqConfig):
        kind, depth = "encoder-decoder", f"{cfg.n_layers} + {cfg.decoder_layers} layers (encoder + decoder)"
    lines = [f"- Architecture: {kind} transformer, {depth}, {cfg.d_model} wide, "
             f"{_count(cfg.n_heads, 'head')}, "
             f"{cfg.position} positions, {cfg.norm}-LN; {m['params']:,} parameters; a vocabulary of "
             f"{cfg.vocab_size:,} tokens."]
    if cfg.languages:  # XLM's language embeddings: which row is which, and what a text given no id reads
        rows = ", ".join(f"{code} ({i})" for i, code in enumerate(cfg.languages))
        read = m.get("language") if m.get("language") in cfg.languages else cfg.languages[0]
        ids = " (`langs` in `transformers`' XLM)" if cls and cls.startswith("XLM") else ""
        lines.append(f"- Languages: {rows}; every token adds its language's embedding, chosen by its id{ids}. "
                     f"A text given no ids reads as {read}.")
    if m.get("task"):
        encoding = m["encoding"]
        fields = " and ".join(f"`{encoding[k]}`" for k in ("text_field", "text_pair_field") if encoding.get(k))
        kept = f" (a longer text keeps {KEPT[encoding['truncation']]})" if encoding.get("truncation") else ""
        lines.append(f"- Input: {fields or 'text'}, at most {encoding['max_len']} tokens{kept}.")
    if loads:
        lines.append(f"- Files: in the layout of `transformers`' {cls}.")
    else:  # a classifier's save_task_model said why
        why = m.get("transformers", "lib layout only: no `transformers` architecture computes it")
        lines.append(f"- Files: {why}.")
    if cls and not loads:
        lines.append(f"- `transformers` loads the backbone alone, as {cls}.")
    elif loads and not m.get("task") and not hub_task:
        lines.append(f"- Causal: its logits at each position are the next token's, though {cls} is a masked LM's "
                     "class (`transformers` has no causal one for it); `generate()` does not take it.")
    return "## Model\n\n" + "\n".join(lines)


def _evaluation(stage: str, params: Params, m: dict[str, Any]) -> str:
    if not m.get("task"):
        if m.get("kept"):
            return "Not measured here: the published model went on unchanged (see its own card)."
        corpus, cfg = ((params.corpora.pretrain, params.pretrain) if stage == "pretrain" else
                       (params.corpora.domain, params.adapt))
        split = f"validation ({f'`{corpus.valid_split}`' if corpus.valid_split else 'held out of train by hash'})"
        perplexity = "val_perplexity" in m
        rows = [[f"{split}{label}", f"{m[prefix + 'val_loss']:.4f}",
                 *([f"{m[prefix + 'val_perplexity']:.2f}"] if perplexity else [])]
                for label, prefix in ((", before adapting", "before_"), ("", "")) if prefix + "val_loss" in m]
        return (f"On {cfg.eval_batches} fixed batches of {cfg.batch_size} × {cfg.seq_len} validation tokens.\n\n"
                + _table(["split", "loss", *(["perplexity"] if perplexity else [])], rows))
    metrics = list(m["dev"])
    splits = [("eval", m["eval_split"]), ("dev", f"dev (hashed out of {params.tasks[m['task']].train_split})")]
    rows = []
    for split, label in splits:
        if not m.get(split):
            continue
        rows.append([label, "this model", f"{m['examples'][split]:,}", *(f"{m[split][k]:.4f}" for k in metrics)])
        if stage == "distill" and m["teacher_scores"].get(split):
            rows.append([label, "its teacher", f"{m['examples'][split]:,}",
                         *(f"{m['teacher_scores'][split][k]:.4f}" for k in metrics)])
    no_labels = "" if m.get("eval") else f" `{m['eval_split']}` has no labels here: dev alone scores it."
    return f"As the `{stage}` stage measured them (`{metrics[0]}` picked the kept epoch).{no_labels}\n\n" + _table(
        ["split", "model", "examples", *metrics], rows)


def _eval_results(params: Params, m: dict[str, Any], hub_task: str | None) -> list[EvalResult] | None:
    """model-index: the scores on the evaluation split of a hub dataset."""
    source = params.tasks[m["task"]].source
    if not (m.get("eval") and hub_task and source.startswith(HUB_PREFIX)):
        return None
    hub = parse_hub(source, "source")
    return [EvalResult(task_type=hub_task, dataset_type=hub.repo, dataset_name=params.tasks[m["task"]].data_label
                       or m["task"], dataset_config=hub.config, dataset_split=m["eval_split"],
                       dataset_revision=hub.revision, metric_type=metric, metric_value=value)
            for metric, value in m["eval"].items()]


def _how_to_use(m: dict[str, Any], cls: str | None) -> str:
    """Code that loads the model: TextClassifier where it serves it, `transformers` where `cls` loads it as the
    model it is, and lib's loader."""
    where = (f"`{MODEL}`: this folder's path. `transformers` also takes the id of the hub repo it was uploaded to; "
             f"lib takes the folder `huggingface_hub.snapshot_download(\"<repo id>\")` gives.")
    blocks = []
    if m.get("served"):
        blocks.append(f'from lib.serving.predict import TextClassifier   # {PIPELINE}: encodes as training did\n'
                      f'clf = TextClassifier.load("{MODEL}")\nclf.predict(["A wonderful film."])   # -> label names')
    if cls:
        blocks.append(f'from transformers import AutoTokenizer, {cls}\n'
                      f'tokenizer = AutoTokenizer.from_pretrained("{MODEL}")\nmodel = {cls}.from_pretrained("{MODEL}")')
    loader = (f'from lib.tasks.model import load_task_model\nmodel, info = load_task_model("{MODEL}")   # info: '
              'labels, encoding, scores' if m.get("task") else
              f'from lib.models.folder import load_model\nlm = load_model("{MODEL}")')
    blocks.append(loader)
    return where + "\n\n" + "\n\n".join(f"```python\n{block}\n```" for block in blocks)


def _limits(params: Params, m: dict[str, Any], base_model: str | None, from_init: bool,
            languages: list[str]) -> str:
    data = "its published model's data and " if from_init else ""
    labels = " and of its labels" if m.get("task") else ""
    lines = [f"- A demonstration model ({m['params']:,} parameters, trained within the budget params set, which by "
             "default fits a 2-core CPU): for research and teaching, and for comparing training recipes. Not for "
             "production unless you measure it on your own data.",
             f"- It knows only {data}the text of the data above: "
             f"{'the languages above' if languages else 'English, for the default sources'}. Other languages "
             "and domains are out of scope.",
             f"- It carries the biases of that data (who wrote it, about what){labels}; its scores hold for the "
             "splits above."]
    if m.get("task"):
        task = params.tasks[m["task"]]
        truncation = m["encoding"].get("truncation", "head")
        if truncation != "head":
            lines.append(f"- A text longer than {m['encoding']['max_len']} tokens keeps {KEPT[truncation]} here; "
                         f"`transformers`' pipeline keeps its start instead.")
        if task.data_note:
            lines.append(f"- {' '.join(task.data_note.split())}")
    else:
        lines.append("- A language model, not a classifier or an assistant: finetune it for a task first.")
    if from_init:
        start = f"[{base_model}](https://huggingface.co/{base_model})" if base_model else f"`{params.init}`"
        lines.append(f"- License: that of the published model it started from, {start}.")
    return "\n".join(lines)


def _provenance(stage: str, params: Params) -> str:
    """The commit and params that made the model, as its MLflow runs are tagged (lib.core.tracking)."""
    tags = tracking.run_tags(stage, params)
    dirty = " with uncommitted changes" if tags["git.dirty"] == "true" else ""
    return (f"Written by the `{stage}` stage of {PIPELINE} at commit `{tags['git.commit'][:12]}`{dirty}, with the "
            f"params whose digest is `{tags['pipeline.key'].partition('/')[2]}` (of every param and the DVC "
            f"experiment name, `{tags['dvc.exp_name']}`). Its MLflow runs carry the tag `pipeline.key` = "
            f"`{tags['pipeline.key']}`.")
