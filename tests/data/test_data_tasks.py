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

SINGLE_AR_DIGEST = "65cb2369ae7e4bd1"  # the rows of the single-query generator before issue 33 (commit 7adaeab)
SMALL_MQAR = dict(V=256, T=64, N=8, n_train=10, n_test=10)
SMALL_T7 = dict(T=64, distance=40, D=3, n_train=10, n_test=10)

# A small config (or several) per registered task: the parametrised tests below are built from TASKS,
# and test_every_task_has_a_small_config fails when a task is registered without an entry here.
SMALL_SPECS = {
    "mqar": ["mqar:cpu,V=256,N=8", "mqar:cpu,V=256,N=8,filler=random", "mqar:cpu,V=256,N=4,num_passes=3"],
    "t7": ["t7:cpu,T=64,distance=40,D=3"],
    "ar": ["ar:cpu", "ar:cpu,T=33,N=4", "ar:cpu,layout=single,T=32", "ar:cpu,layout=single,T=33"],
    "selective_copy": ["t3:cpu,T=64,M=8", "t3:cpu,T=64,M=8,variable=false"],
    "induction": ["t4:cpu,variant=trigger,V=16,T=32", "t4:cpu,T=64"],
    "niah": [f"t5:cpu,T=96,variant={v}" for v in ("single", "multikey", "multivalue", "multiquery", "vartrack")]
    + ["t5:cpu,T=128,variant=multikey,D=7,haystack=essay", "t5:cpu,T=160,variant=vartrack,hops=4,count=4"],
    "passkey": ["t6:cpu"],
}
ALL_SMALL = [spec for name in sorted({cls.name for cls in TASKS.values()}) for spec in SMALL_SPECS.get(name, [])]


def test_every_task_has_a_small_config():
    assert sorted({cls.name for cls in TASKS.values()}) == sorted(SMALL_SPECS)


@pytest.mark.parametrize("spec", ALL_SMALL)
def test_generators_are_deterministic_per_seed_and_split(spec):
    task = parse_task_spec(spec)
    a, b = task.make(50, 3, "train"), task.make(50, 3, "train")
    for x, y in [(a.inputs, b.inputs), (a.labels, b.labels), (a.retrieval_positions, b.retrieval_positions)]:
        assert x.tobytes() == y.tobytes()
    assert not np.array_equal(a.inputs, task.make(50, 3, "test").inputs)
    assert not np.array_equal(a.inputs, task.make(50, 4, "train").inputs)
    assert np.array_equal(task.make(50, 3, "train", chunk_rows=7).inputs, task.make(50, 3, "train", chunk_rows=7).inputs)


@pytest.mark.parametrize("spec", ALL_SMALL)
def test_scored_positions_are_the_retrieval_positions(spec):
    task = parse_task_spec(spec)
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


# -- T2-T6 invariants (benchmark spec section 2) ------------------------------------------------


def test_ar_single_layout_label_is_the_maps_value_of_the_queried_key():
    from slmlab.data.tasks.ar import COPY

    for T in (32, 33):
        b = parse_task_spec(f"ar:cpu,layout=single,T={T}").make(300, 0, "train")
        assert (b.retrieval_positions[:, 0] == T - 2).all() and (b.inputs[:, T - 3] == COPY).all()
        for x, y in zip(b.inputs, b.labels):
            start = (T - 3) % 2
            keys, values = x[start : T - 3 : 2], x[start + 1 : T - 3 : 2]
            assert ((keys >= 2) & (keys < 21)).all() and ((values >= 21) & (values < 40)).all()
            mapping = {}
            for k, v in zip(keys, values):
                assert mapping.setdefault(k, v) == v  # repeated keys keep their value
            assert x[T - 2] in mapping and y[T - 2] == mapping[x[T - 2]] == x[T - 1]  # the answer follows the key
        assert len(np.unique(b.labels[:, T - 2])) > 10  # every value occurs as an answer


