"""llama.cpp as the benchmarks' anchor: the model exported to GGUF (``slmlab.export.gguf``) and decoded
greedily by llama.cpp, timed like the slmlab rows (prefill the prompt, then one token per step).

The loop calls llama.cpp's C API through llama-cpp-python's bindings (``llama_decode`` on a one-token
batch, ``argmax`` of the returned logits): no Python sampler, no per-token bookkeeping. llama.cpp keeps
its defaults otherwise (f16 K/V cache, its own thread pool of ``threads``). Install with
``pip install "slmlab[llamacpp]"`` (a ~20-minute source build on 2 cores); without it the benchmarks
print no llama.cpp rows (this module still imports: llama_cpp is imported only when an engine starts).

Quantized files (q8_0) load with ``use_extra_bufts=False`` in ``llama_model_params``: current llama.cpp
otherwise moves q8_0 weights into its CPU "extra" buffer types and repacks them for its interleaved
kernels (``CPU_REPACK``), and that path segfaulted on these files. Without extra buffers the weights
stay in the plain CPU buffer and the plain ``q8_0`` dot-product kernels run; each llama.cpp row names
the path that ran (:attr:`LlamaCppGreedy.kernel_path`). Bindings too old to have the field keep the
default (and say so).
"""

from __future__ import annotations

import ctypes
import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np

_SILENCE = None  # the log callback must outlive every call into llama.cpp
UNQUANTIZED = ("f32", "f16", "bf16")  # GGUF types llama.cpp never repacks: loaded with its defaults


def available() -> bool:
    """Whether llama-cpp-python is installed."""
    return importlib.util.find_spec("llama_cpp") is not None


def _library():
    global _SILENCE
    import llama_cpp

    if _SILENCE is None:
        llama_cpp.llama_backend_init()
        _SILENCE = llama_cpp.llama_log_callback(lambda level, text, user_data: None)
        llama_cpp.llama_log_set(_SILENCE, ctypes.c_void_p(0))
    return llama_cpp


class LlamaCppGreedy:
    """One GGUF file loaded in llama.cpp with a context for batch-1 greedy decoding of token ids.

    Args:
        path: the ``.gguf`` file.
        n_ctx: context positions (prompt + new tokens).
        threads: llama.cpp threads, for the prompt and for each step.
        repack: allow llama.cpp's extra CPU buffer types (weight repacking, ``CPU_REPACK``); False
            sets ``use_extra_bufts=False`` (the plain kernels of the file's type).
    Attributes:
        kernel_path: which CPU path the weights took, in words (shown in the benchmarks' rows).
    """

    def __init__(self, path: str | Path, n_ctx: int, threads: int, repack: bool = True) -> None:
        lib = self.lib = _library()
        self.ctx = self.model = None
        mparams = lib.llama_model_default_params()
        if not hasattr(mparams, "use_extra_bufts"):
            self.kernel_path = "default buffers (these bindings have no use_extra_bufts)"
        elif repack:
            self.kernel_path = "extra buffer types allowed (CPU_REPACK may repack)"
        else:
            mparams.use_extra_bufts = False
            self.kernel_path = "plain kernels, no repacking (use_extra_bufts=False)"
        self.model = lib.llama_model_load_from_file(str(path).encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        params = lib.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = n_ctx
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        self.ctx = lib.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not create a context for {path}")
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))

    def _decode(self, tokens: list[int]) -> int:
        """Feed ``tokens`` after the cached ones; the argmax of the last one's logits."""
        lib = self.lib
        arr = (lib.llama_token * len(tokens))(*tokens)
        if lib.llama_decode(self.ctx, lib.llama_batch_get_one(arr, len(tokens))) != 0:
            raise RuntimeError("llama_decode failed")
        logits = np.ctypeslib.as_array(lib.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,))
        return int(logits.argmax())

    def generate(self, prompt: list[int], new: int) -> list[int]:
        """``new`` greedy tokens after ``prompt`` (the cache is cleared first): one prefill, then
        ``new - 1`` one-token steps, as slmlab's and transformers' loops."""
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)
        out = [self._decode(list(prompt))]
        while len(out) < new:
            out.append(self._decode([out[-1]]))
        return out

    def close(self) -> None:
        if self.ctx:
            self.lib.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            self.lib.llama_model_free(self.model)
            self.model = None


def llama_cpp_variants(model, tokenizer, prompt: list[int], new: int, threads: int, folder: Path,
                       dtypes: tuple[str, ...] = ("f32", "q8_0")) -> dict[str, tuple[Callable[[], list[int]], LlamaCppGreedy]]:
    """``{row name: (generate(), engine)}``: ``model`` exported to ``folder/model-<dtype>.gguf`` for each
    dtype and loaded in llama.cpp (quantized types without weight repacking, see the module's
    docstring); ``generate()`` returns the ``new`` greedy token ids after ``prompt``. Each row name ends
    with the kernel path that ran."""
    from slmlab.export.gguf import write_gguf

    out = {}
    for dtype in dtypes:
        path = write_gguf(model, tokenizer, Path(folder) / f"model-{dtype}.gguf", dtype=dtype)
        engine = LlamaCppGreedy(path, len(prompt) + new, threads, repack=dtype in UNQUANTIZED)
        name = f"llama.cpp {dtype} (GGUF, {threads} threads; {engine.kernel_path})"
        out[name] = ((lambda e=engine: e.generate(prompt, new)), engine)
    return out


def agreement(reference: list[int], tokens: list[int]) -> str:
    """``"k/n"``: how many of the first greedy tokens equal the reference before the first difference."""
    same = next((i for i, (a, b) in enumerate(zip(reference, tokens)) if a != b), min(len(reference), len(tokens)))
    return f"{same}/{len(reference)}"


def name_agreement(rows: list[dict], variants: dict, reference: list[int]) -> None:
    """Append to each llama.cpp row's name how many of its greedy tokens equal ``reference``, then
    free the engines."""
    for row in rows:
        if row["side"] in variants:
            run, _ = variants[row["side"]]
            row["side"] += f" (greedy = ours: {agreement(reference, run())})"
    for _, engine in variants.values():
        engine.close()
