"""PGSM: the shared family suite plus seed parity, retrieval modes, decode==recompute, presets."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from family_tester import ATOL, FamilyTester, left_pad
from slmlab.generation import generate
from slmlab.models.pgsm import (
    PGSMConfig,
    PGSMForCausalLM,
    audit_parameters,
    build_pgsm_model,
    config_from_seed,
    convert_seed_state_dict,
)
from slmlab.models.pgsm.positions import last_query_token_positions

TINY = dict(vocab_size=61, block_size=64, dim=32, layers=2, hidden=48, kernel_size=5, retrieval_dim=16, retrieval_heads=2)


def two_positions(ids: torch.Tensor) -> torch.Tensor:
    """``[B, 2]``: an early position per row and the last one (row 1 pads its second slot)."""
    b, t = ids.shape
    pos = torch.stack((torch.arange(b) * 3 % (t - 2) + 1, torch.full((b,), t - 1)), dim=1)
    if b > 1:
        pos[1, 1] = -1
    return pos


class TestPGSMFamily(FamilyTester):
    family = "pgsm"
    config_kwargs = TINY

    def forward_kwargs(self, ids):
        return {"retrieval_positions": two_positions(ids)}

    bad_configs = [
        (dict(retrieval_dim=30, retrieval_heads=4), "retrieval_dim must be divisible by retrieval_heads"),
        (dict(retrieval_dim=36, retrieval_heads=4), "must be even for RoPE"),
        (dict(dim=0), "dim must be a positive integer"),
        (dict(rope_layout="neox"), "rope_layout must be one of"),
    ]
    bad_inputs = [
        (dict(input_ids=torch.zeros(2, 6, dtype=torch.long), retrieval_positions=bad), ValueError, match)
        for bad, match in [
            (torch.tensor([6, 1]), r"must lie in \[-1, 6\)"),
            (torch.tensor([[1, 1], [2, 3]]), "repeats a position"),
            (torch.tensor([1.0, 2.0]), "integer tensor"),
            (torch.tensor([1, 2, 3]), r"shape \[batch\]"),
        ]
    ]

    # num_hidden_states: the suite's layers + 1 (the retrieval stage is part of the last layer's entry)

    draft_overrides = dict(layers=1)

    def attention_shapes(self, model, b, t, s):
        """The conv blocks have no attention: one entry, the retriever's (rows of tokens that do not read are 0)."""
        return [(b, model.config.retrieval_heads, t, s)]


def make(**overrides) -> PGSMForCausalLM:
    torch.manual_seed(0)
    model = PGSMForCausalLM(PGSMConfig(**{**TINY, **overrides})).eval()
    with torch.no_grad():  # make norms and biases matter
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def stepwise(model, ids, mask=None, prefill=1, kw=lambda sl: {}):
    """Prefill, then one token per call; ``kw(slice)`` gives each call's extra kwargs."""
    calls = [slice(0, prefill)] + [slice(t, t + 1) for t in range(prefill, ids.shape[1])]
    cache, logits = None, []
    for sl in calls:
        out = model(
            input_ids=ids[:, sl],
            attention_mask=None if mask is None else mask[:, : sl.stop],
            cache=cache,
            use_cache=True,
            **kw(sl),
        )
        cache = out.cache
        logits.append(out.logits)
    return torch.cat(logits, dim=1)


