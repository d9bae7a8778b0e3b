"""Build a run from its config: tokenizer, data source, model, trainer; then train and report.

This is the whole of ``slmlab train`` minus argument parsing. It knows families only through the
registry (``resolve_model_spec``, ``Family.make_config``) and data only through the
``slmlab.data`` contract (``get_tokenizer``, ``get_source``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from ..outputs import dumps_finite
from .checkpoint import resolve_checkpoint
from .config import RunConfig
from .distributed import DistInfo, barrier, init_distributed
from .environment import resolve_device
from .saved import check_trainable, load_saved_model, saved_run_config
from .session import TRAIN, RunSession, held
from .trainer import TIME_CAP_ADVICE, Trainer, stopped_by_time_cap


def _cache_dir(cfg: RunConfig) -> Path | None:
    return Path(cfg.data_cache) if cfg.data_cache else None


def open_data(spec: str, tokenizer, block_size: int, cache_dir: Path | None = None, errors: str = "strict", seed: int = 0,
              train_on: str = "scored", corpus=None):
    """``slmlab.data.get_source``; synthetic tasks fix their own sequence length (block_size unused); chat
    data (``builtin:chat``, what a ``slmlab finetune`` run records) is a :class:`ChatSource`, scored on the
    assistant's tokens, so ``slmlab eval`` of a fine-tune measures what it was trained on."""
    from ..data import get_source, parse_task_spec
    from ..data.chat_data import BUILTIN_CHAT, load_chat
    from ..data.chat_source import ChatSource

    if spec == BUILTIN_CHAT:
        return ChatSource(spec, load_chat(spec), tokenizer, block_size)
    block = None if parse_task_spec(spec) is not None else block_size
    return get_source(spec, tokenizer, block, cache_dir=cache_dir, errors=errors, seed=seed, train_on=train_on,
                      corpus=corpus)


def open_source(cfg: RunConfig, tokenizer, corpus=None):
    """The run's data source (``corpus``: its text corpus, when already loaded)."""
    return open_data(cfg.data, tokenizer, cfg.block_size, _cache_dir(cfg), cfg.data_errors, cfg.seed, cfg.train_on,
                     corpus)


def requested_data(cfg: RunConfig) -> tuple[dict, object | None]:
    """``(identity, corpus)`` of the run's data (:func:`slmlab.data.sources.data_identity`); ``corpus``
    is the loaded local corpus (None for named corpora and tasks), to be opened without reading it again."""
    from ..data.corpora import load_corpus
    from ..data.sources import data_identity, spec_kind

    corpus = None
    if spec_kind(cfg.data) == "local":
        corpus = load_corpus(cfg.data, cache_dir=_cache_dir(cfg), errors=cfg.data_errors)
    return data_identity(cfg.data, corpus), corpus


def fresh_tokenizer(cfg: RunConfig):
    """The tokenizer ``cfg`` asks for, built now: ``byte``, a path, or a BPE trained on the corpus's
    training texts (kept in the data cache, keyed by the vocabulary size and the texts, so every
    rank of a torchrun job and every later run with the same settings gets the same tokenizer)."""
    from ..data import get_tokenizer

    if cfg.tokenizer != "bpe":
        return get_tokenizer(cfg.tokenizer, vocab_size=cfg.vocab_size, cache_dir=_cache_dir(cfg))
    byte = get_tokenizer("byte")
    probe = open_source(cfg, byte)
    if probe.is_synthetic:  # task-local ids: the tokenizer only labels them
        return byte
    # streamed twice (to key the tokenizer cache, then to train), never held in memory
    return get_tokenizer("bpe", texts=probe.train_texts(), vocab_size=cfg.vocab_size, cache_dir=_cache_dir(cfg))


def build_tokenizer(cfg: RunConfig, dist_info: DistInfo, origin: Path | None = None):
    """The run's tokenizer. A model always runs with the tokenizer it was trained with: when
    resuming or fine-tuning, ``origin`` (the checkpoint) holds it and it is loaded from there;
    otherwise it is built (:func:`fresh_tokenizer`) by the main rank first, then by the others from
    the cache. Nothing is written into the run folder: a checkpoint carries its tokenizer."""
    from ..data import get_tokenizer

    if origin is not None and (origin / "tokenizer.json").is_file():
        return get_tokenizer(str(origin))
    tok = fresh_tokenizer(cfg) if dist_info.is_main else None
    barrier(dist_info)
    return tok if tok is not None else fresh_tokenizer(cfg)


