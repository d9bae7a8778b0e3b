"""Synthetic tasks: determinism, invariants, label convention converted exactly once, registration."""

from __future__ import annotations

import importlib
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch

import slmlab.data.tasks as tasks_pkg
from slmlab.data.tasks import (
    IGNORE_INDEX,
    MQAR,
    TASKS,
    DistanceRetrieval,
    Task,
    parse_task_spec,
    register_task,
    to_hf_labels,
)
from slmlab.data.tasks.distance import FILLER, KEYS, QUERY, STORE, VALUES
from slmlab.models.base import causal_lm_loss

SMALL_MQAR = dict(V=256, T=64, N=8, n_train=10, n_test=10)
SMALL_T7 = dict(T=64, distance=40, D=3, n_train=10, n_test=10)


@pytest.mark.parametrize("task", [MQAR(**SMALL_MQAR), MQAR(**SMALL_MQAR, filler="random"), DistanceRetrieval(**SMALL_T7)])
def test_generators_are_deterministic_per_seed_and_split(task):
    a, b = task.make(50, 3, "train"), task.make(50, 3, "train")
    for x, y in [(a.inputs, b.inputs), (a.labels, b.labels), (a.retrieval_positions, b.retrieval_positions)]:
        assert x.tobytes() == y.tobytes()
    assert not np.array_equal(a.inputs, task.make(50, 3, "test").inputs)
    assert not np.array_equal(a.inputs, task.make(50, 4, "train").inputs)
    assert np.array_equal(task.make(50, 3, "train", chunk_rows=7).inputs, task.make(50, 3, "train", chunk_rows=7).inputs)


@pytest.mark.parametrize("task", [MQAR(**SMALL_MQAR), DistanceRetrieval(**SMALL_T7)])
def test_scored_positions_are_the_retrieval_positions(task):
    b = task.make(200, 0, "train")
    rows, cols = np.nonzero(b.scored)
    assert np.array_equal(np.sort(cols.reshape(len(b.inputs), -1), axis=1), b.retrieval_positions)
    assert (b.retrieval_positions <= task.seq_len - 2).all()  # the last position is never scored
    assert b.inputs.min() >= 0 and b.inputs.max() < task.vocab_size


