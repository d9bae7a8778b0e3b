"""NeoLLM default model: the shared family suite on a tiny default-stack config, plus the parameter
budget of the seed's defaults, init identities after from_pretrained, one training step, the baked
embedding table, the standard topology and the refusal of options not built yet."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from family_tester import ATOL, FamilyTester, decode_stepwise
from slmlab.models.neollm import PRESETS, NeoLLMConfig, NeoLLMForCausalLM, audit_parameters

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


# -- the seed's default budget ----------------------------------------------------------------------
def test_default_parameter_budget_matches_the_spec():
    with torch.device("meta"):
        rows = audit_parameters(NeoLLMForCausalLM(NeoLLMConfig()))
        no_fan = audit_parameters(NeoLLMForCausalLM(NeoLLMConfig(fan_ratio=0.0, fan_ratio_ffn=0.0)))
    assert rows["Total"] == 113_131_288 and no_fan["Total"] == 104_469_400
    assert rows["Attention total"] == 14_322_304
    assert rows["MLP total"] == 32_685_720
    assert rows["SiameseNorm / residual norms total"] == 44_544
    assert rows["embedding table W_E"] == rows["lm_head (untied)"] == 64402 * 512
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


# -- other built switches: the hand-picked variants are rows of tests/test_neollm_flags.py ------------
def test_standard_topology_has_no_siamese_modules():
    model = tiny_model(use_siamesenorm=False, use_embedding_input_norm=False)
    names = [n for n, _ in model.named_parameters()]
    assert not any("attn_fuse" in n or "x_scale" in n for n in names)
    assert isinstance(model.model.layers[0].residual.attn_norm, nn.Identity)
    assert sum("residual" in n or "readout" in n for n in names) == 2 * 4 - 1 + 1


# -- options of NeoLLM parts 2/3 are refused at construction --------------------------------------------
@pytest.mark.parametrize(
    "overrides",
    [
        dict(use_siamesenorm=False, use_laurel=True, use_laurel_rw=True),
        dict(use_siamesenorm=False, use_attn_res=True),
        dict(use_siamesenorm=False, use_stack_memory=True),
        dict(use_lns=True),
        dict(use_gpas=True),
        dict(use_token_generator=True),
        dict(use_token_generator=True, use_jtokm=True),
        dict(polynorm_exclusive=True),
        dict(use_embedding_multipliers=True),
        dict(use_mea_attention=True),
    ],
)
def test_unbuilt_options_raise_not_implemented(overrides):
    with pytest.raises(NotImplementedError, match="NeoLLM part 2/3"):
        NeoLLMForCausalLM(NeoLLMConfig(**{**TINY, **overrides}))


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