def check_tokenizer_request(cfg: RunConfig, ckpt: Path, given: frozenset[str]) -> None:
    """Fine-tuning ``ckpt`` reuses its tokenizer: an explicit ``tokenizer=`` / ``vocab_size=`` that
    disagrees with the checkpoint's is refused (it would re-map every token id)."""
    if not (ckpt / "tokenizer.json").is_file():
        return
    saved = saved_run_config(ckpt)
    for key in ("tokenizer", "vocab_size"):
        if key not in given:
            continue
        want = getattr(cfg, key)
        if key in saved and saved[key] == want:
            continue
        if key == "tokenizer" and Path(want).expanduser().resolve() in (ckpt.resolve(), (ckpt / "tokenizer.json").resolve()):
            continue
        raise ValueError(
            f"{key}={want!r} conflicts with the tokenizer {ckpt} was trained with ({ckpt / 'tokenizer.json'}"
            f"{f', {key}={saved[key]!r}' if key in saved else ''}); a model runs with its own tokenizer: drop {key}="
        )


def needed_vocab(source, tokenizer) -> int:
    """Smallest model vocabulary for this data: a synthetic task's own; a corpus's tokenizer size."""
    if source.is_synthetic:
        return int(source.min_vocab_size)
    return max(len(tokenizer), int(source.min_vocab_size))


def build_model(cfg: RunConfig, vocab_size: int, seq_len: int):
    """A fresh model from ``cfg.model`` (family / preset) or a saved model folder to fine-tune. The
    global generator is seeded with ``cfg.seed`` first, either way: every later draw (initial weights,
    dropout) comes from the seed."""
    from ..models.registry import resolve_model_spec

    torch.manual_seed(cfg.seed)
    if Path(cfg.model).is_dir():
        if cfg.model_config:
            raise ValueError(
                f"model_config {sorted(cfg.model_config)} cannot change the saved model {cfg.model}; its config.json"
                " fixes the architecture: drop model_config, or train a fresh model (model=<family>)"
            )
        model = load_saved_model(cfg.model)
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
    return fam.model_class(config)


def attach_tokenizer(model, tokenizer) -> None:
    """Give a freshly built model the tokenizer-derived tables some components need: any module
    with a ``table_ready`` flag and ``set_byte_table(tokenizer)`` (token -> UTF-8 bytes, e.g.
    NeoLLM's Spelling Bee embeddings) is filled once. Saved checkpoints carry the table."""
    for module in model.modules():
        ready = getattr(module, "table_ready", None)
        if isinstance(ready, torch.Tensor) and callable(getattr(module, "set_byte_table", None)) and not bool(ready):
            module.set_byte_table(tokenizer)


def record_tokenizer(model, tokenizer, seq_len: int, synthetic: bool = False) -> None:
    """Make every checkpoint tell its clients how to use it: the tokenizer's bos/eos/pad ids go into
    the model's config and generation config (``config.json`` and ``generation_config.json``, so
    transformers' ``generate`` and ``pipeline`` stop at end-of-text), and the trained context
    ``seq_len`` becomes the tokenizer's ``model_max_length``, which every checkpoint then records as
    ``trained_context`` in ``trainer/state.json`` (:func:`slmlab.train.checkpoint.save_checkpoint`;
    read back by :func:`slmlab.train.saved.trained_context`). A synthetic task's ids are its own
    (the byte tokenizer only labels them), so its ids stay unset, as do ids outside the vocabulary."""
    if tokenizer is None:
        return
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        tid = None if synthetic else getattr(tokenizer, name, None)
        tid = tid if tid is not None and 0 <= tid < model.config.vocab_size else None
        setattr(model.config, name, tid)
        if getattr(model, "generation_config", None) is not None:
            setattr(model.generation_config, name, tid)
    tokenizer.model_max_length = int(seq_len)


