"""NeoLLM default model: the shared family suite on a tiny default-stack config, plus the parameter
budget of the seed's defaults, init identities after from_pretrained, one training step, the baked
embedding table and the standard topology (the generator and JTok-M: tests/models/neollm/test_neollm_generator.py,
tests/models/neollm/test_neollm_jtokm.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from family_tester import ATOL, FamilyTester, decode_stepwise
from slmlab.models.neollm import PRESETS, NeoLLMConfig, NeoLLMForCausalLM, audit_parameters
from slmlab.models.neollm.components.laurel import laurel_a_init

TINY = PRESETS["neollm-tiny"]


def toy_byte_table(vocab_size: int) -> list[bytes]:
    """Deterministic byte strings of lengths 0..7 (id 0 gets none, like a special token)."""
    return [bytes((t * 7 + i) % 256 for i in range(t % 8)) for t in range(vocab_size)]


def tiny_model(**overrides) -> NeoLLMForCausalLM:
    torch.manual_seed(0)
    model = NeoLLMForCausalLM(NeoLLMConfig(**{**TINY, **overrides})).eval()
    if model.config.use_spelling_bee_embeddings:
        model.model.spelling_bee.set_byte_table_from_bytes(toy_byte_table(model.config.vocab_size))
    return model


class TestNeoLLMFamily(FamilyTester):
    family = "neollm"
    config_kwargs = TINY
    skip_common_bad_inputs = ("inputs_embeds must have shape",)  # Spelling Bee (on by default) needs ids
    bad_inputs = [(dict(inputs_embeds=torch.zeros(1, 4, 64)), ValueError, "cannot be used with use_spelling_bee")]
    # Spelling Bee needs ids: any inputs_embeds is refused before its shape is looked at
    skip_common_bad_inputs = ("inputs_embeds must have shape",)

    def make_model(self, **overrides):
        return tiny_model(**overrides)

    def attention_shapes(self, model, b, t, s):
        """Per layer ``[B, H, T·P, S·P]``: IHA layers attend over ``P`` pseudo-tokens per token."""
        heads = model.config.num_attention_heads
        return [(b, heads, t * layer.self_attn.pseudo_heads, s * layer.self_attn.pseudo_heads) for layer in model.model.layers]


# -- the seed's default budget ----------------------------------------------------------------------
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_affine_attention_weights_are_the_weights_on_v(attn_implementation):
    """With affine-scaled attention, ``output_attentions`` reports ``α·p + β`` over the visible keys:
    each row sums to ``α_ma`` (1 at init), and the logits equal the fused path's."""
    model = tiny_model(use_affine_scaled_attention=True)
    model.config._attn_implementation = attn_implementation
    model = NeoLLMForCausalLM(model.config).eval()
    model.model.spelling_bee.set_byte_table_from_bytes(toy_byte_table(model.config.vocab_size))
    with torch.no_grad():
        for layer in model.model.layers:  # move alpha_ma off 1 so the row sums check the affine term
            layer.self_attn.affine.alpha_ma.fill_(0.8)
    ids = torch.randint(1, model.config.vocab_size, (2, 12))
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True)
        plain = model(input_ids=ids)
    torch.testing.assert_close(out.logits, plain.logits, atol=ATOL, rtol=0)
    for weights in out.attentions:
        torch.testing.assert_close(weights.sum(-1), torch.full(weights.shape[:-1], 0.8), atol=ATOL, rtol=0)


def test_assisted_decoding_without_iha_and_momentum_equals_greedy():
    """Without IHA pseudo-tokens and the momentum shear a NeoLLM cache is plain K/V: drafts roll back."""
    flags = dict(use_iha=False, use_momentum_attention=False)
    model, draft = tiny_model(**flags), tiny_model(**flags, num_hidden_layers=2)
    assert model.crop_refusal() is None and "momentum" in tiny_model(use_iha=False).crop_refusal()
    with torch.no_grad():  # a draft that often disagrees, so verification rolls tokens back
        generator = torch.Generator().manual_seed(1)
        for p in draft.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=generator))
    ids = torch.randint(1, model.config.vocab_size, (1, 6))
    greedy = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False)
    expected = model.generate(ids, **greedy)
    assert not torch.equal(draft.generate(ids, **greedy), expected)
    assert torch.equal(model.generate(ids, assistant_model=draft, **greedy), expected)
    assert torch.equal(model.generate(ids, prompt_lookup_num_tokens=3, **greedy), expected)


