"""Atomic, pickle-free training checkpoints.

Layout of one checkpoint folder ``<run>/checkpoints/step_000100/``::

    config.json, model.safetensors, generation_config.json   (``save_pretrained``: loadable by
    tokenizer.json, tokenizer_config.json, ...                 ``AutoModelForCausalLM.from_pretrained``)
    run.yaml                                                  (the resolved run config)
    trainer/optimizer.safetensors + trainer/optimizer.json    (tensors / structure of the optimiser state)
    trainer/rng.safetensors                                   (torch CPU and CUDA generator states)
    trainer/state.json                                        (step, data position, tokens, best metrics,
                                                               the trained context)

Everything is written into a hidden temporary folder that is renamed to its final name only when
complete, so a crash mid-write leaves the previous checkpoint intact; tensors go through safetensors
and the rest through JSON, so loading a checkpoint never unpickles anything.

A run with ``parallel=fsdp2`` writes the same folder with sharded tensors instead of
``model.safetensors`` and ``trainer/optimizer.safetensors``: ``dcp/model/`` and ``dcp/optimizer/``
hold one safetensors file per rank (:mod:`slmlab.train.dcp`), readable at any world size.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ..outputs import dumps_finite, publish_modes

STEP_DIR = re.compile(r"^step_(\d+)$")
REQUIRED_FILES = (
    "config.json",
    "trainer/state.json",
    "trainer/optimizer.json",
    "trainer/optimizer.safetensors",
    "trainer/rng.safetensors",
)
# A sharded (DCP) checkpoint: these folders of per-rank safetensors files instead of model.safetensors
# and trainer/optimizer.safetensors (slmlab.train.dcp writes and reads them).
DCP_MODEL = "dcp/model"
DCP_OPTIMIZER = "dcp/optimizer"
DCP_REQUIRED_FILES = ("config.json", "trainer/state.json", "trainer/optimizer.json", "trainer/rng.safetensors")


def is_dcp_checkpoint(ckpt: Path) -> bool:
    """Whether ``ckpt`` holds sharded (DCP) tensors rather than ``model.safetensors``."""
    return (Path(ckpt) / DCP_MODEL).is_dir()


# The key of ``trainer/state.json`` recording the sequence length the model was trained on (read by
# :func:`slmlab.train.saved.trained_context`).
TRAINED_CONTEXT = "trained_context"
# transformers' "no limit" ``model_max_length`` is int(1e30); anything this large was never a trained length
_NO_LENGTH = 10**9


def real_length(value) -> int | None:
    """``value`` when it is a real sequence length (a positive int below transformers' "no limit"
    placeholder), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < _NO_LENGTH else None


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or corrupt (the message names the file)."""


# -- pickle-free (de)serialisation of nested state -----------------------------------------------
def flatten_state(obj: Any, tensors: dict[str, torch.Tensor], prefix: str = "t") -> Any:
    """Replace every tensor in a nested dict/list/tuple by ``{"__tensor__": key}`` and collect it in
    ``tensors``; dicts keep their key types (``{"__dict__": [[k, v], ...]}``). The result is JSON."""
    if isinstance(obj, torch.Tensor):
        key = f"{prefix}.{len(tensors)}"
        tensors[key] = obj.detach().cpu().contiguous().clone()
        return {"__tensor__": key}
    if isinstance(obj, dict):
        return {"__dict__": [[k, flatten_state(v, tensors, prefix)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [flatten_state(v, tensors, prefix) for v in obj]}
    if isinstance(obj, list):
        return [flatten_state(v, tensors, prefix) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot checkpoint a value of type {type(obj).__name__}")


def unflatten_state(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`flatten_state`."""
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            key = obj["__tensor__"]
            if key not in tensors:
                raise CheckpointError(f"tensor {key!r} referenced by the optimiser state is missing")
            return tensors[key]
        if "__dict__" in obj:
            return {k: unflatten_state(v, tensors) for k, v in obj["__dict__"]}
        if "__tuple__" in obj:
            return tuple(unflatten_state(v, tensors) for v in obj["__tuple__"])
        raise CheckpointError(f"unexpected mapping in checkpoint state: {sorted(obj)}")
    if isinstance(obj, list):
        return [unflatten_state(v, tensors) for v in obj]
    return obj


