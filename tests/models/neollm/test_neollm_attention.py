"""NeoLLM attention side: every component alone, the block against an eager reference written out
here, decode == prefill per layer kind (chunked, left padding, freeze rule), causality, padding,
identity-at-init properties, construction errors and the parameter count."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import transformers.initialization as hf_init

from slmlab.models.neollm.components import ForwardContext, ResidualState
from slmlab.models.neollm.components.attention import (
    ExclusiveSelfAttention,
    HadamardOutput,
    IHACollapse,
    IHAMix,
    MomentumShear,
    NeoLLMAttention,
    NeoLLMAttentionState,
    fwht,
    hadamard_matrix,
)
from slmlab.models.neollm.configuration_neollm import NeoLLMConfig

ATOL = 1e-5
# 3 layers, pattern "LG", REPO from layer 1: 'L'+RoPE, 'G'+REPO-GRAPE, 'L'+REPO-GRAPE (A§7.1).
TINY = dict(
    vocab_size=50, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, iha_local_global_pattern="LG", repo_start_layer=1, iha_sliding_window=4,
    attention_dropout=0.0,
)


def run(block, x, pos, mask=None, state=None, v0=None):
    """One block call with a fresh context and residual state -> (o, the state's v0 afterwards)."""
    carry = ResidualState(streams=(), v0=v0)
    return block(x, ForwardContext(pos, mask), state, carry), carry.v0


def tiny(**kw) -> NeoLLMConfig:
    return NeoLLMConfig(**{**TINY, **kw})


def perturbed(cfg: NeoLLMConfig, layer: int, scale: float = 0.2, seed: int = 0) -> NeoLLMAttention:
    """A block whose identity-initialised parameters are moved away from init (so tests see them)."""
    torch.manual_seed(seed)
    a = NeoLLMAttention(cfg, layer).eval()
    with torch.no_grad():
        for name, p in a.named_parameters():
            p.add_(torch.randn_like(p) * (scale if "proj" not in name or "w_" in name else 0.05))
    return a


def padded_batch(b=2, t=11, d=64, pad=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, d, generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[-1, :pad] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return x, pos, mask


# -- an eager reference of the whole block, written from the spec -------------------------------
def sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


def rotate_pairs(x, ang):
    """x [..., D], ang [..., r/2]: rotate pairs (i, i + r/2)."""
    half = ang.shape[-1]
    a, b, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    c, s = ang.cos(), ang.sin()
    return torch.cat((a * c - b * s, b * c + a * s, rest), -1)


def reference_block(a: NeoLLMAttention, cfg: NeoLLMConfig, x, pos, mask, window):
    """The block written out from the maths, options included: MEA as an einsum plus the head norm,
    GOAT as an explicit ``K(i, j)`` added to the scores, LUCID with a dense ``L`` and ``inv``, the
    affine term as explicit ``α·A + β`` at visible keys, routing as the explicit sum."""
    b, t, d = x.shape
    h, hk, hd, p = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, a.pseudo_heads
    hc = cfg.mea_component_key_value_heads if cfg.use_mea_attention else hk
    g = h // hk
    fan = a.fan
    per = x @ fan.periodic_proj.weight.T
    xf = torch.cat((per.cos(), per.sin(), x @ fan.linear_proj.weight.T + fan.linear_proj.bias), -1)
    qg = (xf @ a.q_proj.weight.T) * a.q_proj.row_multiplier
    qg = qg.view(b, t, h, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:]
    k = (xf @ a.k_proj.weight.T).view(b, t, hc, hd)
    v = (xf @ a.v_proj.weight.T).view(b, t, hc, hd)
    if a.kind == "none":
        qs, ks, vs = q[:, :, :, None], k[:, :, :, None], v[:, :, :, None]
    else:
        qs = torch.einsum("hpg,btgd->bthpd", a.iha.q_mix, q)
        ks = torch.einsum("hpg,btgd->bthpd", a.iha.k_mix, k)
        vs = torch.einsum("hpg,btgd->bthpd", a.iha.v_mix, v)
    if cfg.use_mea_attention:  # HLC: H_c component heads -> H_kv heads, in every slot
        ks = torch.einsum("btcpd,ch->bthpd", ks, a.mea.k_mix)
        vs = torch.einsum("btcpd,ch->bthpd", vs, a.mea.v_mix)
    r2 = cfg.rotary_dim // 2
    theta = 1.0 / (cfg.rope_theta ** (torch.arange(r2, dtype=torch.float64) * 2 / cfg.rotary_dim)).float()
    if cfg.is_repo_layer(a.layer_idx):
        c = a.positions.coords
        rfeat = F.silu(x @ c.w_g.weight.T) * (x @ c.w_c.weight.T)
        z = rfeat @ c.w_z.T  # [B,T,Hk]
        spec = theta[None] * (a.positions.spectrum.log_scale.exp() if cfg.use_repo_grape else 1.0)
        ang_k = z[..., None] * spec  # [B,T,Hk,r2]
        ang_q = ang_k[:, :, torch.arange(h) // g]
        qs, ks = rotate_pairs(qs, ang_q[:, :, :, None]), rotate_pairs(ks, ang_k[:, :, :, None])
    else:
        ang = pos.float()[..., None] * theta  # [B,T,r2]
        qs, ks = rotate_pairs(qs, ang[:, :, None, None]), rotate_pairs(ks, ang[:, :, None, None])
    if cfg.use_momentum_attention:
        m = torch.zeros(b, t)
        m[:, 1:] = (pos[:, 1:] != 0).float() * cfg.momentum_gamma
        m = m[:, :, None, None, None]
        qs = qs + m * (qs - torch.cat((torch.zeros_like(qs[:, :1]), qs[:, :-1]), 1))
        ks = ks + m * (ks - torch.cat((torch.zeros_like(ks[:, :1]), ks[:, :-1]), 1))
    ti, si = torch.arange(t)[:, None], torch.arange(t)[None, :]
    vis = (si <= ti)[None] & mask.bool()[:, None, :]
    if window is not None:
        vis = vis & (ti - si < window)[None]
    prior = torch.zeros(b, hk, t, t)  # GOAT log-prior K(i, j) per KV group
    if cfg.use_repo_goat_prior and cfg.is_repo_layer(a.layer_idx):
        gp, nf = a.goat, cfg.repo_goat_num_frequencies
        omega = cfg.rope_theta ** (-torch.arange(nf, dtype=torch.float32) / max(nf - 1, 1))
        du = z[:, :, None, :] - z[:, None, :, :]  # [B, i, j, Hk]: u_i − u_j
        rel = (gp.cos_weight * torch.cos(du[..., None] * omega) + gp.sin_weight * torch.sin(du[..., None] * omega)).sum(-1)
        sink = gp.sink_weight * torch.exp(-pos.float() / cfg.repo_goat_sink_decay)[:, None, :, None]
        key = torch.tanh(rfeat @ gp.key_bias.T)[:, None]  # [B, 1, j, Hk]
        prior = (rel + sink + key).permute(0, 3, 1, 2)
    if cfg.use_lucid_attention:  # V' = L^{-1} V per KV head and slot, dense L
        strict = (si < ti)[None] & mask.bool()[:, None, :] & mask.bool()[:, :, None]
        if window is not None:
            strict = strict & (ti - si < window)[None]
        vs = vs.clone()
        for kv in range(hk):
            for ps in range(p):
                kc = ks[:, :, kv, ps]
                kn = kc / (kc.pow(2).mean(-1, keepdim=True) + cfg.lucid_attention_eps).sqrt()
                lmat = torch.exp(kn @ kn.transpose(1, 2) / math.sqrt(hd) - math.sqrt(hd)) * strict + torch.eye(t)
                vs[:, :, kv, ps] = torch.linalg.inv(lmat) @ vs[:, :, kv, ps]
    affine = cfg.use_affine_scaled_attention
    if affine:
        alpha = 2 * torch.sigmoid(x @ a.affine.proj.weight.T + a.affine.proj.bias)  # [B, T, H]
    out = torch.zeros(b, t, h, p, hd)
    for hh in range(h):
        kv = hh // g
        for pq in range(p):
            scores = torch.einsum("btd,bspd->btsp", qs[:, :, hh, pq], ks[:, :, kv]) / math.sqrt(hd)
            scores = scores + prior[:, kv, :, :, None]
            scores = scores.masked_fill(~vis[..., None], float("-inf")).reshape(b, t, t * p)
            prob = scores.softmax(-1).nan_to_num(0.0)
            if affine:
                seen = vis[..., None].expand(b, t, t, p).reshape(b, t, t * p).float()
                beta = (a.affine.alpha_ma[hh] - alpha[:, :, hh, None]) / seen.sum(-1, keepdim=True).clamp(min=1)
                prob = alpha[:, :, hh, None] * prob + beta * seen
            out[:, :, hh, pq] = torch.einsum("bts,bsd->btd", prob, vs[:, :, kv].reshape(b, t * p, hd))
    o = torch.einsum("hgp,btgpd->bthd", a.collapse.collapse, out) if p > 1 else out[:, :, :, 0]
    if cfg.use_mea_attention:
        o = a.head_norm.weight * o / (o.pow(2).mean(-1, keepdim=True) + cfg.mea_groupnorm_eps).sqrt()
    if cfg.use_xsa:
        consumed = cfg.use_mea_attention or cfg.use_lucid_attention
        vr = (vs.mean(3) if consumed else v)[:, :, torch.arange(h) // g]
        o = o - (o * vr).sum(-1, keepdim=True) / (vr.pow(2).sum(-1, keepdim=True) + cfg.xsa_eps) * vr
    if cfg.use_directional_routing:
        rt = a.routing
        w = torch.sigmoid((x @ rt.router.weight.T + rt.router.bias) / cfg.directional_routing_temp)
        w = w.view(b, t, h, cfg.directional_routing_k)
        removed = torch.zeros_like(o)
        for kk in range(cfg.directional_routing_k):
            u = rt.directions[:, kk] / rt.directions[:, kk].norm(dim=-1, keepdim=True)  # [H, D]
            removed = removed + w[..., kk, None] * (o * u).sum(-1, keepdim=True) * u
        o = o - removed
    o = (o * torch.sigmoid(gate)).reshape(b, t, h * hd)
    return a.o_proj.alpha * (o @ sylvester(h * hd)) / math.sqrt(h * hd) + a.o_proj.beta


@pytest.mark.parametrize("layer", [0, 1, 2])
@pytest.mark.parametrize("extra", [{}, {"use_repo_grape": False}, {"use_momentum_attention": False, "use_xsa": False}])
def test_block_matches_eager_reference(layer, extra):
    cfg = tiny(**extra)
    a = perturbed(cfg, layer)
    x, pos, mask = padded_batch()
    with torch.no_grad():
        got, v0 = run(a, x, pos, mask)
        ref = reference_block(a, cfg, x, pos, mask, 4 if a.kind == "local" else None)
    assert v0 is None and got.shape == x.shape
    real = mask.bool()
    assert (got - ref)[real].abs().max() <= ATOL


def decode(a, x, pos, mask, chunks):
    st, outs, s = a.new_state(), [], 0
    for n in chunks:
        o, _ = run(a, x[:, s : s + n], pos[:, s : s + n], mask[:, : s + n], st)
        outs.append(o)
        s += n
    return torch.cat(outs, 1), st


@pytest.mark.parametrize("layer", [0, 1, 2])
@pytest.mark.parametrize("chunks", [[1] * 11, [5] + [1] * 6, [3, 4, 1, 3], [2, 9]])
@pytest.mark.parametrize("pseudo", [2, 1])
def test_decode_equals_prefill(layer, chunks, pseudo):
    cfg = tiny(iha_num_pseudo_heads=pseudo)
    a = perturbed(cfg, layer)
    x, pos, mask = padded_batch()
    with torch.no_grad():
        full, _ = run(a, x, pos, mask)
        step, _ = decode(a, x, pos, mask, chunks)
    real = mask.bool()
    assert (full - step)[real].abs().max() <= ATOL


def test_decode_with_global_iha_layers():
    cfg = tiny(iha_global_layers_use_iha=True)
    a = perturbed(cfg, 1)
    assert a.kind == "global" and a.pseudo_heads == 2
    x, pos, mask = padded_batch()
    with torch.no_grad():
        full, _ = run(a, x, pos, mask)
        ref = reference_block(a, cfg, x, pos, mask, None)
        step, _ = decode(a, x, pos, mask, [4] + [1] * 7)
    real = mask.bool()
    assert (full - ref)[real].abs().max() <= ATOL and (full - step)[real].abs().max() <= ATOL


@pytest.mark.parametrize("prefill", [3, 12, 17])
def test_auto_window_is_frozen_by_the_first_cached_call(prefill):
    """Each row's window is max(1, L // 8) of its real prefill tokens (row 1 has 3 pads), frozen for
    the decoding steps: every row equals a fixed-window block with its own window."""
    a = perturbed(tiny(iha_sliding_window=None), 0)
    x, pos, mask = padded_batch(t=prefill + 6)
    rows = (mask[:, :prefill].sum(-1) // 8).clamp(min=1).tolist()
    real = mask.bool()
    with torch.no_grad():
        step, st = decode(a, x, pos, mask, [prefill] + [1] * 6)
        frozen = st.window.tolist() if isinstance(st.window, torch.Tensor) else [st.window] * len(rows)
        assert frozen == rows
        for row, window in enumerate(rows):
            full, _ = run(perturbed(tiny(iha_sliding_window=window), 0), x, pos, mask)
            assert (full - step)[row][real[row]].abs().max() <= ATOL
        auto_full, _ = run(a, x, pos, mask)  # resolves each row's window from its whole length instead
    if (mask.sum(-1) // 8).clamp(min=1).tolist() != rows:
        assert (auto_full - step)[real].abs().max() > 1e-3


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_causality(layer):
    a = perturbed(tiny(), layer)
    x, pos, _ = padded_batch(pad=0)
    for t in (0, 4, 10):
        x2 = x.clone()
        x2[:, t] += torch.randn(x.shape[-1])
        with torch.no_grad():
            o1, _ = run(a, x, pos, None)
            o2, _ = run(a, x2, pos, None)
        assert torch.equal(o1[:, :t], o2[:, :t]) or (o1[:, :t] - o2[:, :t]).abs().max() <= ATOL
        assert (o1[:, t:] - o2[:, t:]).abs().max() > 1e-4  # (XSA zeroes a lone first token's output)


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_left_padded_row_equals_row_alone(layer):
    a = perturbed(tiny(), layer)
    x, pos, mask = padded_batch(pad=4)
    with torch.no_grad():
        batch, _ = run(a, x, pos, mask)
        alone, _ = run(a, x[1:, 4:], pos[1:, 4:], None)
    assert (batch[1:, 4:] - alone).abs().max() <= ATOL


def test_gradient_reaches_every_parameter():
    for layer in range(3):
        a = perturbed(tiny(attention_dropout=0.1), layer).train()
        x, pos, mask = padded_batch()
        x.requires_grad_(True)
        o, _ = run(a, x, pos, mask)
        o[mask.bool()].pow(2).sum().backward()
        for name, p in a.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, (layer, name)
        assert x.grad.abs().sum() > 0


def test_attention_dropout_only_in_training():
    a = perturbed(tiny(attention_dropout=0.5), 0)
    x, pos, _ = padded_batch(pad=0)
    with torch.no_grad():
        e1, e2 = run(a, x, pos, None)[0], run(a, x, pos, None)[0]
        a.train()
        torch.manual_seed(3)
        t1 = run(a, x, pos, None)[0]
    assert torch.equal(e1, e2) and (t1 - e1).abs().max() > 1e-3


# -- identity-at-init properties ------------------------------------------------------------------
def copy_shared(src, dst):
    """Load every parameter ``dst`` has in common with ``src``; return the names only ``dst`` has."""
    sd = src.state_dict()
    missing, _ = dst.load_state_dict({k: v for k, v in sd.items() if k in dst.state_dict()}, strict=False)
    return set(missing)


def test_iha_at_init_equals_plain_attention():
    # W >= T: local IHA at init == use_iha=False (which has no window).
    cfg = tiny(iha_sliding_window=64)
    iha = NeoLLMAttention(cfg, 0).eval()
    plain = NeoLLMAttention(tiny(iha_sliding_window=64, use_iha=False), 0).eval()
    assert copy_shared(iha, plain) == set()
    x, pos, mask = padded_batch()
    with torch.no_grad():
        got, want = run(iha, x, pos, mask)[0], run(plain, x, pos, mask)[0]
    assert (got - want)[mask.bool()].abs().max() <= ATOL


def test_iha_at_init_equals_windowed_mha():
    cfg = tiny()
    a = NeoLLMAttention(cfg, 0).eval()
    x, pos, mask = padded_batch()
    with torch.no_grad():
        got = run(a, x, pos, mask)[0]
        mha = NeoLLMAttention(tiny(use_iha=False), 0).eval()
        copy_shared(a, mha)
        mha.pseudo_heads = 1
        ref = reference_block(mha, cfg, x, pos, mask, 4)  # plain heads, same causal + window mask
    assert (got - ref)[mask.bool()].abs().max() <= ATOL


def test_iha_modules_identity_and_reset():
    mix, col = IHAMix(4, 2, 3), IHACollapse(4, 3)
    q, k = torch.randn(2, 5, 4, 8), torch.randn(2, 5, 2, 8)
    qs, ks, vs = mix(q, k, k)
    assert qs.shape == (2, 5, 4, 3, 8) and ks.shape == vs.shape == (2, 5, 2, 3, 8)
    assert torch.equal(qs, q[:, :, :, None].expand_as(qs)) and torch.allclose(col(qs), q, atol=1e-6)
    with torch.no_grad():
        mix.q_mix.add_(1.0)
        col.collapse.add_(1.0)
    mix.reset_parameters_with(hf_init)
    col.reset_parameters_with(hf_init)
    assert torch.equal(mix(q, k, k)[0], qs) and torch.allclose(col(qs), q, atol=1e-6)


def test_grape_at_init_equals_repo():
    grape = NeoLLMAttention(tiny(), 2).eval()
    with torch.no_grad():
        grape.positions.coords.w_z.normal_(0.0, 1.0)  # real positions, so the rotation matters
    repo = NeoLLMAttention(tiny(use_repo_grape=False), 2).eval()
    assert copy_shared(grape, repo) == set()
    assert set(grape.state_dict()) - set(repo.state_dict()) == {"positions.spectrum.log_scale"}
    x, pos, mask = padded_batch()
    with torch.no_grad():
        assert (run(grape, x, pos, mask)[0] - run(repo, x, pos, mask)[0]).abs().max() <= ATOL
        grape.positions.spectrum.log_scale.fill_(0.5)
        assert (run(grape, x, pos, mask)[0] - run(repo, x, pos, mask)[0]).abs().max() > 1e-4


def test_repo_relative_law():
    """Shifting every REPO coordinate by a constant leaves the scores unchanged."""
    a = perturbed(tiny(use_momentum_attention=False), 2)
    x, pos, _ = padded_batch(pad=0)
    with torch.no_grad():
        base = run(a, x, pos, None)[0]
        coords = a.positions.coords
        orig = coords.coordinates
        coords.coordinates = lambda r: orig(r) + 3.7
        shifted = run(a, x, pos, None)[0]
        coords.coordinates = orig
    assert (base - shifted).abs().max() <= 1e-4


def test_positions_are_relative():
    x, pos, _ = padded_batch(pad=0)
    for layer in (0, 2):  # integer RoPE (0) and REPO (2, which ignores integer positions) are both relative
        a = perturbed(tiny(use_momentum_attention=False), layer)
        with torch.no_grad():
            assert (run(a, x, pos, None)[0] - run(a, x, pos + 5, None)[0]).abs().max() <= 1e-4
    a = perturbed(tiny(use_momentum_attention=False), 0)
    with torch.no_grad():
        assert (run(a, x, pos, None)[0] - run(a, x, pos * 2, None)[0]).abs().max() > 1e-3


def test_momentum_shear_formula_and_boundary():
    m = MomentumShear(0.1)
    q, k = torch.randn(2, 4, 3, 1, 8), torch.randn(2, 4, 1, 1, 8)
    pos = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 2]])  # row 1: one pad slot, then a fresh start
    qh, kh = m(q, k, pos)
    assert torch.equal(qh[:, 0], q[:, 0]) and torch.equal(qh[1, 1], q[1, 1])
    assert torch.allclose(qh[0, 2], 1.1 * q[0, 2] - 0.1 * q[0, 1])
    assert torch.allclose(kh[1, 3], 1.1 * k[1, 3] - 0.1 * k[1, 2])
    st = NeoLLMAttentionState()
    m(q[:, :2], k[:, :2], pos[:, :2], st)
    q2, _ = m(q[:, 2:], k[:, 2:], pos[:, 2:], st)
    assert torch.allclose(q2, qh[:, 2:])


def test_xsa_removes_the_own_value_direction():
    xsa = ExclusiveSelfAttention(4, 2, 1e-6)
    o, v = torch.randn(2, 5, 4, 8), torch.randn(2, 5, 2, 8)
    z = xsa(o, v)
    vr = v.repeat_interleave(2, dim=2)
    assert (z * vr).sum(-1).abs().max() < 1e-4
    assert torch.allclose(z + (o - z), o) and (o - z).abs().max() > 1e-3


def test_hadamard_matmul_equals_butterfly_and_is_orthogonal():
    for n in (1, 2, 8, 64):
        hm = hadamard_matrix(n)
        assert torch.equal(hm, sylvester(n))
        x = torch.randn(3, n)
        assert torch.allclose(fwht(x), x @ hm, atol=1e-5)
        assert torch.allclose(hm @ hm.T, n * torch.eye(n))
    out = HadamardOutput(64, 64)
    x = torch.randn(2, 3, 64)
    assert torch.allclose(out(x).norm(dim=-1), x.norm(dim=-1), atol=1e-4)  # α=1, β=0: an isometry


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(num_attention_heads=3, num_key_value_heads=1, head_dim=16, hidden_size=48), "power of two"),
        (dict(head_dim=8), r"\(32\) == hidden_size \(64\)"),
    ],
)
def test_hadamard_checks(kw, match):
    with pytest.raises(ValueError, match=match):
        NeoLLMAttention(tiny(**kw), 0)
    NeoLLMAttention(tiny(**kw, use_hadamard_o_proj=False), 0)