def test_default_parameter_budget_matches_the_spec():
    with torch.device("meta"):
        rows = audit_parameters(NeoLLMForCausalLM(NeoLLMConfig()))
        no_fan = audit_parameters(NeoLLMForCausalLM(NeoLLMConfig(fan_ratio=0.0, fan_ratio_ffn=0.0)))
    assert rows["Total"] == 113_131_288 and no_fan["Total"] == 104_469_400
    assert rows["Attention total"] == 14_322_304
    assert rows["MLP total"] == 32_685_720
    assert rows["SiameseNorm / residual norms total"] == 44_544
    assert rows["Embedding table"] == rows["LM head (untied)"] == 64402 * 512
    assert rows["Spelling Bee byte table"] == 256 * 512
    assert rows["Without W_E and lm_head"] == 47_183_640
    assert rows["mlp: FAN_ffn"] == 12 * 262_624 and rows["mlp: xIELU"] == 24
    assert rows["attention: FAN_attn"] == 12 * 262_592 and rows["attention: q_proj multipliers"] == 12 * 1024
    assert rows["attention: IHA mix"] + rows["attention: IHA collapse"] == 10 * 320
    assert rows["attention: REPO / GRAPE"] == 8 * (65_792 + 32)
    assert rows["attention: Hadamard o_proj (alpha, beta)"] == 12 * 1024
    parts = [v for k, v in rows.items() if not (k.endswith("total") or k in ("Total", "Without W_E and lm_head"))]
    assert sum(parts) == rows["Total"]  # the component rows partition the total


# -- initialisation ---------------------------------------------------------------------------------
def check_special_inits(model: NeoLLMForCausalLM) -> None:
    std = model.config.initializer_range
    for name, p in model.named_parameters():
        if "multiplier" in name or name.endswith("x_scale") or "norm" in name.split(".")[-2]:
            assert torch.all(p == 1), name
        elif name.endswith(".act_fn.alpha_p") or name.endswith(".act_fn.alpha_n"):
            continue
        elif p.dim() == 2 and ("proj" in name or "embed" in name or name.startswith("lm_head")):
            assert p.abs().max() <= 2 * std + 1e-7, name  # truncated normal at ±2σ
    act = model.model.layers[0].mlp.act_fn
    torch.testing.assert_close(act(torch.tensor([2.0, 1.0, -1.0])), torch.tensor([4.2, 1.3, -0.2057]), atol=1e-4, rtol=0)


def test_special_inits_survive_post_init_and_from_pretrained(tmp_path):
    model = tiny_model(siamese_attn_x_scale_init=1.0)
    check_special_inits(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    model.save_pretrained(tmp_path)
    loaded = NeoLLMForCausalLM.from_pretrained(tmp_path).eval()
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), f"{name} changed by from_pretrained"


def test_siamese_scale_init_value_is_kept():
    model = tiny_model(siamese_attn_x_scale_init=0.5)
    assert torch.all(model.model.layers[1].residual.attn_fuse.x_scale == 0.5)


# -- training ---------------------------------------------------------------------------------------
def test_one_training_step_lowers_the_loss():
    model = tiny_model()
    ids = torch.randint(1, model.config.vocab_size, (4, 16), generator=torch.Generator().manual_seed(3))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with torch.no_grad():
        before = model(input_ids=ids, labels=ids).loss
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        after = model(input_ids=ids, labels=ids).loss
    assert after < before - 1e-3


def test_num_items_in_batch_sums_then_divides():
    model = tiny_model()
    ids = torch.randint(1, model.config.vocab_size, (2, 10))
    mean = model(input_ids=ids, labels=ids).loss
    summed = model(input_ids=ids, labels=ids, num_items_in_batch=2 * 9 * 2).loss
    torch.testing.assert_close(summed, mean / 2, atol=ATOL, rtol=0)


