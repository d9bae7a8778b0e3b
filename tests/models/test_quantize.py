"""Weight-only int8 for every family (slmlab.models.quantize): what is swapped, the logit error against
float32, decode == prefill and plan == forward on the int8 model itself, and save -> load in a fresh
process giving identical logits."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from family_tester import check_plan_steps
from slmlab.generation import generate
from slmlab.layers.quantized import Int4Linear, Int8Linear, pack_nibbles, quantize_groups, unpack_nibbles
from slmlab.models import get_family
from slmlab.models.neollm import PRESETS as NEOLLM_PRESETS
from slmlab.models.quantize import (
    apply_quantization,
    float_linears,
    int8_targets,
    load_quantized,
    quantization_of,
    quantize,
    quantize_int4,
    quantize_int8,
    quantized_modules,
    save_quantized,
)
from slmlab.quant_schemes import INT8, SCHEMES

TINY = {
    "lumen": dict(vocab_size=97, hidden_dim=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_dim=48,
                  max_seq_len=64),
    "lfm2": dict(vocab_size=97, hidden_size=32, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                 num_layers=4, layer_order=["conv", "attn", "conv", "attn"], block_multiple_of=16,
                 max_position_embeddings=64),
    "pgsm": dict(vocab_size=61, block_size=64, dim=32, layers=2, hidden=48, kernel_size=5, retrieval_dim=16,
                 retrieval_heads=2),
    "nanohammer": dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, num_state_heads=3, state_hidden_size=12),
    "neollm": dict(NEOLLM_PRESETS["neollm-tiny"]),  # FAN widths 72/68: zero-padded int8 rows; learnable multipliers
}
PLANNED = ("lumen", "lfm2")  # the families with a decode plan
# Relative logit error |z_int8 - z_fp32| / |z_fp32| of these tiny seeded models on random ids, measured
# 0.58% (neollm) to 0.87% (pgsm). Per-channel int8 rounds each weight by at most half a step of
# max|row| / 127 (about 0.5% of a row's norm for Gaussian-like rows), bf16 activations add 2^-9 per
# element, and the errors of the layers add up in quadrature; 2% is about twice the worst measured,
# while a wrong scale, row order or a float layer left behind a quantized one gives O(1) errors.
LOGIT_REL_ERR = 0.02


def toy_byte_table(vocab_size: int) -> list[bytes]:
    return [bytes((t * 7 + i) % 256 for i in range(t % 8)) for t in range(vocab_size)]


def tiny(family: str, seed: int = 0) -> nn.Module:
    fam = get_family(family)
    torch.manual_seed(seed)
    model = fam.model_class(fam.make_config(None, **TINY[family])).eval()
    if getattr(model.config, "use_spelling_bee_embeddings", False):
        model.model.spelling_bee.set_byte_table_from_bytes(toy_byte_table(model.config.vocab_size))
    return model


def ids_for(model, batch: int = 2, length: int = 24) -> torch.Tensor:
    return torch.randint(1, model.config.vocab_size, (batch, length), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("family", sorted(TINY))
def test_every_linear_is_swapped_and_the_rest_stays_float(family):
    model = tiny(family)
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear) or hasattr(m, "fold_multipliers")]
    names = quantize_int8(model)
    assert names == quantized_modules(model) and sorted(names) == sorted(linears) and float_linears(model) == []
    head = model.get_output_embeddings()
    assert isinstance(head, Int8Linear)  # the (tied) head is int8; the embedding table stays float32
    assert model.get_input_embeddings().weight.dtype == torch.float32
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert model.config.quantization_config["quant_method"] == INT8.method
    assert quantize_int8(model) == names  # idempotent


def prefill_and_decode(q, ids: torch.Tensor, prefill: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """``(one full forward's logits, the same positions' logits from a prefill then one token at a time
    through the cache)``."""
    with torch.inference_mode():
        full = q(input_ids=ids).logits
        out = q(input_ids=ids[:, :prefill], use_cache=True)
        steps, cache = [out.logits], out.cache
        for t in range(prefill, ids.shape[1]):
            out = q(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True)
            steps.append(out.logits)
            cache = out.cache
    return full, torch.cat(steps, dim=1)


@pytest.mark.parametrize("family", sorted(TINY))
def test_int8_logits_stay_close_to_float32(family):
    model = tiny(family)
    q = copy.deepcopy(model)
    quantize_int8(q)
    ids = ids_for(model)
    with torch.inference_mode():
        z, zq = model(input_ids=ids).logits, q(input_ids=ids).logits
    rel = float((zq - z).norm() / z.norm())
    assert 0 < rel < LOGIT_REL_ERR, rel


@pytest.mark.parametrize("family", sorted(TINY))
def test_decode_equals_prefill_on_the_int8_model(family):
    """One token at a time through the cache against one full forward of the same int8 model: the
    int8 kernel computes each row alone, so the only differences are the float paths' own (1e-5)."""
    q = tiny(family)
    quantize_int8(q)
    ids = ids_for(q)
    full, decoded = prefill_and_decode(q, ids)
    # aten._weight_int8pack_mm blocks its fp32 accumulation by the row count M, so one row (decode) and M rows
    # (prefill) may round apart: measured on this CI machine, 2 of 14,400 NeoLLM logits differ by 1.2e-4 (the
    # same at the commit where it passed, so the CPU's kernel path, not the model); fp32 stays at 1e-5 elsewhere
    torch.testing.assert_close(decoded, full, atol=5e-4, rtol=0)
    greedy = generate(q, ids[:1], 8, use_plan=False)
    assert greedy.decode_path == "model forward" and greedy.shape == (1, ids.shape[1] + 8)


