"""Stage `pretrain`: train the transformer with the chosen objective on the packed pretraining tokens.

Writes the pretrained model (`model.safetensors` + `config.json` + the tokenizer files) to --out,
final metrics to the metrics JSON and the training/validation curves as plot CSVs. Checkpoints go to
--checkpoints while it runs: killed and started again, it resumes from the last one.
"""
import argparse
import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import torch

from lib import tracking
from lib.config import flatten, load_params
from lib.data import WindowBatches, fixed_windows
from lib.errors import run_main
from lib.io import atomic_dir, write_csv, write_json
from lib.model import Transformer, save_model
from lib.objectives import build_objective
from lib.packed import PackedTokens
from lib.tokenizer import load_tokenizer, special_ids
from lib.trainer import Trainer, resolve_device

# curve -> its columns; a history row belongs to a curve when it has the curve's `<name>_loss`
CURVES = {"train": ["step", "tokens", "train_loss", "lr", "tokens_per_s"], "val": ["step", "tokens", "val_loss"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--tokenizer", type=Path, default=Path("data/tokenizer"))
    parser.add_argument("--tokens", type=Path, default=Path("data/tokens/pretrain"))
    parser.add_argument("--out", type=Path, default=Path("models/pretrain"))
    parser.add_argument("--metrics", type=Path, default=Path("metrics/pretrain.json"))
    parser.add_argument("--plots", type=Path, default=Path("plots/pretrain"))
    parser.add_argument("--checkpoints", type=Path, default=Path("data/checkpoints/pretrain"))
    args = parser.parse_args()
    params = load_params(args.params)
    cfg = params.pretrain
    stage_params = {"seed": params.seed, "device": params.device, "objective": params.objective,
                    "model": params.model, "mlm": params.mlm, "electra": params.electra, "pretrain": cfg,
                    "impl": params.impl}

    torch.manual_seed(params.seed)
    device = resolve_device(params.device)
    tokenizer = load_tokenizer(args.tokenizer)
    vocab_size = tokenizer.get_vocab_size()
    objective = build_objective(params.objective, params, vocab_size,
                                special_ids(tokenizer, params.tokenizer.special_tokens))
    train_tokens, valid_tokens = PackedTokens(args.tokens / "train"), PackedTokens(args.tokens / "valid")
    window = cfg.seq_len + 1  # causal objectives predict token t+1; the others use the first seq_len
    train = WindowBatches(train_tokens, window, cfg.batch_size, params.seed, name=str(args.tokens / "train"))
    valid = fixed_windows(valid_tokens, window, cfg.batch_size, cfg.eval_batches)
    transformers = [m for m in objective.modules() if isinstance(m, Transformer)]
    flops_per_token = sum(m.flops_per_token(cfg.seq_len) for m in transformers)

    with tracking.stage_run("pretrain", params.tracking, params, stage_params) as run:
        fingerprint = run_fingerprint(stage_params, vocab_size, args.tokenizer, train_tokens, valid_tokens)
        trainer = Trainer(objective, cfg, params.impl, device, train, valid, args.checkpoints, fingerprint,
                          params.seed, flops_per_token, callbacks=(run, ConsoleLog()))
        state = trainer.fit()
        with atomic_dir(args.out) as out:
            save_model(objective.backbone(), out)
            for path in args.tokenizer.iterdir():
                shutil.copy2(path, out / path.name)
        final = next(row for row in reversed(state.history) if "val_loss" in row)
        metrics = {**{k: v for k, v in final.items() if k.startswith("val_")},
                   "unigram_loss": unigram_loss(train_tokens), "objective": params.objective,
                   "tokens_seen": state.tokens, "steps": state.step, "train_seconds": round(state.seconds, 1),
                   "tokens_per_s": round(state.tokens / max(state.seconds, 1e-9), 1),
                   "params": objective.backbone().num_params(), "device": device.type}
        if objective.causal:
            metrics["val_perplexity"] = math.exp(min(metrics["val_loss"], 50.0))
        write_json(args.metrics, metrics)
        for name, columns in CURVES.items():
            write_csv(args.plots / f"{name}.csv", columns,
                      [[row.get(c, "") for c in columns] for row in state.history if f"{name}_loss" in row])
        run.log_metrics(metrics)
        for path in (args.metrics, args.plots):
            run.log_artifact(path)
        shutil.rmtree(args.checkpoints, ignore_errors=True)  # the model is out: nothing left to resume


def run_fingerprint(stage_params: dict, vocab_size: int, tokenizer_dir: Path, *splits: PackedTokens) -> str:
    """What determines the run: a checkpoint is resumed only by a run with the same fingerprint."""
    tokenizer = hashlib.sha256((tokenizer_dir / "tokenizer.json").read_bytes()).hexdigest()
    described = {"params": {k: str(v) for k, v in flatten(stage_params).items() if not k.startswith("impl.compile")},
                 "vocab_size": vocab_size, "tokenizer": tokenizer, "data": [[s.n_tokens, s.n_docs] for s in splits]}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def unigram_loss(packed: PackedTokens) -> float:
    """Cross-entropy of predicting every token by its training frequency: the loss to beat."""
    counts = np.bincount(packed.tokens, minlength=packed.vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


class ConsoleLog:
    """Progress lines on stdout (DVC shows them as the stage runs)."""

    def on_log(self, step: int, row: dict) -> None:
        print(f"step {step:6d}  tokens {row['tokens']:>11,}  loss {row['train_loss']:.4f}  lr {row['lr']:.2e}  "
              f"{row['tokens_per_s']:,.0f} tok/s" + (f"  mfu {row['mfu']:.1%}" if "mfu" in row else ""), flush=True)

    def on_eval(self, step: int, row: dict) -> None:
        print(f"step {step:6d}  validation  " + "  ".join(f"{k[4:]} {v:.4f}" for k, v in row.items()
                                                           if k.startswith("val_")), flush=True)


if __name__ == "__main__":
    run_main(main)
