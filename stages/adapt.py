"""Stage `adapt` (ULMFiT step 2): continue the pretraining objective on the target domain's text.

Loads the pretrained model (--model) and trains it further with the same objective on the domain's
packed tokens (default: IMDb train + unsup, never IMDb test; with `init`, the objective that fits the
checkpoint: mlm for an encoder, clm for GPT-2), with discriminative LRs (each layer
group's LR is the one above it / adapt.lr_decay) and the slanted triangular schedule. Reports the
domain validation metrics before and after. With `adapt.enabled: false` the pretrained model goes to
--out unchanged and the metrics say so, so that the value of adapting can be measured.
"""
import argparse
import shutil
from pathlib import Path

import torch

from lib.config.params import load_params, stage_params
from lib.core import tracking
from lib.core.errors import run_main
from lib.core.io import atomic_dir, check_writable, write_csv, write_json
from lib.data.tokenizer import load_tokenizer, saved_special_ids
from lib.models.folder import read_config
from lib.objectives import build_objective, fitting_objective, load_objective
from lib.training import distributed
from lib.training.lm import CURVES, LMPaths, train_language_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--model", type=Path, default=Path("models/pretrain"))
    parser.add_argument("--tokens", type=Path, default=Path("data/tokens/domain"))
    parser.add_argument("--out", type=Path, default=Path("models/adapt"))
    parser.add_argument("--metrics", type=Path, default=Path("metrics/adapt.json"))
    parser.add_argument("--plots", type=Path, default=Path("plots/adapt"))
    parser.add_argument("--checkpoints", type=Path, default=Path("data/checkpoints/adapt"))
    args = parser.parse_args()
    check_writable(args.out, args.metrics, args.plots, args.checkpoints)
    params = load_params(args.params)
    keyed_on = stage_params(params, "adapt")

    if params.adapt.enabled and distributed.relaunch(params.impl, "stages.adapt"):
        return
    with tracking.stage_run("adapt", params.tracking, params, keyed_on) as run:
        if not params.adapt.enabled:
            with atomic_dir(args.out) as tmp:
                shutil.copytree(args.model, tmp, dirs_exist_ok=True)
            for name, columns in CURVES.items():  # DVC expects the declared plots: empty curves
                write_csv(args.plots / f"{name}.csv", columns, [])
            write_json(args.metrics, {"enabled": False, "objective": params.objective})
            print("adapt.enabled is false: the pretrained model goes on unchanged", flush=True)
            return
        torch.manual_seed(params.seed)
        if params.init:  # the checkpoint's shape, and the objective that fits it (as pretrain chose)
            arch = read_config(args.model)
            name, vocab_size = fitting_objective(params.objective, arch), arch.vocab_size
        else:
            arch, name, vocab_size = None, params.objective, load_tokenizer(args.model).get_vocab_size()
        objective = build_objective(name, params, vocab_size, saved_special_ids(args.model), arch)
        if not load_objective(objective, args.model) and name == "electra":
            print(f"warning: {args.model} has no ELECTRA generator; adapting with a fresh one", flush=True)
        paths = LMPaths(args.model, args.tokens, args.out, args.metrics, args.plots, args.checkpoints)
        metrics = train_language_model("adapt", params, params.adapt, objective, paths, run, keyed_on,
                                       layer_groups=objective.backbone().layer_groups(), measure_before=True)
        if metrics:  # rank 0's
            print(f"domain validation loss {metrics['before_val_loss']:.4f} -> {metrics['val_loss']:.4f}", flush=True)


if __name__ == "__main__":
    run_main(main)
