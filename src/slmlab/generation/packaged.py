"""A decode plan's step compiled ahead of time with AOTInductor and kept on disk.

``torch.compile`` of a step costs, on every call, a Python frame evaluation, guards over each of the
~30-200 tensors the step reads (the weights are inputs, not module attributes, so one compiled step
serves every model of the same shapes) and an AOTAutograd wrapper: about 0.1 ms per token on a
CPU, which at the quickstart size (2.75M parameters, ~0.3 ms of kernels per token) is a quarter of
the token. And each new process traces and compiles again.

A *packaged step* is the same function exported (``torch.export``) with every weight and state as
a flat input, compiled by AOTInductor into a shared library with a C++ wrapper
(``torch._inductor.aoti_compile_and_package``), and run through its loader's ``run(list)``: no
frame evaluation, no guards, no Python between the kernels. The state buffers are written in place
as in eager mode (the K/V write is fused into the generated kernels).

The package is a file under ``$SLMLAB_CACHE/decode-steps`` (default ``~/.cache/slmlab``), named by a
hash of everything the compiled code depends on: the step function and the source of the modules
that define the plan's maths, the layout of its inputs (shape, stride and dtype of every tensor,
every non-tensor field such as ``eps``), the batch, torch's version and the CPU's vector ISA. The
first process that needs a layout compiles it (tens of CPU-seconds; written to a temporary file,
then renamed, so concurrent processes never read half a file); every later start loads it in
milliseconds. Weights are never part of the file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import logging
import os
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..data.paths import resolve_cache_dir
from ..layers import quantized
from ..outputs import publish_file_mode
from .plan import DecodePlan, StepFn

logger = logging.getLogger("slmlab.generation")

FOLDER = "decode-steps"
_LOADED: dict[Path, Any] = {}  # package file -> its loaded runner, once per process


def tensor_leaves(tree: Any) -> list[torch.Tensor]:
    """The tensors of a plan's weights or states (nested dataclasses, tuples and lists), in order."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if dataclasses.is_dataclass(tree):
        return [t for f in dataclasses.fields(tree) for t in tensor_leaves(getattr(tree, f.name))]
    if isinstance(tree, (list, tuple)):
        return [t for item in tree for t in tensor_leaves(item)]
    return []


def with_leaves(tree: Any, leaves: Iterator[torch.Tensor]) -> Any:
    """``tree`` with its tensors replaced, in :func:`tensor_leaves` order, by the next of ``leaves``."""
    if isinstance(tree, torch.Tensor):
        return next(leaves)
    if dataclasses.is_dataclass(tree):
        return dataclasses.replace(tree, **{f.name: with_leaves(getattr(tree, f.name), leaves) for f in dataclasses.fields(tree)})
    if isinstance(tree, (list, tuple)):
        return type(tree)(with_leaves(item, leaves) for item in tree)
    return tree


def layout(tree: Any) -> str:
    """What compiled code depends on in ``tree``: its structure, every non-tensor value, and each
    tensor's shape, stride and dtype (not its values)."""
    if isinstance(tree, torch.Tensor):
        return f"T{tuple(tree.shape)}{tuple(tree.stride())}{tree.dtype}"
    if dataclasses.is_dataclass(tree):
        return f"{type(tree).__qualname__}(" + ",".join(f"{f.name}={layout(getattr(tree, f.name))}" for f in dataclasses.fields(tree)) + ")"
    if isinstance(tree, (list, tuple)):
        return f"{type(tree).__name__}[" + ",".join(layout(item) for item in tree) + "]"
    return repr(tree)


def _vector_isa() -> str:
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return str(pick_vec_isa())


_SOURCES: dict[Any, bytes] = {}  # step function -> a digest of the sources its compiled code comes from


def _source_digest(step_fn: StepFn) -> bytes:
    if step_fn not in _SOURCES:
        modules = {sys.modules[step_fn.__module__], sys.modules[__name__], sys.modules[DecodePlan.__module__], quantized}
        h = hashlib.sha256()
        for path in sorted(inspect.getsourcefile(m) for m in modules):
            h.update(Path(path).read_bytes())
        _SOURCES[step_fn] = h.digest()
    return _SOURCES[step_fn]


