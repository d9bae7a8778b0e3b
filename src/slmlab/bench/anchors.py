"""Published numbers the suite is compared with (``docs/bench.md``, Anchors).

* Zoology Figure 2 (Arora et al., arXiv:2312.04927): MQAR accuracy of gated convolutions by
  ``(T, N)`` and ``d_model``, read from the paper's figure (±0.03); attention ≈ 1.0 in every cell.
* Mamba Table 1 (Gu & Dao, arXiv:2312.00752): selective copying accuracy (%) by architecture.
* Mamba Table 11: induction-head accuracy (%) by test length (trained at 256).
* The T7 prototype: the benchmark spec's measured PGSM / attention accuracies at the ``cpu`` setting.

Each anchor names the bench runs that reproduce it (``plan``) and how to read our value from a result
line (``match``), so ``slmlab bench reproduce <anchor>`` prints ours beside the published number.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ZOOLOGY_FIG2 = {  # (T, N) -> model -> [d=64, 128, 256, 512]
    (64, 4): {"Hyena": [.51, .74, .83, .85], "RWKV": [.74, .92, .95, .97], "H3": [.91, .97, .97, .97],
              "BaseConv": [.69, .92, .94, .97], "Attention": [1.0, 1.0, 1.0, 1.0]},
    (128, 8): {"Hyena": [.20, .62, .73, .83], "RWKV": [.18, .49, .75, .91], "H3": [.25, .72, .90, .75],
               "BaseConv": [.37, .61, .83, .94], "Attention": [1.0, 1.0, 1.0, 1.0]},
    (256, 16): {"Hyena": [.06, .14, .53, .69], "RWKV": [.06, .07, .67, .78], "H3": [.10, .63, .61, .66],
                "BaseConv": [.15, .34, .80, .92], "Attention": [1.0, 1.0, 1.0, 1.0]},
    (512, 64): {"Hyena": [.02, .04, .10, .18], "RWKV": [.02, .03, .16, .37], "H3": [.02, .03, .03, .10],
                "BaseConv": [.02, .03, .05, .70], "Attention": [1.0, 1.0, 1.0, 1.0]},
}
ZOOLOGY_DIMS = (64, 128, 256, 512)

MAMBA_TABLE1 = {  # selective copying accuracy (%)
    "no gate + S4": 18.3, "no gate + S6": 97.0, "H3 + S4": 57.0, "H3 + Hyena": 30.1, "H3 + S6": 99.7,
    "Mamba + S4": 56.4, "Mamba + Hyena": 28.4, "Mamba + S6": 99.8,
}

MAMBA_TABLE11_LENGTHS = (256, 512, 1024, 2048, 4096, 16384, 1 << 20)
MAMBA_TABLE11 = {  # induction heads accuracy (%) at the test lengths above; None = OOM
    "MHA-Abs": [100, 58.6, 26.6, 18.8, 9.8, 7.8, None],
    "MHA-RoPE": [100, 83.6, 31.3, 18.4, 8.6, 5.5, None],
    "MHA-xPos": [100, 99.6, 67.6, 25.4, 7.0, 7.8, None],
    "H3": [100, 80.9, 39.5, 23.8, 14.8, 5.9, 7.4],
    "Hyena": [100, 100, 44.1, 12.5, 6.6, 7.0, 9.8],
    "Mamba": [100, 100, 100, 100, 100, 100, 100],
}

T7_PROTOTYPE = {  # T7 cpu (T 128, distance 96, D 2): accuracy after 750 steps
    "attn2-rope": 0.998, "pgsm-cpu": 1.000, "pgsm-cpu-noret": 1 / 64,
}


@dataclass(frozen=True)
class Anchor:
    """A published result and the bench rows that reproduce it.

    Args:
        name: the ``reproduce`` argument.
        title: what it is (paper, table).
        rows: ``(label, published value, {result field: value})``: our value is the best accuracy
            (max over lr, mean over seeds) of the result lines whose fields match.
        plan_tier: the tier whose runs cover the rows (``bench reproduce --run``).
    """

    name: str
    title: str
    rows: list[tuple[str, object, dict]] = field(default_factory=list)
    plan_tier: str = "cpu-full"


def _fig2_rows() -> list[tuple[str, object, dict]]:
    rows = []
    pairs = (("Attention", "attn2-z", "attention"), ("Hyena", "longconv4", "Hyena vs longconv4"),
             ("BaseConv", "shortconv4", "BaseConv vs shortconv4"))
    for (T, N), models in ZOOLOGY_FIG2.items():
        for i, d in enumerate(ZOOLOGY_DIMS):
            for paper, ours, label in pairs:
                where = {"task": "mqar", "task_T": T, "task_N": N, "d_model": d, "model": ours}
                rows.append((f"T{T} N{N} d{d} {label}", models[paper][i], where))
    return rows


ANCHORS: dict[str, Anchor] = {a.name: a for a in [
    Anchor("zoology-fig2", "Zoology Figure 2: MQAR accuracy by (T, N) and d_model (V 8,192 in the paper)", _fig2_rows()),
    Anchor("mamba-table1", "Mamba Table 1: selective copying accuracy (%; ours x100)", [
        ("H3 + Hyena (LTI long conv) vs longconv4", MAMBA_TABLE1["H3 + Hyena"], {"task": "selective_copy", "model": "longconv4"}),
        ("Mamba + S6 (selective) vs attention", MAMBA_TABLE1["Mamba + S6"], {"task": "selective_copy", "model": "attn2-rope"}),
        ("no gate + S4 vs shortconv4", MAMBA_TABLE1["no gate + S4"], {"task": "selective_copy", "model": "shortconv4"}),
    ], "gpu-paper"),
    Anchor("mamba-table11", "Mamba Table 11: induction heads (%; ours x100) at the training length", [
        ("MHA-RoPE at 2^8 vs attn2-rope", MAMBA_TABLE11["MHA-RoPE"][0], {"task": "induction", "model": "attn2-rope"}),
        ("MHA-Abs at 2^8 vs attn2-z", MAMBA_TABLE11["MHA-Abs"][0], {"task": "induction", "model": "attn2-z"}),
    ], "gpu-paper"),
    Anchor("pgsm-distance", "T7 prototype (benchmark spec): cpu setting, 750 steps", [
        (model, value, {"task": "t7", "model": model}) for model, value in T7_PROTOTYPE.items()
    ]),
]}
