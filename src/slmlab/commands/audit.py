"""``slmlab audit``: a model's parameter budget by the family's own categories."""

from __future__ import annotations

from ._common import command_parser, parse_overrides


def audit_command(argv: list[str]) -> int:
    """Print the parameter budget of a model, by the family's own categories.

    MODEL is a family (`lumen`), `family:preset`, a preset name, or a saved model folder.
    Config overrides follow as key=value (e.g. `slmlab audit lumen num_kv_heads=2`).
    """
    p = command_parser(audit_command, "audit")
    p.add_argument("model")
    p.add_argument("overrides", nargs="*", help="config key=value overrides")
    args = p.parse_args(argv)
    from pathlib import Path

    import torch
    from transformers import AutoConfig

    from slmlab.models.audit import format_audit
    from slmlab.models.registry import check_config_keys, check_saved_model_type, resolve_model_spec

    overrides = parse_overrides(args.overrides)
    if Path(args.model).is_dir():
        fam = check_saved_model_type(args.model)  # never runs code shipped in the folder
        check_config_keys(fam.config_class, overrides, f"{fam.name} config", f"docs/{fam.name}.md")
        cfg = AutoConfig.from_pretrained(args.model, trust_remote_code=False, **overrides)
    else:
        fam, preset = resolve_model_spec(args.model)
        cfg = fam.make_config(preset, **overrides)
    with torch.device("meta"):
        model = fam.model_class(cfg)
    print(format_audit(fam.parameter_audit(model), f"Parameter audit: {fam.name} ({type(model).__name__})"))
    return 0