@pytest.mark.parametrize("family", PLANNED)
def test_the_decode_plan_keeps_int8_weights_and_matches_the_forward(family):
    q = tiny(family)
    quantize_int8(q)
    ids = ids_for(q, batch=1)
    check_plan_steps(q, ids, prefill=6)  # plan logits == the model's own int8 decode, 1e-5
    planned, forward = generate(q, ids, 10), generate(q, ids, 10, use_plan=False)
    assert planned.decode_path == "plan" and torch.equal(planned, forward)
    plan = q.decode_plan(ids.shape[1] + 10)
    assert type(plan.weights.head).__name__ == "Int8Columns"


@pytest.mark.slow  # one AOTInductor compile per family (~15-60 s on 2 CPUs)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("family", PLANNED)
def test_the_packaged_decode_step_runs_the_quantized_kernel_and_matches_the_forward(family, scheme):
    """``generate(compile=True)`` on an int8 / int4 model: the AOTInductor package calls the kernel
    (an extern call in the generated C++) and gives the quantized model's own tokens."""
    q = tiny(family)
    quantize(q, scheme)
    ids = ids_for(q, batch=1)
    compiled = generate(q, ids, 10, compile=True)
    assert compiled.decode_path == "compiled plan"
    assert torch.equal(compiled, generate(q, ids, 10, use_plan=False))


def test_a_parent_can_keep_a_linear_in_float32():
    class Router(nn.Module):
        keep_float_linears = ("gate",)

        def __init__(self):
            super().__init__()
            self.gate, self.proj = nn.Linear(32, 4), nn.Linear(32, 32)

    model = nn.Sequential(Router())
    assert int8_targets(model) == ["0.proj"]
    quantize_int8(model)
    assert type(model[0].gate) is nn.Linear and isinstance(model[0].proj, Int8Linear)
    assert float_linears(model) == ["0.gate"]


def test_learnable_multipliers_are_folded_before_quantizing():
    from slmlab.models.neollm.components.multipliers import RowColMultipliedLinear

    layer = RowColMultipliedLinear(32, 16)
    with torch.no_grad():
        layer.row_multiplier.uniform_(0.5, 2.0)
        layer.col_multiplier.uniform_(0.5, 2.0)
    model = nn.Sequential(layer)
    x = torch.randn(5, 32)
    ref = model(x).detach()
    quantize_int8(model)
    assert isinstance(model[0], Int8Linear)
    assert float((model(x) - ref).norm() / ref.norm()) < 0.015