# -- Spelling Bee in the model ----------------------------------------------------------------------
def test_forward_without_byte_table_raises():
    torch.manual_seed(0)
    model = NeoLLMForCausalLM(NeoLLMConfig(**TINY))
    with pytest.raises(RuntimeError, match="set_byte_table"):
        model(input_ids=torch.ones(1, 3, dtype=torch.long))


def test_baked_table_equals_live_path_and_is_dropped():
    model = tiny_model()
    ids = torch.randint(0, model.config.vocab_size, (2, 7))
    live = model(input_ids=ids).logits
    table = model.bake_inference_table(chunk_size=128)
    assert table.shape == (model.config.vocab_size, model.config.hidden_size)
    torch.testing.assert_close(model(input_ids=ids).logits, live, atol=ATOL, rtol=0)
    torch.testing.assert_close(decode_stepwise(model, ids, prefill=4), live, atol=ATOL, rtol=0)
    with torch.no_grad():  # a stale bake would hide this change
        model.model.embed_tokens.weight.add_(1.0)
    model.train().eval()
    assert model.model.baked_embeddings is None
    model.bake_inference_table()
    model.model.spelling_bee.set_byte_table_from_bytes([b"z"] * 5)
    fresh = model(input_ids=ids).logits  # new table -> live path, bake ignored
    model.model.drop_inference_table()
    torch.testing.assert_close(model(input_ids=ids).logits, fresh, atol=0, rtol=0)
    model.bake_inference_table()
    model.load_state_dict(model.state_dict())
    assert model.model.baked_embeddings is None


def test_inputs_embeds_needs_spelling_bee_off():
    model = tiny_model()
    with pytest.raises(ValueError, match="use_spelling_bee_embeddings=True"):
        model(inputs_embeds=torch.zeros(1, 3, model.config.hidden_size))
    plain = tiny_model(use_spelling_bee_embeddings=False)
    ids = torch.randint(0, plain.config.vocab_size, (2, 7))
    by_ids = plain(input_ids=ids).logits
    by_embeds = plain(inputs_embeds=plain.model.embed_tokens(ids)).logits
    torch.testing.assert_close(by_embeds, by_ids, atol=ATOL, rtol=0)


# -- other built switches: the hand-picked variants are rows of tests/models/neollm/test_neollm_flags.py ------------
def test_standard_topology_has_no_siamese_modules():
    model = tiny_model(use_siamesenorm=False, use_embedding_input_norm=False)
    names = [n for n, _ in model.named_parameters()]
    assert not any("attn_fuse" in n or "x_scale" in n for n in names)
    assert isinstance(model.model.layers[0].residual.attn_norm, nn.Identity)
    assert sum("residual" in n or "readout" in n for n in names) == 2 * 4 - 1 + 1


def test_cli_audit_prints_the_component_budget(capsys):
    from slmlab import cli

    assert cli.main(["audit", "neollm"]) == 0
    out = capsys.readouterr().out
    assert "113,131,288" in out and "attention: REPO / GRAPE" in out and "mlp: FAN_ffn" in out


def test_byte_tokenizer_table_and_text_generation_pipeline():
    from transformers import pipeline

    from slmlab.data.tokenizers import byte_tokenizer

    tok = byte_tokenizer()
    torch.manual_seed(0)
    model = NeoLLMForCausalLM(NeoLLMConfig(**{**TINY, "vocab_size": len(tok)})).eval()
    model.model.spelling_bee.set_byte_table(tok)
    lengths = model.model.spelling_bee.byte_len
    assert all(int(lengths[i]) == 0 for i in tok.all_special_ids)
    assert int((lengths == 1).sum()) == len(tok) - len(tok.all_special_ids)
    out = pipeline("text-generation", model=model, tokenizer=tok)("To be", max_new_tokens=4, do_sample=False)
    assert out[0]["generated_text"].startswith("To be")