# -- seed parity -------------------------------------------------------------------------------
def seed_reference_logits(sd, cfg, ids, positions):
    """The seed's maths written out: LN -> causal depthwise conv -> tanh*sigmoid residual, SiLU-gated
    MLP; retriever with the seed's adjacent-pair RoPE over duplicated frequencies; tied head."""
    dim, heads = cfg["dim"], cfg["retrieval_heads"]
    hd = cfg["retrieval_dim"] // heads

    def ln(x, p):
        return F.layer_norm(x, (dim,), sd[p + ".weight"], sd[p + ".bias"])

    def lin(x, p):
        return x @ sd[p + ".weight"].T + sd[p + ".bias"]

    def block(x, p):
        h = ln(x, p + ".norm_state")
        w = sd[p + ".local_state.conv.weight"]
        conv = F.conv1d(F.pad(h.transpose(1, 2), (w.shape[-1] - 1, 0)), w, sd[p + ".local_state.conv.bias"], groups=dim)
        x = x + torch.tanh(lin(conv.transpose(1, 2), p + ".state_mix")) * torch.sigmoid(lin(h, p + ".state_gate"))
        v, g = lin(ln(x, p + ".norm_ff"), p + ".ff_in").chunk(2, -1)
        return x + lin(F.silu(g) * v, p + ".ff_out")

    def seed_rope(z, pos):  # z [..., hd] at integer positions pos (broadcastable)
        inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
        ang = pos[..., None].float() * torch.cat((inv, inv))
        pair = torch.stack((-z[..., 1::2], z[..., 0::2]), -1).flatten(-2)
        return z * ang.cos() + pair * ang.sin()

    x = sd["token_emb.weight"][ids]
    for i in range(cfg["layers"]):
        x = block(x, f"blocks.{i}")
    b, t, _ = x.shape
    h = ln(x, "retriever.norm")
    k = seed_rope(lin(h, "retriever.k").view(b, t, heads, hd), torch.arange(t)[:, None])
    v = lin(h, "retriever.v").view(b, t, heads, hd)
    out = x.clone()
    for r in range(b):
        p = int(positions[r])
        q = seed_rope(lin(h[r, p], "retriever.q").view(heads, hd), torch.tensor(p))
        att = torch.einsum("hd,thd->ht", q, k[r, :p]).div(math.sqrt(hd)).softmax(-1)
        read = lin(torch.einsum("ht,thd->hd", att, v[r, :p]).reshape(-1), "retriever.out")
        gate = torch.sigmoid(lin(torch.cat((h[r, p], read)), "retriever.gate"))
        out[r, p] = x[r, p] + gate * read
    x = block(out, "post_retrieval_block")
    return ln(x, "final_norm") @ sd["token_emb.weight"].T


def seed_state_dict(model_sd: dict) -> dict:
    """A state_dict with the seed's names (our names minus ``model.``)."""
    return {k.removeprefix("model."): v.clone() for k, v in model_sd.items()}


def test_seed_state_dict_gives_seed_logits():
    seed_cfg = {**TINY, "query_token_id": None}
    sd = seed_state_dict(make(rope_layout="seed").state_dict())
    model = PGSMForCausalLM(config_from_seed(seed_cfg)).eval()
    missing = model.load_state_dict(convert_seed_state_dict(sd), strict=True)
    assert not missing.missing_keys
    ids = torch.randint(0, 61, (3, 20))
    positions = torch.tensor([19, 7, 12])
    with torch.no_grad():
        got = model(input_ids=ids, retrieval_positions=positions).logits
        seed_logits, seed_loss = model.seed_forward(ids, ids, retrieval_positions=positions)
    ref = seed_reference_logits(sd, seed_cfg, ids, positions)
    assert (got - ref).abs().max() <= ATOL
    assert torch.equal(seed_logits, got)
    # the seed's loss compares position t's logits with labels[t] (no shift inside)
    torch.testing.assert_close(seed_loss, F.cross_entropy(got.reshape(-1, 61), ids.reshape(-1)), atol=ATOL, rtol=0)


def test_default_rope_is_a_rotation_and_seed_layout_is_not():
    from slmlab.models.pgsm.retriever import HalfPairRotary, SeedPairRotary

    model = make()
    cos, sin = model.model.retriever.rotary(torch.arange(50)[None])
    x = torch.randn(1, 1, 50, 8)
    ratio = lambda rot: rot(x, cos, sin).norm(dim=-1) / x.norm(dim=-1)  # noqa: E731
    torch.testing.assert_close(ratio(HalfPairRotary()), torch.ones(1, 1, 50), atol=1e-5, rtol=0)
    assert (ratio(SeedPairRotary()) - 1).abs().max() > 0.01


