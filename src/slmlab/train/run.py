"""Build a run from its config: tokenizer, data source, model, trainer; then train and report.

This is the whole of ``slmlab train`` minus argument parsing. It knows families only through the
registry (``resolve_model_spec``, ``Family.make_config``) and data only through the
``slmlab.data`` contract (``get_tokenizer``, ``get_source``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from .checkpoint import list_checkpoints, resolve_checkpoint
from .config import RunConfig
from .distributed import DistInfo, barrier, init_distributed
from .trainer import Trainer, resolve_device


def _cache_dir(cfg: RunConfig) -> Path | None:
    return Path(cfg.data_cache) if cfg.data_cache else None


def open_data(spec: str, tokenizer, block_size: int, cache_dir: Path | None = None, errors: str = "strict", seed: int = 0):
    """``slmlab.data.get_source``; synthetic tasks fix their own sequence length (block_size unused)."""
    from ..data import get_source, parse_task_spec

    block = None if parse_task_spec(spec) is not None else block_size
    return get_source(spec, tokenizer, block, cache_dir=cache_dir, errors=errors, seed=seed)


def open_source(cfg: RunConfig, tokenizer):
    """The run's data source."""
    return open_data(cfg.data, tokenizer, cfg.block_size, _cache_dir(cfg), cfg.data_errors, cfg.seed)


def build_tokenizer(cfg: RunConfig, run_dir: Path, dist_info: DistInfo):
    """The run's tokenizer: reloaded from ``run_dir/tokenizer`` when present (resume), else built
    (BPE is trained on the corpus's training texts, by the main rank, then shared through disk)."""
    from ..data import get_tokenizer

    saved = run_dir / "tokenizer"
    if not saved.is_dir():
        if dist_info.is_main:
            if cfg.tokenizer == "bpe":
                byte = get_tokenizer("byte")
                probe = open_source(cfg, byte)
                if probe.is_synthetic:  # task-local ids: the tokenizer only labels them
                    tok = byte
                else:
                    texts = list(probe.train_texts())
                    if not texts:
                        raise ValueError(f"data {cfg.data!r} yields no training texts to train a BPE tokenizer on")
                    tok = get_tokenizer("bpe", texts=texts, vocab_size=cfg.vocab_size, cache_dir=_cache_dir(cfg))
            else:
                tok = get_tokenizer(cfg.tokenizer, vocab_size=cfg.vocab_size, cache_dir=_cache_dir(cfg))
            tok.save_pretrained(str(saved))
        barrier(dist_info)
    return get_tokenizer(str(saved))


def needed_vocab(source, tokenizer) -> int:
    """Smallest model vocabulary for this data: a synthetic task's own; a corpus's tokenizer size."""
    if source.is_synthetic:
        return int(source.min_vocab_size)
    return max(len(tokenizer), int(source.min_vocab_size))


def build_model(cfg: RunConfig, vocab_size: int, seq_len: int):
    """A fresh model from ``cfg.model`` (family / preset) or a saved model folder to fine-tune."""
    from transformers import AutoModelForCausalLM

    from ..models.registry import resolve_model_spec

    if Path(cfg.model).is_dir():
        model = AutoModelForCausalLM.from_pretrained(cfg.model)
        if model.config.vocab_size < vocab_size:
            raise ValueError(f"model {cfg.model} has vocab_size={model.config.vocab_size} < {vocab_size} needed by the data")
        return model
    fam, preset = resolve_model_spec(cfg.model)
    overrides = dict(cfg.model_config)
    overrides.setdefault("vocab_size", vocab_size)
    if int(overrides["vocab_size"]) < vocab_size:
        raise ValueError(f"model_config.vocab_size={overrides['vocab_size']} is smaller than the {vocab_size} ids the data uses")
    config = fam.make_config(preset, **overrides)
    max_pos = getattr(config, "max_position_embeddings", None)
    if max_pos is not None and max_pos < seq_len:
        raise ValueError(
            f"the data yields sequences of {seq_len} tokens but the model accepts {max_pos}"
            " (max_position_embeddings); lower block_size or raise the model's context in model_config"
        )
    torch.manual_seed(cfg.seed)
    return fam.model_class(config)


def attach_tokenizer(model, tokenizer) -> None:
    """Give a freshly built model the tokenizer-derived tables some components need: any module
    with a ``table_ready`` flag and ``set_byte_table(tokenizer)`` (token -> UTF-8 bytes, e.g.
    NeoLLM's Spelling Bee embeddings) is filled once. Saved checkpoints carry the table."""
    for module in model.modules():
        ready = getattr(module, "table_ready", None)
        if isinstance(ready, torch.Tensor) and callable(getattr(module, "set_byte_table", None)) and not bool(ready):
            module.set_byte_table(tokenizer)


def prepare_for_training(model, seq_len: int) -> None:
    """Call the model's optional ``prepare_for_training(seq_len)`` hook, if it defines one: a model
    whose function depends on the training length (e.g. NeoLLM's automatic local-attention window)
    writes what it resolved into its config, so checkpoints and generation use the trained function."""
    hook = getattr(model, "prepare_for_training", None)
    if callable(hook):
        hook(seq_len)


