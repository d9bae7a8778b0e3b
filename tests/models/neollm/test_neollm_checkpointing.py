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