def test_t2_is_multi_query_recall_at_the_cpu_setting():
    """The numbers that define the suite's T2 (issue 33): the published 40-token vocabulary, 6 pairs in 32 tokens,
    a gap of 7 so that no pair is within 9 tokens (shortconv4's receptive field) of any query, and 1/19 as the
    accuracy of any model that reads no pair."""
    from slmlab.data.tasks.ar import MIN_GAP

    task = parse_task_spec("ar:cpu")
    assert (task.layout, task.T, task.K, task.num_pairs, task.gap, task.vocab_size) == ("multi", 32, 19, 6, 7, 40)
    assert MIN_GAP == 7 and task.query_start == 20 and (task.n_train, task.n_test) == (10_000, 1_000)
    assert task.no_read_accuracy(9) == 1 / 19 == task.no_read_accuracy(1)
    with pytest.raises(ValueError, match="reaches a pair"):
        task.no_read_accuracy(10)
    assert parse_task_spec("t2:cpu") == task
    gpu = parse_task_spec("ar:gpu")
    assert (gpu.T, gpu.K, gpu.num_pairs, gpu.gap, gpu.vocab_size) == (256, 64, 62, 7, 130)
    assert parse_task_spec("ar:cpu,T=64").num_pairs == 14 and parse_task_spec("ar:cpu,T=16").num_pairs == 2


@pytest.mark.parametrize("spec", ["ar:cpu", "ar:cpu,T=33,N=4", "ar:gpu,n_train=10,n_test=10"])
def test_ar_multi_queries_every_key_once_beyond_a_9_token_window(spec):
    from slmlab.data.tasks.ar import COPY, PAD

    task = parse_task_spec(spec)
    T, N, K, q0 = task.T, task.num_pairs, task.K, task.query_start
    b = task.make(200, 0, "train")
    assert (b.retrieval_positions == np.arange(q0, T, 2)).all() and q0 == T - 2 * N
    for x, y in zip(b.inputs, b.labels):
        keys, values = x[0 : 2 * N : 2], x[1 : 2 * N : 2]
        assert len(set(keys)) == N and ((keys >= 2) & (keys < 2 + K)).all()
        assert len(set(values)) == N and ((values >= 2 + K) & (values < 2 + 2 * K)).all()
        assert (x[2 * N : q0 - 1] == PAD).all() and x[q0 - 1] == COPY and (x[q0 + 1 :: 2] == PAD).all()
        pair = dict(zip(keys, values))
        queries = x[q0::2]
        assert sorted(queries) == sorted(keys)  # every key queried exactly once
        assert all(y[p] == pair[x[p]] for p in range(q0, T, 2))
        assert (np.delete(y, np.arange(q0, T, 2)) == IGNORE_INDEX).all()
        for p in range(q0, T, 2):  # a 9-token window ending at a query holds no value
            assert not (x[p - 8 : p + 1] >= 2 + K).any()
    assert len({tuple(r) for r in b.inputs[:, q0::2]}) > 150  # the query order varies


def test_ar_single_layout_keeps_the_published_rows():
    """The published layout draws the same rows as before the multi-query T2 existed (hash of seed 0's rows)."""
    import hashlib

    b = parse_task_spec("ar:cpu,layout=single,T=64").make(64, 0, "train")
    assert hashlib.sha256(b.inputs.tobytes() + b.labels.tobytes()).hexdigest()[:16] == SINGLE_AR_DIGEST


@pytest.mark.parametrize("variable", [True, False])
def test_selective_copy_marker_i_predicts_data_token_i(variable):
    task = parse_task_spec(f"t3:cpu,T=64,M=8,variable={variable}")
    A, M, slots = task.A, task.M, task.noise_slots + task.M
    b = task.make(300, 0, "train")
    for x, y, q in zip(b.inputs, b.labels, b.retrieval_positions):
        region = x[:slots]
        data_pos = np.flatnonzero(region != 0)
        assert len(data_pos) == M and ((region[data_pos] >= 1) & (region[data_pos] <= A - 2)).all()
        assert np.array_equal(q, np.arange(slots, slots + M)) and (x[q] == A - 1).all() and x[-1] == 0
        assert np.array_equal(y[q], region[data_pos])  # marker i predicts the i-th data token
        if not variable:
            assert np.array_equal(data_pos, np.arange(M))
    if variable:
        assert len({tuple(np.flatnonzero(x[:slots])) for x in b.inputs}) > 250