def package_key(step_fn: StepFn, weights: Any, states: list, batch: int) -> str:
    """A hash of what the compiled step depends on (see the module's docstring)."""
    h = hashlib.sha256(_source_digest(step_fn))
    for part in (torch.__version__, platform.machine(), _vector_isa(), f"{step_fn.__module__}.{step_fn.__qualname__}",
                 layout(weights), layout(states), str(batch)):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:24]


class _Step(torch.nn.Module):
    """A step function as a module of flat inputs ``(tokens, position, *weights, *states)`` (export's input form)."""

    def __init__(self, step_fn: StepFn, weights: Any, states: list) -> None:
        super().__init__()
        self.step_fn, self.weights, self.states = step_fn, weights, states
        self.n_weights = len(tensor_leaves(weights))

    def forward(self, tokens: torch.Tensor, position: torch.Tensor, *flat: torch.Tensor) -> torch.Tensor:
        weights = with_leaves(self.weights, iter(flat[: self.n_weights]))
        states = with_leaves(self.states, iter(flat[self.n_weights :]))
        return self.step_fn(weights, states, tokens, position)


def _compile(step_fn: StepFn, weights: Any, states: list, batch: int, path: Path) -> None:
    """Export ``step_fn`` and compile it into the package file ``path``, on example inputs of the
    layout of ``weights`` and ``states`` (zeros: the caller's tensors are not touched)."""
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)  # torch's own deprecations inside export
        examples = [torch.zeros_like(t, memory_format=torch.preserve_format) for t in tensor_leaves(weights) + tensor_leaves(states)]
        device = examples[0].device
        tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)
        position = torch.zeros(1, dtype=torch.long, device=device)
        program = torch.export.export(_Step(step_fn, weights, states), (tokens, position, *examples), strict=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".partial-", suffix=".pt2", dir=path.parent)  # renamed when complete
        os.close(fd)
        try:
            torch._inductor.aoti_compile_and_package(program, package_path=tmp)
            publish_file_mode(tmp)  # a shared cache: 0644 under the usual umask, not mkstemp's 0600
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)


@dataclasses.dataclass
class PackagedStep:
    """A step function loaded from its AOTInductor package.

    Args:
        runner: the package's loader (``run(list of tensors) -> [logits]``).
        path: the package file.
        compiled_s: seconds this call spent compiling it (0.0: loaded from the cache folder or
            already loaded in this process).
    """

    runner: Any
    path: Path
    compiled_s: float = 0.0

    def __call__(self, weights: Any, states: list, tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """``step_fn(weights, states, tokens, position)``: flattens the inputs on each call."""
        return self.runner.run([tokens, position, *tensor_leaves(weights), *tensor_leaves(states)])[0]

    def bind(self, weights: Any, states: list) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """``step(tokens [B, 1], position [1]) -> logits [B, V]`` over these weights and state buffers
        (updated in place), with the flat input list built once."""
        flat = [None, None, *tensor_leaves(weights), *tensor_leaves(states)]
        run = self.runner.run

        def step(tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
            flat[0], flat[1] = tokens, position
            return run(flat)[0]

        return step


def packaged_step(step_fn: StepFn, weights: Any, states: list, batch: int,
                  cache_dir: str | os.PathLike | None = None) -> PackagedStep:
    """The AOTInductor package of ``step_fn`` for inputs laid out as ``weights``, ``states`` (the
    buffers of a started plan) and ``batch`` rows: loaded from the cache folder
    (``$SLMLAB_CACHE/decode-steps``) when it holds this layout, otherwise compiled there first."""
    path = resolve_cache_dir(cache_dir) / FOLDER / f"{step_fn.__name__}-{package_key(step_fn, weights, states, batch)}.pt2"
    compiled_s = 0.0
    if path not in _LOADED:
        if not path.is_file():
            logger.info("compiling the decode step ahead of time into %s (once per layout; later starts load it)", path)
            t0 = time.perf_counter()
            _compile(step_fn, weights, states, batch, path)
            compiled_s = time.perf_counter() - t0
        _LOADED[path] = torch._inductor.aoti_load_package(str(path)).loader
    return PackagedStep(_LOADED[path], path, compiled_s)