@pytest.mark.parametrize("filler", ["zero", "random"])
def test_mqar_invariants(filler):
    task = MQAR(**SMALL_MQAR, filler=filler)
    V, T, N = task.V, task.T, task.N
    b = task.make(300, 0, "train")
    for x, y, q in zip(b.inputs, b.labels, b.retrieval_positions):
        keys, values = x[0 : 2 * N : 2], x[1 : 2 * N : 2]
        assert len(set(keys)) == N and ((keys >= 1) & (keys < V // 2)).all()
        assert len(set(values)) == N and ((values >= V // 2) & (values < V)).all()
        pair = dict(zip(keys, values))
        assert ((q - 2 * N) % 2 == 0).all() and (q >= 2 * N).all()
        assert sorted(x[q]) == sorted(keys)  # each key queried exactly once
        assert all(y[p] == pair[x[p]] for p in q)
        if filler == "zero":
            rest = np.setdiff1d(np.arange(2 * N, T), q)
            assert (x[rest] == 0).all()
    if filler == "random":
        assert (b.inputs[:, 2 * N :] != 0).mean() > 0.5


def test_mqar_queries_cluster_early_with_power_a():
    b = MQAR(V=1024, T=256, N=4, n_train=10, n_test=10).make(500, 0, "train")
    gaps = (b.retrieval_positions - 8) // 2
    uniform = MQAR(V=1024, T=256, N=4, power_a=1.0, n_train=10, n_test=10).make(500, 0, "train")
    assert gaps.mean() < ((uniform.retrieval_positions - 8) // 2).mean() / 2


def test_distance_retrieval_invariants():
    task = DistanceRetrieval(**SMALL_T7)
    b = task.make(300, 0, "train")
    for x, y, (q,), d in zip(b.inputs, b.labels, b.retrieval_positions, b.meta["distance"]):
        kpos = q - d
        assert d == 40 and x[kpos - 1] == STORE and x[q - 1] == QUERY and x[q] == x[kpos]
        assert y[q] == x[kpos + 1] and VALUES[0] <= y[q] < VALUES[1]
        stores = np.flatnonzero(x == STORE)
        assert len(stores) == task.D + 1 and (stores < q - 1).all()
        store_keys = x[stores + 1]
        assert len(set(store_keys)) == task.D + 1 and ((store_keys >= KEYS[0]) & (store_keys < KEYS[1])).all()
        assert (x == QUERY).sum() == 1
        special = np.zeros(len(x), dtype=bool)
        special[np.concatenate([stores, stores + 1, stores + 2, [q - 1, q]])] = True
        assert ((x[~special] >= FILLER[0]) & (x[~special] < FILLER[1])).all()  # filler never mimics a needle


def test_distance_retrieval_variants():
    b = DistanceRetrieval(**SMALL_T7, query_layout="key_then_marker").make(50, 0, "train")
    q = b.retrieval_positions[:, 0]
    rows = np.arange(50)
    assert (b.inputs[rows, q] == QUERY).all() and (b.inputs[rows, q - 1] >= KEYS[0]).all()
    v = DistanceRetrieval(**{**SMALL_T7, "distance": 10, "D": 1}, max_distance=50).make(400, 0, "train")
    assert v.meta["distance"].min() == 10 and v.meta["distance"].max() == 50
    assert np.array_equal(v.meta["group"], v.meta["distance"])


def test_label_conversion_on_a_hand_built_example():
    # Spec convention: the prediction made AT position 2 must be token 7.
    inputs = torch.tensor([[3, 4, 5, 6]])
    spec_labels = np.array([[IGNORE_INDEX, IGNORE_INDEX, 7, IGNORE_INDEX]])
    hf = torch.from_numpy(to_hf_labels(spec_labels))
    assert hf.tolist() == [[IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, 7]]
    # A "model" that outputs 7 only at position 2 (one-hot logits) has ~0 loss under the
    # library's shift-inside loss; one that outputs it at position 3 (shifted twice) does not.
    right = torch.full((1, 4, 10), -20.0)
    right[0, 2, 7] = 20.0
    wrong = torch.full((1, 4, 10), -20.0)
    wrong[0, 2, 5] = 20.0  # at position 2 it copies the input token
    wrong[0, 3, 7] = 20.0
    assert causal_lm_loss(right, hf).item() < 1e-6
    assert causal_lm_loss(wrong, hf).item() > 10
    assert inputs.shape == hf.shape


def test_to_hf_labels_refuses_a_scored_last_position():
    with pytest.raises(ValueError, match="last position"):
        to_hf_labels(np.array([[IGNORE_INDEX, 5]]))


def test_spec_parsing_settings_and_overrides():
    cpu = parse_task_spec("mqar:cpu")
    assert (cpu.V, cpu.T, cpu.N, cpu.filler, cpu.n_train, cpu.n_test) == (1024, 64, 4, "zero", 20_000, 1_000)
    assert parse_task_spec("mqar") == MQAR(**MQAR.settings["gpu"])
    assert parse_task_spec("t1:cpu,T=128,N=8").T == 128
    t7 = parse_task_spec("t7:cpu")
    assert (t7.T, t7.distance, t7.D, t7.n_train, t7.n_test, t7.vocab_size) == (128, 96, 2, 8_000, 500, 256)
    assert parse_task_spec("t7").T == 1024 and parse_task_spec("t7:cpu,max_distance=none").max_distance is None
    assert parse_task_spec("shakespeare") is None


@pytest.mark.parametrize(
    "spec, match",
    [
        ("mqar:laptop", "unknown setting 'laptop'"),
        ("mqar:cpu,K=3", "has no field 'K'"),
        ("mqar:cpu,T=abc", "field 'T' expects an integer, got 'abc'"),
        ("mqar:cpu,power_a=x", "field 'power_a' expects a number"),
        ("mqar:cpu,T=63", "T must be a positive even integer"),
        ("mqar:cpu,V=64", "V must be even and > T"),
        ("mqar:cpu,N=17", "4N <= T"),
        ("mqar:cpu,filler=ones", "filler must be one of"),
        ("mqar:cpu,n_train=0", "n_train must be a positive integer"),
        ("t7:cpu,distance=2", "distance must be >= 3"),
        ("t7:cpu,distance=126", "does not fit in T=128"),
        ("t7:cpu,max_distance=50", "must be >= distance"),
        ("t7:cpu,D=40", "do not fit before a query"),
        ("t7:cpu,query_layout=sideways", "query_layout must be one of"),
    ],
)
def test_invalid_configs_name_the_field(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_task_spec(spec)


@pytest.mark.parametrize("k", [3, 4])  # 3: rejection path (k^2 <= range); 4: sorted-keys path
def test_distinct_uniform_is_distinct_in_range_and_uniform(k):
    from slmlab.data.tasks.base import distinct_uniform

    x = distinct_uniform(np.random.default_rng(0), 5, 15, 40_000, k)
    assert x.shape == (40_000, k) and x.min() >= 5 and x.max() < 15
    ordered = np.sort(x, axis=1)
    assert (ordered[:, 1:] != ordered[:, :-1]).all()
    for col in range(k):  # every slot is uniform over the range (1/10 each, 4-sigma band)
        freq = np.bincount(x[:, col] - 5, minlength=10) / len(x)
        assert np.abs(freq - 0.1).max() < 0.006
    with pytest.raises(ValueError, match="cannot draw 11 distinct values"):
        distinct_uniform(np.random.default_rng(0), 5, 15, 1, 11)


@pytest.fixture
def registry():
    """The task registry, restored after the test (throwaway tasks must not leak into other tests)."""
    saved = dict(TASKS)
    yield TASKS
    TASKS.clear()
    TASKS.update(saved)


def throwaway_task(name: str, task_id: int) -> type[Task]:
    @dataclass(frozen=True)
    class Throwaway(Task):
        settings: ClassVar[dict[str, dict]] = {"gpu": dict(n_train=1, n_test=1)}

        @property
        def vocab_size(self) -> int:
            return 4

        @property
        def seq_len(self) -> int:
            return 4

        def _generate(self, n, rng):
            raise NotImplementedError

    Throwaway.name, Throwaway.task_id = name, task_id
    Throwaway.__qualname__ = f"Throwaway_{name}_{task_id}"
    return Throwaway


def test_duplicate_task_id_or_name_is_refused_and_registers_nothing(registry):
    before = dict(registry)
    with pytest.raises(ValueError, match=r"task_id 1 of .*Throwaway_fresh_1 is already used by slmlab\.data\.tasks\.mqar\.MQAR"):
        register_task(throwaway_task("fresh", MQAR.task_id))
    with pytest.raises(ValueError, match=r"task name 'mqar' of .* is already registered by slmlab\.data\.tasks\.mqar\.MQAR"):
        register_task(throwaway_task("mqar", 901))
    with pytest.raises(ValueError, match="task name 't1'"):
        register_task(throwaway_task("fresh", 902), "T1")  # aliases are case-insensitive, like spec lookup
    with pytest.raises(ValueError, match="non-empty name and a task_id >= 0"):
        register_task(throwaway_task("", 903))
    with pytest.raises(TypeError, match="Task subclass"):
        register_task(int)
    assert registry == before
    fresh = register_task(throwaway_task("fresh", 904), "fresh_alias")
    assert register_task(fresh) is fresh  # the same class again (a reloaded module) is fine
    assert registry["fresh"] is registry["fresh_alias"] is fresh
    assert isinstance(parse_task_spec("FRESH"), fresh)


def test_every_module_of_the_package_registers_its_task():
    modules = {p.stem for p in Path(tasks_pkg.__file__).parent.glob("*.py")} - {"__init__", "base"}
    registered = {cls.__module__.rsplit(".", 1)[1] for cls in TASKS.values()}
    assert modules and modules <= registered
    assert len({cls.task_id for cls in set(TASKS.values())}) == len(set(TASKS.values()))


def test_a_new_module_in_the_package_is_discovered(tmp_path, monkeypatch):
    """A copy of the package with one extra module: importing the package registers the new task."""
    shutil.copytree(Path(tasks_pkg.__file__).parent, tmp_path / "tasks_copy", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "tasks_copy" / "echo.py").write_text(
        "from dataclasses import dataclass\n"
        "from typing import ClassVar\n"
        "from .base import Task, register_task\n\n\n"
        "@dataclass(frozen=True)\n"
        "class Echo(Task):\n"
        "    name: ClassVar[str] = 'echo'\n"
        "    task_id: ClassVar[int] = 99\n"
        "    vocab_size = 4\n"
        "    seq_len = 4\n\n"
        "    def _generate(self, n, rng):\n"
        "        raise NotImplementedError\n\n\n"
        "register_task(Echo)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        copy = importlib.import_module("tasks_copy")
        assert copy.TASKS["echo"].__module__ == "tasks_copy.echo"
        assert {"mqar", "t1", "t7", "distance_retrieval"} <= set(copy.TASKS)
    finally:
        for name in [m for m in sys.modules if m == "tasks_copy" or m.startswith("tasks_copy.")]:
            del sys.modules[name]
    assert "echo" not in TASKS


@pytest.mark.parametrize("name", sorted({cls.name for cls in TASKS.values()}))
def test_every_registered_task_keeps_the_batch_contract(name):
    """Runs for each task in the registry, so a new task module is checked without a new test."""
    cls = TASKS[name]
    task = cls.from_spec("cpu" if "cpu" in cls.settings else cls.default_setting)
    a, b = task.make(4, seed=1, split="train"), task.make(4, seed=1, split="train")
    assert a.inputs.shape == a.labels.shape == (4, task.seq_len) and a.inputs.dtype == a.labels.dtype == np.int64
    assert np.array_equal(a.inputs, b.inputs) and np.array_equal(a.labels, b.labels)
    assert not np.array_equal(a.inputs, task.make(4, seed=1, split="test").inputs)
    assert a.inputs.min() >= 0 and a.inputs.max() < task.vocab_size
    scored = a.labels[a.scored]
    assert scored.size and scored.min() >= 0 and scored.max() < task.vocab_size
    assert not a.scored[:, -1].any()  # the last position has no slot after the shift (to_hf_labels)
    rows = np.arange(4)[:, None]
    real = a.retrieval_positions >= 0
    assert a.scored[np.broadcast_to(rows, real.shape)[real], a.retrieval_positions[real]].all()
    assert all(len(v) == 4 for v in a.meta.values())
