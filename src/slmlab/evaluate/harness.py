"""An lm-evaluation-harness model over any slmlab model and its tokenizer.

:class:`SlmlabLM` implements lm-eval's three request types on the model's own forward pass:

* ``loglikelihood(context, continuation)``: the summed log-probability of the continuation's
  tokens after the context, and whether greedy decoding would have produced them;
* ``loglikelihood_rolling(text)``: the log-probability of a whole document, scored in disjoint
  windows of the trained context (each token predicted once, with as much context as fits);
* ``generate_until(context, {until, max_gen_toks, ...})``: greedy (or sampled) continuation
  through :func:`slmlab.generation.generate`, cut at the first stop string.

Tokenisation follows how slmlab trains: every document is framed ``<bos> text <eos>``, so a
context starts with ``<bos>`` and a rolling document is conditioned on ``<bos>``. The context
window is the one the model was trained on (the run's ``block_size``), not the larger
``max_position_embeddings`` a config may allow: scoring beyond the trained length measures
extrapolation, not the model.

This module imports ``lm_eval`` at import time; import it only when lm-eval is wanted
(``slmlab eval --tasks``), never from ``slmlab``'s top level.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import normalize_gen_kwargs
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window


class SlmlabLM(TemplateLM):
    """lm-eval's ``LM`` interface over an slmlab causal LM.

    Args:
        model: a causal LM returning ``.logits [B, T, V]`` (any slmlab family, in eval mode).
        tokenizer: the tokenizer the model was trained with (``bos``/``eos``/``pad`` set).
        max_length: context window in tokens (the trained block size).
        batch_size: requests per forward pass for the log-likelihood requests.
        device: where the model lives.
        autocast: a context-manager factory or None (fp32), as ``slmlab eval`` uses.
    """

    backend = "causal"

    def __init__(self, model, tokenizer, max_length: int, batch_size: int = 16, device: torch.device | str = "cpu",
                 autocast=None) -> None:
        super().__init__()
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2 tokens, got {max_length}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token; lm-eval needs an end-of-text id")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self._max_length = int(max_length)
        self._batch_size = int(batch_size)
        self._device = torch.device(device)
        self._autocast = autocast or nullcontext

    # -- what lm-eval reads --------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return int(bos) if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """Token ids of ``string``; with ``<bos>`` first unless ``add_special_tokens`` is False."""
        # verbose=False: a whole document is longer than model_max_length on purpose (it is windowed)
        ids = self.tokenizer(string, add_special_tokens=False, verbose=False)["input_ids"]
        if add_special_tokens is False:
            return ids
        return [self.prefix_token_id, *ids]

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    # -- scoring -------------------------------------------------------------------------------
    @torch.no_grad()
    def _logprobs(self, rows: list[list[int]]) -> list[torch.Tensor]:
        """Per row ``[len(row), V]`` log-probabilities of the next token (fp32). Rows are
        right-padded into one batch: a causal model's outputs at real positions never see the padding."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.eot_token_id, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        with self._autocast():
            logits = self.model(input_ids=ids.to(self._device), use_cache=False).logits
        logp = F.log_softmax(logits.float(), dim=-1)
        return [logp[i, : len(row)] for i, row in enumerate(rows)]

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """``(sum of log p(continuation token), greedy?)`` per ``(key, context_ids, continuation_ids)``.

        The model reads the last ``max_length`` tokens of ``context + continuation`` minus the final
        one; the continuation must fit in the window (lm-eval's own rule)."""
        prepared = []
        for _, context, continuation in requests:
            if not continuation:
                raise ValueError("lm-eval sent an empty continuation to score; check the task's doc_to_choice/target")
            if len(continuation) > self._max_length:
                raise ValueError(
                    f"a continuation of {len(continuation)} tokens does not fit the {self._max_length}-token context;"
                    " pass a larger --block-size or shorten the task's answers"
                )
            whole = (context + continuation)[-(self._max_length + 1):]
            prepared.append((whole[:-1], continuation))
        order = sorted(range(len(prepared)), key=lambda i: -len(prepared[i][0]))  # similar lengths share a batch
        results: list[tuple[float, bool] | None] = [None] * len(prepared)
        for start in range(0, len(order), self._batch_size):
            chunk = order[start : start + self._batch_size]
            logps = self._logprobs([prepared[i][0] for i in chunk])
            for i, logp in zip(chunk, logps):
                inputs, continuation = prepared[i]
                scored = logp[len(inputs) - len(continuation):]
                target = torch.tensor(continuation, device=scored.device)
                total = float(scored.gather(-1, target[:, None]).sum())
                greedy = bool((scored.argmax(-1) == target).all())
                results[i] = (total, greedy)
                self.cache_hook.add_partial("loglikelihood", requests[i][0], results[i])
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Log-probability of each whole document (conditioned on ``<bos>``), in disjoint windows."""
        out = []
        for request in requests:
            (text,) = request.args
            windows = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    token_list=self.tok_encode(text, add_special_tokens=False),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self._max_length,
                    context_len=1,
                )
            ]
            scored = self._loglikelihood_tokens([(None, ctx, cont) for ctx, cont in windows])
            total = sum(s for s, _ in scored)
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
        return out

    # -- generation ----------------------------------------------------------------------------
    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """One request at a time: greedy unless the task asks for ``do_sample`` with a temperature."""
        from ..generation import SamplingConfig, generate

        out = []
        for request in requests:
            context, gen_kwargs = request.args
            kwargs = normalize_gen_kwargs(dict(gen_kwargs), default_max_gen_toks=256)
            until = [s for s in kwargs.get("until", []) if s]
            max_new = max(1, min(int(kwargs["max_gen_toks"]), self._max_length - 1))
            ids = self.tok_encode(context)[-(self._max_length - max_new):]
            temperature = float(kwargs.get("temperature", 0.0)) if kwargs.get("do_sample") else 0.0
            sampling = SamplingConfig(temperature=temperature, top_k=int(kwargs.get("top_k", 0) or 0),
                                      top_p=float(kwargs.get("top_p", 1.0) or 1.0))
            prompt = torch.tensor([ids], dtype=torch.long, device=self._device)
            with self._autocast():
                tokens = generate(self.model, prompt, max_new, sampling, stop_tokens=[self.eot_token_id])
            text = self.tok_decode(tokens[0, len(ids):].tolist())
            for stop in until:
                text = text.split(stop, 1)[0]
            out.append(text)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return out
