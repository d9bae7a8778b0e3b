"""NeoLLM residual / embedding / MLP components, each alone: shapes, gradients, the spec's
identity-at-init properties and reference values, position-wise causality, parameter counts."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from transformers import PreTrainedTokenizerFast
from transformers.activations import XIELUActivation

from slmlab.models.neollm.components import (
    XIELU,
    FANFeatures,
    NeoLLMMLP,
    NoFAN,
    NoSpellingBee,
    PreNormResidual,
    ResidualState,
    RowColMultipliedLinear,
    RowMultipliedLinear,
    SiameseReadout,
    SiameseResidual,
    SpellingBee,
    make_fan,
    multiplied_linear,
)
from slmlab.models.neollm.components.byte_table import piece_to_bytes, tokenizer_bytes, unicode_to_byte

ATOL = 1e-6


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def assert_all_grads(module: nn.Module) -> None:
    missing = [n for n, p in module.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing, f"no gradient for {missing}"


# -- learnable multipliers ------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [RowMultipliedLinear, RowColMultipliedLinear])
@pytest.mark.parametrize("bias", [False, True])
def test_multipliers_at_init_equal_plain_linear(cls, bias):
    layer = cls(12, 7, bias=bias)
    plain = nn.Linear(12, 7, bias=bias)
    plain.load_state_dict({k: v for k, v in layer.state_dict().items() if "multiplier" not in k})
    x = torch.randn(3, 5, 12)
    torch.testing.assert_close(layer(x), plain(x), atol=ATOL, rtol=0)


def test_multipliers_formula_gradient_and_folding():
    layer = RowColMultipliedLinear(6, 4, bias=True)
    with torch.no_grad():
        layer.row_multiplier.uniform_(0.5, 2.0)
        layer.col_multiplier.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 6)
    ref = layer.row_multiplier * ((x * layer.col_multiplier) @ layer.weight.T) + layer.bias
    out = layer(x)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)
    out.square().sum().backward()
    assert_all_grads(layer)
    layer.fold_multipliers()
    assert torch.all(layer.row_multiplier == 1) and torch.all(layer.col_multiplier == 1)
    torch.testing.assert_close(layer(x), ref, atol=1e-5, rtol=0)


def test_multiplier_factory_placement():
    assert type(multiplied_linear(4, 5, row=True, enabled=False)) is nn.Linear
    assert type(multiplied_linear(4, 5, row=False)) is nn.Linear
    assert type(multiplied_linear(4, 5, row=True)) is RowMultipliedLinear
    assert type(multiplied_linear(4, 5, row=True, col=True)) is RowColMultipliedLinear
    assert set(multiplied_linear(4, 5, row=True, enabled=False).state_dict()) == {"weight"}
    with pytest.raises(ValueError, match="row=True"):
        multiplied_linear(4, 5, row=False, col=True)


# -- xIELU ----------------------------------------------------------------------------------------
def test_xielu_reference_values_at_init():
    act = XIELU()
    got = act(torch.tensor([2.0, 1.0, -1.0]))
    torch.testing.assert_close(got, torch.tensor([4.2, 1.3, -0.2057]), atol=1e-4, rtol=0)
    assert n_params(act) == 2 and all(p.dtype == torch.float32 for p in act.parameters())


def test_xielu_matches_transformers_and_gets_gradients():
    ours, ref = XIELU(), XIELUActivation(dtype=torch.float32)
    with torch.no_grad():
        ours.alpha_p.fill_(0.3)
        ours.alpha_n.fill_(-0.2)
        ref.alpha_p.fill_(0.3)
        ref.alpha_n.fill_(-0.2)
    x = torch.randn(4, 33) * 3
    torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)
    ours(x).sum().backward()
    assert_all_grads(ours)
    assert ours(x.to(torch.bfloat16)).dtype == torch.bfloat16


# -- FAN ------------------------------------------------------------------------------------------
def test_fan_shapes_formula_and_off_switch():
    fan = FANFeatures(16, 0.25)
    assert fan.out_features == 20 and fan.periodic_dim == 4
    assert n_params(fan) == 16 * 4 + 16 * 12 + 12
    u = torch.randn(2, 5, 16)
    p = u @ fan.periodic_proj.weight.T
    ref = torch.cat([p.cos(), p.sin(), u @ fan.linear_proj.weight.T + fan.linear_proj.bias], -1)
    torch.testing.assert_close(fan(u), ref, atol=ATOL, rtol=0)
    fan(u).sum().backward()
    assert_all_grads(fan)
    off = make_fan(16, 0.0)
    assert isinstance(off, NoFAN) and off.out_features == 16 and off(u) is u
    assert isinstance(make_fan(16, 0.03), NoFAN)  # int(16 * 0.03) = 0 periodic channels
    with pytest.raises(ValueError, match="FAN ratio"):
        make_fan(16, 1.0)


# -- MLP ------------------------------------------------------------------------------------------
def test_mlp_default_parameter_count():
    with torch.device("meta"):
        mlp = NeoLLMMLP(512, 1536, fan_ratio=0.0625, dropout=0.1)
    assert n_params(mlp) == 2_723_810
    assert mlp.fan.out_features == 544
    with torch.device("meta"):
        plain = NeoLLMMLP(512, 1536, fan_ratio=0.0, use_multipliers=False)
    assert n_params(plain) == 3 * 512 * 1536 + 2


def test_mlp_formula_gradients_and_positionwise():
    torch.manual_seed(0)
    mlp = NeoLLMMLP(16, 24, fan_ratio=0.25, dropout=0.5).eval()
    u = torch.randn(2, 6, 16)
    x = mlp.fan(u)
    g = x @ mlp.gate_proj.weight.T
    ref = (XIELU()(g) * (x @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
    torch.testing.assert_close(mlp(u), ref, atol=1e-5, rtol=0)  # multipliers at 1 = plain matrices
    other = u.clone()
    other[:, 3] += 1.0
    diff = (mlp(other) - mlp(u)).abs().amax(-1)
    assert torch.all(diff[:, [0, 1, 2, 4, 5]] == 0) and torch.all(diff[:, 3] > 0)
    mlp.train()
    torch.manual_seed(1)
    mlp(u).square().sum().backward()
    assert_all_grads(mlp)
    assert not torch.allclose(mlp(u), mlp.eval()(u))  # dropout is active in training only


# -- residual flows -------------------------------------------------------------------------------
# The flows update a ResidualState in place; these adapters give the tests a functional view.
def attn_input(flow, streams):
    state = ResidualState(streams=tuple(streams))
    u = flow.attn_input(state)
    return state.streams, u


def mlp_input(flow, streams):
    state = ResidualState(streams=tuple(streams))
    u = flow.mlp_input(state)
    return state.streams, u


def add(flow, streams, update):
    state = ResidualState(streams=tuple(streams))
    flow.add(state, update)
    return state.streams


def rms(t, eps=1e-6):
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)


def test_siamese_layer_formula_and_parameters():
    torch.manual_seed(0)
    res = SiameseResidual(8, layer_idx=2, x_scale_init=0.7)
    assert n_params(res) == 7 * 8
    assert torch.all(res.attn_fuse.x_scale == 0.7)  # s starts at siamese_attn_x_scale_init
    x, y, a, m = (torch.randn(2, 3, 8) for _ in range(4))
    (x1, y1), u = attn_input(res, (x, y))
    torch.testing.assert_close(x1, rms(x), atol=ATOL, rtol=0)
    torch.testing.assert_close(u, rms(0.7 * rms(x) + rms(y)), atol=ATOL, rtol=0)
    x2, y2 = add(res, (x1, y1), a)
    c = math.sqrt(2 * 3)
    torch.testing.assert_close(x2, x1 + a / c, atol=ATOL, rtol=0)
    torch.testing.assert_close(y2, y + a, atol=ATOL, rtol=0)
    (x3, _), u = mlp_input(res, (x2, y2))
    torch.testing.assert_close(u, rms(rms(x2) + rms(y2)), atol=ATOL, rtol=0)
    out = add(res, mlp_input(res, (x2, y2))[0], m)
    (out[0].sum() + out[1].sum() + u.square().sum()).backward()


def test_siamese_variants():
    assert n_params(SiameseResidual(8, 0, normalized_input=False)) == 5 * 8
    no_depth = SiameseResidual(8, 5, depth_scaling=False)
    assert no_depth.inv_depth_scale == 1.0
    raw = SiameseResidual(8, 0, input_norm=False)  # layer 0 without the embedding input norm
    assert n_params(raw) == 3 * 8 and not list(raw.attn_fuse.parameters())
    e = torch.randn(2, 3, 8)
    streams, u = attn_input(raw, (e, e))
    assert u is e and streams[0] is e
    assert n_params(SiameseResidual(8, 1, input_norm=False)) == 7 * 8  # only layer 0 is affected


def test_siamese_gradient_reaches_every_parameter():
    torch.manual_seed(0)
    res, readout = SiameseResidual(8, 0), SiameseReadout(8)
    e = torch.randn(2, 4, 8)
    lin = nn.Linear(8, 8)
    start = readout.start(e)
    assert isinstance(start, ResidualState) and start.v0 is None
    streams, u = attn_input(res, start.streams)
    streams = add(res, streams, lin(u))
    streams, u = mlp_input(res, streams)
    streams = add(res, streams, lin(u).tanh())
    readout.hidden(ResidualState(streams)).pow(3).sum().backward()
    assert_all_grads(res)
    assert_all_grads(readout)
    assert n_params(readout) == 3 * 8


def test_prenorm_residual_and_layer0_switch():
    res = PreNormResidual(8, 0)
    h, a = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    streams, u = attn_input(res, (h,))
    torch.testing.assert_close(u, rms(h), atol=ATOL, rtol=0)
    assert add(res, streams, a)[0].equal(h + a)
    raw = PreNormResidual(8, 0, input_norm=False)
    assert attn_input(raw, (h,))[1] is h and n_params(raw) == 8


# -- Spelling Bee ---------------------------------------------------------------------------------
def spelling_reference(bee: SpellingBee, e_tok, ids, table):
    d = bee.hidden_size
    inv = 10000.0 ** (-torch.arange(0, d, 2).float() / d)
    out = e_tok.clone()
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1]):
            raw = table[int(ids[b, t])][:16]
            if not raw:
                continue
            acc = torch.zeros(d)
            for i, byte in enumerate(raw, start=1):
                v = bee.byte_embed.weight[byte]
                v1, v2 = v[: d // 2], v[d // 2 :]
                c, s = torch.cos(i * inv), torch.sin(i * inv)
                acc = acc + torch.cat([v1 * c - v2 * s, v2 * c + v1 * s])
            out[b, t] = 0.5 * (e_tok[b, t] + acc / math.sqrt(len(raw)))
    return out


def test_spelling_bee_formula_length_zero_and_gradients():
    torch.manual_seed(0)
    table = [b"", b"a", b"hello", "été".encode(), bytes(range(40, 60)), b"\x00\xff"]
    bee = SpellingBee(8, 12)
    bee.set_byte_table_from_bytes(table)  # ids 6, 7 are left empty
    ids = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 2]])
    e_tok = torch.randn(2, 4, 12, requires_grad=True)
    out = bee(e_tok, ids)
    ref = spelling_reference(bee, e_tok.detach(), ids, table + [b"", b""])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    assert out[0, 0].equal(e_tok[0, 0]) and out[1, 2].equal(e_tok[1, 2])  # n = 0: no halving
    assert int(bee.byte_len[4]) == 16  # truncated to 16 bytes
    out.square().sum().backward()
    assert_all_grads(bee)
    assert n_params(bee) == 256 * 12


def test_spelling_bee_requires_the_byte_table_and_off_switch():
    bee = SpellingBee(5, 8)
    with pytest.raises(RuntimeError, match="set_byte_table"):
        bee(torch.zeros(1, 2, 8), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="byte strings"):
        bee.set_byte_table_from_bytes([b"x"] * 6)
    off = NoSpellingBee()
    e = torch.randn(1, 2, 8)
    assert off(e, torch.zeros(1, 2, dtype=torch.long)) is e
    with pytest.raises(ValueError, match="use_spelling_bee_embeddings=False"):
        off.set_byte_table(None)


def test_spelling_bee_table_survives_state_dict_round_trip():
    bee = SpellingBee(4, 8)
    bee.set_byte_table_from_bytes([b"ab", b"c"])
    fresh = SpellingBee(4, 8)
    fresh.load_state_dict(bee.state_dict())
    ids = torch.tensor([[0, 1, 2]])
    e = torch.randn(1, 3, 8)
    torch.testing.assert_close(fresh(e, ids), bee(e, ids), atol=0, rtol=0)


def test_byte_table_rules_from_a_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {"<pad>": 0, "<0x41>": 1, "Ġhello": 2, "▁world": 3, "plain": 4, "ĊĠ": 5, "<extra>": 6}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<pad>")), pad_token="<pad>")
    tok.add_special_tokens({"additional_special_tokens": ["<extra>"]})
    got = tokenizer_bytes(tok, vocab_size=9)
    assert got == [b"", b"A", b" hello", b" world", b"plain", b"\n ", b"", b"", b""]
    bee = SpellingBee(9, 8)
    bee.set_byte_table(tok)
    assert bee.byte_len.tolist() == [0, 1, 6, 6, 5, 2, 0, 0, 0]


def test_gpt2_byte_alphabet_is_a_bijection():
    table = unicode_to_byte()
    assert len(table) == 256 and sorted(table.values()) == list(range(256))
    assert piece_to_bytes("Ā") == b"\x00" and piece_to_bytes("<0xff>") == b"\xff"


def test_residual_flows_and_spelling_bee_are_positionwise():
    torch.manual_seed(0)
    bee = SpellingBee(10, 8)
    bee.set_byte_table_from_bytes([bytes([t]) * (t % 4) for t in range(10)])
    ids = torch.randint(0, 10, (2, 6))
    e = torch.randn(2, 6, 8)
    for flow in (SiameseResidual(8, 1), PreNormResidual(8, 1)):
        streams = (e, e * 2)[: 2 if isinstance(flow, SiameseResidual) else 1]
        base = add(flow, *mlp_input(flow, attn_input(flow, streams)[0]))
        moved = tuple(s.clone() for s in streams)
        moved[0][:, 4] += 1.0
        out = add(flow, *mlp_input(flow, attn_input(flow, moved)[0]))
        for a, b in zip(base, out):
            assert torch.equal(a[:, :4], b[:, :4]) and torch.equal(a[:, 5:], b[:, 5:])
    other = ids.clone()
    other[:, 4] = (other[:, 4] + 1) % 10
    d = (bee(e, ids) - bee(e, other)).abs().amax(-1)
    assert torch.all(d[:, :4] == 0) and torch.all(d[:, 5:] == 0)


# == part 3a: LAUREL, AttnRes, StackMemory, LNS, GPAS, PolyNorm, embedding multipliers ==============
from slmlab.models.neollm import PRESETS, NeoLLMConfig  # noqa: E402
from slmlab.models.neollm.components import (  # noqa: E402
    GPAS,
    AttnResReadout,
    AttnResResidual,
    DepthAttention,
    EmbeddingMultipliers,
    LaurelResidual,
    LayerFlow,
    LayerNormScaling,
    NormScaledFlow,
    PolyNorm,
    Readout,
    StackMemory,
    make_activation,
)
from slmlab.models.neollm.components.attn_res import block_of  # noqa: E402
from slmlab.models.neollm.components.laurel import laurel_a_init  # noqa: E402

FLOW_VARIANTS = {
    "laurel-rw": dict(use_siamesenorm=False, use_laurel=True, use_laurel_rw=True),
    "laurel-lr": dict(use_siamesenorm=False, use_laurel=True, use_laurel_lr=True, laurel_lr_rank=8),
    "laurel-rw-lr": dict(use_siamesenorm=False, use_laurel=True, use_laurel_rw=True, use_laurel_lr=True, laurel_lr_rank=8),
    "attnres-full": dict(use_siamesenorm=False, use_attn_res=True, attn_res_num_blocks=0),
    "attnres-2": dict(use_siamesenorm=False, use_attn_res=True, attn_res_num_blocks=2),
    "stackmemory": dict(use_siamesenorm=False, use_stack_memory=True),
    "lns-gpas-siamese": dict(use_lns=True, use_gpas=True),
    "lns-gpas-standard": dict(use_siamesenorm=False, use_lns=True, use_gpas=True),
    "gpas-attnres": dict(use_siamesenorm=False, use_attn_res=True, use_gpas=True),
}


def flow_stack(**overrides):
    """The per-layer flows and the read-out of a tiny config, with fixed position-wise sublayers."""
    config = NeoLLMConfig(**{**PRESETS["neollm-tiny"], **overrides})
    torch.manual_seed(0)
    flows = nn.ModuleList(LayerFlow.from_config(config, i) for i in range(config.num_hidden_layers))
    readout = Readout.from_config(config)
    subs = nn.ModuleList(nn.Linear(config.hidden_size, config.hidden_size) for _ in range(2 * config.num_hidden_layers))
    return config, flows, readout, subs


def run_stack(flows, readout, subs, e):
    state = readout.start(e)
    for i, flow in enumerate(flows):
        flow.add(state, torch.tanh(subs[2 * i](flow.attn_input(state))))
        flow.add(state, subs[2 * i + 1](flow.mlp_input(state)))
    return readout.hidden(state), readout.stream(state)


@pytest.mark.parametrize("name", FLOW_VARIANTS)
def test_new_flows_shape_gradients_and_positionwise(name):
    config, flows, readout, subs = flow_stack(**FLOW_VARIANTS[name])
    with torch.no_grad():  # move the zero inits (LAUREL B, AttnRes w, GPAS α) so every parameter is reachable
        for p in [*flows.parameters(), *readout.parameters()]:
            p.add_(0.1 * torch.randn_like(p))
    e = torch.randn(2, 6, config.hidden_size)
    h, stream = run_stack(flows, readout, subs, e)
    assert h.shape == stream.shape == e.shape
    (h.square().sum() + stream.sum()).backward()
    assert_all_grads(flows[1:])
    assert_all_grads(readout)
    silent = [n for n, p in flows[0].named_parameters() if p.grad is None or not torch.any(p.grad != 0)]
    assert all("attn_agg" in n for n in silent), silent  # layer 0 aggregates one source: weight 1, no gradient
    moved = e.clone()
    moved[:, 4] += 1.0
    with torch.no_grad():
        out, _ = run_stack(flows, readout, subs, moved)
        d = (out - h).abs().amax(-1)
    assert torch.all(d[:, :4] == 0) and torch.all(d[:, 5:] == 0) and torch.all(d[:, 4] > 0)


def test_flow_choice_table():
    kinds = {name: type(flow_stack(**over)[1][1]).__name__ for name, over in FLOW_VARIANTS.items()}
    assert kinds["laurel-rw"] == "LaurelResidual" and kinds["attnres-2"] == "AttnResResidual"
    assert kinds["stackmemory"] == "StackMemoryResidual" and kinds["lns-gpas-siamese"] == "NormScaledFlow"
    assert type(flow_stack()[1][0]) is SiameseResidual  # no LNS/GPAS: the bare flow, state-dict keys unchanged
    assert type(flow_stack(use_siamesenorm=False)[2]).__name__ == "PreNormReadout"
    assert type(flow_stack(**FLOW_VARIANTS["attnres-2"])[2]) is AttnResReadout


# -- LAUREL -----------------------------------------------------------------------------------------
def test_laurel_a_init_and_lr_with_zero_b_is_the_plain_residual():
    a = laurel_a_init(10, 4)
    assert a.shape == (10, 4) and torch.all((a != 0).sum(1) == 1)
    assert torch.allclose(a[7, 3], torch.tensor(1 / math.sqrt(40))) and a[7, 2] == 0
    torch.manual_seed(0)
    flow, plain = LaurelResidual(16, 1, rank=4, lr=True), PreNormResidual(16, 1)
    h, f = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    for sub in (attn_input, mlp_input):
        streams, u = sub(flow, (h,))
        torch.testing.assert_close(u, sub(plain, (h,))[1], atol=0, rtol=0)
        state = ResidualState(streams=streams, sublayer=0 if sub is attn_input else 1)
        flow.add(state, f)
        torch.testing.assert_close(state.streams[0], h + f, atol=ATOL, rtol=0)
    assert n_params(flow) - n_params(plain) == 2 * 2 * 4 * 16


def test_laurel_rw_and_rw_lr_formulas():
    torch.manual_seed(0)
    flow = LaurelResidual(16, 2, rank=4, rw=True, lr=True)
    with torch.no_grad():
        for combine in flow.laurel:
            combine.low_rank.lr_b.normal_()
            combine.weights.rw_logits.normal_()
    h, f = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    for k in (0, 1):
        c = flow.laurel[k]
        alpha, beta = c.weights.rw_logits.softmax(0)
        ref = alpha * f + beta * (h + (h @ c.low_rank.lr_a) @ c.low_rank.lr_b)
        state = ResidualState(streams=(h,), sublayer=k)
        flow.add(state, f)
        torch.testing.assert_close(state.streams[0], ref, atol=ATOL, rtol=0)
    rw = LaurelResidual(16, 0, rw=True)
    state = ResidualState(streams=(h,))
    rw.add(state, f)
    torch.testing.assert_close(state.streams[0], 0.5 * (h + f), atol=ATOL, rtol=0)  # logits 0: α = β = ½
    assert n_params(rw) - n_params(PreNormResidual(16, 0)) == 4


# -- AttnRes ----------------------------------------------------------------------------------------
def test_depth_attention_at_init_is_the_mean_and_formula():
    agg = DepthAttention(8)
    sources = [torch.randn(2, 3, 8) * (i + 1) for i in range(4)]
    torch.testing.assert_close(agg(sources), torch.stack(sources).mean(0), atol=ATOL, rtol=0)
    with torch.no_grad():
        agg.query.normal_()
        agg.key_weight.uniform_(0.5, 1.5)
    logits = torch.stack([(rms(v) * agg.key_weight) @ agg.query for v in sources])
    ref = (logits.softmax(0)[..., None] * torch.stack(sources)).sum(0)
    torch.testing.assert_close(agg(sources), ref, atol=ATOL, rtol=0)
    assert agg.query.dtype == agg.key_weight.dtype == torch.float32 and n_params(agg) == 16


def tagged_run(num_blocks: int, layers: int = 5):
    """Run AttnRes flows with one-hot tagged updates (channel 0 = e, attention of layer l = 1 + 2l,
    MLP of layer l = 2 + 2l) and record, per aggregation, the channels present in each source."""
    dim = 2 * layers + 1
    flows = [AttnResResidual(dim, i, layers, num_blocks) for i in range(layers)]
    readout = AttnResReadout(dim)
    log = []

    def record(module, args):
        log.append([{int(c) for c in torch.nonzero(s[0, 0]).flatten()} for s in args[0]])

    for m in [*flows, readout]:
        for agg in m.modules():
            if isinstance(agg, DepthAttention):
                agg.register_forward_pre_hook(record)
    eye = torch.eye(dim)[:, None, None, :]  # [dim, 1, 1, dim]
    state = readout.start(eye[0])
    for i, flow in enumerate(flows):
        flow.attn_input(state)
        flow.add(state, eye[1 + 2 * i])
        flow.mlp_input(state)
        flow.add(state, eye[2 + 2 * i])
    readout.hidden(state)
    return log, state


def test_attn_res_block_bookkeeping_by_hand():
    r = lambda a, b: set(range(a, b + 1))  # noqa: E731
    log, state = tagged_run(num_blocks=2)  # L = 5, N = 2: blocks of 2 layers, the last takes 3 (l = 2, 3, 4)
    assert log == [
        [{0}], [{0}, {1}],                                      # layer 0: attention, MLP
        [{0}, r(1, 2)], [{0}, r(1, 3)],                         # layer 1
        [{0}, r(1, 4)], [{0}, r(1, 4), {5}],                    # layer 2 closes block 0
        [{0}, r(1, 4), r(5, 6)], [{0}, r(1, 4), r(5, 7)],       # layer 3
        [{0}, r(1, 4), r(5, 8)], [{0}, r(1, 4), r(5, 9)],       # layer 4
        [{0}, r(1, 4), r(5, 10)],                               # read-out
    ]
    log, state = tagged_run(num_blocks=0)  # full AttnRes: every layer is a block, L + 1 sources at the read-out
    assert log[2] == [{0}, {1, 2}] and log[3] == [{0}, {1, 2}, {3}]
    assert log[-1] == [{0}, {1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}]
    assert len(state.sources) == 5 and len(state.streams) == 1
    assert [block_of(i, 3, 7) for i in range(3)] == [block_of(i, 3, 3) for i in range(3)] == [0, 1, 2]  # N > L acts as N = L
    assert [block_of(i, 12, 4) for i in range(12)] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3


def test_attn_res_readout_stream_is_the_plain_residual_sum():
    _, state = tagged_run(num_blocks=2)
    torch.testing.assert_close(AttnResReadout(11).stream(state), torch.ones(1, 1, 11), atol=0, rtol=0)


# -- StackMemory ------------------------------------------------------------------------------------
def forced(sm: StackMemory, action: int, h: torch.Tensor) -> StackMemory:
    """Action logits forced to one action: rows ``head·3 + action`` read channel 0 with weight 1e4."""
    with torch.no_grad():
        sm.action_proj.weight.zero_()
        sm.action_proj.weight[action::3, 0] = 1e4
        h[..., 0] = 1.0
    return sm


def test_stack_memory_push_pop_noop_by_hand():
    torch.manual_seed(0)
    sm = StackMemory(16, 8, 2, 5)  # H = 2, d_s = 4, S = 5
    h = torch.randn(2, 3, 16)
    stack, mask = torch.randn(2, 3, 2, 5, 4), torch.tensor([1.0, 1.0, 0.5, 0.0, 0.0]).expand(2, 3, 2, 5)
    k = sm.down_proj(h).unflatten(-1, (2, 4))
    new_s, new_m = sm.update(stack, mask, forced(sm, 0, h).actions(h), k)  # push
    torch.testing.assert_close(new_s, torch.cat([k[..., None, :], stack[..., :-1, :]], -2), atol=0, rtol=0)
    assert torch.equal(new_m[0, 0, 0], torch.tensor([1.0, 1.0, 1.0, 0.5, 0.0]))
    new_s, new_m = sm.update(stack, mask, forced(sm, 1, h).actions(h), k)  # pop
    torch.testing.assert_close(new_s[..., :-1, :], stack[..., 1:, :], atol=0, rtol=0)
    assert torch.all(new_s[..., -1, :] == 0) and torch.equal(new_m[0, 0, 0], torch.tensor([1.0, 0.5, 0.0, 0.0, 0.0]))
    new_s, new_m = sm.update(stack, mask, forced(sm, 2, h).actions(h), k)  # no-op
    assert torch.equal(new_s, stack) and torch.equal(new_m, mask)


def test_stack_memory_empty_slots_get_no_read_weight_and_formula():
    torch.manual_seed(0)
    sm = StackMemory(16, 8, 2, 5)
    stack = torch.randn(2, 3, 2, 5, 4)
    mask = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0]).expand(2, 3, 2, 5)
    with torch.no_grad():
        sm.gate.zero_()  # equal scores: an empty slot gets 1e-6 of a full slot's weight (the log(mask) floor)
    w = sm.read_weights(stack, mask)
    torch.testing.assert_close(w[..., 2:], 1e-6 * w[..., :1].expand(-1, -1, -1, 3), atol=1e-12, rtol=1e-5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 2), atol=ATOL, rtol=0)
    with torch.no_grad():
        sm.gate.normal_()
        sm.res_weight.fill_(0.7)
    h = torch.randn(2, 3, 16)
    out, s2, m2 = sm(h, stack, mask)
    p = (sm.action_proj(h).unflatten(-1, (2, 3)) / 2.0).softmax(-1)  # temperature sqrt(d_s) = 2
    ref_s, ref_m = sm.update(stack, mask, p, sm.down_proj(h).unflatten(-1, (2, 4)))
    omega = (ref_s @ sm.gate + ref_m.clamp(min=1e-6).log()).softmax(-1)
    r = (omega[..., None] * ref_s).sum(-2).flatten(-2)
    torch.testing.assert_close(out, h + 0.7 * sm.up_proj(r), atol=ATOL, rtol=0)
    torch.testing.assert_close(s2, ref_s, atol=ATOL, rtol=0)
    assert n_params(StackMemory(512, 32, 4, 16)) == 38_921


# -- LNS and GPAS -----------------------------------------------------------------------------------
def test_lns_scales_inputs_without_parameters():
    lns = LayerNormScaling(3)
    u = torch.randn(2, 4, 8)
    torch.testing.assert_close(lns(u), u / 2.0, atol=0, rtol=0)
    assert n_params(lns) == 0 and not lns.state_dict() and lns(u.bfloat16()).dtype == torch.bfloat16
    flow = NormScaledFlow(PreNormResidual(8, 3), lns, GPAS())
    streams, got = attn_input(flow, (u,))
    torch.testing.assert_close(got, rms(u) / 2.0, atol=ATOL, rtol=0)


def test_gpas_identity_at_init_and_gradient_passes_unchanged():
    gpas = GPAS()
    x = torch.randn(2, 4, 8, requires_grad=True)
    g = torch.randn(2, 4, 8)
    y = gpas(x, 1)
    assert torch.equal(y, x)
    y.backward(g)
    assert torch.equal(x.grad, g)  # autograd: the stop-gradient keeps dy/dx = I
    with torch.no_grad():
        gpas.alpha.copy_(torch.tensor([0.3, -0.7]))
    x.grad = None
    gpas.alpha.grad = None
    y = gpas(x, 1)
    torch.testing.assert_close(y, (1 - torch.nn.functional.silu(torch.tensor(-0.7))) * x, atol=ATOL, rtol=0)
    y.backward(g)
    assert torch.equal(x.grad, g)
    s = torch.sigmoid(torch.tensor(-0.7))
    dsilu = s * (1 + -0.7 * (1 - s))
    torch.testing.assert_close(gpas.alpha.grad, torch.tensor([0.0, float(-dsilu * (g * x.detach()).sum())]), atol=1e-4, rtol=1e-5)
    assert n_params(gpas) == 2 and gpas.alpha.dtype == torch.float32


def test_gpas_junctions_siamese_y_and_attnres_partial_sum():
    torch.manual_seed(0)
    gpas = GPAS()
    with torch.no_grad():
        gpas.alpha.fill_(1.0)
    keep = 1 - torch.nn.functional.silu(torch.tensor(1.0))
    flow = NormScaledFlow(SiameseResidual(8, 1), nn.Identity(), gpas)
    x, y, a = torch.randn(3, 2, 4, 8)
    state = ResidualState(streams=(x, y))
    flow.attn_input(state)
    bx = state.streams[0]
    flow.add(state, a)
    torch.testing.assert_close(state.streams[0], bx + a / 2.0, atol=ATOL, rtol=0)  # c_1 = sqrt(4)
    torch.testing.assert_close(state.streams[1], keep * (y + a), atol=ATOL, rtol=0)
    flow = NormScaledFlow(AttnResResidual(8, 0, 2, 0), nn.Identity(), gpas)
    state = AttnResReadout(8).start(x)
    flow.attn_input(state)
    flow.add(state, a)
    torch.testing.assert_close(state.streams[0], keep * a, atol=ATOL, rtol=0)
    assert torch.equal(state.sources[0], x)


# -- PolyNorm and embedding multipliers ---------------------------------------------------------------
def test_polynorm_at_init_is_the_mean_of_normalised_powers():
    act = make_activation("xielu", polynorm_exclusive=True, eps=1e-6)
    assert isinstance(act, PolyNorm) and n_params(act) == 4
    x = torch.randn(2, 5, 12)
    ref = (rms(x) + rms(x * x) + rms(x**3)) / 3
    torch.testing.assert_close(act(x), ref, atol=ATOL, rtol=0)
    with torch.no_grad():
        act.weight.copy_(torch.tensor([0.2, -0.5, 1.5]))
        act.bias.fill_(0.25)
    torch.testing.assert_close(act(x), 0.2 * rms(x) - 0.5 * rms(x * x) + 1.5 * rms(x**3) + 0.25, atol=1e-5, rtol=0)
    act(x).sum().backward()
    assert_all_grads(act)
    assert act(x.bfloat16()).dtype == torch.bfloat16
    moved = x.clone()
    moved[:, 3] += 1.0
    d = (act(moved) - act(x)).abs().amax(-1)  # normalised over the feature axis only: position-wise
    assert torch.all(d[:, :3] == 0) and torch.all(d[:, 4:] == 0)
    mlp = NeoLLMMLP(16, 24, polynorm_exclusive=True, hidden_act="xielu")
    assert isinstance(mlp.act_fn, PolyNorm)


def test_embedding_multipliers_at_one_equal_the_lookup_and_formula():
    torch.manual_seed(0)
    emb, mult = nn.Embedding(10, 6), EmbeddingMultipliers(10, 6)
    ids = torch.randint(0, 10, (2, 5))
    assert torch.equal(mult(emb(ids), ids), emb(ids)) and n_params(mult) == 16
    with torch.no_grad():
        mult.row_multiplier.uniform_(0.5, 2)
        mult.col_multiplier.uniform_(0.5, 2)
    ref = mult.row_multiplier[ids][..., None] * emb.weight[ids] * mult.col_multiplier
    out = mult(emb(ids), ids)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)
    out.sum().backward()
    assert_all_grads(mult)
    other = ids.clone()
    other[:, 2] = (other[:, 2] + 1) % 10
    with torch.no_grad():
        d = (mult(emb(other), other) - out).abs().amax(-1)
    assert torch.all(d[:, :2] == 0) and torch.all(d[:, 3:] == 0)
