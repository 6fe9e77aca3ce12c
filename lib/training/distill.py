"""Knowledge distillation: a smaller student trained on a finetuned teacher's outputs, for every task
type (lib/tasks).

The student is the teacher's architecture with fewer layers, optionally narrower. At the teacher's
width it starts from the teacher: embeddings, final norm, heads, and a choice of its blocks, either
spread from the first to the last (DistilBERT's "one layer out of two": for 12 -> 6 layers, blocks
0, 2, 4, 7, 9, 11) or the bottom k, in each stack of an encoder-decoder (distill.layers for the encoder,
decoder_layers for the decoder, whose depth sets the time per generated token). A narrower student starts
from random weights, and learned projections carry its states to the teacher's width for the state losses.

The loss is a weighted sum of
- soft: the teacher's outputs as targets, in the form that fits the task's type (Distilled.soft_loss):
  KL(teacher || student) of the temperature-T distributions, times T^2, so that its gradients keep
  their size whatever T is (Hinton et al. 2015), over the classes (classification), over a question's
  choices (multiple_choice), over the tags at each tagged position (tagging: a word's first subword,
  averaged over the tagged words, as the type's loss), or over the candidate positions of the start
  and of the end (span_qa, the mean of the two); for regression the MSE between the student's and
  the teacher's standardised score (no temperature: there is no distribution to soften); for seq2seq
  word-level KD (Kim & Rush 2016), per target token over the teacher's top_k likeliest tokens;
- hard: the type's own loss (lib/tasks) with the gold labels, on the labeled examples only; for seq2seq
  with distill.targets teacher, sequence-level KD (Kim & Rush 2016): the targets are the teacher's own
  generations on the training sources (its beams), written once before the first epoch;
- hidden: per real token, 1 - cosine (DistilBERT) or the MSE (TinyBERT) between a student layer's
  output and the teacher layer it imitates: the last layer only, or every student layer (seq2seq: the
  decoder's layers, at the target's tokens);
- pkd: Patient-KD (Sun et al. 2019), the squared distance between the L2-normalised summary states
  ([CLS], or a causal model's last token) of the intermediate layers.
The state losses read every sequence the model runs: multiple choice runs one per choice, so there
they compare each (context, ending) sequence's states, and a question's pkd term is the mean over its
choices.

The transfer set is the task's train examples plus, for classification, unlabeled in-domain text that
only the teacher labels. The teacher's outputs (its outputs, per token for tagging and spans, and the
states the losses need) are computed once, before the first epoch, and kept in memory. Each epoch
ends in a checkpoint; a killed run started again resumes after its last finished epoch and ends with
the same student, since batch order and dropout come from the seed and the saved RNG state.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from lib.config.errors import UserError
from lib.config.params import DistillConfig, ImplConfig
from lib.core import distributed, runtime
from lib.core.distributed import Context
from lib.core.progress import Progress
from lib.data.encoding import batch_indices
from lib.evaluation.efficiency import parameter_count
from lib.models.architectures import build_model
from lib.models.architectures.encoder_decoder import Seq2SeqConfig
from lib.models.config import TransformerConfig
from lib.tasks import DEFAULT_TYPE, TYPES
from lib.tasks.base import TaskType, move
from lib.tasks.base import UNLABELED, TaskData
from lib.tasks.capabilities import Distilled, UnlabeledTransfer
from lib.tasks.model import TaskModel
from lib.tasks.scoring import predict_all, score_split
from lib.training.epoch_loop import EpochLoop
from lib.training.finetune import run_name
from lib.training.optim import Schedule, optimizer_and_schedule


@dataclass
class TeacherOutputs:
    # per example, what its type keeps of the teacher's outputs (Distilled.kept_outputs): float32 (n_outputs,)
    # for a type with one output vector per example (classification's classes, regression's score, multiple
    # choice's choices), (T_i, n_outputs) for a per-token type, the likeliest tokens per target token for seq2seq
    logits: list[torch.Tensor]
    # per sequence (n_hidden_layers, T_s, d) bfloat16, its real tokens only; empty without a hidden loss.
    # A sequence is an example, or one choice of a multiple-choice example: example i's S sequences
    # are i * S ... i * S + S - 1
    hidden: list[torch.Tensor]
    summary: torch.Tensor | None  # (N * S, n_pkd_layers, d) float32; None without Patient-KD


@dataclass
class DistillResult:
    task: str
    teacher: dict[str, Any]  # {"dev": metrics, "eval": metrics or None}, on the student's examples
    student: dict[str, Any]
    confusion: list[list[int]] | None  # the student's on the evaluation split
    best_epoch: int
    history: list[dict[str, float]]  # per epoch: losses, lr, dev metrics
    seconds: float  # training the student (over every resumed part) and scoring it
    teacher_seconds: float  # the teacher's outputs on the transfer set and its scores
    transfer: dict[str, int]  # {"labeled": n, "unlabeled": m}
    # the teacher blocks (0-based) the student starts from, [] for a random init, and the teacher layer
    # (1-based) each student layer imitates (an encoder-decoder's: each decoder layer); both numbered through
    # the encoder, then the decoder
    teacher_blocks: list[int]
    layer_map: list[int]
    student_params: int
    teacher_params: int


def student_plan(cfg: DistillConfig, n_teacher: int, layers: int | None = None,
                 key: str = "layers") -> tuple[list[int], list[int]]:
    """(teacher blocks the student copies, 0-based, [] for a random init; the teacher layer, 1-based,
    each student layer imitates: cfg.layer_map, or the layer of the block it copies), for a stack of
    `layers` (cfg.layers) student blocks over n_teacher teacher blocks; `key`: the depth's in distill."""
    k = layers or cfg.layers
    if k > n_teacher:
        raise UserError(f"distill.{key}: {k} is more than the teacher's {n_teacher} layers; use at most {n_teacher}")
    spread = list(range(k)) if cfg.init == "bottom" else [round(i * (n_teacher - 1) / max(1, k - 1)) for i in range(k)]
    layer_map = cfg.layer_map or [b + 1 for b in spread]
    for i, layer in enumerate(layer_map):
        if not 1 <= layer <= n_teacher:
            raise UserError(f"distill.layer_map[{i}]: {layer} is not a teacher layer (1..{n_teacher})")
    return ([] if cfg.init == "random" else spread), layer_map