def test_dense_o_proj_and_multiplier_switch():
    a = NeoLLMAttention(tiny(use_hadamard_o_proj=False), 0)
    names = set(a.state_dict())
    assert {"o_proj.weight", "o_proj.row_multiplier", "o_proj.col_multiplier", "q_proj.row_multiplier"} <= names
    assert a.q_proj.row_multiplier.shape == (4 * 2 * 16,)
    assert not any("multiplier" in n for n in NeoLLMAttention(tiny(use_learnable_multipliers=False), 0).state_dict())
    assert not any(n.startswith(("k_proj.row", "v_proj.row")) for n in names)


def test_fan_off_means_plain_projection_input():
    a = NeoLLMAttention(tiny(fan_ratio=0.0), 0)
    assert a.q_proj.in_features == 64 and not any(n.startswith("fan.") for n, _ in a.named_parameters())
    assert NeoLLMAttention(tiny(), 0).q_proj.in_features == 64 + 8


def test_output_gate():
    from slmlab.models.neollm.components.attention import OutputGate

    o, g = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8)
    assert torch.equal(OutputGate()(o, torch.zeros_like(g)), 0.5 * o)  # σ(0) = 1/2 at a zero gate
    assert torch.allclose(OutputGate()(o, g), o * torch.sigmoid(g))


