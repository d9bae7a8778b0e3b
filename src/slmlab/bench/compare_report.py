"""The report of ``slmlab compare``, made from its result lines only (``--report-only`` rebuilds it
byte for byte): ``summary.md`` (tables), ``fitted_configs.json`` and the PNGs.

* ``bpb_vs_params.png``: validation bits per byte vs non-embedding parameters (text data);
* ``acc_vs_cache.png``: test accuracy vs cache bytes per token, one panel per task;
* ``val_loss_vs_tokens.png``: validation loss vs training tokens per family, one panel per data;
* ``t7_acc_by_distance.png``: T7 test accuracy by distance group per family;
* ``learning_curves.png``: one panel per row, validation accuracy (loss on text) against steps for each
  seed of the chosen lr, titled with the row's convergence word (runs that recorded ``val_curve``).

A family's row uses the learning rate chosen on validation (seeds' mean: lowest validation bits per
byte on text, highest validation accuracy on a task; never the test split), with the seeds' mean,
per-seed values and a 95% interval across seeds (and test examples, on a task); a failed run is shown
with its error, a diverged one with its step. Every row says ``converged`` or ``not converged`` by the
rule of :mod:`slmlab.bench.convergence` (``convergence unknown (run before the rule)`` for lines without
a ``val_curve``). A plot whose data is absent is skipped.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from ..outputs import dumps_finite
from .convergence import line_judgement, row_word
from .jsonl import last_written
from .plots import LEARNING_CURVES, learning_curves
from .report import CLAIM_SEEDS, CONVERGENCE_NOTE
from .stats import seed_example_ci, seed_summary

PLOTS = ("bpb_vs_params.png", "acc_vs_cache.png", "val_loss_vs_tokens.png", "t7_acc_by_distance.png", LEARNING_CURVES)


def _order(lines: list[dict], field: str, setting: str) -> list[str]:
    """Values of ``field`` in the comparison's own order (its settings), then any others sorted."""
    listed = list(lines[-1].get("settings", {}).get(setting, [])) if lines else []
    seen = {line[field] for line in lines}
    return [v for v in listed if v in seen] + sorted(seen - set(listed))


