"""How a run spreads over processes, chosen once by ``parallel``: one process, DDP or FSDP2.

Every strategy answers the same few questions for the :class:`~slmlab.train.trainer.Trainer`, which
never asks which one it holds:

- ``shard(model)``: before the optimiser is built (FSDP2 turns the parameters into shards in place);
- ``wrap(model)``: the module the loop calls (DDP's wrapper, or the model itself);
- ``accumulating(wrapped, sync)``: the context of a micro-batch (gradients are reduced on the last one);
- ``clip_grad_norm`` / ``grad_norm``: the global gradient norm as a float;
- ``save_checkpoint``: who writes a checkpoint (the main rank alone, or every rank its shard);
- ``full_model(model)``: the whole unsharded model on the main rank (a report's sample, ``best``).

``parallel=ddp`` (the default) is DDP under ``torchrun`` and a plain model in one process;
``parallel=fsdp2`` is :class:`slmlab.train.fsdp.FSDP2` at any world size (one process included).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from torch.nn.parallel import DistributedDataParallel

from .checkpoint import save_checkpoint
from .distributed import DistInfo
from .fsdp import FSDP2
from .precision import uses_bf16


def save_on_main(root, step: int, model, tokenizer, optimizer, trainer_state: dict, run_config: dict, keep: int,
                 trained_context: int | None, extra_json: dict, dist_info: DistInfo):
    """:func:`slmlab.train.checkpoint.save_checkpoint` on the main rank (the whole model is on every
    rank); returns the folder there, None elsewhere."""
    if not dist_info.is_main:
        return None
    return save_checkpoint(root, step, model, tokenizer, optimizer, trainer_state, run_config, keep,
                           trained_context=trained_context, extra_json=extra_json)


class SingleProcess:
    """One process, the whole model: nothing to shard, wrap or reduce."""

    name = "single process"

    def __init__(self, dist_info: DistInfo, device: torch.device, find_unused: bool = False) -> None:
        self.dist, self.device = dist_info, device

    def shard(self, model: torch.nn.Module) -> None:
        """Nothing to shard."""

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def accumulating(self, wrapped: torch.nn.Module, sync: bool) -> AbstractContextManager:
        return nullcontext()

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> float:
        """Clip the global gradient norm to ``max_norm``; returns it before clipping."""
        return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))

    def grad_norm(self, model: torch.nn.Module) -> float:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0

    save_checkpoint = staticmethod(save_on_main)

    def full_model(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """The whole model on the main rank (None on the others)."""
        return model if self.dist.is_main else None


class DDP(SingleProcess):
    """``DistributedDataParallel``: every rank holds the whole model; gradients are all-reduced on the
    last micro-batch of a step (``no_sync`` before it)."""

    name = "DDP"

    def __init__(self, dist_info: DistInfo, device: torch.device, find_unused: bool = False) -> None:
        super().__init__(dist_info, device)
        self.find_unused = find_unused

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=self.find_unused)

    def accumulating(self, wrapped: torch.nn.Module, sync: bool) -> AbstractContextManager:
        return nullcontext() if sync else wrapped.no_sync()


def replicated(cfg, dist_info: DistInfo, device: torch.device):
    """``parallel=ddp``: DDP under torchrun, the plain model in one process."""
    return (DDP if dist_info.enabled else SingleProcess)(dist_info, device, cfg.ddp_find_unused)


def sharded(cfg, dist_info: DistInfo, device: torch.device):
    """``parallel=fsdp2``: FSDP2 over the process group (of any size), bf16 parameters for compute when
    the run's precision is bf16 (reductions in fp32), CPU offload when ``fsdp_cpu_offload``."""
    return FSDP2(dist_info, device, bf16=uses_bf16(device, cfg.precision), cpu_offload=cfg.fsdp_cpu_offload)


# parallel -> the strategy of a run (RunConfig, DistInfo, device); the config's choices are these keys
PARALLEL = {"ddp": replicated, "fsdp2": sharded}
# which strategies need a process group even in one process (open_devices forms a group of one)
NEEDS_GROUP = {"ddp": False, "fsdp2": True}


def build_parallel(cfg, dist_info: DistInfo, device: torch.device):
    """The strategy ``cfg.parallel`` names for this process (:data:`PARALLEL`)."""
    return PARALLEL[cfg.parallel](cfg, dist_info, device)
