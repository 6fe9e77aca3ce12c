"""XLNet's permutation LM: the two streams' masks, the query stream's blindness to its own token, and a
task that only context from both sides solves."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from lib.config.errors import UserError
from lib.config.params import ParamsError, PLMConfig
from lib.data.windows import Windows
from lib.models.architectures.encoder import Encoder
from lib.objectives.plm import PermutationLM, two_stream_masks
from tests.helpers import TOY_SPECIAL, TOY_VOCAB, counting_batch, counting_rows, two_sided_rows
from tests.test_objectives import build, one_thread, tiny_params  # noqa: F401 (the fixture applies here too)


def plm(position: str = "rope", partial_k: int = 6, seed: int = 0) -> PermutationLM:
    model = dataclasses.replace(tiny_params().model, position=position)
    return build("plm", seed, model=model, plm=PLMConfig(partial_k=partial_k))


def test_masks_follow_the_order_as_built_by_hand():
    order = torch.tensor([[2, 0, 3, 1]])  # ranks: position 2 first, then 0, 3, 1
    content, query, targets = two_stream_masks(order, n_predict=2)
    assert targets.tolist() == [[3, 1]]
    assert content.int().tolist() == [[[1, 0, 1, 0],   # position 0 sees 2 and itself
                                       [1, 1, 1, 1],   # 1, last in the order, sees all
                                       [0, 0, 1, 0],   # 2, first, only itself
                                       [1, 0, 1, 1]]]  # 3 sees 2, 0 and itself
    assert query.int().tolist() == [[[1, 0, 1, 0],     # target 3 sees 2 and 0, never itself
                                     [1, 0, 1, 1]]]    # target 1 sees 2, 0 and 3


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_a_prediction_reads_what_precedes_it_in_the_order_and_never_its_own_token(position):
    objective = plm(position, partial_k=2).eval()
    inputs = len(TOY_SPECIAL) + torch.randint(0, TOY_VOCAB - len(TOY_SPECIAL), (1, 8), generator=torch.Generator().manual_seed(0))
    order = torch.tensor([[5, 2, 7, 0, 3, 6, 1, 4]])  # targets: the last 4 of the order, 3, 6, 1, 4
    with torch.no_grad():
        logits, targets = objective.predict(inputs, order)
    assert targets.tolist() == [[3, 6, 1, 4]]
    rank = order[0].argsort()
    for p, target in enumerate(targets[0].tolist()):
        for position_changed in range(8):
            changed = inputs.clone()
            first = len(TOY_SPECIAL)
            changed[0, position_changed] = first + (changed[0, position_changed] - first + 7) % (TOY_VOCAB - first)
            with torch.no_grad():
                moved = objective.predict(changed, order)[0][0, p]
            sees = rank[position_changed] < rank[target]
            assert torch.allclose(moved, logits[0, p], atol=1e-6) != bool(sees), (target, position_changed)


def test_finetuning_reads_an_ordinary_bidirectional_backbone():
    objective = plm()
    assert type(objective.backbone()) is Encoder
    assert {name for name, _ in objective.named_parameters() if not name.startswith("model.")} == {"query_start"}


def test_forward_contract():
    objective = plm(partial_k=4)
    loss, metrics = objective(counting_batch())
    assert set(metrics) == {"loss", "accuracy"} and metrics["loss"] == loss.detach()
    loss.backward()
    assert objective.query_start.grad.abs().sum() > 0


def test_the_query_stream_enters_the_blocks_at_the_content_streams_scale():
    """Both streams start from an embedding row taken through the embeddings' LayerNorm, not the query
    stream from w's raw 0.02 scale, 50 times below the normed token embeddings."""
    objective = plm().eval()
    model = objective.backbone()
    tokens = counting_rows()[0][:, :-1]
    content = model.project(model.embeddings(tokens))
    query = objective.query_inputs(*tokens.shape)
    rms = lambda x: x.pow(2).mean(-1).sqrt()
    assert query.shape == content.shape
    assert torch.allclose(rms(query), rms(content), rtol=0.05)


def test_learns_what_only_context_on_both_sides_tells():
    """After training, a token whose two neighbours come before it in the order is predicted almost
    always; the window's last token, with its left neighbour only, at chance (1/7) as a left-to-right
    LM would be everywhere."""
    torch.manual_seed(0)
    objective = plm(partial_k=2)
    optimizer = torch.optim.Adam(objective.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(600):
        rows = two_sided_rows(32, 9, g)
        loss, _ = objective(Windows(rows, torch.ones_like(rows, dtype=torch.bool)))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    rows = two_sided_rows(64, 8, g)
    shuffled = lambda positions: positions[torch.randperm(4, generator=g)]
    order = torch.stack([torch.cat([shuffled(torch.tensor([0, 2, 4, 6])), shuffled(torch.tensor([1, 3, 5, 7]))])
                         for _ in rows])  # the even positions first: the targets are the odd ones
    with torch.no_grad():
        logits, targets = objective.eval().predict(rows, order)
    correct = logits.argmax(-1) == rows.gather(1, targets)
    both_sides = targets < 7
    assert correct[both_sides].float().mean() > 0.9
    assert correct[~both_sides].float().mean() < 0.35


def test_absolute_positions_and_a_k_below_2_stop_at_start():
    with pytest.raises(UserError, match=r"^model.position: objective plm needs relative positions \(rope or alibi\), "
                                        "not learned"):
        plm("learned")
    with pytest.raises(ParamsError, match=r"^plm.partial_k: 1 must be >= 2"):
        PLMConfig(partial_k=1).validate("plm")


def test_flops_count_the_query_stream_at_the_predicted_share():
    T = 32
    objective, mlm = plm(partial_k=4), build("mlm")
    backbone = objective.backbone().flops_per_token(T, predicted=0.25)
    assert backbone < objective.flops_per_token(T) < backbone * 1.25 + 1
    assert objective.flops_per_token(T) > mlm.flops_per_token(T)