# -- retrieval semantics -----------------------------------------------------------------------
def test_retriever_reads_strictly_backward():
    retriever = make().model.retriever
    torch.manual_seed(1)
    x = torch.randn(1, 10, 32)
    pos_ids = torch.arange(10)[None]
    y = retriever(x, torch.tensor([[1]]), pos_ids)
    # position 1 may read only position 0: softmax over one key is 1, so the read is W_o v_0
    h = retriever.norm(x)
    read = retriever.out(retriever.v(h[:, 0]))
    gate = torch.sigmoid(retriever.gate(torch.cat((h[:, 1], read), -1)))
    torch.testing.assert_close(y[:, 1], x[:, 1] + gate * read, atol=ATOL, rtol=0)
    assert torch.equal(torch.cat((y[:, :1], y[:, 2:]), 1), torch.cat((x[:, :1], x[:, 2:]), 1))
    # the future (and the position itself as a key) never changes what position 6 reads
    base = retriever(x, torch.tensor([[6]]), pos_ids)[:, 6]
    other = x.clone()
    other[:, 7:] = torch.randn(1, 3, 32)
    torch.testing.assert_close(retriever(other, torch.tensor([[6]]), pos_ids)[:, 6], base, atol=ATOL, rtol=0)
    # position 0 has nothing to read: unchanged and finite (the seed gives NaN everywhere)
    assert torch.equal(retriever(x, torch.tensor([[0]]), pos_ids), x)


def test_several_positions_equal_the_sum_of_single_reads():
    retriever = make().model.retriever
    x = torch.randn(2, 12, 32)
    pos_ids = torch.arange(12).expand(2, 12)
    both = retriever(x, torch.tensor([[3, 9], [11, -1]]), pos_ids)
    one = retriever(x, torch.tensor([[3], [11]]), pos_ids)
    two = retriever(x, torch.tensor([[9], [-1]]), pos_ids)
    torch.testing.assert_close(both, one + two - x, atol=ATOL, rtol=0)


def test_rows_without_positions_keep_every_parameter_in_the_graph():
    """A batch whose rows all pad (-1) still reaches every parameter (DDP needs the same graph on
    every rank) and leaves the stream unchanged before the post-retrieval block."""
    model = make().train()
    ids = torch.randint(0, 61, (2, 9))
    model(input_ids=ids, labels=ids, retrieval_positions=torch.full((2, 2), -1), use_cache=False).loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    retriever = model.model.retriever
    x = torch.randn(2, 9, 32)
    assert torch.equal(retriever(x, torch.full((2, 2), -1), torch.arange(9).expand(2, 9)), x)


def test_retrieval_off_is_exactly_the_backbone():
    on = make()
    off = PGSMForCausalLM(PGSMConfig(**{**TINY, "use_sparse_retrieval": False})).eval()
    off.load_state_dict(on.state_dict(), strict=False)
    ids = torch.randint(0, 61, (2, 15))
    with torch.no_grad():
        backbone = off(input_ids=ids).logits
        assert torch.equal(on(input_ids=ids).logits, backbone)  # no positions resolved -> no retriever, no post block
        assert torch.equal(off(input_ids=ids, retrieval_positions=torch.tensor([3, 4])).logits, backbone)
        assert not torch.equal(on(input_ids=ids, retrieval_positions=torch.tensor([3, 4])).logits, backbone)


def test_query_token_detection_matches_the_seed_rule():
    ids = torch.tensor([[5, 9, 5, 1, 2], [1, 2, 3, 4, 6], [9, 9, 9, 9, 9]])
    got = last_query_token_positions(ids, 9, None)[:, 0]
    expected = []
    for row in ids.tolist():  # the seed's rule, one row at a time: last match, else the last token
        hits = [i for i, tok in enumerate(row) if tok == 9]
        expected.append(hits[-1] if hits else len(row) - 1)
    assert got.tolist() == expected
    model = make(query_token_id=9, auto_retrieve_on_query_token=True, retrieve_at_last_token_if_unspecified=True)
    with torch.no_grad():
        auto = model(input_ids=ids).logits
        explicit = model(input_ids=ids, retrieval_positions=torch.tensor(expected)).logits
        flat = model(input_ids=ids, retrieval_positions=torch.tensor(expected)[:, None]).logits
    assert torch.equal(auto, explicit) and torch.equal(flat, explicit)