def build_trainer(cfg: RunConfig, resume: str | Path | bool | None = None) -> Trainer:
    """Everything ``slmlab train`` builds, ready to ``train()``.

    Args:
        cfg: the run config.
        resume: True = the run folder's newest checkpoint (fresh if it has none); a path = that run or
            checkpoint; None/False = a fresh run, refused if ``out_dir`` already holds checkpoints.
    """
    device = resolve_device(cfg.device)
    dist_info = init_distributed(device)
    device = resolve_device(cfg.device, dist_info)
    run_dir = Path(cfg.out_dir)
    ckpt = None
    existing = list_checkpoints(run_dir / "checkpoints")
    if resume is True:
        ckpt = existing[-1] if existing else None  # nothing to resume yet: start fresh
    elif resume:
        ckpt = resolve_checkpoint(resume)
    elif existing:
        raise ValueError(
            f"out_dir {run_dir} already holds checkpoints (newest: {existing[-1].name}); pass --resume to continue"
            " that run, or choose another out_dir"
        )
    tokenizer = build_tokenizer(cfg, run_dir, dist_info)
    source = open_source(cfg, tokenizer)
    first = next(iter(source.eval_batches("validation", 1, 1)))
    seq_len = first["input_ids"].shape[1]
    model = build_model(cfg, needed_vocab(source, tokenizer), seq_len)
    attach_tokenizer(model, tokenizer)
    prepare_for_training(model, seq_len)
    trainer = Trainer(cfg, model, source, tokenizer, run_dir, dist_info, device)
    if ckpt is not None:
        trainer.resume(ckpt)
    return trainer


def sample_text(model, tokenizer, prompt: str, max_new_tokens: int, temperature: float, top_k: int, seed: int) -> str:
    """A short continuation of ``prompt`` through the shared decode loop."""
    from ..generation import SamplingConfig, generate

    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    if ids.shape[1] == 0 and tokenizer.bos_token_id is not None:
        ids = torch.tensor([[tokenizer.bos_token_id]])
    device = next(model.parameters()).device
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos is not None:
        max_new_tokens = max(0, min(max_new_tokens, max_pos - ids.shape[1]))
    gen = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    out = generate(model, ids.to(device), max_new_tokens, SamplingConfig(temperature, top_k), generator=gen,
                   stop_tokens=[t for t in (tokenizer.eos_token_id,) if t is not None])
    model.train(was_training)
    return tokenizer.decode(out[0], skip_special_tokens=True)


def write_report(trainer: Trainer) -> dict:
    """The final run report (``report.json`` + ``report.md``) of the main rank; returns it."""
    cfg, st = trainer.cfg, trainer.state
    report = {
        "model": cfg.model,
        "model_type": trainer.model.config.model_type,
        "parameters": trainer.n_params,
        "data": cfg.data,
        "steps": st.step,
        "stop_reason": st.stop_reason,
        "tokens_seen": st.tokens_seen,
        "tokens_per_s": trainer.tokens_per_s,
        "train_time_s": st.train_time_s,
        "best_val_loss": st.best_val_loss if math.isfinite(st.best_val_loss) else None,
        "final_eval": st.last_eval,
        "checkpoint": str(trainer.last_checkpoint()),
        "config": cfg.to_dict(),
    }
    if not trainer.source.is_synthetic and trainer.tokenizer is not None and cfg.sample_tokens:
        report["sample"] = sample_text(trainer.model, trainer.tokenizer, cfg.sample_prompt, cfg.sample_tokens,
                                       cfg.sample_temperature, cfg.sample_top_k, cfg.seed)
    if trainer.dist.is_main:
        trainer.run_dir.mkdir(parents=True, exist_ok=True)
        (trainer.run_dir / "report.json").write_text(json.dumps(report, indent=2))
        (trainer.run_dir / "report.md").write_text(format_report(report))
    return report


def format_report(report: dict) -> str:
    ev = report.get("final_eval") or {}
    lines = [
        f"# Run report: {report['model']} on {report['data']}",
        "",
        f"- parameters: {report['parameters']:,}",
        f"- steps: {report['steps']} ({report['stop_reason']})",
        f"- tokens seen: {report['tokens_seen']:,} at {report['tokens_per_s']:,.0f} tokens/s ({report['train_time_s']:.0f} s)",
    ]
    if report.get("best_val_loss") is not None:
        lines.append(f"- best validation loss: {report['best_val_loss']:.4f} nats/token")
    if "bits_per_byte" in ev:
        lines.append(f"- validation bits per byte: {ev['bits_per_byte']:.4f}")
    if "loss" in ev:
        lines.append(f"- final validation loss {ev['loss']:.4f}, perplexity {ev['ppl']:.2f}, accuracy {ev['acc']:.4f}")
    if "acc_by_group" in ev:
        lines.append("- accuracy by group: " + ", ".join(f"{g}: {a:.3f}" for g, a in ev["acc_by_group"].items()))
    lines.append(f"- checkpoint: {report['checkpoint']}")
    if "sample" in report:
        lines += ["", "## Sample", "", report["sample"]]
    return "\n".join(lines) + "\n"
