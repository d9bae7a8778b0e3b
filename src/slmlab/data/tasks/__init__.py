"""Synthetic tasks as numpy generators (T1 MQAR, T7 distance retrieval); see ``docs/data.md``.

Every module of this package is imported here, and each registers its task in :data:`TASKS`
(:func:`register_task`, which refuses a duplicate name or ``task_id``), so adding a task is adding a
module. ``parse_task_spec("mqar:cpu")`` builds a config.
"""

import importlib
import pkgutil

from .base import IGNORE_INDEX, SPLIT_IDS, TASKS, Task, TaskBatch, parse_task_spec, register_task, to_hf_labels

# The built-in tasks' classes stay importable from here (public names); a new task needs no line here.
from .distance import DistanceRetrieval
from .mqar import MQAR

for _info in pkgutil.iter_modules(__path__):
    if _info.name != "base" and not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = [
    "IGNORE_INDEX",
    "SPLIT_IDS",
    "TASKS",
    "DistanceRetrieval",
    "MQAR",
    "Task",
    "TaskBatch",
    "parse_task_spec",
    "register_task",
    "to_hf_labels",
]