def block_stacks(cfg: TransformerConfig) -> list[tuple[str, int]]:
    """A task model's stacks of blocks, bottom first: (their state-dict prefix, depth). The last is the one
    whose states the state losses compare: an encoder-decoder's decoder, whose states are at the outputs'
    positions."""
    if isinstance(cfg, Seq2SeqConfig):
        return [("backbone.encoder.blocks", cfg.n_layers), ("backbone.decoder.blocks", cfg.decoder_layers)]
    return [("backbone.blocks", cfg.n_layers)]


def student_depths(cfg: DistillConfig, teacher: TransformerConfig) -> dict[str, int]:
    """The student's depth per stack as its config's fields: cfg.layers, and an encoder-decoder's decoder's."""
    if isinstance(teacher, Seq2SeqConfig):
        return {"n_layers": cfg.layers, "decoder_layers": cfg.decoder_layers or cfg.layers}
    return {"n_layers": cfg.layers}


def student_layout(cfg: DistillConfig, teacher: TransformerConfig) -> tuple[list[int], list[int], int]:
    """(the teacher blocks the student copies, numbered through the teacher's stacks bottom up; the teacher
    layer each student layer of the last stack imitates, numbered within that stack; the teacher layers
    below that stack): student_plan per stack."""
    blocks, below = [], 0
    for (key, k), (_, n) in zip(student_depths(cfg, teacher).items(), block_stacks(teacher)):
        copied, layer_map = student_plan(cfg, n, k, "layers" if key == "n_layers" else key)
        blocks += [below + b for b in copied]
        below += n
    return blocks, layer_map, below - n


def student_schedule(cfg: DistillConfig) -> Schedule:
    """The student's LR: linear warmup over warmup_frac of the steps, then linear decay to 0."""
    return Schedule("linear", warmup_frac=cfg.warmup_frac)