def rng_state() -> dict[str, torch.Tensor]:
    out = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            out[f"cuda.{i}"] = state
    return out


def set_rng_state(states: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(states["cpu"])
    cuda = [states[k] for k in sorted((k for k in states if k.startswith("cuda.")), key=lambda k: int(k[5:]))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


@contextlib.contextmanager
def quiet_hf_progress():
    """Silence transformers' per-file progress bars ("Writing model shards", "Loading weights")."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


# -- writing -------------------------------------------------------------------------------------
def write_trainer_files(folder: Path, optimizer, trainer_state: dict) -> None:
    """The non-model part of a checkpoint: optimiser, RNG, trainer state (state.json last)."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    structure = flatten_state(optimizer.state_dict(), tensors)
    save_file(tensors, str(folder / "optimizer.safetensors"))
    (folder / "optimizer.json").write_text(json.dumps(structure))
    write_rng_and_state(folder, trainer_state)


def write_rng_and_state(folder: Path, trainer_state: dict) -> None:
    """``rng.safetensors`` (this process's generators) and ``state.json`` (step, data position, ...)."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file(rng_state(), str(folder / "rng.safetensors"))
    (folder / "state.json").write_text(dumps_finite(trainer_state, indent=2))


def write_run_files(folder: Path, tokenizer, run_config: dict, extra_json: dict[str, dict] | None = None) -> None:
    """What every checkpoint carries beside its tensors: the tokenizer, ``run.yaml`` and ``extra_json``
    (name -> JSON object, e.g. ``data_identity.json``)."""
    import yaml

    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
    (folder / "run.yaml").write_text(yaml.safe_dump(run_config, sort_keys=False))
    for name, payload in (extra_json or {}).items():
        (folder / name).write_text(dumps_finite(payload, indent=1) + "\n")


class NonFiniteWeights(CheckpointError):
    """A model holds NaN/inf parameters: it is never saved as a checkpoint, nor evaluated."""


def non_finite_parameters(model: torch.nn.Module) -> list[str]:
    """Names of the parameters and buffers of ``model`` holding NaN or inf (floating point only); of a
    sharded (FSDP2) model, those whose shard on this rank does."""
    tensors = [(n, t.to_local() if hasattr(t, "to_local") else t)
               for n, t in list(model.named_parameters()) + list(model.named_buffers())]
    return [n for n, t in tensors if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def _fsync_tree(folder: Path) -> None:
    """Flush every file under ``folder``, then the folders themselves, to stable storage."""
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True) + [folder]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    system has no such call (the caller then falls back to two renames)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def remove_stale_temporaries(root: Path) -> list[Path]:
    """Delete the ``.tmp-step_*`` / ``.old-step_*`` folders a killed writer left in ``root``
    (call it while holding the run lock: no live writer can own them); returns what was removed."""
    root = Path(root)
    stale = [p for p in root.iterdir() if p.name.startswith((".tmp-step_", ".old-step_"))] if root.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def save_checkpoint(
    root: Path, step: int, model, tokenizer, optimizer, trainer_state: dict, run_config: dict, keep: int = 0,
    trained_context: int | None = None, extra_json: dict[str, dict] | None = None,
) -> Path:
    """Write ``root/step_{step:06d}`` atomically and prune to the newest ``keep`` (0 = keep all).

    Every file and the folder are fsync'd before the rename that publishes it; re-saving an
    existing step swaps the two folders atomically, so some ``step_N`` is on disk at every moment.

    Args:
        root: the run's ``checkpoints`` folder.
        model: the unwrapped ``PreTrainedModel`` (``save_pretrained``).
        tokenizer: saved beside the model (may be None).
        optimizer: anything with ``state_dict()``.
        trainer_state: JSON-able step / data position / metrics.
        run_config: the resolved run config (saved as ``run.yaml``).
        keep: how many checkpoints to keep (0 = all).
        trained_context: the sequence length the model is trained on (the trainer passes its
            source's ``seq_len``), recorded in ``trainer/state.json`` as ``trained_context`` and read
            back by :func:`slmlab.train.saved.trained_context`; None when unknown.
        extra_json: more JSON files of the checkpoint, name -> object (e.g. ``data_identity.json``),
            written inside the temporary folder so they appear with the checkpoint or not at all.
    Raises:
        NonFiniteWeights: the model holds NaN/inf parameters (nothing is written).
    """
    bad = non_finite_parameters(model)
    if bad:
        raise NonFiniteWeights(f"refusing to save step {step}: parameters {bad[:3]} hold NaN/inf")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = temporary_folder(root, step)
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        with quiet_hf_progress():
            model.save_pretrained(str(tmp))
        write_run_files(tmp, tokenizer, run_config, extra_json)
        write_trainer_files(tmp / "trainer", optimizer, {**trainer_state, TRAINED_CONTEXT: trained_context})
        final = publish_checkpoint(tmp, root, step)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune_checkpoints(root, keep)
    return final


def temporary_folder(root: Path, step: int, pid: int | None = None) -> Path:
    """Where step ``step`` is written before it is published (``pid``: the writer's, this process's by default)."""
    return Path(root) / f".tmp-step_{step:06d}-{os.getpid() if pid is None else pid}"


def publish_checkpoint(tmp: Path, root: Path, step: int) -> Path:
    """Make the complete folder ``tmp`` the checkpoint ``root/step_{step:06d}``: every file and folder is
    fsync'd before the rename that publishes it; re-saving an existing step swaps the two folders
    atomically, so some ``step_N`` is on disk at every moment. Returns the checkpoint folder."""
    final = Path(root) / f"step_{step:06d}"
    publish_modes(tmp)  # 0644 / 0755 (the umask's), not the private modes of temporaries
    _fsync_tree(tmp)
    if final.exists():  # re-saving the same step (e.g. Ctrl-C right after a periodic save)
        if _exchange(tmp, final):  # tmp now holds the old folder
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            old = Path(root) / f".old-step_{step:06d}-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(Path(root))
    return final


def prune_checkpoints(root: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints of ``root`` (0 = all)."""
    if keep > 0:
        for old in list_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


# -- finding and reading -------------------------------------------------------------------------
def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first (temporary folders are ignored)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder from a run folder (its newest checkpoint), a ``checkpoints`` folder, or a
    checkpoint / saved-model folder itself."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no run or checkpoint at {path}")
    if (path / "config.json").is_file():
        return path
    for root in (path / "checkpoints", path):
        found = list_checkpoints(root)
        if found:
            return found[-1]
    raise CheckpointError(f"{path} holds no checkpoint (expected config.json or checkpoints/step_*/)")


def check_checkpoint(ckpt: Path, need_trainer: bool = True) -> None:
    """Raise :class:`CheckpointError` naming the first missing or damaged file: the required files
    exist, every JSON file parses, and every safetensors file has a valid header whose tensors lie
    inside the file (a truncated copy is caught here, before ``from_pretrained`` reads it)."""
    sharded = is_dcp_checkpoint(ckpt)
    needed = DCP_REQUIRED_FILES if sharded else REQUIRED_FILES
    for name in needed if need_trainer else needed[:1]:
        if not (ckpt / name).is_file():
            raise CheckpointError(f"checkpoint {ckpt} is incomplete: {name} is missing")
    shards = (DCP_MODEL, DCP_OPTIMIZER) if need_trainer else (DCP_MODEL,)
    for name in shards if sharded else ():
        if not any((ckpt / name).glob("*.safetensors")):
            raise CheckpointError(f"checkpoint {ckpt} is incomplete: {name}/ holds no shard")
    weights = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors")  # or a LoRA adapter
    if not sharded and not any((ckpt / n).is_file() for n in weights):
        raise CheckpointError(f"checkpoint {ckpt} is incomplete: model.safetensors is missing")
    folders = (ckpt, ckpt / "trainer") if need_trainer else (ckpt,)
    folders += tuple(ckpt / name for name in shards) if sharded else ()
    for folder in folders:
        for path in sorted(folder.glob("*.json")):
            _read_json(path)
        for path in sorted(folder.glob("*.safetensors")):
            check_safetensors_header(path)


def check_safetensors_header(path: Path) -> None:
    """Check a safetensors file's framing without reading its tensors: an 8-byte header length, a
    JSON header, and data offsets that end inside the file."""
    size = path.stat().st_size
    damaged = f"{path} is corrupt or truncated (not a complete safetensors file)"
    fix = "; resume from an earlier checkpoint or save the model again"
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(damaged + fix)
        n = int.from_bytes(head, "little")
        if n <= 0 or 8 + n > size:
            raise CheckpointError(damaged + fix)
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CheckpointError(damaged + fix) from None
    if not isinstance(header, dict):
        raise CheckpointError(damaged + fix)
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
               and "data_offsets" in v), default=0)
    if 8 + n + end > size:
        raise CheckpointError(f"{path} is truncated: its header describes {8 + n + end} bytes, the file has {size}" + fix)


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors raises its own error types for truncated/garbled files
        raise CheckpointError(f"{path} is corrupt or not a safetensors file: {err}") from err