def prepare_for_training(model, seq_len: int) -> None:
    """Call the model's optional ``prepare_for_training(seq_len)`` hook, if it defines one: a model
    whose function depends on the training length (e.g. NeoLLM's automatic local-attention window)
    writes what it resolved into its config, so checkpoints and generation use the trained function."""
    hook = getattr(model, "prepare_for_training", None)
    if callable(hook):
        hook(seq_len)


def build_trainer(cfg: RunConfig, given: frozenset[str] = frozenset(), session: RunSession | None = None) -> Trainer:
    """Everything ``slmlab train`` builds, ready to ``train()``, started as ``session`` decided: fresh or
    resumed (the resume checked against the checkpoint), with one line saying which.

    Args:
        cfg: the run config.
        given: the config keys the user set explicitly (a fine-tune refuses a conflicting tokenizer).
        session: the open :class:`~slmlab.train.session.RunSession` of ``cfg.out_dir`` (resume,
            ``--allow-change``); None: a fresh run's session, held while the trainer is built.
    """
    from ..data.sources import data_identity
    from .resume_check import DATA_IDENTITY_FILE, read_data_identity

    with held(session, cfg.out_dir, TRAIN) as session:
        device, dist_info = open_devices(cfg)
        ckpt, origin = session.checkpoint, session.checkpoint
        identity, corpus = None, None
        if ckpt is not None:
            if read_data_identity(ckpt) is not None:  # else an older checkpoint, compared by the data text
                identity, corpus = requested_data(cfg)
            saved, resharded = same_global_batch(saved_run_config(ckpt), ckpt, cfg, dist_info)
            session.check_resume(cfg, identity, saved, resharded)
        elif Path(cfg.model).is_dir():  # fine-tuning a saved model: its tokenizer comes with it
            origin = resolve_checkpoint(cfg.model)
            check_trainable(origin)  # a quantized folder: refused before any data is read
            check_tokenizer_request(cfg, origin, given)
        tokenizer = build_tokenizer(cfg, dist_info, origin)
        source = open_source(cfg, tokenizer, corpus)
        if identity is None:
            identity = data_identity(cfg.data, getattr(source, "corpus", None), errors=cfg.data_errors)
        first = next(iter(source.eval_batches("validation", 1, 1)))
        seq_len = first["input_ids"].shape[1]
        model = build_model(cfg, needed_vocab(source, tokenizer), seq_len)
        attach_tokenizer(model, tokenizer)
        record_tokenizer(model, tokenizer, seq_len, source.is_synthetic)
        prepare_for_training(model, seq_len)
        trainer = Trainer(cfg, model, source, tokenizer, session.run_dir, dist_info, device)
        if identity is not None:
            trainer.checkpoint_json[DATA_IDENTITY_FILE] = identity  # compared by the next --resume
        session.start(trainer)
        return trainer


def same_global_batch(saved: dict, ckpt: Path, cfg: RunConfig, dist_info: DistInfo) -> tuple[dict, list[str]]:
    """``(saved, changes)``: a checkpoint written at another world size resumes with the same global
    batch (what each step computes), so its per-rank ``batch_size`` may change with the world size: when
    ``batch_size x world_size`` is the checkpoint's, ``saved`` takes the new ``batch_size`` (the resume
    check then sees no change) and ``changes`` says what moved; otherwise both are as they were."""
    from .saved import read_json_object

    state = read_json_object(Path(ckpt) / "trainer" / "state.json")
    rows, world = state.get("global_batch_rows"), state.get("world_size")
    old = saved.get("batch_size")
    if old == cfg.batch_size or rows != cfg.batch_size * dist_info.world_size or not isinstance(world, int):
        return saved, []
    return {**saved, "batch_size": cfg.batch_size}, [
        f"batch_size: {old} -> {cfg.batch_size} per rank, {world} -> {dist_info.world_size} ranks (the same global batch"
        f" of {rows} rows)"]


def open_devices(cfg: RunConfig) -> tuple[torch.device, DistInfo]:
    """``(device, dist_info)`` of a run about to start or resume: the device after the process group
    (so each rank gets its own)."""
    from .parallel import NEEDS_GROUP

    device = resolve_device(cfg.device)
    dist_info = init_distributed(device, group=NEEDS_GROUP[cfg.parallel])  # FSDP2: a group even of one
    return resolve_device(cfg.device, dist_info), dist_info