def best_rows(lines: list[dict]) -> dict[tuple[str, str], dict]:
    """``{(data, model): row}``: the lr chosen on validation, that lr's seeds, every lr, or the failure.

    The lr is chosen on the validation split, never on test: on a task the seeds' mean ``best_val_acc``
    (the kept weights' validation accuracy; highest wins), on text the seeds' mean validation bits per
    byte (lowest wins; text has no test split, so its figure is read on the same validation batches).
    Only ``ok`` runs that are complete are figures; an lr with a diverged seed is no candidate; a run
    that diverged is listed with its step (``diverged``). A row: ``metric``, ``selected_on``, ``best_lr``,
    ``summary`` (seeds' mean / min / max / n / per-seed ``values``), ``ci`` (95% across seeds and test
    examples on a task, across seeds on text; None for one text seed), ``runs``, ``by_lr``
    (``{lr: reported mean}``), ``val_by_lr``, ``diverged``, ``failed_runs``, ``incomplete``, ``convergence``
    (the rule's word over the chosen lr's seeds); or
    ``{"failed": error}`` / ``{"diverged_only": text}`` where no lr has a complete run.
    """
    groups: dict[tuple[str, str], dict[float, list[dict]]] = defaultdict(lambda: defaultdict(list))
    failures: dict[tuple[str, str], list[dict]] = defaultdict(list)
    diverged: dict[tuple[str, str], list[dict]] = defaultdict(list)
    incomplete: dict[tuple[str, str], int] = defaultdict(int)
    for line in lines:
        key = (line["data"], line["model"])
        state = line.get("status")
        if state == "ok" and line.get("complete", True):
            groups[key][line["lr"]].append(line)
        elif state == "ok":
            incomplete[key] += 1
        elif state == "diverged":
            diverged[key].append({"lr": line["lr"], "seed": line["seed"], "step": line.get("diverged_step")})
        else:
            failures[key].append(line)
    rows = {}
    for key in set(groups) | set(failures) | set(diverged) | set(incomplete):
        gone = sorted(diverged.get(key, []), key=lambda d: (d["lr"], d["seed"]))
        bad_lrs = {d["lr"] for d in gone}
        by_lr = {lr: runs for lr, runs in groups.get(key, {}).items() if lr not in bad_lrs}
        if not by_lr:
            if gone:
                rows[key] = {"diverged_only": "; ".join(_diverged_text(d) for d in gone), "diverged": gone}
            elif failures.get(key):
                rows[key] = {"failed": failures[key][0]["error"]}
            else:
                rows[key] = {"failed": f"{incomplete[key]} incomplete run(s), no complete one"}
            continue
        text = next(iter(by_lr.values()))[0]["kind"] == "text"
        metric, select = ("bits_per_byte", "bits_per_byte") if text else ("acc", "best_val_acc")
        usable = {lr: runs for lr, runs in by_lr.items()
                  if all(r.get(metric) is not None and r.get(select) is not None for r in runs)}
        if not usable:
            rows[key] = {"failed": f"no {metric} recorded"}
            continue
        val = {lr: seed_summary([r[select] for r in runs])["mean"] for lr, runs in usable.items()}
        pick = min if text else max
        best_lr = pick(sorted(val), key=lambda lr: val[lr])
        runs = sorted(usable[best_lr], key=lambda r: r["seed"])
        values = [r[metric] for r in runs]
        if text:
            ci = seed_example_ci([None] * len(runs), values) if len(runs) > 1 else None
        elif len(runs) == 1 and not runs[0].get("example_counts"):
            ci = list(runs[0]["ci"]["acc"])  # a line without example counts: its own interval over examples
        else:
            ci = seed_example_ci([r.get("example_counts") or None for r in runs], values)
        rows[key] = {"metric": metric, "selected_on": "validation", "best_lr": best_lr,
                     "summary": seed_summary(values), "ci": ci, "runs": runs,
                     "by_lr": {lr: seed_summary([r[metric] for r in usable[lr]])["mean"] for lr in sorted(usable)},
                     "val_by_lr": {lr: val[lr] for lr in sorted(usable)}, "diverged": gone,
                     "failed_runs": len(failures.get(key, [])), "incomplete": incomplete.get(key, 0),
                     "convergence": row_word([line_judgement(r, "val_curve") for r in runs])}
    return rows


def _diverged_text(d: dict) -> str:
    return f"diverged at step {d['step']} (lr {d['lr']:g}, seed {d['seed']})"


