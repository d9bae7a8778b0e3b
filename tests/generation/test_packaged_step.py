"""The AOTInductor-packaged decode step (``slmlab.generation.packaged``): what its cache key depends
on, the buffer sizes a compiled plan gets, one compile per layout into the cache folder, a second
process loading the file instead of compiling, and its logits against the eager plan."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from family_tester import check_plan_steps
from slmlab.generation import COMPILED_PLAN, build_plan, compiled_step, generate
from slmlab.generation.loop import compiled_capacity
from slmlab.generation.packaged import FOLDER, layout, package_key, packaged_step, tensor_leaves, with_leaves
from slmlab.models.lumen import LumenConfig, LumenForCausalLM


def lumen(**kw) -> LumenForCausalLM:
    torch.manual_seed(0)
    base = dict(vocab_size=97, hidden_dim=32, num_layers=2, num_heads=4, num_kv_heads=1, intermediate_dim=48, max_seq_len=64)
    return LumenForCausalLM(LumenConfig(**{**base, **kw})).eval()


def started_plan(model, capacity: int = 16, batch: int = 1):
    with torch.inference_mode():
        plan = build_plan(model, capacity)
        plan.start(model(input_ids=torch.randint(0, 97, (batch, 4)), use_cache=True).cache)
    return plan


def test_leaves_round_trip_and_the_key_follows_the_layout_not_the_values():
    model = lumen()
    plan = started_plan(model)
    leaves = tensor_leaves(plan.weights)
    assert leaves and all(isinstance(t, torch.Tensor) for t in leaves)
    doubled = with_leaves(plan.weights, iter([t * 2 for t in leaves]))
    assert type(doubled) is type(plan.weights) and doubled.eps == plan.weights.eps
    assert all(torch.equal(a, 2 * b) for a, b in zip(tensor_leaves(doubled), leaves))
    key = package_key(plan.step_fn, plan.weights, plan.states, 1)
    assert layout(doubled) == layout(plan.weights)  # new weights of the same shapes: the same package
    assert package_key(plan.step_fn, doubled, plan.states, 1) == key
    assert package_key(plan.step_fn, plan.weights, plan.states, 2) != key  # batch
    assert package_key(plan.step_fn, dataclasses.replace(plan.weights, eps=1e-5), plan.states, 1) != key  # a constant
    assert package_key(plan.step_fn, plan.weights, started_plan(model, 32).states, 1) != key  # buffer size
    assert package_key(plan.step_fn, started_plan(lumen(hidden_dim=48)).weights, plan.states, 1) != key


@pytest.mark.parametrize("needed, limit, size", [(5, None, 256), (256, None, 256), (257, None, 512),
                                                 (300, 1024, 512), (600, 1000, 1000), (20, 64, 64), (64, 64, 64)])
def test_a_compiled_plan_gets_few_buffer_sizes(needed, limit, size):
    assert compiled_capacity(needed, limit) == size


@pytest.mark.slow  # one AOTInductor compile (~15-40 s on 2 CPUs) and a second process
def test_the_step_compiles_once_per_layout_then_loads_and_equals_the_eager_step(tmp_path, monkeypatch):
    monkeypatch.setenv("SLMLAB_CACHE", str(tmp_path))
    model = lumen()
    ids = torch.randint(0, 97, (1, 18), generator=torch.Generator().manual_seed(2))
    check_plan_steps(model, ids, prefill=6, step_fn=compiled_step(build_plan(model, 18)))  # 1e-5, compiled here
    files = list((tmp_path / FOLDER).glob("*.pt2"))
    assert len(files) == 1 and files[0].name.startswith("lumen_step-")
    plan = started_plan(model, 18)
    again = packaged_step(plan.step_fn, plan.weights, plan.states, 1)
    assert again.path == files[0] and again.compiled_s == 0.0
    out = generate(model, ids[:, :6], 12, compile=True)  # 64 positions (the model's): a second layout
    assert out.decode_path == COMPILED_PLAN and torch.equal(out, generate(model, ids[:, :6], 12, use_plan=False))
    assert len(list((tmp_path / FOLDER).glob("*.pt2"))) == 2 and not list((tmp_path / FOLDER).glob(".partial-*"))
    script = """
import json, torch
from slmlab.generation import build_plan
from slmlab.generation.packaged import packaged_step
from slmlab.models.lumen import LumenConfig, LumenForCausalLM
torch.manual_seed(0)
model = LumenForCausalLM(LumenConfig(vocab_size=97, hidden_dim=32, num_layers=2, num_heads=4, num_kv_heads=1,
                                     intermediate_dim=48, max_seq_len=64)).eval()
with torch.inference_mode():
    plan = build_plan(model, 18)
    plan.start(model(input_ids=torch.randint(0, 97, (1, 4)), use_cache=True).cache)
    step = packaged_step(plan.step_fn, plan.weights, plan.states, 1)
print(json.dumps({"path": str(step.path), "compiled_s": step.compiled_s}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"path": str(files[0]), "compiled_s": 0.0}  # a fresh process loads the file


def test_a_frozen_weights_block_held_across_calls_arranges_the_plan_once(monkeypatch):
    """generate() inside a caller's frozen_weights() block reuses the plan's arranged weights; each
    call gets buffers of its own; without such a block every call arranges them again and nothing
    stays cached."""
    from slmlab.generation import loop
    from slmlab.layers import frozen_weights

    model = lumen()
    ids = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(3))
    built = []
    real = loop.build_plan
    monkeypatch.setattr(loop, "build_plan", lambda m, capacity: built.append(capacity) or real(m, capacity))
    reference = generate(model, ids, 8, use_plan=False)
    assert torch.equal(generate(model, ids, 8), reference) and torch.equal(generate(model, ids, 8), reference)
    assert built == [13, 13] and not loop._PLANS.get(model)  # no block held: built per call, then forgotten
    with frozen_weights():
        outs = [generate(model, ids, 8) for _ in range(3)] + [generate(model, ids, 9)]
        assert len(loop._PLANS[model]) == 2
    assert built == [13, 13, 13, 14] and all(torch.equal(o[:, :13], reference) for o in outs)
    with frozen_weights():  # a new block: the promise of the last one has ended
        generate(model, ids, 8)
    assert built[-1] == 13 and len(built) == 5 and len(loop._PLANS[model]) == 1
