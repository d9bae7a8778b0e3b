"""The NeoLLM flag table for generative combination tests: every built flag with the values worth
testing, the config's constraints between them, and a seeded all-pairs generator.

A new mechanism adds its flag (and any constraint) here; ``tests/models/neollm/test_neollm_flags.py`` then builds,
trains one step and checks decode == prefill for a set of rows that covers every pair of values of
every two flags, without enumerating the full product (2^20+ combinations).
"""

from __future__ import annotations

import itertools
import random

# A 3-layer model small enough for a one-core sweep; pattern "LG" and REPO from layer 1 give a local
# RoPE layer, a global REPO layer and a local REPO layer.
BASE = dict(
    vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=256, iha_local_global_pattern="LG",
    repo_start_layer=1, attention_dropout=0.0, dropout_rate=0.0,
    # small generator / JTok-M sizes (used only when those flags are on)
    generator_d_seed=8, generator_num_modes=2, generator_num_knots=6, generator_krank=4, jtokm_num_modes=2,
)

# flag -> values (the first value is the seed default or the tiny default).
FLAGS: dict[str, tuple] = {
    "use_siamesenorm": (True, False),
    "siamese_normalized_input": (True, False),
    "siamese_depth_scaling": (True, False),
    "use_embedding_input_norm": (True, False),
    "use_learnable_multipliers": (True, False),
    "fan_ratio": (0.125, 0.0),
    "fan_ratio_ffn": (0.0625, 0.0),
    "use_fan_residual": (False, True),
    "use_spelling_bee_embeddings": (True, False),
    "hidden_act": ("xielu", "silu"),
    "use_momentum_attention": (True, False),
    "use_xsa": (True, False),
    "use_hadamard_o_proj": (True, False),
    "use_repo": (True, False),
    "use_repo_grape": (True, False),
    "use_iha": (True, False),
    "iha_num_pseudo_heads": (2, 1, 3),
    "iha_global_layers_use_iha": (False, True),
    "iha_sliding_window": (None, 2, 4),
    "num_key_value_heads": (2, 1, 4),
    "head_dim": (16, 8),
    "partial_rotary_factor": (0.25, 0.5),
    "tie_word_embeddings": (False, True),
    "attention_bias": (False, True),
    "dropout_rate": (0.0, 0.1),
    "attention_dropout": (0.0, 0.1),
    # attention options (docs/neollm-attention.md): MEA with H_c == H_kv (None) or H_c = 1 != H_kv
    "use_mea_attention": (False, True),
    "mea_component_key_value_heads": (None, 1),
    "use_lucid_attention": (False, True),
    "use_affine_scaled_attention": (False, True),
    "use_directional_routing": (False, True),
    "use_repo_goat_prior": (False, True),
    # residual side (docs/neollm-residual.md)
    "use_laurel": (False, True),
    "use_laurel_rw": (False, True),
    "use_laurel_lr": (False, True),
    "use_attn_res": (False, True),
    "attn_res_num_blocks": (4, 0, 2),
    "use_stack_memory": (False, True),
    "use_lns": (False, True),
    "use_gpas": (False, True),
    "polynorm_exclusive": (False, True),
    "use_embedding_multipliers": (False, True),
    # embedding side (docs/neollm.md): the Leviathan generator and JTok-M on top of it
    "use_token_generator": (False, True),
    "use_jtokm": (False, True),
}

# The config's constraints between flags: (explanation, predicate that a valid row satisfies).
CONSTRAINTS = (
    (
        "use_hadamard_o_proj needs num_attention_heads * head_dim == hidden_size",
        lambda r: not r["use_hadamard_o_proj"] or BASE["num_attention_heads"] * r["head_dim"] == BASE["hidden_size"],
    ),
    (
        "the rotated width int(head_dim * partial_rotary_factor) must be positive and even",
        lambda r: int(r["head_dim"] * r["partial_rotary_factor"]) % 2 == 0,
    ),
    (
        "at most one residual flow among use_laurel, use_attn_res, use_stack_memory, use_siamesenorm",
        lambda r: sum(bool(r[f]) for f in ("use_laurel", "use_attn_res", "use_stack_memory", "use_siamesenorm")) <= 1,
    ),
    ("use_laurel needs use_laurel_rw or use_laurel_lr", lambda r: not r["use_laurel"] or r["use_laurel_rw"] or r["use_laurel_lr"]),
    ("use_jtokm needs use_token_generator", lambda r: not r["use_jtokm"] or r["use_token_generator"]),
)

