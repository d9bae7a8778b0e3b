"""Weight-only quantization schemes as rows of one table (:data:`SCHEMES`): all that differs between them.

A row says what ``--quantize`` (generate, eval, serve) and ``slmlab quantize --scheme`` offer and how their
help names it, what a saved folder's ``quantization_config`` records, which layer class of
:mod:`slmlab.layers.quantized` replaces an ``nn.Linear`` (it quantizes one, names its own record entries and
is rebuilt from a record), which class of :mod:`slmlab.generation.plan` holds its layers in a decode plan (one
kernel call for q|k|v or gate|up, also inside the compiled step), and where its kernel runs (the refusal of
any other device or of a model already in another scheme). :mod:`slmlab.models.quantize`, the plan and the
command line read the rows; nothing else compares a scheme's name (``tests/test_quant_schemes.py``). A new
scheme is a row here plus its two classes.

Rows name their classes rather than hold them: this module is standard library only, so every layer may read
it and the command line builds its ``--help`` without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scheme:
    """One weight-only quantization scheme.

    Args:
        name: the word ``--quantize`` and ``slmlab quantize --scheme`` take.
        method: the ``quant_method`` of a saved folder's ``quantization_config``.
        bits: bits per stored weight.
        weights, activations: how the weights are stored and what the matmuls read, in the record's words.
        layer: the class of :mod:`slmlab.layers.quantized` that replaces an ``nn.Linear`` (``from_linear``,
            ``settings()``, ``for_record``).
        columns: the class of :mod:`slmlab.generation.plan` that holds such layers in a decode plan
            (``stack``, ``project``).
        kernel: the kernel its matmuls run through, in words.
        flag_help: the scheme in ``--quantize``'s help.
        scheme_help: the scheme in ``slmlab quantize --scheme``'s help.
        devices: the device types the kernel runs on.
    """

    name: str
    method: str
    bits: int
    weights: str
    activations: str
    layer: str
    columns: str
    kernel: str
    flag_help: str
    scheme_help: str
    devices: tuple[str, ...] = ("cpu",)

    def record(self, names: list[str], settings: dict) -> dict:
        """The ``quantization_config`` of a model whose modules ``names`` are this scheme's layers, with the
        layers' own ``settings`` (e.g. int4's ``group_size``) after ``bits``."""
        return {"quant_method": self.method, "bits": self.bits, **settings, "weights": self.weights,
                "activations": self.activations, "modules": list(names)}

    def refusal(self, device, held: Scheme | None) -> str | None:
        """Why ``--quantize <name>`` cannot run on ``device`` (a ``torch.device``) for a model that ``held``
        quantizes already (None: a float model), or None when it can."""
        if device.type not in self.devices:
            where = " or ".join(kind.upper() for kind in self.devices)
            return (f"--quantize {self.name} runs on the {where} ({self.kernel}), not on {device}; pass --device"
                    f" {self.devices[0]}")
        if held is not None and held is not self:
            return (f"--quantize {self.name}: the model is already {held.name} (a folder written by slmlab quantize)"
                    " and cannot be requantized; drop --quantize, or pass the float run it came from with"
                    f" --quantize {self.name}")
        return None


INT8 = Scheme(
    name="int8",
    method="slmlab_int8",
    bits=8,
    weights="per-output-channel symmetric int8, bfloat16 scales",
    activations="bfloat16 in the int8 matmuls",
    layer="Int8Linear",
    columns="Int8Columns",
    kernel="torch's int8 weight kernel",
    flag_help="int8 (per output channel)",
    scheme_help="int8 (per output channel)",
)
INT4 = Scheme(
    name="int4",
    method="slmlab_int4",
    bits=4,
    weights="group-wise asymmetric int4 (a bfloat16 scale and zero per group of input columns)",
    activations="bfloat16 in the int4 matmuls",
    layer="Int4Linear",
    columns="Int4Columns",
    kernel="torch's int4 weight kernel",
    flag_help="int4 (groups of 32 columns)",
    scheme_help="int4 (groups of 32 input columns, a scale and a zero each)",
)
SCHEMES: dict[str, Scheme] = {row.name: row for row in (INT8, INT4)}


def scheme_named(name: str, what: str) -> Scheme:
    """The row called ``name``.

    Raises:
        ValueError: an unknown name, said as ``unknown <what> 'name'; choose one of: ...``.
    """
    if name not in SCHEMES:
        raise ValueError(f"unknown {what} {name!r}; choose one of: {', '.join(SCHEMES)}")
    return SCHEMES[name]


def scheme_with_method(method) -> Scheme | None:
    """The row whose folders record ``quant_method: method`` (None: no scheme of slmlab's)."""
    return next((row for row in SCHEMES.values() if row.method == method), None)
