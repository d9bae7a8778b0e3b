"""NeoLLM attention options (MEA, REPO-GOAT, LUCID, affine-scaled, directional routing): the block
against the eager reference of ``test_neollm_attention.py`` (each option alone and all five, P ∈ {1, 2},
every tiny layer kind), identities at init, hand-computed cases, decode == prefill, causality,
gradients, the affine EMA, parameter counts on the meta device and the config checks."""

from __future__ import annotations

import math

import pytest
import torch
import transformers.initialization as hf_init

from slmlab.layers.masks import AttentionBias
from slmlab.models.neollm.components.attention import (
    ATTENTION_FUNCTIONS,
    AttentionCall,
    AttentionCore,
    GoatPrior,
    LucidPreconditioner,
    NeoLLMAttention,
)
from slmlab.models.neollm.configuration_neollm import NeoLLMConfig
from test_neollm_attention import ATOL, copy_shared, decode, padded_batch, perturbed, reference_block, run, tiny

OPTIONS = {
    "mea": dict(use_mea_attention=True),
    "mea-hc3": dict(use_mea_attention=True, mea_component_key_value_heads=3),
    "goat": dict(use_repo_goat_prior=True),
    "lucid": dict(use_lucid_attention=True),
    "affine": dict(use_affine_scaled_attention=True),
    "routing": dict(use_directional_routing=True),
}
ALL = {k: v for opt in OPTIONS.values() for k, v in opt.items()} | {"mea_component_key_value_heads": 1}
CASES = {**OPTIONS, "all": ALL}


def with_alpha_ma(a: NeoLLMAttention, seed: int = 5) -> NeoLLMAttention:
    """Move the affine EMA buffer off its init too (buffers are not parameters)."""
    if hasattr(a.affine, "alpha_ma"):
        a.affine.alpha_ma.copy_(0.5 + torch.rand(a.affine.alpha_ma.shape, generator=torch.Generator().manual_seed(seed)))
    return a


@pytest.mark.parametrize("pseudo", [2, 1])
@pytest.mark.parametrize("layer", [0, 1, 2])
@pytest.mark.parametrize("case", sorted(CASES))
def test_block_with_options_matches_reference(case, layer, pseudo):
    cfg = tiny(iha_num_pseudo_heads=pseudo, **CASES[case])
    a = with_alpha_ma(perturbed(cfg, layer))
    x, pos, mask = padded_batch()
    with torch.no_grad():
        got, _ = run(a, x, pos, mask)
        ref = reference_block(a, cfg, x, pos, mask, 4 if a.kind == "local" else None)
    assert (got - ref)[mask.bool()].abs().max() <= ATOL


@pytest.mark.parametrize("pseudo", [2, 1])
@pytest.mark.parametrize("layer", [0, 1, 2])
@pytest.mark.parametrize("chunks", [[1] * 11, [5] + [1] * 6, [3, 4, 1, 3]])
@pytest.mark.parametrize("case", sorted(CASES))
def test_decode_equals_prefill_with_options(case, chunks, layer, pseudo):
    cfg = tiny(iha_num_pseudo_heads=pseudo, **CASES[case])
    a = with_alpha_ma(perturbed(cfg, layer))
    x, pos, mask = padded_batch()
    with torch.no_grad():
        full, _ = run(a, x, pos, mask)
        step, _ = decode(a, x, pos, mask, chunks)
        alone, _ = run(a, x[1:, 3:], pos[1:, 3:], None)
    real = mask.bool()
    assert (full - step)[real].abs().max() <= ATOL
    assert (full[1:, 3:] - alone).abs().max() <= ATOL  # a left-padded row equals the row alone


# -- identities at init ----------------------------------------------------------------------------
def pair(extra: dict, layer: int):
    on, off = NeoLLMAttention(tiny(**extra), layer).eval(), NeoLLMAttention(tiny(), layer).eval()
    with torch.no_grad():
        for p in off.parameters():  # move the shared weights off init so the comparison sees them
            p.add_(0.05 * torch.randn_like(p))
    return on, off


