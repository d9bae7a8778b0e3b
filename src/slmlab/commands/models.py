"""``slmlab models``: the installed families and their presets with parameter counts."""

from __future__ import annotations

from ._common import command_parser


def models_command(argv: list[str]) -> int:
    """List the model families and their presets with parameter counts.

    Parameter counts are computed by building each preset (on the meta device, so it is instant).
    """
    import torch

    import slmlab

    p = command_parser(models_command, "models")
    p.add_argument("--family", help="only this family")
    args = p.parse_args(argv)
    chosen = slmlab.families()
    if args.family:
        fam = slmlab.get_family(args.family)  # ValueError naming the known families
        chosen = {fam.name: fam}
    for name, fam in sorted(chosen.items()):
        print(f"{name:<12} {fam.description}")
        for preset in fam.presets or {"(defaults)": {}}:
            cfg = fam.make_config(preset if preset in fam.presets else None)
            with torch.device("meta"):
                model = fam.model_class(cfg)
            n = sum(q.numel() for q in model.parameters())
            print(f"    {preset:<28}{n:>14,} parameters")
    return 0