# -- decode == recompute, per retrieval mode --------------------------------------------------
@pytest.mark.parametrize("prefill, every_step, rope_layout", [(1, True, "rotate_half"), (6, True, "seed"), (6, False, "rotate_half")])
def test_decode_equals_recompute_explicit_positions(prefill, every_step, rope_layout):
    """Positions are absolute columns: given at every call (HF ``generate``) or once at prefill (the
    lean loop, the cache remembers them), each is applied when its token is processed."""
    model = make(rope_layout=rope_layout)
    ids = torch.randint(1, 61, (2, 14))
    pos = torch.tensor([[2, 9, 13], [6, -1, 11]])
    with torch.no_grad():
        full = model(input_ids=ids, retrieval_positions=pos, use_cache=False).logits
        step = stepwise(
            model, ids, prefill=prefill, kw=lambda sl: {"retrieval_positions": pos} if every_step or sl.start == 0 else {}
        )
    assert (step - full).abs().max() <= ATOL


@pytest.mark.parametrize("prefill", [1, 6])
def test_decode_equals_recompute_last_token_mode(prefill):
    model = make(retrieve_at_last_token_if_unspecified=True)
    ids = torch.randint(1, 61, (2, 12))
    with torch.no_grad():
        step = stepwise(model, ids, prefill=prefill)
        # every call retrieves at its last token: the prefill's last token and each decoded token
        cols = torch.arange(prefill - 1, 12).expand(2, -1)
        full = model(input_ids=ids, retrieval_positions=cols, use_cache=False).logits
    assert (step - full).abs().max() <= ATOL


def test_decode_equals_recompute_query_token_mode():
    model = make(query_token_id=7, auto_retrieve_on_query_token=True)
    ids = torch.randint(8, 61, (2, 12))
    ids[0, 3] = 7
    ids[1, 9] = 7
    with torch.no_grad():
        step = stepwise(model, ids, prefill=6)
        # prefill: row 0 retrieves at its query token (3), row 1 has none in the prompt -> its last token (5);
        # afterwards only query tokens retrieve (row 1 at 9)
        cols = torch.tensor([[3, -1], [5, 9]])
        full = model(input_ids=ids, retrieval_positions=cols, use_cache=False).logits
    assert (step - full).abs().max() <= ATOL


@pytest.mark.parametrize("mode", ["explicit", "last_token"])
def test_left_padded_decode_and_rows_alone(mode):
    model = make(retrieve_at_last_token_if_unspecified=mode == "last_token")
    rows = [torch.randint(1, 61, (n,)) for n in (12, 8, 5)]
    ids, mask = left_pad(rows)
    pads = torch.tensor([12 - len(r) for r in rows])[:, None]
    if mode == "explicit":  # positions within each row, shifted by its padding
        within = torch.tensor([[1, 6], [3, 7], [4, -1]])
        kw_step = lambda sl: {"retrieval_positions": pos}  # noqa: E731
    else:  # prefill (7 tokens) retrieves at column 6, then every decoded token
        within = torch.arange(6, 12).expand(3, -1) - pads
        kw_step = lambda sl: {}  # noqa: E731
    pos = torch.where(within >= 0, within + pads, torch.full_like(within, -1))
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, retrieval_positions=pos, use_cache=False).logits
        step = stepwise(model, ids, mask, prefill=7, kw=kw_step)
        real = mask.bool()
        assert (step[real] - full[real]).abs().max() <= ATOL
        for i, row in enumerate(rows):  # a padded row equals the same row alone, unpadded
            alone = model(input_ids=row[None], retrieval_positions=within[i : i + 1].clamp(min=-1), use_cache=False)
            assert (full[i, 12 - len(row) :] - alone.logits[0]).abs().max() <= ATOL