@pytest.mark.parametrize("hc", [2, 3, 1])
@pytest.mark.parametrize("layer", [0, 2])
def test_mea_mix_at_init_is_no_mixing(hc, layer):
    torch.manual_seed(0)
    on, off = pair(dict(use_mea_attention=True, mea_component_key_value_heads=hc), layer)
    if hasattr(off.iha, "k_mix"):
        off.iha.reset_parameters_with(hf_init)  # identity K/V mixes on both sides (shapes differ)
    sd = off.state_dict()
    skip = ("k_proj", "v_proj", "iha.k_mix", "iha.v_mix")
    on.load_state_dict({k: v for k, v in sd.items() if not k.startswith(skip)}, strict=False)
    with torch.no_grad():
        for name in ("k_proj", "v_proj"):  # component c = h mod H_c feeds mixed head h at init
            w = getattr(off, name).weight.view(2, 16, -1)
            comp = getattr(on, name).weight.view(hc, 16, -1)
            for h in range(2):
                w[h] = comp[h % hc]
    off.head_norm = on.head_norm  # the head norm is not an identity; the HLC is
    x, pos, mask = padded_batch()
    with torch.no_grad():
        assert (run(on, x, pos, mask)[0] - run(off, x, pos, mask)[0])[mask.bool()].abs().max() <= ATOL


@pytest.mark.parametrize(
    "extra, layers",
    [(dict(use_repo_goat_prior=True), (1, 2)), (dict(use_affine_scaled_attention=True), (0, 1, 2))],
)
def test_goat_and_affine_at_init_are_off(extra, layers):
    for layer in layers:
        torch.manual_seed(layer)
        on, off = pair(extra, layer)
        assert copy_shared(off, on) == {n for n in on.state_dict() if n.startswith(("goat.", "affine."))}
        x, pos, mask = padded_batch()
        with torch.no_grad():
            assert (run(on, x, pos, mask)[0] - run(off, x, pos, mask)[0])[mask.bool()].abs().max() <= ATOL


def test_routing_with_router_forced_to_zero_is_off():
    on, off = pair(dict(use_directional_routing=True), 1)
    copy_shared(off, on)
    x, pos, mask = padded_batch()
    with torch.no_grad():
        assert (run(on, x, pos, mask)[0] - run(off, x, pos, mask)[0]).abs().max() > 1e-3  # w ≈ 0.5 at init
        on.routing.router.bias.fill_(-1e4)
        assert (run(on, x, pos, mask)[0] - run(off, x, pos, mask)[0])[mask.bool()].abs().max() <= ATOL


# -- LUCID by hand ---------------------------------------------------------------------------------
def test_lucid_equal_keys_give_differences():
    k = torch.randn(1, 1, 1, 1, 8).expand(1, 3, 1, 1, 8)
    v = torch.randn(1, 3, 1, 1, 8)
    got = LucidPreconditioner(1e-6)(k, v)[0, :, 0, 0]
    want = torch.stack((v[0, 0, 0, 0], v[0, 1, 0, 0] - v[0, 0, 0, 0], v[0, 2, 0, 0] - v[0, 1, 0, 0]))
    assert (got - want).abs().max() <= 1e-4


def test_lucid_orthogonal_keys():
    d, t = 64, 5
    k = torch.zeros(1, t, 1, 1, d)
    for i in range(t):
        k[0, i, 0, 0, i] = 3.0  # mutually orthogonal
    v = torch.randn(1, t, 1, 1, d)
    got = LucidPreconditioner(1e-6)(k, v)
    past = torch.cat((torch.zeros_like(v[:, :1]), v.cumsum(1)[:, :-1]), 1)
    want = v - math.exp(-math.sqrt(d)) * past
    assert (got - want).abs().max() <= 10 * math.exp(-2 * math.sqrt(d)) * v.abs().sum()


# -- affine ----------------------------------------------------------------------------------------
def affine_call(mask, alpha, alpha_ma):
    return AttentionCall(AttentionBias(mask, mask is None), 0.0, None, alpha, alpha_ma)