# Parameters whose gradient is exactly zero at init by construction (their partner starts at 0):
# LAUREL's A while B = 0, AttnRes' key-norm weight while the pseudo-query w = 0. They get a gradient
# after one optimiser step. Layer 0's attention-side AttnRes aggregator sees one source (weight 1)
# and never gets a gradient.
ZERO_GRAD_AT_INIT = r"\.lr_a$|agg\.key_weight$|layers\.0\.residual\.(flow\.)?attn_agg\."
NEVER_GRAD = r"layers\.0\.residual\.(flow\.)?attn_agg\."

# Hand-picked variants the earlier tests checked one by one; they are rows of the sweep.
HAND_PICKED = {
    "standard": dict(use_siamesenorm=False),
    "standard-raw-l0": dict(use_siamesenorm=False, use_embedding_input_norm=False),
    "siamese-raw-l0": dict(use_embedding_input_norm=False),
    "siamese-plain": dict(siamese_normalized_input=False, siamese_depth_scaling=False),
    "no-mult-no-fan": dict(use_learnable_multipliers=False, fan_ratio=0.0, fan_ratio_ffn=0.0),
    "fan-residual": dict(use_spelling_bee_embeddings=False, use_fan_residual=True),
    "attention-all-five": dict(use_mea_attention=True, mea_component_key_value_heads=1, use_lucid_attention=True,
                               use_affine_scaled_attention=True, use_directional_routing=True,
                               use_repo_goat_prior=True, use_fan_residual=True, attention_bias=True,
                               iha_sliding_window=4),
    "laurel-rw-lr-lns-gpas": dict(use_siamesenorm=False, use_laurel=True, use_laurel_rw=True, use_laurel_lr=True,
                                  use_lns=True, use_gpas=True),
    "attnres-full-gpas": dict(use_siamesenorm=False, use_attn_res=True, attn_res_num_blocks=0, use_gpas=True),
    "stackmemory-polynorm": dict(use_siamesenorm=False, use_stack_memory=True, polynorm_exclusive=True),
    "tied-embedding-multipliers": dict(tie_word_embeddings=True, use_embedding_multipliers=True),
    "generator-jtokm-siamese": dict(use_token_generator=True, use_jtokm=True),
    "generator-jtokm-standard-plain": dict(use_token_generator=True, use_jtokm=True, use_siamesenorm=False,
                                           use_spelling_bee_embeddings=False),
    "generator-jtokm-attnres": dict(use_token_generator=True, use_jtokm=True, use_siamesenorm=False, use_attn_res=True),
}


def defaults() -> dict:
    return {flag: values[0] for flag, values in FLAGS.items()}


def is_valid(row: dict) -> bool:
    return all(check(row) for _, check in CONSTRAINTS)


def pairs_of(row: dict) -> set:
    items = sorted((flag, repr(row[flag])) for flag in FLAGS)
    return set(itertools.combinations(items, 2))


def required_pairs() -> set:
    """Every pair of (flag, value) assignments that some valid row can hold."""
    need = set()
    for (f1, v1s), (f2, v2s) in itertools.combinations(sorted(FLAGS.items()), 2):
        for v1, v2 in itertools.product(v1s, v2s):
            row = {**defaults(), f1: v1, f2: v2}
            if not is_valid(row):  # try to repair with the other flags before giving the pair up
                row = _repair(row, fixed={f1, f2})
            if row is not None:
                need.add(((f1, repr(v1)), (f2, repr(v2))))
    return need


def _repair(row: dict, fixed: set, rng: random.Random | None = None) -> dict | None:
    rng = rng or random.Random(0)
    free = [f for f in FLAGS if f not in fixed]
    for _ in range(200):
        if is_valid(row):
            return row
        f = rng.choice(free)
        row = {**row, f: rng.choice(FLAGS[f])}
    return row if is_valid(row) else None


def all_pairs_rows(seed: int = 0, candidates: int = 60) -> list[tuple[str, dict]]:
    """Seeded greedy all-pairs cover: the hand-picked rows first, then, until every required pair is
    covered, the best of ``candidates`` random valid rows (each seeded with one uncovered pair).

    Returns:
        ``(name, full flag assignment)`` rows.
    """
    rng = random.Random(seed)
    rows = [(name, {**defaults(), **over}) for name, over in HAND_PICKED.items()]
    uncovered = required_pairs()
    for _, row in rows:
        uncovered -= pairs_of(row)
    while uncovered:
        target = sorted(uncovered)[0]
        best, gain = None, -1
        for _ in range(candidates):
            row = {f: rng.choice(v) for f, v in FLAGS.items()}
            for flag, value in target:
                row[flag] = next(v for v in FLAGS[flag] if repr(v) == value)
            row = _repair(row, fixed={target[0][0], target[1][0]}, rng=rng)
            if row is None:
                continue
            g = len(pairs_of(row) & uncovered)
            if g > gain:
                best, gain = row, g
        rows.append((f"pairs-{len(rows) - len(HAND_PICKED):02d}", best))
        uncovered -= pairs_of(best)
    return rows
