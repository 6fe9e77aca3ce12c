"""Finetuning and distillation throughput: this pipeline's training steps against Hugging Face's `Trainer`.

    python bench/finetune_throughput.py [--task sst2|imdb] [--max-len N] [--batch N] [--steps N] [--warmup N]
        [--precision auto|bf16|fp32] [--threads N] [--layers N] [--only finetune|distill] [--model DIR]
        [--data DIR] [--seed N]

Needs `accelerate` (transformers' Trainer does): `pip install -e '.[bench]'`.

Both sides run in this one process, one after the other, on the same examples: (warmup + steps) x batch
train texts of the task drawn with a fixed seed from ../shared/data/<task>/train.jsonl.gz; the first
warmup x batch are the warmup pool, the other steps x batch the timed pool. Both start from the same
MiniLM (../shared/models/all-MiniLM-L6-v2), cut texts to the same --max-len tokens ([CLS] and
[SEP] included, the head of a longer text kept), train with the same batch size, AdamW, gradient clipping
at 1.0 and a linear LR schedule (each its own AdamW: ours torch's AdamW as lib/training/optim.py makes it,
fused on CUDA and the foreach implementation on CPU; HF its default optim, adamw_torch_fused), and run in the
same precision: bf16 autocast or fp32, resolved as the
stages resolve impl.precision (lib.core.runtime; auto = bf16 on CUDA, on CPU only where its probe found
bf16 faster); HF gets bf16=True exactly when ours runs bf16. Each side first trains one pass over the
warmup pool (untimed), then one pass over the timed pool (timed). Neither side is compiled: the finetune
and distill stages never compile (impl.compile applies to pretrain and adapt only), and Trainer's
torch_compile is off by default.

Finetune. Ours is the finetune stage's `plain` variant (the cpu-minilm recipe's): lib.models.hf.import_model
reads MiniLM, lib/training/variants/plain.py builds the TaskModel (BERT's pooler + a linear layer on [CLS],
as BertForSequenceClassification), FullTrainer builds its AdamW and LambdaLR (warmup + linear decay;
lib.training.optim) and EpochLoop; the texts are encoded by lib.tasks.classification.encode_rows.
  Timed: one FullTrainer.train_epoch over the timed pool, as the stage runs it: batch_indices (shuffled,
  sorted by length within chunks of 50 batches: little padding), the type's collate (padding to each
  batch's longest), autocast forward, cross-entropy, backward, loss.item(), EpochLoop.step (non-finite
  check, gradient clipping, AdamW step, scheduler step, zero_grad), the progress line.
  Not timed: importing the model, encoding the texts, building the trainer and optimizer, dev scoring
  and the epoch's checkpoint (EpochLoop.run is not called: they are per epoch, not per step).
HF is `Trainer` on AutoModelForSequenceClassification of the same folder, the texts tokenized by its
AutoTokenizer (truncation=True, max_length) through datasets.map, as HF users run it: its own dataloader
(RandomSampler, dataloader_num_workers=0), DataCollatorWithPadding (dynamic padding to each batch's
longest), its default optimizer (adamw_torch_fused) and linear schedule, max_grad_norm 1.0; logging, saving, evaluation and
reporting off.
  Timed: from on_epoch_begin to on_epoch_end of a second trainer.train() over the timed pool (max_steps =
  steps, one epoch): the dataloader's iteration and collation, training_step (accelerate's autocast
  forward, loss, backward), clipping, optimizer and scheduler steps, zero_grad, the callbacks.
  Not timed: the first train() over the warmup pool, tokenization, building the Trainer, its optimizer
  and accelerate's prepare (before on_epoch_begin), _finalize_training (after on_epoch_end).

Distill. A 3-layer student (--layers; the cpu-minilm recipe's) of the 6-layer MiniLM teacher, with the
distill stage's default loss: soft (KL of the T=2 distributions x T^2, weight 1), hard (cross-entropy
with the gold label, weight 0.5) and hidden (1 - cosine of the student's last layer and the teacher's
last layer over the real tokens, weight 1). The teacher is the finetune `plain` classifier of MiniLM (its
head untrained: that does not change the cost).
  Ours: lib.training.distill as distill_task sets it up (student_plan, build_student from every other
  teacher block, Distiller, optimizer_and_schedule, EpochLoop). Timed: distill.teacher_outputs on the timed pool
  (the teacher's forward, in eval mode under no_grad, batches of 2 x batch sorted by length, its logits
  and last-layer states kept on the CPU in bf16: the stage computes them once before the first epoch)
  plus one distill.train_epoch over it (collate, the student's forward, the three losses against the
  cached outputs, backward, EpochLoop.step). The warmup pass does the same on the warmup pool.
  HF: a Trainer subclass whose compute_loss does what HF users write for knowledge distillation:
  the teacher (AutoModelForSequenceClassification, eval mode) forward under no_grad inside
  accelerator.autocast() on the same batch, the student's forward (the same class with
  num_hidden_layers=3), and the same three losses; everything else as the finetune Trainer. Timed as
  above: the teacher's forward is inside every step.
  So both timed regions hold one teacher forward and one student training step per example; ours runs
  the teacher in larger batches, once per pass, as the stage does.

Reported per side: examples/s and tokens/s over the timed region, tokens being real (non-pad) tokens; the
padded tokens per example show what each side's batching computed on. ours/HF is the ratio of examples/s
(the same examples, so the same as the ratio of tokens/s).
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from lib.config.errors import UserError
from lib.config.params import DistillConfig, FinetuneConfig, ImplConfig, TaskConfig  # noqa: E402
from lib.core import distributed  # noqa: E402
from lib.core import runtime  # noqa: E402
from lib.core.errors import run_main  # noqa: E402
from lib.data.encoding import batch_indices  # noqa: E402
from lib.models.hf import import_model, import_tokenizer  # noqa: E402
from lib.tasks.base import TaskData  # noqa: E402
from lib.tasks.classification import TYPE as CLASSIFICATION, Row, encode_rows  # noqa: E402
from lib.training import distill  # noqa: E402
from lib.training.epoch_loop import EpochLoop  # noqa: E402
from lib.training.finetune import FullTrainer  # noqa: E402
from lib.training.optim import optimizer_and_schedule  # noqa: E402
from lib.training.variants.plain import Plain  # noqa: E402

TASKS = {"sst2": ("text", 64), "imdb": ("text", 192)}  # text field, params.yaml's max_len
LABELS = ["negative", "positive"]


def read_rows(data: Path, task: str, n: int, seed: int) -> list[tuple[str, int]]:
    """n (text, label) rows of the task's train split, a fixed random sample."""
    path = data / task / "train.jsonl.gz"
    if not path.is_file():
        raise UserError(f"{path}: not found; --data names the folder of the offline datasets (../shared/data)")
    field = TASKS[task][0]
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [(r[field], int(r["label"])) for r in map(json.loads, f) if r[field].strip()]
    if len(rows) < n:
        raise UserError(f"{path}: {len(rows)} rows, fewer than the {n} that --warmup, --steps and --batch need")
    return random.Random(seed).sample(rows, n)


