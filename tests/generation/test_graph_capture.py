"""Graph capture: ``torch.export`` of every family's forward, ONNX (run by onnxruntime) of Lumen and
LFM2, and training forwards that ``torch.compile`` captures without a graph break.

Captured outputs must equal eager ones within 1e-5 (fp32), the capture must leave no traced tensor
behind in the model (eager calls after it still return real tensors), and the eager input checks
the capture skips must still raise.
"""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from slmlab.models import get_family

TINY = {
    "lumen": dict(vocab_size=97, hidden_dim=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_dim=48,
                  max_seq_len=64),
    "lfm2": dict(vocab_size=97, hidden_size=32, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                 num_layers=4, layer_order=["conv", "attn", "conv", "attn"], block_multiple_of=16,
                 max_position_embeddings=64),
    "pgsm": dict(vocab_size=61, block_size=64, dim=32, layers=2, hidden=48, kernel_size=5, retrieval_dim=16,
                 retrieval_heads=2),
    "nanohammer": dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, num_state_heads=3, state_hidden_size=12, max_position_embeddings=96,
                       bos_token_id=None, eos_token_id=None),
    "neollm": None,  # the neollm-tiny preset: Spelling Bee, IHA, REPO-GRAPE, momentum, XSA, Hadamard output
}
# Families whose exported graph takes any batch size and any sequence length from this minimum up
# (NanoHammer takes lengths 1-2 down another path; NeoLLM's blocked paths specialise the length).
DYNAMIC = {"lumen": 0, "lfm2": 0, "pgsm": 0, "nanohammer": 3}


def build(family: str, seed: int = 0) -> torch.nn.Module:
    fam = get_family(family)
    config = fam.make_config("neollm-tiny") if TINY[family] is None else fam.make_config(**TINY[family])
    torch.manual_seed(seed)
    model = fam.model_class(config).eval()
    if family == "neollm":  # Spelling Bee reads a byte table: a deterministic toy one
        table = [bytes((t * 7 + i) % 256 for i in range(t % 8)) for t in range(config.vocab_size)]
        model.model.spelling_bee.set_byte_table_from_bytes(table)
    return model


def ids_for(model: torch.nn.Module, batch: int, length: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (batch, length), generator=gen)


class Logits(torch.nn.Module):
    """``input_ids -> logits``: the graph an ONNX consumer runs (no cache)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def sequence_dims(model: torch.nn.Module, min_length: int = 0) -> dict:
    return {0: Dim("batch", max=64), 1: Dim("seq", min=min_length, max=model.max_positions())}


@pytest.mark.parametrize("family", sorted(TINY))
def test_export_equals_eager(family):
    model = build(family)  # exported before any eager call: no cache of the model is warm yet
    ids = ids_for(model, 2, 12)
    dynamic = family in DYNAMIC
    shapes = {"input_ids": sequence_dims(model, DYNAMIC[family]), "use_cache": None} if dynamic else None
    program = torch.export.export(model, (), {"input_ids": ids, "use_cache": False}, dynamic_shapes=shapes)
    captured = program.module()
    for x in [ids, ids_for(model, 3, 20, seed=2)] if dynamic else [ids]:
        want = model(input_ids=x, use_cache=False).logits
        assert type(want) is torch.Tensor  # the trace left no fake tensor in the model's caches
        torch.testing.assert_close(captured(input_ids=x, use_cache=False).logits, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", sorted(TINY))
def test_export_with_padding_mask_equals_eager(family):
    """A left-padded batch through the exported graph: the graph always takes the masked path, which
    is exact for an all-ones mask too; real positions equal eager within 1e-5."""
    model = build(family)
    ids = ids_for(model, 2, 12)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    dynamic = family in DYNAMIC
    dims = sequence_dims(model, DYNAMIC.get(family, 0))
    shapes = {"input_ids": dims, "attention_mask": dims, "use_cache": None}
    program = torch.export.export(model, (), {"input_ids": ids, "attention_mask": mask, "use_cache": False},
                                  dynamic_shapes=shapes if dynamic else None)
    for m in (mask, torch.ones_like(ids)):
        want = model(input_ids=ids, attention_mask=m, use_cache=False).logits
        got = program.module()(input_ids=ids, attention_mask=m, use_cache=False).logits
        real = m.bool()
        torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=0)


def test_eager_checks_survive_capture():
    model = build("lumen")
    ids = ids_for(model, 2, 12)
    torch.export.export(model, (), {"input_ids": ids, "use_cache": False})
    bad = ids.clone()
    bad[0, 3] = model.config.vocab_size
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(input_ids=bad)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(input_ids=ids, labels=bad)
    # the RoPE table still grows on demand in eager mode (positions past the initial table)
    rotary = model.model.rotary_emb
    cos, _ = rotary(torch.tensor([[rotary._initial_len + 5]]))
    assert cos.shape == (1, 1, rotary.rotary_dim)


@pytest.mark.slow  # ~16 s each on an idle 2-core machine: the dynamo exporter plus onnxscript's translation
@pytest.mark.parametrize("family", ["lumen", "lfm2"])
def test_onnx_equals_eager(family, tmp_path):
    ort = pytest.importorskip("onnxruntime", reason='ONNX export needs the onnx extra: pip install "slmlab[onnx]"')
    pytest.importorskip("onnxscript", reason='ONNX export needs the onnx extra: pip install "slmlab[onnx]"')
    model = build(family)
    wrapper = Logits(model).eval()
    ids = ids_for(model, 2, 12)
    program = torch.onnx.export(wrapper, (ids,), dynamo=True, dynamic_shapes={"input_ids": sequence_dims(model)})
    path = tmp_path / f"{family}.onnx"
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    for x in (ids, ids_for(model, 3, 20, seed=2)):
        got = torch.from_numpy(session.run(None, {name: x.numpy()})[0])
        with torch.no_grad():
            torch.testing.assert_close(got, wrapper(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", sorted(TINY))
def test_training_forward_has_no_graph_break(family):
    model = build(family).train()
    ids = ids_for(model, 2, 12)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(input_ids=ids, labels=ids, use_cache=False)
    assert explained.graph_break_count == 0, [reason.reason.splitlines()[0] for reason in explained.break_reasons]


@pytest.mark.parametrize("family", ["lumen", "lfm2"])
def test_fullgraph_training_step_equals_eager(family):
    """``torch.compile(fullgraph=True)`` traces forward and backward (aot_eager: the same graphs
    inductor gets, without its C++ build); loss and every gradient equal eager's."""
    eager, compiled = build(family).train(), build(family).train()
    ids = ids_for(eager, 2, 12)
    torch._dynamo.reset()
    step = torch.compile(compiled, fullgraph=True, backend="aot_eager")
    want = eager(input_ids=ids, labels=ids, use_cache=False).loss
    got = step(input_ids=ids, labels=ids, use_cache=False).loss
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=0, msg=name)


@pytest.mark.slow
def test_inductor_training_step_equals_eager():
    """The real backend: inductor compiles a Lumen training step (forward + backward) in one graph."""
    eager, compiled = build("lumen").train(), build("lumen").train()
    ids = ids_for(eager, 2, 12)
    torch._dynamo.reset()
    step = torch.compile(compiled, fullgraph=True)
    want = eager(input_ids=ids, labels=ids, use_cache=False).loss
    got = step(input_ids=ids, labels=ids, use_cache=False).loss
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=0, msg=name)
