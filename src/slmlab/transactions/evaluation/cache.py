"""The score cache of ``slmlab transactions evaluate --cache DIR``: scores that cost CPU-minutes to
hours on a large bank and depend only on the bank and a model, kept between reports.

Each entry is one ``.npz`` file named ``<name>-<data key>-<spec digest>.npz`` holding the scores of every
bank row and the computation's info. The data key hashes what the scores read of the bank
(:func:`.baseline.data_key`); the spec lists everything else that decides them (a booster's options and
hyper-parameters; a network's :func:`weights_key`). A file is written to a temporary name and renamed,
so a run killed mid-write leaves no half entry; a file whose row count differs from the bank's is
recomputed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

# config fields that say where a network was saved or loaded, not what it computes: ``save_pretrained``
# sets ``architectures`` and ``dtype`` on the config it writes, ``from_pretrained`` sets ``_name_or_path``
UNSAVED_FIELDS = ("_name_or_path", "architectures", "dtype", "torch_dtype", "transformers_version")


def weights_key(model: torch.nn.Module) -> str:
    """A network's identity, hashed: its config (architecture, fitted schema, head options; not
    :data:`UNSAVED_FIELDS`) and every tensor of its state dict, so the same weights share a key whether
    just trained, saved, or loaded from any folder, and a retrained model never reads another's scores."""
    config = {k: v for k, v in model.config.to_dict().items() if k not in UNSAVED_FIELDS}
    h = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def cached_scores(cache_dir: str | Path | None, name: str, key: str, spec: list, n_rows: int,
                  compute: Callable[[], tuple[np.ndarray, dict]]) -> tuple[np.ndarray, dict]:
    """``compute()``'s ``(scores [n_rows], info)``, read from ``cache_dir`` when an earlier run stored them
    under the same ``name``, data ``key`` and ``spec`` (a list JSON can write), else computed and stored
    there; ``None``: no cache. ``info["cache"]`` says which file was read or written."""
    if cache_dir is None:
        return compute()
    digest = hashlib.sha256(json.dumps([name, *spec], sort_keys=True, default=str).encode()).hexdigest()[:8]
    path = Path(cache_dir, f"{name}-{key}-{digest}.npz")
    if path.is_file():
        with np.load(path, allow_pickle=False) as z:
            scores, info = z["scores"], json.loads(str(z["info"]))
        if len(scores) == n_rows:
            return scores, {**info, "cache": f"read {path}"}
    scores, info = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, scores=scores, info=np.array(json.dumps(info, default=str)))
    os.replace(tmp, path)
    return scores, {**info, "cache": f"wrote {path}"}
