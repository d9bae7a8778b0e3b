"""NeoLLMConfig: the seed's 83 fields and defaults, its errors and warnings, derived fields, JSON."""

from __future__ import annotations

import inspect
import json
import logging

import pytest
from transformers import AutoConfig

import slmlab  # noqa: F401  (registers the families)
from slmlab.models.neollm.configuration_neollm import NeoLLMConfig

LOGGER = "slmlab.models.neollm.configuration_neollm"

# The seed's ``__init__`` signature, written out by hand (seed 000): name -> default.
SEED_DEFAULTS = dict(
    vocab_size=64402, hidden_size=512, intermediate_size=1536, num_hidden_layers=12, num_attention_heads=8,
    num_key_value_heads=4, hidden_act="xielu", max_position_embeddings=32768, initializer_range=0.02,
    rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=10000.0, rope_scaling=None, partial_rotary_factor=0.25,
    attention_bias=False, attention_dropout=0.1, head_dim=64, use_momentum_attention=True, momentum_gamma=0.10,
    use_mea_attention=False, mea_component_key_value_heads=None, mea_groupnorm_eps=1e-6, use_lucid_attention=False,
    lucid_attention_eps=1e-6, use_affine_scaled_attention=False, affine_momentum=0.9, use_xsa=True, xsa_eps=1e-6,
    use_directional_routing=False, directional_routing_k=4, directional_routing_temp=3.0, use_attn_res=False,
    attn_res_num_blocks=4, use_stack_memory=False, stack_d_model=32, num_mem_heads=4, stack_slots=16,
    stack_memory_cache_size=2048, use_fan_residual=False, fan_ratio=0.125, fan_ratio_ffn=0.0625, dropout_rate=0.1,
    use_learnable_multipliers=True, use_embedding_multipliers=False, use_lns=False, use_gpas=False,
    use_siamesenorm=True, siamese_normalized_input=True, siamese_depth_scaling=True, siamese_attn_x_scale_init=1.0,
    use_embedding_input_norm=True, use_token_generator=False, generator_d_seed=128, generator_num_modes=8,
    generator_num_knots=32, generator_spline_degree=2, generator_k=3, generator_krank=64, use_jtokm=False,
    jtokm_num_experts=4, jtokm_top_k=2, jtokm_num_modes=4, jtokm_aux_loss_weight=1e-4, jtokm_norm_eps=1e-6,
    use_hadamard_o_proj=True, polynorm_exclusive=False, use_spelling_bee_embeddings=True, use_repo=True,
    repo_start_layer=None, repo_d_p=None, use_repo_grape=True, use_repo_goat_prior=False, repo_goat_num_frequencies=3,
    repo_goat_sink_decay=4.0, use_laurel=False, use_laurel_rw=False, use_laurel_lr=False, laurel_lr_rank=32,
    use_iha=True, iha_num_pseudo_heads=2, iha_local_global_pattern="LLLLG", iha_sliding_window=None,
    iha_global_layers_use_iha=False,
)
# Defaults the seed resolves in ``__init__``.
DERIVED = dict(repo_start_layer=12 // 3, repo_d_p=512 // 8, mea_component_key_value_heads=4)


# the default `rope_parameters` (and its alias `rope_scaling`): plain RoPE from the fields
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}


def test_signature_matches_the_seed():
    params = inspect.signature(NeoLLMConfig.__init__).parameters
    ours = {k: p.default for k, p in params.items() if k not in ("self", "kwargs", "use_cache")}
    assert len(SEED_DEFAULTS) == 83
    assert ours == SEED_DEFAULTS


def test_every_default_is_the_seeds():
    cfg = NeoLLMConfig()
    for name, default in SEED_DEFAULTS.items():
        # `rope_scaling` is transformers' alias of `rope_parameters`: plain RoPE's dict by default
        want = DEFAULT_ROPE if name == "rope_scaling" else DERIVED.get(name, default)
        assert getattr(cfg, name) == want, name
    assert cfg.use_cache is True


def test_derived_defaults_follow_the_sizes():
    cfg = NeoLLMConfig(num_hidden_layers=7, hidden_size=256, num_key_value_heads=2)
    assert (cfg.repo_start_layer, cfg.repo_d_p, cfg.mea_component_key_value_heads) == (2, 32, 2)
    assert NeoLLMConfig(mea_component_key_value_heads=6).mea_component_key_value_heads == 6


