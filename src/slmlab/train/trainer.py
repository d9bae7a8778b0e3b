"""The training loop with explicit, checkpointable state (torchtitan's Trainer pattern).

One optimiser step = ``grad_accum`` micro-batches per rank; the data position is the micro-batch
index, so the stream restarts exactly where it stopped (``DataSource.batches(step=...)``), and the
learning rate is a pure function of the step: resuming reproduces the uninterrupted loss curve.
Under ``torchrun`` each rank reads its own rows of the global batch; ``parallel`` chooses how the model
spreads over the ranks (DDP or FSDP2: :mod:`slmlab.train.parallel`), once, at construction.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..evaluate.lm import evaluate_source, family_forward_inputs, model_inputs
from .checkpoint import NonFiniteWeights, list_checkpoints
from .config import RunConfig
from .dcp import load_any_training_state
from .distributed import DistInfo, all_reduce_mean, barrier, broadcast_flag
from .environment import resolve_device
from .metrics import MetricsLogger
from .optim import build_optimizer, lr_factor, set_lr
from .parallel import build_parallel
from .precision import autocast_factory
from .progress import Progress


class TrainingDiverged(RuntimeError):
    """The loss became NaN/inf; the message names the step and the last good checkpoint."""


# ``max_steps`` is a run's budget; ``max_time`` only a safety cap. A run the cap stops before its last
# step says so in these words (progress output, stop_reason, report), and its report is incomplete.
TIME_CAP = "stopped by the max_time safety cap"
TIME_CAP_ADVICE = "raise max_time (0 = no cap) and rerun with --resume to finish"


def time_cap_reason(step: int, max_steps: int) -> str:
    """The ``stop_reason`` of a run the ``max_time`` safety cap stopped at ``step`` of ``max_steps``."""
    return f"{TIME_CAP} at step {step} of {max_steps}; the result is not the configured run"


def stopped_by_time_cap(stop_reason: str) -> bool:
    return stop_reason.startswith(TIME_CAP)


@dataclass(frozen=True)
class StepResult:
    """The numbers of one optimiser step (what :meth:`Trainer.train_step` returns)."""

    loss: float  # mean loss over the step's micro-batches and ranks
    lr: float
    grad_norm: float | None  # before clipping; None without clipping
    tokens: int  # over all ranks
    seconds: float
    aux_loss: float | None = None  # the auxiliary part of ``loss`` (e.g. JTok-M's balance loss); None without one


@dataclass
class TrainState:
    """Everything besides weights and optimiser needed to continue a run exactly."""

    step: int = 0
    tokens_seen: int = 0
    train_time_s: float = 0.0
    best_val_loss: float = math.inf
    best_acc: float = -1.0  # best validation accuracy (keep_best), -1 before the first evaluation
    best_step: int = -1
    last_eval: dict = field(default_factory=dict)
    last_eval_step: int = -1  # the step ``last_eval`` was measured at (-1: none, or a checkpoint older than this field)
    stop_reason: str = ""

    def to_json(self, cfg: RunConfig, world_size: int) -> dict:
        return {
            "step": self.step,
            "data_step": self.step * cfg.grad_accum,
            "tokens_seen": self.tokens_seen,
            "train_time_s": self.train_time_s,
            "best_val_loss": self.best_val_loss if math.isfinite(self.best_val_loss) else None,
            "best_acc": self.best_acc,
            "best_step": self.best_step,
            "last_eval": self.last_eval,
            "last_eval_step": self.last_eval_step,
            "world_size": world_size,
            "global_batch_rows": cfg.batch_size * world_size,
            "seed": cfg.seed,
        }


class Trainer:
    """Train ``model`` on ``source`` as ``cfg`` says; write everything under ``run_dir``.

    Args:
        cfg: the validated run config.
        model: an unwrapped ``PreTrainedModel`` (moved to the run's device here).
        source: a ``slmlab.data`` DataSource (``batches``/``eval_batches``/``bytes_per_token``).
        tokenizer: saved beside every checkpoint (may be None).
        run_dir: the run folder.
        dist_info: the torchrun position (single process by default).
        device: where to train (default: ``cfg.device`` resolved).
        evaluator: ``evaluator(model, split) -> dict`` with at least ``loss`` (``acc`` optional), for
            models whose outputs are not ``[B, T, V]`` text logits; default: the LM evaluation
            (``slmlab.evaluate.lm.evaluate_source``).
        parallel: a strategy of :mod:`slmlab.train.parallel` instead of the one ``cfg.parallel`` names
            (a benchmark's DDP in a group of one, say).
        on_evaluation: callbacks ``hook(step, result) -> str`` given each periodic validation result; a
            non-empty string stops the run with that ``stop_reason`` (e.g. a plateau rule). They run in
            order after the ``early_stop_acc`` check, until one stops the run; more may be appended to
            :attr:`on_evaluation` before :meth:`train`.
    """

    def __init__(self, cfg: RunConfig, model, source, tokenizer=None, run_dir: str | Path | None = None,
                 dist_info: DistInfo | None = None, device: torch.device | None = None, evaluator=None,
                 parallel=None, on_evaluation: tuple[Callable[[int, dict], str], ...] = ()) -> None:
        self.evaluator = evaluator
        self.on_evaluation: list[Callable[[int, dict], str]] = list(on_evaluation)
        self.cfg = cfg
        self.dist = dist_info or DistInfo()
        self.device = device or resolve_device(cfg.device, self.dist)
        self.run_dir = Path(run_dir or cfg.out_dir)
        self.ckpt_root = self.run_dir / "checkpoints"
        self.model = model.to(self.device)
        self.source = source
        self.checkpoint_json: dict[str, dict] = {}  # extra JSON files every checkpoint carries (name -> object)
        self.tokenizer = tokenizer
        self.forward_inputs = family_forward_inputs(model)
        # train_on=scored: the LM head runs only at scored positions (same loss; SLMForCausalLM.forward)
        self.scored_only = (
            cfg.train_on == "scored" and bool(getattr(source, "is_synthetic", False))
            and "scored_only" in inspect.signature(model.forward).parameters
        )
        if cfg.gradient_checkpointing:  # every decoder layer recomputed in backward (use_reentrant=False)
            self.model.activation_checkpointing_enable()
        self.parallel = parallel or build_parallel(cfg, self.dist, self.device)  # one process, DDP or FSDP2
        self.parallel.shard(self.model)  # FSDP2: parameters become shards here, before the optimiser sees them
        self.optimizer = build_optimizer(self.model, cfg.optim)
        self.state = TrainState()
        self.losses: list[float] = []
        self.wrapped = self.parallel.wrap(self.model)  # DDP's wrapper, or the model
        self.train_model = torch.compile(self.wrapped) if cfg.compile else self.wrapped
        self.autocast = autocast_factory(self.device, cfg.precision)
        self.n_params = sum(p.numel() for p in {id(p): p for p in self.model.parameters()}.values())
        self._window_tokens, self._window_time = 0, 0.0  # since the last metrics record
        self._resumed_at = -1  # the step of the checkpoint this run resumed from

    # -- state ---------------------------------------------------------------------------------
    def resume(self, ckpt: str | Path) -> None:
        """Continue from a checkpoint written by :meth:`save` (weights, optimiser, RNG, position)."""
        data = self.load_checkpoint(Path(ckpt))
        if data.get("global_batch_rows") not in (None, self.cfg.batch_size * self.dist.world_size):
            raise ValueError(
                f"checkpoint was written with a global batch of {data['global_batch_rows']} rows per micro-step;"
                f" this run has batch_size*world_size = {self.cfg.batch_size * self.dist.world_size}: exact resume needs the same"
            )
        best = data.get("best_val_loss")
        self.state = TrainState(
            step=int(data["step"]),
            tokens_seen=int(data.get("tokens_seen", 0)),
            train_time_s=float(data.get("train_time_s", 0.0)),
            best_val_loss=math.inf if best is None else float(best),
            best_acc=float(data.get("best_acc", -1.0)),
            best_step=int(data.get("best_step", -1)),
            last_eval=data.get("last_eval") or {},
            last_eval_step=int(data.get("last_eval_step", -1)),
        )
        self._resumed_at = self.state.step

    def load_checkpoint(self, ckpt: Path) -> dict:
        """Load the weights, optimiser and RNG of ``ckpt``, written at any world size, whole or sharded;
        returns its trainer state (a subclass that saves something else than the whole model, e.g. a
        LoRA adapter, loads it here)."""
        return load_any_training_state(ckpt, self.model, self.optimizer)

    def checkpoint_model(self):
        """What a checkpoint saves as the model (``save_pretrained``, ``named_parameters``): the model."""
        return self.model

    def save(self) -> Path | None:
        """Write a checkpoint of the current step: the main rank the whole model, or (FSDP2) every rank
        its shards; returns the folder on the main rank."""
        try:
            return self.parallel.save_checkpoint(
                self.ckpt_root, self.state.step, self.checkpoint_model(), self.tokenizer, self.optimizer,
                self.state.to_json(self.cfg, self.dist.world_size), self.cfg.to_dict(), self.cfg.keep_checkpoints,
                self.source.seq_len, self.checkpoint_json, self.dist,
            )
        except NonFiniteWeights as err:
            last = self.last_checkpoint()
            raise TrainingDiverged(
                f"the weights became non-finite by step {self.state.step} ({err}); no checkpoint was written."
                f" Last good checkpoint: {last if last else 'none written yet'}. Lower optim.lr or check the data."
            ) from None

    def last_checkpoint(self) -> Path | None:
        found = list_checkpoints(self.ckpt_root)
        return found[-1] if found else None

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate(self, split: str = "validation") -> dict:
        """Validation metrics of the current model (every rank computes the same numbers)."""
        if self.evaluator is not None:
            return self.evaluator(self.model, split)
        bs = self.cfg.eval_batch_size or self.cfg.batch_size
        return evaluate_source(
            self.model, self.source, split, bs, self.cfg.eval_batches or None,
            self.forward_inputs, self.device, self.autocast,
        )

    # -- one step ------------------------------------------------------------------------------
    def _micro_step(self, batch: dict, sync: bool) -> tuple[torch.Tensor, int, torch.Tensor | None]:
        kwargs = model_inputs(batch, self.forward_inputs, self.device)
        kwargs["labels"] = batch["labels"].to(self.device)
        if self.scored_only:
            kwargs["scored_only"] = True
        with self.parallel.accumulating(self.wrapped, sync):
            with self.autocast() if self.autocast else nullcontext():
                out = self.train_model(**kwargs, use_cache=False)
            loss = out.loss / self.cfg.grad_accum
            loss.backward()
        mask = batch.get("attention_mask")
        tokens = int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        aux = getattr(out, "aux_loss", None)  # already inside out.loss; logged on its own
        return loss.detach(), tokens, None if aux is None else aux.detach() / self.cfg.grad_accum

    def train_step(self, stream: Iterator[dict]) -> StepResult:
        """One optimiser step: ``grad_accum`` micro-batches from ``stream``, the divergence check,
        clipping, the update; advances :attr:`state` and returns the step's numbers.

        Raises:
            TrainingDiverged: the mean loss is NaN/inf (the update is not applied).
        """
        cfg, st = self.cfg, self.state
        t0 = time.perf_counter()
        lr = set_lr(self.optimizer, lr_factor(st.step, cfg.max_steps, cfg.schedule))
        loss_sum, tokens, aux_sum = torch.zeros((), device=self.device), 0, None
        for micro in range(cfg.grad_accum):
            loss, n, aux = self._micro_step(next(stream), sync=micro == cfg.grad_accum - 1)
            loss_sum += loss
            tokens += n
            aux_sum = aux if aux_sum is None else aux_sum + aux  # the model's structure: all or none
        loss_value = float(all_reduce_mean(loss_sum, self.dist))
        aux_value = None if aux_sum is None else float(all_reduce_mean(aux_sum, self.dist))
        self._check_finite(loss_value)
        grad_norm = None
        if cfg.optim.grad_clip > 0:
            grad_norm = self.parallel.clip_grad_norm(self.model, cfg.optim.grad_clip)
            self._check_finite(grad_norm, "gradient norm")
        else:  # no clipping: still never apply a non-finite update
            self._check_finite(self.parallel.grad_norm(self.model), "gradient norm")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        result = StepResult(loss_value, lr, grad_norm, tokens * self.dist.world_size, time.perf_counter() - t0, aux_value)
        st.step += 1
        st.tokens_seen += result.tokens
        st.train_time_s += result.seconds
        self.losses.append(loss_value)
        return result

    def _check_finite(self, value: float, what: str = "loss") -> None:
        if math.isfinite(value):
            return
        self.optimizer.zero_grad(set_to_none=True)
        last = self.last_checkpoint()
        raise TrainingDiverged(
            f"{what} became {value} at step {self.state.step + 1}; training stopped before applying that update."
            f" Last good checkpoint: {last if last else 'none written yet'}. Lower optim.lr or check the data."
        )

    # -- cadences: each decides whether the step just finished is its own ---------------------
    def _every(self, n: int) -> bool:
        return bool(n) and self.state.step % n == 0

    @property
    def _done(self) -> bool:
        return self.state.step >= self.cfg.max_steps

    def log_due(self) -> bool:
        return self._every(self.cfg.log_every) or self._done

    def eval_due(self) -> bool:
        return self._every(self.cfg.eval_every) and not self._done

    def checkpoint_due(self) -> bool:
        return self._every(self.cfg.checkpoint_every) and not self._done

    def _over_time_budget(self) -> bool:
        """Whether any rank's training time (over every session of the run) reached the ``max_time``
        safety cap (a collective: every rank, every step)."""
        over = bool(self.cfg.max_time) and self.state.train_time_s >= self.cfg.max_time
        return broadcast_flag(over, self.dist)

    # -- what the cadences run ------------------------------------------------------------------
    def _log_train(self, metrics: MetricsLogger, step: StepResult) -> None:
        self._window_tokens += step.tokens
        self._window_time += step.seconds
        if not self.log_due():
            return
        metrics.log("train", self.state.step, {
            "loss": step.loss, "lr": step.lr, "grad_norm": step.grad_norm, "tokens": self.state.tokens_seen,
            "tokens_per_s": self._window_tokens / max(self._window_time, 1e-9), "train_time_s": self.state.train_time_s,
            **({} if step.aux_loss is None else {"aux_loss": step.aux_loss}),
        })
        self._window_tokens, self._window_time = 0, 0.0

    def _log_eval(self, metrics: MetricsLogger) -> dict:
        result = self.evaluate()
        self.state.last_eval = {k: v for k, v in result.items() if k != "acc_by_group"}
        self.state.last_eval_step = self.state.step
        if "acc_by_group" in result:
            self.state.last_eval["acc_by_group"] = {str(k): v for k, v in result["acc_by_group"].items()}
        self.state.best_val_loss = min(self.state.best_val_loss, result["loss"])
        if self.cfg.keep_best and "acc" in result and result["acc"] > self.state.best_acc:
            self.state.best_acc, self.state.best_step = float(result["acc"]), self.state.step
            whole = self.parallel.full_model(self.model)  # FSDP2: gathered (every rank takes part)
            if whole is not None:
                whole.save_pretrained(str(self.ckpt_root / "best"))
        metrics.log("eval", self.state.step, self.state.last_eval)
        return result

    def _evaluation_stop(self, result: dict) -> str:
        """The ``stop_reason`` a periodic validation ``result`` gives (``""``: go on): validation accuracy
        above ``early_stop_acc``, else the first :attr:`on_evaluation` hook that says stop."""
        reason = ""
        if self.cfg.early_stop_acc and "acc" in result and result["acc"] > self.cfg.early_stop_acc:
            reason = f"validation accuracy {result['acc']:.4f} > {self.cfg.early_stop_acc}"
        for hook in self.on_evaluation:
            reason = reason or hook(self.state.step, result)
        return reason

    def _save_and_wait(self) -> Path | None:
        path = self.save()
        barrier(self.dist)
        return path

    # -- the loop ------------------------------------------------------------------------------
    def train(self) -> TrainState:
        """Run until ``max_steps`` (the budget), early stop, Ctrl-C, divergence or the ``max_time``
        safety cap (which says so: :func:`time_cap_reason`).

        Raises:
            TrainingDiverged: loss NaN/inf (no checkpoint is written for the bad step).
        """
        cfg, st = self.cfg, self.state
        metrics = MetricsLogger(self.run_dir, cfg.tensorboard, self.dist.is_main)
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            cfg.save(self.run_dir / "run.yaml")
        stream = self.source.batches(
            "train", cfg.batch_size, seed=cfg.seed, step=st.step * cfg.grad_accum,
            rank=self.dist.rank, world_size=self.dist.world_size,
        )
        progress = Progress(cfg.max_steps, st.step, cfg.progress and self.dist.is_main, cfg.log_every)
        self.train_model.train()
        self._window_tokens, self._window_time = 0, 0.0  # since the last metrics record
        evaluated_at = st.last_eval_step  # a finished run resumed: its final evaluation is on record already
        try:
            while st.step < cfg.max_steps:
                out = self.train_step(stream)
                progress.update(st.step, out.loss, out.lr, out.tokens, out.seconds)
                self._log_train(metrics, out)
                if self.eval_due():
                    result, evaluated_at = self._log_eval(metrics), st.step
                    progress.write(f"step {st.step}: " + _format_eval(result))
                    st.stop_reason = self._evaluation_stop(result)
                if self._over_time_budget() and not st.stop_reason and st.step < cfg.max_steps:
                    st.stop_reason = time_cap_reason(st.step, cfg.max_steps)
                    progress.write(f"{st.stop_reason}: its {cfg.max_time:g} s of training time ran out;"
                                   f" {TIME_CAP_ADVICE}")
                if st.stop_reason:
                    break
                if self.checkpoint_due():
                    self._save_and_wait()
            st.stop_reason = st.stop_reason or "max_steps reached"
            if evaluated_at != st.step:
                self._log_eval(metrics)
            if st.step != self._resumed_at:  # else the checkpoint it resumed from is this step's
                self._save_and_wait()
        except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM through slmlab.train.signals
            st.stop_reason = getattr(err, "stop_reason", "interrupted (Ctrl-C)")
            self.optimizer.zero_grad(set_to_none=True)
            saved = self.save()
            progress.write(f"interrupted at step {st.step}; checkpoint saved to {saved}")
        finally:
            progress.close()
            metrics.close()
        return st

    @property
    def tokens_per_s(self) -> float:
        return self.state.tokens_seen / max(self.state.train_time_s, 1e-9)


def _format_eval(result: dict) -> str:
    parts = [f"val loss {result['loss']:.4f}"]
    if "bits_per_byte" in result:
        parts.append(f"bpb {result['bits_per_byte']:.3f}")
    if "acc" in result:
        parts.append(f"acc {result['acc']:.4f}")
    return ", ".join(parts)