def test_selective_copy_hand_built_example_through_the_one_label_conversion():
    """T=6, M=2, L=1: [blank, 3, 5, marker, marker, blank]. The prediction made at the first marker
    (position 3) must be 3 and at the second (4) must be 5; after to_hf_labels the model's shifted loss
    compares logits[p] with hf[p + 1]."""
    task = parse_task_spec("t3:cpu,T=6,M=2,A=8")
    inputs = np.array([[0, 3, 5, 7, 7, 0]])
    labels = np.full((1, 6), IGNORE_INDEX)
    labels[0, [3, 4]] = [3, 5]
    batch = task.make(2000, 0, "train")
    row = np.flatnonzero((batch.inputs == inputs).all(axis=1))
    assert row.size and np.array_equal(batch.labels[row[0]], labels[0])  # the generator writes this very row
    hf = torch.from_numpy(to_hf_labels(labels))
    assert hf.tolist() == [[IGNORE_INDEX] * 4 + [3, 5]]
    right = torch.full((1, 6, 8), -20.0)
    right[0, 3, 3] = right[0, 4, 5] = 20.0
    shifted_twice = torch.full((1, 6, 8), -20.0)
    shifted_twice[0, 4, 3] = shifted_twice[0, 5, 5] = 20.0
    assert causal_lm_loss(right, hf).item() < 1e-6 and causal_lm_loss(shifted_twice, hf).item() > 10


def test_induction_trigger_appears_twice_and_the_label_follows_the_first():
    task = parse_task_spec("t4:cpu,variant=trigger,V=16,T=32")
    b = task.make(300, 0, "train")
    for x, y, (q,) in zip(b.inputs, b.labels, b.retrieval_positions):
        s = np.flatnonzero(x == 0)
        assert len(s) == 2 and s[1] == q == 30 and y[q] == x[s[0] + 1] == x[q + 1] and x[s[0] + 1] != 0
    assert len(np.unique(b.meta["offset"])) > 10


def test_induction_segment_copies_its_source_at_varying_offsets():
    task = parse_task_spec("t4:cpu,T=64")
    L = task.segment_len
    b = task.make(300, 0, "train")
    for x, y, q, off in zip(b.inputs, b.labels, b.retrieval_positions, b.meta["offset"]):
        s2 = q[0]
        s1 = s2 - off
        assert 0 <= s1 and s1 + L <= s2 and task.T // 2 <= s2 <= task.T - L
        assert np.array_equal(x[s2 : s2 + L], x[s1 : s1 + L])
        assert np.array_equal(q, np.arange(s2, s2 + L - 1)) and np.array_equal(y[q], x[q + 1])
    assert len(np.unique(b.meta["offset"])) > 20  # a fixed offset would teach a positional head
    longer = task.with_length(128).make(10, 0, "test")
    assert longer.inputs.shape == (10, 128) and (longer.meta["group"] == 128).all() and task.lengths == (64, 128, 256)


@pytest.mark.parametrize("spec", SMALL_SPECS["niah"])
def test_niah_needles_are_well_formed_and_the_answer_is_the_queried_keys_digits(spec):
    from slmlab.data.tasks.niah import DIGITS, EQ, HAYSTACK, NEEDLE, QUERY, SEP, VAR

    task = parse_task_spec(spec)
    m, H = task.m, task.haystack_len
    b = task.make(200, 0, "train")
    for x, y, q, depth in zip(b.inputs, b.labels, b.retrieval_positions, b.meta["depth"]):
        hay = x[:H]
        specials = np.isin(hay, [NEEDLE, VAR])
        plain = ~np.isin(np.arange(H), np.concatenate([np.arange(s, s + task.needle_len) for s in np.flatnonzero(specials)]))
        assert ((hay[plain] >= HAYSTACK[0]) & (hay[plain] < HAYSTACK[1])).all() or task.variant == "vartrack"
        needles = {}
        for s in np.flatnonzero(hay == NEEDLE):
            body = hay[s : s + m + 3]
            assert body[-1] == SEP and ((body[2:-1] >= DIGITS[0]) & (body[2:-1] < DIGITS[1])).all()
            needles.setdefault(int(body[1]), []).append(body[2:-1])
        queries = np.flatnonzero(x[H:] == QUERY) + H
        assert len(queries) == task.queries
        answer = []
        for qpos in queries:
            key = int(x[qpos + 1])
            digits = x[qpos + 2 : qpos + 2 + task.answer_digits]
            if task.variant == "vartrack":
                chain = {int(hay[s + 1]): hay[s + 3 : s + 3 + m] if hay[s + 3] >= DIGITS[0] and hay[s + 3] < DIGITS[1]
                         else int(hay[s + 3]) for s in np.flatnonzero(hay == VAR)}
                assert all(hay[s + 2] == EQ for s in np.flatnonzero(hay == VAR))
                value, hops = chain[key], 0
                while isinstance(value, int):
                    value, hops = chain[value], hops + 1
                assert hops == task.hops and np.array_equal(value, digits)
                first = int(np.flatnonzero(hay == VAR)[0])
                assert abs(first / (H - task.needle_len - 4 * task.hops) - depth / 10) <= 1 / H + 1e-9
            else:
                assert np.array_equal(np.concatenate(needles[key]), digits)  # all values, in order of appearance
            answer.append(digits)
            assert np.array_equal(y[qpos + 1 : qpos + 1 + task.answer_digits], digits)
        assert len(q) == sum(len(a) for a in answer) == task.queries * task.answer_digits
        if task.variant == "multikey":
            assert len(needles) == 1 + task.D
        if task.variant in ("single", "multikey", "multiquery"):
            assert all(len(v) == 1 for v in needles.values())
        if task.variant in ("single", "multikey"):  # the queried needle sits at its depth bucket
            start = int(np.flatnonzero((hay == NEEDLE) & (np.roll(hay, -1) == x[queries[0] + 1]))[0])
            assert abs(start / (H - task.needle_len) - depth / 10) <= 1 / H + 1e-9
    assert set(np.unique(b.meta["depth"])) == set(range(11))


