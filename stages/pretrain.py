"""Stage `pretrain`: train the transformer with the chosen objective on the packed pretraining tokens.

Writes the pretrained model (`model.safetensors` + `config.json` + the tokenizer files, and for
ELECTRA `objective.safetensors` with the generator) to --out, final metrics to the metrics JSON and
the training/validation curves as plot CSVs. Checkpoints go to --checkpoints while it runs: killed
and started again, it resumes from the last one.

With `init` set the model is the checkpoint's (lib/models/hf.py), trained with the objective that fits it;
`pretrain.with_init: keep` writes it out unchanged (no curves), `continue` pretrains it further.
"""
import argparse
from pathlib import Path

import torch

from lib.config.params import load_params, stage_params
from lib.core import tracking
from lib.core.errors import run_main
from lib.core.io import check_writable
from lib.data.tokenizer import load_tokenizer, saved_special_ids
from lib.objectives import build_objective
from lib.training import distributed
from lib.training.lm import LMPaths, keep_checkpoint, objective_from_checkpoint, train_language_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--tokenizer", type=Path, default=Path("data/tokens/tokenizer"))
    parser.add_argument("--tokens", type=Path, default=Path("data/tokens/pretrain"))
    parser.add_argument("--out", type=Path, default=Path("models/pretrain"))
    parser.add_argument("--metrics", type=Path, default=Path("metrics/pretrain.json"))
    parser.add_argument("--plots", type=Path, default=Path("plots/pretrain"))
    parser.add_argument("--checkpoints", type=Path, default=Path("data/checkpoints/pretrain"))
    args = parser.parse_args()
    check_writable(args.out, args.metrics, args.plots, args.checkpoints)
    params = load_params(args.params)
    keyed_on = stage_params(params, "pretrain")

    if distributed.relaunch(params.impl, "stages.pretrain"):
        return
    torch.manual_seed(params.seed)
    paths = LMPaths(args.tokenizer, args.tokens, args.out, args.metrics, args.plots, args.checkpoints)
    with tracking.stage_run("pretrain", params.tracking, params, keyed_on) as run:
        if not params.init:
            objective = build_objective(params.objective, params, load_tokenizer(args.tokenizer).get_vocab_size(),
                                        saved_special_ids(args.tokenizer))
            train_language_model("pretrain", params, params.pretrain, objective, paths, run, keyed_on)
            return
        objective, imported = objective_from_checkpoint(params, args.tokenizer)
        if params.pretrain.with_init == "keep":
            keep_checkpoint(params, objective, imported, paths, run)
        else:
            train_language_model("pretrain", params, params.pretrain, objective, paths, run, keyed_on)


if __name__ == "__main__":
    run_main(main)