def build_student(teacher: TaskModel, cfg: DistillConfig, blocks: list[int],
                  kind: TaskType = TYPES[DEFAULT_TYPE]) -> TaskModel:
    """The student's model, as task type `kind` builds it: the teacher's config with cfg's depths (and
    cfg.width) and its head, the teacher's weights where `blocks` (numbered through the teacher's stacks, as
    student_layout gives them) names which of its blocks to copy."""
    t = teacher.backbone.cfg
    depths = student_depths(cfg, t)
    s = dataclasses.replace(t, **depths) if cfg.width == 1.0 else dataclasses.replace(
        t.scaled(cfg.width), embedding_size=None, **depths)
    student = kind.build_model(build_model(s), copy.copy(teacher.head_cfg))
    student.language = teacher.language
    if blocks:
        source = teacher.state_dict()
        copied = {name: source[name] for name in student.state_dict()}
        below_s = below_t = 0
        for (prefix, k), (_, n) in zip(block_stacks(s), block_stacks(t)):
            # 1 block stored when the teacher shares its layers
            stored = len({name[len(prefix) + 1:].split(".")[0] for name in source if name.startswith(prefix + ".")})
            for name in copied:
                block = re.fullmatch(rf"{re.escape(prefix)}\.(\d+)\.(.*)", name)
                if block:
                    copied[name] = source[f"{prefix}.{(blocks[below_s + int(block[1])] - below_t) % stored}.{block[2]}"]
            below_s, below_t = below_s + k, below_t + n
        student.load_state_dict(copied)
    return student


class Distiller(nn.Module):
    """The student and, when it is narrower than the teacher, a projection per student layer to the
    teacher's width; trained together, only the student is kept."""

    def __init__(self, student: TaskModel, teacher_width: int, kind: TaskType):
        super().__init__()
        self.student, self.kind = student, kind
        width, layers = student.backbone.cfg.d_model, block_stacks(student.backbone.cfg)[-1][1]
        self.projections = nn.ModuleList(
            nn.Identity() if width == teacher_width else nn.Linear(width, teacher_width) for _ in range(layers))

    def forward(self, batch: dict[str, torch.Tensor], hidden_layers: list[int],
                summary_layers: list[int]) -> tuple[torch.Tensor, list, list]:
        """The student's outputs on a batch of its type (float32, as the type's forward shapes them),
        and at the given student layers (1-based) its states and summary states projected to the
        teacher's width, one row per sequence the model ran (multiple choice: B * n_choices).
        Everything the losses read comes out of this one forward, so that DDP sees every parameter
        that gets a gradient; the student's own forward, so that FSDP gathers it as the unit it is
        (it is also scored on its own)."""
        student = self.student
        outputs, (_, states) = self.kind.forward(student, batch, output_hidden_states=True)
        mask = self.kind.state_mask(batch)
        hidden = [self.projections[s - 1](states[s].float()) for s in hidden_layers]
        summary = [self.projections[s - 1](student.token_state(states[s], mask).float()) for s in summary_layers]
        return outputs.float(), hidden, summary


def hidden_loss(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, kind: str) -> torch.Tensor:
    """(B, T, d) states -> the mean over real tokens of 1 - cosine or of the per-dimension squared error."""
    if kind == "cosine":
        per_token = 1 - F.cosine_similarity(student, teacher, dim=-1)
    else:
        per_token = (student - teacher).pow(2).mean(-1)
    return per_token[mask].mean()


def patient_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """(B, L, d) summary states -> squared distance of the unit vectors, summed over layers, mean over the batch."""
    return (F.normalize(student, dim=-1) - F.normalize(teacher, dim=-1)).pow(2).sum((-1, -2)).mean()


