"""Stage `pretrain`: train the transformer with the chosen objective on the packed pretraining tokens.

Writes the pretrained model (`model.safetensors` + `config.json` + the tokenizer files, and for
ELECTRA `objective.safetensors` with the generator) to --out, final metrics to the metrics JSON and
the training/validation curves as plot CSVs. Checkpoints go to --checkpoints while it runs: killed
and started again, it resumes from the last one.

With `init` set the model is the published model's (lib/models/hf.py), trained with the objective that fits it;
`pretrain.with_init: keep` writes it out unchanged (no curves), `continue` pretrains it further.
"""

import torch

from lib.core.errors import run_main
from lib.core.stage import open_stage
from lib.data.tokenizer import load_tokenizer, saved_special_ids
from lib.objectives import build_objective, check_objective
from lib.training.lm import LMPaths, keep_published_model, objective_from_init, train_language_model
from lib.training.optim import check_optimizers


def main() -> None:
    stage = open_stage("pretrain", __doc__,
                       inputs={"tokenizer": "data/tokens/tokenizer", "tokens": "data/tokens/pretrain",
                               "parallel": "data/tokens/parallel"},
                       outputs={"out": "models/pretrain", "metrics": "metrics/pretrain.json",
                                "plots": "plots/pretrain", "checkpoints": "data/checkpoints/pretrain"},
                       checks=[check_objective, check_optimizers])
    args, params = stage.args, stage.params

    if stage.relaunch():
        return
    torch.manual_seed(params.seed)
    paths = LMPaths(args.tokenizer, args.tokens, args.parallel, args.out, args.metrics, args.plots, args.checkpoints)
    with stage.run() as run:
        if not params.init:
            objective = build_objective(params.objective, params, load_tokenizer(args.tokenizer).get_vocab_size(),
                                        saved_special_ids(args.tokenizer))
            train_language_model("pretrain", params, params.pretrain, objective, paths, run, stage.keyed_on)
            return
        objective, imported = objective_from_init(params, args.tokenizer)
        if params.pretrain.with_init == "keep":
            keep_published_model(params, objective, imported, paths, run)
        else:
            train_language_model("pretrain", params, params.pretrain, objective, paths, run, stage.keyed_on)


if __name__ == "__main__":
    run_main(main)
