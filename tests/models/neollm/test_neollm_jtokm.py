"""JTok-M (``use_jtokm``): the modulation and the balance loss against the formulas written out
here, the auxiliary loss in the output (``loss == CE + aux_loss``, none without labels, padding
excluded, gradient accumulation weighting), parameter counts at the seed's defaults, decode ==
prefill with left padding in every topology, save / load, gradients, the config's errors and the
``aux_loss`` metric of ``slmlab train``."""

from __future__ import annotations

import math

import pytest
import torch

from family_tester import ATOL, decode_stepwise, left_pad
from slmlab.models.base import causal_lm_loss
from slmlab.models.neollm import NeoLLMConfig, NeoLLMForCausalLM, audit_parameters
from slmlab.models.neollm.components.context import ForwardContext, ResidualState
from slmlab.models.neollm.components.generator import LeviathanGenerator
from slmlab.models.neollm.components.jtokm import JTokM, NoModulation

JTOKM = dict(
    use_token_generator=True, use_jtokm=True, generator_d_seed=6, generator_num_modes=2, generator_num_knots=5,
    generator_krank=4, jtokm_num_modes=3, jtokm_aux_loss_weight=0.01,
)
TINY = dict(
    vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, iha_sliding_window=4, dropout_rate=0.0, attention_dropout=0.0, **JTOKM,
)
TOPOLOGIES = {
    "siamese": {},
    "standard": dict(use_siamesenorm=False),
    "laurel": dict(use_siamesenorm=False, use_laurel=True, use_laurel_rw=True, use_laurel_lr=True),
    "attnres": dict(use_siamesenorm=False, use_attn_res=True, attn_res_num_blocks=2),
    "stackmemory": dict(use_siamesenorm=False, use_stack_memory=True),
    "siamese-lns-gpas": dict(use_lns=True, use_gpas=True),
}


def tiny_model(**overrides) -> NeoLLMForCausalLM:
    torch.manual_seed(0)
    model = NeoLLMForCausalLM(NeoLLMConfig(**{**TINY, **overrides})).eval()
    if model.config.use_spelling_bee_embeddings:
        model.model.spelling_bee.set_byte_table_from_bytes([bytes([t % 256]) * (t % 4) for t in range(300)])
    return model


# -- the maths, transcribed independently -----------------------------------------------------------
@torch.no_grad()
def reference_modulation(mod: JTokM, h: torch.Tensor, z: torch.Tensor, basis: torch.Tensor, layer: int) -> torch.Tensor:
    """Δr per token, in float64, from the definitions (one token at a time)."""
    n_e, top_k = mod.num_experts, mod.top_k
    out = torch.zeros(h.shape, dtype=torch.float64)
    for b in range(h.shape[0]):
        for t in range(h.shape[1]):
            x = h[b, t].double()
            normed = mod.router_norm.weight.double() * x / torch.sqrt((x * x).mean() + mod.router_norm.eps)
            g = mod.router.weight.double() @ normed
            chosen = sorted(range(n_e), key=lambda i: -float(g[i]))[:top_k]
            sig = {i: 1.0 / (1.0 + math.exp(-float(g[i]))) for i in chosen}
            e = torch.zeros(h.shape[-1], dtype=torch.float64)
            for i in chosen:
                surf = torch.tensor([
                    math.prod(
                        sum(float(basis[b, t, j, q]) * (1.0 + float(mod.delta[i, m, j, q])) for q in range(basis.shape[-1]))
                        for j in range(basis.shape[-2])
                    )
                    for m in range(mod.delta.shape[1])
                ], dtype=torch.float64)
                m_i = mod.out_proj[i].double() @ surf + mod.res_proj[i].double() @ z[b, t].double()
                e += sig[i] / sum(sig.values()) * m_i
            out[b, t] = mod.scale.double() * e / math.sqrt(float(e @ e) + mod.norm_eps) / math.sqrt(2 * (layer + 1))
    return out


def reference_balance(logits: torch.Tensor, real: torch.Tensor, top_k: int) -> float:
    """``n_e Σ_i f_i p_i`` over the real tokens, one token at a time."""
    n_e = logits.shape[-1]
    count, p, f = 0, [0.0] * n_e, [0.0] * n_e
    for g in logits[real.bool()].tolist():
        count += 1
        sig = [1.0 / (1.0 + math.exp(-v)) for v in g]
        for i in sorted(range(n_e), key=lambda i: -g[i])[:top_k]:
            f[i] += 1.0
        for i in range(n_e):
            p[i] += sig[i] / sum(sig)
    return n_e * sum((f[i] / (count * top_k)) * (p[i] / count) for i in range(n_e))


