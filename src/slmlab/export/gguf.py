"""GGUF export: a model, with its own tokenizer, as one llama.cpp file.

A family exports to GGUF when its ``convert.py`` declares a llama.cpp architecture
(``EXPORT.gguf``, a :class:`slmlab.models.export_info.GGUFLayout`, looked up through
:func:`slmlab.models.registry.get_export_info`): the family writes the architecture's
hyper-parameters and puts each tensor in llama.cpp's layout; this module does the rest, for every
family, with the ``gguf`` package (``pip install "slmlab[export]"``), following llama.cpp's own
converter (``convert_hf_to_gguf.py``), which is not used:

* tensor names come from ``gguf``'s name map of the architecture (``model.layers.0.self_attn.q_proj``
  -> ``blk.0.attn_q``); a tied LM head is not written (llama.cpp reuses ``token_embd``);
* norms and 1-D tensors stay f32 whatever the dtype (and what the family keeps in f32, e.g. a conv
  kernel); ``f16``, ``q8_0`` and ``q4_0`` apply to the matrices. ``q8_0`` and ``q4_0`` need every matrix
  row to be a whole number of 32-value blocks;
* ``context_length`` (llama.cpp's training context and default ``n_ctx``) is the context the run
  trained on when recorded (:func:`slmlab.train.saved.trained_context`), else the model's position
  limit.

llama.cpp's converter recognises a tokenizer by the hash of a few known vocabularies and rejects
slmlab's per-run BPE; here the run's own vocabulary is written: tokens in ids order (padded with
unused ``[PADi]`` tokens up to the model's ``vocab_size``), their types (specials are control
tokens), the merges in rank order, bos/eos/pad ids, ``tokenizer.ggml.model = "gpt2"`` and the
pre-tokenizer ``gpt-2``, whose split regex is that of the ``tokenizers`` ByteLevel pre-tokenizer
slmlab's BPE and byte tokenizers use. Neither adds bos/eos when encoding (as slmlab's tokenizer).
A model saved without a tokenizer, or a synthetic-task run (whose ids are the task's own; its byte
tokenizer only labels them), gets ``tokenizer.ggml.model = "none"``: llama.cpp then takes token ids
only.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..data.chat import plain_chat_template
from ..outputs import publish_file_mode

if TYPE_CHECKING:
    from ..models.export_info import GGUFLayout

DTYPES = ("f32", "f16", "q8_0", "q4_0")
Q8_BLOCK = 32


def export_gguf(source: Path, out: Path, *, dtype: str = "f32", force: bool = False) -> Path:
    """Write the model at ``source`` (run, checkpoint or saved-model folder) to the GGUF file ``out``.

    Args:
        source: a run folder (its newest checkpoint), a checkpoint folder or a saved model folder.
        out: the ``.gguf`` file to write (its folder is created).
        dtype: ``f32``, ``f16``, ``q8_0`` or ``q4_0`` for the weight matrices.
        force: overwrite ``out`` if it exists.
    Returns:
        ``out``.
    Raises:
        ValueError: a family llama.cpp does not run, a dtype the model cannot take, an existing
            ``out`` without ``force``, a tokenizer that is not byte-level BPE.
    """
    from ..train.saved import open_checkpoint
    from .common import load_source

    check_dtype(dtype)
    out = Path(out)
    _check_out_file(out, force)
    saved = open_checkpoint(source)  # resolved and checked once
    gguf_layout(saved.family.name)  # refused before any weight is read
    src = load_source(saved)
    # a synthetic task's ids are its own (its byte tokenizer only labels them): ids only, no specials
    synthetic = src.tokenizer is not None and all(v is None for v in src.special_ids.values())
    return write_gguf(src.model, None if synthetic else src.tokenizer, out, dtype=dtype,
                      name=(src.run_dir or src.checkpoint).name, special_ids=src.special_ids,
                      context_length=src.trained_context)


def check_dtype(dtype: str) -> None:
    """Refuse a dtype other than :data:`DTYPES`."""
    if dtype not in DTYPES:
        raise ValueError(f"GGUF dtype {dtype!r} is not supported; choose one of {', '.join(DTYPES)}")


def gguf_layout(family: str) -> GGUFLayout:
    """The family's llama.cpp layout (its ``EXPORT.gguf``); refuses a family with none, naming those
    that export."""
    from ..models.registry import families, get_export_info

    layout = get_export_info(family).gguf
    if layout is None:
        arches = {name: get_export_info(fam).gguf_arch for name, fam in families().items()}
        supported = ", ".join(f"{name} (llama.cpp '{arch}')" for name, arch in arches.items() if arch is not None)
        raise ValueError(
            f"family {family!r} has no llama.cpp architecture, so it cannot be exported to GGUF; supported: "
            f"{supported}; export it with --to hf instead"
        )
    return layout


def _check_out_file(out: Path, force: bool) -> None:
    if out.is_dir():
        raise ValueError(f"{out} is a folder; give the path of the .gguf file to write")
    if out.exists() and not force:
        raise ValueError(f"{out} already exists; pass --force to overwrite it, or choose another path")


# -- tensors ---------------------------------------------------------------------------------------


def _model_tensors(model, arch, transform: Callable | None) -> Iterator[tuple[str, str, object]]:
    """``(gguf name, slmlab name, float32 numpy array)`` for every weight the file holds, in the
    family's llama.cpp layout (``transform``, :attr:`GGUFLayout.tensor`)."""
    import gguf

    config = model.config
    name_map = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    table = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is table
    for name, tensor in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue  # llama.cpp uses token_embd when output.weight is absent
        gguf_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"{name} has no GGUF tensor name in llama.cpp's {gguf.MODEL_ARCH_NAMES[arch]!r} architecture")
        array = tensor.detach().float().cpu().numpy()
        yield gguf_name, name, transform(name, array, config) if transform is not None else array