# -- residual flows, LNS, GPAS, PolyNorm, embedding multipliers (docs/neollm-residual.md) -------------
RESIDUAL_VARIANTS = {
    "laurel-rw": dict(use_siamesenorm=False, use_laurel=True, use_laurel_rw=True),
    "laurel-lr": dict(use_siamesenorm=False, use_laurel=True, use_laurel_lr=True, laurel_lr_rank=8),
    "laurel-rw-lr": dict(use_siamesenorm=False, use_laurel=True, use_laurel_rw=True, use_laurel_lr=True, laurel_lr_rank=8),
    "attnres-full": dict(use_siamesenorm=False, use_attn_res=True, attn_res_num_blocks=0),
    "attnres-2": dict(use_siamesenorm=False, use_attn_res=True, attn_res_num_blocks=2),
    "stackmemory": dict(use_siamesenorm=False, use_stack_memory=True, stack_d_model=16, num_mem_heads=2, stack_slots=4),
    "lns-gpas-siamese": dict(use_lns=True, use_gpas=True),
    "lns-gpas-standard": dict(use_siamesenorm=False, use_lns=True, use_gpas=True),
    "polynorm": dict(polynorm_exclusive=True),
    "embedding-multipliers": dict(use_embedding_multipliers=True),
}


def perturbed(model: NeoLLMForCausalLM) -> NeoLLMForCausalLM:
    """Move every parameter off its init (zero-init branches, unit multipliers) so the checks see the
    trained function, not an identity."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


@pytest.mark.parametrize("name", RESIDUAL_VARIANTS)
def test_residual_variants_decode_equals_prefill_left_padded(name):
    from family_tester import left_pad

    model = perturbed(tiny_model(**RESIDUAL_VARIANTS[name]))
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(1, model.config.vocab_size, (n,), generator=g) for n in (10, 7)]
    ids, mask = left_pad(rows)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        step = decode_stepwise(model, ids, mask, prefill=4)
        alone = model(input_ids=rows[1][None]).logits[0]
    real = mask.bool()
    torch.testing.assert_close(step[real], out.logits[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(out.logits[1, -7:], alone, atol=ATOL, rtol=0)
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1
    assert all(h.shape == (2, 10, model.config.hidden_size) for h in out.hidden_states)


def test_embedding_multipliers_baked_equals_live_and_tied_head_has_none():
    model = perturbed(tiny_model(use_embedding_multipliers=True))
    ids = torch.randint(0, model.config.vocab_size, (2, 7))
    with torch.no_grad():
        live = model(input_ids=ids).logits
        model.bake_inference_table(chunk_size=64)
        torch.testing.assert_close(model(input_ids=ids).logits, live, atol=ATOL, rtol=0)
        torch.testing.assert_close(decode_stepwise(model, ids, prefill=3), live, atol=ATOL, rtol=0)
    tied = tiny_model(use_embedding_multipliers=True, tie_word_embeddings=True)
    assert not any("embed_multipliers" in n for n, _ in tied.named_parameters())
    assert tied.lm_head.weight is tied.model.embed_tokens.weight


def test_new_special_inits_survive_post_init_and_from_pretrained(tmp_path):
    overrides = dict(use_siamesenorm=False, use_laurel=True, use_laurel_rw=True, use_laurel_lr=True, laurel_lr_rank=8,
                     use_lns=True, use_gpas=True, polynorm_exclusive=True, use_embedding_multipliers=True)
    for extra in (overrides, dict(use_siamesenorm=False, use_attn_res=True), dict(use_siamesenorm=False, use_stack_memory=True)):
        model = tiny_model(**extra)
        model.post_init()
        for name, p in model.named_parameters():
            if name.endswith(("lr_b", "rw_logits", "gpas.alpha", "agg.query", "act_fn.bias")):
                assert torch.all(p == 0), name
            elif name.endswith(("key_weight", "res_weight")) or "multiplier" in name:
                assert torch.all(p == 1), name
            elif name.endswith("act_fn.weight"):
                assert torch.allclose(p, torch.full((3,), 1 / 3)), name
            elif name.endswith("lr_a"):
                assert torch.equal(p, laurel_a_init(*p.shape)), name
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
        model.save_pretrained(tmp_path / "m")
        loaded = NeoLLMForCausalLM.from_pretrained(tmp_path / "m").eval()
        for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
            assert torch.equal(a, b), f"{name} changed by from_pretrained"


def test_optional_parameter_counts_match_the_spec():
    def rows(**overrides):
        with torch.device("meta"):
            return audit_parameters(NeoLLMForCausalLM(NeoLLMConfig(**overrides)))

    off = dict(use_siamesenorm=False)
    assert rows(**off, use_laurel=True, use_laurel_lr=True)["residual: LAUREL (per layer)"] == 12 * 65_536
    assert rows(**off, use_laurel=True, use_laurel_rw=True, use_laurel_lr=True)["residual: LAUREL (per layer)"] == 12 * 65_540
    attn_res = rows(**off, use_attn_res=True)
    assert attn_res["residual: AttnRes pseudo-queries (per layer)"] == 12 * 2_048
    assert attn_res["residual: AttnRes pseudo-queries (read-out)"] == 1_024
    assert rows(**off, use_stack_memory=True)["residual: StackMemory (per layer)"] == 12 * 38_921
    both = rows(use_lns=True, use_gpas=True)
    assert both["residual: GPAS gates (per layer)"] == 24 and both["Total"] == 113_131_288 + 24  # LNS: 0
    poly = rows(polynorm_exclusive=True)
    assert poly["mlp: PolyNorm"] == 12 * 4 and poly["Total"] == 113_131_288 - 24 + 48
    assert rows(use_embedding_multipliers=True)["embedding multipliers (rho, kappa)"] == 64402 + 512


@pytest.mark.parametrize("extra", [{}, {"use_affine_scaled_attention": True}])
def test_meta_built_model_init_weights_restores_every_buffer(extra):
    """A model built on the meta device, materialised (``to_empty``) and initialised with
    ``init_weights()`` has the buffers of a normally built one: the Spelling Bee table empty and not
    ready (forward then asks for it, instead of reading garbage), the affine ``alpha_ma`` at 1."""
    config = NeoLLMConfig(**{**TINY, **extra})
    normal = NeoLLMForCausalLM(config)
    with torch.device("meta"):
        meta = NeoLLMForCausalLM(config)
    meta.to_empty(device="cpu")
    for _, buf in meta.named_buffers():  # what uninitialised memory may hold
        buf.fill_(7 if buf.dtype != torch.bool else True)
    meta.init_weights()
    want = dict(normal.named_buffers())
    got = dict(meta.named_buffers())
    assert got.keys() == want.keys() and any(".spelling_bee." in n for n in want)
    for name, buf in want.items():
        assert torch.equal(got[name], buf), name
    with pytest.raises(RuntimeError, match="set_byte_table"):
        meta(input_ids=torch.tensor([[1, 2, 3]]))
    meta.model.spelling_bee.set_byte_table_from_bytes(toy_byte_table(config.vocab_size))
    assert torch.isfinite(meta(input_ids=torch.tensor([[1, 2, 3]])).logits).all()


def test_from_pretrained_keeps_the_saved_byte_table_and_affine_mean(tmp_path):
    """``_init_weights`` resets those buffers only where nothing was loaded: a saved byte table and
    ``alpha_ma`` come back from ``from_pretrained`` as saved."""
    config = NeoLLMConfig(**{**TINY, "use_affine_scaled_attention": True})
    model = NeoLLMForCausalLM(config)
    model.model.spelling_bee.set_byte_table_from_bytes(toy_byte_table(config.vocab_size))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.affine.alpha_ma.fill_(0.75)
    model.save_pretrained(tmp_path)
    back = NeoLLMForCausalLM.from_pretrained(tmp_path)
    want = dict(model.named_buffers())
    for name, buf in back.named_buffers():
        assert torch.equal(buf, want[name]), name
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(back.eval()(input_ids=ids).logits, model.eval()(input_ids=ids).logits, atol=1e-5, rtol=0)
