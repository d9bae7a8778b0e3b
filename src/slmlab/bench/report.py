"""Summaries of result lines: best-of-lr per configuration with the seeds' mean / min / max, and the
``reproduce`` table (ours beside the published number)."""

from __future__ import annotations

from collections import defaultdict

from .anchors import Anchor
from .stats import seed_summary

CONFIG_KEYS = ("task", "task_spec", "model", "d_model")


def best_of_lr(lines: list[dict]) -> list[dict]:
    """Per (task spec, model, d_model): for each lr the seeds' mean accuracy; the best lr is reported
    (Zoology's max over lr) with every lr kept under ``by_lr``."""
    groups: dict[tuple, dict[float, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for line in lines:
        groups[tuple(line.get(k) for k in CONFIG_KEYS)][line["lr"]].append(line)
    out = []
    for key, by_lr in groups.items():
        summaries = {lr: seed_summary([r["acc"] for r in runs]) for lr, runs in by_lr.items()}
        best_lr = max(summaries, key=lambda lr: summaries[lr]["mean"])
        best = by_lr[best_lr]
        out.append({
            **dict(zip(CONFIG_KEYS, key)), "best_lr": best_lr, "acc": summaries[best_lr],
            "exact": seed_summary([r["exact"] for r in best]), "token_acc": seed_summary([r["token_acc"] for r in best]),
            "ci": best[0]["ci"]["acc"], "params_total": best[0]["params_total"],
            "params_nonembedding": best[0]["params_nonembedding"], "state_floats": best[0]["state_floats"],
            "steps": best[0]["steps"], "wall_s": best[0]["wall_s"], "by_lr": {str(k): v["mean"] for k, v in summaries.items()},
            "lines": best,
        })
    return sorted(out, key=lambda r: (r["task"], r["task_spec"], r["model"], r["d_model"] or 0))


def format_table(rows: list[dict]) -> str:
    """A plain-text table of :func:`best_of_lr` rows."""
    head = f"{'task spec':<34} {'model':<16} {'d':>4} {'params':>9} {'state':>9} {'lr':>7} {'acc (mean/min/max, n)':<26}" \
           f" {'95% CI (seed 1)':<16} {'exact':>6} {'steps':>6} {'wall s':>7}"
    out = [head, "-" * len(head)]
    for r in rows:
        a = r["acc"]
        out.append(
            f"{r['task_spec']:<34} {r['model']:<16} {r['d_model'] or 0:>4} {r['params_total']:>9,} {r['state_floats']:>9,}"
            f" {r['best_lr']:>7.1e} {a['mean']:.3f} / {a['min']:.3f} / {a['max']:.3f}, {a['n']:<4}"
            f" [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]  {r['exact']['mean']:>6.3f} {r['steps']:>6} {r['wall_s']:>7.0f}"
        )
    return "\n".join(out)


def matches(line: dict, where: dict) -> bool:
    return all(line.get(k) == v for k, v in where.items())


def reproduce_table(anchor: Anchor, lines: list[dict]) -> str:
    """Published value beside ours (best lr, mean over seeds; ``—`` where no run matches)."""
    percent = anchor.name.startswith("mamba")
    out = [anchor.title, f"{'row':<44} {'published':>10} {'ours':>10} {'runs':>5}", "-" * 72]
    for label, published, where in anchor.rows:
        found = [r for r in best_of_lr([x for x in lines if matches(x, where)])]
        if found:
            best = max(found, key=lambda r: r["acc"]["mean"])
            ours = best["acc"]["mean"] * (100 if percent else 1)
            ours_text, n = (f"{ours:.1f}" if percent else f"{ours:.3f}"), best["acc"]["n"]
        else:
            ours_text, n = "—", 0
        pub = "—" if published is None else (f"{published:.1f}" if percent else f"{published:.3f}")
        out.append(f"{label:<44} {pub:>10} {ours_text:>10} {n:>5}")
    return "\n".join(out)