@pytest.mark.parametrize("entry", ["affine", "affine_eager"])
def test_affine_rows_sum_to_alpha_ma_and_skip_masked_keys(entry):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 6, 8, generator=g), torch.randn(2, 2, 6, 8, generator=g)
    alpha, alpha_ma = 2 * torch.rand(2, 4, 6, generator=g), 0.5 + torch.rand(4, generator=g)
    allowed = torch.ones(6, 6, dtype=torch.bool).tril()[None, None] & (torch.arange(6) >= 2)[None, None, None]
    allowed = allowed.expand(2, 1, 6, 6).clone()
    allowed[0] = torch.ones(6, 6, dtype=torch.bool).tril()
    allowed = allowed | ~allowed.any(-1, keepdim=True)
    fn = ATTENTION_FUNCTIONS[entry]
    for mask in (allowed, None):
        out = fn(q, k, torch.ones(2, 2, 6, 8), affine_call(mask, alpha, alpha_ma))
        assert (out - alpha_ma[None, :, None, None]).abs().max() <= ATOL
    v = torch.randn(2, 2, 6, 8, generator=g)
    base = fn(q, k, v, affine_call(allowed, alpha, alpha_ma))
    v2 = v.clone()
    v2[:, :, 5] += 10.0  # a future key for rows < 5
    v2[1, :, :2] += 10.0  # padded keys of row 1
    moved = fn(q, k, v2, affine_call(allowed, alpha, alpha_ma))
    assert (moved[0, :, :5] - base[0, :, :5]).abs().max() <= ATOL
    assert (moved[1, :, 2:5] - base[1, :, 2:5]).abs().max() <= ATOL  # (row 5 sees key 5)
    eager = ATTENTION_FUNCTIONS["affine_eager"](q, k, v, affine_call(allowed, alpha, alpha_ma))
    assert (base - eager).abs().max() <= ATOL


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_affine_eager_equals_fused_in_the_block(layer):
    a = with_alpha_ma(perturbed(tiny(use_affine_scaled_attention=True, use_lucid_attention=True), layer))
    x, pos, mask = padded_batch(t=13)
    with torch.no_grad():
        fused, _ = run(a, x, pos, mask)
        a.core.attend = ATTENTION_FUNCTIONS["affine_eager"]
        eager, _ = run(a, x, pos, mask)
    assert (fused - eager)[mask.bool()].abs().max() <= ATOL
    eager_cfg = tiny(use_affine_scaled_attention=True)
    eager_cfg._attn_implementation = "eager"
    assert AttentionCore.from_config(eager_cfg, 0).attend is ATTENTION_FUNCTIONS["affine_eager"]


def test_affine_ema_closed_form_and_frozen_in_eval():
    a = NeoLLMAttention(tiny(use_affine_scaled_attention=True, affine_momentum=0.8), 0)
    with torch.no_grad():
        a.affine.proj.bias.copy_(torch.tensor([0.0, 1.0, -1.0, 2.0]))
    alpha = 2 * torch.sigmoid(a.affine.proj.bias.detach())
    x, pos, mask = padded_batch()
    a.train()
    with torch.no_grad():
        for _ in range(3):
            run(a, x, pos, mask)
    assert torch.allclose(a.affine.alpha_ma, 0.8**3 + (1 - 0.8**3) * alpha, atol=1e-6)
    a.eval()
    before = a.affine.alpha_ma.clone()
    with torch.no_grad():
        run(a, x, pos, mask)
    assert torch.equal(a.affine.alpha_ma, before)


