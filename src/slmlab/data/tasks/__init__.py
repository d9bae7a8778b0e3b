"""Synthetic tasks of spec/benchmarks.md as numpy generators (T1 MQAR, T7 distance retrieval).

Each module registers its task in :data:`TASKS`; ``parse_task_spec("mqar:cpu")`` builds a config.
"""

from .base import IGNORE_INDEX, SPLIT_IDS, TASKS, Task, TaskBatch, parse_task_spec, register_task, to_hf_labels
from .distance import DistanceRetrieval
from .mqar import MQAR

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