def test_query_token_mode_ignores_padding_and_decodes_like_recompute():
    model = make(query_token_id=0, auto_retrieve_on_query_token=True)  # the pad id is the query id
    rows = [torch.randint(1, 61, (10,)), torch.randint(1, 61, (6,))]
    rows[0][[2, 8]] = 0
    rows[1][4] = 0
    ids, mask = left_pad(rows)  # row 1 has 4 pads (id 0) before its tokens, and no query in the prompt
    with torch.no_grad():
        step = stepwise(model, ids, mask, prefill=7)
        # prefill: row 0's query token (2); row 1 has only pads with the query id -> its last token (6);
        # decoding: query tokens only (column 8 in both rows)
        full = model(input_ids=ids, attention_mask=mask, retrieval_positions=torch.tensor([[2, 8], [6, 8]])).logits
    real = mask.bool()
    assert (step[real] - full[real]).abs().max() <= ATOL


def test_generation_with_retrieval_lean_loop_equals_hf_generate():
    model = make(retrieve_at_last_token_if_unspecified=True)
    ids = torch.randint(1, 61, (1, 6))
    assert torch.equal(generate(model, ids, 8), model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False))
    plain = make()
    kw = {"retrieval_positions": torch.tensor([[2, 5]])}
    ours = generate(plain, ids, 8, model_kwargs=kw)
    hf = plain.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, **kw)
    assert torch.equal(ours, hf)
    # and both equal greedy recomputation of the whole window with the same positions
    seq = ids
    with torch.no_grad():
        for _ in range(8):
            nxt = plain(input_ids=seq, use_cache=False, **kw).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat((seq, nxt), 1)
    assert torch.equal(seq, ours)
    # beams and several samples per prompt reorder/repeat every cached state, the positions included
    beams = plain.generate(ids, max_new_tokens=4, num_beams=3, num_return_sequences=2, do_sample=False, **kw)
    samples = plain.generate(ids, max_new_tokens=4, do_sample=True, num_return_sequences=3, **kw)
    assert beams.shape == (2, 10) and samples.shape == (3, 10)


def test_enabling_retrieval_after_an_unretrieved_prefix_raises():
    model = make()
    ids = torch.randint(1, 61, (1, 6))
    out = model(input_ids=ids, use_cache=True)
    with pytest.raises(ValueError, match="cached prefix was run without retrieval"):
        model(input_ids=ids[:, :1], cache=out.cache, retrieval_positions=torch.tensor([6]))


# -- presets, configs, validation ---------------------------------------------------------------
@pytest.mark.parametrize(
    "size, kwargs, expected",
    [
        ("tiny", dict(block_size=512), 737_280),
        ("small", dict(block_size=1024), 1_720_704),
        ("medium", {}, 11_991_680),
        ("large", {}, 81_589_504),
    ],
)
def test_preset_parameter_counts(size, kwargs, expected):
    cfg = getattr(PGSMConfig, size)(vocab_size=256, **kwargs)
    with torch.device("meta"):
        model = PGSMForCausalLM(cfg)
    rows = audit_parameters(model)
    assert rows["Total"] == expected == sum(p.numel() for p in model.parameters())
    parts = ("Tied embedding table", "Backbone blocks", "Retriever", "Post-retrieval block", "Final norm")
    assert sum(rows[k] for k in parts) == expected


def test_presets_and_factory_follow_the_seed():
    cfg = PGSMConfig.medium(vocab_size=300, kernel_size=9)
    assert (cfg.block_size, cfg.dim, cfg.kernel_size, cfg.vocab_size, cfg.retrieval_heads) == (2048, 384, 9, 300, 8)
    model = build_pgsm_model("Tiny ", vocab_size=100, block_size=64, layers=1, use_post_retrieval_block=False)
    assert (model.config.block_size, model.config.layers, model.config.dim) == (64, 1, 128)
    with pytest.raises(ValueError, match="Unknown model size"):
        build_pgsm_model("huge")
    with pytest.raises(TypeError, match="unknown PGSMConfig field"):
        PGSMConfig.small(widht=3)


def test_tie_word_embeddings_is_the_hf_name_of_tie_weights():
    assert PGSMConfig(**TINY, tie_word_embeddings=False).tie_weights is False
    assert PGSMConfig(**TINY).tie_word_embeddings is True
    untied = PGSMForCausalLM(PGSMConfig(**TINY, tie_weights=False))
    assert untied.lm_head.weight is not untied.model.token_emb.weight
    with pytest.raises(ValueError, match="contradicts"):
        PGSMConfig(**TINY, tie_weights=True, tie_word_embeddings=False)


