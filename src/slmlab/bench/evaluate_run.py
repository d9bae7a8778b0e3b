"""A saved run or checkpoint evaluated from its path: what ``slmlab eval`` prints, as a dict.

:func:`evaluate_run` measures loss, perplexity, bits per byte and task accuracy on a data split
(:func:`slmlab.evaluate.evaluate_source`); :func:`evaluate_tasks_run` runs lm-evaluation-harness
tasks (:func:`slmlab.evaluate.tasks.run_tasks`). Both open the folder once
(:func:`slmlab.train.saved.load_for_inference`), quantize it when asked, and take the context window
from the one inference-context rule (:meth:`~slmlab.train.saved.LoadedModel.context`). They live
here, above ``train/``, because loading a saved run is train's; ``evaluate/`` sits below it.
"""

from __future__ import annotations

from pathlib import Path


def evaluate_run(path: str | Path, data: str | None = None, split: str = "validation", batch_size: int = 16,
                 max_batches: int | None = None, block_size: int | None = None, quantize: str | None = None,
                 device: str = "auto", progress: bool = True) -> dict:
    """Evaluate the run or checkpoint at ``path`` on a data split.

    Args:
        path: a run folder (its newest checkpoint), a checkpoint folder or a saved model folder.
        data: a data spec; None reads the run's own (``run.yaml`` beside the weights).
        split / batch_size / max_batches: which rows, in batches of how many sequences, and how many
            batches at most (None: the whole split).
        block_size: the context in tokens (None: the one the model was trained on).
        quantize: ``"int8"`` / ``"int4"`` weight-only linears (CPU), or None.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``...
        progress: batches done / total, tokens/s and eta on stderr (:func:`eval_progress`), after a
            line naming the checkpoint, data and batches.
    Returns:
        ``{"checkpoint", "data", "split", "loss", "ppl", "tokens", ...}``: the checkpoint folder and
        data spec, then :func:`~slmlab.evaluate.evaluate_source`'s numbers.
    Raises:
        ValueError: no data named anywhere, no tokenizer saved with the weights, or what loading refuses.
    """
    from ..evaluate.lm import count_eval_batches, evaluate_source, family_forward_inputs
    from ..train.precision import autocast_factory
    from ..train.run import open_data

    loaded = _load(path, device, quantize)
    ckpt, model, dev, run_cfg = loaded.checkpoint, loaded.model, loaded.device, loaded.run_config
    data = data or run_cfg.get("data")
    if not data:
        raise ValueError(f"{ckpt} has no run.yaml naming its data; pass --data")
    if loaded.tokenizer is None:
        raise ValueError(f"{ckpt} has no tokenizer.json; evaluation needs the tokenizer the model was trained with")
    cache = run_cfg.get("data_cache")
    source = open_data(data, loaded.tokenizer, loaded.context(block_size), Path(cache) if cache else None,
                       run_cfg.get("data_errors", "strict"), run_cfg.get("seed", 0))
    bar = eval_progress(count_eval_batches(source, split, batch_size, max_batches), progress)
    bar.write(f"slmlab eval: {ckpt} on {data} ({split}): {bar.total} batches of {batch_size}"
              f" sequences of {source.seq_len} tokens on {dev}")
    try:
        result = evaluate_source(model, source, split, batch_size, max_batches, family_forward_inputs(model), dev,
                                 autocast_factory(dev), progress=bar.advance)
    finally:
        bar.close()
    return {"checkpoint": str(ckpt), "data": data, "split": split, **result}


def evaluate_tasks_run(path: str | Path, tasks, *, include_path: str | Path | None = None,
                       limit: int | float | None = None, num_fewshot: int | None = None, batch_size: int = 16,
                       block_size: int | None = None, quantize: str | None = None, device: str = "auto") -> dict:
    """lm-evaluation-harness ``tasks`` on the run or checkpoint at ``path`` (the ``eval`` extra).

    Args:
        tasks: task names, patterns or ``.yaml`` paths (``"a,b"`` or a list), or a
            :class:`~slmlab.evaluate.tasks.TaskSelection` already resolved (``include_path`` unused then).
        include_path / limit / num_fewshot / batch_size: as :func:`slmlab.evaluate.tasks.run_tasks` takes them.
        block_size: the context window (None: the one the model was trained on).
        quantize / device: as in :func:`evaluate_run`.
    Returns:
        lm-eval's results dict (``results``, ``n-samples``, ``versions``, ...) with ``checkpoint`` (the
        folder, a string) and ``context`` (the window in tokens) added.
    """
    from ..evaluate.tasks import require_lm_eval, run_tasks
    from ..train.precision import autocast_factory

    require_lm_eval()  # before loading the model: a missing extra is the first thing to say
    loaded = _load(path, device, quantize)
    if loaded.tokenizer is None:
        raise ValueError(f"{loaded.checkpoint} has no tokenizer.json; lm-eval tasks need the tokenizer the model was"
                         " trained with")
    context = loaded.context(block_size)
    results = run_tasks(loaded.model, loaded.tokenizer, tasks, max_length=context, include_path=include_path,
                        limit=limit, num_fewshot=num_fewshot, batch_size=batch_size, device=loaded.device,
                        autocast=autocast_factory(loaded.device))
    return {"checkpoint": str(loaded.checkpoint), "context": context, **results}


def eval_progress(total: int, enabled: bool = True):
    """The progress display of an evaluation of ``total`` batches, on stderr (stdout holds the result):
    the training display (:class:`slmlab.train.progress.Progress`) counting batches, a line every
    tenth of them (or 30 s) off a terminal."""
    import sys

    from ..train.progress import Progress

    return Progress(total, enabled=enabled, every_steps=max(1, total // 10), stream=sys.stderr, desc="eval",
                    unit="batch", label="eval batch")


def _load(path, device: str, quantize: str | None):
    """The saved model at ``path`` on ``device``, quantized with ``quantize`` (None: as saved)."""
    from ..models.quantize import apply_quantization
    from ..train.saved import load_for_inference

    loaded = load_for_inference(path, device)
    apply_quantization(loaded.model, quantize, loaded.device)
    return loaded
