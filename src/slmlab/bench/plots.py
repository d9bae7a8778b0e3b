"""The suite's plots, made from result lines only (matplotlib, PNG; ``docs/bench.md``, Plots).

* ``t1_acc_vs_d.png``: MQAR accuracy vs ``d_model`` per ``(T, N)``, one line per model (Zoology
  Figure 2 layout).
* ``t1_acc_vs_state.png``: accuracy vs inference state (floats, log x): the recall–memory trade-off.
* ``t4_acc_vs_length.png``: induction accuracy vs test length (log x), training length marked.
* ``t5_depth_length.png`` / ``t6_depth_length.png``: depth × length heat-maps of ``exact``.
* ``t7_acc_vs_distance.png``: T7 accuracy vs distance per model; ``t7_acc_vs_retrieval_dim.png``: T7 accuracy vs
  ``retrieval_dim`` (a sweep in ``model_config``), the seed-001 claim's curve.
* ``best_acc.png``: every (task spec, model) at its best lr (chosen on validation), with the 95%
  interval across seeds and examples.
* ``learning_curves.png``: one panel per row with a recorded curve: validation accuracy (loss on text)
  against steps, one line per seed of the chosen lr, titled with the row's convergence word.
Only complete runs are drawn (a run the ``max_time`` cap stopped, or a diverged one, is no point on any
plot; :mod:`slmlab.bench.report`). A plot whose data is absent is skipped; :func:`make_plots` returns
the files written.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from pathlib import Path

from .report import best_of_lr, latest, model_label, status


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, written: list[Path]) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    written.append(path)


def make_plots(lines: list[dict], out_dir: str | Path) -> list[Path]:
    """Write every plot the lines support into ``out_dir``."""
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    rows = [r for r in best_of_lr(lines) if r["acc"] is not None]
    lines = [x for x in latest(lines) if status(x) == "complete"]
    try:
        _best_acc(plt, rows, out, written)
        _t1(plt, rows, out, written)
        _t4(plt, [x for x in lines if x["task"] == "induction"], out, written)
        for task, name in (("niah", "t5"), ("passkey", "t6")):
            _heatmap(plt, [x for x in lines if x["task"] == task], out / f"{name}_depth_length.png", task, written)
        _t7(plt, [r for r in rows if r["task"] == "t7"], out, written)
        panels = [(f"{r['task_spec']} | {model_label(r)}", r["convergence"],
                   [(f"seed {x['seed']}", x["curve"]) for x in r["lines"] if x.get("curve")]) for r in rows]
        learning_curves(plt, [p for p in panels if p[2]], out / LEARNING_CURVES, written)
    finally:
        plt.close("all")
    return written


LEARNING_CURVES = "learning_curves.png"
TITLE_WIDTH = 90  # characters of a panel title's line (an ablation row's key runs to ~330)


def wrapped_title(title: str, width: int = TITLE_WIDTH) -> str:
    """``title`` as is when it fits one line of ``width``, else broken after its commas into lines of at
    most ``width`` (a key of many switches, which would run over the neighbouring panels)."""
    if len(title) <= width:
        return title
    return "\n".join(textwrap.wrap(title.replace(",", ", "), width))


def learning_curves(plt, panels: list[tuple[str, str, list]], path: Path, written: list[Path], save=None) -> None:
    """One panel per row: ``(title, convergence word, [(label, curve), ...])``, a curve being
    ``[[step, loss, acc or None], ...]``; accuracy where the curve has it, loss otherwise."""
    if not panels:
        return
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False)
    for ax, (title, word, curves) in zip(axes.flat, panels):
        acc = all(c[2] is not None for _, curve in curves for c in curve)
        for label, curve in curves:
            ax.plot([c[0] for c in curve], [c[2] if acc else c[1] for c in curve], marker="o", ms=2, label=label)
        if acc:
            ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel("validation accuracy" if acc else "validation loss", fontsize=7)
        ax.set_xlabel("step", fontsize=7)
        ax.set_title(f"{wrapped_title(title)}\n{word}", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    (save or _save)(fig, path, written)


def _best_acc(plt, rows, out, written) -> None:
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.2))
    labels = [f"{r['task_spec']} | {model_label(r)}" for r in rows]
    acc = [r["acc"]["mean"] for r in rows]
    err = [[a - r["ci"][0] for a, r in zip(acc, rows)], [r["ci"][1] - a for a, r in zip(acc, rows)]]
    ax.barh(range(len(rows)), acc, xerr=err, color="tab:blue", alpha=0.8)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.02)
    ax.set_xlabel("test accuracy (lr chosen on validation; seeds' mean, bar: 95% CI over seeds and examples)")
    _save(fig, out / "best_acc.png", written)


def _t1(plt, rows, out, written) -> None:
    t1 = [r for r in rows if r["task"] == "mqar"]
    if not t1:
        return
    by_cfg = defaultdict(lambda: defaultdict(list))
    for r in t1:
        cfg = r["lines"][0]["task_config"]
        by_cfg[(cfg["T"], cfg["N"])][model_label(r)].append((r["d_model"], r["acc"]["mean"]))
    fig, axes = plt.subplots(1, len(by_cfg), figsize=(3.2 * len(by_cfg), 3), squeeze=False)
    for ax, ((T, N), models) in zip(axes[0], sorted(by_cfg.items())):
        for model, points in sorted(models.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=model)
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"T={T}, N={N}")
        ax.set_xlabel("d_model")
    axes[0][0].set_ylabel("MQAR accuracy")
    axes[0][-1].legend(fontsize=7)
    _save(fig, out / "t1_acc_vs_d.png", written)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for model in sorted({model_label(r) for r in t1}):
        pts = [(r["state_floats"], r["acc"]["mean"]) for r in t1 if model_label(r) == model]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], label=model)
    ax.set_xscale("log")
    ax.set_xlabel("inference state (floats, excl. weights)")
    ax.set_ylabel("MQAR accuracy")
    ax.legend(fontsize=7)
    _save(fig, out / "t1_acc_vs_state.png", written)


def _accuracy_axes(ax, xlabel: str, ylabel: str) -> None:
    """An accuracy (0-1) against a doubling x axis, labelled, with a legend."""
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)


def _t4(plt, lines, out, written) -> None:
    if not lines:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for line in lines:
        points = {int(line["task_config"]["T"]): line["acc"]}
        points.update({int(k): v for k, v in line.get("acc_by_length", {}).items() if v is not None})
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], "o-", label=f"{line['model']} lr {line['lr']:g} s{line['seed']}")
        ax.axvline(line["task_config"]["T"], color="grey", ls=":")
    _accuracy_axes(ax, "test length (dotted: training length)", "induction accuracy")
    _save(fig, out / "t4_acc_vs_length.png", written)


def _heatmap(plt, lines, path, task, written) -> None:
    if not lines:
        return
    import numpy as np

    models = sorted({x["model"] for x in lines})
    fig, axes = plt.subplots(1, len(models), figsize=(4 * len(models), 3), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [x for x in lines if x["model"] == model]
        lengths = sorted({int(x["task_config"]["T"]) for x in mine})
        grid = np.full((len(lengths), 11), np.nan)
        for x in mine:
            for depth, acc in (x.get("exact_by_group") or x.get("acc_by_group", {})).items():
                grid[lengths.index(int(x["task_config"]["T"])), int(depth)] = acc
        im = ax.imshow(grid, vmin=0, vmax=1, aspect="auto", cmap="viridis")
        ax.set_xticks(range(11), [f"{d / 10:.1f}" for d in range(11)], fontsize=6)
        ax.set_yticks(range(len(lengths)), lengths)
        ax.set_xlabel("depth")
        ax.set_ylabel("T")
        ax.set_title(f"{task}: {model}", fontsize=8)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="exact")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    written.append(path)


def _t7(plt, rows, out, written) -> None:
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for model in sorted({model_label(r) for r in rows}):
        pts = sorted((r["lines"][0]["task_config"]["distance"], r["acc"]["mean"]) for r in rows if model_label(r) == model)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=model)
    ax.axhline(1 / 64, color="grey", ls=":", label="chance (1/64)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("distance (key to query)")
    ax.set_ylabel("T7 accuracy")
    ax.legend(fontsize=7)
    _save(fig, out / "t7_acc_vs_distance.png", written)
    swept = [r for r in rows if "retrieval_dim" in r["model_config"]]
    if not swept:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for spec in sorted({r["task_spec"] for r in swept}):
        pts = sorted((r["model_config"]["retrieval_dim"], r["acc"]["mean"], r["ci"]) for r in swept if r["task_spec"] == spec)
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[[p[1] - p[2][0] for p in pts], [p[2][1] - p[1] for p in pts]],
                    fmt="o-", capsize=3, label=spec)
    ax.axhline(0.95, color="grey", ls="--", label="strong (0.95)")
    ax.axhline(1 / 64, color="grey", ls=":", label="chance (1/64)")
    _accuracy_axes(ax, "retrieval_dim", "T7 accuracy (seeds' mean, 95% CI)")
    _save(fig, out / "t7_acc_vs_retrieval_dim.png", written)