def given_keys(files: list[str], overrides: list[str]) -> frozenset[str]:
    """The top-level config keys the user set (in a config file or an override)."""
    import yaml

    from .config import parse_overrides

    keys = set(parse_overrides(list(overrides)))
    for path in files:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        keys |= set(loaded) if isinstance(loaded, dict) else set()
    return frozenset(keys)


def train_run(files: list[str], overrides: list[str], resume: str | bool = False,
              allow_change: tuple[str, ...] = ()) -> int:
    """The whole of ``slmlab train`` after its arguments: the config from ``files`` and ``overrides``,
    one :class:`~slmlab.train.session.RunSession` (``resume``, ``allow_change``: as there), the trainer,
    the run and its report; returns the exit status (:func:`train_and_report`)."""
    from .config import load_config

    cfg = load_config(files, overrides)
    with RunSession(cfg.out_dir, TRAIN, resume, allow_change) as session:
        trainer = build_trainer(cfg, given_keys(files, overrides), session)
        header = (f"slmlab train: {cfg.model} ({trainer.n_params:,} parameters) on {cfg.data}, {cfg.max_steps} steps x"
                  f" {cfg.batch_size * cfg.grad_accum * trainer.dist.world_size} sequences -> {cfg.out_dir}")
        return train_and_report(session, trainer, header)


def train_and_report(session: RunSession, trainer: Trainer, header: str,
                     show: Callable[[dict], None] | None = None) -> int:
    """Train inside ``session`` and report; returns the exit status.

    The main rank prints ``header`` first and, after the run, the report (:func:`write_report`; ``show``
    prints it instead, and may add to it). A diverged run prints its message (the step, the last good
    checkpoint) and returns 1; otherwise the session's status: 0, or 130 / 143 after Ctrl-C / SIGTERM.
    Every rank leaves the process group at the end.
    """
    from .distributed import shutdown
    from .trainer import TrainingDiverged

    try:
        if session.main:
            print(header)
        try:
            trainer.train()
        except TrainingDiverged as err:
            print(f"slmlab {session.kind.command}: {err}", file=sys.stderr)
            return 1
        report = write_report(trainer)
        if session.main and show is not None:
            show(report)
        elif session.main:
            print(format_report(report))
    finally:
        shutdown(trainer.dist)
    return session.exit_status(trainer)


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