def test_modulation_and_balance_loss_are_the_formulas():
    torch.manual_seed(3)
    gen = LeviathanGenerator(100, 16, k=2, d_seed=5, num_modes=2, num_knots=6, krank=3)
    mod = JTokM(16, layer_idx=2, num_layers=4, d_seed=5, num_knots=6, num_experts=4, top_k=2, num_modes=3,
                aux_loss_weight=0.5)
    with torch.no_grad():
        mod.delta.normal_(0.0, 0.3)
        mod.scale.uniform_(0.5, 1.5)
        mod.router_norm.weight.uniform_(0.5, 1.5)
        mod.router.weight.normal_(0.0, 0.5)
    ids = torch.randint(0, 100, (2, 5))
    latents = gen.latents(ids)
    h = torch.randn(2, 5, 16)
    update = torch.randn(2, 5, 16)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    ctx = ForwardContext(torch.zeros(2, 5, dtype=torch.long), mask, ids, aux_losses=[], latents=latents)
    out = mod(update, ResidualState(streams=(), mlp_stream=h), ctx)
    z, basis = latents.z[latents.inverse], latents.basis[latents.inverse]
    torch.testing.assert_close((out - update).double(), reference_modulation(mod, h, z, basis, 2), atol=1e-6, rtol=0)
    (aux,) = ctx.aux_losses
    want = 0.5 / 4 * reference_balance(mod.route(h).detach(), mask, 2)
    assert math.isclose(float(aux.detach()), want, rel_tol=1e-6)
    # the latent coordinate is the generator's mode 1: z = sigmoid(½ γ_1 ⊙ LN(W_1 s))
    torch.testing.assert_close(latents.z, gen.mode_latents(gen.seed(torch.unique(ids)))[:, 0], atol=1e-6, rtol=0)
    assert NoModulation()(update, None, None) is update


def test_zero_router_gives_exactly_lambda():
    model = tiny_model()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.modulation.router.weight.zero_()
    ids = torch.randint(0, 300, (2, 9))
    out = model(input_ids=ids, labels=ids)
    assert abs(float(out.aux_loss.detach()) - 0.01) < 1e-6


def test_loss_is_cross_entropy_plus_aux_loss_and_no_aux_without_labels():
    model = tiny_model()
    ids = torch.randint(0, 300, (2, 9))
    out = model(input_ids=ids, labels=ids)
    ce = causal_lm_loss(out.logits, ids)
    assert out.aux_loss is not None and float(out.aux_loss.detach()) > 0 and torch.isfinite(out.aux_loss)
    assert torch.equal(out.loss, ce + out.aux_loss)
    assert model(input_ids=ids).aux_loss is None
    loss, logits, *_, aux = model(input_ids=ids, labels=ids, return_dict=False)
    assert torch.equal(loss, out.loss) and torch.equal(aux, out.aux_loss) and logits.shape == (2, 9, 300)
    plain = tiny_model(use_jtokm=False)
    assert plain(input_ids=ids, labels=ids).aux_loss is None


def test_aux_loss_ignores_padding():
    model = tiny_model()
    g = torch.Generator().manual_seed(5)
    ids, mask = left_pad([torch.randint(1, 300, (n,), generator=g) for n in (9, 5)])
    labels = ids.masked_fill(mask == 0, -100)
    first = model(input_ids=ids, attention_mask=mask, labels=labels).aux_loss
    other = ids.clone()
    other[mask == 0] = 123
    second = model(input_ids=other, attention_mask=mask, labels=labels).aux_loss
    assert abs(float(first.detach()) - float(second.detach())) < 1e-9


def test_gradient_accumulation_weights_the_aux_loss_by_counted_tokens():
    model = tiny_model()
    ids = torch.randint(0, 300, (2, 9))
    full = model(input_ids=ids, labels=ids)
    part = model(input_ids=ids, labels=ids, num_items_in_batch=4 * 8)  # this micro-batch holds 16 of 32
    torch.testing.assert_close(part.aux_loss, full.aux_loss / 2, atol=1e-9, rtol=0)
    torch.testing.assert_close(part.loss, causal_lm_loss(part.logits, ids, num_items_in_batch=32) + part.aux_loss,
                               atol=0, rtol=0)


def test_parameter_counts_at_the_seed_defaults():
    with torch.device("meta"):
        model = NeoLLMForCausalLM(NeoLLMConfig(use_token_generator=True, use_jtokm=True))
    per_layer = [sum(p.numel() for p in layer.modulation.parameters()) for layer in model.model.layers]
    assert per_layer == [338_944] * 12  # 4 x (16,384 + 2,048 + 65,536) + 2,048 + 512 + 512
    assert audit_parameters(model)["JTok-M modulation (all layers)"] == 12 * 338_944