def test_value_residual_hook_and_decode():
    cfg = tiny(use_fan_residual=True)
    l0, l1 = perturbed(cfg, 0), perturbed(cfg, 1)
    assert l1.value_residual.value_residual_lambda.tolist() != [0.5, 0.5]  # perturbed
    x, pos, mask = padded_batch()
    with torch.no_grad():
        o0, v0 = run(l0, x, pos, mask)
        assert v0.shape == (2, 11, 2, 16)
        o1, kept = run(l1, x, pos, mask, v0=v0)
        assert kept is v0  # layers >= 1 read v0 from the residual state and leave it there
        s0, s1, outs = l0.new_state(), l1.new_state(), []
        for a, b in ((0, 5), (5, 6), (6, 11)):
            _, v0s = run(l0, x[:, a:b], pos[:, a:b], mask[:, :b], s0)
            outs.append(run(l1, x[:, a:b], pos[:, a:b], mask[:, :b], s1, v0=v0s)[0])
    assert (torch.cat(outs, 1) - o1)[mask.bool()].abs().max() <= ATOL
    with pytest.raises(ValueError, match="need v0"):
        run(l1, x, pos, mask)
    assert NeoLLMAttention(tiny(use_fan_residual=True), 1).value_residual.value_residual_lambda.tolist() == [0.5, 0.5]


