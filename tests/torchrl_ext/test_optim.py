"""V3's LaProp/AGC optimiser with a found_inf input (torchrl_ext.optim)."""

import pytest
import torch
from torchrl.trainers.algorithms import DreamerV3Optimizer

from torchrl_ext.optim import SkippableDreamerV3Optimizer

SHAPES = [(5, 3), (7,), (4, 4, 2)]
SETTINGS = dict(lr=1e-2, agc=0.3, eps=1e-20, warmup_steps=4)


def _twins(seed: int = 0):
    torch.manual_seed(seed)
    ours = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    upstream = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    return ours, upstream


def _set_grads(params, grads):
    for p, g in zip(params, grads):
        p.grad = g.clone()


@pytest.mark.parametrize("found_inf", [None, 0.0], ids=["no_flag", "flag_zero"])
def test_finite_steps_match_upstream(found_inf):
    ours, upstream = _twins()
    mine, theirs = SkippableDreamerV3Optimizer(ours, **SETTINGS), DreamerV3Optimizer(upstream, **SETTINGS)
    for _ in range(12):  # through the lr warm-up and past it
        grads = [torch.randn(s) * 3 for s in SHAPES]
        _set_grads(ours, grads), _set_grads(upstream, grads)
        mine.found_inf = None if found_inf is None else torch.tensor(found_inf)
        mine.step(), theirs.step()
    for p, q in zip(ours, upstream):
        torch.testing.assert_close(p, q)
        torch.testing.assert_close(mine.state[p]["rms"], theirs.state[q]["rms"])
        torch.testing.assert_close(mine.state[p]["momentum"], theirs.state[q]["momentum"])
    assert int(mine.param_groups[0]["step"]) == theirs.param_groups[0]["step"] == 12


def test_a_flagged_step_changes_nothing_and_the_next_steps_continue_as_if_it_never_came():
    ours, upstream = _twins()
    mine, theirs = SkippableDreamerV3Optimizer(ours, **SETTINGS), DreamerV3Optimizer(upstream, **SETTINGS)
    for step in range(8):
        grads = [torch.randn(s) for s in SHAPES]
        if step in (0, 5):  # a skipped first step (no moments yet) and a later one
            before = [p.detach().clone() for p in ours] + [t.clone() for s in mine.state.values() for t in s.values()]
            _set_grads(ours, [torch.full(s, float("nan")) for s in SHAPES])
            mine.found_inf = torch.tensor(1.0)
            mine.step()
            after = [p.detach() for p in ours] + [t for s in mine.state.values() for t in s.values()]
            assert all(torch.equal(a, b) for a, b in zip(after, before))
            assert all(torch.isfinite(t).all() for t in after)
        _set_grads(ours, grads), _set_grads(upstream, grads)
        mine.found_inf = torch.tensor(0.0)
        mine.step(), theirs.step()
    for p, q in zip(ours, upstream):
        torch.testing.assert_close(p, q)
    assert int(mine.param_groups[0]["step"]) == theirs.param_groups[0]["step"] == 8  # skips not counted


def test_state_dict_round_trip_and_upstream_checkpoints_load():
    ours, upstream = _twins()
    theirs = DreamerV3Optimizer(upstream, **SETTINGS)
    _set_grads(upstream, [torch.ones(s) for s in SHAPES])
    theirs.step()
    mine = SkippableDreamerV3Optimizer(ours, **SETTINGS)
    mine.load_state_dict(theirs.state_dict())  # an upstream checkpoint: a host int step count
    step = mine.param_groups[0]["step"]
    assert torch.is_tensor(step) and int(step) == 1
    again = SkippableDreamerV3Optimizer([torch.nn.Parameter(p.detach().clone()) for p in ours], **SETTINGS)
    again.load_state_dict(mine.state_dict())
    assert int(again.param_groups[0]["step"]) == 1
    assert again.param_groups[0]["step"] is not step  # its own counter, not an alias


def test_a_step_with_no_gradients_is_an_error_as_upstream():
    mine = SkippableDreamerV3Optimizer([torch.nn.Parameter(torch.ones(2))], **SETTINGS)
    with pytest.raises(RuntimeError, match="no parameter gradients"):
        mine.step()


def test_a_masked_step_leaves_no_flag_for_the_next_plain_step():
    """masked_step reads its flag from the argument: a skipped masked step must not make
    a later step() (found_inf left None) skip too, and nothing is written on the optimiser
    (a traced update must not mutate it)."""
    ours, upstream = _twins()
    mine, theirs = SkippableDreamerV3Optimizer(ours, **SETTINGS), DreamerV3Optimizer(upstream, **SETTINGS)
    _set_grads(ours, [torch.full(s, float("nan")) for s in SHAPES])
    mine.masked_step(torch.tensor(1.0))
    assert mine.found_inf is None
    grads = [torch.randn(s) for s in SHAPES]
    _set_grads(ours, grads), _set_grads(upstream, grads)
    mine.step(), theirs.step()
    for p, q in zip(ours, upstream):
        torch.testing.assert_close(p, q)