def test_gradients_reach_every_parameter_and_inits_survive_from_pretrained(tmp_path):
    model = tiny_model()
    for layer in model.model.layers:
        assert torch.all(layer.modulation.scale == 1) and layer.modulation.scale.dtype == torch.float32
        assert abs(float(layer.modulation.delta.detach().std()) - 0.02) < 0.005
    model.train()
    ids = torch.randint(0, 300, (4, 12))
    model(input_ids=ids, labels=ids).loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.any(p.grad != 0), name
    model.eval()
    model.save_pretrained(tmp_path)
    loaded = NeoLLMForCausalLM.from_pretrained(tmp_path).eval()
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name} changed by from_pretrained"
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=0, rtol=0)


# every topology without Spelling Bee, and the two main ones with it
DECODE_CASES = [(name, False) for name in sorted(TOPOLOGIES)] + [("siamese", True), ("standard", True)]


@pytest.mark.parametrize("topology, spelling_bee", DECODE_CASES)
def test_decode_equals_prefill_left_padded(topology, spelling_bee):
    model = tiny_model(use_spelling_bee_embeddings=spelling_bee, **TOPOLOGIES[topology])
    g = torch.Generator().manual_seed(6)
    rows = [torch.randint(1, 300, (n,), generator=g) for n in (10, 6)]
    ids, mask = left_pad(rows)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits
        step = decode_stepwise(model, ids, mask, prefill=4)
        alone = model(input_ids=rows[1][None]).logits[0]
        model.bake_inference_table()
        baked = decode_stepwise(model, ids, mask, prefill=4)
    real = mask.bool()
    torch.testing.assert_close(step[real], full[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(baked[real], full[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(full[1, -6:], alone, atol=ATOL, rtol=0)


def test_modulation_changes_the_output_in_every_topology():
    ids = torch.randint(0, 300, (1, 6))
    for overrides in TOPOLOGIES.values():
        model = tiny_model(**overrides)
        with torch.no_grad():
            on = model(input_ids=ids).logits
            for layer in model.model.layers:
                layer.modulation.scale.zero_()  # Δr = 0
            off = model(input_ids=ids).logits
        assert (on - off).abs().max() > 1e-4, overrides


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(jtokm_num_modes=0), "jtokm_num_modes"),
        (dict(jtokm_norm_eps=0.0), "jtokm_norm_eps"),
        (dict(jtokm_aux_loss_weight=-1e-4), "jtokm_aux_loss_weight"),
        (dict(use_token_generator=False), "requires `use_token_generator=True`"),
        (dict(jtokm_top_k=4), "1 <= jtokm_top_k < jtokm_num_experts"),
    ],
)
def test_config_errors_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        NeoLLMConfig(**{**TINY, **overrides})


def test_refuses_inputs_embeds():
    model = tiny_model(use_spelling_bee_embeddings=False)
    with pytest.raises(ValueError, match="use_jtokm=True"):
        model(inputs_embeds=torch.zeros(1, 3, 64))


def test_slmlab_train_logs_aux_loss(tmp_path):
    from slmlab import cli
    from slmlab.train.metrics import read_metrics

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(2):
        (corpus / f"w{i}.txt").write_text("To be, or not to be, that is the question.\n" * 30, encoding="utf-8")
    out = tmp_path / "run"
    args = ["--model", "neollm:neollm-tiny", "--data", str(corpus), "--out", str(out), "batch_size=2", "block_size=16",
            "eval_batches=1", "eval_every=0", "checkpoint_every=0", "progress=false", "tensorboard=false",
            f"data_cache={tmp_path / 'cache'}", "sample_tokens=2", "log_every=1", "--steps", "2",
            "model_config.use_token_generator=true", "model_config.use_jtokm=true", "model_config.generator_d_seed=8",
            "model_config.generator_num_modes=2", "model_config.generator_krank=8"]
    assert cli.main(["train", *args]) == 0
    records = read_metrics(out / "metrics.jsonl", "train")
    assert [r["step"] for r in records] == [1, 2]
    assert all(0 < r["aux_loss"] < r["loss"] and math.isfinite(r["aux_loss"]) for r in records)


def test_router_runs_in_fp32_under_bf16_autocast():
    model = tiny_model(use_spelling_bee_embeddings=False).train()
    mod, seen = model.model.layers[1].modulation, []
    balance = mod.balance_loss
    mod.balance_loss = lambda logits, chosen, ctx: seen.append(logits.dtype) or balance(logits, chosen, ctx)
    ids = torch.randint(0, 300, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=ids, labels=ids)
    assert seen == [torch.float32] and out.aux_loss.dtype == torch.float32
    out.loss.backward()
    assert torch.isfinite(out.loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