def _tensor_type(gguf_name: str, array, dtype: str, keep_f32: tuple[str, ...] = ()):
    """The GGML type of one tensor: f32 for norms, 1-D tensors and the tensors the family keeps in
    f32 (``keep_f32``, as llama.cpp's converter), ``dtype`` for the matrices."""
    import gguf

    t = gguf.GGMLQuantizationType
    if array.ndim == 1 or gguf_name.endswith("_norm.weight") or any(part in gguf_name for part in keep_f32):
        return t.F32
    return {"f32": t.F32, "f16": t.F16, "q8_0": t.Q8_0, "q4_0": t.Q4_0}[dtype]


# -- tokenizer -------------------------------------------------------------------------------------


@dataclass
class GGUFVocab:
    """A tokenizer as llama.cpp's BPE vocabulary reads it.

    Args:
        tokens: the token strings by id (byte-level alphabet, as in ``tokenizer.json``), padded to the
            model's vocabulary with ``[PADi]``.
        types: ``gguf.TokenType`` per token.
        merges: ``"left right"`` in rank order.
        bos, eos, pad: special ids (None when the tokenizer has none).
    """

    tokens: list[str]
    types: list[int]
    merges: list[str]
    bos: int | None
    eos: int | None
    pad: int | None
    chat_template: str | None = None


def gguf_vocab(tokenizer, vocab_size: int, special_ids: dict | None = None) -> GGUFVocab:
    """The GGUF vocabulary of a byte-level BPE ``PreTrainedTokenizerFast`` (slmlab's BPE and byte
    tokenizers), for a model of ``vocab_size`` rows, with ``special_ids`` (default: the tokenizer's
    bos/eos/pad); refuses a tokenizer llama.cpp would split differently."""
    import gguf

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    _check_byte_level_bpe(spec)
    vocab = tokenizer.get_vocab()
    if len(vocab) > vocab_size or max(vocab.values()) >= vocab_size:
        raise ValueError(
            f"the tokenizer has {len(vocab)} tokens (largest id {max(vocab.values())}) but the model has only"
            f" vocab_size={vocab_size} rows; the model and tokenizer do not belong together"
        )
    by_id = {i: tok for tok, i in vocab.items()}
    added = {i: t for i, t in tokenizer.added_tokens_decoder.items()}
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(added[i].content)
            types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"].get("merges") or []]
    ids = special_ids or {name: getattr(tokenizer, name) for name in ("bos_token_id", "eos_token_id", "pad_token_id")}
    return GGUFVocab(tokens, [int(t) for t in types], merges, ids["bos_token_id"], ids["eos_token_id"], ids["pad_token_id"],
                     plain_chat_template(tokenizer))


def _check_byte_level_bpe(spec: dict) -> None:
    """A ``tokenizer.json`` llama.cpp's ``gpt2`` model with the ``gpt-2`` pre-tokenizer reproduces:
    a BPE model without byte fallback or affixes, no normalizer, a ByteLevel pre-tokenizer with the
    GPT-2 regex and no prefix space."""
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    problems = []
    if model.get("type") != "BPE":
        problems.append(f"model type {model.get('type')!r} (need BPE)")
    if model.get("byte_fallback") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        problems.append("BPE with byte fallback or subword affixes")
    if spec.get("normalizer") is not None:
        problems.append(f"a normalizer ({spec['normalizer'].get('type')})")
    if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) or pre.get("add_prefix_space"):
        problems.append(f"pre-tokenizer {pre.get('type')!r} (need ByteLevel with its regex and no prefix space)")
    if problems:
        raise ValueError(
            "the model's tokenizer is not a byte-level BPE llama.cpp can reproduce: " + "; ".join(problems)
            + "; train one with `slmlab tokenizer train` or use the byte tokenizer"
        )


