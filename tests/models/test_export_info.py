"""Helpers of :mod:`slmlab.models.export_info` that families' ``convert.py`` share."""

from __future__ import annotations

import torch
from torch import nn

from slmlab.models.export_info import same_names_twin


class _Twin(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)


def test_same_names_twin_holds_the_models_weights_in_eval_mode():
    model = _Twin(3)
    twin, reason = same_names_twin(_Twin, 3, model)
    assert reason is None and isinstance(twin, _Twin) and not twin.training
    assert all(torch.equal(twin.state_dict()[k], v) for k, v in model.state_dict().items())
