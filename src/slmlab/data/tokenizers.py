"""Tokenizers: byte-level (no training), ByteLevel BPE trained with ``tokenizers``, or a saved one.

Every tokenizer returned here is a :class:`transformers.PreTrainedTokenizerFast` whose ``bos``,
``eos`` and ``pad`` tokens are set. The byte-level tokenizer maps byte ``b`` to id ``b`` (ids 0-255)
and puts ``<bos>``/``<eos>``/``<pad>`` at 256/257/258; the BPE tokenizer puts them at 0/1/2 and
starts from the same 256-symbol byte alphabet (:mod:`slmlab.data.byte_alphabet`, GPT-2's table), so
both encode any Unicode text and decode it back unchanged. Neither adds specials on ``encode``:
:mod:`slmlab.data.packing` frames every document as ``<bos> text <eos>`` itself.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ..outputs import publish_modes
from .byte_alphabet import byte_to_unicode
from .paths import resolve_cache_dir

BOS, EOS, PAD = "<bos>", "<eos>", "<pad>"
SPECIAL_TOKENS = (BOS, EOS, PAD)
_SPECIAL_ATTRS = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False, **_SPECIAL_ATTRS)


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: id ``b`` is byte ``b``; specials ``<bos>``=256, ``<eos>``=257, ``<pad>``=258."""
    vocab = {ch: b for b, ch in byte_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return _wrap(tok)


def train_bpe(texts: Iterable[str], vocab_size: int = 2048, length: int | None = None) -> PreTrainedTokenizerFast:
    """Train a ByteLevel BPE tokenizer (Sennrich et al. 2016, arXiv:1508.07909, on GPT-2's byte alphabet).

    The trainer reads ``texts`` as a stream (``train_from_iterator``): memory is the trainer's word
    counts, not the corpus.

    Args:
        texts: training documents (any iterable, consumed once).
        length: the number of documents, if known (the trainer's progress hint).
        vocab_size: final vocabulary size including the three specials; must leave room for the
            256-symbol byte alphabet (>= 259). A small corpus may stop merging earlier.
    """
    if int(vocab_size) < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be >= {256 + len(SPECIAL_TOKENS)} (byte alphabet + specials), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=int(vocab_size),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=length)
    return _wrap(tok)


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerFast) -> str:
    """A stable hash of everything that decides the ids a tokenizer produces."""
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode("utf-8")).hexdigest()[:16]


def _ensure_specials(tokenizer: PreTrainedTokenizerFast, origin: str) -> PreTrainedTokenizerFast:
    """Set missing bos/eos/pad: reuse a token named ``<bos>``/``<eos>``/``<pad>`` if the vocabulary has
    one, otherwise add it (the vocabulary grows, with a warning)."""
    vocab = tokenizer.get_vocab()
    added = []
    for attr, name in _SPECIAL_ATTRS.items():
        if getattr(tokenizer, attr) is None:
            if name not in vocab:
                added.append(name)
            tokenizer.add_special_tokens({attr: name})
    if added:
        msg = f"tokenizer {origin} had no {added}; added them as new tokens (vocabulary is now {len(tokenizer)})"
        warnings.warn(msg, stacklevel=2)
    return tokenizer


def _first_broken_file(path: Path) -> Path | None:
    """The first of a tokenizer's JSON files that does not parse (names the file in the error)."""
    import json

    files = [path] if path.is_file() else [path / n for n in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")]
    for file in files:
        try:
            if file.is_file():
                json.loads(file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return file
    return None


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerFast:
    """Load a ``tokenizer.json`` file or a folder saved by ``save_pretrained`` (or holding a tokenizer.json)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(f"tokenizer spec {str(path)!r} is not 'byte', 'bpe' or an existing tokenizer.json / folder")
    if p.is_dir() and not (p / "tokenizer.json").is_file():
        raise ValueError(f"tokenizer folder {p} has no tokenizer.json")
    try:
        if p.is_dir():
            tok = PreTrainedTokenizerFast.from_pretrained(str(p), clean_up_tokenization_spaces=False, trust_remote_code=False)
        else:
            tok = PreTrainedTokenizerFast(tokenizer_file=str(p), clean_up_tokenization_spaces=False)
    except Exception as exc:  # the Rust side raises plain Exceptions for malformed json
        raise ValueError(f"{_first_broken_file(p) or p} is not a valid tokenizer file ({exc}); it is damaged or"
                         " half-written: copy it again from the run's checkpoint, or train a new one (slmlab tokenizer"
                         " train) and delete the broken file") from None
    return _ensure_specials(tok, str(p))


def _texts_digest(texts: Iterable[str]) -> tuple[str, int]:
    """``(digest, count)`` of the non-empty texts, streamed."""
    h, count = hashlib.sha256(), 0
    for t in texts:
        if not t:
            continue
        data = t.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
        count += 1
    return h.hexdigest()[:16], count


def get_tokenizer(
    spec: str,
    *,
    texts: Iterable[str] | None = None,
    vocab_size: int = 2048,
    cache_dir: Path | None = None,
) -> PreTrainedTokenizerFast:
    """Build or load a tokenizer.

    Args:
        spec: ``"byte"`` (byte-level, no training), ``"bpe"`` (ByteLevel BPE trained on ``texts``), or a
            path to a ``tokenizer.json`` / a saved tokenizer folder.
        texts: training documents for ``"bpe"`` (e.g. ``DataSource.train_texts()``). A re-iterable (a
            list, or :class:`~slmlab.data.corpora.CorpusTexts`) is streamed twice, to key the cache and
            to train, and never held in memory; a one-shot iterator is read into a list first.
        vocab_size: BPE vocabulary size including the specials.
        cache_dir: where a trained BPE tokenizer is kept (``<cache>/tokenizers/bpe-<vocab>-<hash>/``),
            keyed by the training texts, so a second run loads it instead of retraining. Default:
            ``$SLMLAB_CACHE`` or ``~/.cache/slmlab``.

    Returns:
        a ``PreTrainedTokenizerFast`` with ``bos_token``, ``eos_token`` and ``pad_token`` set.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"tokenizer spec must be 'byte', 'bpe' or a path, got {spec!r}")
    if spec == "byte":
        return byte_tokenizer()
    if spec == "bpe":
        if texts is None:
            raise ValueError("tokenizer 'bpe' needs training texts (texts=...), e.g. DataSource.train_texts()")
        if iter(texts) is texts:  # a one-shot iterator: it must be read twice
            texts = list(texts)
        digest, count = _texts_digest(texts)
        if not count:
            raise ValueError("tokenizer 'bpe' got no (non-empty) training texts")
        folder = resolve_cache_dir(cache_dir) / "tokenizers" / f"bpe-{int(vocab_size)}-{digest}"
        if (folder / "tokenizer.json").is_file():
            return load_tokenizer(folder)
        tok = train_bpe((t for t in texts if t), vocab_size, length=count)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
        tok.save_pretrained(str(tmp))
        publish_modes(tmp)  # a shared cache: 0755 / 0644 (the umask's), not mkdtemp's 0700
        try:
            os.replace(tmp, folder)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not (folder / "tokenizer.json").is_file():  # not a lost race with another process: a real error
                raise
        return tok
    return load_tokenizer(spec)
