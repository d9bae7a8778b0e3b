"""The bench's model table: an id -> how to build it for a task, with the parameter count it must have.

Ids of ``docs/bench.md`` (Models): the bench-only controls (:mod:`slmlab.bench.controls`) and
registered families at fixed configurations (PGSM, Lumen as ``attn4-llama``, LFM2 hybrids). Any
other registered family or ``family:preset`` is accepted too, built at its preset. Vocabulary and,
for learned positions / long filters, the length follow the task; fixed-context models (PGSM's
``block_size``, a preset's context) are checked against the task's ``T`` before any training.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .controls import ControlConfig, ControlForCausalLM

_PGSM_CPU = dict(block_size=128, dim=64, layers=3, hidden=128, kernel_size=17, retrieval_dim=128, retrieval_heads=4,
                 init_std=0.1)
_NORET = dict(use_sparse_retrieval=False, use_post_retrieval_block=False)
# pgsm-small (the seed's T7 setting) with every size divided by 8: the retrieval_dim claim on the CPU
_PGSM_RD_CPU = dict(block_size=128, dim=24, layers=3, hidden=48, kernel_size=17, retrieval_dim=64, retrieval_heads=4,
                    init_std=0.1)
# NeoLLM at its defaults but small; Spelling Bee off (it spells token ids as text bytes: task ids are no text)
_NEOLLM_BENCH = dict(use_spelling_bee_embeddings=False)
# NeoLLM's fit at 200k non-embedding parameters (docs/results/compare-t2-200k/fitted_configs.json) with every default
# on, Spelling Bee included, as `slmlab compare` trains it: a task's ids are labelled by the byte tokenizer, so id k
# spells as the one byte k (build_model attaches that table), a second learned embedding of every id.
_NEOLLM_200K = dict(tie_word_embeddings=True, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8, intermediate_size=408, use_hadamard_o_proj=True,
                    iha_local_global_pattern="LLLG")
_HYBRID = ["conv", "full_attention", "conv", "full_attention"]


@dataclass(frozen=True)
class ModelEntry:
    """One row of the table.

    Args:
        id: the name used on the command line.
        family: ``"control"`` or a registry spec (``pgsm``, ``pgsm:pgsm-small``, ``lumen``, ...).
        config: config fields (control: :class:`ControlConfig` fields; family: overrides of its preset).
        description: one line for ``slmlab bench list``.
        length_field: a config field set to the task's ``T`` (learned positions, long filter), or None.
        params: ``(total, non-embedding)`` at ``reference`` (vocab_size, T), asserted by a test.
        reference: the ``vocab_size`` and ``T`` at which ``params`` holds.
    """

    id: str
    family: str
    config: dict
    description: str
    length_field: str | None = None
    params: tuple[int, int] | None = None
    reference: dict = field(default_factory=lambda: dict(vocab_size=256, T=128))


MODELS: dict[str, ModelEntry] = {e.id: e for e in [
    ModelEntry("attn2-z", "control", dict(d_model=64, n_layers=2, n_heads=1, positions="learned"),
               "Zoology attention: 2 layers, 1 head, learned positions, LayerNorm, biases, no MLP", "max_len",
               (103_296, 33_664 + 64 * 64), dict(vocab_size=1024, T=64)),
    ModelEntry("attn2-rope", "control", dict(d_model=64, n_layers=2, n_heads=2, positions="rope", mlp_ratio=4, max_len=0),
               "2 layers, 2 heads, RoPE, GELU MLP 4x (the T7 attention reference)", None,
               (116_480, 100_096), dict(vocab_size=256, T=128)),
    ModelEntry("shortconv4", "control", dict(d_model=64, n_layers=4, mixer="shortconv", positions="none", max_len=0),
               "4 gated short convolutions (kernel 3, receptive field 9), no MLP: negative control", None,
               (117_120, 51_584), dict(vocab_size=1024, T=64)),
    ModelEntry("longconv4", "control", dict(d_model=64, n_layers=4, mixer="longconv", positions="none"),
               "Hyena-like: short conv -> explicit causal filter of length T (FFT) -> gate, x4, no MLP", "max_len",
               (117_120 + 4 * (64 * 64 + 64), 51_584 + 4 * (64 * 64 + 64)), dict(vocab_size=1024, T=64)),
    ModelEntry("pgsm-cpu", "pgsm", dict(_PGSM_CPU), "PGSM dim 64, 3 blocks, hidden 128, k 17, retriever rd 128 / 4 heads",
               None, (196_608, 180_224)),
    ModelEntry("pgsm-cpu-noret", "pgsm", dict(_PGSM_CPU, **_NORET), "pgsm-cpu without retriever and post block",
               None, (120_384, 104_000)),
    ModelEntry("pgsm-tiny", "pgsm:pgsm-tiny", {}, "PGSM tiny preset (dim 128, rd 256)", None, (737_280, 704_512)),
    ModelEntry("pgsm-small", "pgsm:pgsm-small", {}, "PGSM small preset (dim 192, rd 512): the T7 reconstruction",
               None, (1_720_704, 1_671_552)),
    ModelEntry("pgsm-small-noret", "pgsm:pgsm-small", dict(_NORET), "pgsm-small without retriever", None,
               (950_976, 901_824)),
    ModelEntry("pgsm-wide-noret", "pgsm:pgsm-small", dict(dim=256, hidden=512, **_NORET),
               "conv-only PGSM matching pgsm-small's non-embedding parameters", None, (1_661_184, 1_595_648)),
    ModelEntry("pgsm-rd-cpu", "pgsm", dict(_PGSM_RD_CPU),
               "pgsm-small at 1/8 size: dim 24, hidden 48, rd 64 / 4 heads, block 128 (the retrieval_dim claim)",
               None, (34_992, 28_848)),
    ModelEntry("neollm-cpu", "neollm:neollm-tiny", dict(_NEOLLM_BENCH, hidden_size=32, num_hidden_layers=2, head_dim=8,
                                                        intermediate_size=64, iha_local_global_pattern="LG"),
               "NeoLLM defaults at hidden 32, 2 layers (local window 4, then global), 4/2 heads of 8, intermediate 64,"
               " Spelling Bee off (the XSA claim)",
               None, (42_044, 25_660)),
    ModelEntry("neollm-200k", "neollm", dict(_NEOLLM_200K), "NeoLLM fitted to 200k non-embedding parameters as"
               " `slmlab compare` fits it (compare-t2-200k): hidden 32, 4 layers LLLG, 4/2 heads of 8, intermediate"
               " 408, tied, every default on (Spelling Bee spells id k as byte k, as in the compare; the recall ablation)",
               None, (200_862, 199_582), dict(vocab_size=40, T=32)),
    ModelEntry("neollm-gpu", "neollm:neollm-small", dict(_NEOLLM_BENCH),
               "NeoLLM small preset (hidden 256, 6 layers), Spelling Bee off (the XSA claim at GPU scale)", None,
               (6_028_476, 5_897_404)),
    ModelEntry("attn4-llama", "lumen", dict(hidden_dim=192, num_layers=4, num_heads=4, num_kv_heads=4,
                                             intermediate_dim=448, max_seq_len=1024),
               "Lumen: d 192, 4 layers, 4/4 heads, RoPE, SwiGLU 448, RMSNorm", None, (1_672_896, 1_623_744)),
    ModelEntry("lfm2-hyb", "lfm2", dict(hidden_size=192, num_layers=4, layer_types=_HYBRID, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=768, max_position_embeddings=1024),
               "LFM2 hybrid: hidden 192, [conv, attn, conv, attn], 4/2 heads, SwiGLU 512", None, (1_747_968, 1_698_816)),
    ModelEntry("lfm2-hyb-cpu", "lfm2", dict(hidden_size=64, num_layers=4, layer_types=_HYBRID, num_attention_heads=4,
                                            num_key_value_heads=2, intermediate_size=256, max_position_embeddings=1024),
               "LFM2 hybrid at hidden 64, intermediate 256", None, (271_360, 254_976)),
]}


def known_models() -> list[str]:
    """Table ids, then the registered families and their presets (``family:preset``)."""
    import slmlab.models  # noqa: F401  (registers the families)

    from ..models.registry import families

    extra = []
    for name, fam in families().items():
        extra.append(name)
        extra.extend(f"{name}:{p}" for p in fam.presets)
    return list(MODELS) + extra


def resolve_entry(model_id: str) -> ModelEntry:
    """The table row of ``model_id``, or a row for a registered family / preset; ``ValueError`` listing
    the known ids otherwise."""
    if model_id in MODELS:
        return MODELS[model_id]
    import slmlab.models  # noqa: F401  (registers the families)

    from ..models.registry import resolve_model_spec

    try:
        resolve_model_spec(model_id)
    except ValueError:
        raise ValueError(f"unknown model {model_id!r}; known: {', '.join(known_models())}") from None
    return ModelEntry(model_id, model_id, {}, f"registered family {model_id} at its preset")


def make_config(model_id: str, vocab_size: int, T: int, overrides: dict | None = None):
    """The model config for a task of ``vocab_size`` ids and length ``T`` (``ValueError`` naming the
    model and the task's need when the model cannot hold ``T`` tokens)."""
    entry = resolve_entry(model_id)
    values = dict(entry.config, vocab_size=vocab_size)
    if entry.length_field:
        values[entry.length_field] = T
    values.update(overrides or {})
    if entry.family == "control":
        config = ControlConfig(**values)
    else:
        from ..models.registry import resolve_model_spec

        fam, preset = resolve_model_spec(entry.family)
        config = fam.make_config(preset, **values)
    if config.vocab_size < vocab_size:
        raise ValueError(f"model {model_id} has vocab_size={config.vocab_size} < the task's {vocab_size} ids")
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and limit < T:
        field_name = type(config).attribute_map.get("max_position_embeddings", "max_position_embeddings")
        raise ValueError(
            f"model {model_id} accepts {field_name}={limit} tokens < the task's T={T}; use a model with a longer"
            " context (or override it) or a shorter task"
        )
    return config


def build_model(model_id: str, vocab_size: int, T: int, overrides: dict | None = None, seed: int = 0):
    """A freshly initialised model (``torch.manual_seed(seed)`` first), with the tables a tokenizer fills
    filled as ``slmlab train`` fills them on a task (:func:`label_task_ids`)."""
    config = make_config(model_id, vocab_size, T, overrides)
    torch.manual_seed(seed)
    if isinstance(config, ControlConfig):
        return ControlForCausalLM(config)
    from ..models.registry import get_family

    return label_task_ids(get_family(config.model_type).model_class(config))


def label_task_ids(model):
    """``model`` with its tokenizer-derived tables filled from the byte tokenizer, which is what labels a
    task's ids in ``slmlab train`` and ``slmlab compare`` (task ids are the task's own; id k reads as
    the byte tokenizer's piece k). NeoLLM's Spelling Bee is such a table: on a task it spells id k as
    one byte, a second learned embedding of each id, so a bench run of NeoLLM trains the model the
    compare trains. A model without such a table, or on the meta device (a count, no data), is returned
    as it is."""
    if any(p.is_meta for p in model.parameters()) or not any(
            callable(getattr(m, "set_byte_table", None)) for m in model.modules()):
        return model
    from ..data import get_tokenizer
    from ..train.run import attach_tokenizer

    attach_tokenizer(model, get_tokenizer("byte"))
    return model


def count_parameters(model) -> tuple[int, int]:
    """``(total, non-embedding)``, shared tensors counted once; embeddings are the token table (tied
    with the head) and an untied head."""
    params = {id(p): p for p in model.parameters()}
    total = sum(p.numel() for p in params.values())
    embeddings = {id(p): p for p in model.get_input_embeddings().parameters()}  # a table, or NeoLLM's generator
    head = model.get_output_embeddings()
    if head is not None:
        embeddings[id(head.weight)] = head.weight
    embedding = sum(p.numel() for p in embeddings.values())
    return total, total - embedding


@torch.no_grad()
def prefill_cache(model, T: int):
    """The family's ``ModelCache`` after a prefill of ``T`` tokens (batch 1; PGSM prefills with a
    retrieval read at the last position, so its retriever's K/V count)."""
    from ..evaluate.lm import family_forward_inputs

    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        extra = {}
        if "retrieval_positions" in family_forward_inputs(model):  # PGSM: a read at the last position fills its K/V
            extra["retrieval_positions"] = torch.tensor([T - 1], device=device)
        return model(input_ids=torch.zeros(1, T, dtype=torch.long, device=device), use_cache=True, **extra).cache
    finally:
        model.train(was_training)


def state_floats(model, T: int) -> int:
    """Numbers an inference of ``T`` tokens keeps besides the weights: the control models' formula, or
    the filled size of a family's cache after a prefill of ``T`` tokens (``ModelCache.state_floats``)."""
    if hasattr(model, "state_floats"):
        return int(model.state_floats(T))
    return int(prefill_cache(model, T).state_floats())


def cache_nbytes(model, T: int) -> int:
    """Bytes a family's cache holds after a prefill of ``T`` tokens (``ModelCache.nbytes``: filled
    parts only, at the weights' dtype)."""
    return int(prefill_cache(model, T).nbytes())
