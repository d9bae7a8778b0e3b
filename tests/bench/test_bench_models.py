"""Bench model table: parameter counts of the spec's table, the control models, cache sizes."""

from __future__ import annotations

import pytest
import torch

from slmlab.bench.controls import ControlConfig, ControlForCausalLM
from slmlab.bench.models import MODELS, build_model, count_parameters, make_config, resolve_entry, state_floats


@pytest.mark.parametrize("model_id", sorted(MODELS))
def test_parameter_counts_on_the_meta_device_equal_the_table(model_id):
    entry = MODELS[model_id]
    with torch.device("meta"):
        model = build_model(model_id, entry.reference["vocab_size"], entry.reference["T"])
    assert count_parameters(model) == entry.params


CONTROLS = [
    dict(d_model=32, n_layers=2, n_heads=2, positions="learned", max_len=24),
    dict(d_model=32, n_layers=2, n_heads=2, positions="rope", mlp_ratio=4, max_len=0),
    dict(d_model=32, n_layers=2, mixer="shortconv", positions="none", max_len=0),
    dict(d_model=32, n_layers=2, mixer="longconv", positions="none", max_len=24),
]


@pytest.mark.parametrize("kwargs", CONTROLS, ids=lambda k: f"{k.get('mixer', 'attention')}-{k['positions']}")
def test_control_models_are_causal_train_and_refuse_to_generate(kwargs, tmp_path):
    torch.manual_seed(0)
    model = ControlForCausalLM(ControlConfig(vocab_size=50, **kwargs))
    ids = torch.randint(0, 50, (2, 24))
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    changed = ids.clone()
    changed[:, 15] = (ids[:, 15] + 1) % 50
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, model(input_ids=changed).logits
    assert (a[:, :15] - b[:, :15]).abs().max() < 1e-5 and (a[:, 15:] - b[:, 15:]).abs().max() > 1e-4
    with pytest.raises(TypeError, match="cannot generate"):
        model.generate(ids)
    model.save_pretrained(tmp_path)
    loaded = ControlForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model.eval()(input_ids=ids).logits, atol=1e-5, rtol=0)


def test_state_floats_of_controls_and_families():
    attn = build_model("attn2-z", 1024, 64)
    assert state_floats(attn, 64) == 2 * 2 * 64 * 64  # K and V, 2 layers
    assert state_floats(build_model("shortconv4", 1024, 64), 64) == 4 * 2 * 64
    lumen = build_model("lumen", 64, 32, dict(hidden_dim=32, num_layers=2, num_heads=2, num_kv_heads=1,
                                             intermediate_dim=32, max_seq_len=32))
    assert state_floats(lumen, 32) == 2 * 2 * 1 * 16 * 32  # layers x K,V x kv heads x head dim x T
    # the spec's inference-memory column: PGSM 4*16*64 conv + 2*128*T retriever K/V (+1: the retrieval flag);
    # the conv-only control 3*16*64; LFM2 hybrid 2*2*96*T KV + 2*2*192 conv
    assert state_floats(build_model("pgsm-cpu", 256, 128), 128) == 4 * 16 * 64 + 2 * 128 * 128 + 1
    assert state_floats(build_model("pgsm-cpu-noret", 256, 128), 128) == 3 * 16 * 64
    assert state_floats(build_model("lfm2-hyb", 256, 128), 128) == 2 * 2 * 96 * 128 + 2 * 2 * 192


def test_model_cache_size_agrees_with_nanohammer_cache_nbytes():
    from slmlab.models.nanohammer import NanoHammerConfig, NanoHammerForCausalLM, cache_nbytes

    cfg = NanoHammerConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, num_state_heads=3, state_hidden_size=12, max_position_embeddings=96)
    model = NanoHammerForCausalLM(cfg).eval()
    cache = model(input_ids=torch.randint(1, 61, (2, 20)), use_cache=True).cache
    assert cache.nbytes() == cache_nbytes(cache)["filled"] and cache.state_floats() * 4 == cache.nbytes()


@pytest.mark.parametrize(
    "model_id, vocab, T, match",
    [
        ("nope", 16, 16, "unknown model 'nope'; known: attn2-z"),
        ("pgsm-cpu", 256, 256, "pgsm-cpu accepts block_size=128 tokens < the task's T=256"),
        ("attn4-llama", 256, 2048, "attn4-llama accepts .*=1024 tokens < the task's T=2048"),
    ],
)
def test_model_task_mismatch_is_refused_naming_both(model_id, vocab, T, match):
    with pytest.raises(ValueError, match=match):
        make_config(model_id, vocab, T)


def test_registered_families_are_accepted_at_their_presets():
    assert resolve_entry("lumen").family == "lumen"
    with pytest.raises(ValueError, match="mixer must be one of"):
        ControlConfig(mixer="ssm")
