"""How long a prediction made from no token of its own takes to start reading context: XLNet's query
stream (`plm`) against BERT's masked LM, with its 80/10/10 recipe and with every selected token [MASK].

    python bench/plm_plateau.py [--variants plm mlm mlm-all-mask] [--seeds 0 1 2 3] [--cap 600] [--lm-head linear]

The rows are tests/helpers.py's two_sided_rows at 128 tokens: token i is a pair of fresh draws (a_i,
a_(i-1)), so only its two neighbours tell it, and a model that reads no context stays near 1/49. The
objective runs at 2 layers x 32 with RoPE (plm with K = 6) and trains with Adam 3e-3 on fresh batches of
32 rows, with BERT's LM head (dense, GELU, LayerNorm, decoder: what every objective here builds) or
GPT-2's (`--lm-head linear`: the tied decoder alone). Printed, one line per variant and seed: the step at which the training accuracy first passes
0.3, or "> cap". The seed sets it, not the machine's speed.
docs/results/README.md ("Pretraining objectives at equal compute", `plm`) has the figures.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lib.config.params import CorpusConfig, Corpora, MLMConfig, ModelConfig, Params  # noqa: E402
from lib.data.windows import TaggedWindows  # noqa: E402
from lib.models.config import LM_HEADS  # noqa: E402
from lib.objectives import build_objective  # noqa: E402
from tests.helpers import TOY_SPECIAL, TOY_VOCAB, two_sided_rows  # noqa: E402

VARIANTS = {"plm": ("plm", MLMConfig()), "mlm": ("mlm", MLMConfig()),
            "mlm-all-mask": ("mlm", MLMConfig(mask_token=1.0, random_token=0.0))}
LENGTH = 128


def steps_to_context(variant: str, seed: int, cap: int, lm_head: str) -> int | None:
    """Training steps until the batch's accuracy passes 0.3; None if not within `cap`."""
    name, mlm = VARIANTS[variant]
    torch.manual_seed(seed)
    corpus = CorpusConfig(source="unused")
    model = ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, dropout=0.0, max_positions=LENGTH,
                        position="rope", lm_head=lm_head)
    params = Params(corpora=Corpora(pretrain=corpus, domain=corpus), tasks={}, model=model, mlm=mlm)
    objective = build_objective(name, params, TOY_VOCAB, TOY_SPECIAL)
    optimizer = torch.optim.Adam(objective.parameters(), lr=3e-3)
    rows = torch.Generator().manual_seed(seed)
    for step in range(1, cap + 1):
        tokens = two_sided_rows(32, LENGTH + 1, rows)
        loss, metrics = objective(TaggedWindows(tokens, torch.ones_like(tokens, dtype=torch.bool)))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if metrics["accuracy"] > 0.3:
            return step
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    parser.add_argument("--cap", type=int, default=600)
    parser.add_argument("--lm-head", choices=list(LM_HEADS), default="mlp")
    args = parser.parse_args()
    torch.set_num_threads(1)  # a model this small gains nothing from threads
    for variant in args.variants:
        for seed in args.seeds:
            steps = steps_to_context(variant, seed, args.cap, args.lm_head)
            print(f"{variant:13s} seed {seed}: {steps if steps else f'> {args.cap}'} steps", flush=True)


if __name__ == "__main__":
    main()
