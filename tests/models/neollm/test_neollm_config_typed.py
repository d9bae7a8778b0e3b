"""NeoLLMConfig as a typed (transformers 5 dataclass) config: its fields, and the config.json it writes
and reads, value by value, as the seed-signature class wrote it (the expected dicts are built here)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import transformers
from transformers import AutoConfig, PretrainedConfig

import slmlab  # noqa: F401  (registers the families)
from slmlab.models.neollm.configuration_neollm import INIT_ONLY_KEYWORDS, NeoLLMConfig

# Every field's default as config.json holds it (derived ones resolved), in the groups of the class.
FIELDS = dict(
    # core sizes
    vocab_size=64402, hidden_size=512, intermediate_size=1536, num_hidden_layers=12, num_attention_heads=8,
    num_key_value_heads=4, head_dim=64, hidden_act="xielu", max_position_embeddings=32768, initializer_range=0.02,
    rms_norm_eps=1e-6, tie_word_embeddings=False, use_cache=True,
    # rotary positions
    rope_theta=10000.0, partial_rotary_factor=0.25,
    # attention
    attention_bias=False, attention_dropout=0.1, use_momentum_attention=True, momentum_gamma=0.1,
    use_mea_attention=False, mea_component_key_value_heads=4, mea_groupnorm_eps=1e-6, use_lucid_attention=False,
    lucid_attention_eps=1e-6, use_affine_scaled_attention=False, affine_momentum=0.9, use_xsa=True, xsa_eps=1e-6,
    use_directional_routing=False, directional_routing_k=4, directional_routing_temp=3.0, use_hadamard_o_proj=True,
    # residual flow
    use_attn_res=False, attn_res_num_blocks=4, use_stack_memory=False, stack_d_model=32, num_mem_heads=4,
    stack_slots=16, stack_memory_cache_size=2048, use_laurel=False, use_laurel_rw=False, use_laurel_lr=False,
    laurel_lr_rank=32,
    # MLP, FANformer, dropout
    use_fan_residual=False, fan_ratio=0.125, fan_ratio_ffn=0.0625, dropout_rate=0.1, polynorm_exclusive=False,
    # multipliers, norms
    use_learnable_multipliers=True, use_embedding_multipliers=False, use_lns=False, use_gpas=False,
    use_siamesenorm=True, siamese_normalized_input=True, siamese_depth_scaling=True, siamese_attn_x_scale_init=1.0,
    use_embedding_input_norm=True,
    # embeddings, generator, JTok-M
    use_spelling_bee_embeddings=True, use_token_generator=False, generator_d_seed=128, generator_num_modes=8,
    generator_num_knots=32, generator_spline_degree=2, generator_k=3, generator_krank=64, use_jtokm=False,
    jtokm_num_experts=4, jtokm_top_k=2, jtokm_num_modes=4, jtokm_aux_loss_weight=1e-4, jtokm_norm_eps=1e-6,
    # REPO
    use_repo=True, repo_start_layer=4, repo_d_p=64, use_repo_grape=True, use_repo_goat_prior=False,
    repo_goat_num_frequencies=3, repo_goat_sink_decay=4.0,
    # IHA
    use_iha=True, iha_num_pseudo_heads=2, iha_local_global_pattern="LLLLG", iha_sliding_window=None,
    iha_global_layers_use_iha=False,
)
# Field defaults before resolution (None -> derived in __post_init__).
UNRESOLVED = dict(mea_component_key_value_heads=None, repo_start_layer=None, repo_d_p=None)


def expected_json(**changes) -> dict:
    """The config.json the seed-signature class wrote: every field, the token ids, `rope_parameters`."""
    out = {**FIELDS, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    out.update(model_type="neollm", transformers_version=transformers.__version__)
    out.update(changes)
    # without a scaling: plain RoPE from the fields (transformers 5's default `rope_parameters`)
    out.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": out["rope_theta"],
                                       "partial_rotary_factor": out["partial_rotary_factor"]})
    return out


def saved(cfg: NeoLLMConfig, folder) -> dict:
    cfg.save_pretrained(folder)
    return json.loads((folder / "config.json").read_text())


def attributes(cfg: NeoLLMConfig) -> dict:
    """``vars(cfg)`` less what loading a file records about the file (its path, model type, version)."""
    return {k: v for k, v in vars(cfg).items() if k not in ("_name_or_path", "model_type", "transformers_version")}


def own_fields() -> dict:
    inherited = {f.name for f in dataclasses.fields(PretrainedConfig)}
    return {f.name: f.default for f in dataclasses.fields(NeoLLMConfig) if f.name not in inherited}


def test_fields_are_typed_class_attributes_with_the_seed_defaults():
    fields = own_fields()
    assert len(fields) == 83 and fields == {**FIELDS, **UNRESOLVED}
    assert all(f.type for f in dataclasses.fields(NeoLLMConfig))
    assert all(vars(NeoLLMConfig)[name] == default for name, default in fields.items())
    # `rope_scaling` is an init-only keyword: the class keeps transformers' alias property of `rope_parameters`.
    assert set(INIT_ONLY_KEYWORDS) == {"rope_scaling"} and "rope_scaling" not in fields
    assert isinstance(vars(PretrainedConfig)["rope_scaling"], property) and "rope_scaling" not in vars(NeoLLMConfig)


CASES = {
    "default": ({}, {}),
    "tiny": (
        dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, iha_sliding_window=4),
        dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, iha_sliding_window=4,
             repo_start_layer=1, repo_d_p=8, mea_component_key_value_heads=2),
    ),
    "rope_scaling": (
        dict(hidden_size=256, iha_sliding_window=8, rope_scaling={"rope_type": "linear", "factor": 2.0}),
        dict(hidden_size=256, iha_sliding_window=8, repo_d_p=32, rope_parameters={
            "rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
    ),
    "rope_parameters": (
        dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 500000.0, "partial_rotary_factor": 0.5}),
        dict(rope_theta=500000.0, partial_rotary_factor=0.5, rope_parameters={
            "rope_type": "yarn", "factor": 4.0, "rope_theta": 500000.0, "partial_rotary_factor": 0.5,
            "original_max_position_embeddings": 32768}),
    ),
    "generator_untied": (
        dict(use_token_generator=True, tie_word_embeddings=True, use_jtokm=True, generator_spline_degree=3),
        dict(use_token_generator=True, tie_word_embeddings=False, use_jtokm=True, generator_spline_degree=3),
    ),
    "normalised_types": (
        dict(use_lns=1, use_gpas=0, siamese_attn_x_scale_init=2, repo_goat_num_frequencies=2.0, repo_goat_sink_decay=3,
             iha_global_layers_use_iha=1, use_repo_goat_prior=True, siamese_normalized_input=0, mea_component_key_value_heads=2.0),
        dict(use_lns=True, use_gpas=False, siamese_attn_x_scale_init=2.0, repo_goat_num_frequencies=2,
             repo_goat_sink_decay=3.0, iha_global_layers_use_iha=True, use_repo_goat_prior=True,
             siamese_normalized_input=False, mea_component_key_value_heads=2),
    ),
    "residual_flow": (
        dict(use_siamesenorm=False, use_stack_memory=True, stack_d_model=64, num_mem_heads=8, repo_start_layer=2, repo_d_p=7),
        dict(use_siamesenorm=False, use_stack_memory=True, stack_d_model=64, num_mem_heads=8, repo_start_layer=2, repo_d_p=7),
    ),
    "pretrained_config_keywords": (
        dict(bos_token_id=1, eos_token_id=2, pad_token_id=0, output_hidden_states=True, dtype="bfloat16",
             architectures=["NeoLLMForCausalLM"], auto_map={"AutoConfig": "x.Y"}, num_labels=3, use_cache=False,
             max_length=50, do_sample=True),
        dict(bos_token_id=1, eos_token_id=2, pad_token_id=0, output_hidden_states=True, dtype="bfloat16",
             architectures=["NeoLLMForCausalLM"], auto_map={"AutoConfig": "x.Y"}, use_cache=False,
             id2label={"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"},
             label2id={"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2}),
    ),
}


@pytest.mark.parametrize("kwargs, changes", list(CASES.values()), ids=list(CASES))
def test_config_json_values_and_round_trips(tmp_path, kwargs, changes):
    want = expected_json(**changes)
    cfg = NeoLLMConfig(**kwargs)
    assert saved(cfg, tmp_path / "new") == want
    # A config.json as the seed-signature class wrote it loads with the same attributes and writes itself back.
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text(json.dumps(want))
    back = NeoLLMConfig.from_pretrained(tmp_path / "old")
    assert attributes(back) == attributes(cfg)
    assert saved(back, tmp_path / "again") == want
    assert {k: type(getattr(back, k)) for k in FIELDS} == {k: type(getattr(cfg, k)) for k in FIELDS}
    payload = {k: v for k, v in want.items() if k not in ("model_type", "transformers_version")}
    made = AutoConfig.for_model("neollm", **payload)
    assert type(made) is NeoLLMConfig and made.to_dict() == cfg.to_dict()


def test_keywords_that_are_not_fields_go_to_pretrained_config():
    cfg = NeoLLMConfig(bos_token_id=5, auto_map={"AutoConfig": "x.Y"}, max_length=9, attn_implementation="eager")
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg._attn_implementation) == (5, None, "eager")
    assert cfg.auto_map == {"AutoConfig": "x.Y"} and not hasattr(cfg, "max_length")  # auto_map kept, as transformers does
    with pytest.raises(ValueError, match=r"unknown neollm config key\(s\): 'foo'"):  # a key transformers does not know
        NeoLLMConfig(foo="bar")
    assert NeoLLMConfig(rope_scaling={"rope_type": "linear", "factor": 2.0}).rope_scaling["factor"] == 2.0


def test_keyword_only_and_compared_by_fields():
    with pytest.raises(ValueError, match="accepts only keyword arguments"):
        NeoLLMConfig(64402)
    assert NeoLLMConfig() == NeoLLMConfig()
    assert NeoLLMConfig() != NeoLLMConfig(hidden_size=256)


DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}


def test_the_default_config_carries_transformers_rope_parameters(tmp_path):
    """transformers 5 configs carry a ``rope_parameters`` dict; the default is plain RoPE with the
    config's ``rope_theta`` / ``partial_rotary_factor`` (both fields kept), and the default config's
    config.json differs from the old one (``"rope_parameters": null``) by that key only."""
    cfg = NeoLLMConfig()
    assert cfg.rope_parameters == DEFAULT_ROPE and (cfg.rope_theta, cfg.partial_rotary_factor) == (10000.0, 0.25)
    cfg.validate_rope()
    old = {**FIELDS, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "rope_parameters": None,
           "model_type": "neollm", "transformers_version": transformers.__version__}
    assert saved(cfg, tmp_path / "new") == {**old, "rope_parameters": DEFAULT_ROPE}
    assert NeoLLMConfig.from_pretrained(tmp_path / "new").to_dict() == cfg.to_dict()
    (tmp_path / "old").mkdir()  # a config.json with `"rope_parameters": null` loads to the same config
    (tmp_path / "old" / "config.json").write_text(json.dumps(old))
    assert NeoLLMConfig.from_pretrained(tmp_path / "old").rope_parameters == DEFAULT_ROPE
    moved = NeoLLMConfig(rope_theta=500000.0, partial_rotary_factor=0.5)
    assert moved.rope_parameters == {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5}
    given = NeoLLMConfig(rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    assert given.rope_theta == 500000.0 and given.rope_parameters == {**DEFAULT_ROPE, "rope_theta": 500000.0}
