"""Export a run or checkpoint for other tools: a transformers folder (--to hf) or a llama.cpp file (--to gguf)."""

from __future__ import annotations

from pathlib import Path

from ._common import command_parser

TARGETS = {
    "hf": "every family: lumen and lfm2 as transformers' own Llama/Lfm2 classes, the others as remote code",
    "gguf": "lumen and lfm2, llama.cpp architectures",
}


def _targets() -> str:
    return ", ".join(f"{name} ({what})" for name, what in TARGETS.items())


def export_command(argv: list[str]) -> int:
    """Export a run or checkpoint for other tools: a transformers folder (--to hf) or a llama.cpp file (--to gguf).

    RUN_OR_CHECKPOINT is a run folder (its newest checkpoint), a checkpoint folder or a saved model.
    --to hf writes a folder that loads with AutoModelForCausalLM.from_pretrained without slmlab: lumen
    and lfm2 as transformers' own classes, pgsm, nanohammer and neollm as remote code
    (trust_remote_code=True). It holds the tokenizer, generation_config.json (bos/eos/pad) and a
    model card README.md. --to gguf writes one GGUF file for llama.cpp (lumen, lfm2).
    Examples:
      slmlab export runs/quickstart --to hf exports/quickstart-hf
      slmlab export runs/quickstart --to gguf exports/quickstart.gguf --dtype q8_0
    """
    p = command_parser(export_command, "export")
    p.add_argument("source", metavar="RUN_OR_CHECKPOINT")
    p.add_argument("--to", required=True, metavar="TARGET", help="hf or gguf")
    p.add_argument("out", metavar="OUT", help="the folder (hf) or .gguf file (gguf) to write")
    p.add_argument("--dtype", default=None,
                   help="weights on disk: f32 (default), f16 or bf16 for hf; f32, f16, q8_0 or q4_0 for gguf")
    p.add_argument("--force", action="store_true", help="replace an existing non-empty OUT")
    args = p.parse_args(argv)
    if args.to not in TARGETS:
        raise ValueError(f"unknown export target {args.to!r}; targets: {_targets()}")
    if args.to == "hf":
        from ..export.hf import export_hf

        result = export_hf(args.source, args.out, force=args.force, dtype=args.dtype or "f32")
        trust = ", trust_remote_code=True" if result.kind != "native" else ""
        print(f"slmlab export: wrote {result.out} ({result.family} as {result.architecture}, {result.kind},"
              f" {result.dtype}); load it with AutoModelForCausalLM.from_pretrained({str(result.out)!r}{trust})")
        why = result.why_remote or result.no_twin
        if why:
            print(f"slmlab export: remote code because {why}")
        return 0
    from ..export.gguf import export_gguf

    path = export_gguf(Path(args.source), Path(args.out), dtype=args.dtype or "f32", force=args.force)
    print(f"slmlab export: wrote {path}")
    return 0
