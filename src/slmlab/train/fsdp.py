"""FSDP2 (``torch.distributed.fsdp.fully_shard``): ``parallel=fsdp2``.

Each decoder layer is one FSDP unit, then the root (embeddings, final norm, LM head): a layer's
parameters are all-gathered just before its forward (and again in backward), its gradients
reduce-scattered just after, and between uses every rank keeps only its shard of parameters,
gradients and optimiser state. The decoder layers are the modules whose class the model lists in
``_no_split_modules`` (transformers' own "never split this block" list), so no family is named here.

With bf16 precision the :class:`~torch.distributed.fsdp.MixedPrecisionPolicy` gathers and computes
with bf16 parameters and reduces gradients in fp32; the sharded parameters, their gradients and the
optimiser state stay fp32. ``fsdp_cpu_offload`` keeps the shards in CPU memory
(:class:`~torch.distributed.fsdp.CPUOffloadPolicy`; pinned memory on CUDA). Checkpoints are sharded too
(:mod:`slmlab.train.dcp`): every rank writes its shard, and any world size reads them back.

Gradient checkpointing (the model's own, enabled before sharding) and ``torch.compile`` (of the
sharded model) compose with it. Muon is refused: it orthogonalises whole matrices, and FSDP2 hands
each rank a shard of rows.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager

import torch
import torch.distributed as dist

from .dcp import model_class, reshard, save_dcp_checkpoint
from .distributed import DistInfo


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP2 wraps one by one: those whose class the model lists in ``_no_split_modules``,
    outermost first (a listed module inside another listed one is left to its parent)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    found: list[torch.nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside or type(module).__name__ not in names:
            continue
        found.append(module)
        inside |= {id(m) for m in module.modules()}
    if not found:
        raise ValueError(
            f"{type(model).__name__} lists no decoder layer class in _no_split_modules ({sorted(names)}); FSDP2 wraps"
            " each such layer: name the block class there, or train with parallel=ddp"
        )
    return found


def shard_model(model: torch.nn.Module, bf16: bool = False, cpu_offload: bool = False, pin_memory: bool = False) -> None:
    """``fully_shard`` every decoder layer, then the root, in place (a process group must exist).

    Args:
        model: the whole model, on its device.
        bf16: gather and compute with bf16 parameters, reduce gradients in fp32.
        cpu_offload: keep the sharded parameters, gradients and optimiser state in CPU memory.
        pin_memory: pin that CPU memory (CUDA only).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if not dist.is_initialized():
        raise ValueError(
            "parallel=fsdp2 shards over a process group and none exists; run under torchrun, or call"
            " slmlab.train.distributed.init_distributed(device, group=True) first"
        )
    policy = dict(
        mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
        else MixedPrecisionPolicy(),
        offload_policy=CPUOffloadPolicy(pin_memory=pin_memory) if cpu_offload else OffloadPolicy(),
    )
    for layer in decoder_layers(model):
        fully_shard(layer, **policy)
    fully_shard(model, **policy)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's value as a plain tensor (a replicated norm), else ``t``."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


@contextmanager
def _gradient_sync(model: torch.nn.Module, sync: bool):
    model.set_requires_gradient_sync(sync)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


class FSDP2:
    """``parallel=fsdp2``: the strategy the trainer holds (see :mod:`slmlab.train.parallel`).

    Args:
        dist_info: this process's place in the group (a group of one included).
        device: where it computes.
        bf16: the bf16 mixed-precision policy (fp32 reductions).
        cpu_offload: shards in CPU memory.
    """

    name = "FSDP2"

    def __init__(self, dist_info: DistInfo, device: torch.device, bf16: bool = False, cpu_offload: bool = False) -> None:
        self.dist, self.device = dist_info, device
        self.bf16, self.cpu_offload = bf16, cpu_offload

    def shard(self, model: torch.nn.Module) -> None:
        shard_model(model, self.bf16, self.cpu_offload, pin_memory=self.device.type == "cuda")

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model  # the sharded model is its own wrapper

    def accumulating(self, wrapped: torch.nn.Module, sync: bool) -> AbstractContextManager:
        """Micro-batches before the last keep their gradients unreduced (as DDP's ``no_sync``)."""
        return _gradient_sync(wrapped, sync)

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> float:
        return float(_local(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))

    def grad_norm(self, model: torch.nn.Module) -> float:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        return float(_local(torch.nn.utils.get_total_norm(grads))) if grads else 0.0

    save_checkpoint = staticmethod(save_dcp_checkpoint)

    def full_model(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """An unsharded fp32 copy of ``model`` on the main rank, None on the others (a collective: every
        rank calls it). Building the copy leaves the random number generators as they were."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(reshard(model), options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.dist.is_main:
            return None
        with torch.random.fork_rng(devices=[]):
            twin = model_class(model)(model.config)
        twin.load_state_dict(state)
        twin.generation_config = model.generation_config
        return twin.to(self.device).train(model.training)
