"""Task types: what a task's rows are and how a model learns and is scored on them, chosen by a task's
`type` in params.yaml (TaskConfig.type), as lib/objectives/ is chosen by `objective`.

A type says, for lib/training/finetune.py's one fit loop:
- how a split's rows are read (bad rows skipped and counted by reason) and which text hashes them
  into train and dev (`load`, with lib.tasks.base's hashed dev carve and limits, shared by every type);
- how items become model inputs and batches (`collate`: a dict of tensors), and what the head puts
  out: one vector per sequence or one per token (`per_token`), of `n_outputs(task)` values;
- its model: the head a finetune variant asks for (`head`), the model built on a backbone
  (`build_model`) and read back from its saved folder (`read_model`); by default model.py's TaskModel;
- the forward pass over a batch (multiple choice runs the encoder over every choice), the loss, and
  how many units (examples, tagged tokens) the loss averages over, so data-parallel ranks weigh
  their shares of a batch;
- predictions per batch (`predict_batch`: by default the forward pass read by `predict`; a type that
  generates generates there) and the scores of a split (`score`);
- what params may say of it (its metrics and their defaults, whether label_names apply, the
  text_pair_field it needs: `check`, run by `check_tasks` for every stage that reads `tasks`);
- how a timed call reads, what its fields hold for decontamination (`field_kinds`).

What only some types have, a type declares by inheriting a capability (capabilities.py), which the
code that uses it tests with isinstance: `Exported` (the shape of its transformers task model, config
keys and pipeline tag for export), `Served` (lib/serving predicts it from raw text), `Distilled` (its
soft loss), `UnlabeledTransfer` (distill.unlabeled's texts the teacher labels), `Baselined` (a train-only
baseline, lib/metrics/baselines.py), `Calibrated` (a setting the evaluation split takes from dev: SQuAD
2.0's no-answer threshold), `ZeroShot` (zero-shot prompting), and `Reported` (the extras of its scores
the evaluation keeps, their plots and the type's own section of the report).

Beside the types: the task model they build by default (model.py: a backbone and a head, and its saved
folder) and the one scoring path (scoring.py: a model's predictions and scores on a split of any type),
used by finetune, distill, evaluate and serving alike.

A new type is one module here with a TaskType subclass and its TYPE, and its entry in TYPES below.
No other file names a type (tests/test_layout.py fails on a type's name as a string outside lib/tasks/).
"""
from typing import Any

from lib.config.params import DistillConfig, Params, ParamsError, TaskConfig, check_choice
from lib.tasks import classification, multiple_choice, regression, seq2seq, span_qa, tagging
from lib.tasks.base import TaskType
from lib.tasks.capabilities import Distilled, UnlabeledTransfer, ZeroShot

TYPES: dict[str, TaskType] = {t.name: t for t in (classification.TYPE, regression.TYPE, tagging.TYPE, span_qa.TYPE,
                                                  multiple_choice.TYPE, seq2seq.TYPE)}
DEFAULT_TYPE = classification.TYPE.name  # a task's type where params.yaml names none


def task_type(cfg: TaskConfig) -> TaskType:
    """The task's type (null in params: DEFAULT_TYPE)."""
    return TYPES[cfg.type or DEFAULT_TYPE]


def saved_type(meta: dict[str, Any]) -> TaskType:
    """The task type of a saved model's classifier.json (one from before task types has none, and is the
    default's)."""
    return TYPES[meta.get("type", DEFAULT_TYPE)]


def task_metrics(cfg: TaskConfig) -> list[str]:
    """The task's metrics, the first of which picks the best epoch: its own, else its type's defaults."""
    return list(cfg.metrics) if cfg.metrics is not None else list(task_type(cfg).default_metrics)


def field_kinds(tasks: dict[str, TaskConfig]) -> dict[str, dict[str, str]]:
    """Per task, what its fields hold where not one text (its type's `field_kinds`), for decontamination."""
    return {name: task_type(cfg).field_kinds for name, cfg in tasks.items()}


def check_task(cfg: TaskConfig, key: str) -> None:
    """One task's config (`key`: tasks.<name>) against its type. The params stay as written (null type
    and metrics: task_type, task_metrics), so every stage tracks the same values whichever checks it runs."""
    if cfg.type is not None:
        check_choice(cfg.type, TYPES, f"{key}.type")
    task_type(cfg).check(cfg, key)


