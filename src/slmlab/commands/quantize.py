"""``slmlab quantize``: write an int8 copy of a saved model (:mod:`slmlab.models.quantize`)."""

from __future__ import annotations

from ..quant_schemes import SCHEMES, scheme_named
from ._common import command_parser


def quantize_command(argv: list[str]) -> int:
    """Write a weight-only int8 (or int4) copy of a run or checkpoint (every family; CPU decoding).

    RUN is a run folder (its newest checkpoint), a checkpoint folder or a saved model; OUT is a new
    (or empty) folder, written through a temporary sibling (a crash leaves no partial OUT); a RUN that
    changes while it is read (a live run rotating checkpoints) is refused. Every linear layer's weight
    becomes per-output-channel symmetric int8 (the LM head too), or with --scheme int4 4-bit codes with
    a scale and zero per group of 32 input columns;
    embedding tables, norms and convolution kernels stay float32. OUT holds
    model.safetensors, config.json (with a quantization_config naming the int8 modules), the
    tokenizer and the run's record; generate, eval and serve load it as they load any run.
    Details and measured speed/quality: docs/quantize.md.
    Examples:
      slmlab quantize runs/quickstart runs/quickstart-int8
      slmlab generate runs/quickstart-int8 --prompt "ROMEO:"
    """
    p = command_parser(quantize_command, "quantize")
    p.add_argument("run", metavar="RUN")
    p.add_argument("out", metavar="OUT")
    p.add_argument("--scheme", default="int8", help="the weight format: "
                   + " or ".join(row.scheme_help for row in SCHEMES.values()))
    args = p.parse_args(argv)
    scheme_named(args.scheme, "--scheme")  # refused before torch is imported
    from ..models.quantize import float_linears, quantize, quantized_modules, save_quantized
    from ..outputs import check_output_folder, snapshot
    from ..train.saved import load_for_inference, open_checkpoint

    out = check_output_folder(args.out)  # refused before any weight is read
    saved = open_checkpoint(args.run)
    before = snapshot(saved.checkpoint)  # a live run rotating its checkpoints is refused, not half-copied
    loaded = load_for_inference(saved, "cpu")
    if quantized_modules(loaded.model):
        raise ValueError(f"{loaded.checkpoint} is already quantized; quantize the float run it came from")
    swapped = quantize(loaded.model, args.scheme)
    save_quantized(loaded.model, loaded.checkpoint, out, before)
    kept = float_linears(loaded.model)
    size = (out / "model.safetensors").stat().st_size / 1e6
    print(f"slmlab quantize: wrote {out} ({loaded.family.name}, {len(swapped)} {args.scheme} linear layers"
          f"{f', {len(kept)} kept float32' if kept else ''}; model.safetensors {size:.1f} MB)")
    return 0
