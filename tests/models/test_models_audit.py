"""The parameter audit (``slmlab.models.audit``) and ``Family.parameter_audit``."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from slmlab.models import get_family
from slmlab.models.audit import count_unique_parameters, format_audit, module_breakdown


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)                 # 40
        self.body = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2, bias=False))  # 15 + 6
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight             # tied: counted once


def test_module_breakdown_counts_tied_tensors_once():
    rows = module_breakdown(Tied())
    assert rows == {"embed.weight": 40, "body.0": 15, "body.1": 6, "Total": 61}
    assert count_unique_parameters(Tied()) == 61


def test_family_audit_falls_back_to_the_module_breakdown():
    lumen = get_family("lumen")
    config = lumen.make_config(None, num_layers=1)
    with torch.device("meta"):
        model = lumen.model_class(config)
    own = lumen.parameter_audit(model)
    assert own == lumen.audit(model) and own["Total"] == count_unique_parameters(model)
    plain = dataclasses.replace(lumen, audit=None).parameter_audit(model)
    assert plain == module_breakdown(model) and plain["Total"] == own["Total"]


def test_format_audit_table():
    text = format_audit({"a": 1, "Total": 1234}, "T")
    assert text.splitlines() == ["T", "-" * 21, "  a" + " " * 17 + "1", "  Total" + " " * 9 + "1,234"]