def _add_vocab(writer, vocab: GGUFVocab | None, vocab_size: int) -> None:
    import gguf

    if vocab is None:
        writer.add_tokenizer_model("none")
        return
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    # an empty list is still written: llama.cpp requires the key for a gpt2 vocabulary (byte tokenizer)
    writer.add_key_value(gguf.Keys.Tokenizer.MERGES, vocab.merges, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)
    for add, token_id in ((writer.add_bos_token_id, vocab.bos), (writer.add_eos_token_id, vocab.eos),
                          (writer.add_pad_token_id, vocab.pad)):
        if token_id is not None:
            add(token_id)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    if vocab.chat_template:  # llama.cpp's chat / server format conversations with it
        writer.add_chat_template(vocab.chat_template)


def _writer_class():
    """``gguf.GGUFWriter`` that can also write an empty array (it refuses by default)."""
    import gguf

    class Writer(gguf.GGUFWriter):
        def _pack_val(self, val, vtype, add_vtype, sub_type=None):
            if vtype == gguf.GGUFValueType.ARRAY and len(val) == 0 and sub_type is not None:
                head = self._pack("I", vtype) if add_vtype else b""
                return head + self._pack("I", sub_type) + self._pack("Q", 0)
            return super()._pack_val(val, vtype, add_vtype, sub_type=sub_type)

    return Writer


# -- the file --------------------------------------------------------------------------------------


def write_gguf(model, tokenizer, out: Path, *, dtype: str = "f32", name: str | None = None,
               special_ids: dict | None = None, context_length: int | None = None) -> Path:
    """Write ``model`` (of a family with a llama.cpp layout) and its ``tokenizer``, or None, to the
    GGUF file ``out`` (overwritten; written to a temporary file first, so a failure leaves no partial
    file).

    Args:
        model: a model of a family whose ``EXPORT.gguf`` is set (:func:`gguf_layout`).
        tokenizer: its byte-level BPE ``PreTrainedTokenizerFast``, or None (ids only).
        out: the file to write.
        dtype: ``f32``, ``f16``, ``q8_0`` or ``q4_0``.
        name: ``general.name`` (default: the family).
        special_ids: ``{"bos_token_id": .., "eos_token_id": .., "pad_token_id": ..}`` (default: the
            tokenizer's).
        context_length: the trained context (:func:`slmlab.train.saved.trained_context`; default:
            the model's position limit).
    """
    import gguf

    from ..models.registry import get_family

    check_dtype(dtype)
    family = get_family(model.config.model_type).name
    layout = gguf_layout(family)
    model_arch = {arch_name: arch for arch, arch_name in gguf.MODEL_ARCH_NAMES.items()}.get(layout.arch)
    if model_arch is None:
        raise ValueError(f"the {family} family names llama.cpp architecture {layout.arch!r}, which this gguf package"
                         " does not know; upgrade gguf (pip install -U gguf)")
    config = model.config
    tensors = []
    for gguf_name, slm_name, array in _model_tensors(model, model_arch, layout.tensor):
        qtype = _tensor_type(gguf_name, array, dtype, layout.keep_f32)
        if qtype in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0) and array.shape[-1] % Q8_BLOCK:
            raise ValueError(
                f"--dtype {dtype} needs every matrix row to be a multiple of {Q8_BLOCK} values; {slm_name} has rows of"
                f" {array.shape[-1]}: use --dtype f16 or f32"
            )
        tensors.append((gguf_name, array, qtype))
    vocab = None if tokenizer is None else gguf_vocab(tokenizer, config.vocab_size, special_ids)

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        writer = _writer_class()(tmp, gguf.MODEL_ARCH_NAMES[model_arch])
        writer.add_type(gguf.GGUFType.MODEL)
        writer.add_name(name or family)
        writer.add_context_length(context_length or config.max_position_embeddings)
        for key, value in layout.metadata(config).items():
            getattr(writer, f"add_{key}")(value)
        file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[dtype]
        writer.add_file_type(int(file_type))
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _add_vocab(writer, vocab, config.vocab_size)
        for gguf_name, array, qtype in tensors:
            writer.add_tensor(gguf_name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        publish_file_mode(tmp)  # 0644 under the usual umask, not mkstemp's 0600
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out
