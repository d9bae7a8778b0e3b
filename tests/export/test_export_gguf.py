"""GGUF export (lumen -> llama.cpp 'llama', lfm2 -> 'lfm2'): the file read back with the ``gguf``
package holds every weight and the run's own tokenizer; other families, dtypes and outputs are
refused; with llama-cpp-python installed, llama.cpp decodes the file to slmlab's greedy tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason='the GGUF export needs the `gguf` package: pip install "slmlab[export]"')

from slmlab.data.byte_alphabet import byte_to_unicode  # noqa: E402
from slmlab.data.tokenizers import byte_tokenizer, train_bpe  # noqa: E402
from slmlab.export.gguf import export_gguf  # noqa: E402
from slmlab.generation import generate  # noqa: E402
from slmlab.models.lfm2 import Lfm2SmallConfig, Lfm2SmallForCausalLM  # noqa: E402
from slmlab.models.lumen import LumenConfig, LumenForCausalLM  # noqa: E402

TEXTS = [
    "ROMEO: But soft, what light through yonder window breaks? It is the east, and Juliet is the sun.",
    "JULIET: O Romeo, Romeo, wherefore art thou Romeo? Deny thy father and refuse thy name.",
    "The quick brown fox jumps over the lazy dog; 1234 numbers, tabs\tand\nnew lines.",
] * 8
LUMEN = dict(vocab_size=320, hidden_dim=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_dim=128, max_seq_len=256)
LFM2 = dict(vocab_size=320, hidden_size=64, intermediate_size=192, num_attention_heads=4, num_key_value_heads=2,
            num_layers=3, layer_order=["conv", "attn", "conv"], block_multiple_of=64, max_position_embeddings=256)
BUILD = {"lumen": (LumenConfig, LumenForCausalLM, LUMEN), "lfm2": (Lfm2SmallConfig, Lfm2SmallForCausalLM, LFM2)}

# slmlab name -> llama.cpp name, written out here (not taken from the exporter) for the tiny configs above.
LLAMA_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    **{f"model.layers.{i}.{a}.weight": f"blk.{i}.{b}.weight" for i in range(2) for a, b in [
        ("input_layernorm", "attn_norm"), ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"), ("self_attn.o_proj", "attn_output"), ("post_attention_layernorm", "ffn_norm"),
        ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down")]},
}
_LFM2_COMMON = [("operator_norm", "attn_norm"), ("ffn_norm", "ffn_norm"), ("feed_forward.w1", "ffn_gate"),
                ("feed_forward.w3", "ffn_up"), ("feed_forward.w2", "ffn_down")]
_LFM2_CONV = [("conv.in_proj", "shortconv.in_proj"), ("conv.conv", "shortconv.conv"), ("conv.out_proj", "shortconv.out_proj")]
_LFM2_ATTN = [("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
              ("self_attn.out_proj", "attn_output"), ("self_attn.q_layernorm", "attn_q_norm"),
              ("self_attn.k_layernorm", "attn_k_norm")]
LFM2_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight", "model.embedding_norm.weight": "token_embd_norm.weight",
    **{f"model.layers.{i}.{a}.weight": f"blk.{i}.{b}.weight" for i, kind in enumerate(LFM2["layer_order"])
       for a, b in _LFM2_COMMON + (_LFM2_CONV if kind == "conv" else _LFM2_ATTN)},
}
NAMES = {"lumen": LLAMA_NAMES, "lfm2": LFM2_NAMES}


@pytest.fixture(scope="module")
def bpe():
    return train_bpe(TEXTS, vocab_size=300)


def build(family: str, **overrides):
    config_class, model_class, kwargs = BUILD[family]
    torch.manual_seed(0)
    return model_class(config_class(**{**kwargs, **overrides})).eval()


def save(tmp_path, model, tokenizer, name="run"):
    folder = tmp_path / name
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def read(path):
    """``({name: float32 array in the model's [rows, cols] order}, {name: GGML type}, {key: value})``."""
    reader = gguf.GGUFReader(path)
    arrays, types = {}, {}
    for t in reader.tensors:
        shape = [int(n) for n in reversed(t.shape)]  # GGUF lists the fastest axis first
        arrays[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        types[t.name] = t.tensor_type
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    return arrays, types, fields


def from_llama_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order (per head, rows 0, D/2, 1, D/2+1, ... back to 0..D)."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, w.shape[1]).transpose(0, 2, 1, 3).reshape(w.shape)


def expected_arrays(family: str, model) -> dict[str, np.ndarray]:
    state = {k: v.float().numpy() for k, v in model.state_dict().items()}
    return {gname: state[name].reshape(state[name].shape[0], -1) if state[name].ndim == 3 else state[name]
            for name, gname in NAMES[family].items()}


def undo_layout(family: str, name: str, array: np.ndarray, config) -> np.ndarray:
    if family == "lumen" and name.endswith("attn_q.weight"):
        return from_llama_rows(array, config.num_heads)
    if family == "lumen" and name.endswith("attn_k.weight"):
        return from_llama_rows(array, config.num_kv_heads)
    return array


def q8_bound(ref: np.ndarray) -> np.ndarray:
    """Per-element error bound of q8_0: half a step of its 32-value block's scale (amax / 127), plus
    the f16 rounding of that scale."""
    blocks = np.abs(ref.reshape(-1, 32)).max(axis=1, keepdims=True) / 127
    return np.broadcast_to(blocks * 0.5 + blocks * 127 * 2e-3 + 1e-7, (blocks.shape[0], 32)).reshape(ref.shape)


def q4_bound(ref: np.ndarray) -> np.ndarray:
    """Per-element error bound of q4_0: its 32-value block's scale is the signed extreme / -8, so the extreme is
    exact and a value of the other sign near -extreme clamps at code 15: up to one step (amax / 8), plus the
    f16 rounding of the scale over 8 steps."""
    amax = np.abs(ref.reshape(-1, 32)).max(axis=1, keepdims=True)
    return np.broadcast_to(amax / 8 + amax * 2e-3 + 1e-7, (amax.shape[0], 32)).reshape(ref.shape)


@pytest.mark.parametrize("family", ["lumen", "lfm2"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0", "q4_0"])
def test_every_tensor_reads_back(tmp_path, bpe, family, dtype):
    model = build(family)
    out = export_gguf(save(tmp_path, model, bpe), tmp_path / "m.gguf", dtype=dtype, force=False)
    arrays, types, fields = read(out)
    expected = expected_arrays(family, model)
    assert set(arrays) == set(expected)  # tied head: no output.weight, llama.cpp reuses token_embd
    assert fields["general.architecture"] == {"lumen": "llama", "lfm2": "lfm2"}[family]
    for name, ref in expected.items():
        got = undo_layout(family, name, arrays[name], model.config)
        assert got.shape == ref.shape, name
        kept_f32 = ref.ndim == 1 or "norm" in name or "shortconv.conv" in name
        if dtype == "f32" or kept_f32:
            assert types[name] == gguf.GGMLQuantizationType.F32, name
            np.testing.assert_array_equal(got, ref, err_msg=name)
        elif dtype == "f16":
            assert types[name] == gguf.GGMLQuantizationType.F16, name
            np.testing.assert_allclose(got, ref, atol=1e-3, rtol=0, err_msg=name)
        elif dtype == "q8_0":
            assert types[name] == gguf.GGMLQuantizationType.Q8_0, name
            assert np.all(np.abs(got - ref) <= q8_bound(ref)), name
        else:
            assert types[name] == gguf.GGMLQuantizationType.Q4_0, name
            assert np.all(np.abs(got - ref) <= q4_bound(ref)), name
            assert np.abs(got - ref).max() > q8_bound(ref).max(), name  # 4 bits, not 8


def test_llama_rows_are_permuted_for_rotary_pairs(tmp_path, bpe):
    """The q/k matrices are not stored as they are: llama.cpp rotates adjacent pairs."""
    model = build("lumen")
    arrays, _, _ = read(export_gguf(save(tmp_path, model, bpe), tmp_path / "m.gguf", dtype="f32", force=False))
    q = model.model.layers[0].self_attn.q_proj.weight.detach().numpy()
    assert not np.array_equal(arrays["blk.0.attn_q.weight"], q)
    np.testing.assert_array_equal(arrays["blk.0.attn_q.weight"][1], q[model.config.head_dim // 2])


def test_untied_head_is_written(tmp_path, bpe):
    model = build("lumen", tie_word_embeddings=False)
    arrays, _, _ = read(export_gguf(save(tmp_path, model, bpe), tmp_path / "m.gguf", dtype="f32", force=False))
    np.testing.assert_array_equal(arrays["output.weight"], model.lm_head.weight.detach().numpy())


def test_metadata(tmp_path, bpe):
    model = build("lfm2")
    trained = train_bpe(TEXTS, vocab_size=300)
    trained.model_max_length = 64  # what `slmlab train` records: the context the run trained on
    _, _, f = read(export_gguf(save(tmp_path, model, trained), tmp_path / "m.gguf", dtype="f32", force=False))
    assert f["lfm2.context_length"] == 64
    assert f["lfm2.attention.head_count_kv"] == [0, 2, 0]  # conv layers have no KV heads
    assert f["lfm2.shortconv.l_cache"] == 3
    assert f["lfm2.feed_forward_length"] == model.config.effective_intermediate_size
    assert f["lfm2.block_count"] == 3 and f["lfm2.embedding_length"] == 64 and f["lfm2.vocab_size"] == 320
    model = build("lumen")
    _, _, f = read(export_gguf(save(tmp_path, model, bpe, "lumen"), tmp_path / "l.gguf", dtype="q8_0", force=False))
    assert (f["llama.attention.head_count"], f["llama.attention.head_count_kv"]) == (4, 2)
    assert f["llama.rope.dimension_count"] == 16
    assert f["llama.context_length"] == 256  # no trained context recorded: the model's position limit
    assert f["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_Q8_0)


def test_bpe_tokenizer_is_the_runs(tmp_path, bpe):
    model = build("lumen")
    _, _, f = read(export_gguf(save(tmp_path, model, bpe), tmp_path / "m.gguf", dtype="f32", force=False))
    n = len(bpe)
    assert f["tokenizer.ggml.model"] == "gpt2" and f["tokenizer.ggml.pre"] == "gpt-2"
    assert f["tokenizer.ggml.tokens"] == bpe.convert_ids_to_tokens(list(range(n))) + [f"[PAD{i}]" for i in range(n, 320)]
    merges = json.loads(bpe.backend_tokenizer.to_str())["model"]["merges"]
    assert f["tokenizer.ggml.merges"] == [" ".join(m) if isinstance(m, list) else m for m in merges]
    assert len(f["tokenizer.ggml.merges"]) > 0
    assert (f["tokenizer.ggml.bos_token_id"], f["tokenizer.ggml.eos_token_id"], f["tokenizer.ggml.padding_token_id"]) == (
        bpe.bos_token_id, bpe.eos_token_id, bpe.pad_token_id)
    types = f["tokenizer.ggml.token_type"]
    specials = {bpe.bos_token_id, bpe.eos_token_id, bpe.pad_token_id}
    assert [types[i] for i in sorted(specials)] == [gguf.TokenType.CONTROL] * 3
    assert all(types[i] == gguf.TokenType.NORMAL for i in range(n) if i not in specials)
    assert all(t == gguf.TokenType.UNUSED for t in types[n:])
    assert f["tokenizer.ggml.add_bos_token"] is False and f["tokenizer.ggml.add_eos_token"] is False


def test_byte_tokenizer(tmp_path):
    tok = byte_tokenizer()
    model = build("lfm2")
    _, _, f = read(export_gguf(save(tmp_path, model, tok), tmp_path / "m.gguf", dtype="f32", force=False))
    tokens = f["tokenizer.ggml.tokens"]
    assert tokens[:256] == [byte_to_unicode()[b] for b in range(256)]
    assert tokens[256:259] == ["<bos>", "<eos>", "<pad>"]
    assert f["tokenizer.ggml.merges"] == []  # present though empty: llama.cpp requires the key
    assert (f["tokenizer.ggml.bos_token_id"], f["tokenizer.ggml.eos_token_id"]) == (256, 257)


def test_chat_template_is_carried_without_generation_markers(tmp_path):
    """llama.cpp formats conversations with ``tokenizer.chat_template``: the tokenizer's own (here slmlab's
    default), minus transformers' ``{% generation %}`` markers, rendering the same text."""
    from slmlab.data.chat import DEFAULT_CHAT_TEMPLATE, render_chat_text

    tok = byte_tokenizer()
    _, _, f = read(export_gguf(save(tmp_path, build("lfm2"), tok), tmp_path / "m.gguf", dtype="f32", force=False))
    template = f["tokenizer.chat_template"]
    assert "{%- generation" not in template and "endgeneration" not in template and template != DEFAULT_CHAT_TEMPLATE
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}]
    plain = tok.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True)
    assert plain == render_chat_text(tok, messages) == "System: Be terse.\nUser: 2+2?\nAssistant: 4\nUser: 3+3?\nAssistant:"


def test_model_without_tokenizer_is_ids_only(tmp_path):
    model = build("lumen")
    _, _, f = read(export_gguf(save(tmp_path, model, None), tmp_path / "m.gguf", dtype="f32", force=False))
    assert f["tokenizer.ggml.model"] == "none" and "tokenizer.ggml.tokens" not in f


def test_synthetic_task_run_is_ids_only(tmp_path):
    """A synthetic-task run's byte tokenizer only labels the task's ids: no vocabulary, no specials."""
    folder = save(tmp_path, build("lumen"), byte_tokenizer())
    (folder / "run.yaml").write_text("data: mqar:cpu\n")
    _, _, f = read(export_gguf(folder, tmp_path / "m.gguf", dtype="f32", force=False))
    assert f["tokenizer.ggml.model"] == "none" and "tokenizer.ggml.eos_token_id" not in f


def test_refuses_other_families(tmp_path):
    from slmlab.models.pgsm import PGSMConfig, PGSMForCausalLM
    from test_pgsm import TINY

    folder = save(tmp_path, PGSMForCausalLM(PGSMConfig(**TINY)), None)
    # the supported families in the registry's order (the family folders', alphabetical)
    with pytest.raises(ValueError, match=r"'pgsm'.*supported: lfm2 \(llama.cpp 'lfm2'\), lumen \(llama.cpp 'llama'\);"):
        export_gguf(folder, tmp_path / "m.gguf", dtype="f32", force=False)
    assert not (tmp_path / "m.gguf").exists()


def test_every_declared_architecture_is_one_gguf_knows():
    from slmlab.models.registry import families, get_export_info

    declared = {name: get_export_info(fam).gguf_arch for name, fam in families().items()}
    assert {n: a for n, a in declared.items() if a} == {"lumen": "llama", "lfm2": "lfm2"}
    assert {a for a in declared.values() if a} <= set(gguf.MODEL_ARCH_NAMES.values())


@pytest.mark.parametrize("family", sorted(BUILD))
def test_every_metadata_key_is_a_gguf_writer_method(family):
    from slmlab.models.registry import get_export_info

    config_class, _, kwargs = BUILD[family]
    metadata = get_export_info(family).gguf.metadata(config_class(**kwargs))
    assert metadata["block_count"] == kwargs["num_layers"] and metadata["vocab_size"] == kwargs["vocab_size"]
    assert [key for key in metadata if not callable(getattr(gguf.GGUFWriter, f"add_{key}", None))] == []


@pytest.mark.parametrize("dtype", ["q4_k", "bf16", "F32"])
def test_refuses_unknown_dtype(tmp_path, bpe, dtype):
    folder = save(tmp_path, build("lumen"), bpe)
    with pytest.raises(ValueError, match="f32, f16, q8_0, q4_0"):
        export_gguf(folder, tmp_path / "m.gguf", dtype=dtype, force=False)


def test_refuses_q8_0_when_rows_are_not_whole_blocks(tmp_path, bpe):
    folder = save(tmp_path, build("lumen", hidden_dim=48, intermediate_dim=96), bpe)
    with pytest.raises(ValueError, match="q8_0 needs every matrix row to be a multiple of 32.*use --dtype f16 or f32"):
        export_gguf(folder, tmp_path / "m.gguf", dtype="q8_0", force=False)
    assert not (tmp_path / "m.gguf").exists() and not list(tmp_path.glob(".m.gguf*"))
    export_gguf(folder, tmp_path / "m.gguf", dtype="f16", force=False)  # the same model takes f16


@pytest.mark.parametrize(("family", "overrides", "message"), [
    ("lumen", dict(intermediate_dim=0), "no MLP sublayer"),
    ("lfm2", dict(conv_bias=True), "conv biases"),
])
def test_refuses_what_llama_cpp_cannot_run(tmp_path, bpe, family, overrides, message):
    folder = save(tmp_path, build(family, **overrides), bpe)
    with pytest.raises(ValueError, match=message):
        export_gguf(folder, tmp_path / "m.gguf", dtype="f32", force=False)


def test_existing_output_needs_force(tmp_path, bpe):
    folder = save(tmp_path, build("lumen"), bpe)
    out = tmp_path / "m.gguf"
    out.write_bytes(b"keep me")
    with pytest.raises(ValueError, match="already exists; pass --force"):
        export_gguf(folder, out, dtype="f32", force=False)
    assert out.read_bytes() == b"keep me"
    export_gguf(folder, out, dtype="f32", force=True)
    assert read(out)[2]["general.architecture"] == "llama"
    with pytest.raises(ValueError, match="is a folder"):
        export_gguf(folder, tmp_path, dtype="f32", force=True)


# -- llama.cpp itself ------------------------------------------------------------------------------


def llama_cpp_greedy(path, prompt: list[int], n: int):
    """``(n greedy tokens, the Llama)`` from llama.cpp (f32 K/V cache, one thread) after ``prompt``."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_batch=256, n_threads=1, type_k=0, type_v=0,
                          logits_all=True, verbose=False)
    llm.eval(prompt)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([out[-1]])
    return out, llm


@pytest.mark.slow
@pytest.mark.parametrize("family", ["lumen", "lfm2"])
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_llama_cpp_decodes_the_same_greedy_tokens(tmp_path, bpe, family, dtype):
    pytest.importorskip("llama_cpp", reason='llama.cpp check needs llama-cpp-python (pip install "slmlab[llamacpp]",'
                        " a ~20-minute source build on 2 cores)")
    # a wider init than the default spreads the logits, so the greedy path has no near-ties
    model = build(family, initializer_range=0.2)
    out = export_gguf(save(tmp_path, model, bpe), tmp_path / "m.gguf", dtype=dtype, force=False)
    text = TEXTS[0]
    ids = bpe(text, add_special_tokens=False)["input_ids"]
    ours = generate(model, torch.tensor([ids]), 64)[0, len(ids):].tolist()
    theirs, llm = llama_cpp_greedy(out, ids, 64)
    assert theirs == ours
    assert llm.tokenize(text.encode(), add_bos=False, special=False) == ids  # the same ids as the run's tokenizer