@torch.no_grad()
def teacher_outputs(teacher: TaskModel, task: TaskData, examples: list, hidden_layers: list[int],
                    summary_layers: list[int], batch_size: int, pad_id: int, device: torch.device, impl: ImplConfig,
                    context: Context = Context(), label: str = "distill: teacher", top_k: int = 8) -> TeacherOutputs:
    """The teacher's outputs on `examples` (of `task`'s type) as the type keeps them (top_k: see
    DistillConfig), its states at `hidden_layers` (per position of Distilled.state_mask) and its summary
    states at `summary_layers` (layers 1-based), in one forward pass over them. Under torchrun each rank
    runs every world-th batch and every rank gets the whole. Progress lines (`label`) count this rank's
    batches."""
    teacher.eval()
    kind = TYPES[task.type]
    precision = runtime.resolve_precision(impl.precision, device)
    groups = batch_indices(examples, batch_size)
    progress = Progress(label, -(-len(groups) // context.world), "batches", out=lambda line: distributed.say(context, line))

    def outputs(group: list[int]) -> tuple[list[torch.Tensor], torch.Tensor | None, list[torch.Tensor]]:
        part = [examples[i] for i in group]
        batch = move(kind.collate(part, pad_id, task), device)
        mask = kind.state_mask(batch)
        with runtime.autocast(device, precision):
            out, (_, states) = kind.forward(teacher, batch, output_hidden_states=True)
        logits = kind.kept_outputs(out.float().cpu(), part, top_k)
        summary = torch.stack([teacher.token_state(states[layer], mask)
                               for layer in summary_layers], 1).float().cpu() if summary_layers else None
        # per sequence, its real tokens only; bf16 halves the memory (the losses compare in float32)
        lengths = mask.sum(1).tolist()
        hidden = [torch.stack([states[layer][row, :n] for layer in hidden_layers]).to(torch.bfloat16).cpu()
                  for row, n in enumerate(lengths)] if hidden_layers else []
        progress.tick(progress.done + 1)
        return logits, summary, hidden

    logits: list[torch.Tensor] = [torch.empty(0)] * len(examples)
    hidden: list[torch.Tensor] = []
    summary: torch.Tensor | None = None
    for group, (group_logits, group_summary, group_hidden) in zip(groups, distributed.spread(context, groups, outputs)):
        per = (len(group_summary) if group_summary is not None else len(group_hidden)) // len(group)  # sequences
        rows = [i * per + k for i in group for k in range(per)]
        if group_hidden:
            hidden = hidden or [torch.empty(0)] * (len(examples) * per)
            for row, states in zip(rows, group_hidden):
                hidden[row] = states
        if group_summary is not None:
            if summary is None:
                summary = torch.zeros(len(examples) * per, *group_summary.shape[1:])
            summary[rows] = group_summary
        for i, out in zip(group, group_logits):
            logits[i] = out
    return TeacherOutputs(logits, hidden, summary)


def teacher_written(teacher: TaskModel, task: TaskData, examples: list, batch_size: int, pad_id: int,
                    device: torch.device, impl: ImplConfig, context: Context, label: str) -> list:
    """`examples` with the teacher's predictions as their targets (sequence-level KD, Kim & Rush 2016): for
    seq2seq its generations, decoded as the task decodes (its beams, at most its longest train target)."""
    progress = Progress(label, -(-len(examples) // batch_size // context.world), "batches",
                        out=lambda line: distributed.say(context, line))
    written = predict_all(teacher, task, examples, batch_size, pad_id, device, impl, context,
                          on_batch=lambda: progress.tick(progress.done + 1))
    return TYPES[task.type].with_targets(examples, written, task)


def distill_task(teacher: TaskModel, task: TaskData, unlabeled: list, metrics: list[str],
                 cfg: DistillConfig, impl: ImplConfig, device: torch.device, seed: int, pad_id: int,
                 checkpoint_dir: Path, fingerprint: str,
                 on_epoch: Callable[[dict[str, float]], None] = lambda row: None,
                 context: Context = Context()) -> tuple[DistillResult, TaskModel]:
    """Train a student on task.train + `unlabeled` from `teacher`, pick its best epoch on task.dev,
    score teacher and student on task.dev and task.eval. Resumes from checkpoint_dir when it holds a
    checkpoint with this fingerprint. Returns the result and the best student (on the CPU). Under
    torchrun every rank calls it: each computes the teacher's outputs on every world-th batch (and
    gets all of them), trains on its share of every batch (DDP) and scores every world-th batch;
    rank 0 writes the checkpoints. With impl.strategy fsdp the teacher and the student are sharded
    over the ranks, and the returned student is whole on rank 0 only. `unlabeled` (examples the teacher
    alone labels, lib.tasks.classification.Example with label UNLABELED) is for a classification task only."""
    kind = TYPES[task.type]
    if not isinstance(kind, Distilled):
        raise UserError(f"distill.tasks: {task.name} is {task.type}, which has no distillation")
    if unlabeled and not isinstance(kind, UnlabeledTransfer):
        raise UserError(f"distill.unlabeled.{task.name}: {task.name} is {task.type}, which takes no unlabeled "
                        "transfer text")
    blocks, layer_map, below = student_layout(cfg, teacher.backbone.cfg)
    k = len(layer_map)  # the layers of the student's stack whose states the losses compare
    # (student layer, teacher layer) pairs, 1-based
    hidden_pairs = [] if cfg.hidden_weight == 0 else (
        [(k, layer_map[-1])] if cfg.hidden_layers == "last" else list(zip(range(1, k + 1), layer_map)))
    summary_pairs = list(zip(range(1, k), layer_map[:-1])) if cfg.pkd_weight > 0 else []
    transfer = task.train + unlabeled

    torch.manual_seed(seed)
    distiller = Distiller(build_student(teacher, cfg, blocks, kind), teacher.backbone.cfg.d_model,
                          kind)  # whole teacher
    student = distiller.student
    teacher_params = parameter_count(teacher)

    started = time.perf_counter()
    teacher = teacher.to(device)
    fsdp = impl.strategy == "fsdp" and context.active
    if fsdp:  # the backbone, whose forward gathers its shards (the TaskModel around it is not wrapped)
        distributed.shard(teacher.backbone, context)
    label = f"distill: {run_name(task.name, 'student', seed)}"
    if cfg.targets == "teacher":
        transfer = teacher_written(teacher, task, transfer, cfg.batch_size * 2, pad_id, device, impl, context,
                                   f"{label} teacher writing the targets")
    cache = teacher_outputs(teacher, task, transfer, [t for _, t in hidden_pairs], [t for _, t in summary_pairs],
                            cfg.batch_size * 2, pad_id, device, impl, context, f"{label} teacher labelling", cfg.top_k)
    teacher_scores = evaluate(teacher, task, metrics, cfg.batch_size * 2, pad_id, device, impl, context)[0]
    if not fsdp:  # a sharded teacher keeps its 1/world share where it is
        teacher.to("cpu")
    teacher_seconds = round(time.perf_counter() - started, 1)

    synced = distributed.wrap(distiller.to(device), context, device, impl.strategy, parts=[student])
    steps_per_epoch = math.ceil(len(transfer) / cfg.batch_size)
    optimizer, scheduler = optimizer_and_schedule(distiller, cfg, device, cfg.lr, student_schedule(cfg),
                                                  steps_per_epoch * cfg.epochs)
    loop = EpochLoop(distiller, student, optimizer, scheduler, cfg, epochs=cfg.epochs, patience=cfg.patience,
                     metric=metrics[0], checkpoint_dir=checkpoint_dir, fingerprint=fingerprint, where=label,
                     context=context)
    # the batches of the epochs left; the ETA assumes patience does not end the run sooner
    progress = Progress(label, steps_per_epoch * (cfg.epochs - loop.state.epoch), "batches",
                        out=lambda line: distributed.say(context, line))

    def epoch_of_training(epoch: int) -> dict[str, float]:
        return train_epoch(synced, task, transfer, cache, hidden_pairs, summary_pairs, cfg, impl, device, pad_id, loop,
                           seed * 1000 + epoch, context,
                           lambda: progress.tick(progress.done + 1, f"  epoch {epoch} of {cfg.epochs}"))

    def dev_scores() -> dict[str, float]:
        return score_split(student, task, "dev", metrics, cfg.batch_size * 2, pad_id, device, impl, context)[0]

    state = loop.run(epoch_of_training, dev_scores, on_epoch)

    scoring_started = time.perf_counter()
    student_scores, confusion = evaluate(student, task, metrics, cfg.batch_size * 2, pad_id, device, impl, context)
    result = DistillResult(
        task.name, teacher_scores, student_scores, confusion, state.best_epoch, state.history,
        round(state.seconds + time.perf_counter() - scoring_started, 1), teacher_seconds,
        {"labeled": task.size("train"), "unlabeled": len(unlabeled),
         **({"teacher_targets": len(transfer)} if cfg.targets == "teacher" else {})},
        blocks, [below + layer for layer in layer_map], parameter_count(student), teacher_params)
    return result, distributed.to_cpu(student.eval(), context)


def evaluate(model: TaskModel, task: TaskData, metrics: list[str], batch_size: int, pad_id: int,
             device: torch.device, impl: ImplConfig,
             context: Context = Context()) -> tuple[dict[str, Any], list[list[int]] | None]:
    """({"dev": metrics, "eval": metrics or None}, the evaluation split's confusion matrix or None)."""
    dev, calibration = score_split(model, task, "dev", metrics, batch_size, pad_id, device, impl, context)
    scores: dict[str, Any] = {"dev": dev, "eval": None}
    confusion = None
    if task.eval is not None:
        scores["eval"], extras = score_split(model, task, "eval", metrics, batch_size, pad_id, device, impl, context,
                                             calibration)
        confusion = extras.get("confusion")
    return scores, confusion


def train_epoch(synced: nn.Module, task: TaskData, transfer: list, cache: TeacherOutputs,
                hidden_pairs: list[tuple[int, int]], summary_pairs: list[tuple[int, int]], cfg: DistillConfig,
                impl: ImplConfig, device: torch.device, pad_id: int, loop: EpochLoop, seed: int,
                context: Context = Context(), on_batch: Callable[[], None] = lambda: None) -> dict[str, float]:
    """One pass over the transfer set, each batch's optimizer step by `loop`, calling on_batch after
    each batch; returns the mean of each loss term (and the total) per example.
    `synced` is the Distiller, wrapped under torchrun (DDP or FSDP): then each rank takes its share of every
    batch and weighs each term by its share of the batch's units (the type's: examples, tagged words),
    labeled units, examples or tokens, so that DDP's mean over ranks is the whole batch's loss."""
    synced.train()
    kind = TYPES[task.type]
    precision = runtime.resolve_precision(impl.precision, device)
    sums: dict[str, float] = {}
    per = len(cache.summary) // len(transfer) if cache.summary is not None else len(cache.hidden) // len(transfer)

    def sequences(indices: list[int]) -> list[int]:  # the cache rows of the examples' sequences
        return [i * per + k for i in indices for k in range(per)]

    for group in batch_indices(transfer, cfg.batch_size, seed):
        n = len(group)
        mine, scale = context.part(group)
        batch = move(kind.collate([transfer[i] for i in mine], pad_id, task), device)
        mask = kind.state_mask(batch)
        with runtime.autocast(device, precision):
            outputs, hidden, summary = synced(batch, [s for s, _ in hidden_pairs], [s for s, _ in summary_pairs])
        units = distributed.part_weight(sum(kind.units(transfer[i]) for i in mine),
                                        sum(kind.units(transfer[i]) for i in group), scale)
        target = kind.batch_targets([cache.logits[i] for i in mine], outputs.shape[1]).to(device)
        terms = {"soft": kind.soft_loss(outputs, target, batch, cfg.temperature) * units}
        labeled = [row for row, i in enumerate(mine) if is_labeled(transfer[i])]
        n_labeled = sum(kind.units(transfer[i]) for i in group if is_labeled(transfer[i]))
        if cfg.hard_weight > 0 and n_labeled:
            if len(labeled) == len(mine):
                hard = kind.loss(outputs, batch, task)
            elif labeled:
                rows = torch.tensor(labeled, device=device)
                hard = kind.loss(outputs[rows], {k: v[rows] for k, v in batch.items()}, task)
            else:
                hard = outputs.sum() * 0
            mine_labeled = sum(kind.units(transfer[mine[row]]) for row in labeled)
            terms["hard"] = hard * distributed.part_weight(mine_labeled, n_labeled, scale)
        if hidden_pairs:
            rows = sequences(mine)
            target = torch.zeros(len(rows), len(hidden_pairs), mask.shape[1], cache.hidden[rows[0]].shape[-1])
            for row, s in enumerate(rows):
                target[row, :, : cache.hidden[s].shape[1]] = cache.hidden[s].float()
            target = target.to(device)
            tokens = distributed.part_weight(int(mask.sum()), sum(cache.hidden[s].shape[1] for s in sequences(group)),
                                             scale)
            terms["hidden"] = sum(hidden_loss(hidden[j], target[:, j], mask, cfg.hidden_loss)
                                  for j in range(len(hidden_pairs))) / len(hidden_pairs) * tokens
        if summary_pairs:
            examples = distributed.part_weight(len(mine), n, scale)  # a mean over sequences: over examples alike
            terms["pkd"] = patient_loss(torch.stack(summary, 1), cache.summary[sequences(mine)].to(device)) * examples
        weights = {"soft": cfg.soft_weight, "hard": cfg.hard_weight, "hidden": cfg.hidden_weight, "pkd": cfg.pkd_weight}
        loss = sum(weights[name] * term for name, term in terms.items())
        loss.backward()
        loop.step(distributed.total(context, loss.item() / context.world, device))  # the batch's loss
        for name, value in {**terms, "loss": loss}.items():  # each rank's part of the batch's mean
            sums[name] = sums.get(name, 0.0) + value.item() / context.world * n
        on_batch()
    totals = {name: distributed.total(context, value, device) for name, value in sorted(sums.items())}
    return {f"{name}_loss" if name != "loss" else "train_loss": total / len(transfer) for name, total in totals.items()}


def is_labeled(example) -> bool:
    """Whether an example has a gold label: all but the unlabeled transfer text (lib.tasks.classification.Example with
    label UNLABELED) that only the teacher labels."""
    return getattr(example, "label", None) != UNLABELED
