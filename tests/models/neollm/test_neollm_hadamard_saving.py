"""The seed's claim on the Hadamard output projection's parameter saving, by the audit's own counts
(issue 33.4; verdict in docs/results/seed-claims.md)."""

from __future__ import annotations

import pytest
import torch

import slmlab  # noqa: F401  (registers the families)
from slmlab.models import get_family


def audit(**overrides) -> dict[str, int]:
    family = get_family("neollm")
    with torch.device("meta"):  # counts only: no memory, no init
        model = family.model_class(family.make_config(**overrides))
    return family.parameter_audit(model)


def test_the_hadamard_saving_is_18_6_percent_of_the_attention_projections_not_25():
    dense, hadamard = audit(use_hadamard_o_proj=False), audit()
    saved = dense["Total"] - hadamard["Total"]
    assert saved == dense["attention: o_proj"] == 3_145_728  # the dense o_proj goes; its multipliers become alpha, beta
    assert hadamard["attention: Hadamard o_proj (alpha, beta)"] == dense["attention: o_proj multipliers"]
    projections = sum(dense[f"attention: {k}"] for k in ("FAN_attn", "q_proj", "k_proj", "v_proj", "o_proj"))
    assert saved / projections == pytest.approx(0.186, abs=5e-4)  # the seed's notes suggest ~25%
    assert saved / dense["Attention total"] == pytest.approx(0.180, abs=5e-4)
    assert saved / dense["Without W_E and lm_head"] == pytest.approx(0.0625, abs=5e-5)
