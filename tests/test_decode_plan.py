"""Decode plans (``slmlab.generation.plan``): the inference-only step of Lumen and LFM2 must equal
the model's own decode through its cache, step by step (fp32, 1e-5), and ``generate`` must pick
the plan only where it applies."""

from __future__ import annotations

import pytest
import torch

from family_tester import ATOL, left_pad
from slmlab.generation import SamplingConfig, build_plan, compiled_step, generate
from slmlab.generation.plan import adjacent_pair_order, pair_rows, rope_multipliers, rotate_pairs
from slmlab.layers.rotary import RotaryEmbedding, apply_rotary
from slmlab.models.lfm2 import Lfm2SmallConfig, Lfm2SmallForCausalLM
from slmlab.models.lumen import LumenConfig, LumenForCausalLM

LUMEN = [
    dict(num_kv_heads=1, intermediate_dim=48),
    dict(num_kv_heads=2, intermediate_dim=48),
    dict(num_kv_heads=4, intermediate_dim=0),
]
LFM2 = [
    dict(layer_order=["conv", "attn", "conv", "attn"], conv_kernel_size=3, num_key_value_heads=2),
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
    model = make(**kw)
    ids = torch.randint(0, 97, (2, 20))
    with torch.inference_mode():
        cache = model(input_ids=ids[:, :7], use_cache=True).cache
        plan = build_plan(model, 20)
        plan.start(cache)
        # the model's own cache from here on is a second, independent copy of the prompt
        ref_cache = model(input_ids=ids[:, :7], use_cache=True).cache
        position = torch.tensor([7])
        for t in range(7, 20):
            got = plan.step(ids[:, t : t + 1], position)
            ref = model(input_ids=ids[:, t : t + 1], cache=ref_cache, use_cache=True).logits[:, -1]
            torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
            position += 1


@pytest.mark.parametrize("make, kw", MODELS)
def test_generate_through_the_plan_equals_generate_through_forward(make, kw):
    model = make(**kw)
    ids = torch.randint(0, 97, (3, 6))
    torch.testing.assert_close(generate(model, ids, 25), generate(model, ids, 25, use_plan=False), atol=0, rtol=0)
    sampling = SamplingConfig(temperature=0.9, top_k=20)
    a = generate(model, ids, 25, sampling, generator=torch.Generator().manual_seed(3))
    b = generate(model, ids, 25, sampling, generator=torch.Generator().manual_seed(3), use_plan=False)
    assert torch.equal(a, b)


def test_the_plan_is_built_per_call_so_it_sees_new_weights():
    model = lumen(num_kv_heads=2, intermediate_dim=48)
    ids = torch.randint(0, 97, (1, 5))
    generate(model, ids, 10)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert torch.equal(generate(model, ids, 10), generate(model, ids, 10, use_plan=False))


def test_generate_falls_back_where_the_plan_does_not_apply():
    model = lumen(num_kv_heads=2, intermediate_dim=48)
    assert build_plan(model, 65) is None  # beyond max_seq_len=64: the model's own length error applies
    with pytest.raises(ValueError, match="max_seq_len"):
        generate(model, torch.randint(0, 97, (1, 60)), 10)
    ids, mask = left_pad([torch.randint(0, 97, (5,)), torch.randint(0, 97, (8,))])
    with torch.inference_mode():
        ref = generate(model, ids, 6, attention_mask=mask, use_plan=False)
    assert torch.equal(generate(model, ids, 6, attention_mask=mask), ref)  # padded: forward path


def test_half_precision_models_decode_through_forward():
    model = lumen(num_kv_heads=2, intermediate_dim=48).to(torch.bfloat16)
    assert build_plan(model, 16) is None
    assert generate(model, torch.randint(0, 97, (1, 5)), 4).shape == (1, 9)


def test_a_prompt_that_fills_the_plan_is_refused():
    model = lumen(num_kv_heads=1, intermediate_dim=48)
    with torch.inference_mode():
        cache = model(input_ids=torch.randint(0, 97, (1, 8)), use_cache=True).cache
    with pytest.raises(ValueError, match="fills all 8 positions"):
        build_plan(model, 8).start(cache)


@pytest.mark.slow  # torch.compile: ~10-20 s per model on a CPU
@pytest.mark.parametrize("make, kw", [MODELS[0], MODELS[3]])
def test_compiled_plan_steps_equal_eager_steps(make, kw):
    """Compiled, RoPE runs in real arithmetic (``rotate_pairs``); the logits must still agree."""
    model = make(**kw)
    ids = torch.randint(0, 97, (1, 18))
    with torch.inference_mode():
        cache = model(input_ids=ids[:, :6], use_cache=True).cache
        eager, compiled = build_plan(model, 18), build_plan(model, 18)
        eager.start(cache)
        compiled.start(model(input_ids=ids[:, :6], use_cache=True).cache)
        step_fn, position = compiled_step(compiled), torch.tensor([6])
        for t in range(6, 18):
            torch.testing.assert_close(
                compiled.step(ids[:, t : t + 1], position, step_fn), eager.step(ids[:, t : t + 1], position), atol=ATOL, rtol=0
            )
            position += 1
    assert torch.equal(generate(model, ids[:, :6], 12, compile=True), generate(model, ids[:, :6], 12, use_plan=False))
