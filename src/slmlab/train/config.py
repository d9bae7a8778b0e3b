"""A training run as one typed config: YAML file + ``key=value`` overrides -> :class:`RunConfig`.

Sections are small dataclasses (optimiser, schedule, checkpointing, logging), torchtitan style; every
field is validated here, once, with a ``ValueError`` that names the field and the value. The resolved
config is saved beside every checkpoint (``run.yaml``) so a run can be resumed or audited later.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# How a run spreads over processes (slmlab.train.parallel.PARALLEL holds the strategy of each).
PARALLEL_CHOICES = ("ddp", "fsdp2")


def _betas(value) -> tuple[float, ...]:
    """``optim.betas`` as a tuple of floats: a list or tuple of numbers; anything else is refused, named."""
    if isinstance(value, (list, tuple)) and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in value):
        return tuple(float(b) for b in value)
    raise ValueError(f"optim.betas must be two numbers in [0, 1) (AdamW's beta1, beta2), got {value!r}; write e.g."
                     " optim.betas=[0.9,0.95]")


def check_seed(seed, what: str = "seed") -> int:
    """``seed`` when it is a whole number in ``[0, 2**32)`` (what torch, numpy and the samplers all take).

    Raises:
        ValueError: naming ``what`` and the value.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        example = f"{what} 0" if what.startswith("--") else f"{what}=0"
        raise ValueError(f"{what} must be a whole number in [0, 2**32), got {seed!r}; pass e.g. {example}")
    return seed


@dataclass
class OptimConfig:
    """Optimiser settings.

    Args:
        name: ``adamw`` (fused kernel) or ``muon`` (``torch.optim.Muon`` on the 2-D hidden
            weight matrices, AdamW on embeddings, norms, biases and the output head).
        lr: peak learning rate of AdamW.
        muon_lr: peak learning rate of Muon (``muon`` only).
        betas, eps: AdamW moments.
        weight_decay: decoupled decay; never applied to norms, biases or embeddings.
        grad_clip: max global gradient norm (0 = off).
        lr_scales: learning-rate multipliers by parameter-name prefix, e.g. ``{"encoder.": 0.1}``
            for fine-tuning a pretrained body slower than a new head; the longest matching prefix wins.
    """

    name: str = "adamw"
    lr: float = 1e-3
    muon_lr: float = 0.02
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    lr_scales: dict = field(default_factory=dict)

    def validate(self) -> None:
        if self.name not in ("adamw", "muon"):
            raise ValueError(f"optim.name must be 'adamw' or 'muon', got {self.name!r}")
        for key in ("lr", "muon_lr", "eps"):
            if not float(getattr(self, key)) > 0:
                raise ValueError(f"optim.{key} must be > 0, got {getattr(self, key)!r}")
        self.betas = _betas(self.betas)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"optim.betas must be two numbers in [0, 1), got {self.betas!r}")
        self.betas = (float(self.betas[0]), float(self.betas[1]))
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError(f"optim.weight_decay and optim.grad_clip must be >= 0, got {self.weight_decay}, {self.grad_clip}")
        if not isinstance(self.lr_scales, dict):
            raise ValueError(f"optim.lr_scales must map parameter-name prefixes to multipliers, got {self.lr_scales!r}")
        for prefix, scale in self.lr_scales.items():
            if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
                raise ValueError(f"optim.lr_scales[{prefix!r}] must be a number > 0, got {scale!r}")
        self.lr_scales = {str(k): float(v) for k, v in self.lr_scales.items()}