def check_transfer(name: str, cfg: TaskConfig, source: str, source_cfg: TaskConfig) -> None:
    """A transfer task is scored by the models of its source task: the same type, and for a type whose
    classes params name, the same classes (Params.validate: `source` is a task in `tasks`)."""
    for task, task_cfg in ((name, cfg), (source, source_cfg)):
        if task_cfg.type is not None:
            check_choice(task_cfg.type, TYPES, f"tasks.{task}.type")
    kind, source_kind = task_type(cfg), task_type(source_cfg)
    if kind is not source_kind:
        raise ParamsError(f"tasks.{name}.type: {kind.name}, but its transfer_from task '{source}' is "
                          f"{source_kind.name}; a transfer task is scored with its source's models: give both one type")
    if kind.named_labels and cfg.label_names != source_cfg.label_names:
        raise ParamsError(f"tasks.{name}.label_names: {cfg.label_names} differ from tasks.{source}.label_names "
                          f"({source_cfg.label_names}), the classes of the models it is scored with; give the same")


def check_tasks(params: Params) -> None:
    """The `tasks` section against the types (a check of lib.config.params.load_params, for the stages that
    read tasks): each task's type a registered one, its metrics the type's, its fields what the type
    needs, and what other sections ask of a task's type."""
    for name, cfg in params.tasks.items():
        if cfg.transfer_from is not None:  # first: it has its source's metrics, which its type may not have
            check_transfer(name, cfg, cfg.transfer_from, params.tasks[cfg.transfer_from])
        check_task(cfg, f"tasks.{name}")
    for name in params.evaluate.zero_shot:  # Params.validate: every name is a task's
        kind = task_type(params.tasks[name])
        if not isinstance(kind, ZeroShot):
            raise ParamsError(f"evaluate.zero_shot.{name}: {name} is {kind.name}, which has no zero-shot prompting: "
                              "remove the entry")
    distill = params.distill
    for i, name in enumerate(distill.tasks or ()):  # Params.validate: tasks (null: finetune's, filled in)
        kind = task_type(params.tasks[name])
        if not isinstance(kind, Distilled):
            raise ParamsError(f"distill.tasks[{i}]: '{name}' is a {kind.name} task, which has no distillation; "
                              "list distill.tasks without it ([] for no students)")
        check_distilled(kind, name, distill)
    for name, split in params.distill.unlabeled.items():  # Params.validate: every name is a task's
        kind = task_type(params.tasks[name])
        if not isinstance(kind, UnlabeledTransfer):
            raise ParamsError(f"distill.unlabeled.{name}: {split!r} names unlabeled text for a {kind.name} task, "
                              "which takes no unlabeled transfer text: remove the entry")
    if params.finetune.aux_lm_weight > 0:
        for task in params.finetune.tasks:
            kind = task_type(params.tasks[task])
            if not kind.aux_lm:
                raise ParamsError(f"finetune.aux_lm_weight: the auxiliary LM loss is not for {kind.name} tasks, and "
                                  f"finetune.tasks has {task}; set it to 0")


def check_distilled(kind: Distilled, name: str, distill: DistillConfig) -> None:
    """What distill asks of the type of task `name`: sequence-level KD of a type that writes its outputs
    with a decoder (Distilled.generates), Patient-KD and a layer map of one that does not."""
    if kind.generates:
        if distill.pkd_weight > 0:
            raise ParamsError(f"distill.pkd_weight: Patient-KD compares a sequence's summary states, which a "
                              f"{kind.name} task ({name}) has none of; set it to 0 or leave {name} out of distill.tasks")
        if distill.layer_map is not None:
            raise ParamsError(f"distill.layer_map: a {kind.name} student ({name}) imitates the teacher's decoder "
                              "layers it starts from; set layer_map: null")
    elif distill.targets == "teacher":
        raise ParamsError(f"distill.targets: teacher (sequence-level KD) is for tasks whose outputs are written "
                          f"text, and {name} is a {kind.name} task; set targets: gold or list seq2seq tasks only")
