"""Task types: what a task's rows are and how a model learns and is scored on them, chosen by a task's
`type` in params.yaml (TaskConfig.type), as lib/objectives/ is chosen by `objective`.

A type says, for lib/training/finetune.py's one fit loop:
- how a split's rows are read (bad rows skipped and counted by reason) and which text hashes them
  into train and dev (`load`, with lib.tasks.base's hashed dev carve and limits, shared by every type);
- how items become model inputs and batches (`collate`: a dict of tensors), and what the head puts
  out: one vector per sequence or one per token (`per_token`), of `n_outputs(task)` values;
- the forward pass over a batch (multiple choice runs the encoder over every choice), the loss, and
  how many units (examples, tagged tokens) the loss averages over, so data-parallel ranks weigh
  their shares of a batch;
- predictions per example and the scores of a split (`score`), with what the evaluation split takes
  from dev (`calibration`: SQuAD 2.0's no-answer threshold).
"""
from lib.tasks import classification, multiple_choice, regression, span_qa, tagging
from lib.tasks.base import TaskType

TYPES: dict[str, TaskType] = {t.name: t for t in (classification.TYPE, regression.TYPE, tagging.TYPE, span_qa.TYPE,
                                                  multiple_choice.TYPE)}
