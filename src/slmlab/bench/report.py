"""Summaries of result lines: per configuration the learning rate chosen on validation, the seeds' test
accuracy (mean, per-seed values, an interval across seeds and examples), and the ``reproduce`` table
(ours beside the published number).

Only complete runs are figures. A run the ``max_time`` safety cap stopped (``"complete": false``) is
counted and named, never averaged in; a diverged run is shown with its step, and an lr with a diverged
seed is not a candidate for the best lr.
"""

from __future__ import annotations

from collections import defaultdict

from .anchors import Anchor
from .convergence import ACC_TOL, LOSS_TOL, line_judgement, row_word
from .jsonl import last_written
from .stats import seed_example_ci, seed_summary

CONFIG_KEYS = ("task", "task_spec", "model", "model_config", "d_model")
CLAIM_SEEDS = 3  # a row with fewer complete seeds is a reading, not a claim


def config_text(config: dict | None) -> str:
    """``"retrieval_dim=64,use_xsa=False"``: a run's ``model_config`` overrides as its key writes them."""
    return ",".join(f"{k}={v}" for k, v in (config or {}).items())


def model_label(row: dict) -> str:
    """``model`` or ``model[field=value,...]``: the model column of a row or line with ``model_config``."""
    extra = config_text(row.get("model_config"))
    return f"{row['model']}[{extra}]" if extra else row["model"]


def status(line: dict) -> str:
    """``complete``, ``incomplete`` (stopped by the time cap, or cut short) or ``diverged``. Lines written
    before these fields existed are judged by their ``stop_reason``: only ``max_steps reached`` and the
    early stop on validation accuracy were complete."""
    if "complete" in line:
        if line["complete"]:
            return "complete"
        return "diverged" if line.get("diverged_step") is not None else "incomplete"
    reason = str(line.get("stop_reason", ""))
    return "complete" if reason.startswith(("max_steps reached", "validation accuracy")) else "incomplete"


def finished(line: dict) -> bool:
    """A run a rerun skips: complete, or diverged (a divergence is the run's outcome, at a fixed step)."""
    return status(line) in ("complete", "diverged")


def run_identity(line: dict) -> tuple:
    """What a line is a run of: its configuration (:data:`CONFIG_KEYS`), lr and seed; the budget is not part of it."""
    return (*(config_text(line.get(k)) if k == "model_config" else line.get(k) for k in CONFIG_KEYS),
            line.get("lr"), line.get("seed"))


def latest(lines: list[dict]) -> list[dict]:
    """One line per run (:func:`run_identity`), the last one written: a redone run replaces its incomplete
    attempt, and a rerun under another budget (a longer patience, more steps) replaces the earlier line in
    every table and plot, so one seed is never counted twice; the earlier line stays in ``results.jsonl``."""
    return last_written(lines, run_identity)


