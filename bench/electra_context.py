"""How long ELECTRA's discriminator takes to read context, per position encoding.

    python bench/electra_context.py [--positions learned rope alibi sinusoidal] [--seeds 0 1 2] [--cap 3000]

The rows count up by 1-3 over ids 5..59 from a random start, with an eos at position 13 (tests/helpers.py's
counting_rows). The objective is the electra objective at 2 layers x 32. Its generator's samples are replaced
by ids drawn uniformly from 5..59, the rows' own token distribution: a token's identity then says nothing,
and only its neighbours tell a replaced one (it breaks the count). It trains with Adam 3e-3 on fresh batches
of 32 rows x 32 tokens.

Printed, one line per position encoding and seed: the step at which the mean training `disc_auc` of the
last 50 steps passes 0.8, or "> cap". The seed sets it, not the machine's speed.
docs/results/README.md ("ELECTRA's discriminator on the CPU") has the figures and what they mean.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lib.config.params import CorpusConfig, Corpora, ModelConfig, Params  # noqa: E402
from lib.objectives import build_objective  # noqa: E402
from lib.objectives import electra  # noqa: E402
from tests.helpers import TOY_SPECIAL, TOY_VOCAB, counting_batch  # noqa: E402

FIRST_ID = len(TOY_SPECIAL)


def uniform_sample(logits: torch.Tensor) -> torch.Tensor:
    """Stands in for the generator's samples: ids 5..59, uniformly."""
    return torch.randint(FIRST_ID, TOY_VOCAB, (len(logits),), device=logits.device)


def steps_to_context(position: str, seed: int, cap: int) -> int | None:
    """Training steps until the mean disc_auc of the last 50 passes 0.8; None if not within `cap`."""
    torch.manual_seed(seed)
    corpus = CorpusConfig(source="unused")
    model = ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, dropout=0.0, max_positions=64, position=position)
    params = Params(corpora=Corpora(pretrain=corpus, domain=corpus), tasks={}, model=model)
    objective = build_objective("electra", params, TOY_VOCAB, TOY_SPECIAL)
    optimizer = torch.optim.Adam(objective.parameters(), lr=3e-3)
    recent: list[float] = []
    for step in range(1, cap + 1):
        loss, metrics = objective(counting_batch(32, 33, seed=step))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        recent = (recent + [float(metrics["disc_auc"])])[-50:]
        if step >= 50 and sum(recent) / 50 > 0.8:
            return step
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--positions", nargs="+", default=["learned", "rope", "alibi", "sinusoidal"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--cap", type=int, default=3000)
    args = parser.parse_args()
    torch.set_num_threads(1)  # a model this small gains nothing from threads
    electra.sample = uniform_sample  # the one change to the objective: identity-free replacements
    for position in args.positions:
        for seed in args.seeds:
            steps = steps_to_context(position, seed, args.cap)
            print(f"{position:12s} seed {seed}: {steps if steps else f'> {args.cap}'} steps", flush=True)


if __name__ == "__main__":
    main()
