"""The Leviathan continuous token generator (``use_token_generator``): its coordinates, basis and
output against the formulas written out here, unique-id and chunked evaluation, parameter counts at
the seed's defaults, the baked table, decode == prefill with left padding, save / load, gradients,
the refusals and the config's errors."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from family_tester import ATOL, decode_stepwise, left_pad
from slmlab.models.neollm import NeoLLMConfig, NeoLLMForCausalLM, audit_parameters
from slmlab.models.neollm.components.generator import (
    LeviathanGenerator,
    khronos_basis,
    latent_base,
    latent_coordinates,
)

# tiny generator sizes: d = 6 seed dimensions, 3 modes, 5 knots, rank 4
GEN = dict(use_token_generator=True, generator_d_seed=6, generator_num_modes=3, generator_num_knots=5, generator_krank=4)
TINY = dict(
    vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, iha_sliding_window=4, dropout_rate=0.0, attention_dropout=0.0, **GEN,
)


def toy_bytes(vocab: int) -> list[bytes]:
    return [bytes((t * 7 + i) % 256 for i in range(t % 6)) for t in range(vocab)]


def tiny_model(**overrides) -> NeoLLMForCausalLM:
    torch.manual_seed(0)
    model = NeoLLMForCausalLM(NeoLLMConfig(**{**TINY, **overrides})).eval()
    if model.config.use_spelling_bee_embeddings:
        model.model.spelling_bee.set_byte_table_from_bytes(toy_bytes(model.config.vocab_size))
    return model


# -- the maths, transcribed independently -----------------------------------------------------------
def cardinal_quadratic(x: float) -> float:
    """The centred quadratic cardinal B-spline by the Cox-de Boor recursion on integer knots:
    ``N_0 = 1[0, 1)``, ``N_k(x) = (x N_{k-1}(x) + (k + 1 - x) N_{k-1}(x - 1)) / k``, centred by 1.5."""

    def n(k: int, t: float) -> float:
        if k == 0:
            return 1.0 if 0.0 <= t < 1.0 else 0.0
        return (t * n(k - 1, t) + (k + 1 - t) * n(k - 1, t - 1)) / k

    return n(2, x + 1.5)


def reference_basis(z: float, knots: int) -> list[float]:
    raw = [cardinal_quadratic((z - q / (knots - 1)) * (knots - 1)) for q in range(knots)]
    total = sum(raw) + 1e-8
    return [r / total for r in raw]


@torch.no_grad()
def reference_embedding(gen: LeviathanGenerator, t: int) -> torch.Tensor:
    """``e(t) = Σ_i H_i Π_j Σ_q B_i[j, q](1 + WD_i[j, q, r])`` in float64, one id at a time."""
    k, b, d = gen.codebooks.shape
    coords = [(t // b**j) % b for j in range(k)]
    seed = torch.cat([gen.codebooks[j, coords[j]].double() for j in range(k)])
    out = torch.zeros(gen.hidden_size, dtype=torch.float64)
    for i in range(gen.seed_proj.shape[0]):
        a = gen.seed_proj[i].double() @ seed
        a = (a - a.mean()) / torch.sqrt(a.var(unbiased=False) + gen.eps)
        z = 1.0 / (1.0 + torch.exp(-0.5 * gen.scale[i].double() * a))
        y = torch.ones(gen.delta.shape[-1], dtype=torch.float64)
        for j in range(d):
            basis = torch.tensor(reference_basis(float(z[j]), gen.num_knots), dtype=torch.float64)
            y = y * (basis[:, None] * (1.0 + gen.delta[i, j].double())).sum(0)
        out += gen.out_proj[i].double() @ y
    return out


def test_base_is_integer_exact_and_every_id_gets_its_own_coordinates():
    assert latent_base(64402, 3) == 41 and 40**3 < 64402 <= 41**3
    assert latent_base(64, 2) == 8 and latent_base(65, 2) == 9 and latent_base(1, 3) == 1
    assert latent_base(10**9, 3) == 1000  # a float cube root gives 999.9999999999998
    ids = torch.arange(64402)
    coords = latent_coordinates(ids, 41, 3)
    assert coords.shape == (64402, 3) and int(coords.min()) == 0 and int(coords.max()) == 40
    assert torch.unique(coords, dim=0).shape[0] == 64402
    assert torch.equal((coords * torch.tensor([1, 41, 41**2])).sum(-1), ids)  # digits in base 41


@pytest.mark.parametrize("knots", [2, 5, 32])
def test_basis_matches_the_cardinal_b_spline_and_rows_sum_to_one(knots):
    ties = (torch.arange(knots - 1, dtype=torch.float64) + 0.5) / (knots - 1)  # half-way between two knots
    spread = torch.rand(200, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    z = torch.cat([torch.tensor([0.0, 1e-4, 0.13, 0.5, 0.77, 0.999, 1.0], dtype=torch.float64), ties, spread])
    got = khronos_basis(z, knots)
    want = torch.tensor([reference_basis(float(v), knots) for v in z], dtype=torch.float64)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(got.sum(-1), torch.ones(len(z), dtype=torch.float64), atol=1e-7, rtol=0)
    assert cardinal_quadratic(0.0) == 0.75 and cardinal_quadratic(1.0) == 0.125  # 0.75 - u², ½(1.5 - u)²
    ends = [sum(cardinal_quadratic((e - q / (knots - 1)) * (knots - 1)) for q in range(knots)) for e in (0.0, 1.0)]
    assert ends == pytest.approx([0.875, 0.875], abs=1e-12)  # raw end-knot sums; the normalisation makes them 1


def test_generator_output_is_the_formula():
    torch.manual_seed(1)
    gen = LeviathanGenerator(50, 12, k=2, d_seed=5, num_modes=3, num_knots=6, krank=4)
    with torch.no_grad():
        gen.scale.uniform_(0.5, 2.0)
        gen.delta.normal_(0.0, 0.2)
    ids = torch.tensor([[0, 7, 49], [13, 7, 31]])
    got = gen(ids)
    assert got.shape == (2, 3, 12)
    for b in range(2):
        for t in range(3):
            torch.testing.assert_close(got[b, t].double(), reference_embedding(gen, int(ids[b, t])), atol=1e-5, rtol=0)


def test_unique_and_chunked_evaluation_equal_per_id_evaluation_and_ids_differ_at_init():
    torch.manual_seed(2)
    gen = LeviathanGenerator(300, 16, k=3, d_seed=6, num_modes=2, num_knots=5, krank=4, chunk_size=3)
    ids = torch.randint(0, 300, (3, 9))
    batch = gen(ids)
    alone = torch.stack([gen(ids[b, t].view(1, 1))[0, 0] for b in range(3) for t in range(9)]).view(3, 9, 16)
    torch.testing.assert_close(batch, alone, atol=1e-6, rtol=0)
    gen.chunk_size = 1000
    torch.testing.assert_close(gen(ids), batch, atol=1e-6, rtol=0)
    assert gen.delta.abs().sum() > 0 and not torch.allclose(gen(torch.tensor([[1]])), gen(torch.tensor([[2]])))


def test_parameter_counts_at_the_seed_defaults():
    with torch.device("meta"):
        model = NeoLLMForCausalLM(NeoLLMConfig(use_token_generator=True))
        dense = NeoLLMForCausalLM(NeoLLMConfig())
    gen = model.model.token_generator
    assert gen.base == 41 and not hasattr(model.model, "embed_tokens")
    assert sum(p.numel() for p in gen.parameters()) == 2_769_280  # 15,744 + 8 x (49,152 + 128 + 262,144 + 32,768)
    assert gen.codebooks.numel() == 15_744
    assert dense.model.embed_tokens.weight.numel() == 32_973_824
    rows, dense_rows = audit_parameters(model), audit_parameters(dense)
    assert rows["Leviathan generator (replaces a 32,973,824-parameter V x D table)"] == 2_769_280
    assert rows["Total"] == dense_rows["Total"] - 32_973_824 + 2_769_280
    assert sum(v for k, v in rows.items() if not k.endswith("total") and k not in ("Total", "Without W_E and lm_head")) == rows["Total"]
    ratio = 32_973_824 / 2_769_280
    print(f"input parameters: dense table 32,973,824 / generator 2,769,280 = {ratio:.2f}x")
    assert math.isclose(ratio, 11.907, abs_tol=1e-3)


def test_init_and_gradients_reach_every_generator_parameter():
    model = tiny_model(use_spelling_bee_embeddings=False)
    gen = model.get_input_embeddings()
    stats = {name: p.detach() for name, p in gen.named_parameters()}
    assert isinstance(gen, LeviathanGenerator) and model.model.get_input_embeddings() is gen
    assert torch.all(stats["scale"] == 1) and abs(float(stats["codebooks"].std()) - 1.0) < 0.2
    assert abs(float(stats["delta"].std()) - 0.02) < 0.005 and float(stats["seed_proj"].abs().max()) <= 0.04
    ids = torch.randint(0, 300, (2, 8))
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.any(p.grad != 0), name


@pytest.mark.parametrize("spelling_bee", [False, True])
def test_baked_table_equals_the_live_generator(spelling_bee):
    model = tiny_model(use_spelling_bee_embeddings=spelling_bee)
    ids = torch.randint(0, 300, (2, 11))
    with torch.no_grad():
        live_embeds = model.model.embed(ids)
        live = model(input_ids=ids).logits
        table = model.bake_inference_table(chunk_size=97)
        every = model.model._embed_live(torch.arange(300)[None])[0]
        torch.testing.assert_close(table, every, atol=1e-6, rtol=0)
        torch.testing.assert_close(model.model.embed(ids), live_embeds, atol=1e-6, rtol=0)
        torch.testing.assert_close(model(input_ids=ids).logits, live, atol=ATOL, rtol=0)
        torch.testing.assert_close(decode_stepwise(model, ids, prefill=4), live, atol=ATOL, rtol=0)
    model.train()
    assert model.model.baked_embeddings is None


@pytest.mark.parametrize("spelling_bee", [False, True])
@pytest.mark.parametrize("topology", ["siamese", "standard"])
def test_decode_equals_prefill_left_padded(spelling_bee, topology):
    model = tiny_model(use_spelling_bee_embeddings=spelling_bee, use_siamesenorm=topology == "siamese")
    g = torch.Generator().manual_seed(4)
    rows = [torch.randint(1, 300, (n,), generator=g) for n in (10, 6)]
    ids, mask = left_pad(rows)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits
        step = decode_stepwise(model, ids, mask, prefill=4)
        alone = model(input_ids=rows[1][None]).logits[0]
    real = mask.bool()
    torch.testing.assert_close(step[real], full[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(full[1, -6:], alone, atol=ATOL, rtol=0)


def test_save_load_round_trip_keeps_every_weight_and_the_logits(tmp_path):
    model = tiny_model()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    ids = torch.randint(0, 300, (2, 7))
    model.save_pretrained(tmp_path)
    loaded = NeoLLMForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.use_token_generator and not loaded.config.tie_word_embeddings
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name} changed by from_pretrained"
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=0, rtol=0)


def test_refusals_inputs_embeds_and_resize():
    model = tiny_model(use_spelling_bee_embeddings=False)
    with pytest.raises(ValueError, match="use_token_generator=True"):
        model(inputs_embeds=torch.zeros(1, 3, 64))
    with pytest.raises(ValueError, match="resize_token_embeddings is not supported with use_token_generator"):
        model.resize_token_embeddings(310)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(generator_k=0), "generator_k"),
        (dict(generator_num_knots=1), "generator_num_knots"),
        (dict(generator_d_seed=0), "generator_d_seed"),
        (dict(generator_num_modes=0), "generator_num_modes"),
        (dict(generator_krank=-1), "generator_krank"),
    ],
)
def test_config_errors_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        NeoLLMConfig(**{**TINY, **overrides})
    NeoLLMConfig(**{**TINY, **overrides, "use_token_generator": False})  # ignored while the generator is off


def test_spline_degree_is_documentation_only(caplog):
    with caplog.at_level(logging.WARNING):
        cfg = NeoLLMConfig(**TINY, generator_spline_degree=3)
    assert "documentation only" in caplog.text
    torch.manual_seed(0)
    a = NeoLLMForCausalLM(cfg).eval()
    torch.manual_seed(0)
    b = NeoLLMForCausalLM(NeoLLMConfig(**TINY)).eval()
    for model in (a, b):
        model.model.spelling_bee.set_byte_table_from_bytes(toy_bytes(300))
    ids = torch.randint(0, 300, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(a(input_ids=ids).logits, b(input_ids=ids).logits, atol=0, rtol=0)


def test_generator_models_count_and_serve_without_a_token_table():
    """Code that used to read ``get_input_embeddings().weight`` (the bench's parameter count, the server's
    batcher) works when the input block is the generator."""
    from slmlab.bench.models import count_parameters
    from slmlab.serve.batch import DecodeBatch

    model = tiny_model(use_token_generator=True).eval()
    total, non_embedding = count_parameters(model)
    generator = sum(p.numel() for p in model.get_input_embeddings().parameters())
    head = model.get_output_embeddings().weight.numel()
    assert total - non_embedding == generator + head
    batch = DecodeBatch(model)
    rows = batch.prefill([[3, 4, 5], [6, 7]])
    assert rows.logits.shape == (2, model.config.vocab_size) and torch.isfinite(rows.logits).all()
    alone = model(input_ids=torch.tensor([[6, 7]])).logits[0, -1]
    torch.testing.assert_close(rows.logits[1], alone, atol=1e-5, rtol=0)
