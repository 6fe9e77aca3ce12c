"""Whether an encoder-decoder learns to read its source: T5's shape (pre-norm) against BART's (post-norm),
trained from random weights under AdamW to translate Multi30k English -> German.

    python bench/seq2seq_shapes.py [--data ../shared/data/multi30k_en_de] [--shapes t5,bart] [--lrs 1e-3]
        [--warmup 100] [--steps 400] [--batch 64] [--precision bf16|fp32] [--threads N]

A decoder can lower its loss as a language model of the targets alone; what the source is worth is the
loss on held-out pairs with their own sources against the same targets read after other pairs' sources
(shuffled within the batch): a model that reads no source scores both alike. Both shapes get the sizes
a CPU translation recipe would (4 + 4 layers, d_model 256, 4 heads, d_ff 1024, dropout 0.1), built as
`from_scratch` builds them (lib.models.architectures), and one BPE vocabulary (8,192 tokens, trained here on
both sides of the training pairs). Each (shape, lr) trains on the training pairs, encoded as the seq2seq
task type encodes them (lib/tasks/seq2seq.py: source and target ended by eos, at most 64 tokens each), in
the same batches of --batch pairs (lib.data.encoding.batch_indices, seed 0), with AdamW (betas 0.9 / 0.98,
eps 1e-6, weight decay 0.01), a linear warmup over --warmup steps then the constant lr, gradients clipped at
1.0, the type's loss (cross-entropy averaged over target tokens). Every 100 steps it prints the mean
training loss of those steps and, on 256 validation pairs in eval mode, the loss with their own and with
shuffled sources. Nothing is timed, so other load on the machine changes no figure.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from lib.config.params import ModelConfig, TaskConfig, TokenizerConfig  # noqa: E402
from lib.core import runtime  # noqa: E402
from lib.core.errors import UserError, run_main  # noqa: E402
from lib.data.encoding import batch_indices  # noqa: E402
from lib.data.tokenizer import saved_special_ids, train_tokenizer  # noqa: E402
from lib.models.architectures import build_model  # noqa: E402
from lib.models.architectures.encoder_decoder import SHAPES, seq2seq_config  # noqa: E402
from lib.tasks.base import TaskData  # noqa: E402
from lib.tasks.seq2seq import TYPE as KIND, Example, Seq2SeqModel, encode, read_rows  # noqa: E402

SIZES = ModelConfig(d_model=256, n_layers=4, n_heads=4, d_ff=1024, dropout=0.1, max_positions=512)


def pairs(folder: Path, split: str) -> list[dict[str, str]]:
    path = folder / f"{split}.jsonl.gz"
    if not path.is_file():
        raise UserError(f"--data: {path} not found; point --data at a folder with Multi30k's {split}.jsonl.gz")
    with gzip.open(path, "rt", encoding="utf-8") as rows:
        return [{"source": r["translation"]["en"], "target": r["translation"]["de"]} for r in map(json.loads, rows)]


def curve(shape: str, lr: float, task: TaskData, held_out: list[Example], vocab_size: int, args) -> list[str]:
    """Per 100 steps: "train loss / held-out loss with own sources / with shuffled sources"."""
    torch.manual_seed(0)
    model = Seq2SeqModel(build_model(seq2seq_config(SIZES, shape, None, vocab_size, task.special))).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / args.warmup))
    groups = batch_indices(task.train, args.batch, seed=0)
    own = KIND.collate(held_out, task.special["pad"], task)
    shuffled = {**own, "input_ids": own["input_ids"].roll(1, 0), "attention_mask": own["attention_mask"].roll(1, 0)}
    seen: list[float] = []
    cells = []
    for step in range(1, args.steps + 1):
        batch = KIND.collate([task.train[i] for i in groups[step % len(groups)]], task.special["pad"], task)
        with runtime.autocast(torch.device("cpu"), args.precision):
            outputs, _ = KIND.forward(model, batch)
        loss = KIND.loss(outputs, batch, task)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        seen.append(loss.item())
        if step % 100 == 0 or step == args.steps:
            model.eval()
            with torch.no_grad(), runtime.autocast(torch.device("cpu"), args.precision):
                held = [KIND.loss(KIND.forward(model, b)[0], b, task).item() for b in (own, shuffled)]
            model.train()
            cells.append(f"{sum(seen) / len(seen):.2f} / {held[0]:.2f} / {held[1]:.2f}")
            seen = []
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/multi30k_en_de")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--lrs", default="1e-3")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    if not set(shapes) <= set(SHAPES):
        raise UserError(f"--shapes: {args.shapes} must name some of {', '.join(SHAPES)}")
    torch.set_num_threads(args.threads)
    train, validation = pairs(args.data, "train"), pairs(args.data, "validation")
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = train_tokenizer((t for r in train for t in (r["source"], r["target"])),
                                    TokenizerConfig(vocab_size=8192, train_chars=None, sentinels=0), folder)
        special = saved_special_ids(folder)

    def encode_rows(rows: list[dict[str, str]]) -> list[Example]:
        return encode(read_rows(rows, TaskConfig(source="unused", type=KIND.name), "--data")[0], tokenizer,
                      special["eos"], 64, 64)[0]

    task = TaskData("multi30k_en_de", [], encode_rows(train), [], None, "", {}, {}, type=KIND.name, special=special)
    held_out = encode_rows(validation[:256])
    print(f"{len(task.train):,} training pairs, {len(held_out)} held out, {tokenizer.get_vocab_size():,} tokens, "
          f"{args.steps} steps of {args.batch}, warmup {args.warmup}, {args.precision}, {args.threads} threads")
    checkpoints = [*range(100, args.steps, 100), args.steps]
    print("| shape | lr | " + " | ".join(f"step {step}" for step in checkpoints) + " |")
    print("|---|---|" + "---|" * len(checkpoints))
    for shape in shapes:
        for lr in map(float, args.lrs.split(",")):
            cells = curve(shape, lr, task, held_out, tokenizer.get_vocab_size(), args)
            print(f"| {shape} | {lr:g} | " + " | ".join(cells) + " |", flush=True)
    print("Each cell: training loss (mean of the last 100 steps) / held-out loss with own sources / with shuffled "
          "sources.")


if __name__ == "__main__":
    run_main(main)
