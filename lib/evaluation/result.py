"""What the evaluation finds for a task (lib.evaluation.evaluate), typed, and its one JSON form: the
task's entry of metrics/evaluate.json, written by `to_json` and read back by `from_json`.

The JSON keeps the order it has always had, and a key that does not apply is absent (not null):
dvc metrics and anyone reading the file see the same file as before the result was typed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lib.tasks import TYPES
from lib.tasks.capabilities import kept_extras

Scores = dict[str, dict[str, float]]  # model -> metric -> value (a finetune variant's also <metric>_std)
PerModel = dict[str, dict[str, Any]]  # an extra's name -> model -> its value


@dataclass
class SplitEvaluation:
    """The scores of every model on one labeled split, and how many items each side had."""

    examples: int  # evaluation items scored
    train_examples: int  # train items finetuning (and the baseline beside it) learned from
    full_train_examples: int  # all of train but dev (the other baseline's)
    scores: Scores = field(default_factory=dict)
    extras: PerModel = field(default_factory=dict)  # the type's per-split extras, as the JSON holds them

    def to_json(self) -> dict[str, Any]:
        return {"examples": self.examples, "train_examples": self.train_examples,
                "full_train_examples": self.full_train_examples, "scores": self.scores, **self.extras}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SplitEvaluation:
        known = {"examples", "train_examples", "full_train_examples", "scores"}
        return cls(examples=data["examples"], train_examples=data["train_examples"],
                   full_train_examples=data["full_train_examples"], scores=data["scores"],
                   extras={k: v for k, v in data.items() if k not in known})


@dataclass
class Retention:
    """How much of the teacher a distilled student keeps: `retained`, the student's share of the teacher's
    main metric on the first split (None where the teacher scored 0), and `speedup`, the teacher's CPU
    p50 latency over the student's."""

    retained: float | None
    speedup: float


@dataclass
class TaskEvaluation:
    """evaluate's result for a task: per labeled split the scores of every model, the type's extras, the
    models' efficiency, and what the report says about them."""

    type: str  # the task's type (lib.tasks.TYPES)
    metric: str  # the main metric: what picks the best model, the figures' score
    metrics: list[str]
    splits: dict[str, SplitEvaluation] = field(default_factory=dict)  # in eval_splits order, labeled ones only
    language: str | None = None
    transfer_from: str | None = None  # the task whose models and train set it is scored with
    teacher: dict[str, Any] | None = None  # the teacher's finetune variant and seed
    data: dict[str, str | None] | None = None  # the params' data label and note
    # the type's extras of the first split (lib.tasks.capabilities.Extra), the figures' only ones too
    extras: PerModel = field(default_factory=dict)
    label_names: list[str] | None = None  # the classes of its confusion matrices (figures only)
    note: str | None = None  # what was not scored, and why
    timed: str | None = None  # what one timed call of a model is
    efficiency: dict[str, dict[str, Any]] = field(default_factory=dict)  # role -> size, CPU (and GPU) timings
    onnx: dict[str, dict[str, Any]] | None = None  # role -> ONNX size and ONNX Runtime timings (served types)
    retention: Retention | None = None  # where both teacher and student were timed after distillation

    @property
    def first_split(self) -> SplitEvaluation:
        """The split the finetune variants and figures are scored on."""
        return next(iter(self.splits.values()))

    @property
    def first_split_name(self) -> str:
        return next(iter(self.splits))

    def to_json(self) -> dict[str, Any]:
        """The task's entry of metrics/evaluate.json: what the figures alone draw is left out."""
        kind = TYPES[self.type]
        saved = {extra.name for extra in kept_extras(kind) if extra.saved}
        optional = {"transfer_from": self.transfer_from, "teacher": self.teacher, "data": self.data,
                    **{name: value for name, value in self.extras.items() if name in saved},
                    "note": self.note, "timed": self.timed}
        out = {"type": self.type, "metric": self.metric, "metrics": self.metrics,
               "splits": {name: split.to_json() for name, split in self.splits.items()}, "language": self.language,
               **{key: value for key, value in optional.items() if value is not None}, "efficiency": self.efficiency}
        if self.onnx is not None:
            out["onnx"] = self.onnx
        if self.retention is not None:
            out.update(retained=self.retention.retained, speedup=self.retention.speedup)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskEvaluation:
        """A task's entry of metrics/evaluate.json read back (without what only the figures drew)."""
        fields = {"type", "metric", "metrics", "splits", "language", "transfer_from", "teacher", "data", "note",
                  "timed", "efficiency", "onnx", "retained", "speedup"}
        retention = Retention(data["retained"], data["speedup"]) if "speedup" in data else None
        return cls(type=data["type"], metric=data["metric"], metrics=data["metrics"],
                   splits={name: SplitEvaluation.from_json(split) for name, split in data["splits"].items()},
                   language=data.get("language"), transfer_from=data.get("transfer_from"), teacher=data.get("teacher"),
                   data=data.get("data"), extras={k: v for k, v in data.items() if k not in fields},
                   note=data.get("note"), timed=data.get("timed"), efficiency=data.get("efficiency", {}),
                   onnx=data.get("onnx"), retention=retention)