def test_a_seed_config_untied_after_construction_saves_and_loads_untied(tmp_path):
    """The seed's ``tie_weights=True``, then ``tie_word_embeddings=False``: one switch, so the untied
    model saves (config.json keeps only ``tie_word_embeddings``) and loads back untied, same logits."""
    cfg = PGSMConfig(**TINY, tie_weights=True)
    cfg.tie_word_embeddings = False
    assert cfg.tie_weights is False
    torch.manual_seed(0)
    model = PGSMForCausalLM(cfg).eval()
    assert model.lm_head.weight is not model.model.token_emb.weight
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["tie_word_embeddings"] is False and "tie_weights" not in saved
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert again.config.tie_weights is False and again.lm_head.weight is not again.model.token_emb.weight
    torch.testing.assert_close(again.lm_head.weight, model.lm_head.weight, atol=0, rtol=0)
    ids = torch.randint(0, TINY["vocab_size"], (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits, atol=ATOL, rtol=0)
    cfg.tie_weights = True  # the seed's name sets the same switch
    assert cfg.tie_word_embeddings is True


def test_retrieval_shape_is_only_checked_when_the_retriever_is_built():
    cfg = PGSMConfig(**{**TINY, "retrieval_dim": 30, "retrieval_heads": 4, "use_sparse_retrieval": False})
    model = PGSMForCausalLM(cfg)
    assert model.model.retriever is None and model.model.post_retrieval_block is None


def test_automatic_retrieval_needs_input_ids():
    auto = make(query_token_id=3, auto_retrieve_on_query_token=True)
    with pytest.raises(ValueError, match="needs input_ids"):
        auto(inputs_embeds=torch.zeros(1, 4, 32))


def test_conv_init_follows_the_seed_and_survives_save_load(tmp_path):
    model = PGSMForCausalLM(PGSMConfig(**TINY))
    conv = model.model.blocks[0].local_state.conv
    bound = 1 / math.sqrt(TINY["kernel_size"])  # PyTorch's Conv1d default, kept by the seed
    assert conv.weight.abs().max() <= bound and conv.weight.std() > bound / 4
    assert model.model.final_norm.weight.eq(1).all() and model.model.blocks[0].ff_in.bias.eq(0).all()
    model.save_pretrained(tmp_path)
    again = PGSMForCausalLM.from_pretrained(tmp_path)
    assert torch.equal(again.model.blocks[0].local_state.conv.weight, conv.weight)
    assert again.lm_head.weight is again.model.token_emb.weight


# -- output_hidden_states ------------------------------------------------------------------------
@pytest.mark.parametrize("retrieval", ["none", "explicit", "last_token", "off"])
def test_hidden_states_are_one_per_layer_plus_the_embeddings(retrieval):
    """``len(hidden_states) == layers + 1`` whether or not a token retrieves: the embeddings, then one
    entry per backbone block, where the last block's entry includes the retrieval stage (retriever +
    post-retrieval block) and is the returned, normalised state; also per decoding step."""
    overrides = {"last_token": dict(retrieve_at_last_token_if_unspecified=True), "off": dict(use_sparse_retrieval=False)}
    model = make(layers=3, **overrides.get(retrieval, {}))
    ids = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(0))
    kw = {"retrieval_positions": two_positions(ids)} if retrieval == "explicit" else {}
    out = model(input_ids=ids, output_hidden_states=True, use_cache=True, **kw)
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1 == 4
    plain = model(input_ids=ids, output_hidden_states=True, retrieval_positions=None, use_cache=False)
    torch.testing.assert_close(out.hidden_states[0], plain.hidden_states[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(out.hidden_states[1], plain.hidden_states[1], atol=ATOL, rtol=0)  # block 0
    final = model.model(input_ids=ids, use_cache=False, **kw).last_hidden_state  # retrieval included
    torch.testing.assert_close(out.hidden_states[-1], final, atol=ATOL, rtol=0)
    step = model(input_ids=ids[:, -1:], cache=out.cache, use_cache=True, output_hidden_states=True)
    assert len(step.hidden_states) == model.config.num_hidden_layers + 1