def final_validation(trainer: Trainer) -> tuple[dict, dict]:
    """``(final, periodic)``: the report's validation figure and what each periodic evaluation read.

    The periodic evaluations (``eval_every``, the curves of ``loss.png``) read the first
    ``eval_batches`` batches of the validation split, to keep training fast; the figure a report
    quotes must not silently be that subset. So for a text corpus the final figure is measured again
    on the whole validation split when the periodic ones were a subset, unless the run was interrupted
    (a SIGTERM grace period is no time for a full pass; the report then names the subset). Synthetic
    tasks and custom evaluators keep their last periodic result, with its size named. Either way
    ``final`` says its ``scope``, ``tokens`` and ``step``.
    """
    from ..evaluate.lm import count_eval_batches, evaluate_source
    from .progress import Progress
    from .signals import exit_status

    cfg, st = trainer.cfg, trainer.state
    bs = cfg.eval_batch_size or cfg.batch_size
    last = dict(st.last_eval)
    # a subset unless the split ran out first (fewer rows than eval_batches x batch size)
    subset = bool(cfg.eval_batches) and (not last or int(last.get("examples", 0)) >= cfg.eval_batches * bs)
    periodic = {"batches": cfg.eval_batches or "all", "batch_size": bs, "tokens": last.get("tokens"),
                "scope": f"first {cfg.eval_batches} batches of {bs} sequences" if subset else "whole validation split"}
    text = trainer.evaluator is None and not trainer.source.is_synthetic
    if subset and text and exit_status(st.stop_reason) == 0 and last:
        sample, scope = final_eval_sample(trainer.source, cfg.final_eval_tokens)
        show = cfg.progress and trainer.dist.is_main  # the pass is as long as `slmlab eval`: show it
        total = count_eval_batches(trainer.source, "validation", bs, sample=sample)
        progress = Progress(total, enabled=show, every_steps=max(1, total // 10), desc="final eval", unit="batch",
                            label="final eval batch")
        progress.write(f"final validation on the {scope}: {total} batches of {bs} sequences")
        try:
            final = evaluate_source(trainer.model, trainer.source, "validation", bs, None, trainer.forward_inputs,
                                    trainer.device, trainer.autocast, progress=progress.advance, sample=sample)
        finally:
            progress.close()
        final = {k: v for k, v in final.items() if k != "acc_by_group"}
        return {**final, "scope": scope, "step": st.step, "measured_at_end": True}, periodic
    step = _last_eval_step(trainer)
    return {**last, "scope": periodic["scope"], "step": step, "measured_at_end": False}, periodic


def final_eval_sample(source, max_tokens: int) -> tuple[int | None, str]:
    """``(sample, scope)`` of the final validation: the whole split (``sample`` None) when it holds at
    most ``max_tokens`` tokens (or ``max_tokens`` is 0), else a seeded fixed sample of the sequences
    holding about ``max_tokens`` tokens (:meth:`~slmlab.data.sources.DataSource.eval_batches`)."""
    from ..data.sources import EVAL_SAMPLE_SEED

    if not max_tokens or not hasattr(source, "n_eval_rows"):  # 0, or a duck-typed source: no sampling
        return None, "whole validation split"
    rows, length = source.n_eval_rows("validation"), source.seq_len
    if rows * length <= max_tokens:
        return None, "whole validation split"
    sample = max(1, max_tokens // length)
    return sample, (f"validation sample: {sample:,} of {rows:,} sequences ({sample * length:,} of {rows * length:,}"
                    f" tokens, seed {EVAL_SAMPLE_SEED}; final_eval_tokens={max_tokens:,})")


def _last_eval_step(trainer: Trainer) -> int | None:
    from .metrics import read_metrics

    path = trainer.run_dir / "metrics.jsonl"
    records = read_metrics(path, "eval") if path.is_file() else []
    return int(records[-1]["step"]) if records else None


def write_loss_plot(trainer: Trainer, final: dict) -> str | None:
    """``loss.png`` in the run folder from ``metrics.jsonl`` (:func:`slmlab.plots.training_curves`);
    returns its file name, or None (with a printed note) when matplotlib is missing."""
    from ..plots import matplotlib_missing, training_curves
    from .metrics import read_metrics

    missing = matplotlib_missing()
    if missing:
        print(f"slmlab train: loss.png not written: {missing}")
        return None
    path = trainer.run_dir / "metrics.jsonl"
    records = read_metrics(path) if path.is_file() else []
    end = {"": final} if final.get("measured_at_end") else None
    training_curves({"": records}, trainer.run_dir / "loss.png", f"{trainer.cfg.model} on {trainer.cfg.data}", end)
    return "loss.png"


def write_report(trainer: Trainer) -> dict:
    """The final run report (``report.json`` + ``report.md`` + ``loss.png``) of the main rank; returns it."""
    from .environment import run_environment

    cfg, st = trainer.cfg, trainer.state
    final, periodic = final_validation(trainer)
    report = {
        "model": cfg.model,
        "model_type": trainer.model.config.model_type,
        "parameters": trainer.n_params,
        "data": cfg.data,
        "steps": st.step,
        "stop_reason": st.stop_reason,
        "incomplete": is_incomplete(st.stop_reason),
        "tokens_seen": st.tokens_seen,
        "tokens_per_s": trainer.tokens_per_s,
        "train_time_s": st.train_time_s,
        "best_val_loss": st.best_val_loss if math.isfinite(st.best_val_loss) else None,
        "final_eval": final,
        "periodic_eval": periodic,
        "checkpoint": str(trainer.last_checkpoint()),
        "config": cfg.to_dict(),
        "environment": run_environment(trainer.device, next(trainer.model.parameters()).dtype,
                                       "bf16 autocast" if trainer.autocast else "fp32", trainer.dist.world_size),
    }
    if not trainer.source.is_synthetic and trainer.tokenizer is not None and cfg.sample_tokens:
        whole = trainer.parallel.full_model(trainer.model)  # FSDP2: gathered on the main rank (a collective)
        if whole is not None:
            report["sample"] = sample_text(whole, trainer.tokenizer, cfg.sample_prompt, cfg.sample_tokens,
                                           cfg.sample_temperature, cfg.sample_top_k, cfg.seed)
    if trainer.dist.is_main:
        trainer.run_dir.mkdir(parents=True, exist_ok=True)
        report["plot"] = write_loss_plot(trainer, final)
        (trainer.run_dir / "report.json").write_text(dumps_finite(report, indent=2))
        (trainer.run_dir / "report.md").write_text(format_report(report))
    return report


def is_incomplete(stop_reason: str) -> bool:
    """Whether a run that stopped for ``stop_reason`` is not the configured run: the ``max_time``
    safety cap or a Ctrl-C / SIGTERM ended it before ``max_steps`` (an early stop on accuracy is a
    deliberate end)."""
    from .signals import exit_status

    return stopped_by_time_cap(stop_reason) or exit_status(stop_reason) != 0


def incomplete_note(report: dict) -> str | None:
    """The report's warning line for an incomplete run (None for a complete one)."""
    reason = report.get("stop_reason", "")
    if not report.get("incomplete"):
        return None
    if stopped_by_time_cap(reason):
        return f"**Incomplete run**: {reason}; {TIME_CAP_ADVICE}."
    total = (report.get("config") or {}).get("max_steps", "?")
    return (f"**Incomplete run**: {reason} at step {report['steps']} of {total}; the result is not the configured"
            " run; rerun with --resume to finish.")


def _tokens(n) -> str:
    return f"{n:,} tokens" if isinstance(n, int) else "? tokens"


def format_report(report: dict) -> str:
    ev = report.get("final_eval") or {}
    periodic = report.get("periodic_eval") or {}
    note = incomplete_note(report)
    lines = [
        f"# Run report: {report['model']} on {report['data']}",
        "",
        *([note, ""] if note else []),
        f"- parameters: {report['parameters']:,}",
        f"- steps: {report['steps']} ({report['stop_reason']})",
        f"- tokens seen: {report['tokens_seen']:,} at {report['tokens_per_s']:,.0f} tokens/s ({report['train_time_s']:.0f} s)",
    ]
    if "loss" in ev:
        where = f"{ev.get('scope', 'validation split')}, {_tokens(ev.get('tokens'))}"
        if ev.get("step") is not None:
            where += f", step {ev['step']}"
        if "bits_per_byte" in ev:
            lines.append(f"- validation bits per byte: {ev['bits_per_byte']:.4f} ({where})")
        lines.append(f"- final validation loss {ev['loss']:.4f}, perplexity {ev['ppl']:.2f}, accuracy {ev['acc']:.4f}"
                     f" ({where})")
        if "acc_by_group" in ev:
            lines.append("- accuracy by group: " + ", ".join(f"{g}: {a:.3f}" for g, a in ev["acc_by_group"].items()))
    if periodic:
        lines.append(f"- periodic validation (the curves): {periodic['scope']}, {_tokens(periodic.get('tokens'))} each")
    if report.get("best_val_loss") is not None:
        lines.append(f"- best periodic validation loss: {report['best_val_loss']:.4f} nats/token")
    lines.append(f"- checkpoint: {report['checkpoint']}")
    env = report.get("environment") or {}
    if env:
        commit = env.get("git_commit")
        code = f"slmlab {env.get('slmlab')}" + (f" ({commit[:12]}{', modified' if env.get('git_dirty') else ''})" if commit else "")
        lines.append(f"- measured with {code}, torch {env.get('torch')}, transformers {env.get('transformers')} on"
                     f" {env.get('device')} ({env.get('device_name')}), {env.get('dtype')} weights, {env.get('precision')},"
                     f" {env.get('threads')} threads x {env.get('world_size')} process(es), {env.get('date')}")
    if report.get("plot"):
        lines += ["", f"![training curves: loss, validation bits per byte, learning rate]({report['plot']})"]
    if "sample" in report:
        lines += ["", "## Sample", "", report["sample"]]
    return "\n".join(lines) + "\n"
