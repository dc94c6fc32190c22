"""torchrl_ext/held_out.py: a held-out view computes with its original's current weights,
passes gradients to its inputs only, and says when it no longer shares their memory."""

from __future__ import annotations

import torch
from torch import nn
from torchrl.objectives.utils import hold_out_net

from torchrl_ext import held_out_view, shares_weights, stale_held_out_views


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.SiLU(), nn.Linear(8, 2))  # a buffer too


def test_a_view_computes_with_the_current_weights_and_differentiates_only_its_input():
    net = _net().eval()
    view = held_out_view(net)
    x = torch.randn(5, 3, requires_grad=True)
    torch.testing.assert_close(view(x), net(x), rtol=0, atol=0)
    view(x).square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert all(p.grad is None for p in net.parameters()) and not any(p.requires_grad for p in view.parameters())

    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    net(x).sum().backward()
    opt.step()  # in place: the view reads the new weights
    torch.testing.assert_close(view(x), net(x), rtol=0, atol=0)
    net.load_state_dict(_net().state_dict())  # also in place
    torch.testing.assert_close(view(x), _net().eval()(x), rtol=0, atol=0)
    assert shares_weights(view, net) and stale_held_out_views(nn.ModuleDict({"v": view})) == []


def test_hold_out_net_leaves_a_view_held_out():
    """Upstream's losses wrap what they hold out in hold_out_net, which hands gradients
    back to the weights on exit (``requires_grad_()``) when they had them on entry."""
    view = held_out_view(_net())
    with hold_out_net(view):
        pass
    assert not any(t.requires_grad for t in view.parameters())


def test_a_view_whose_original_got_new_memory_is_reported_by_name():
    net = _net()
    holder = nn.ModuleDict({"imagination": nn.Sequential(held_out_view(net))})
    net.double()  # new tensors for the original; the view still holds the old ones
    assert not shares_weights(holder["imagination"][0], net)
    assert stale_held_out_views(holder) == ["ModuleDict.imagination.0"]
