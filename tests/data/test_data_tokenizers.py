"""Tokenizers: byte-level never fails, BPE round-trips Unicode, specials, caching and loading."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from slmlab.data import get_tokenizer, tokenizer_fingerprint
from slmlab.data.byte_alphabet import byte_to_unicode, unicode_to_byte
from slmlab.data.packing import encode_documents


def random_unicode(rng: random.Random, n: int) -> str:
    """Any code point except surrogates (not encodable as UTF-8), weighted toward odd ranges."""
    pools = [(0, 0x7F), (0x80, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFF), (0x10000, 0x10FFFF)]
    chars = []
    for _ in range(n):
        lo, hi = rng.choice(pools)
        chars.append(chr(rng.randint(lo, hi)))
    return "".join(chars)


def corpus_texts(n_docs: int = 40, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["the", "king", "queen", "doth", "speak", "thee", "thou", "art", "noble", "lord", "ünïcödé", "日本", "😀"]
    return ["\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(20)) for _ in range(n_docs)]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return get_tokenizer("bpe", texts=corpus_texts(), vocab_size=320, cache_dir=tmp_path_factory.mktemp("cache"))


def test_byte_tokenizer_ids_are_bytes_and_specials_follow():
    tok = get_tokenizer("byte")
    assert len(tok) == 259
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (256, 257, 258)
    rng = random.Random(0)
    for _ in range(50):
        text = random_unicode(rng, rng.randint(0, 64))
        ids = tok.encode(text)
        assert ids == list(text.encode("utf-8"))
        assert tok.decode(ids) == text


def test_byte_tokenizer_never_fails_on_any_bytes():
    tok = get_tokenizer("byte")
    rng = random.Random(1)
    for _ in range(50):
        raw = bytes(rng.randrange(256) for _ in range(rng.randint(1, 80)))
        text = raw.decode("utf-8", errors="replace")
        assert tok.decode(tok.encode(text)) == text
    every_byte = bytes(range(256)).decode("latin-1")
    assert tok.decode(tok.encode(every_byte)) == every_byte


def test_packing_shortcut_matches_the_rust_byte_tokenizer():
    tok = get_tokenizer("byte")
    texts = [random_unicode(random.Random(i), 50) for i in range(5)]
    framed = list(encode_documents(tok, texts))
    for text, ids in zip(texts, framed):
        assert ids.tolist() == [tok.bos_token_id] + tok.encode(text) + [tok.eos_token_id]


def test_bpe_round_trips_arbitrary_unicode(bpe):
    rng = random.Random(2)
    for _ in range(100):
        text = random_unicode(rng, rng.randint(0, 100))
        assert bpe.decode(bpe.encode(text)) == text
    for text in ["  leading and trailing  ", "\t\n\r\x00\x7f", "ſtraße İstanbul ﬁ", "the king doth speak"]:
        assert bpe.decode(bpe.encode(text)) == text


def test_byte_alphabet_round_trips_all_256_bytes_as_bytelevel_does(bpe):
    forward, inverse = byte_to_unicode(), unicode_to_byte()
    assert sorted(forward) == list(range(256)) and len(set(forward.values())) == 256
    assert [inverse[forward[b]] for b in range(256)] == list(range(256))
    assert all(len(ch) == 1 and ch.isprintable() and not ch.isspace() for ch in forward.values())
    assert set(forward.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert set(forward.values()) <= set(bpe.get_vocab())  # the trained BPE starts from this alphabet
    # tokenizers' ByteLevel writes each UTF-8 byte as the same character, and its decoder reads it back
    text = "".join(chr(c) for c in range(0x80)) + "".join(random_unicode(random.Random(3), 400))
    data = text.encode("utf-8")
    pieces = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(text)
    assert "".join(piece for piece, _ in pieces) == "".join(forward[b] for b in data)
    assert decoders.ByteLevel().decode([forward[b] for b in data]) == text
    with pytest.raises(TypeError):
        forward[0] = "x"  # read-only: one shared table nobody can corrupt


def test_neollm_byte_table_uses_the_one_alphabet():
    from slmlab.models.neollm.components import byte_table

    assert byte_table.unicode_to_byte is unicode_to_byte
    assert byte_table.piece_to_bytes("".join(byte_to_unicode()[b] for b in range(256))) == bytes(range(256))


def test_bpe_vocabulary_and_specials(bpe):
    assert len(bpe) <= 320
    assert (bpe.bos_token, bpe.eos_token, bpe.pad_token) == ("<bos>", "<eos>", "<pad>")
    assert (bpe.bos_token_id, bpe.eos_token_id, bpe.pad_token_id) == (0, 1, 2)
    assert len(bpe.encode("the king doth speak")) < len("the king doth speak")  # it learned merges
    assert bpe.encode("the king") == bpe("the king")["input_ids"]  # no specials added on encode


def test_bpe_is_cached_by_texts_and_vocab(tmp_path):
    texts = corpus_texts(10)
    first = get_tokenizer("bpe", texts=texts, vocab_size=300, cache_dir=tmp_path)
    saved = list((tmp_path / "tokenizers").iterdir())
    assert len(saved) == 1 and (saved[0] / "tokenizer.json").is_file()
    again = get_tokenizer("bpe", texts=iter(texts), vocab_size=300, cache_dir=tmp_path)
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(first)
    get_tokenizer("bpe", texts=texts, vocab_size=290, cache_dir=tmp_path)
    assert len(list((tmp_path / "tokenizers").iterdir())) == 2


def test_load_saved_folder_and_tokenizer_json(bpe, tmp_path):
    bpe.save_pretrained(tmp_path / "tok")
    text = "thou art noble 😀"
    from_folder = get_tokenizer(str(tmp_path / "tok"))
    from_json = get_tokenizer(str(tmp_path / "tok" / "tokenizer.json"))
    plain = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tok" / "tokenizer.json"))
    for tok in (from_folder, from_json):
        assert tok.encode(text) == bpe.encode(text) == plain.encode(text)
        assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2)


def test_foreign_tokenizer_gets_missing_specials_added(tmp_path):
    raw = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    raw.save(str(path))
    with pytest.warns(UserWarning, match="added"):
        tok = get_tokenizer(str(path))
    assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}) == 3
    assert len(tok) == 6


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(spec="bpe"), "needs training texts"),
        (dict(spec="bpe", texts=["", ""]), "no \\(non-empty\\) training texts"),
        (dict(spec="bpe", texts=["abc"], vocab_size=100), "vocab_size must be >= 259"),
        (dict(spec="no/such/tokenizer.json"), "not 'byte', 'bpe' or an existing"),
        (dict(spec=""), "tokenizer spec"),
    ],
)
def test_tokenizer_errors(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        get_tokenizer(cache_dir=tmp_path, **kwargs)


def test_corrupt_tokenizer_json_is_a_clear_error(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"not": "a tokenizer"}))
    with pytest.raises(ValueError, match="tokenizer.json is not a valid tokenizer file"):
        get_tokenizer(str(path))
