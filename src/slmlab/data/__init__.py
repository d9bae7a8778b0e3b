"""Data: tokenizers, text corpora, packing into blocks, synthetic tasks (the data <-> trainer contract).

Typical use::

    from slmlab.data import get_source, get_tokenizer
    texts = get_source("shakespeare", None, 256).train_texts()      # no tokenizer needed yet
    tok = get_tokenizer("bpe", texts=texts, vocab_size=2048)
    src = get_source("shakespeare", tok, 256)
    batch = next(src.batches("train", 32, seed=0))                   # input_ids, labels [32, 256]
"""

from .corpora import Corpus, load_corpus
from .sources import DataSource, TaskSource, TextSource, get_source
from .tasks import TASKS, Task, TaskBatch, parse_task_spec, to_hf_labels
from .tokenizers import SPECIAL_TOKENS, byte_tokenizer, get_tokenizer, tokenizer_fingerprint

__all__ = [
    "Corpus",
    "DataSource",
    "SPECIAL_TOKENS",
    "TASKS",
    "Task",
    "TaskBatch",
    "TaskSource",
    "TextSource",
    "byte_tokenizer",
    "get_source",
    "get_tokenizer",
    "load_corpus",
    "parse_task_spec",
    "to_hf_labels",
    "tokenizer_fingerprint",
]