def result(label: str, seconds: float, examples: int, tokens: int, padded: int) -> dict:
    return {"side": label, "seconds": seconds, "examples_per_s": examples / seconds, "tokens_per_s": tokens / seconds,
            "tokens": tokens, "padded_per_example": padded / examples}


def padded_tokens(examples: list, batch_size: int, seed: int) -> int:
    """The tokens ours computes on in one train_epoch: each batch padded to its longest (the same batches
    train_epoch draws from the same seed)."""
    return sum(len(group) * max(len(examples[i].ids) for i in group)
               for group in batch_indices(examples, batch_size, seed=seed))


# ours -----------------------------------------------------------------------------------------------

class Ours:
    def __init__(self, args: argparse.Namespace, device: torch.device):
        self.args, self.device = args, device
        folder = Path(args.model)
        imported = import_model(folder)
        tokenizer, roles, _ = import_tokenizer(folder, imported.model.cfg.vocab_size)
        self.special = {role: tokenizer.token_to_id(token) for role, token in roles.items()}
        self.backbone = imported.model
        cfg = TaskConfig(source="bench", max_len=args.max_len, truncation="head")
        self.pools = [encode_rows([Row(text, None, label) for text, label in pool], cfg, tokenizer, self.special)[0]
                      for pool in args.pools]
        self.impl = ImplConfig(precision=args.precision, threads=args.threads)
        self.checkpoints = args.scratch / "ours"  # EpochLoop's; nothing is written there

    def task(self, examples: list) -> TaskData:
        return TaskData("bench", LABELS, examples, [], None, "none", {}, {})

    def finetune(self) -> dict:
        args = self.args
        cfg = FinetuneConfig(batch_size=args.batch, epochs=3)
        warm, timed = self.pools
        task = self.task(timed)  # the schedule spans 3 passes over the timed pool: warmup + timed fit in it
        plan = Plain().setup(self.backbone, len(LABELS), cfg, CLASSIFICATION)
        plan.model.read_as(None)
        model = plan.model.to(self.device)
        trainer = FullTrainer(model, plan, task, cfg, self.impl, self.device, self.special["pad"], args.seed,
                              self.checkpoints / "finetune", "bench", "accuracy", label="ours finetune")
        task.train = warm
        trainer.train_epoch(1)
        task.train = timed
        sync(self.device)
        started = time.perf_counter()
        trainer.train_epoch(2)
        sync(self.device)
        seconds = time.perf_counter() - started
        self.teacher = model.cpu()  # the distillation's teacher
        return result("ours", seconds, len(timed), sum(len(e.ids) for e in timed),
                      padded_tokens(timed, args.batch, args.seed * 1000 + 2))

    def distill(self) -> dict:
        args = self.args
        cfg = DistillConfig(layers=args.layers, batch_size=args.batch, epochs=3, lr=3e-4)
        warm, timed = self.pools
        task = self.task(timed)
        kind = CLASSIFICATION
        teacher = self.teacher
        blocks, layer_map = distill.student_plan(cfg, teacher.backbone.cfg.n_layers)
        k = cfg.layers
        hidden_pairs = [(k, layer_map[-1])]  # hidden_layers: last
        torch.manual_seed(args.seed)
        distiller = distill.Distiller(distill.build_student(teacher, cfg, blocks), teacher.backbone.cfg.d_model, kind)
        teacher = teacher.to(self.device)
        synced = distributed.wrap(distiller.to(self.device), distributed.Context(), self.device, self.impl.strategy,
                                  parts=[distiller.student])
        total = -(-len(timed) // cfg.batch_size) * cfg.epochs
        optimizer, scheduler = optimizer_and_schedule(distiller, cfg, self.device, cfg.lr,
                                                      distill.student_schedule(cfg), total)
        loop = EpochLoop(distiller, distiller.student, optimizer, scheduler, cfg, epochs=cfg.epochs,
                         patience=cfg.patience, metric="accuracy", checkpoint_dir=self.checkpoints / "distill",
                         fingerprint="bench", where="ours distill")
        pad = self.special["pad"]

        def one_pass(examples: list, epoch: int) -> None:
            task.train = examples
            cache = distill.teacher_outputs(teacher, task, examples, [t for _, t in hidden_pairs], [],
                                            cfg.batch_size * 2, pad, self.device, self.impl, label="ours teacher")
            distill.train_epoch(synced, task, examples, cache, hidden_pairs, [], cfg, self.impl, self.device, pad,
                                loop, args.seed * 1000 + epoch)

        one_pass(warm, 1)
        sync(self.device)
        started = time.perf_counter()
        one_pass(timed, 2)
        sync(self.device)
        seconds = time.perf_counter() - started
        return result("ours", seconds, len(timed), sum(len(e.ids) for e in timed),
                      padded_tokens(timed, args.batch, args.seed * 1000 + 2))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# Hugging Face -----------------------------------------------------------------------------------------

class HF:
    def __init__(self, args: argparse.Namespace, device: torch.device):
        import datasets
        import transformers

        self.args, self.device, self.transformers = args, device, transformers
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
        datasets.disable_progress_bars()
        transformers.logging.set_verbosity_error()  # the load report: the head is new, the student has 3 of 6 layers
        transformers.logging.disable_progress_bar()

        def tokenized(pool: list[tuple[str, int]]):
            raw = datasets.Dataset.from_dict({"text": [t for t, _ in pool], "label": [y for _, y in pool]})
            return raw.map(lambda b: self.tokenizer(b["text"], truncation=True, max_length=args.max_len),
                           batched=True, remove_columns=["text"])

        self.pools = [tokenized(pool) for pool in args.pools]

    def model(self, **overrides):
        return self.transformers.AutoModelForSequenceClassification.from_pretrained(
            self.args.model, num_labels=len(LABELS), attn_implementation="sdpa", **overrides)

    def run(self, trainer_class: type, model, lr: float, **extra) -> dict:
        """Trainer over the warmup pool, then over the timed pool; the second pass timed."""
        transformers, args = self.transformers, self.args
        warm, timed = self.pools
        timer = clock(transformers, self.device)
        collator = CountingCollator(transformers.DataCollatorWithPadding(self.tokenizer))
        training = transformers.TrainingArguments(
            output_dir=str(args.scratch / "hf"), per_device_train_batch_size=args.batch,
            max_steps=args.warmup, learning_rate=lr, weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.98,
            adam_epsilon=1e-6, max_grad_norm=1.0, warmup_steps=max(1, round(0.1 * 3 * args.steps)),
            bf16=args.precision == "bf16", use_cpu=self.device.type == "cpu", dataloader_num_workers=0,
            logging_strategy="no", save_strategy="no", eval_strategy="no", report_to=[], disable_tqdm=True,
            seed=args.seed)
        trainer = trainer_class(model=model, args=training, train_dataset=warm, data_collator=collator,
                                callbacks=[timer], **extra)
        trainer.remove_callback(transformers.PrinterCallback)  # its end-of-train line; logging is off
        trainer.train()
        # the timed pass: the same Trainer, its dataset and length changed
        trainer.train_dataset, trainer.args.max_steps = timed, args.steps
        collator.batches.clear()
        timer.armed = True
        trainer.train()
        if len(collator.batches) != args.steps:
            raise RuntimeError(f"HF collated {len(collator.batches)} batches in the timed pass, not {args.steps}")
        tokens = sum(real for real, _ in collator.batches)
        padded = sum(width for _, width in collator.batches)
        return result("HF Trainer", timer.seconds, len(timed), tokens, padded)

    def finetune(self) -> dict:
        return self.run(self.transformers.Trainer, self.model(), FinetuneConfig().plain.lr)

    def distill(self) -> dict:
        teacher = self.model().to(self.device).eval()
        student = self.model(num_hidden_layers=self.args.layers)
        return self.run(distillation_trainer(self.transformers), student, 3e-4, teacher=teacher)


class CountingCollator:
    """DataCollatorWithPadding, recording each batch's (real tokens, padded tokens) as it collates it."""

    def __init__(self, collator):
        self.collator, self.batches = collator, []

    def __call__(self, features):
        batch = self.collator(features)
        mask = batch["attention_mask"]
        self.batches.append((int(mask.sum()), mask.numel()))
        return batch


def clock(transformers, device: torch.device):
    """A TrainerCallback that times, once armed, from on_epoch_begin to on_epoch_end of the next train()."""

    class Clock(transformers.TrainerCallback):
        def __init__(self):
            self.armed, self.seconds, self.started = False, 0.0, 0.0

        def on_epoch_begin(self, args, state, control, **kwargs):
            if self.armed:
                sync(device)
                self.started = time.perf_counter()

        def on_epoch_end(self, args, state, control, **kwargs):
            if self.armed:
                sync(device)
                self.seconds = time.perf_counter() - self.started
                self.armed = False

    return Clock()


def distillation_trainer(transformers):
    dc = DistillConfig()

    class DistillationTrainer(transformers.Trainer):
        """Knowledge distillation as HF users write it: Trainer with compute_loss overridden; the losses
        of the distill stage's defaults (soft KL x T^2, hard cross-entropy, hidden cosine on the last layer)."""

        def __init__(self, *args, teacher=None, **kwargs):
            super().__init__(*args, **kwargs)
            self.teacher = teacher

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels = inputs["labels"]
            features = {k: v for k, v in inputs.items() if k != "labels"}
            with torch.no_grad(), self.accelerator.autocast():
                teacher = self.teacher(**features, output_hidden_states=True)
            student = model(**features, output_hidden_states=True)
            t = dc.temperature
            logits, target = student.logits.float(), teacher.logits.float()
            soft = F.kl_div(F.log_softmax(logits / t, -1), F.log_softmax(target / t, -1), reduction="batchmean",
                            log_target=True) * t * t
            hard = F.cross_entropy(logits, labels)
            mask = inputs["attention_mask"].bool()
            cosine = F.cosine_similarity(student.hidden_states[-1].float(), teacher.hidden_states[-1].float(), dim=-1)
            hidden = (1 - cosine)[mask].mean()
            loss = dc.soft_weight * soft + dc.hard_weight * hard + dc.hidden_weight * hidden
            return (loss, student) if return_outputs else loss

    return DistillationTrainer


# main ---------------------------------------------------------------------------------------------

def line(r: dict) -> str:
    return (f"  {r['side']:<10} {r['examples_per_s']:8.1f} examples/s  {r['tokens_per_s']:9,.0f} tokens/s  "
            f"({r['tokens']:,} real tokens in {r['seconds']:.1f} s; {r['padded_per_example']:.1f} tokens/example "
            "with padding)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=TASKS, default="sst2")
    parser.add_argument("--max-len", type=int, help="tokens per example, [CLS]/[SEP] included (default: the task's "
                                                    "params.yaml max_len: sst2 64, imdb 192)")
    parser.add_argument("--batch", type=int, default=32, help="examples per step (default: the stages' 32)")
    parser.add_argument("--steps", type=int, default=80, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per side first")
    parser.add_argument("--precision", choices=runtime.PRECISIONS, default="auto",
                        help="bf16 = bf16 autocast; auto = as the stages choose (lib/core/runtime.py)")
    parser.add_argument("--threads", type=int, default=0, help="torch's CPU threads; 0 = as the stages choose")
    parser.add_argument("--layers", type=int, default=3, help="the student's layers (distill)")
    parser.add_argument("--model", default=str(ROOT.parent / "shared" / "models" / "all-MiniLM-L6-v2"))
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--only", choices=["finetune", "distill"], help="one of the two benchmarks")
    parser.add_argument("--seed", type=int, default=1337)
    args = parser.parse_args()
    if min(args.batch, args.steps, args.warmup) < 1:
        raise UserError("--batch, --steps and --warmup must be >= 1")

    try:
        import accelerate  # noqa: F401 - transformers' Trainer needs it
    except ImportError:
        raise UserError("the HF side needs accelerate: pip install -e '.[bench]'") from None
    import transformers

    device = runtime.resolve_device("auto")
    torch.set_num_threads(runtime.cpu_threads(args.threads))
    args.precision = runtime.resolve_precision(args.precision, device, key="--precision")
    args.max_len = args.max_len or TASKS[args.task][1]
    rows = read_rows(Path(args.data), args.task, (args.warmup + args.steps) * args.batch, args.seed)
    args.pools = [rows[:args.warmup * args.batch], rows[args.warmup * args.batch:]]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{where}; torch {torch.__version__}, transformers {transformers.__version__}; {args.precision}; "
          f"{args.task} train, max_len {args.max_len}, batch {args.batch}; {args.warmup} warmup + {args.steps} "
          f"timed steps per side; MiniLM-L6 ({Path(args.model).name}), student {args.layers} layers", flush=True)

    with tempfile.TemporaryDirectory(prefix="finetune-bench-") as scratch:
        args.scratch = Path(scratch)
        compare(args, device)


def compare(args: argparse.Namespace, device: torch.device) -> None:
    ours, hf = Ours(args, device), HF(args, device)
    for name in ("finetune", "distill"):
        if args.only and args.only != name:
            continue
        if name == "distill" and not hasattr(ours, "teacher"):
            ours.teacher = Plain().setup(ours.backbone, len(LABELS), FinetuneConfig(), CLASSIFICATION).model
            ours.teacher.read_as(None)
        torch.manual_seed(args.seed)
        mine = getattr(ours, name)()
        torch.manual_seed(args.seed)
        theirs = getattr(hf, name)()
        if mine["tokens"] != theirs["tokens"]:
            print(f"  note: {mine['tokens']:,} real tokens ours, {theirs['tokens']:,} HF", flush=True)
        print(f"{name}:\n{line(mine)}\n{line(theirs)}\n  ours/HF    {mine['examples_per_s'] / theirs['examples_per_s']:.2f}x",
              flush=True)


if __name__ == "__main__":
    run_main(main)
