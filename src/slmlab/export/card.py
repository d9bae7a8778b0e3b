"""The model card (``README.md``) of an exported folder: what the model is, what it was trained on
and for how long, what it measured, and how to load it without slmlab."""

from __future__ import annotations

from .common import ExportSource


def _sizes(config) -> list[str]:
    rows = []
    for label, attr in (("hidden size", "hidden_size"), ("layers", "num_hidden_layers"),
                        ("attention heads", "num_attention_heads"), ("key/value heads", "num_key_value_heads"),
                        ("vocabulary", "vocab_size"), ("positions accepted", "max_position_embeddings")):
        value = getattr(config, attr, None)
        if value is not None:
            rows.append(f"{label} {value:,}" if isinstance(value, int) else f"{label} {value}")
    return rows


def model_card(src: ExportSource, result) -> str:
    """The card's markdown for an export ``result`` (:class:`slmlab.export.hf.HFExport`) of ``src``;
    the family's name is its ``display_name`` (:class:`slmlab.models.export_info.ExportInfo`)."""
    from ..models.registry import get_export_info

    config = src.model.config
    params = sum(p.numel() for p in src.model.parameters())
    remote = result.kind != "native"
    trust = ", trust_remote_code=True" if remote else ""
    name = get_export_info(src.family).display_name
    run = src.run_config
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        f"tags: [slmlab, {src.family}]",
        "---",
        "",
        f"# {name} ({params:,} parameters)",
        "",
        f"A {name} model trained with slmlab and exported for transformers as "
        + (f"transformers' own `{result.architecture}`: nothing of slmlab is needed to load it."
           if not remote else
           f"remote code: `{result.architecture}`'s source is in this folder (`auto_map` in `config.json`),"
           " with no import of slmlab; load it with `trust_remote_code=True`."),
    ]
    if result.why_remote:
        lines += ["", f"Not exported as transformers' own class: {result.why_remote}."]
    lines += ["", "## Model", "", f"- family: `{src.family}` (slmlab `model_type` `{config.model_type}`)",
              f"- parameters: {params:,} (tied tensors counted once)", f"- sizes: {', '.join(_sizes(config))}",
              f"- weights: {result.dtype}"]
    if result.max_diff is not None:
        lines.append(f"- conversion check: the largest logit difference from slmlab's model on a float32 probe batch is"
                     f" {result.max_diff:.2g}")
    ids = ", ".join(f"{k.removesuffix('_token_id')} {v}" for k, v in src.special_ids.items() if v is not None)
    lines.append(f"- special tokens: {ids} (in `config.json` and `generation_config.json`)" if ids else
                 "- special tokens: none recorded (a synthetic-task model: its ids are the task's own)")
    lines += ["", "## Training", ""]
    if run.get("data"):
        lines.append(f"- data: `{run['data']}`, tokenizer `{run.get('tokenizer', '?')}` (saved in this folder)")
    if src.trained_context is not None:
        lines.append(f"- trained context: {src.trained_context:,} tokens per sequence (the tokenizer's"
                     " `model_max_length`); longer inputs are outside what the model was trained on")
    else:
        lines.append("- trained context: not recorded by this checkpoint")
    if src.step is not None:
        tokens = f", {src.tokens_seen:,} tokens" if isinstance(src.tokens_seen, int) else ""
        lines.append(f"- steps: {src.step:,}{tokens}")
    ev = src.evaluation or {}
    if "bits_per_byte" in ev or "loss" in ev:
        on = f" on {ev['tokens']:,} validation tokens" if isinstance(ev.get("tokens"), int) else ""
        figures = [f"{ev['bits_per_byte']:.4f} bits/byte" if "bits_per_byte" in ev else "",
                   f"loss {ev['loss']:.4f} nats/token" if "loss" in ev else ""]
        lines.append(f"- validation (the run's report, this checkpoint){on}: {', '.join(f for f in figures if f)}")
    else:
        lines.append("- validation: not measured for this checkpoint by its run's report (`slmlab eval` measures it)")
    lines += [
        "", "## Load", "", "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'tokenizer = AutoTokenizer.from_pretrained("PATH")',
        f'model = AutoModelForCausalLM.from_pretrained("PATH"{trust})',
        'ids = tokenizer("Hello", return_tensors="pt").input_ids',
        "out = model.generate(ids, max_new_tokens=50, do_sample=False)  # stops at the eos token",
        "print(tokenizer.decode(out[0], skip_special_tokens=True))",
        "```",
        "",
        "`PATH` is this folder (or its hub repository). The tokenizer adds no bos/eos when encoding, as in"
        " training, where every document was framed `<bos> text <eos>`.",
    ]
    return "\n".join(lines) + "\n"