def test_layer_schedule():
    cfg = NeoLLMConfig()
    kinds = cfg.layer_attention_kinds
    assert kinds[:4] == ["local/rope"] * 4
    assert kinds[4] == "none/repo" and kinds[9] == "none/repo"
    assert [i for i, k in enumerate(kinds) if k == "local/repo"] == [5, 6, 7, 8, 10, 11]
    assert cfg.rotary_dim == 16
    assert NeoLLMConfig(iha_num_pseudo_heads=1).iha_kind(4) == "mix"
    assert NeoLLMConfig(iha_global_layers_use_iha=True).iha_kind(4) == "global"
    assert NeoLLMConfig(use_iha=False).iha_kind(0) == "none"
    assert NeoLLMConfig(iha_local_global_pattern=" lg ").iha_kind(1) == "none"
    off = NeoLLMConfig(use_repo=False, use_repo_grape=False)
    assert not any(off.is_repo_layer(i) for i in range(12))
    assert NeoLLMConfig(use_repo=False, use_repo_grape=False, use_repo_goat_prior=True).is_repo_layer(4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(use_jtokm=True), "requires `use_token_generator=True`"),
        (dict(use_jtokm=True, use_token_generator=True, jtokm_top_k=4), "1 <= jtokm_top_k < jtokm_num_experts"),
        (dict(use_jtokm=True, use_token_generator=True, jtokm_top_k=0), "jtokm_top_k=0"),
        (dict(repo_start_layer=12), "repo_start_layer=12, num_hidden_layers=12"),
        (dict(repo_start_layer=-1), "0 <= repo_start_layer"),
        (dict(use_repo=False, use_repo_grape=False, use_repo_goat_prior=True, repo_start_layer=40), "repo_start_layer=40"),
        (dict(use_repo_goat_prior=True, repo_goat_num_frequencies=-1), "repo_goat_num_frequencies` must be >= 0"),
        (dict(use_repo_goat_prior=True, repo_goat_sink_decay=0.0), "repo_goat_sink_decay` must be > 0"),
        (dict(iha_num_pseudo_heads=0), "iha_num_pseudo_heads` must be >= 1"),
        (dict(iha_local_global_pattern="  "), "must not be empty"),
        (dict(iha_local_global_pattern="LLXG"), r"invalid characters: \['X'\]"),
        (dict(iha_sliding_window=0), "iha_sliding_window"),
        (dict(use_laurel=True, use_laurel_rw=True), r"Active flags: \['use_laurel', 'use_siamesenorm'\]"),
        (dict(use_siamesenorm=False, use_attn_res=True, use_stack_memory=True), "at most one residual-flow"),
        (dict(use_siamesenorm=False, use_laurel=True), "at least one sub-variant"),
        (dict(use_siamesenorm=False, use_stack_memory=True, stack_d_model=30), "divisible by `num_mem_heads`"),
        (dict(use_siamesenorm=False, use_stack_memory=True, stack_slots=0), "stack_slots"),
        (dict(use_siamesenorm=False, use_stack_memory=True, num_mem_heads=0), "num_mem_heads"),
        (dict(num_attention_heads=8, num_key_value_heads=3), "divisible by `num_key_value_heads`"),
        (dict(partial_rotary_factor=0.0), "partial_rotary_factor"),
        (dict(head_dim=10, partial_rotary_factor=0.3), "positive even number"),
        (dict(vocab_size=0), "vocab_size"),
    ],
)
def test_seed_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NeoLLMConfig(**kwargs)


def test_checks_are_skipped_where_the_seed_skips_them():
    # REPO range only with a REPO flag, GOAT only with GOAT, IHA only with IHA, StackMemory only when on.
    NeoLLMConfig(use_repo=False, use_repo_grape=False, repo_start_layer=99)
    NeoLLMConfig(repo_goat_num_frequencies=-1, repo_goat_sink_decay=-1.0)
    NeoLLMConfig(use_iha=False, iha_local_global_pattern="xyz", iha_num_pseudo_heads=0)
    NeoLLMConfig(stack_d_model=30)
    NeoLLMConfig(jtokm_top_k=9)
    NeoLLMConfig(use_laurel_rw=True, use_laurel_lr=True)


def _warnings(caplog, **kwargs):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cfg = NeoLLMConfig(**kwargs)
    return cfg, " | ".join(r.getMessage() for r in caplog.records if r.name == LOGGER)