@dataclass
class ScheduleConfig:
    """Learning-rate schedule, a pure function of the optimiser step.

    Args:
        name: ``cosine`` (linear warm-up, cosine to ``min_lr_ratio``), ``wsd`` (warm-up, stable,
            linear decay over the last ``decay_frac`` of the steps; Hu et al., MiniCPM, arXiv:2404.06395)
            or ``constant`` (warm-up then flat).
        warmup: warm-up steps; a value < 1 is a fraction of ``max_steps``.
        min_lr_ratio: final lr / peak lr.
        decay_frac: fraction of steps spent decaying (``wsd`` only).
    """

    name: str = "cosine"
    warmup: float = 0.05
    min_lr_ratio: float = 0.1
    decay_frac: float = 0.2

    def validate(self) -> None:
        if self.name not in ("cosine", "wsd", "constant"):
            raise ValueError(f"schedule.name must be 'cosine', 'wsd' or 'constant', got {self.name!r}")
        if self.warmup < 0:
            raise ValueError(f"schedule.warmup must be >= 0, got {self.warmup!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"schedule.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        if not 0.0 < self.decay_frac <= 1.0:
            raise ValueError(f"schedule.decay_frac must be in (0, 1], got {self.decay_frac!r}")


@dataclass
class RunConfig:
    """Everything a ``slmlab train`` run needs.

    Args:
        model: family (``lumen``), ``family:preset``, a preset name, or a saved model folder.
        model_config: config overrides for the model (``vocab_size`` defaults to the tokenizer's).
        data: a ``slmlab.data.get_source`` spec (``shakespeare``, ``mqar:cpu``, a file, ...).
        tokenizer: ``bpe``, ``byte`` or a tokenizer path (``slmlab.data.get_tokenizer``).
        vocab_size: BPE vocabulary size (incl. specials).
        block_size: tokens per training sequence (text corpora; synthetic tasks fix their own).
        batch_size: sequences per micro-batch per rank; the global batch is
            ``batch_size * grad_accum * world_size``.
        grad_accum: micro-batches per optimiser step.
        max_steps: optimiser steps: the run's budget (the schedule, the ETA and the report are for it).
        max_time: a safety cap only (0 = none): stop (with a checkpoint) once the run has trained
            this many seconds, summed over its sessions; a run it stops before ``max_steps`` says
            "stopped by the max_time safety cap at step N of M; the result is not the configured
            run" and its report is marked incomplete.
        seed: model init, data order and sampling.
        precision: ``auto`` (bf16 autocast on CUDA, fp32 on CPU), ``fp32`` or ``bf16``.
        compile: wrap the model in ``torch.compile``.
        gradient_checkpointing: recompute each decoder layer in backward instead of keeping its
            activations (transformers' ``activation_checkpointing_enable()``, ``use_reentrant=False``):
            less activation memory for more compute; the same gradients.
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:1`` ...
        eval_every / eval_batches / eval_batch_size: periodic validation (0 = only at the end).
        final_eval_tokens: the final validation of a text corpus reads the whole split up to this
            many tokens; a larger split is measured on a seeded, fixed sample of its sequences holding
            about this many tokens (the report says which). 0 = always the whole split.
        early_stop_acc: stop once validation accuracy exceeds this (synthetic tasks; 0 = off).
        keep_best: also save the weights with the best validation accuracy so far as
            ``checkpoints/best`` (evaluated at every ``eval_every`` and at the end).
        train_on: synthetic tasks: ``scored`` (loss only at the scored positions, the LM head run
            only there) or ``all`` (full next-token loss on every position, the safari style).
        checkpoint_every / keep_checkpoints: periodic checkpoints (0 = only at the end).
        log_every: metrics cadence in steps; ``progress``: show a progress bar.
        tensorboard: also write TensorBoard events (``out_dir/tb``).
        out_dir: the run folder (config, checkpoints, metrics.jsonl, report).
        sample_prompt / sample_tokens / sample_temperature / sample_top_k: the report's sample.
        data_cache: cache folder for the data layer (None = its default).
        data_errors: ``strict`` (non-UTF-8 input is an error) or ``replace`` (U+FFFD).
        ddp_find_unused: DDP ``find_unused_parameters``.
        parallel: ``ddp`` (DDP under torchrun, the plain model in one process) or ``fsdp2`` (FSDP2:
            each decoder layer, then the root, sharded over the ranks, bf16 compute with fp32
            reductions when ``precision`` is bf16, sharded DCP checkpoints that resume at any world
            size; a process group of one in a plain ``python`` run).
        fsdp_cpu_offload: ``parallel=fsdp2`` keeps the sharded parameters, gradients and optimiser
            state in CPU memory (less GPU memory, slower steps).
    """

    model: str = "lumen"
    model_config: dict = field(default_factory=dict)
    data: str = "shakespeare"
    tokenizer: str = "bpe"
    vocab_size: int = 2048
    block_size: int = 256
    batch_size: int = 16
    grad_accum: int = 1
    max_steps: int = 1000
    max_time: float = 0.0
    seed: int = 0
    precision: str = "auto"
    compile: bool = False
    gradient_checkpointing: bool = False
    device: str = "auto"
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    eval_every: int = 200
    eval_batches: int = 20
    eval_batch_size: int = 0
    final_eval_tokens: int = 5_000_000
    early_stop_acc: float = 0.0
    keep_best: bool = False
    train_on: str = "scored"
    checkpoint_every: int = 500
    keep_checkpoints: int = 2
    log_every: int = 10
    progress: bool = True
    tensorboard: bool = True
    out_dir: str = "runs/default"
    sample_prompt: str = "\n"
    sample_tokens: int = 200
    sample_temperature: float = 0.8
    sample_top_k: int = 50
    data_cache: str | None = None
    data_errors: str = "strict"
    ddp_find_unused: bool = False
    parallel: str = "ddp"
    fsdp_cpu_offload: bool = False

    def validate(self) -> RunConfig:
        check_seed(self.seed, "seed")
        for key in ("vocab_size", "block_size", "batch_size", "grad_accum", "max_steps", "log_every"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        for key in ("eval_every", "eval_batches", "eval_batch_size", "final_eval_tokens", "checkpoint_every",
                    "keep_checkpoints", "sample_tokens"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{key} must be an integer >= 0, got {value!r}")
        if self.max_time < 0:
            raise ValueError(f"max_time must be >= 0 seconds, got {self.max_time!r}")
        if not isinstance(self.gradient_checkpointing, bool):
            raise ValueError(f"gradient_checkpointing must be true or false, got {self.gradient_checkpointing!r}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"precision must be 'auto', 'fp32' or 'bf16', got {self.precision!r}")
        if self.data_errors not in ("strict", "replace"):
            raise ValueError(f"data_errors must be 'strict' or 'replace', got {self.data_errors!r}")
        if self.train_on not in ("scored", "all"):
            raise ValueError(f"train_on must be 'scored' or 'all', got {self.train_on!r}")
        if not 0.0 <= self.early_stop_acc <= 1.0:
            raise ValueError(f"early_stop_acc must be in [0, 1], got {self.early_stop_acc!r}")
        if not isinstance(self.model_config, dict):
            raise ValueError(f"model_config must be a mapping of config overrides, got {self.model_config!r}")
        if self.parallel not in PARALLEL_CHOICES:
            raise ValueError(f"parallel must be one of {', '.join(PARALLEL_CHOICES)}, got {self.parallel!r}")
        if self.parallel == "fsdp2" and self.optim.name == "muon":
            raise ValueError("optim.name=muon with parallel=fsdp2: Muon orthogonalises whole matrices and FSDP2 gives"
                             " each rank a shard of their rows; use optim.name=adamw, or parallel=ddp for Muon")
        if self.fsdp_cpu_offload and self.parallel != "fsdp2":
            raise ValueError("fsdp_cpu_offload=true needs parallel=fsdp2 (DDP keeps the whole model on each device)")
        self.optim.validate()
        self.schedule.validate()
        return self

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["optim"]["betas"] = list(self.optim.betas)
        return out

    def save(self, path: Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


_SECTIONS = {"optim": OptimConfig, "schedule": ScheduleConfig}


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"cannot set {key!r}: {part!r} is not a section")
    node[parts[-1]] = value


def parse_overrides(items: list[str]) -> dict:
    """``["optim.lr=3e-4", "model_config.num_layers=2"]`` -> nested dict; values are parsed as YAML."""
    tree: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(
                f"expected key=value, got {item!r}; write each override as key=value"
                " (e.g. lr=3e-4 or model_config.hidden_size=64)"
            )
        _set_dotted(tree, key.strip(), yaml.safe_load(raw) if raw.strip() else "")
    return tree


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _coerce(cls, values: dict, where: str) -> dict:
    """Cast each value to the type of the field's default (YAML reads ``3e-4`` as a string)."""
    out = {}
    defaults = {f.name: (f.default if f.default is not dataclasses.MISSING else None) for f in dataclasses.fields(cls)}
    for key, value in values.items():
        default = defaults.get(key)
        try:
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise ValueError
            elif isinstance(default, float) and not isinstance(value, bool):
                value = float(value)
            elif isinstance(default, int) and isinstance(value, str):
                value = int(value)
        except ValueError:
            raise ValueError(f"{where}{key} must be a {type(default).__name__}, got {value!r}") from None
        out[key] = value
    return out


def config_from_dict(tree: dict) -> RunConfig:
    """Build and validate a :class:`RunConfig`; unknown keys are errors naming the key."""
    known = {f.name for f in dataclasses.fields(RunConfig)}
    unknown = sorted(set(tree) - known)
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown}; known: {sorted(known)}")
    kwargs = {}
    for key, value in tree.items():
        if key in _SECTIONS:
            if not isinstance(value, dict):
                raise ValueError(f"{key} must be a mapping, got {value!r}")
            section = _SECTIONS[key]
            fields = {f.name for f in dataclasses.fields(section)}
            bad = sorted(set(value) - fields)
            if bad:
                raise ValueError(f"unknown {key} key(s) {bad}; known: {sorted(fields)}")
            value = _coerce(section, value, f"{key}.")
            if "betas" in value:
                value["betas"] = _betas(value["betas"])
            kwargs[key] = section(**value)
        else:
            kwargs.update(_coerce(RunConfig, {key: value}, ""))
    return RunConfig(**kwargs).validate()


def load_config(files: list[str | Path] = (), overrides: list[str] = (), base: dict | None = None) -> RunConfig:
    """Merge ``base`` <- each YAML file <- ``key=value`` overrides, then validate."""
    tree: dict = dict(base or {})
    for path in files:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        with path.open(encoding="utf-8") as stream:  # a YAML error then names the file
            loaded = yaml.safe_load(stream) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"config file {path} must hold a mapping, got {type(loaded).__name__}")
        tree = _merge(tree, loaded)
    tree = _merge(tree, parse_overrides(list(overrides)))
    return config_from_dict(tree)
