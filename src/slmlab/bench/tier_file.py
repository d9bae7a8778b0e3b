"""Tiers as YAML files: the runs of a tier and their budgets, editable without touching code
(``docs/bench.md``, Tier files). The built-in tiers are the files in ``slmlab/bench/tiers/`` (one
source: ``--tier cpu-full`` reads ``tiers/cpu-full.yaml``); ``--tier FILE.yaml`` reads a user's copy.

A file names its tier and lists groups; each group is the product of its ``tasks`` × ``models`` × ``lrs``
× ``seeds`` (× the lists inside ``model_config``, e.g. a ``d_model`` sweep) with the group's budget::

    tier: cpu-full
    description: what the tier is for
    defaults: {batch_size: 64}          # RunPlan fields for every group (optional)
    groups:
      - tasks: [mqar:cpu, "mqar:cpu,T=128,N=8"]
        models: [attn2-z, shortconv4]
        lrs: [1.0e-3, 3.0e-3]
        max_steps: 2191                 # the budget: steps, the same on any machine
        max_time: 1200                  # a safety cap only (a run it stops is no result)

``max_steps`` is required in every group (or in ``defaults``): a run's budget is its steps, never the
clock. ``seeds`` defaults to :data:`DEFAULT_SEEDS` (three: what a claim needs); a check tier says
``seeds: [0]``. Every other key of a group (and of ``defaults``) is a
:class:`~slmlab.bench.suite.RunPlan` field. Unknown keys, tasks and models raise ``ValueError`` naming the
file, the group and the key, before any run starts.
``slmlab bench run --tier FILE.yaml`` runs it; ``slmlab bench list --yaml TIER`` prints a built-in one.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
from pathlib import Path

from ..data.sources import TRAIN_ON
from .suite import RunPlan, filter_plans

GROUP_LISTS = {"tasks": "task", "models": "model", "lrs": "lr", "seeds": "seed"}
PLAN_FIELDS = {f.name for f in dataclasses.fields(RunPlan)} - {"task", "model", "lr", "seed", "model_config"}
TOP_KEYS = ("tier", "description", "defaults", "groups")
DEFAULT_SEEDS = [0, 1, 2]
TIERS_DIR = Path(__file__).parent / "tiers"


def builtin_tiers() -> dict[str, Path]:
    """The built-in tiers, name -> file, in the order ``slmlab bench list`` shows them."""
    order = ("cpu-smoke", "cpu-full", "gpu-paper", "micro")
    files = {p.stem: p for p in TIERS_DIR.glob("*.yaml")}
    return {name: files[name] for name in sorted(files, key=lambda n: (order.index(n) if n in order else len(order), n))}


def tier_path(tier: str) -> Path:
    """The file of a built-in tier name, or ``tier`` itself when it names a YAML file."""
    if is_tier_file(tier):
        return Path(tier)
    tiers = builtin_tiers()
    if tier not in tiers:
        raise ValueError(f"unknown tier {tier!r}; known: {', '.join(tiers)} (or a tier file, FILE.yaml)")
    return tiers[tier]


def tier_plans(tier: str, tasks: list[str] | None = None, models: list[str] | None = None,
               seeds: list[int] | None = None) -> list[RunPlan]:
    """A tier's runs (a built-in name or a tier file), filtered by task names / aliases and model ids,
    repeated for each seed (:func:`slmlab.bench.suite.filter_plans`)."""
    return filter_plans(load_tier_file(tier_path(tier))[2], tasks, models, seeds)


def is_tier_file(name: str) -> bool:
    """True when ``--tier`` names a YAML file rather than a built-in tier."""
    return name.endswith((".yaml", ".yml"))


def load_tier_file(path: str | Path) -> tuple[str, str, list[RunPlan]]:
    """``(tier name, description, plans)`` of a tier file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: malformed YAML, an unknown key, task or model, or a group without tasks, models or lrs.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no tier file {path}; `slmlab bench list` names the built-in tiers")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a tier file is a mapping with keys {', '.join(TOP_KEYS)}")
    _check_keys(path, "the file", raw, TOP_KEYS)
    groups = raw.get("groups")
    if not isinstance(groups, list) or not groups:
        raise ValueError(f"{path}: 'groups' must be a non-empty list of run groups")
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ValueError(f"{path}: 'defaults' must be a mapping of RunPlan fields (and seeds)")
    _check_keys(path, "defaults", defaults, sorted(PLAN_FIELDS | {"seeds"}))
    plans = []
    for number, group in enumerate(groups, 1):
        if not isinstance(group, dict):
            raise ValueError(f"{path}: group {number} must be a mapping, got {group!r}")
        plans += _expand(path, number, {**defaults, **group})
    _check_names(path, plans)
    return str(raw.get("tier") or path.stem), str(raw.get("description") or ""), plans


def _expand(path: Path, number: int, group: dict) -> list[RunPlan]:
    where = f"group {number}"
    _check_keys(path, where, group, sorted(PLAN_FIELDS | set(GROUP_LISTS) | {"model_config"}))
    axes = []
    for key in ("tasks", "models", "lrs", "seeds"):
        values = group.get(key, DEFAULT_SEEDS if key == "seeds" else None)
        values = [values] if isinstance(values, (str, int, float)) else values
        if not isinstance(values, list) or not values:
            raise ValueError(f"{path}: {where} needs a non-empty list '{key}'")
        axes.append(values)
    if "max_steps" not in group:
        raise ValueError(f"{path}: {where} has no max_steps; a run's budget is its step count (max_time is only a"
                         " safety cap): add max_steps to the group or to defaults")
    config = group.get("model_config") or {}
    if not isinstance(config, dict):
        raise ValueError(f"{path}: {where}: 'model_config' must be a mapping of config fields")
    names = list(config)
    config_axes = [v if isinstance(v, list) else [v] for v in config.values()]
    fixed = {k: v for k, v in group.items() if k in PLAN_FIELDS}
    if fixed.get("train_on", "scored") not in TRAIN_ON:
        raise ValueError(f"{path}: {where}: train_on must be one of {TRAIN_ON}, got {fixed['train_on']!r}")
    plans = []
    for task, model, lr, seed in itertools.product(*axes):
        for values in itertools.product(*config_axes):
            try:
                plans.append(RunPlan(str(task), str(model), float(lr), seed=int(seed),
                                     model_config=tuple(zip(names, values)), **fixed))
            except (TypeError, ValueError) as err:
                raise ValueError(f"{path}: {where}: {err}") from None
    return plans


def _check_keys(path: Path, where: str, mapping: dict, known) -> None:
    for key in mapping:
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(known)}"
            raise ValueError(f"{path}: {where} has an unknown key {key!r}{hint}")


def _check_names(path: Path, plans: list[RunPlan]) -> None:
    """Unknown tasks and models raise before any run (listing the known ones)."""
    from ..data.tasks import TASKS, parse_task_spec
    from .models import resolve_entry

    for spec in sorted({p.task for p in plans}):
        try:
            task = parse_task_spec(spec)
        except ValueError as err:
            raise ValueError(f"{path}: task {spec!r}: {err}") from None
        if task is None:
            raise ValueError(f"{path}: unknown task {spec!r}; known: {', '.join(sorted(TASKS))}")
    for model in sorted({p.model for p in plans}):
        try:
            resolve_entry(model)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None