def best_of_lr(lines: list[dict]) -> list[dict]:
    """Per (task spec, model, model_config, d_model): the lr whose seeds have the best mean validation accuracy
    (``best_val_acc``, the kept weights' score; never the test split), among the lrs with at least one
    complete seed and no diverged one; that lr's test metrics over its complete seeds.

    Each row: ``best_lr``, ``acc`` (the seeds' mean / min / max / n / per-seed ``values``), ``seeds``, ``ci``
    (95% across seeds and test examples, :func:`slmlab.bench.stats.seed_example_ci`), ``claim`` (at least
    :data:`CLAIM_SEEDS` seeds), ``exact``, ``token_acc``, ``val``, ``by_lr`` (every lr's validation and test
    means, seed counts, diverged seeds), ``incomplete`` (lines the time cap stopped: not used), ``diverged``
    (``[{lr, seed, step}]``), ``convergence`` (the rule's word over the chosen lr's seeds,
    :func:`slmlab.bench.convergence.row_word`) and ``lines``. A configuration without any usable lr has
    ``acc`` None.
    """
    groups: dict[tuple, dict[float, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for line in latest(lines):
        groups[tuple(config_text(line.get(k)) if k == "model_config" else line.get(k) for k in CONFIG_KEYS)][
            line["lr"]].append(line)
    out = []
    for key, by_lr in groups.items():
        every = [x for runs in by_lr.values() for x in runs]
        diverged = sorted(({"lr": x["lr"], "seed": x["seed"], "step": x["diverged_step"]} for x in every
                           if status(x) == "diverged"), key=lambda d: (d["lr"], d["seed"]))
        table, candidates = {}, {}
        for lr, runs in sorted(by_lr.items()):
            done = sorted((x for x in runs if status(x) == "complete"), key=lambda x: x["seed"])
            n_diverged = sum(status(x) == "diverged" for x in runs)
            if not done:
                continue
            entry = {"val": seed_summary([_val(x) for x in done])["mean"],
                     "test": seed_summary([x["acc"] for x in done])["mean"], "n": len(done), "diverged": n_diverged}
            table[str(lr)] = entry
            if not n_diverged:
                candidates[lr] = (entry["val"], done)
        first = every[0]
        row = {**dict(zip(CONFIG_KEYS, key)), "model_config": dict(first.get("model_config") or {}),
               "params_total": first["params_total"],
               "params_nonembedding": first["params_nonembedding"], "state_floats": first["state_floats"],
               "by_lr": table, "incomplete": sum(status(x) == "incomplete" for x in every), "diverged": diverged,
               "selected_on": "validation", "best_lr": None, "acc": None, "ci": None, "claim": False, "lines": [],
               "convergence": None}
        if candidates:
            best_lr = max(sorted(candidates), key=lambda lr: candidates[lr][0])
            best = candidates[best_lr][1]
            acc = seed_summary([x["acc"] for x in best])
            row.update(
                best_lr=best_lr, acc=acc, seeds=[x["seed"] for x in best], claim=acc["n"] >= CLAIM_SEEDS,
                ci=_interval(best),
                exact=seed_summary([x["exact"] for x in best]), token_acc=seed_summary([x["token_acc"] for x in best]),
                val=candidates[best_lr][0], params_total=best[0]["params_total"],
                params_nonembedding=best[0]["params_nonembedding"], state_floats=best[0]["state_floats"],
                steps=best[0]["steps"], wall_s=best[0]["wall_s"], lines=best,
                convergence=row_word([line_judgement(x) for x in best]),
            )
        out.append(row)
    return sorted(out, key=lambda r: (r["task"], r["task_spec"], r["model"], _config_order(r["model_config"]),
                                      r["d_model"] or 0))


def _config_order(config: dict) -> tuple:
    """Rows of one model sort by their ``model_config`` values, numbers as numbers (a sweep reads in order)."""
    return tuple((k, (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))) for k, v in config.items())


def _interval(runs: list[dict]) -> list[float]:
    """95% across seeds and examples; one seed whose line has no example counts (written before they were
    kept) keeps its own bootstrap interval over examples."""
    if len(runs) == 1 and not runs[0].get("example_counts") and runs[0].get("ci"):
        return list(runs[0]["ci"]["acc"])
    return seed_example_ci([x.get("example_counts") or None for x in runs], [x["acc"] for x in runs])


def _val(line: dict) -> float:
    """The validation score of the kept weights (-1 when a run never evaluated)."""
    value = line.get("best_val_acc")
    return -1.0 if value is None else float(value)


CONVERGENCE_NOTE = (
    f"convergence (docs/bench.md, Convergence): a seed is not converged when its best validation accuracy rose by"
    f" more than {ACC_TOL} or its best validation loss fell by more than {LOSS_TOL:.0%} over its last W steps (W: its"
    f" patience, or a quarter of max_steps), or it ran fewer than W steps; converged otherwise, or when it stopped on"
    f" the solved threshold; a row is converged when every seed is")


def format_table(rows: list[dict]) -> str:
    """A plain-text table of :func:`best_of_lr` rows, then notes (rows under three seeds, diverged seeds,
    incomplete runs left out)."""
    width = max([16] + [len(model_label(r)) for r in rows])
    head = (f"{'task spec':<34} {'model':<{width}} {'d':>4} {'params':>9} {'state':>9} {'lr':>7}  {'acc (mean; per seed)':<30}"
            f" {'95% CI (seeds x examples)':<26} {'exact':>6} {'steps':>6} {'wall s':>7}  convergence")
    out = [head, "-" * len(head)]
    notes = []
    for r in rows:
        start = (f"{r['task_spec']:<34} {model_label(r):<{width}} {r['d_model'] or 0:>4} {r['params_total']:>9,}"
                 f" {r['state_floats']:>9,}")
        flags = [f"lr {d['lr']:g} seed {d['seed']} diverged at step {d['step']}" for d in r["diverged"]]
        if r["incomplete"]:
            flags.append(f"{r['incomplete']} incomplete (not used)")
        if r["acc"] is None:
            why = "; ".join(flags) or "no complete run"
            out.append(f"{start} {'—':>7}  — ({why})")
            continue
        a = r["acc"]
        mark = "" if r["claim"] else "*"
        values = ", ".join(f"{v:.3f}" for v in a["values"])
        acc = f"{a['mean']:.3f}{mark}; {values}"
        ci = f"[{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]"
        out.append(
            f"{start} {r['best_lr']:>7.1e}  {acc:<30} {ci:<26} {r['exact']['mean']:>6.3f} {r['steps']:>6}"
            f" {r['wall_s']:>7.0f}  {r['convergence']}" + (f"  ({'; '.join(flags)})" if flags else "")
        )
    if any(r["acc"] is not None and not r["claim"] for r in rows):
        notes.append(f"* fewer than {CLAIM_SEEDS} seeds complete: a reading, not a claim (bench run --seeds 0,1,2)")
    notes.append("lr chosen on validation accuracy (seeds' mean); test accuracy of that lr's complete seeds")
    notes.append(CONVERGENCE_NOTE)
    return "\n".join(out + [""] + notes)


def incomplete_note(lines: list[dict]) -> str | None:
    """``"K of N runs incomplete ..."`` naming each run the time cap stopped (None when every run finished)."""
    lines = latest(lines)
    cut = [x for x in lines if status(x) == "incomplete"]
    if not cut:
        return None
    names = "\n".join(f"  {x.get('key', x.get('model'))}: {x.get('stop') or x.get('stop_reason')}" for x in cut)
    return (f"{len(cut)} of {len(lines)} runs incomplete (stopped before their max_steps; not in the table or"
            f" plots; rerun with the same --out and a larger --max-time to redo them):\n{names}")


def matches(line: dict, where: dict) -> bool:
    return all(line.get(k) == v for k, v in where.items())


def reproduce_table(anchor: Anchor, lines: list[dict]) -> str:
    """Published value beside ours (best lr on validation, test mean over complete seeds; ``—`` where no
    complete run matches)."""
    percent = anchor.name.startswith("mamba")
    out = [anchor.title, f"{'row':<44} {'published':>10} {'ours':>10} {'runs':>5}", "-" * 72]
    for label, published, where in anchor.rows:
        found = [r for r in best_of_lr([x for x in lines if matches(x, where)]) if r["acc"] is not None]
        if found:
            best = max(found, key=lambda r: r["val"])  # several matching configurations: chosen on validation
            ours = best["acc"]["mean"] * (100 if percent else 1)
            ours_text, n = (f"{ours:.1f}" if percent else f"{ours:.3f}"), best["acc"]["n"]
        else:
            ours_text, n = "—", 0
        pub = "—" if published is None else (f"{published:.1f}" if percent else f"{published:.3f}")
        out.append(f"{label:<44} {pub:>10} {ours_text:>10} {n:>5}")
    return "\n".join(out)
