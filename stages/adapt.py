"""Stage `adapt` (ULMFiT step 2): continue the pretraining objective on the target domain's text.

Loads the pretrained model (--model) and trains it further with the same objective on the domain's
packed tokens (default: IMDb train + unsup, never IMDb test; with `init`, the objective that fits the
published model: mlm for an encoder, clm for GPT-2), with discriminative LRs (each layer
group's LR is the one above it / adapt.lr_decay) and the slanted triangular schedule. Reports the
domain validation metrics before and after. With `adapt.enabled: false` the pretrained model goes to
--out unchanged and the metrics say so, so that the value of adapting can be measured.
"""
import shutil

import torch

from lib.core.errors import run_main
from lib.core.io import atomic_dir, write_csv, write_json
from lib.core.stage import open_stage
from lib.data.tokenizer import load_tokenizer, saved_special_ids
from lib.models.folder import read_config
from lib.objectives import (EXTRAS_FILE, build_objective, check_objective, fitting_objective, load_objective,
                            objective_extras)
from lib.training.lm import CURVES, LMPaths, train_language_model
from lib.training.optim import check_optimizers


def main() -> None:
    stage = open_stage("adapt", __doc__, inputs={"model": "models/pretrain", "tokens": "data/tokens/domain",
                                                    "parallel": "data/tokens/parallel"},
                       outputs={"out": "models/adapt", "metrics": "metrics/adapt.json", "plots": "plots/adapt",
                                "checkpoints": "data/checkpoints/adapt"}, checks=[check_objective, check_optimizers])
    args, params = stage.args, stage.params

    if params.adapt.enabled and stage.relaunch():
        return
    with stage.run() as run:
        if not params.adapt.enabled:
            with atomic_dir(args.out) as tmp:
                shutil.copytree(args.model, tmp, dirs_exist_ok=True)
            for name, columns in CURVES.items():  # DVC expects the declared plots: empty curves
                write_csv(args.plots / f"{name}.csv", columns, [])
            write_json(args.metrics, {"enabled": False, "objective": params.objective})
            print("adapt.enabled is false: the pretrained model goes on unchanged", flush=True)
            return
        torch.manual_seed(params.seed)
        if params.init:  # the published model's shape, and the objective that fits it (as pretrain chose)
            arch = read_config(args.model)
            name, vocab_size = fitting_objective(params.objective, arch), arch.vocab_size
        else:
            arch, name, vocab_size = None, params.objective, load_tokenizer(args.model).get_vocab_size()
        objective = build_objective(name, params, vocab_size, saved_special_ids(args.model), arch)
        if not load_objective(objective, args.model) and objective_extras(objective):
            print(f"warning: {args.model} has no {EXTRAS_FILE} ({name}'s parts beyond the backbone: ELECTRA's "
                  "generator, bilm's backward stack); adapting with fresh ones", flush=True)
        paths = LMPaths(args.model, args.tokens, args.parallel, args.out, args.metrics, args.plots, args.checkpoints)
        metrics = train_language_model("adapt", params, params.adapt, objective, paths, run, stage.keyed_on,
                                       layer_groups=objective.backbone().layer_groups(), measure_before=True)
        if metrics:  # rank 0's
            print(f"domain validation loss {metrics['before_val_loss']:.4f} -> {metrics['val_loss']:.4f}", flush=True)


if __name__ == "__main__":
    run_main(main)