# -- GOAT ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layer, t", [(1, 9), (2, 13)])  # global masked path; local blocked path (t > 2W)
def test_goat_logits_equal_the_prior_with_zero_content_queries(layer, t):
    cfg = tiny(use_repo_goat_prior=True)  # layer 1: global, no IHA (masked path); layer 2: local, P = 2, W = 4
    goat = GoatPrior(4, 2, 16, 3, 8, 4.0, 1e4)
    with torch.no_grad():
        for p in goat.parameters():
            p.normal_()
    g = torch.Generator().manual_seed(t)
    r, z = torch.randn(1, t, 8, generator=g), 3 * torch.randn(1, t, 2, generator=g)
    pos = torch.arange(t)[None]
    pseudo = 2 if layer == 2 else 1
    q = torch.zeros(1, t, 4, pseudo, 16)
    k, v = torch.randn(1, t, 2, pseudo, 16, generator=g), torch.randn(1, t, 2, pseudo, 16, generator=g)
    qg, kg = goat(q, k, (r, z), pos)
    core = AttentionCore.from_config(cfg, layer)
    assert core.pseudo_heads == pseudo and core.local == (layer == 2) and (layer == 1 or t > 2 * 4)
    out = core(qg, kg, v)
    qs, ks = goat.channels((r, z), pos)
    window = 4 if core.local else t
    ti, si = torch.arange(t)[:, None], torch.arange(t)[None, :]
    vis = (si <= ti) & (ti - si < window)
    for h in range(4):
        logits = torch.einsum("ic,jc->ij", qs[0, :, h // 2], ks[0, :, h // 2])  # exactly K(i, j)
        logits = logits.masked_fill(~vis, float("-inf"))[:, :, None].expand(t, t, pseudo).reshape(t, t * pseudo)
        want = logits.softmax(-1) @ v[0, :, h // 2].reshape(t * pseudo, 16)
        for ps in range(pseudo):  # every pseudo-query of token i has the same prior logits
            assert (out[0, :, h, ps] - want).abs().max() <= ATOL


def test_goat_relative_part_is_shift_invariant():
    goat = GoatPrior(4, 2, 16, 3, 8, 4.0, 1e4)
    with torch.no_grad():
        for p in goat.parameters():
            p.normal_()
    r, z, pos = torch.randn(2, 7, 8), torch.randn(2, 7, 2), torch.arange(7).expand(2, 7)
    q1, k1 = goat.channels((r, z), pos)
    q2, k2 = goat.channels((r, z + 5.3), pos)
    rel = lambda q, k: torch.einsum("bigc,bjgc->bgij", q[..., :6], k[..., :6])  # noqa: E731
    assert (rel(q1, k1) - rel(q2, k2)).abs().max() <= 1e-4
    assert (rel(q1, k1)).abs().max() > 1e-2


# -- the whole block with everything on ------------------------------------------------------------
@pytest.mark.parametrize("layer", [0, 1, 2])
def test_causality_with_all_options(layer):
    a = with_alpha_ma(perturbed(tiny(**ALL), layer))
    x, pos, _ = padded_batch(pad=0)
    for t in (3, 9):
        x2 = x.clone()
        x2[:, t] += torch.randn(x.shape[-1])
        with torch.no_grad():
            o1, o2 = run(a, x, pos, None)[0], run(a, x2, pos, None)[0]
        assert (o1[:, :t] - o2[:, :t]).abs().max() <= ATOL
        assert (o1[:, t:] - o2[:, t:]).abs().max() > 1e-4


def test_gradient_reaches_every_parameter_with_all_options():
    for layer in range(3):
        a = perturbed(tiny(**ALL, attention_dropout=0.1), layer).train()
        x, pos, mask = padded_batch()
        o, _ = run(a, x, pos, mask)
        o[mask.bool()].pow(2).sum().backward()
        silent = [n for n, p in a.named_parameters() if p.grad is None or not torch.any(p.grad != 0)]
        assert not silent, (layer, silent)


def test_bf16_autocast_runs_with_all_options():
    a = perturbed(tiny(**ALL), 2)
    x, pos, mask = padded_batch()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        o, _ = run(a, x, pos, mask)
    assert torch.isfinite(o.float()).all()


# -- parameters, inits, config ---------------------------------------------------------------------
def test_option_parameter_counts_on_meta():
    with torch.device("meta"):
        base = [sum(p.numel() for p in NeoLLMAttention(NeoLLMConfig(), i).parameters()) for i in (0, 4, 5)]
        for extra, add in [
            (dict(use_mea_attention=True), (544, 544, 544)),
            (dict(use_repo_goat_prior=True), (0, 284, 284)),
            (dict(use_affine_scaled_attention=True), (4_104,) * 3),
            (dict(use_directional_routing=True), (18_464,) * 3),
        ]:
            cfg = NeoLLMConfig(**extra)
            got = [sum(p.numel() for p in NeoLLMAttention(cfg, i).parameters()) for i in (0, 4, 5)]
            assert [g - b for g, b in zip(got, base, strict=True)] == list(add), extra


def test_special_inits_of_the_options_survive_hf_reinit():
    a = perturbed(tiny(**ALL), 2)
    for m in a.modules():
        if hasattr(m, "reset_parameters_with"):
            m.reset_parameters_with(hf_init)
    assert torch.equal(a.mea.k_mix, torch.ones(1, 2)) and torch.equal(a.head_norm.weight, torch.ones(4, 16))
    assert all(torch.equal(p, torch.zeros_like(p)) for p in a.goat.parameters())
    assert torch.equal(a.affine.proj.weight, torch.zeros(4, 64)) and torch.equal(a.routing.router.bias, torch.zeros(16))
    assert a.routing.router.weight.abs().max() <= 2 * 0.02


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(mea_component_key_value_heads=0), "mea_component_key_value_heads"),
        (dict(use_directional_routing=True, directional_routing_k=0), "directional_routing_k"),
        (dict(use_directional_routing=True, directional_routing_k=16), "directional_routing_k"),
        (dict(use_directional_routing=True, directional_routing_temp=0.0), "directional_routing_temp"),
        (dict(affine_momentum=1.0), "affine_momentum"),
        (dict(affine_momentum=-0.1), "affine_momentum"),
        (dict(use_lucid_attention=True, lucid_attention_eps=0.0), "lucid_attention_eps"),
        (dict(use_mea_attention=True, mea_groupnorm_eps=-1.0), "mea_groupnorm_eps"),
        (dict(xsa_eps=0.0), "xsa_eps"),
    ],
)
def test_config_rejects_bad_option_values(kw, field):
    with pytest.raises(ValueError, match=f"`{field}`"):
        tiny(**kw)
    tiny(**{**kw, "use_xsa": False} if field == "xsa_eps" else {})


