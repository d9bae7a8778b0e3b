"""``slmlab models``: the installed families and their presets with parameter counts
(:func:`slmlab.bench.family_table.models_table`)."""

from __future__ import annotations

from ._common import command_parser


def models_command(argv: list[str]) -> int:
    """List the model families and their presets with parameter counts.

    Counts come from building each preset on the meta device. Building needs torch and every family
    (seconds to import), so the table is kept in a cache file keyed by a hash of the model code
    (src/slmlab/models, src/slmlab/layers): later calls answer without importing torch, and any change
    to that code recomputes it. The cache lives in $SLMLAB_CACHE_DIR, else $SLMLAB_CACHE (the data cache),
    else $XDG_CACHE_HOME/slmlab, else ~/.cache/slmlab; --no-cache skips it.
    """
    p = command_parser(models_command, "models")
    p.add_argument("--family", help="only this family")
    p.add_argument("--no-cache", action="store_true", help="build every preset now; neither read nor write the cache")
    args = p.parse_args(argv)
    from ..bench.family_table import choose_family, models_table

    table = models_table(use_cache=not args.no_cache)
    if args.family:
        table = [choose_family(table, args.family)]
    for fam in table:
        print(f"{fam['name']:<12} {fam['description']}")
        for preset, n in fam["presets"].items():
            print(f"    {preset:<28}{n:>14,} parameters")
    return 0
