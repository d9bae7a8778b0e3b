"""Training curves as PNG files (matplotlib, Agg backend, imported only when a plot is drawn).

:func:`training_curves` draws one or more runs from their ``metrics.jsonl`` records: every run
writes ``loss.png`` with it, and a comparison of runs passes several. Three panels, step on x:

* **loss**: training loss (solid) and validation loss (dashed, markers) in nats per token;
* **validation bits per byte** for text, or validation accuracy for synthetic tasks;
* **learning rate**.

A run's final figure measured on the whole validation split (``final``) is drawn as a star, so
it is never mistaken for a point of the periodic, possibly subset, evaluations.
matplotlib comes with the ``train`` extra; :func:`matplotlib_missing` says how to get it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

INSTALL_HINT = 'pip install "slmlab[train]"'


def matplotlib_missing() -> str | None:
    """None when matplotlib imports, else a sentence saying how to install it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return f"matplotlib is not installed; {INSTALL_HINT}"
    return None


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(records: Sequence[dict], kind: str, key: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for r in records:
        value = r.get(key)
        if r.get("kind") == kind and isinstance(value, (int, float)) and not isinstance(value, bool):
            steps.append(int(r["step"]))
            values.append(float(value))
    return steps, values


def training_curves(runs: Mapping[str, Sequence[dict]], path: str | Path, title: str | None = None,
                    final: Mapping[str, dict] | None = None) -> Path:
    """Draw the runs' training curves into ``path`` (PNG); returns the path.

    Args:
        runs: label -> the run's metrics records (``{"kind": "train"|"eval", "step", "loss", "lr",
            "bits_per_byte", "acc", ...}``, as :func:`slmlab.train.metrics.read_metrics` returns).
            One run may use the label ``""`` (no legend entry for the run's name).
        path: the PNG to write (its folder is created).
        title: the figure's title.
        final: label -> ``{"step", "loss", "bits_per_byte" or "acc"}`` measured on the whole
            validation split, drawn as stars.
    """
    plt = pyplot()
    final = final or {}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    loss_ax, val_ax, lr_ax = axes
    val_key = "bits_per_byte" if any(_series(r, "eval", "bits_per_byte")[0] for r in runs.values()) else "acc"
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, records) in enumerate(runs.items()):
        colour = colours[i % len(colours)]
        name = f"{label} " if label else ""
        steps, values = _series(records, "train", "loss")
        if steps:
            loss_ax.plot(steps, values, color=colour, lw=1.2, label=f"{name}train")
        steps, values = _series(records, "eval", "loss")
        if steps:
            sizes = sorted({r.get("tokens") for r in records if r.get("kind") == "eval"}, key=str)
            size = f" ({sizes[0]:,} tokens each)" if len(sizes) == 1 and isinstance(sizes[0], int) else ""
            loss_ax.plot(steps, values, color=colour, ls="--", marker="o", ms=3, label=f"{name}validation{size}")
        steps, values = _series(records, "eval", val_key)
        if steps:
            val_ax.plot(steps, values, color=colour, marker="o", ms=3, label=label or None)
        steps, values = _series(records, "train", "lr")
        if steps:
            lr_ax.plot(steps, values, color=colour, lw=1.2, label=label or None)
        end = final.get(label) or {}
        if "step" in end:
            for ax, key in ((loss_ax, "loss"), (val_ax, val_key)):
                if isinstance(end.get(key), (int, float)):
                    size = f", {end['tokens']:,} tokens" if isinstance(end.get("tokens"), int) else ""
                    ax.plot([end["step"]], [end[key]], marker="*", ms=11, color=colour, ls="none",
                            label=f"{name}whole split{size}" if ax is loss_ax else None)
    loss_ax.set(title="loss", xlabel="step", ylabel="nats / token")
    val_ax.set(title="validation bits per byte" if val_key == "bits_per_byte" else "validation accuracy",
               xlabel="step", ylabel="bits / byte" if val_key == "bits_per_byte" else "accuracy")
    lr_ax.set(title="learning rate", xlabel="step", ylabel="lr")
    lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        if not ax.has_data():
            ax.text(0.5, 0.5, "no records", ha="center", va="center", transform=ax.transAxes, color="grey")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