# -- the model: inits after post_init / from_pretrained, alpha_ma across processes and ranks --------
LOAD_SCRIPT = """
import json, sys
import slmlab  # noqa: F401  (registers the Auto classes)
from slmlab.models.neollm import NeoLLMForCausalLM
m = NeoLLMForCausalLM.from_pretrained(sys.argv[1])
print("ALPHA_MA " + json.dumps([layer.self_attn.affine.alpha_ma.tolist() for layer in m.model.layers]))
"""


def tiny_model(**kw):
    from slmlab.models.neollm import NeoLLMForCausalLM

    torch.manual_seed(0)
    return NeoLLMForCausalLM(NeoLLMConfig(**{**TINY_MODEL, **kw}))


TINY_MODEL = dict(
    vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, iha_local_global_pattern="LG", repo_start_layer=1, iha_sliding_window=4,
    use_spelling_bee_embeddings=False,
)


@pytest.mark.slow  # a fresh interpreter imports slmlab + transformers (~15 s on a shared core)
def test_option_inits_survive_post_init_and_from_pretrained_and_alpha_ma_reloads_in_a_fresh_process(tmp_path):
    import json
    import subprocess
    import sys

    from slmlab.models.neollm import NeoLLMForCausalLM

    model = tiny_model(**ALL)
    attn = model.model.layers[2].self_attn
    assert torch.equal(attn.mea.k_mix, torch.ones(1, 2)) and all(torch.equal(p, torch.zeros_like(p)) for p in attn.goat.parameters())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
        for i, layer in enumerate(model.model.layers):
            layer.self_attn.affine.alpha_ma.fill_(0.5 + 0.25 * i)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.post_init()
    for name, v in model.state_dict().items():
        assert torch.equal(v, before[name]), f"{name} changed by post_init"
    model.save_pretrained(tmp_path)
    loaded = NeoLLMForCausalLM.from_pretrained(tmp_path)
    for name, v in loaded.state_dict().items():
        assert torch.equal(v, before[name]), f"{name} changed by from_pretrained"
    proc = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("ALPHA_MA "))
    assert json.loads(line[len("ALPHA_MA "):]) == [[0.5 + 0.25 * i] * 4 for i in range(3)]


def test_audit_lists_the_options_under_readable_labels():
    from slmlab.models.neollm import audit_parameters

    rows = audit_parameters(tiny_model(**ALL))
    for label in ("MEA head mix (W_K, W_V)", "MEA head RMSNorm", "REPO-GOAT prior", "affine-scaled alpha", "directional routing"):
        assert rows[f"attention: {label}"] > 0, label