def test_passkey_scored_bytes_are_the_passkey_digits_at_their_depth():
    from slmlab.data.tasks.passkey import INSTRUCTION, QUESTION

    task = parse_task_spec("t6:cpu")
    b = task.make(100, 0, "train")
    for x, y, q, key, depth in zip(b.inputs, b.labels, b.retrieval_positions, b.meta["passkey"], b.meta["depth"]):
        text = bytes(x.astype(np.uint8)).decode("ascii")
        digits = str(key)
        assert text.endswith(QUESTION.decode() + digits) and len(digits) == 5
        assert "".join(chr(c) for c in y[q]) == digits and np.array_equal(q, np.arange(task.T - 6, task.T - 1))
        start = text.index(f"The pass key is {key}. Remember it.")
        assert abs((start - len(INSTRUCTION)) / task.filler_len - depth / 10) <= 0.05  # at the nearest sentence boundary


@pytest.mark.parametrize("spec", ["ar:cpu,n_train=200,n_test=50", "t5:cpu,T=96,n_train=200,n_test=50"])
def test_the_leakage_check_runs_for_new_tasks(spec):
    from slmlab.data.sources import TaskSource

    source = TaskSource(spec, parse_task_spec(spec))
    next(source.eval_batches("test", 8))
    assert set(source.leakage) == {"validation", "test"} and all(0.0 <= v <= 1.0 for v in source.leakage.values())


@pytest.mark.parametrize(
    "spec, match",
    [
        ("ar:cpu,layout=single,T=5", "T must be >= 7"),
        ("ar:cpu,T=8", "cannot hold 1 pairs, COPY and their queries"),
        ("ar:cpu,N=20", "N must be in \\[1, K=19\\]"),
        ("ar:cpu,T=16,N=4", "need T >= 4N \\+ 1"),
        ("ar:cpu,layout=double", "layout must be one of"),
        ("ar:cpu,K=1", "K must be >= 2"),
        ("t3:cpu,T=16,M=8", "need T >= 2M \\+ 1"),
        ("t3:cpu,variable=maybe", "expects true or false"),
        ("t4:cpu,variant=loop", "variant must be one of"),
        ("t4:cpu,T=66", "multiple of 4"),
        ("t4:cpu,test_lengths=64/x", "test_lengths must be integers"),
        ("t5:cpu,T=18", "too short for"),
        ("t5:cpu,variant=haystack", "variant must be one of"),
        ("t5:cpu,depth=11", "depth must be a bucket"),
        ("t5:cpu,count=5", "count must be in"),
        ("t6:cpu,T=200", "T must be >= "),
        ("mqar:cpu,num_passes=8", "num_passes must be >= 1"),
    ],
)
def test_invalid_new_task_configs_name_the_field(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_task_spec(spec)