def test_rope_scaling():
    lin = perturbed(tiny(rope_scaling={"rope_type": "linear", "factor": 2.0}, use_momentum_attention=False), 0)
    base = perturbed(tiny(use_momentum_attention=False), 0)
    x, pos, _ = padded_batch(pad=0)
    with torch.no_grad():
        assert (run(lin, x, pos * 2, None)[0] - run(base, x, pos, None)[0]).abs().max() <= ATOL
    with pytest.raises(ValueError, match="dynamic"):
        NeoLLMAttention(tiny(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), 0)


def test_state_batch_ops_and_crop():
    a = perturbed(tiny(), 0)
    x, pos, mask = padded_batch()
    with torch.no_grad():
        _, st = decode(a, x, pos, mask, [6])
        st.select_batch(torch.tensor([1, 1]))
        rows = torch.tensor([1, 1])
        nxt, _ = run(a, x[rows, 6:7], pos[rows, 6:7], mask[rows, :7], st)
        _, ref_st = decode(a, x[1:], pos[1:], mask[1:], [6])
        ref, _ = run(a, x[1:, 6:7], pos[1:, 6:7], mask[1:, :7], ref_st)
    assert (nxt - ref).abs().max() <= ATOL
    assert st.num_tokens == 7
    with pytest.raises(ValueError, match="cannot be cropped"):
        st.crop(3)