def test_apply_quantization_refuses_what_it_cannot_run():
    model = tiny("lumen")
    assert apply_quantization(model, None, "cpu") == []
    with pytest.raises(ValueError, match="unknown --quantize scheme 'int2'"):
        apply_quantization(model, "int2", "cpu")
    with pytest.raises(ValueError, match="runs on the CPU.*pass --device cpu"):
        apply_quantization(model, "int8", "cuda")


FRESH_PROCESS = """
import sys, torch
from slmlab.train.saved import load_for_inference
loaded = load_for_inference(sys.argv[1], "cpu")
torch.save(loaded.model(input_ids=torch.load(sys.argv[2])).logits.detach(), sys.argv[3])
"""


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("family", sorted(TINY))
def test_save_then_load_in_a_fresh_process_gives_identical_logits(family, scheme, tmp_path):
    q = tiny(family)
    quantize(q, scheme)
    folder = save_quantized(q, None, tmp_path / scheme)
    record = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert record["quant_method"] == SCHEMES[scheme].method and record["modules"] == quantized_modules(q)
    assert record["bits"] == {"int8": 8, "int4": 4}[scheme] and record.get("group_size") == (32 if scheme == "int4" else None)
    assert quantization_of(folder) == record
    ids = ids_for(q)
    with torch.inference_mode():
        expected = q(input_ids=ids).logits
        again = load_quantized(folder)
        torch.testing.assert_close(again(input_ids=ids).logits, expected, atol=0, rtol=0)
    torch.save(ids, tmp_path / "ids.pt")
    subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(folder), str(tmp_path / "ids.pt"), str(tmp_path / "z.pt")],
                   check=True, timeout=120)
    torch.testing.assert_close(torch.load(tmp_path / "z.pt"), expected, atol=0, rtol=0)


def test_saved_int8_folders_are_refused_where_they_cannot_load(tmp_path):
    q = tiny("lumen")
    with pytest.raises(ValueError, match="no quantized module; call"):
        save_quantized(q, None, tmp_path / "float")
    quantize_int8(q)
    folder = save_quantized(q, None, tmp_path / "int8")
    with pytest.raises(ValueError, match="exists and is not an empty folder"):
        save_quantized(q, None, folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["quant_method"] = "gptq"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="quantization_config slmlab cannot load"):
        quantization_of(folder)


# -- int4 -------------------------------------------------------------------------------------------------
# Rounding to 16 levels over a group's range: for Gaussian rows the range of 32 values is ~4.1 sigma, the step
# ~0.27 sigma and the rounding error uniform, ~0.079 sigma (step / sqrt 12): measured 0.078 below. The tiny
# models' logits then move by 8.4-11.1% (lumen ... pgsm), 13-15x int8's 0.57-0.82%; 0.2 is about twice the
# worst, while a wrong zero, nibble order or group gives errors of order 1.
INT4_LOGIT_REL_ERR = 0.2


