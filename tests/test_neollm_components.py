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