def test_seed_warnings(caplog):
    cfg, text = _warnings(caplog, use_token_generator=True, tie_word_embeddings=True)
    assert cfg.tie_word_embeddings is False and "setting `tie_word_embeddings=False`" in text
    cfg, text = _warnings(caplog, use_embedding_multipliers=True, use_learnable_multipliers=False)
    assert "inactive because `use_learnable_multipliers=False`" in text
    _, text = _warnings(caplog, use_embedding_multipliers=True, use_token_generator=True)
    assert "inactive because `use_token_generator=True`" in text
    _, text = _warnings(caplog, use_embedding_multipliers=True, tie_word_embeddings=True)
    assert "inactive because `tie_word_embeddings=True`" in text
    _, text = _warnings(caplog, use_repo_goat_prior=True, repo_goat_num_frequencies=2)
    assert "appends 6 prior channels" in text and "dim=70" in text
    _, text = _warnings(caplog, use_repo_goat_prior=True)
    assert text == ""
    _, text = _warnings(caplog, use_embedding_multipliers=True)
    assert text == ""


def test_json_round_trip(tmp_path):
    cfg = NeoLLMConfig(hidden_size=256, iha_sliding_window=8, rope_scaling={"rope_type": "linear", "factor": 2.0})
    cfg.save_pretrained(tmp_path)
    back = NeoLLMConfig.from_pretrained(tmp_path)
    assert back.to_dict() == cfg.to_dict()
    assert back.rope_scaling["rope_type"] == "linear" and back.rope_scaling["factor"] == 2.0
    assert NeoLLMConfig.from_dict(NeoLLMConfig().to_dict()).rope_scaling == DEFAULT_ROPE


def test_config_json_written_by_the_seed_class_loads(tmp_path):
    """What the seed's class writes: every field (derived ones resolved), its ``auto_map``, the
    transformers bookkeeping and the legacy ``rope_scaling`` key."""
    payload = {**SEED_DEFAULTS, **DERIVED, "num_key_value_heads": 2, "use_repo_goat_prior": True}
    payload.update(
        model_type="neollm",
        architectures=["NeoLLMForCausalLM"],
        transformers_version="4.57.1",
        torch_dtype="float32",
        auto_map={
            "AutoConfig": "configuration_neollm.NeoLLMConfig",
            "AutoModel": "modeling_neollm.NeoLLMModel",
            "AutoModelForCausalLM": "modeling_neollm.NeoLLMForCausalLM",
        },
    )
    (tmp_path / "config.json").write_text(json.dumps(payload))
    cfg = NeoLLMConfig.from_pretrained(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)) is NeoLLMConfig  # registered by `import slmlab`
    assert cfg.num_key_value_heads == 2 and cfg.use_repo_goat_prior and cfg.rope_scaling == DEFAULT_ROPE
    assert cfg.mea_component_key_value_heads == 4  # the seed stored the resolved value
    for name in SEED_DEFAULTS:
        if name != "rope_scaling":  # checked above: the alias of the default `rope_parameters`
            assert getattr(cfg, name) == payload[name], name


# -- residual-side options (docs/neollm-residual.md) ----------------------------------------------
@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(use_siamesenorm=False, use_laurel=True, use_laurel_lr=True, laurel_lr_rank=0), "laurel_lr_rank"),
        (dict(use_siamesenorm=False, use_laurel=True, use_laurel_lr=True, laurel_lr_rank=513), "laurel_lr_rank"),
        (dict(use_siamesenorm=False, use_attn_res=True, attn_res_num_blocks=-1), "attn_res_num_blocks"),
    ],
)
def test_residual_option_values_are_validated(overrides, field):
    with pytest.raises(ValueError, match=field):
        NeoLLMConfig(**overrides)


def test_residual_option_edges_accepted_and_logged(caplog):
    NeoLLMConfig(use_siamesenorm=False, use_laurel=True, use_laurel_lr=True, laurel_lr_rank=512)
    NeoLLMConfig(use_siamesenorm=False, use_laurel=True, use_laurel_rw=True, laurel_lr_rank=0)  # LR off: rank unused
    with caplog.at_level(logging.INFO, logger="slmlab.models.neollm.configuration_neollm"):
        NeoLLMConfig(use_siamesenorm=False, use_attn_res=True, attn_res_num_blocks=20)
    assert "behaves as 12" in caplog.text