def test_int4_codes_pack_two_per_byte_and_the_layer_equals_its_dequantized_weight():
    codes = torch.randint(0, 16, (32, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(unpack_nibbles(pack_nibbles(codes)), codes)
    assert pack_nibbles(torch.tensor([[1, 2]], dtype=torch.uint8)).item() == 0x21  # even column in the low nibble
    torch.manual_seed(0)
    linear = nn.Linear(70, 37, bias=True)  # pads to 96 columns (3 groups) and 48 rows
    layer = Int4Linear.from_linear(linear)
    assert layer.qweight.shape == (48, 48) and layer.scales_zeros.shape == (3, 48, 2) and layer.weight.shape == (37, 70)
    x = torch.randn(5, 70)
    expected = x.to(torch.bfloat16).float() @ layer.weight.T + linear.bias
    torch.testing.assert_close(layer(x), expected, atol=2e-2, rtol=1e-2)  # bfloat16 output of the kernel
    w = torch.randn(256, 512)
    codes, pairs = quantize_groups(w, 32)
    s, z = pairs.float().transpose(0, 1).unbind(-1)
    back = ((codes.float().reshape(256, 16, 32) - 8) * s[..., None] + z[..., None]).reshape(256, 512)
    rel = float((back - w).norm() / w.norm())
    assert 0.06 < rel < 0.10, rel  # ~0.079: 16 levels over a group's range
    const = quantize_groups(torch.full((16, 32), 0.3), 32)
    assert torch.all(const[0] == 8) and torch.allclose(const[1][..., 1].float(), torch.tensor(0.3), atol=2e-3)


@pytest.mark.parametrize("family", sorted(TINY))
def test_int4_logits_stay_close_to_float32_and_further_than_int8(family):
    model = tiny(family)
    q4, q8 = copy.deepcopy(model), copy.deepcopy(model)
    assert quantize_int4(q4) == int8_targets(model) and quantize_int8(q8)
    ids = ids_for(model)
    with torch.inference_mode():
        z, z4, z8 = model(input_ids=ids).logits, q4(input_ids=ids).logits, q8(input_ids=ids).logits
    rel4, rel8 = float((z4 - z).norm() / z.norm()), float((z8 - z).norm() / z.norm())
    assert 3 * rel8 < rel4 < INT4_LOGIT_REL_ERR, (rel4, rel8)
    assert q4.config.quantization_config["bits"] == 4


@pytest.mark.parametrize("family", sorted(TINY))
def test_decode_equals_prefill_on_the_int4_model(family):
    q = tiny(family)
    quantize_int4(q)
    ids = ids_for(q)
    full, decoded = prefill_and_decode(q, ids)
    # The kernel computes each row alone (bit-identical for 1 or 24 rows), but it reads bfloat16 activations: a
    # 1e-7 difference of a float path between prefill and decode (LFM2's convolution) can flip one rounding, which
    # moves the outputs it feeds by a bfloat16 step. Measured: LFM2 28 of 4,656 logits apart, at most 3.9e-3 (one
    # step at |z| 0.72), the other families 0. Bound: two steps of the largest logit, and 99% equal to 1e-5.
    diff = (decoded - full).abs()
    assert diff.max() <= 2**-7 * full.abs().max() and (diff > 1e-5).float().mean() < 0.01, diff.max()


@pytest.mark.parametrize("family", PLANNED)
def test_the_decode_plan_keeps_int4_weights_and_matches_the_forward(family):
    q = tiny(family)
    quantize_int4(q)
    ids = ids_for(q, batch=1)
    check_plan_steps(q, ids, prefill=6)
    planned, forward = generate(q, ids, 10), generate(q, ids, 10, use_plan=False)
    assert planned.decode_path == "plan" and torch.equal(planned, forward)
    assert type(q.decode_plan(ids.shape[1] + 10).weights.head).__name__ == "Int4Columns"


def test_the_cli_flags_offer_every_scheme():
    import argparse

    from slmlab.commands._common import add_quantize_argument

    parser = argparse.ArgumentParser()
    add_quantize_argument(parser)
    assert tuple(parser._option_string_actions["--quantize"].choices) == tuple(SCHEMES) == ("int8", "int4")


# -- each scheme's row against the numbers the code gave before the schemes were rows --------------------------


def formula_model() -> nn.Sequential:
    """Two linears with weights from a formula (no random numbers), the first with a bias, widths every kernel
    pads (40 input columns: int8 stores 48, int4 64; 24 and 8 output rows: int4 stores 32 and 16)."""
    first, second = nn.Linear(40, 24, bias=True), nn.Linear(24, 8, bias=False)
    with torch.no_grad():
        first.weight.copy_(torch.sin(torch.arange(960, dtype=torch.float32) * 0.37).view(24, 40) * 0.5)
        first.bias.copy_(torch.cos(torch.arange(24, dtype=torch.float32)) * 0.1)
        second.weight.copy_(torch.cos(torch.arange(192, dtype=torch.float32) * 0.91).view(8, 24) * 0.3)
    return nn.Sequential(first, nn.ReLU(), second)


# Computed with slmlab at 5f48a81 (before the schemes were rows of slmlab.quant_schemes) from formula_model()
# and FORMULA_INPUT (multiples of 1/4: bfloat16-exact, so the first layer's kernel sums are exact): every third
# output, the sum of all outputs, three dequantized weights of the first layer and each layer's weight sum.
FORMULA_INPUT = (torch.arange(120, dtype=torch.float32).view(3, 40) % 17 - 8) / 4
BEFORE_THE_TABLE = {
    "int8": dict(outputs=[1.3125, -1.90625, 2.21875, -2.234375, 3.015625, -3.234375, 0.359375, -1.875],
                 output_sum=-3.203125, weights=[0.0, -0.491943359375, 0.082672119140625],
                 weight_sums=[2.684539794921875, -0.189208984375],
                 record={"quant_method": "slmlab_int8", "bits": 8,
                         "weights": "per-output-channel symmetric int8, bfloat16 scales",
                         "activations": "bfloat16 in the int8 matmuls", "modules": ["0", "2"]}),
    "int4": dict(outputs=[1.1171875, -1.8359375, 2.28125, -1.953125, 3.078125, -3.0625, 0.953125, -1.8359375],
                 output_sum=-4.8828125, weights=[-0.03271484375, -0.49267578125, 0.099609375],
                 weight_sums=[2.512451171875, -0.305419921875],
                 record={"quant_method": "slmlab_int4", "bits": 4, "group_size": 32,
                         "weights": "group-wise asymmetric int4 (a bfloat16 scale and zero per group of input columns)",
                         "activations": "bfloat16 in the int4 matmuls", "modules": ["0", "2"]}),
}


def test_every_scheme_has_its_numbers_from_before_the_table():
    assert sorted(BEFORE_THE_TABLE) == sorted(SCHEMES)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_each_scheme_quantizes_a_tiny_model_to_the_numbers_it_gave_before(scheme):
    model, before = formula_model(), BEFORE_THE_TABLE[scheme]
    assert quantize(model, scheme) == ["0", "2"]
    with torch.no_grad():
        y = model(FORMULA_INPUT)
    torch.testing.assert_close(y.flatten()[::3], torch.tensor(before["outputs"]), atol=1e-6, rtol=0)
    assert abs(float(y.sum()) - before["output_sum"]) <= 1e-6
    w = model[0].weight
    torch.testing.assert_close(torch.stack([w[0, 0], w[5, 17], w[23, 39]]), torch.tensor(before["weights"]),
                               atol=1e-6, rtol=0)
    sums = [float(model[i].weight.double().sum()) for i in (0, 2)]
    assert sums == pytest.approx(before["weight_sums"], abs=1e-6, rel=0)
    record = SCHEMES[scheme].record(["0", "2"], model[0].settings())
    assert list(record.items()) == list(before["record"].items())  # the same entries in the same order


def test_the_quantize_flags_help_is_what_it_was(capsys, monkeypatch):
    import argparse

    from slmlab import cli
    from slmlab.commands._common import add_quantize_argument

    parser = argparse.ArgumentParser()
    add_quantize_argument(parser)
    action = parser._option_string_actions["--quantize"]
    assert action.choices == ["int8", "int4"] and action.default is None
    assert action.help == ("weight-only int8 (per output channel) or int4 (groups of 32 columns) linear layers (CPU;"
                           " docs/quantize.md); a folder written by `slmlab quantize` is quantized already")
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exc:
        cli.main(["quantize", "--help"])
    words = " ".join(capsys.readouterr().out.split())
    assert exc.value.code == 0 and ("--scheme SCHEME the weight format: int8 (per output channel) or int4 (groups of 32"
                                    " input columns, a scale and a zero each)") in words
