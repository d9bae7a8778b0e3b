"""NeoLLM under gradient checkpointing: every residual flow (the layer passes a ResidualState, which
the non-reentrant checkpoint differentiates through) gives the plain backward's gradients (1e-6), and
the reentrant checkpoint is refused with what to do instead."""

from __future__ import annotations

import pytest
import torch

from slmlab.models.neollm import PRESETS, NeoLLMConfig, NeoLLMForCausalLM

FLOWS = {
    "siamesenorm": {},
    "prenorm": {"use_siamesenorm": False},
    "laurel": {"use_siamesenorm": False, "use_laurel": True, "use_laurel_rw": True, "use_laurel_lr": True},
    "attn_res": {"use_siamesenorm": False, "use_attn_res": True, "attn_res_num_blocks": 2},
    "stack_memory": {"use_siamesenorm": False, "use_stack_memory": True},
}


def model_with(**overrides) -> NeoLLMForCausalLM:
    torch.manual_seed(0)
    config = NeoLLMConfig(**{**PRESETS["neollm-tiny"], "use_spelling_bee_embeddings": False, **overrides})
    return NeoLLMForCausalLM(config).train()


@pytest.mark.parametrize("flow", sorted(FLOWS))
def test_checkpointed_gradients_equal_the_plain_backward(flow):
    model = model_with(**FLOWS[flow])
    ids = torch.randint(1, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))
    grads = []
    for checkpointed in (False, True):
        if checkpointed:
            model.activation_checkpointing_enable()
        model.zero_grad()
        torch.manual_seed(1)  # dropout: the same masks in both runs
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=0, msg=name)


def test_the_reentrant_checkpoint_is_refused():
    model = model_with()
    with pytest.raises(ValueError, match="use_reentrant=False only"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    assert not model.is_activation_checkpointing


def test_affine_running_mean_updates_once_under_checkpointing():
    """Affine-scaled attention's ``alpha_ma`` EMA: the checkpointed layer runs again in backward, but
    the recomputation reuses the entry value and does not step the EMA a second time, so one training
    step gives the plain step's gradients and buffers (1e-5)."""
    import copy

    base = model_with(use_affine_scaled_attention=True)
    with torch.no_grad():  # alpha != 1 and alpha_ma != 1, so both the update and β matter
        for i, layer in enumerate(base.model.layers):
            layer.self_attn.affine.proj.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(10 + i))
            layer.self_attn.affine.alpha_ma.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(20 + i))
    ids = torch.randint(1, base.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))
    runs = []
    for checkpointed in (False, True):
        model = copy.deepcopy(base)
        if checkpointed:
            model.activation_checkpointing_enable()
        torch.manual_seed(1)
        model(input_ids=ids, labels=ids).loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        runs.append((grads, {n: b.clone() for n, b in model.named_buffers() if n.endswith("alpha_ma")}))
    (g0, b0), (g1, b1) = runs
    assert b0 and g0.keys() == g1.keys() and b0.keys() == b1.keys()
    for name, buf in b0.items():
        assert not torch.equal(buf, base.get_buffer(name)), name  # the step did update the EMA
        torch.testing.assert_close(b1[name], buf, atol=1e-5, rtol=0, msg=name)
    for name, grad in g0.items():
        torch.testing.assert_close(g1[name], grad, atol=1e-5, rtol=0, msg=name)
