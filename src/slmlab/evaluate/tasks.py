"""Run lm-evaluation-harness tasks against an slmlab model (``slmlab eval RUN --tasks ...``).

lm-eval is an optional extra (``pip install "slmlab[eval]"``) and is imported only here, inside
the functions. Tasks are named as lm-eval names them (installed tasks, groups, tags, glob patterns),
found in ``--include-path`` folders of task YAMLs, or given as ``.yaml`` paths. When every name is
found under the include path, lm-eval's own index of installed tasks (~15,000 YAMLs, seconds to
scan) is never built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EXTRA_HINT = 'pip install "slmlab[eval]"'


def require_lm_eval():
    """The ``lm_eval`` module, or a ValueError saying how to install it."""
    try:
        import lm_eval
    except ImportError as err:
        raise ValueError(f"--tasks needs lm-evaluation-harness, which is not installed ({err}); {EXTRA_HINT}") from None
    return lm_eval


def split_task_names(tasks: str | list[str]) -> list[str]:
    """``"a,b"`` or ``["a", "b,c"]`` -> ``["a", "b", "c"]`` (blanks dropped; an empty list is refused)."""
    items = [tasks] if isinstance(tasks, str) else list(tasks)
    names = [t.strip() for item in items for t in item.split(",") if t.strip()]
    if not names:
        raise ValueError("--tasks names no task; pass lm-eval task names separated by commas (e.g. --tasks arc_easy,piqa)")
    return names


@dataclass(frozen=True)
class TaskSelection:
    """What ``simple_evaluate`` needs: lm-eval's ``TaskManager`` and the matched task names or YAML configs."""

    manager: object
    items: list
    include_path: str | None


def resolve_tasks(names: list[str], include_path: str | Path | None = None) -> TaskSelection:
    """The tasks ``names`` select (installed, under ``include_path``, or ``.yaml`` files).

    Raises:
        ValueError: lm-eval's "Tasks not found" message plus what to do; a missing include path.
    """
    require_lm_eval()
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml

    if include_path is not None and not Path(include_path).is_dir():
        raise ValueError(f"--include-path {include_path} is not a folder; pass the folder that holds the task YAMLs")
    yaml_names = [n for n in names if n.endswith((".yaml", ".yml"))]
    for name in yaml_names:
        if not Path(name).is_file():
            raise ValueError(f"task file {name} does not exist; check the path")
    plain = [n for n in names if n not in yaml_names]
    manager = None
    if include_path is not None:  # the user's folder alone: no scan of every installed task
        manager = TaskManager(include_path=str(include_path), include_defaults=False)
        if any(not manager.match_tasks([n]) for n in plain):
            manager = None
    if manager is None:
        manager = TaskManager(include_path=str(include_path) if include_path is not None else None)
    missing = [n for n in plain if not manager.match_tasks([n])]
    if missing:
        where = f" (searched lm-eval's installed tasks and {include_path})" if include_path else ""
        raise ValueError(
            f"Tasks not found: {', '.join(missing)}{where}; pass --include-path DIR with the folder that holds the"
            " task's YAML (or the .yaml file itself as the task), or list lm-eval's tasks with `lm_eval ls tasks`"
        )
    resolved: list = []
    for name in names:
        found = [load_yaml(str(Path(name).absolute()), resolve_func=True)] if name in yaml_names else manager.match_tasks([name])
        resolved += [t for t in found if t not in resolved]
    return TaskSelection(manager, resolved, str(include_path) if include_path is not None else None)


def parse_limit(value: str | None) -> int | float | None:
    """``--limit``: an integer number of documents per task, or a fraction in (0, 1)."""
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"--limit must be a number of documents or a fraction in (0, 1), got {value!r}") from None
    if number <= 0:
        raise ValueError(f"--limit must be positive, got {value}")
    if number < 1:
        return number
    if number != int(number):
        raise ValueError(f"--limit above 1 counts documents and must be an integer, got {value}")
    return int(number)


def run_tasks(model, tokenizer, tasks: str | list[str] | TaskSelection, *, max_length: int, include_path: str | Path | None = None,
              limit: int | float | None = None, num_fewshot: int | None = None, batch_size: int = 16,
              device="cpu", autocast=None, log_samples: bool = False, seed: int = 0) -> dict:
    """lm-eval's ``simple_evaluate`` over :class:`slmlab.evaluate.harness.SlmlabLM`.

    Args:
        model / tokenizer: an slmlab causal LM and the tokenizer it was trained with.
        tasks: lm-eval task names, patterns or ``.yaml`` paths (``"a,b"`` or a list), or what
            :func:`resolve_tasks` returned (then ``include_path`` is not used again).
        max_length: the context window in tokens (the run's ``block_size``).
        include_path: a folder of extra task YAMLs.
        limit: documents per task (int) or a fraction of each task (float < 1).
        num_fewshot: few-shot examples (None: each task's default).
        batch_size / device / autocast: as in ``slmlab eval``.
        log_samples: keep lm-eval's per-document ``samples`` (requests, responses, metrics).
        seed: lm-eval's random, numpy, torch and few-shot seeds.
    Returns:
        lm-eval's results dict (``results``, ``versions``, ``n-shot``, ``config``, ... and
        ``samples`` when asked).
    """
    require_lm_eval()
    from lm_eval import simple_evaluate

    from .harness import SlmlabLM

    selection = tasks if isinstance(tasks, TaskSelection) else resolve_tasks(split_task_names(tasks), include_path)
    lm = SlmlabLM(model, tokenizer, max_length=max_length, batch_size=batch_size, device=device, autocast=autocast)
    results = simple_evaluate(
        model=lm, tasks=selection.items, num_fewshot=num_fewshot, limit=limit, task_manager=selection.manager,
        log_samples=log_samples, bootstrap_iters=1000, random_seed=seed, numpy_random_seed=seed,
        torch_random_seed=seed, fewshot_random_seed=seed,
    )
    if results is None:  # lm-eval returns None on non-zero ranks only
        raise ValueError("lm-eval returned no results; run slmlab eval --tasks in a single process")
    return results
