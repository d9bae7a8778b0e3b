"""Decode plans (``slmlab.generation.plan``): the engine's pieces, the layouts of Lumen and LFM2 that
their family test classes do not cover, and the frozen weight classes.

The generic plan tests (steps equal the model's own decode at 1e-5, generate through the plan equals
generate through forward, fallbacks, compiled steps) live in ``family_tester.py`` and run for every
family test class that sets ``has_decode_plan``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from family_tester import ATOL, check_generate_paths_agree, check_plan_steps
from slmlab.generation import StackWeights, build_plan
from slmlab.generation.plan import adjacent_pair_order, pair_rows, rope_multipliers, rotate_pairs
from slmlab.layers.rotary import RotaryEmbedding, apply_rotary
from slmlab.models.lfm2 import Lfm2SmallConfig, Lfm2SmallForCausalLM
from slmlab.models.lfm2.decode import Lfm2AttentionWeights, Lfm2ConvWeights, Lfm2LayerWeights
from slmlab.models.lumen import LumenConfig, LumenForCausalLM
from slmlab.models.lumen.decode import LumenLayerWeights

# layouts beyond those of TestLumenFamily / TestLumenAttentionOnly (GQA 4:2) and TestLfm2Family
# (conv, attn, conv, attn; kernel 3; GQA 4:2): MQA, plain MHA, attention first, conv biases
LUMEN = [
    dict(num_kv_heads=1, intermediate_dim=48),
    dict(num_kv_heads=4, intermediate_dim=0),
]
LFM2 = [
    dict(layer_order=["attn", "conv", "conv"], conv_kernel_size=4, num_key_value_heads=1, conv_bias=True),
    dict(layer_order=["conv", "conv", "attn"], conv_kernel_size=3, num_key_value_heads=4),
]


def lumen(**kw):
    base = dict(vocab_size=97, hidden_dim=32, num_layers=2, num_heads=4, max_seq_len=64)
    return LumenForCausalLM(LumenConfig(**{**base, **kw})).eval()


def lfm2(**kw):
    base = dict(vocab_size=97, hidden_size=32, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    return Lfm2SmallForCausalLM(Lfm2SmallConfig(**{**base, "num_layers": len(kw["layer_order"]), **kw})).eval()


MODELS = [pytest.param(lumen, kw, id=f"lumen-{i}") for i, kw in enumerate(LUMEN)] + [
    pytest.param(lfm2, kw, id=f"lfm2-{i}") for i, kw in enumerate(LFM2)
]


def test_paired_rows_and_complex_rope_equal_rotate_half_rope():
    heads, head_dim, positions = 3, 8, torch.tensor([[0, 5, 17]])
    weight, x = torch.randn(heads * head_dim, 6), torch.randn(1, 3, 6)
    cos, sin = RotaryEmbedding(head_dim, 500.0)(positions)
    ref = apply_rotary((x @ weight.t()).view(1, 3, heads, head_dim).transpose(1, 2), cos, sin)  # [1, H, T, D]
    turn = rope_multipliers(32, head_dim, 500.0, heads, x.device)[positions[0]]
    got = rotate_pairs(x @ pair_rows(weight, heads, head_dim).t(), turn).view(1, 3, heads, head_dim).transpose(1, 2)
    torch.testing.assert_close(got, ref[..., adjacent_pair_order(head_dim)], atol=ATOL, rtol=0)


@pytest.mark.parametrize("make, kw", MODELS)
def test_plan_steps_equal_the_models_decode(make, kw):
    check_plan_steps(make(**kw), torch.randint(0, 97, (2, 20)), prefill=7)


@pytest.mark.parametrize("make, kw", MODELS)
def test_generate_through_the_plan_equals_generate_through_forward(make, kw):
    check_generate_paths_agree(make(**kw), torch.randint(0, 97, (3, 6)), 25)


def weight_classes(plan) -> list:
    """Every weight dataclass instance a plan's step reads: the stack, each layer, their parts."""
    found, todo = [], [plan.weights]
    while todo:
        obj = todo.pop()
        found.append(obj)
        todo += [v for v in (getattr(obj, f.name) for f in dataclasses.fields(obj)) if dataclasses.is_dataclass(v)]
        todo += [v for v in getattr(obj, "layers", ()) if dataclasses.is_dataclass(v)]
    return found


@pytest.mark.parametrize(
    "make, kw, classes",
    [
        (lumen, LUMEN[0], {StackWeights, LumenLayerWeights}),
        (lfm2, LFM2[0], {StackWeights, Lfm2LayerWeights, Lfm2AttentionWeights, Lfm2ConvWeights}),
    ],
)
def test_plan_weights_are_frozen_and_a_wrong_field_name_raises(make, kw, classes):
    """A dict silently skipped a sublayer whose key was misspelt (``if "gate_up" in layer``); the
    frozen weight classes refuse a wrong name when built, read or written."""
    objects = weight_classes(build_plan(make(**kw), 16))
    assert classes <= {type(o) for o in objects}
    for obj in objects:
        name = dataclasses.fields(obj)[0].name
        with pytest.raises(TypeError, match="unexpected keyword"):
            dataclasses.replace(obj, **{name + "_typo": getattr(obj, name)})
        with pytest.raises(AttributeError):
            getattr(obj, name + "_typo")
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, getattr(obj, name))
    with pytest.raises(TypeError, match="conv_bais"):
        Lfm2ConvWeights(in_proj=torch.zeros(2, 6), conv=torch.zeros(2, 3), out_proj=torch.zeros(2, 2), conv_bais=torch.zeros(2))