def test_beam_reorder_with_all_options():
    a = with_alpha_ma(perturbed(tiny(**ALL), 2))
    x, pos, mask = padded_batch()
    with torch.no_grad():
        _, st = decode(a, x, pos, mask, [6])
        st.select_batch(torch.tensor([1, 1]))
        rows = torch.tensor([1, 1])
        nxt, _ = run(a, x[rows, 6:8], pos[rows, 6:8], mask[rows, :8], st)
        _, ref_st = decode(a, x[1:], pos[1:], mask[1:], [6])
        ref, _ = run(a, x[1:, 6:8], pos[1:, 6:8], mask[1:, :8], ref_st)
    assert (nxt - ref).abs().max() <= ATOL
    with pytest.raises(ValueError, match="cannot be cropped"):
        st.crop(3)


DDP_SCRIPT = """
import json, os, sys
import torch
import torch.distributed as dist
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
from test_neollm_attention import ForwardContext, NeoLLMAttention, ResidualState, tiny
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
a = NeoLLMAttention(tiny(use_affine_scaled_attention=True, affine_momentum=0.5), 0).train()
with torch.no_grad():
    a.affine.proj.weight.normal_(0.0, 0.5)
g = torch.Generator().manual_seed(100 + rank)
for _ in range(3):
    x = torch.randn(2, 7, 64, generator=g)
    pos = torch.arange(7).expand(2, 7)
    a(x, ForwardContext(pos, None), None, ResidualState(streams=(), v0=None))
with open(os.path.join(sys.argv[1], f"rank{{rank}}.json"), "w") as f:
    json.dump(a.affine.alpha_ma.tolist(), f)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_alpha_ma_is_identical_on_two_gloo_ranks(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "ddp_alpha.py"
    script.write_text(DDP_SCRIPT.format(tests=str(Path(__file__).parent)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), str(tmp_path)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0 == r1 and r0 != [1.0] * 4


def test_cli_audit_prints_the_options_and_refuses_bad_values(capsys):
    from slmlab import cli

    args = ["use_mea_attention=true", "use_repo_goat_prior=true", "use_affine_scaled_attention=true",
            "use_directional_routing=true", "use_lucid_attention=true"]
    assert cli.main(["audit", "neollm", *args]) == 0
    out = capsys.readouterr().out
    for label, count in [("MEA head mix (W_K, W_V)", "384"), ("MEA head RMSNorm", "6,144"), ("REPO-GOAT prior", "2,272"),
                         ("affine-scaled alpha", "49,248"), ("directional routing", "221,568")]:
        line = next(ln for ln in out.splitlines() if f"attention: {label}" in ln)
        assert line.split()[-1] == count, line
    rc = cli.main(["audit", "neollm", "use_directional_routing=true", "directional_routing_k=64"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("slmlab audit: error: `directional_routing_k`") and "; pick" in err


@pytest.mark.parametrize("window, q_len, p", [(None, 9, 1), (3, 9, 2), (4, 2, 2), (None, 1, 2)])
def test_prefix_sum_visible_mean_equals_the_masked_mean(window, q_len, p):
    from slmlab.models.neollm.components.attention import visible_mean
    from slmlab.models.neollm.components.attention.affine import visible_token_mean

    s = 9
    v = torch.randn(2, 2, s, p, 8, generator=torch.Generator().manual_seed(p))
    mask = torch.ones(2, s, dtype=torch.long)
    mask[1, :3] = 0
    core = AttentionCore(p, local=window is not None, window=window, dropout=0.0)
    bias = core.bias(mask, q_len, s, window, v.device)
    if bias.mask is None:
        bias = AttentionBias(torch.ones(1, 1, q_len * p, s * p, dtype=torch.bool), False)
    want = visible_mean(v.reshape(2, 2, s * p, 8), bias, q_len * p, 1)
    got = visible_token_mean(v, mask.bool(), q_len, window).repeat_interleave(p, dim=2)
    real = mask[:, -q_len:].bool().repeat_interleave(p, dim=1)  # pad query rows are never read
    assert (got - want).permute(0, 2, 1, 3)[real].abs().max() <= ATOL