def test_default_attention_parameter_count_on_meta():
    cfg = NeoLLMConfig()
    with torch.device("meta"):
        counts = [sum(p.numel() for p in NeoLLMAttention(cfg, i).parameters()) for i in range(12)]
    assert counts[:4] == [1_149_696] * 4
    assert counts[4] == counts[9] == 1_215_200
    assert counts[5:9] + counts[10:] == [1_215_520] * 6
    assert sum(counts) == 14_322_304


def test_special_inits_survive_hf_reinit():
    a = perturbed(tiny(), 2)
    for m in a.modules():
        if hasattr(m, "reset_parameters_with"):
            m.reset_parameters_with(hf_init)
    assert torch.equal(a.positions.spectrum.log_scale, torch.zeros(2, 2))
    assert torch.equal(a.o_proj.alpha, torch.ones(64)) and torch.equal(a.o_proj.beta, torch.zeros(64))
    assert a.positions.coords.w_z.abs().max() <= 2 * 0.02
    fresh = NeoLLMAttention(tiny(), 2)
    assert torch.equal(a.iha.q_mix, fresh.iha.q_mix) and torch.equal(a.collapse.collapse, fresh.collapse.collapse)


@pytest.mark.parametrize("t, window, p", [(7, 1, 2), (16, 3, 2), (33, 5, 2), (20, 4, 1), (9, 4, 3)])
def test_blocked_local_attention_equals_masked_full(t, window, p):
    from slmlab.layers.attention import sdpa
    from slmlab.models.neollm.components.attention import AttentionCore
    from slmlab.models.neollm.components.attention.local_blocks import blocked_local_attention

    g = torch.Generator().manual_seed(t)
    q, k, v = (torch.randn(2, t, n, p, 8, generator=g) for n in (4, 2, 2))
    mask = torch.ones(2, t, dtype=torch.long)
    mask[1, : t // 3] = 0
    core = AttentionCore(p, local=True, window=window, dropout=0.0)
    bias = core.bias(mask, t, t, window, q.device)
    flat = lambda x: x.permute(0, 2, 1, 3, 4).reshape(2, x.shape[2], t * p, 8)  # noqa: E731
    full = sdpa(flat(q), flat(k), flat(v), bias).view(2, 4, t, p, 8).permute(0, 2, 1, 3, 4)
    got = blocked_local_attention(q, k, v, mask, window)
    assert got.shape == q.shape
    assert (got - full)[mask.bool()].abs().max() <= ATOL
    assert torch.allclose(blocked_local_attention(q, k, v, None, window)[0], got[0], atol=ATOL)


@pytest.mark.parametrize("how", ["kwarg", "attribute"])
def test_rope_parameters_are_honoured(how):
    """transformers v5's ``rope_parameters`` (given to the config, or set on it before the model is
    built, as transformers' own tests do): its ``rope_theta`` and linear ``factor`` equal the block
    built with ``rope_theta=500`` at doubled positions; a default ``rope_type`` with a theta equals
    ``rope_theta`` alone."""
    linear = {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}
    default = {"rope_type": "default", "rope_theta": 500.0}
    if how == "kwarg":
        scaled, plain = tiny(rope_parameters=linear, use_momentum_attention=False), tiny(rope_parameters=default)
    else:
        scaled, plain = tiny(use_momentum_attention=False), tiny()
        scaled.rope_parameters, plain.rope_parameters = linear, default
    base = perturbed(tiny(rope_theta=500.0, use_momentum_attention=False), 0)
    x, pos, _ = padded_batch(pad=0)
    with torch.no_grad():
        assert (run(perturbed(scaled, 0), x, pos * 2, None)[0] - run(base, x, pos, None)[0]).abs().max() <= ATOL
        theta500 = run(perturbed(tiny(rope_theta=500.0), 0), x, pos, None)[0]
        assert torch.equal(run(perturbed(plain, 0), x, pos, None)[0], theta500)
        assert (run(perturbed(tiny(), 0), x, pos, None)[0] - theta500).abs().max() > 1e-3


def test_rope_parameters_survive_a_save_and_load(tmp_path):
    cfg = tiny(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0})
    assert cfg.rope_theta == 500.0 and cfg.rope_parameters["factor"] == 2.0
    cfg.save_pretrained(tmp_path)
    back = NeoLLMConfig.from_pretrained(tmp_path)
    assert back.rope_theta == 500.0 and back.rope_parameters == cfg.rope_parameters