def _read_json(path: Path) -> dict:
    """The JSON object in a checkpoint's ``path``: every JSON file a checkpoint holds is an object."""
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(
            f"{path} is corrupt (invalid JSON: {err}); the file was damaged or half-written: resume from an earlier"
            " checkpoint or save it again"
        ) from err
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} is damaged: it holds a JSON {type(data).__name__}, not an object; resume from an"
                              " earlier checkpoint or save it again")
    return data


def model_state_from_checkpoint(ckpt: Path) -> dict[str, torch.Tensor]:
    index = ckpt / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(_read_json(index)["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for name in files:
            state.update(_read_safetensors(ckpt / name))
        return state
    return _read_safetensors(ckpt / "model.safetensors")


def load_model_weights(model: torch.nn.Module, ckpt: Path) -> None:
    """Load a checkpoint's weights into ``model``; keys absent from the file must be tied to a loaded
    tensor (``save_pretrained`` drops the tied LM head)."""
    state = model_state_from_checkpoint(ckpt)
    own = model.state_dict()
    unexpected = sorted(set(state) - set(own))
    if unexpected:
        raise CheckpointError(f"{ckpt}: weights {unexpected[:5]} do not belong to {type(model).__name__}")
    for name, tensor in state.items():
        if tensor.shape != own[name].shape:
            raise CheckpointError(f"{ckpt}: weight {name} has shape {tuple(tensor.shape)}, model expects {tuple(own[name].shape)}")
    model.load_state_dict(state, strict=False)
    loaded = {own[n].data_ptr() for n in state}
    missing = [n for n in own if n not in state and own[n].data_ptr() not in loaded]
    if missing:
        raise CheckpointError(f"{ckpt}: model.safetensors lacks weights {missing[:5]}")


def load_training_state(ckpt: Path, model: torch.nn.Module, optimizer) -> dict:
    """Restore model weights, optimiser state and RNG from ``ckpt``; returns the trainer state."""
    ckpt = Path(ckpt)
    check_checkpoint(ckpt)
    load_model_weights(model, ckpt)
    return load_trainer_files(ckpt, optimizer)


def load_trainer_files(ckpt: Path, optimizer) -> dict:
    """Restore the optimiser state and RNG of a checked checkpoint; returns the trainer state (the model's
    weights are the caller's: :func:`load_training_state`, or a LoRA adapter's own loader)."""
    ckpt = Path(ckpt)
    state = _read_json(ckpt / "trainer" / "state.json")
    try:
        optimizer.load_state_dict(read_optimizer_state(ckpt))
    except (KeyError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{ckpt}/trainer/optimizer.*: does not match this model/optimiser: {err}") from err
    set_rng_state(_read_safetensors(ckpt / "trainer" / "rng.safetensors"))
    return state


def read_optimizer_state(ckpt: Path) -> dict:
    """The optimiser ``state_dict()`` a whole checkpoint saved (parameters by position)."""
    tensors = _read_safetensors(Path(ckpt) / "trainer" / "optimizer.safetensors")
    return unflatten_state(_read_json(Path(ckpt) / "trainer" / "optimizer.json"), tensors)


def read_trainer_state(ckpt: Path) -> dict:
    """``trainer/state.json`` of a checkpoint (step, data position, tokens, best metrics)."""
    return _read_json(Path(ckpt) / "trainer" / "state.json")


def restore_rng(ckpt: Path) -> None:
    """Set this process's generators to those a checkpoint saved."""
    set_rng_state(_read_safetensors(Path(ckpt) / "trainer" / "rng.safetensors"))