def _num(value, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def _config_text(fit: dict) -> str:
    overrides = fit.get("overrides") or {}
    skip = {"tie_word_embeddings", "vocab_size"}
    return ", ".join(f"{k}={v}" for k, v in overrides.items() if k not in skip and not isinstance(v, list)) or "—"


def _first(lines: list[dict], model: str) -> dict | None:
    return next((x for x in lines if x["model"] == model and x.get("status") == "ok"), None)


def summary_markdown(lines: list[dict], plots: list[str] = ()) -> str:
    """``summary.md``: settings, the fitted models with their memory, one table per data, and links
    to ``plots`` (PNG file names in the same folder). It reads the last line of each run
    (:func:`latest_runs`) and says how many earlier lines that replaced, when any did."""
    if not lines:
        return "# slmlab compare\n\nNo runs recorded.\n"
    runs = latest_runs(lines)
    replaced, lines = len(lines) - len(runs), runs
    settings = lines[-1].get("settings", {})
    budget = lines[-1]["budget"]
    models, data = _order(lines, "model", "models"), _order(lines, "data", "data")
    rows = best_rows(lines)
    env = next((x for x in lines if x.get("status") == "ok"), {})
    out = [
        f"# slmlab compare: {budget:,} non-embedding parameters",
        "",
        f"Every family fitted to the budget (±10%) by its scaling rule, embeddings"
        f" {'untied' if settings.get('untied') else 'tied'}; the same data, {_budget_text(settings)}, batch"
        f" {settings.get('batch_size')}, lr grid {', '.join(f'{lr:g}' for lr in settings.get('lrs', []))}, seeds"
        f" {', '.join(map(str, settings.get('seeds', [])))}; evaluations every {settings.get('eval_every')} steps."
        f" Each row is the lr chosen on validation (seeds' mean), with its seeds' mean and per-seed values."
        + (f" {replaced} earlier lines in results.jsonl were replaced by a later run of the same data, model, lr"
           " and seed under other settings; only the later ones are read here." if replaced else ""),
        f"Measured with torch {env.get('torch', '?')} on {settings.get('device', '?')} ({env.get('dtype', '?')}"
        " weights).",
        "",
        "## Models",
        "",
        "| model | fitted config | non-embedding | vs budget | cache bytes / token | constant state bytes |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for model in models:
        fit = next((x["fit"] for x in lines if x["model"] == model), {})
        if "error" in fit:
            out.append(f"| {model} | failed: {fit['error']} | — | — | — | — |")
            continue
        first = _first(lines, model) or {}
        count = fit.get("non_embedding")
        share = f"{count / budget - 1:+.1%}" if count else "—"
        out.append(f"| {model} | {_config_text(fit)} | {_num(count)} | {share} |"
                   f" {_num(first.get('cache_bytes_per_token'))} | {_num(first.get('cache_bytes_constant'))} |")
    few = False
    for spec in data:
        kind = next(x["kind"] for x in lines if x["data"] == spec)
        out += ["", f"## {spec}", ""]
        if kind == "text":
            scope = next((x.get("val_scope") for x in lines if x["data"] == spec and x.get("val_scope")), "?")
            out += [f"Validation bits per byte at the last step ({scope}; lower is better). Text has no test"
                    " split: the lr is chosen on these same validation batches, so the figure is optimistic by"
                    " that choice.", "",
                    "| model | params total / embedding | lr (validation) | bits per byte: mean; per seed |"
                    " convergence | 95% CI (seeds) | every lr | steps | train tok/s | decode tok/s | wall s |",
                    "|---|---:|---:|---|---|---|---|---:|---:|---:|---:|"]
        else:
            out += ["Test accuracy at the scored positions of the lr chosen on validation accuracy, over its"
                    " seeds, with a 95% interval across seeds and test examples (1,000 two-stage resamples).", "",
                    "| model | params total / embedding | lr (validation) | accuracy: mean; per seed |"
                    " convergence | 95% CI (seeds × examples) | exact | every lr (validation → test) | steps |"
                    " train tok/s | decode tok/s | wall s |",
                    "|---|---:|---:|---|---|---|---:|---|---:|---:|---:|---:|"]
        blanks = " — |" * (9 if kind == "text" else 10)
        for model in models:
            row = rows.get((spec, model))
            if row is None:
                continue
            if "diverged_only" in row:
                out.append(f"| {model} | {_cell(row['diverged_only'])} |{blanks}")
                continue
            if "failed" in row:
                out.append(f"| {model} | failed: {_cell(row['failed'])} |{blanks}")
                continue
            r, s = row["runs"][0], row["summary"]
            digits = 4 if kind == "text" else 3
            mark = "" if s["n"] >= CLAIM_SEEDS else "*"
            few = few or bool(mark)
            value = f"{s['mean']:.{digits}f}{mark}; " + ", ".join(f"{v:.{digits}f}" for v in s["values"])
            value += f" | {row['convergence']}"
            ci = "—" if row["ci"] is None else f"[{row['ci'][0]:.{digits}f}, {row['ci'][1]:.{digits}f}]"
            if kind == "text":
                every = [f"{lr:g}: {m:.{digits}f}" for lr, m in row["by_lr"].items()]
            else:
                every = [f"{lr:g}: {row['val_by_lr'][lr]:.3f} → {m:.3f}" for lr, m in row["by_lr"].items()]
            every += [_diverged_text(d) for d in row["diverged"]]
            if row["failed_runs"]:
                every.append(f"{row['failed_runs']} failed")
            if row["incomplete"]:
                every.append(f"{row['incomplete']} incomplete")
            every_text = _cell(", ".join(every))
            params = f"{r['params_total']:,} / {r['params_embedding']:,}"
            speed = f"{_num(r['train_tokens_per_s'])} | {_num(r['decode_tokens_per_s'])} | {_num(r['wall_s'])}"
            if kind == "text":
                out.append(f"| {model} | {params} | {row['best_lr']:g} | {value} | {ci} | {every_text} | {r['steps']} |"
                           f" {speed} |")
            else:
                exact = seed_summary([x["exact"] for x in row["runs"]])["mean"]
                out.append(f"| {model} | {params} | {row['best_lr']:g} | {value} | {ci} | {exact:.3f} | {every_text} |"
                           f" {r['steps']} | {speed} |")
    if few:
        out += ["", f"\\* fewer than {CLAIM_SEEDS} seeds: a reading, not a claim (`--seeds 0,1,2`)."]
    out += ["", f"Convergence: {CONVERGENCE_NOTE[CONVERGENCE_NOTE.index(': ') + 2:]}."]
    out += ["", "## Scaling rules", ""]
    for model in models:
        fit = next((x["fit"] for x in lines if x["model"] == model), {})
        if fit.get("rule"):
            out.append(f"- {model}: {fit['rule']}")
    if plots:
        out += ["", "## Plots", ""]
        out += [f"![{name[:-4]}]({name})" for name in plots]
    return "\n".join(out) + "\n"


def _budget_text(settings: dict) -> str:
    """The step budget as the settings state it: a ceiling with a plateau stop, or a fixed budget (lines
    written before the plateau stop)."""
    if "patience" not in settings:
        return f"{settings.get('steps')} steps (a fixed budget: run before the plateau stop)"
    if not settings["patience"]:
        return f"{settings.get('steps')} steps (no plateau stop)"
    return (f"a ceiling of {settings.get('steps')} steps, stopping on a validation plateau of {settings['patience']}"
            " steps")


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def fitted_configs(lines: list[dict]) -> dict:
    """``fitted_configs.json``: per family its fitted config, count, rule (or its fitting error), from the last
    line of each run (:func:`latest_runs`)."""
    lines, out = latest_runs(lines), {}
    for model in _order(lines, "model", "models"):
        out[model] = next(x["fit"] for x in lines if x["model"] == model)
    return {"budget": lines[-1]["budget"] if lines else None, "tied": lines[-1]["tied"] if lines else None,
            "models": out}


def latest_runs(lines: list[dict]) -> list[dict]:
    """One line per run (data, model, lr, seed), the last one written: a rerun of the comparison under another
    budget (a longer patience, more steps) into the same folder replaces the earlier lines in the report, so a
    seed is never counted twice; the earlier lines stay in ``results.jsonl``."""
    return last_written(lines, lambda line: (line.get("data"), line.get("model"), line.get("lr"), line.get("seed")))


def write_report(lines: list[dict], out_dir: str | Path) -> list[Path]:
    """Write ``summary.md``, ``fitted_configs.json`` and the PNGs into ``out_dir``; returns the files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from ..plots import matplotlib_missing

    missing = matplotlib_missing()
    if missing:
        print(f"slmlab compare: plots not written: {missing}")
    plots = [] if missing else make_plots(lines, out)
    summary, configs = out / "summary.md", out / "fitted_configs.json"
    summary.write_text(summary_markdown(lines, [p.name for p in plots]))
    configs.write_text(dumps_finite(fitted_configs(lines), indent=2) + "\n")
    return [summary, configs, *plots]


def make_plots(lines: list[dict], out: Path) -> list[Path]:
    from ..plots import pyplot

    plt = pyplot()
    lines = latest_runs(lines)
    rows = best_rows(lines)
    models, data = _order(lines, "model", "models"), _order(lines, "data", "data")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {m: colours[i % len(colours)] for i, m in enumerate(models)}
    written: list[Path] = []
    text = [d for d in data if next(x["kind"] for x in lines if x["data"] == d) == "text"]
    tasks = [d for d in data if d not in text]
    ok = {k: r for k, r in rows.items() if "summary" in r}
    try:
        points = [(d, m, ok[(d, m)]) for d in text for m in models if (d, m) in ok]
        if points:
            fig, ax = plt.subplots(figsize=(6, 4))
            for d, m, r in points:
                ax.scatter(r["runs"][0]["params_nonembedding"], r["summary"]["mean"], color=colour[m],
                           marker="o" if d == text[0] else "s", label=f"{m} ({d})")
            ax.set_xlabel("non-embedding parameters")
            ax.set_ylabel("validation bits per byte")
            ax.set_title("bits per byte vs non-embedding parameters")
            ax.legend(fontsize=7)
            _save(fig, out / PLOTS[0], written)
        panels = [(d, [(m, ok[(d, m)]) for m in models if (d, m) in ok]) for d in tasks]
        panels = [p for p in panels if p[1]]
        if panels:
            fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
            for ax, (d, found) in zip(axes[0], panels):
                for m, r in found:
                    ax.scatter(r["runs"][0]["cache_bytes_per_token"], r["summary"]["mean"], color=colour[m], label=m)
                ax.set_xlabel("cache bytes per token")
                ax.set_ylabel("test accuracy")
                ax.set_ylim(-0.02, 1.02)
                ax.set_title(d)
                ax.legend(fontsize=7)
            _save(fig, out / PLOTS[1], written)
        panels = [(d, [(m, ok[(d, m)]) for m in models if (d, m) in ok and ok[(d, m)]["runs"][0].get("curve")])
                  for d in data]
        panels = [p for p in panels if p[1]]
        if panels:
            fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
            for ax, (d, found) in zip(axes[0], panels):
                for m, r in found:
                    curve = r["runs"][0]["curve"]
                    ax.plot([c[0] for c in curve], [c[1] for c in curve], marker="o", ms=3, color=colour[m], label=m)
                ax.set_xlabel("training tokens")
                ax.set_ylabel("validation loss (nats / token)")
                ax.set_title(f"{d} (lr chosen on validation, first seed)")
                ax.legend(fontsize=7)
            _save(fig, out / PLOTS[2], written)
        t7 = [(d, m, ok[(d, m)]) for d in tasks for m in models
              if (d, m) in ok and ok[(d, m)]["runs"][0].get("task") == "t7" and ok[(d, m)]["runs"][0].get("acc_by_group")]
        if t7:
            fig, ax = plt.subplots(figsize=(6, 4))
            for d, m, r in t7:
                groups = r["runs"][0]["acc_by_group"]
                keys = sorted(groups, key=lambda g: float(g) if _is_number(g) else g)
                ax.plot(range(len(keys)), [groups[k] for k in keys], marker="o", color=colour[m],
                        label=m if len({x[0] for x in t7}) == 1 else f"{m} ({d})")
                ax.set_xticks(range(len(keys)), keys, rotation=30, fontsize=7)
            ax.set_xlabel("distance group")
            ax.set_ylabel("test accuracy")
            ax.set_ylim(-0.02, 1.02)
            ax.set_title("T7 accuracy by distance (lr chosen on validation, first seed)")
            ax.legend(fontsize=7)
            _save(fig, out / PLOTS[3], written)
        panels = [(f"{d} | {m}", ok[(d, m)]["convergence"],
                   [(f"seed {r['seed']}", r["val_curve"]) for r in ok[(d, m)]["runs"] if r.get("val_curve")])
                  for d in data for m in models if (d, m) in ok]
        learning_curves(plt, [p for p in panels if p[2]], out / LEARNING_CURVES, written, _save)
    finally:
        plt.close("all")
    return written


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _save(fig, path: Path, written: list[Path]) -> None:
    fig.subplots_adjust(left=0.14, right=0.97, bottom=0.16, top=0.9, wspace=0.3, hspace=0.75)  # fixed: no layout solver
    fig.savefig(path, dpi=100, metadata={"Software": None})
    written.append(path)
